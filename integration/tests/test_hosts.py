"""The promise on hosts as users have them: swap, zram and systemd-oomd (issue #25).

Debian's default host has no swap and no systemd-oomd, and the rest of the
suite runs on that. Each test here first makes the VM the host a user has,
as root (``roothelper.sh profile``), because these are the hosts where a
fleet's promise broke: Ubuntu's (a swap file, systemd-oomd with Ubuntu's
drop-ins) and Fedora's (zram as large as memory, systemd-oomd with Fedora's
per-slice drop-ins). It goes back to Debian's default after.

The runaway's pages do not compress (a random block repeated page by page):
zram takes their whole size from RAM, the case where MemAvailable reaches
nothing while SwapFree stays high (../shared/FIELD-NOTES.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DISTRO, MANAGER
from roothelper import as_root
from test_guard import TOOL_CALL, guard_kills, kernel_oom_kills, memory_back, wait_until

import agentscope
from agentscope import DEVNULL, AsyncFleet

# Where the profiles' systemd-oomd is in the image (integration/images.py).
PROFILE_DISTROS = ("trixie", "sid")
pytestmark = pytest.mark.skipif(
    DISTRO not in PROFILE_DISTROS,
    reason=f"host profiles run on {', '.join(PROFILE_DISTROS)} (systemd-oomd in the image)",
)

# 16 MiB every 20 ms, each page distinct random bytes: nothing for zram to compress.
INCOMPRESSIBLE = (
    "import os, time\nblock = os.urandom(1 << 20)\nchunks = []\nwhile True:\n"
    "    chunks.append(bytearray(block * 16))\n    time.sleep(0.02)\n"
)
HEARTBEAT = 'while :; do date +%s.%N >> "$1"; sleep 0.2; done'


@pytest.fixture(params=["ubuntu", "fedora"])
def host(request: pytest.FixtureRequest) -> Iterator[str]:
    """The VM as the host a user has, for this test only; Debian's default after.

    Set up before the fleet and taken down after it: the fleet's agents are
    stopped and the memory is back before the swap goes (a swapoff while a
    runaway still holds swap would run the VM out of memory).
    """
    print(as_root("profile", request.param, timeout=120))
    try:
        yield request.param
    finally:
        print(as_root("profile", "debian", timeout=180))


@pytest.fixture
async def fleet(host: str) -> AsyncIterator[AsyncFleet]:
    async with AsyncFleet(f"h{uuid.uuid4().hex[:6]}") as f:
        try:
            yield f
        finally:
            for agent in await f.agents():
                with contextlib.suppress(agentscope.AgentscopeError):
                    await f.stop(agent.name, timeout=5)
            await wait_until(memory_back, 60)


async def test_a_runaway_on_a_users_host_is_ended_by_the_guard_and_only_its_tool_call_dies(
    host: str, fleet: AsyncFleet, tmp_path: Path
) -> None:
    tmp_path.chmod(0o777)
    beats = [tmp_path / f"beat-{i}" for i in range(3)]
    rc = tmp_path / "rc"
    siblings = [
        await fleet.launch(
            f"sib-{i}",
            ["sh", "-c", HEARTBEAT, "sh", str(b)],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        for i, b in enumerate(beats)
    ]
    kills_before = kernel_oom_kills()
    t0 = time.monotonic()
    async with fleet.monitor(interval=1.0, guard=True) as monitor:
        agent = await fleet.launch(
            "runaway",
            ["sh", "-c", TOOL_CALL, "sh", INCOMPRESSIBLE, str(rc)],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        kills: list[Any] = await guard_kills(monitor, 1, 150)
    lifetime = time.monotonic() - t0
    ended = await wait_until(rc.exists, 10)
    print(
        f"{MANAGER} {host}: guard kills {[k.to_dict() for k in kills]}, "
        f"runaway ended after {lifetime:.1f}s, rc {rc.read_text().strip() if ended else None}"
    )
    # Every agent's scope is still there: systemd-oomd, which kills whole
    # leaf cgroups, took none of them, and neither did the kernel.
    assert agent.alive(), "the agent's shell lives on after its tool call"
    assert all(s.alive() for s in siblings), "a sibling agent died"
    assert kernel_oom_kills() == kills_before, "the kernel's OOM killer acted, not the guard"
    assert len(kills) == 1, [k.to_dict() for k in kills]
    (kill,) = kills
    assert (kill.agent, kill.unit, kill.comm) == ("runaway", agent.unit, "python3")
    assert kill.pid != agent.pid
    assert ended
    assert rc.read_text().strip() == f"rc={128 + signal.SIGKILL}"
    # The siblings kept beating once the runaway was gone.
    after = time.time()
    await asyncio.sleep(1.5)
    for beat in beats:
        assert float(beat.read_text().split()[-1]) > after - 0.5
    assert os.path.exists(f"/proc/{agent.pid}")
