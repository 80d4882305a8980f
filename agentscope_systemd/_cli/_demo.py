"""``agentscope demo``: a fleet, a runaway agent, and its kill named.

The demo launches a small fleet (cheap ``sh`` agents holding a few MB
each), starts the monitor with its memory guard, and lets one agent's tool
call grow until it is killed. It then shows what agentscope promises: the
kill is named (agent and process), the other agents and the manager live on,
the agents slice carries no limit, and the memory report says who holds
what. Every outcome is checked; the exit status is 0 only if all happened.

On a real host the runaway gets its own ``memory_max``: the kernel's OOM
killer takes it inside its scope, and the demo never squeezes the machine.
``--global-oom`` drops that cap and lets the tool call run the whole
machine short, on the kernel's defaults (no MGLRU ``min_ttl_ms``, the
kernel log closed to users): there the guard kills it before the kernel
has to, and its ``guard_kill`` event names it. Meant for the throwaway VM
of ``make demo``. Every agent the demo started is stopped on the way out,
also on Ctrl-C and SIGTERM.

Only the library's public API is used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from . import _render
from ._context import show
from ._errors import BadInput, Failed, Interrupted
from ._fleet import Options

__all__ = [
    "AgentSpec",
    "DemoSettings",
    "checks_of",
    "fleet_specs",
    "largest_per_agent",
    "run_demo",
    "verdict_view",
]

log = logging.getLogger("agentscope.demo")

_ROLES = ("planner", "coder-1", "coder-2", "coder-3", "reviewer", "tester", "docs", "indexer")
_HOLD_MB = (24, 12, 40, 16, 8, 32, 4, 20)
#: The agent whose tool call runs away (its index in the fleet).
RUNAWAY_INDEX = 2
#: The agent that runs in a tmux session once ``launch(..., terminal="tmux")``
#: exists; None until then. The one place to switch it on.
TMUX_AGENT: str | None = None

# Every agent holds N MB in a shell variable (so its largest process is its
# own ``sh``) and idles in ``sleep``: cheap under TCG, no interpreter start.
_HOLD = 'x=$(head -c $(($1 * 1048576)) /dev/zero | tr "\\0" x)\n'
_STEADY = _HOLD + "exec 3>&-\nwhile :; do sleep 3600; done\n"
# The runaway: the same, until the demo creates the trigger file; then a tool
# call (python3) that allocates and touches memory in large chunks until it
# is killed. The shell survives its child, as an agent survives a tool call.
_RUNAWAY = (
    _HOLD
    + 'while [ ! -e "$2" ]; do sleep 0.2; done\n'
    + '"$3" -c "$4"\n'
    + 'echo "tool call ended with status $?"\n'
    + "while :; do sleep 3600; done\n"
)
#: The tool call: issue #20's runaway, 16 MiB every 20 ms, each chunk touched
#: at once (bytes * n fills it). Without a cap, on the kernel's defaults, the
#: kernel alone let it squeeze the 768 MB TCG VM for 59-275 s (every agent
#: and the manager stalled); the guard kills it once MemAvailable falls to
#: 10%. It first idles 2 s, as a tool call starts up: the monitor (1 s
#: samples) sees it once before it grows, so a kernel kill in its capped
#: scope can be named without the kernel log (the user manager).
GROW = (
    "import time\ntime.sleep(2)\nchunks = []\nwhile True:\n"
    "    chunks.append(b'x' * (16 << 20))\n    time.sleep(0.02)\n"
)


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One demo agent: its name, what it holds, and whether it is the runaway."""

    name: str
    hold_mb: int
    runaway: bool = False
    terminal: str | None = None


