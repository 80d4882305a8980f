"""systemd-oomd's victim is a tool call, not its agent (#26 item 6), on Ubuntu's host.

The VM is made the host an Ubuntu user has (``roothelper.sh profile ubuntu``:
a swap file as large as memory, systemd-oomd with Ubuntu's drop-ins), whose
swap rule on ``-.slice`` covers every cgroup of the host, the agents' too.
No guard runs: oomd is the one that acts, as on a host where the fleet's
monitor is not running. oomd kills a whole *candidate* cgroup, a leaf or one
with ``memory.oom.group`` 1 (systemd-oomd.service(8)): in a delegated agent
scope those are the ``agent`` leaf and each ``call-LABEL-N``. Its swap rule
takes the candidate with the most swap once memory and swap are both more
than 90 % used (src/oom/oomd-util.c, ``oomd_select_by_swap_usage``).

The runaway's call asks for swap (``--memory-swap-max``): a call has none
unless asked (``memory.swap.max`` 0), and a call without swap is never the
swap rule's candidate; the kernel's OOM killer ends it instead (docs/calls.md,
"systemd-oomd and calls"). Ubuntu's memory pressure rule (``user@.service``, 50 % for
20 s) never fired in these squeezes: the agents' ``full`` pressure stayed
under 3 %.
"""

from __future__ import annotations

import asyncio
import grp
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import DISTRO, MANAGER, meminfo_kib, own_fleet
from roothelper import as_root
from test_calls import cgroup_of
from test_guard import kernel_oom_kills, wait_until
from test_hosts import HEARTBEAT, INCOMPRESSIBLE, PROFILE_DISTROS, users_host

import agentscope_systemd
from agentscope_systemd import DEVNULL, AsyncFleet
from agentscope_systemd._monitor._oomd import OomdLine, parse_oomd_line

pytestmark = pytest.mark.skipif(
    DISTRO not in PROFILE_DISTROS,
    reason=f"host profiles run on {', '.join(PROFILE_DISTROS)} (systemd-oomd in the image)",
)
CLI = shutil.which("agentscope") or "agentscope"


@pytest.fixture
def ubuntu() -> Iterator[str]:
    with users_host("ubuntu") as name:
        yield name


@pytest.fixture
async def fleet(ubuntu: str) -> AsyncIterator[AsyncFleet]:
    async with own_fleet("c", squeezed=True) as f:
        yield f


def oomd_kills_since(since: int) -> list[OomdLine]:
    """oomd's own lines about its kills since ``since``, from its journal (as root)."""
    text = as_root("oomd", "log", str(since))
    print(text[-3000:])
    lines = (line.partition(": ")[2] for line in text.splitlines() if "systemd-oomd[" in line)
    return [kill for kill in map(parse_oomd_line, lines) if kill is not None]


def reads_oomds_journal() -> bool:
    """Whether this process, so its monitor, reads systemd-oomd's lines (journald:
    root, or the groups Debian's journald lets read the system journal)."""
    if os.geteuid() == 0:
        return True
    names = {g.gr_name for g in grp.getgrall() if g.gr_gid in os.getgroups()}
    return bool(names & {"systemd-journal", "adm"})


@pytest.mark.heavy("oomd-calls")
async def test_oomd_calls_victim_is_the_runaway_call_and_the_agent_lives(
    fleet: AsyncFleet, tmp_path: Path
) -> None:
    tmp_path.chmod(0o777)
    rc, sleeper, beat = tmp_path / "rc", tmp_path / "sleeper", tmp_path / "beat"
    (tmp_path / "grow.py").write_text(INCOMPRESSIBLE)
    # The call's tree: the runaway and a sleep it started, both in the call.
    (tmp_path / "call.sh").write_text(
        f"sleep 300 &\necho $! > {sleeper}\nexec python3 {tmp_path / 'grow.py'}\n"
    )
    sibling = await fleet.launch(
        "sib",
        ["sh", "-c", HEARTBEAT, "sh", str(beat)],
        stdin=DEVNULL,
        stdout=DEVNULL,
        stderr=DEVNULL,
    )
    since = int(time.time())
    kills_before = kernel_oom_kills()
    events: list[agentscope_systemd.OomdKill] = []
    async with fleet.monitor(interval=1.0, guard=False) as monitor:

        async def collect() -> None:
            async for event in monitor:
                if isinstance(event, agentscope_systemd.OomdKill):
                    events.append(event)

        collector = asyncio.ensure_future(collect())
        t0 = time.monotonic()
        agent = await fleet.launch(
            "runner",
            [
                "sh",
                "-c",
                f"{CLI} call --name grow --memory-swap-max infinity -- sh {tmp_path / 'call.sh'}"
                f'; echo "rc=$?" > {rc}; while :; do sleep 3600; done',
            ],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        where = cgroup_of(agent.pid)  # the agent's leaf, before anything can kill it
        # 240 s: filling memory and a swap file as large under TCG took up to
        # 150 s with three VMs on two cores (a CI host that slow lost the run).
        ended = await wait_until(rc.exists, 240)
        lifetime = time.monotonic() - t0
        if reads_oomds_journal() and await wait_until(lambda: events, 15):
            await asyncio.sleep(3)  # oomd names its victim again a reading later: no event
        collector.cancel()
    leaf, scope = Path("/sys/fs/cgroup" + where), where.rpartition("/")[0]
    kills = oomd_kills_since(since)
    status = rc.read_text().strip() if ended else None
    meminfo = meminfo_kib()
    print(
        f"{MANAGER}: runaway ended after {lifetime:.1f}s, {status}; "
        f"oomd: {kills}; events: {[e.to_dict() for e in events]}; "
        f"now MemAvailable {meminfo['MemAvailable']} kB, SwapFree {meminfo['SwapFree']} kB"
    )
    assert leaf.name == "agent", f"no delegated scope here: the agent is in {leaf}"
    # The agent's own leaf is the one oomd takes last (_calls/_calls.py, _avoid_oomd).
    assert os.getxattr(leaf, "user.oomd_avoid") == b"1"
    assert ended, "the runaway call lived on"
    assert rc.read_text().strip() == f"rc={128 + signal.SIGKILL}"
    # oomd took the call, and nothing else: not the agent's leaf, not its sibling.
    # (It may name the call again at its next reading, 1 s on, while the
    # killed runaway still frees its swap: measured 1.2 s later, 380 MiB.)
    assert kills, "oomd killed nothing"
    assert {(k.cgroup, k.rule) for k in kills} == {(f"{scope}/call-grow-1", "swap")}
    assert kernel_oom_kills() == kills_before, "the kernel's OOM killer acted, not oomd"
    assert await wait_until(lambda: not Path(f"/proc/{sleeper.read_text().strip()}").exists(), 5)
    assert agent.alive(), "the agent's shell died with its call"
    assert sibling.alive(), "a sibling agent died"
    after = time.time()
    await asyncio.sleep(1.5)
    assert float(beat.read_text().split()[-1]) > after - 0.5, "the sibling stopped beating"
    # agentscope's event names the agent and the call, once, from oomd's journal
    # line; a user who may not read the system journal gets none (docs/guard.md).
    if not reads_oomds_journal():
        assert events == []
        return
    assert [(e.agent, e.unit, e.call, e.rule) for e in events] == [
        ("runner", agent.unit, "call-grow-1", "swap")
    ]
    (recorded,) = await fleet.events(kind="oomd_kill")
    assert (recorded.agent, recorded.detail["call"]) == ("runner", "call-grow-1")
