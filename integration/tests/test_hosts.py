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
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DISTRO, MANAGER, cli_monitor, own_fleet
from roothelper import as_root
from test_guard import TOOL_CALL, guard_kills, kernel_oom_kills, wait_until

import agentscope_systemd
from agentscope_systemd import DEVNULL, AsyncFleet

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


@contextlib.contextmanager
def users_host(profile: str) -> Iterator[str]:
    """The VM as the host a user has (``profile``); Debian's default after.

    Set up before the fleet and taken down after it: the fleet's agents are
    stopped and the memory is back before the swap goes (a swapoff while a
    runaway still holds swap would run the VM out of memory).
    """
    print(as_root("profile", profile, timeout=120))
    try:
        yield profile
    finally:
        print(as_root("profile", "debian", timeout=180))


@pytest.fixture(
    params=[
        pytest.param("ubuntu", marks=pytest.mark.heavy("profile-ubuntu")),
        pytest.param("fedora", marks=pytest.mark.heavy("profile-fedora")),
    ]
)
def host(request: pytest.FixtureRequest) -> Iterator[str]:
    """The VM as the host a user has, for this test only (:func:`users_host`)."""
    with users_host(request.param) as name:
        yield name


@pytest.fixture
async def fleet(host: str) -> AsyncIterator[AsyncFleet]:
    async with own_fleet("h", squeezed=True) as f:
        yield f


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


# --- A host shared with other programs and users (Debian's default profile) ---

# The hog grows as the runaway does, in a scope of its own outside the agents
# slice: another user's job, a build, a browser.
HOG = (
    "import os, time\nblock = os.urandom(1 << 20)\nchunks = []\nwhile True:\n"
    "    chunks.append(bytearray(block * 16))\n    time.sleep(0.02)\n"
)
GuardHeld = getattr(agentscope_systemd, "GuardHeld", None)


