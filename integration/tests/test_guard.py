"""The memory guard against a real kernel on Debian's defaults (issue #20).

No MGLRU ``min_ttl_ms`` here: the kernel's own OOM killer would take minutes
to act, so a kill within the tests' bounds is the guard's, and the kernel's
``oom_kill`` count in /proc/vmstat must not move. Each runaway is a tool
call with no cap: 16 MiB every 20 ms, each chunk touched. The VM has 768 MB.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_monitor, own_fleet, systemctl, validate

import agentscope_systemd
from agentscope_systemd import DEVNULL, AsyncFleet

GuardKill = getattr(agentscope_systemd, "GuardKill", None)
pytestmark = pytest.mark.skipif(GuardKill is None, reason="no guard in this build")

CLI = shutil.which("agentscope") or "agentscope"
GROW = (
    "import time\nchunks = []\nwhile True:\n"
    "    chunks.append(b'x' * (16 << 20))\n    time.sleep(0.02)\n"
)
# An agent's shell that starts the tool call, says how it ended, and lives on.
TOOL_CALL = 'python3 -c "$1"; echo "rc=$?" > "$2"; while :; do sleep 3600; done'
# A tool call that holds 96 MiB: under a MemoryHigh of 48M it reclaims for good.
THROTTLED = "import time\nb = b'x' * (96 << 20)\ntime.sleep(3600)\n"
HEARTBEAT = 'while :; do date +%s.%N >> "$1"; sleep 0.2; done'
SIBLINGS = 3
#: What the test's manager holds so that it is the host's largest process:
#: the runaway reaches ~200-250 MB when MemAvailable falls to 10% of 714 MiB.
BALLAST = 280 << 20


def kernel_oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    raise AssertionError("no oom_kill in /proc/vmstat")


def rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


async def wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.2)
    return False


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="guard-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def fleet() -> AsyncIterator[AsyncFleet]:
    async with own_fleet("g", squeezed=True) as f:
        yield f


def largest_processes(n: int = 12) -> str:
    """``ps``'s largest processes by RSS: what ran beside a late kill, in a failure's output."""
    ps = ["ps", "-eo", "pid,ppid,stat,etimes,rss,comm,args", "--sort=-rss"]
    out = subprocess.run(ps, capture_output=True, text=True, check=False).stdout
    return "\n".join(out.splitlines()[: n + 1])


async def guard_kills(monitor: agentscope_systemd.Monitor, want: int, timeout: float) -> list[Any]:
    """Guard kills from the monitor until ``want`` came, then 3 s more for any extra."""
    got: list[Any] = []
    it = monitor.__aiter__()
    started = time.monotonic()
    deadline = started + timeout
    said = False

    def note(event: Any) -> None:
        nonlocal deadline
        if isinstance(event, GuardKill):  # type: ignore[arg-type]
            got.append(event)
            if len(got) == want:
                deadline = min(deadline, time.monotonic() + 3.0)
        elif type(event).__name__ == "GuardHeld":  # why a kill came late, in a failure's output
            print(f"guard held: {event.to_dict()}")

    # One pending read at a time, never cancelled mid-wait: a cancelled
    # __anext__ would end the monitor's event generator.
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            now = time.monotonic()
            if not said and len(got) < want and now - started > 20:
                # A kill this late is the bed's trouble or the guard's (CI's
                # slower hosts, issue #29): say what ran beside it.
                said = True
                print(f"guard_kills: {now - started:.0f} s without a kill\n{largest_processes()}")
            if now >= deadline:
                return got
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=min(deadline - now, 5.0))
            if not done:
                continue
            event, pending = pending.result(), None
            note(event)
    finally:
        if pending is not None:
            pending.cancel()


@pytest.mark.heavy("guard")
async def test_runaway_tool_call_is_killed_by_the_guard_not_the_kernel(
    fleet: AsyncFleet, work: Path
) -> None:
    # The manager (this process) is the host's largest process throughout:
    # never a candidate, it must not be chosen over the runaway.
    ballast = b"\1" * BALLAST
    beats = [work / f"beat-{i}" for i in range(SIBLINGS)]
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
    rc = work / "rc"
    kills_before = kernel_oom_kills()
    async with fleet.monitor(interval=1.0, guard=True) as monitor:
        agent = await fleet.launch(
            "runaway",
            ["sh", "-c", TOOL_CALL, "sh", GROW, str(rc)],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        kills = await guard_kills(monitor, 1, 120)
        manager_rss = rss_of(os.getpid())
    # Before any assertion: a failed test's traceback keeps its frame, and the
    # ballast with it, for the rest of the suite (the next tests' memory).
    del ballast
    assert len(kills) == 1, kills  # exactly one event
    (kill,) = kills
    print(f"guard kill: {kill.to_dict()}; manager rss {manager_rss >> 20} MiB")
    assert kill.agent == "runaway"
    assert kill.unit == agent.unit
    assert kill.comm == "python3"
    assert kill.pid not in (agent.pid, os.getpid())  # the tool call, not its shell
    assert kill.trigger in ("memory", "psi")
    assert 0 <= kill.reaction_seconds < 5
    # The premise held: the manager was larger than the process the guard chose.
    assert manager_rss > kill.rss + kill.swap
    assert kernel_oom_kills() == kills_before, "the kernel killed something"
    assert await wait_until(rc.exists, 10)
    assert rc.read_text().strip() == f"rc={128 + signal.SIGKILL}"
    assert agent.alive(), "the agent's shell lives on after its tool call"
    # Every sibling lives, and beats again after the kill: within seconds, not
    # a fixed 1.5 s. The squeeze evicted the pages of `date` and `sleep`, and
    # the first beats after it read them back from disk (once 3 s under TCG,
    # sd247's user suite, 2026-12-04). How long siblings go silent is what
    # benchmarks/bench_squeeze.py measures, on a bed that times it.
    after = time.time()
    for sib, beat in zip(siblings, beats, strict=True):
        assert sib.alive()
        assert await wait_until(lambda b=beat: float(b.read_text().split()[-1]) > after, 15), (
            f"{sib.name} did not beat within 15 s of the kill"
        )
    recorded = await fleet.events(kind="guard_kill")
    assert [(e.agent, e.kind) for e in recorded] == [("runaway", "guard_kill")]


@pytest.mark.heavy("guard")
async def test_two_runaways_at_once_both_killed_by_the_cli_monitor(
    fleet: AsyncFleet, work: Path
) -> None:
    # `agentscope monitor --guard --json` as its own process, as a harness runs it.
    with cli_monitor(
        "--json", "--fleet", fleet.name, "monitor", "--guard", "--interval", "1"
    ) as monitor:
        try:
            kills_before = kernel_oom_kills()
            rcs = {n: work / f"rc-{n}" for n in ("left", "right")}
            agents = {
                n: await fleet.launch(
                    n,
                    ["sh", "-c", TOOL_CALL, "sh", GROW, str(rc)],
                    stdin=DEVNULL,
                    stdout=DEVNULL,
                    stderr=DEVNULL,
                )
                for n, rc in rcs.items()
            }
            assert await wait_until(lambda: all(rc.exists() for rc in rcs.values()), 150)
        finally:
            monitor.send_signal(signal.SIGTERM)
            out, err = monitor.communicate(timeout=60)
    print(err[-2000:])
    assert "Traceback" not in err
    events = [json.loads(line) for line in out.splitlines()]
    assert {validate(e) for e in events} == {"agentscope.event/1"}
    kills = [e for e in events if e["kind"] == "guard_kill"]
    assert sorted(k["agent"] for k in kills) == ["left", "right"], kills
    assert {k["detail"]["comm"] for k in kills} == {"python3"}
    assert kernel_oom_kills() == kills_before
    for name, rc in rcs.items():
        assert rc.read_text().strip() == f"rc={128 + signal.SIGKILL}", name
        assert agents[name].alive()


@pytest.mark.heavy("guard")
async def test_main_process_runaway_is_killed_when_no_descendant_qualifies(
    fleet: AsyncFleet,
) -> None:
    kills_before = kernel_oom_kills()
    async with fleet.monitor(interval=1.0, guard=True) as monitor:
        # The agent itself grows: no tool call, no descendant at all.
        agent = await fleet.launch(
            "itself", ["python3", "-c", GROW], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL
        )
        kills = await guard_kills(monitor, 1, 120)
    assert [(k.agent, k.pid, k.comm) for k in kills] == [("itself", agent.pid, "python3")]
    assert await asyncio.wait_for(agent.wait(), 30) == -signal.SIGKILL
    assert kernel_oom_kills() == kills_before


def host_psi_full() -> float:
    line = Path("/proc/pressure/memory").read_text().splitlines()[1]  # full avg10=...
    return float(line.split()[1].partition("=")[2])


@pytest.mark.heavy("throttle")
async def test_a_scope_throttled_by_its_own_memory_high_costs_no_sibling(
    fleet: AsyncFleet,
) -> None:
    # Seen in a VM run of the dashboard's story: a 96 MiB tool call under a
    # MemoryHigh=48M set by hand held the quiet host's PSI full over 60% for
    # 10 s with 64% of memory available, and the guard killed the largest
    # process of the slice, an innocent agent's. The throttle is the scope's
    # own limit at work: nothing is to be killed for it.
    innocent = await fleet.launch(
        "indexer",
        ["python3", "-c", "import time\nb = b'x' * (120 << 20)\ntime.sleep(3600)\n"],
        stdin=DEVNULL,
        stdout=DEVNULL,
        stderr=DEVNULL,
    )
    async with fleet.monitor(interval=1.0, guard=True) as monitor:
        throttled = await fleet.launch(
            "docs",
            ["sh", "-c", 'sleep 2; exec python3 -c "$1"', "sh", THROTTLED],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        # Never set by agentscope (launch refuses MemoryHigh): the hand edit a
        # harness or an admin makes.
        systemctl("set-property", "--runtime", throttled.unit, "MemoryHigh=48M")
        peak = 0.0
        deadline = time.monotonic() + 30
        kills: list[Any] = []
        over_since: float | None = None  # host PSI full avg10 at 60 % or more since then
        while time.monotonic() < deadline and not kills:
            kills = await guard_kills(monitor, 1, 1.0)
            psi = host_psi_full()
            peak = max(peak, psi)
            now = time.monotonic()
            over_since = (over_since or now) if psi >= 60.0 else None
            # The guard's PSI rule fires after 10 s at 60 % (GuardConfig's
            # psi_full_seconds): once the throttle has held it that long and a
            # margin more, the guard has been tried (CI's time, #29).
            if over_since is not None and now - over_since >= 14.0:
                break
    print(f"host PSI full avg10 peaked at {peak:.1f}%")
    assert kills == [], [k.to_dict() for k in kills]
    assert innocent.alive()
    assert throttled.alive()  # throttled, not killed
    if peak < 60.0:
        pytest.skip(f"the throttle held host PSI full at {peak:.1f}% only: the guard was not tried")
