"""The squeeze inside a container with the kubelet's group OOM (issue #27): three ways, one run.

Needs Podman with crun and root (or a rootless user Podman serves): run it
in the trixie VM, whose image has both (integration/images.py). Each round
is one fresh container of the test bed (integration/tests/test_containers.py:
a ``--rootfs`` directory with the guest's ``/usr`` and agentscope
bind-mounted, ``--network=none``, its ``--memory`` limit without swap, and
``memory.oom.group=1`` written on it through ``--cgroup-conf`` as the
kubelet does on cgroup v2 since Kubernetes 1.28, kubernetes#117793). Its
PID 1 is the harness below, which holds bench_squeeze.py's squeeze:

- 6 sibling agents appending a timestamp to a file every 0.2 s;
- one agent whose tool call (a ``python3`` its ``sh`` starts) grows 16 MiB
  every 20 ms, touching its pages;
- the manager: the harness itself, with a 50 ms asyncio ticker that keeps
  its worst loop lag from the trigger until 3 s after the tool call died.

The rounds (``--rounds``, each ``--repeat`` times, interleaved):

``bare``
    no agentscope: the agents are the harness's plain subprocesses and the
    harness imports nothing but the standard library. Expected: the
    kernel's group kill ends the whole container (Podman exit 137).
``earlyoom``
    the same with Debian's earlyoom (the VM's own binary, through the
    bind-mounted ``/usr``) running inside the container at its defaults,
    reporting every second what it sees: it reads ``/proc/meminfo``, the
    VM's memory, not the container's limit (rfjakob/earlyoom#331).
``process``
    agentscope: ``AsyncFleet`` (``manager="auto"``) and its monitor with the
    guard, on Podman's default read-only cgroupfs: the process mode.
``cgroup``
    the same with ``--systemd=always`` (the container's cgroup delegated to
    it, the cgroupfs writable): the cgroup mode.

Per round: whether the container survived (the harness ended its agents and
exited 0), the runaway's lifetime (its first allocation until its shell saw
it die, or until the container's end), the manager's worst loop lag, the
siblings' longest heartbeat gap, and what was killed: the kernel's victims
(its log, with whether it was the group kill), earlyoom's signals, the
guard's and the monitor's kill events with the agent they name.

Run: ``python3 benchmarks/bench_container.py [--rounds process,cgroup,bare,earlyoom]``
(in the VM: ``python integration/vm.py -d trixie -m system --run
"python benchmarks/bench_container.py"``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_squeeze import (
    GROW,
    HEARTBEAT,
    RUNAWAY,
    SIBLINGS,
    TICK,
    _fmt,
    vmstat_oom_kills,
    worst_gap,
)

_HERE = Path(__file__).resolve().parent
# The test bed: integration/tests in a checkout, tests/ next to the benchmarks in the VM (/tmp/it).
for _where in (_HERE.parent / "integration" / "tests", _HERE.parent / "tests"):
    if (_where / "test_containers.py").is_file():
        sys.path.insert(0, str(_where))
        break
from test_containers import LIMIT, container_root, podman, run_container, work_dir  # noqa: E402

#: The ways, and the harness's way and Podman's extra options for each.
WAYS: dict[str, tuple[str, list[str]]] = {
    "bare": ("bare", []),
    "earlyoom": ("earlyoom", []),
    "process": ("agentscope", []),
    "cgroup": ("agentscope", ["--systemd=always"]),
}

# The harness, the container's PID 1 (the venv's python3). argv: way (bare,
# earlyoom, agentscope), siblings, give-up seconds, work directory, tick.
# Standard library only outside the agentscope way, so the bare rounds run
# no agentscope at all: hence its own small ticker rather than
# bench_squeeze.Ticker. Each step is one JSON line in log.jsonl and the
# worst lag so far is in the file ``lag``, written at once: a group kill
# leaves what came before it.
HARNESS = textwrap.dedent(
    """
    import asyncio, contextlib, json, os, signal, subprocess, sys, time

    WAY, SIBLINGS, GIVE_UP, WORK, TICK = (
        sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5]))

    def path(name):
        return os.path.join(WORK, name)

    def note(step, **what):
        with open(path("log.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "t": time.time(), **what}) + "\\n")

    def stamp(name):
        try:
            words = open(path(name)).read().split()
        except OSError:
            return None
        return words if len(words) == 2 else None

    async def ticker():
        worst = 0.0
        while True:
            due = time.monotonic() + TICK
            await asyncio.sleep(TICK)
            late = time.monotonic() - due
            if late > worst:
                worst = late
                with open(path("lag.new"), "w") as f:
                    f.write(f"{worst:.4f}")
                os.replace(path("lag.new"), path("lag"))

    def agents():
        tool = open(path("tool.py")).read()
        sibs = [(f"sib-{i}", ["sh", path("beat.sh"), path(f"beat-{i}")]) for i in range(SIBLINGS)]
        agent = ["sh", path("agent.sh"), path("go"), tool, path("start"), path("end")]
        return [*sibs, ("runaway", agent)]

    async def squeeze():
        await asyncio.sleep(2.0)  # settled: heartbeats running, the monitor's first samples
        tick = asyncio.create_task(ticker())
        note("trigger")
        open(path("go"), "w").close()
        deadline = time.monotonic() + GIVE_UP
        while stamp("end") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        given_up = stamp("end") is None
        if given_up and (start := stamp("start")) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(start[1]), signal.SIGKILL)
            for _ in range(200):
                if stamp("end") is not None:
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(3.0)  # the kill's aftermath: late heartbeats, late events
        tick.cancel()
        return given_up

    async def plain():
        quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        earlyoom = None
        if WAY == "earlyoom":
            log = open(path("earlyoom.log"), "w")
            earlyoom = subprocess.Popen(["earlyoom", "-r", "1"], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT)
        procs = {name: subprocess.Popen(argv, **quiet) for name, argv in agents()}
        note("launched", agents=list(procs))
        given_up = await squeeze()
        note("after", given_up=given_up,
             siblings=[p.poll() is None for n, p in procs.items() if n != "runaway"],
             runaway=procs["runaway"].poll() is None,
             earlyoom=None if earlyoom is None else earlyoom.poll())
        for p in [*procs.values(), *([earlyoom] if earlyoom else [])]:
            p.kill()
            p.wait()

    async def fleet():
        import agentscope_systemd as a
        quiet = dict(stdin=a.DEVNULL, stdout=a.DEVNULL, stderr=a.DEVNULL)
        async with a.AsyncFleet("bench") as fleet:
            note("open", mode=fleet.mode, reason=fleet.mode_reason)
            launched = {name: await fleet.launch(name, argv, **quiet) for name, argv in agents()}
            note("launched", agents=list(launched))
            kills = []

            async def collect(monitor):
                async for event in monitor:
                    if isinstance(event, (a.GuardKill, a.OomKill)):
                        kills.append(event.to_dict())
                        note("kill", event=event.to_dict())

            async with fleet.monitor(interval=1.0, guard=True) as monitor:
                collector = asyncio.create_task(collect(monitor))
                given_up = await squeeze()
                collector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await collector
            note("after", given_up=given_up,
                 siblings=[x.alive() for n, x in launched.items() if n != "runaway"],
                 runaway=launched["runaway"].alive(), kills=kills)

            async def stop(name):
                with contextlib.suppress(a.AgentscopeError):
                    await fleet.stop(name, timeout=5)

            await asyncio.gather(*(stop(n) for n in launched))

    asyncio.run(fleet() if WAY == "agentscope" else plain())
    note("done")
    """
)

# The kernel's line for each victim (mm/oom_kill.c): "Killed process PID (COMM) total-vm:...".
_KILLED = re.compile(r"Killed process (\d+) \((.{1,64}?)\) total-vm")
# Go's RFC 3339 with nanoseconds, as Podman's inspect gives FinishedAt.
_GO_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


@dataclass
class Outcome:
    """One round's figures (seconds unless named otherwise)."""

    round: str
    repeat: int
    mode: str | None = None  # the fleet's, in the agentscope rounds
    survived: bool = False  # the harness ended its agents and exited 0
    exit_code: int | None = None  # Podman's: 137 when the kernel killed the harness
    group_kill: bool = False  # the kernel said it killed the container's tasks as a group
    runaway_lifetime: float | None = None
    lifetime_until_container_end: bool = False
    given_up: bool = False
    tool_exit: int | None = None  # the tool call's, as its shell saw it
    manager_worst_lag: float | None = None
    sibling_worst_gap: float | None = None
    siblings_alive: int = 0
    runaway_shell_alive: bool = False
    kernel_oom_kills: int = 0  # /proc/vmstat oom_kill: one per victim
    kernel_killed: list[str] | None = None  # "comm (pid)" from the kernel's log
    guard_kills: list[dict[str, Any]] = field(default_factory=list)
    oom_events: list[dict[str, Any]] = field(default_factory=list)
    named: list[str] = field(default_factory=list)  # the agents the kill events name
    earlyoom_exit: int | None = None  # None: it ran to the end of the round (or not asked)
    earlyoom_saw: list[str] = field(default_factory=list)  # its first and last report
    earlyoom_signals: list[str] = field(default_factory=list)
    seconds: float = 0.0


def go_time(text: str) -> float | None:
    """Seconds since the epoch of a Go RFC 3339 time (nanoseconds allowed), None if not one."""
    m = _GO_TIME.fullmatch(text.strip())
    if m is None:
        return None
    zone = "+00:00" if m[3] == "Z" else m[3]
    seconds = datetime.fromisoformat(m[1] + zone).timestamp() + float(f"0.{m[2] or 0}")
    return seconds if seconds > 0 else None  # Go's zero time: not finished


def kernel_victims(log: str) -> tuple[list[str], bool]:
    """The kernel's OOM victims in its log ("comm (pid)"), and whether it was a group kill."""
    victims = [f"{m[2]} ({m[1]})" for m in _KILLED.finditer(log)]
    return victims, "memory.oom.group" in log


def earlyoom_lines(log: str) -> tuple[list[str], list[str]]:
    """earlyoom's first and last memory report, and the lines where it signalled a process."""
    lines = [line.strip()[:200] for line in log.splitlines() if line.strip()]
    reports = [line for line in lines if line.startswith("mem avail")]
    signals = [line for line in lines if " to process " in line or "escalating" in line]
    saw = reports[:1] + reports[-1:] if len(reports) > 1 else reports
    if not reports:  # it did not get as far as a report: say what it said
        saw = lines[-3:]
    return saw, signals


def kernel_log(since: float) -> str | None:
    """The kernel's messages since ``since``, from the journal; None where it cannot be read.

    ``--since`` takes whole seconds: the lines are kept by their own
    timestamps, so the previous round's kills are not counted again.
    """
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        got = subprocess.run(
            ["journalctl", "-k", "-q", "-o", "short-unix", "--no-pager", f"--since=@{int(since)}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if got.returncode == 0:
            return "".join(line + "\n" for line in got.stdout.splitlines() if _after(line, since))
    return None


def _after(line: str, since: float) -> bool:
    try:
        return float(line.partition(" ")[0]) >= since
    except ValueError:
        return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _words(path: Path) -> list[str]:
    return (_read(path) or "").split()


def prepare(work: Path) -> None:
    """The squeeze's agents, as the harness runs them: bench_squeeze.py's own scripts."""
    (work / "tool.py").write_text(GROW)
    (work / "agent.sh").write_text(RUNAWAY)
    (work / "beat.sh").write_text(HEARTBEAT)


def one_round(name: str, repeat: int, give_up: float) -> Outcome:
    """One container, one squeeze; the container and its directories are gone afterwards."""
    way, options = WAYS[name]
    out = Outcome(round=name, repeat=repeat)
    t0 = time.time()
    kills_before = vmstat_oom_kills()
    with container_root() as root, work_dir() as work:
        prepare(work)
        ran = run_container(
            root,
            work,
            f"bench-{name}-{repeat}",
            HARNESS,
            *(way, str(SIBLINGS), str(give_up), "/work", str(TICK)),
            options=options,
        )
        read_round(out, ran, work)
    out.kernel_oom_kills = vmstat_oom_kills() - kills_before
    log = kernel_log(t0)
    if log is not None:
        out.kernel_killed, out.group_kill = kernel_victims(log)
    out.seconds = time.time() - t0
    return out


def read_round(out: Outcome, ran: dict[str, Any], work: Path) -> None:
    """What the harness left in ``work``, and Podman's word on the container, into ``out``."""
    state = ran["state"]
    steps = [json.loads(line) for line in (_read(work / "log.jsonl") or "").splitlines()]
    got = {s["step"]: s for s in steps}
    out.exit_code = ran["rc"]
    out.survived = ran["rc"] == 0 and "done" in got
    out.mode = got.get("open", {}).get("mode")
    ended = go_time(str(state.get("FinishedAt", ""))) or time.time()
    start, end = _words(work / "start"), _words(work / "end")
    if len(start) == 2 and len(end) == 2:
        out.tool_exit = int(end[0])
        out.runaway_lifetime = float(end[1]) - float(start[0])
    elif len(start) == 2 and not out.survived:
        out.runaway_lifetime = ended - float(start[0])
        out.lifetime_until_container_end = True
    lag = _read(work / "lag")
    out.manager_worst_lag = float(lag) if lag else None
    if "trigger" in got:
        until = got["after"]["t"] if "after" in got else ended
        beats = [work / f"beat-{i}" for i in range(SIBLINGS)]
        out.sibling_worst_gap = max(worst_gap(b, got["trigger"]["t"], until) for b in beats)
    after = got.get("after", {})
    out.given_up = bool(after.get("given_up"))
    out.siblings_alive = sum(after.get("siblings", [])) if out.survived else 0
    out.runaway_shell_alive = bool(after.get("runaway")) and out.survived
    for kill in (s["event"] for s in steps if s["step"] == "kill"):
        keep = {k: kill.get(k) for k in ("agent", "comm", "pid", "rss")}
        if kill["kind"] == "guard_kill":
            keep["reaction"] = kill.get("reaction_seconds")
            keep["available_percent"] = kill.get("limit_available_percent")
            keep["limit"] = kill.get("limit")
            out.guard_kills.append(keep)
        else:
            keep["source"] = kill.get("source")
            out.oom_events.append(keep)
        out.named.append(str(kill.get("agent")))
    if out.round == "earlyoom":
        out.earlyoom_exit = after.get("earlyoom")
        out.earlyoom_saw, out.earlyoom_signals = earlyoom_lines(_read(work / "earlyoom.log") or "")


def killed(o: Outcome) -> str:
    """What was killed, in a table cell."""
    said = []
    comms = ", ".join(sorted({v.rsplit(" (", 1)[0] for v in o.kernel_killed or []})) or "?"
    if o.group_kill:
        said.append(f"whole container: kernel group kill of {o.kernel_oom_kills} ({comms})")
    elif o.exit_code == 137 and not o.survived:
        said.append(f"whole container (exit 137); kernel: {o.kernel_oom_kills} kills ({comms})")
    elif o.kernel_oom_kills:
        said.append(f"kernel: {', '.join(o.kernel_killed or [])} ({o.kernel_oom_kills} kills)")
    for k in o.guard_kills:
        said.append(f"guard: {k['comm']} of {k['agent']} ({_fmt(k.get('reaction'))})")
    if o.earlyoom_signals:
        said.append(f"earlyoom: {len(o.earlyoom_signals)} signals")
    elif o.round == "earlyoom":
        said.append("earlyoom: nothing")
    if o.survived and o.tool_exit is not None and not o.guard_kills and not o.kernel_oom_kills:
        said.append(f"tool call exit {o.tool_exit}")
    return "; ".join(said) or "nothing"


def table(rows: list[Outcome]) -> str:
    head = (
        "round | mode | container | runaway lifetime | manager lag | sibling gap"
        " | siblings alive | killed | named"
    )
    lines = [head, " | ".join("---" for _ in head.split(" | "))]
    for o in rows:
        life = _fmt(o.runaway_lifetime)
        life += " (to its end)" if o.lifetime_until_container_end else ""
        life += " (gave up)" if o.given_up else ""
        cells = (
            f"{o.round} #{o.repeat}",
            o.mode or "-",
            "survived" if o.survived else f"killed (exit {o.exit_code})",
            life,
            _fmt(o.manager_worst_lag),
            _fmt(o.sibling_worst_gap),
            f"{o.siblings_alive}/{SIBLINGS}",
            killed(o),
            ", ".join(sorted(set(o.named))) or "nobody",
        )
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def targets(rows: list[Outcome]) -> list[str]:
    """Issue #27's targets, for the agentscope rounds, and the bare rounds' expected group kill."""
    out = []
    bare = [o for o in rows if o.round == "bare"]
    if bare:
        dead = sum(1 for o in bare if not o.survived and o.exit_code == 137)
        out.append(f"bare: the whole container killed in {dead}/{len(bare)} rounds (expected all)")
    ours = [o for o in rows if o.round in ("process", "cgroup")]
    if ours:
        lived = sum(1 for o in ours if o.survived)
        only = sum(
            1
            for o in ours
            if o.survived and o.siblings_alive == SIBLINGS and set(o.named) == {"runaway"}
        )
        lags = [o.manager_worst_lag for o in ours if o.manager_worst_lag is not None]
        worst = max(lags, default=None)
        out.append(f"agentscope: the container survived {lived}/{len(ours)} rounds (target: all)")
        out.append(
            f"agentscope: only the runaway died (every sibling alive, every kill named"
            f" 'runaway') in {only}/{len(ours)} rounds"
            " (target: all)"
        )
        out.append(
            f"agentscope: the manager's worst loop lag {_fmt(worst)} (target: under 1 s:"
            f" {'met' if worst is not None and worst < 1.0 else 'not met'})"
        )
    return out


def header() -> str:
    version = podman("--version").stdout.strip()
    eo = subprocess.run(["earlyoom", "-v"], capture_output=True, text=True, check=False)
    earlyoom = (eo.stdout or eo.stderr).strip().splitlines()[:1] or ["absent"]
    total = next(
        int(line.split()[1]) >> 10
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return (
        f"bench_container: {version}, {earlyoom[0]}, uid {os.getuid()}, limit {LIMIT},"
        f" MemTotal {total} MiB, {os.cpu_count()} CPUs, kernel {os.uname().release}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", default="process,cgroup,bare,earlyoom", help="comma-separated")
    p.add_argument("--repeat", type=int, default=2, help="rounds of each way (interleaved)")
    p.add_argument(
        "--give-up", type=float, default=60.0, help="seconds before the harness kills the tool call"
    )
    args = p.parse_args()
    names = [r for r in args.rounds.split(",") if r]
    if unknown := set(names) - set(WAYS):
        p.error(f"unknown rounds {sorted(unknown)}: choose from {', '.join(WAYS)}")
    print(header(), flush=True)
    rows = []
    for repeat in range(1, args.repeat + 1):
        for name in names:
            o = one_round(name, repeat, args.give_up)
            rows.append(o)
            print(f"round {name} #{repeat} ({o.seconds:.0f}s): {json.dumps(asdict(o))}", flush=True)
    print(
        f"\nthe squeeze in a {LIMIT} container with memory.oom.group=1 (lifetime: first allocation"
        " until its shell saw it die, or until the container's end; lag: the manager's worst"
        f" {TICK * 1000:.0f} ms tick lateness; gap: the siblings' longest heartbeat gap)"
    )
    print(table(rows))
    for line in targets(rows):
        print(line)


if __name__ == "__main__":
    main()