def outside_scope(name: str, *argv: str, props: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """A process in a transient scope of the manager under test, outside the agents slice."""
    cmd = ["systemd-run", *(["--user"] if MANAGER == "user" else []), "--scope", "--quiet"]
    cmd += [f"--unit={name}", *(f"--property={p}" for p in props), *argv]
    return subprocess.Popen(cmd, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)


@pytest.fixture
async def quiet_fleet() -> AsyncIterator[AsyncFleet]:
    async with own_fleet("q", squeezed=True) as f:
        yield f


async def agents_of(fleet: AsyncFleet, n: int) -> list[agentscope_systemd.Agent]:
    # Each holds 48 MiB, so a guard that wrongly blamed the fleet would find a victim.
    hold = (
        "import time\nb = bytearray(48 << 20)\n"
        "for i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(3600)\n"
    )
    return [
        await fleet.launch(
            f"agent-{i}", ["python3", "-c", hold], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL
        )
        for i in range(n)
    ]


@pytest.mark.heavy("shared-host")
@pytest.mark.skipif(GuardHeld is None, reason="no GuardHeld in this build")
async def test_a_hog_outside_the_fleet_costs_no_agent(quiet_fleet: AsyncFleet) -> None:
    agents = await agents_of(quiet_fleet, 3)
    unit = f"hog-{uuid.uuid4().hex[:6]}.scope"
    held: list[Any] = []
    kills: list[Any] = []
    async with quiet_fleet.monitor(interval=1.0, guard=True) as monitor:
        hog = outside_scope(unit, "python3", "-c", HOG)
        try:
            # The guard sees the shortage, names the hog's cgroup and holds its hand;
            # the test then ends the hog itself, as the kernel or oomd would.
            it = monitor.__aiter__()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and not held:
                with contextlib.suppress(TimeoutError):
                    event = await asyncio.wait_for(it.__anext__(), deadline - time.monotonic())
                    if isinstance(event, GuardHeld):  # type: ignore[arg-type]
                        held.append(event)
                    elif isinstance(event, agentscope_systemd.GuardKill):
                        kills.append(event)
                if hog.poll() is not None:
                    break
        finally:
            hog.kill()
            hog.wait()
        kills += await guard_kills(monitor, 1, 3)
    print(f"{MANAGER}: held {[h.to_dict() for h in held]}, hog rc {hog.returncode}")
    assert kills == [], [k.to_dict() for k in kills]
    assert len(held) == 1, "the guard says once whose shortage it is"
    assert held[0].culprit is not None
    assert held[0].culprit.endswith(unit), held[0].to_dict()
    for a in agents:
        assert a.alive(), f"{a.name} died"


@pytest.mark.heavy("shared-host")
async def test_two_guards_on_one_squeeze_kill_one_process(
    quiet_fleet: AsyncFleet, tmp_path: Path
) -> None:
    # Two fleets' guards over one agents slice: a harness's and another's.
    tmp_path.chmod(0o777)
    rc = tmp_path / "rc"
    async with (
        AsyncFleet(f"o{uuid.uuid4().hex[:6]}") as other,
        other.monitor(interval=1.0, guard=True) as other_monitor,
        quiet_fleet.monitor(interval=1.0, guard=True) as monitor,
    ):
        agent = await quiet_fleet.launch(
            "runaway",
            ["sh", "-c", TOOL_CALL, "sh", INCOMPRESSIBLE, str(rc)],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        ours = asyncio.ensure_future(guard_kills(monitor, 1, 150))
        theirs = asyncio.ensure_future(guard_kills(other_monitor, 1, 150))
        assert await wait_until(rc.exists, 150)
        # Any second kill would come within moments of the first.
        await asyncio.sleep(5)
        ours.cancel()
        theirs.cancel()
        recorded = [
            *await quiet_fleet.events(kind="guard_kill"),
            *await other.events(kind="guard_kill"),
        ]
    print(f"{MANAGER}: guard kills recorded {[e.to_dict() for e in recorded]}")
    assert rc.read_text().strip() == f"rc={128 + signal.SIGKILL}"
    assert agent.alive()
    assert len(recorded) == 1, [e.to_dict() for e in recorded]
    assert recorded[0].agent == "runaway"


@contextlib.contextmanager
def unreadable_registry() -> Iterator[dict[str, str]]:
    """The default registry of the manager under test replaced by garbage, then put back."""
    if MANAGER == "user":
        state = Path(tempfile.mkdtemp(prefix="state-"))
        (state / "agentscope").mkdir()
        (state / "agentscope" / "agentscope.db").write_bytes(b"this is not a database\n" * 64)
        try:
            yield {"XDG_STATE_HOME": str(state)}
        finally:
            shutil.rmtree(state, ignore_errors=True)
        return
    home, saved = Path("/var/lib/agentscope"), Path("/var/lib/agentscope.saved")
    home.rename(saved)
    try:
        home.mkdir(mode=0o755)
        (home / "agentscope.db").write_bytes(b"this is not a database\n" * 64)
        yield {}
    finally:
        shutil.rmtree(home, ignore_errors=True)
        saved.rename(home)


@pytest.mark.heavy("shared-host")
async def test_the_guard_acts_when_the_registry_cannot_be_opened(tmp_path: Path) -> None:
    # A harness started its agent itself (systemd-run, named as docs/json.md
    # says), and the monitor's registry is garbage: the guard must act anyway.
    tmp_path.chmod(0o777)
    rc = tmp_path / "rc"
    user = ["--user"] if MANAGER == "user" else []
    unit = f"agentscope-r{uuid.uuid4().hex[:6]}-runaway-{uuid.uuid4().hex[:6]}.scope"
    kills_before = kernel_oom_kills()
    runaway: subprocess.Popen[bytes] | None = None
    with (
        unreadable_registry() as env,
        cli_monitor("--json", "monitor", "--guard", "--interval", "1", env=env) as monitor,
    ):
        try:
            runaway = subprocess.Popen(
                [
                    *("systemd-run", *user, "--scope", "--quiet", f"--unit={unit}"),
                    *("--slice=app-agentscope-agents.slice", "sh", "-c", TOOL_CALL),
                    *("sh", INCOMPRESSIBLE, str(rc)),
                ],
                stdin=DEVNULL,
                stdout=DEVNULL,
                stderr=DEVNULL,
            )
            ended = await wait_until(rc.exists, 150)
        finally:
            monitor.send_signal(signal.SIGTERM)
            _, err = monitor.communicate(timeout=60)
            subprocess.run(["systemctl", *user, "stop", unit], check=False)
            if runaway is not None:
                runaway.wait(30)
    print(err[-3000:])
    assert "Traceback" not in err
    assert "its kills are not being recorded" in err
    assert ended
    assert rc.read_text().strip() == f"rc={128 + signal.SIGKILL}"
    assert kernel_oom_kills() == kills_before, "the kernel's OOM killer acted, not the guard"
    assert "guard killed pid" in err