def fleet_specs(count: int) -> list[AgentSpec]:
    """The demo fleet of ``count`` agents (at least 2: a runaway and a survivor).

    >>> [s.name for s in fleet_specs(3)]
    ['planner', 'coder-1', 'coder-2']
    >>> [s.name for s in fleet_specs(9) if s.runaway]
    ['coder-2']
    >>> [s.name for s in fleet_specs(2) if s.runaway]
    ['coder-1']
    """
    if count < 2:
        raise BadInput(f"the demo needs at least 2 agents, not {count}")
    specs = []
    for i in range(count):
        name = _ROLES[i] if i < len(_ROLES) else f"agent-{i + 1}"
        specs.append(
            AgentSpec(
                name=name,
                hold_mb=_HOLD_MB[i % len(_HOLD_MB)],
                runaway=i == min(RUNAWAY_INDEX, count - 1),
                terminal="tmux" if name == TMUX_AGENT else None,
            )
        )
    return specs


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """What ``agentscope demo`` was asked to do."""

    agents: int = 8
    memory_max: int | None = 256 << 20  # None: no cap, the guard's catch (--global-oom)
    timeout: float = 150.0
    interval: float = 1.0


# -- pure parts: checks and views -------------------------------------------


def largest_per_agent(
    processes: Sequence[Mapping[str, Any]], agents: Sequence[str]
) -> dict[str, dict[str, Any] | None]:
    """Each agent's largest process in a report's ``processes`` list (None if not listed)."""
    best: dict[str, dict[str, Any] | None] = dict.fromkeys(agents)
    for p in processes:
        agent = p.get("agent")
        if agent not in best:
            continue
        current = best[agent]
        if current is None or (p.get("rss") or 0) > (current.get("rss") or 0):
            best[agent] = {k: p.get(k) for k in ("pid", "comm", "rss")}
    return best


def checks_of(summary: Mapping[str, Any]) -> dict[str, bool]:
    """The outcomes the demo promises, each True only if it happened.

    Capped (the default): the kernel OOM-kills the tool call in its scope.
    Uncapped (``global_oom``): the guard kills it and the kernel never has to.
    """
    runaway = summary.get("runaway")
    kills = summary.get("kills") or []
    kill = summary.get("kill") or {}
    after = {a["name"]: a for a in summary.get("agents_after") or []}
    others = [n for n in summary.get("agents") or [] if n != runaway]
    limits = summary.get("slice_limits") or {}
    largest = summary.get("largest_per_agent") or {}
    if summary.get("global_oom"):
        caught = {
            "guard_kill_seen": kill.get("kind") == "guard_kill",
            "no_kernel_oom_kill": not summary.get("oom_kills")
            and not summary.get("kernel_oom_kills"),
        }
    else:
        caught = {"oom_kill_seen": kill.get("kind") == "oom_kill"}
    return {
        **caught,
        "runaway_named": kill.get("agent") == runaway,
        "process_named": bool(kill.get("comm")) and kill.get("pid") is not None,
        "only_the_runaway_killed": bool(kills) and all(k.get("agent") == runaway for k in kills),
        "others_running": bool(others)
        and all(after.get(n, {}).get("state") == "running" for n in others)
        and all(n in summary.get("alive_after", []) for n in others),
        "manager_alive": bool(summary.get("manager_alive")),
        "slice_unlimited": bool(limits) and all(v is None for v in limits.values()),
        "report_names_every_agent": bool(largest)
        and all(largest.get(n) is not None for n in others),
    }


_CHECK_TEXT = {
    "oom_kill_seen": "the kernel OOM-killed a process in the agents slice",
    "guard_kill_seen": "the guard killed the runaway before the host thrashed",
    "no_kernel_oom_kill": "the kernel's OOM killer never had to act",
    "runaway_named": "the monitor named the runaway agent",
    "process_named": "and its killed process",
    "only_the_runaway_killed": "nothing else was killed",
    "others_running": "the other agents kept running",
    "manager_alive": "the manager (this process) kept running",
    "slice_unlimited": "the agents slice has no memory limit",
    "report_names_every_agent": "the report names each agent's largest process",
}


def verdict_view(checks: Mapping[str, bool]) -> Group:
    """One line per promised outcome: ``ok`` or ``FAILED``."""
    lines: list[RenderableType] = []
    for key, passed in checks.items():
        line = Text("  ok     " if passed else "  FAILED ", style="green" if passed else "bold red")
        line.append(_CHECK_TEXT.get(key, key))
        lines.append(line)
    return Group(*lines)


def oom_line(kill: Mapping[str, Any], seconds: float | None) -> Text:
    """``OOM kill: agent coder-2, process python3 (pid 812, 410.0 MiB), from the kernel log``."""
    source = {
        "kmsg": "named by the kernel log",
        "reaped": "named from the reaped child",
        "cgroup": "named from the process that left the scope",
    }.get(str(kill.get("source")), str(kill.get("source")))
    text = Text("OOM kill", style="bold red")
    text.append(f": agent {kill.get('agent') or '?'}, process {kill.get('comm') or '?'}")
    text.append(f" (pid {kill.get('pid') or '?'}")
    if kill.get("rss_last_seen"):
        text.append(f", {_render.format_bytes(kill['rss_last_seen'])} last seen")
    text.append(f"), {source}")
    if seconds is not None:
        text.append(f"; {seconds:.1f}s after the tool call began")
    return text


def guard_line(kill: Mapping[str, Any], seconds: float | None) -> Text:
    """``guard kill: agent coder-2, process python3 (pid 812, 410.0 MiB) at MemAvailable 9.8%``."""
    text = Text("guard kill", style="bold red")
    text.append(f": agent {kill.get('agent') or '?'}, process {kill.get('comm') or '?'}")
    size = (kill.get("rss") or 0) + (kill.get("swap") or 0)
    text.append(f" (pid {kill.get('pid') or '?'}, {_render.format_bytes(size)})")
    if kill.get("trigger") == "psi":
        text.append(f" at PSI full {kill.get('psi_full_avg10')}%")
    else:
        text.append(f" at MemAvailable {kill.get('mem_available_percent', 0):.1f}%")
    if kill.get("reaction_seconds") is not None:
        text.append(f", {kill['reaction_seconds'] * 1000:.0f} ms after the crossing")
    if seconds is not None:
        text.append(f"; {seconds:.1f}s after the tool call began")
    return text


def report_table(
    agents: Sequence[Mapping[str, Any]], largest: Mapping[str, Mapping[str, Any] | None]
) -> Table:
    """Per agent: its memory, its largest process and that process's RSS."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("AGENT", "MEMORY", "PEAK", "OOM KILLS", "LARGEST PROCESS", "RSS"):
        right = name in ("MEMORY", "PEAK", "OOM KILLS", "RSS")
        table.add_column(name, justify="right" if right else "left", no_wrap=True)
    by_name = {str(a.get("agent")): a for a in agents}
    for name, proc in largest.items():
        a = by_name.get(name, {})
        _render.add_row(
            table,
            name,
            _render.format_bytes(a.get("memory_current")),
            _render.format_bytes(a.get("memory_peak")),
            str(a.get("oom_kills", "-")),
            "-" if proc is None else f"{proc.get('comm')} (pid {proc.get('pid')})",
            "-" if proc is None else _render.format_bytes(proc.get("rss")),
        )
    return table


# -- the run ------------------------------------------------------------------


class _Warnings(logging.Handler):
    """Keeps the library's warnings (no OOMPolicy on this systemd...) for the summary."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _Story:
    """Prints the demo as it happens (nothing with --json)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.console = Console(highlight=False)

    def say(self, *items: RenderableType) -> None:
        if not self.quiet:
            for item in items:
                if isinstance(item, Text):  # a sentence wraps at the terminal
                    self.console.print(item)
                else:  # a table: at its full width, never a folded unit name
                    show(item, self.console)

    def step(self, title: str) -> None:
        self.say(Text(""), Text(f"== {title}", style="bold"))


def run_demo(opts: Options, settings: DemoSettings) -> None:
    """Run the demo; print the story (or the JSON summary with --json).

    Raises:
        Failed: an outcome did not happen, or SIGTERM interrupted the demo (exit 1).
        Interrupted: Ctrl-C (exit 130); every agent it started is stopped.
        SystemdUnavailable, AgentscopeError: from the library (exit 4, 1).
    """
    specs = fleet_specs(settings.agents)
    fleet_name = "demo" if opts.fleet == "default" else opts.fleet
    story = _Story(quiet=opts.json)
    warnings = _Warnings()
    signals: list[int] = []
    logging.getLogger("agentscope").addHandler(warnings)
    try:
        summary = asyncio.run(
            _demo(opts.manager, fleet_name, specs, settings, story, warnings, signals)
        )
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Before the fleet was open: nothing was started.
        raise Interrupted("the demo was interrupted before it started anything") from None
    finally:
        logging.getLogger("agentscope").removeHandler(warnings)
    if opts.json:
        from agentscope_systemd._contract import stamped

        sys.stdout.write(json.dumps(stamped("demo", summary), default=str) + "\n")
        sys.stdout.flush()
    if summary.get("interrupted"):
        message = "the demo was interrupted; every agent it started is stopped"
        if signal.SIGINT in signals:  # Ctrl-C: 130, as from every command
            raise Interrupted(message)
        raise Failed(message, "terminated")  # SIGTERM: exit 1
    failed = [k for k, ok in summary["checks"].items() if not ok]
    if failed:
        raise Failed(
            "the demo did not show what it should: " + ", ".join(_CHECK_TEXT[k] for k in failed),
            "demo_failed",
        )


async def _demo(
    manager: str,
    fleet_name: str,
    specs: Sequence[AgentSpec],
    settings: DemoSettings,
    story: _Story,
    warnings: _Warnings,
    signals: list[int],
) -> dict[str, Any]:
    from agentscope_systemd import AsyncFleet, probe

    t0 = time.monotonic()
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()

    # Either signal cancels the main task (as asyncio.run does for SIGINT);
    # which one came decides the exit code (Ctrl-C: 130, SIGTERM: 1).
    def interrupt(signum: int) -> None:
        signals.append(signum)
        main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt, sig)
    caps = await probe(manager)
    runaway = next(s for s in specs if s.runaway)
    summary: dict[str, Any] = {
        "fleet": fleet_name,
        "manager": caps.manager,
        "systemd_version": caps.systemd_version,
        "scope_oom_policy": caps.scope_oom_policy,
        "global_oom": settings.memory_max is None,
        "memory_max": settings.memory_max,
        "agents": [s.name for s in specs],
        "runaway": runaway.name,
        "manager_pid": os.getpid(),
        "interrupted": False,
        "timings": {"probed": round(time.monotonic() - t0, 1)},
    }
    story.say(
        Text(
            f"agentscope demo: {len(specs)} agents in fleet {fleet_name!r}, "
            f"{caps.manager} manager, systemd {caps.systemd_version}",
            style="bold",
        ),
        Text(
            f"each agent gets its own scope under {caps.slice}, "
            + (
                "with OOMPolicy=continue"
                if caps.scope_oom_policy
                else "without OOMPolicy (this systemd refuses it on scopes: see the warning)"
            )
        ),
    )
    workdir = Path(tempfile.mkdtemp(prefix="agentscope-demo-"))
    trigger = workdir / "grow"
    python = shutil.which("python3") or sys.executable
    launched: list[str] = []
    fleet = AsyncFleet(fleet_name, manager)
    names = {s.name for s in specs}
    try:
        await fleet.open()
        # Agents left by an earlier demo that was SIGKILLed would block the names.
        leftovers = [a.name for a in await fleet.agents() if a.name in names]
        if leftovers:
            story.say(Text(f"stopping {len(leftovers)} agents left by an earlier demo"))
            await _stop_all(fleet, leftovers)
        await _story_body(
            fleet, specs, settings, story, summary, launched, trigger, python, workdir, t0
        )
    except asyncio.CancelledError:
        # Handled here: the cleanup below must not see a pending cancellation.
        main.uncancel()
        summary["interrupted"] = True
        story.say(Text("interrupted: stopping the demo's agents", style="yellow"))
    finally:
        # Cleanup must finish even if a second Ctrl-C or SIGTERM arrives.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: None)
        cleanup = asyncio.ensure_future(_stop_demo_agents(fleet, launched, names))
        stopped, errors = await asyncio.shield(cleanup)
        _mark(summary, "stopped", t0)
        summary["stopped"] = stopped
        summary["stop_errors"] = errors
        await fleet.aclose()
        shutil.rmtree(workdir, ignore_errors=True)
    summary["warnings"] = list(warnings.messages)
    summary["elapsed"] = round(time.monotonic() - t0, 1)
    summary["checks"] = checks_of(summary)
    if not summary["interrupted"]:
        story.say(Text(""), Text("== what happened", style="bold"), verdict_view(summary["checks"]))
        story.say(
            Text(
                f"stopped the demo's {len(summary['stopped'])} agents; "
                f"{summary['elapsed']:.0f}s in all",
                style="dim",
            )
        )
    return summary


async def _stop_demo_agents(
    fleet: Any, launched: Sequence[str], names: set[str]
) -> tuple[list[str], list[str]]:
    """Stop what the demo launched, and any demo agent whose launch was interrupted."""
    from agentscope_systemd import AgentscopeError

    found = list(launched)
    with contextlib.suppress(AgentscopeError):
        found += [a.name for a in await fleet.agents() if a.name in names and a.name not in found]
    return await _stop_all(fleet, found)


async def _stop_all(fleet: Any, names: Sequence[str]) -> tuple[list[str], list[str]]:
    from agentscope_systemd import AgentNotFound, AgentscopeError

    async def one(name: str) -> str | None:
        try:
            await fleet.stop(name, timeout=5)
        except AgentNotFound:
            return None
        except AgentscopeError as exc:
            return f"{name}: {exc}"
        return None

    results = await asyncio.gather(*(one(n) for n in names))
    errors = [r for r in results if r is not None]
    return [n for n, r in zip(names, results, strict=True) if r is None], errors


async def _story_body(
    fleet: Any,
    specs: Sequence[AgentSpec],
    settings: DemoSettings,
    story: _Story,
    summary: dict[str, Any],
    launched: list[str],
    trigger: Path,
    python: str,
    workdir: Path,
    t0: float,
) -> None:
    from agentscope_systemd import DEVNULL, GuardKill, OomKill

    runaway = next(s for s in specs if s.runaway)
    story.step(f"launching {len(specs)} agents, each in its own scope")
    log_path = workdir / "runaway.log"
    with log_path.open("wb") as out:
        for spec in specs:
            script = _RUNAWAY if spec.runaway else _STEADY
            extra: dict[str, Any] = {} if spec.terminal is None else {"terminal": spec.terminal}
            await fleet.launch(
                spec.name,
                ["sh", "-c", script, "sh", str(spec.hold_mb), str(trigger), python, GROW],
                stdin=DEVNULL,
                stdout=out if spec.runaway else DEVNULL,
                stderr=out if spec.runaway else DEVNULL,
                memory_max=settings.memory_max if spec.runaway else None,
                **extra,
            )
            launched.append(spec.name)
    _mark(summary, "launched", t0)
    # Let every shell fill its variable before the first table.
    await _wait_filled(fleet, specs, timeout=30)
    _mark(summary, "filled", t0)
    before = [a.to_dict() for a in await fleet.agents()]
    summary["agents_before"] = before
    story.step("the fleet before")
    story.say(_render.ls_table(before))

    kills: list[dict[str, Any]] = []
    # No pressure reports: each is a host-wide /proc pass with smaps_rollup of
    # the largest processes (the runaway first), taken in the middle of the
    # squeeze; in a starved TCG VM that held a CPU for 24 s before the kill.
    no_pressure = {"pressure_some_avg10": 100.0, "available_fraction": 1e-9}
    kernel_before = await asyncio.to_thread(_kernel_oom_kills)
    async with fleet.monitor(
        interval=settings.interval, top=10, guard=True, **no_pressure
    ) as monitor:
        cap = (
            "no per-agent limit: the whole machine runs short, and the guard steps in"
            if settings.memory_max is None
            else f"memory_max {_render.format_bytes(settings.memory_max)} on its scope only, "
            "so this machine is never squeezed"
        )
        story.step(f"{runaway.name}'s tool call starts to allocate ({cap})")
        await asyncio.to_thread(trigger.touch)
        started = time.monotonic()
        events = monitor.__aiter__()
        deadline = started + settings.timeout
        first_at: float | None = None
        while True:
            # After the first kill, a short wait for any second one.
            until = deadline if first_at is None else min(deadline, first_at + 3.0)
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left):
                    event = await anext(events)
            except (TimeoutError, StopAsyncIteration):
                break
            if isinstance(event, (OomKill, GuardKill)):
                data = event.to_dict()
                data["seconds"] = round(time.monotonic() - started, 1)
                kills.append(data)
                line = oom_line if isinstance(event, OomKill) else guard_line
                story.say(line(data, data["seconds"]))
                if first_at is None:
                    first_at = time.monotonic()
        if not kills:
            story.say(
                Text(f"no kill within {settings.timeout:.0f}s", style="bold red"),
            )
    summary["kills"] = kills
    summary["kill"] = kills[0] if kills else None
    summary["oom_kills"] = [k for k in kills if k.get("kind") == "oom_kill"]
    summary["guard_kills"] = [k for k in kills if k.get("kind") == "guard_kill"]
    # Any kernel OOM kill on the host (/proc/vmstat), in the slice or not.
    after_count = await asyncio.to_thread(_kernel_oom_kills)
    summary["kernel_oom_kills"] = (
        None if after_count is None or kernel_before is None else after_count - kernel_before
    )
    summary["seconds_to_kill"] = kills[0]["seconds"] if kills else None

    _mark(summary, "killed", t0)
    after_agents = await fleet.agents()
    after = [a.to_dict() for a in after_agents]
    summary["agents_after"] = after
    summary["alive_after"] = [a.name for a in after_agents if a.alive()]
    summary["manager_alive"] = True  # this process is the manager, and it got here
    summary["manager_oom_score_adj"] = await asyncio.to_thread(_own_oom_score_adj)
    story.step("the fleet after")
    story.say(_render.ls_table(after))
    others = [a for a in summary["alive_after"] if a != runaway.name]
    story.say(
        Text(
            f"{len(others)} other agents running; the manager (pid {os.getpid()}, "
            f"oom_score_adj {summary['manager_oom_score_adj']}) running"
            + (
                f"; {runaway.name}'s shell survived its tool call"
                if runaway.name in summary["alive_after"]
                else ""
            )
        )
    )

    limits = await fleet.slice_limits()
    summary["slice_limits"] = limits
    story.step(f"the agents slice ({fleet.slice})")
    story.say(
        Text(
            "limits: "
            + ", ".join(
                f"{k}={'none' if v is None else _render.format_bytes(v)}" for k, v in limits.items()
            )
        )
    )

    report = (await fleet.report(top=100)).to_dict()
    _mark(summary, "reported", t0)
    largest = largest_per_agent(report["processes"], [s.name for s in specs])
    summary["largest_per_agent"] = largest
    summary["report"] = {
        "host": report["host"],
        "pressure": report["pressure"],
        "agents": report["agents"],
        "processes": report["processes"][:10],
    }
    story.step("the memory report: each agent's largest process")
    story.say(report_table(report["agents"], largest))
    outside = [p for p in report["processes"][:10] if p.get("agent") is None][:3]
    if outside:
        story.say(
            Text(
                "largest processes outside the fleet: "
                + ", ".join(
                    f"{p['comm']} (pid {p['pid']}, {_render.format_bytes(p['rss'])})"
                    for p in outside
                ),
                style="dim",
            )
        )


async def _wait_filled(fleet: Any, specs: Sequence[AgentSpec], timeout: float) -> None:
    """Until each agent's scope holds what its shell was asked to hold (or the timeout)."""
    want = {s.name: s.hold_mb << 20 for s in specs}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = {a.name: a.memory_current or 0 for a in await fleet.agents()}
        if all(current.get(n, 0) >= size for n, size in want.items()):
            return
        await asyncio.sleep(0.5)


def _mark(summary: dict[str, Any], phase: str, t0: float) -> None:
    """Seconds since the start at the end of each phase (``timings`` in the summary)."""
    summary["timings"][phase] = round(time.monotonic() - t0, 1)


def _kernel_oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat ``oom_kill``, 4.13+)."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _own_oom_score_adj() -> int | None:
    try:
        return int(Path("/proc/self/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None
