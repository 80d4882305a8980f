"""The watching commands: report, events, top, and the foreground monitor.

rich, the renderers and the monitor's machinery are imported by the command
that uses them: ``events --json`` prints without them (issue 28).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._context import emit_json, fleet_of, options, show, valid_agent
from ._direct import LIMIT, print_events
from ._errors import BadInput, Failed, Interrupted
from ._parse import duration_option, real_option, whole_option

if TYPE_CHECKING:
    import queue
    from types import FrameType

    from agentscope_systemd import Fleet
    from agentscope_systemd._fleet._blocking import BlockingMonitor
    from agentscope_systemd.watchdog import FatalLog

    from ._fleet import Options
    from ._http import FaceState
    from ._notify import Notifier

__all__ = ["events", "monitor", "report", "top"]

# The bounds of the numbers these commands take (docs/cli.md lists them).
MAX_INTERVAL = 86400.0
_TOP = whole_option("--top", 0, 10_000)
_INTERVAL = duration_option("--interval", 0.1, MAX_INTERVAL)


def _top_option(help: str) -> Any:
    return typer.Option(help=help, metavar="N", parser=_TOP)


def _interval_option(between: str) -> Any:
    """``--interval`` of top and the monitor: the time between ``between``."""
    return typer.Option(
        help=f"Time between {between}: a time span (2, 500ms, 1min; 100ms to 1d).",
        parser=_INTERVAL,
        metavar="SPAN",
    )


def _monitor_option(
    option: str,
    help: str,
    *,
    metavar: str | None = None,
    parser: Callable[[object], float] | None = None,
    envvar: str | None = None,
) -> Any:
    """A monitor option, also read from ``$AGENTSCOPE_<OPTION>`` (a unit's Environment=)."""
    name = option.partition("/")[0].removeprefix("--").replace("-", "_").upper()
    return typer.Option(
        option, help=help, metavar=metavar, envvar=envvar or f"AGENTSCOPE_{name}", parser=parser
    )


def _guard_percent(option: str, help: str) -> Any:
    """A guard threshold in percent, 0 to 100."""
    return _monitor_option(option, help, metavar="PCT", parser=real_option(option, 0, 100))


def report(
    ctx: typer.Context,
    top: Annotated[int, _top_option("How many top processes to show (0-10000).")] = 10,
) -> None:
    """The memory report: per agent, and the top processes with their agents.

    Examples:

    \b
      agentscope report --top 5
      agentscope --json report
    """
    with fleet_of(ctx) as fleet:
        data = fleet.report(top=top).to_dict()
    if options(ctx).json:
        emit_json("report", data)
    else:
        from . import _render

        show(_render.report_view(data))


def events(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events.")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="Only events from TIME on: -1h, 1h30min ago, today, ISO 8601, ..."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only events before this (same forms as --since).")
    ] = None,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    agent: Annotated[
        str | None, typer.Option(help="Only events of this agent.", callback=valid_agent)
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            help="Only the newest N events that match (0-1000000000).",
            metavar="N",
            parser=LIMIT,
        ),
    ] = None,
) -> None:
    """Print the fleet's recorded events (OOM kills, throttling, starts, exits).

    Reads the registry file alone: works without systemd (no bus needed).

    Examples:

    \b
      agentscope events --since "1h ago" --kind oom_kill
      agentscope --json events --follow
    """
    print_events(
        options(ctx), follow=follow, since=since, until=until, kind=kind, agent=agent, limit=limit
    )


def top(
    ctx: typer.Context,
    interval: Annotated[float, _interval_option("refreshes")] = 1.0,
) -> None:
    """A live view of the fleet: agents with memory bars, PSI, recent events; q quits.

    Examples:

    \b
      agentscope top --interval 500ms
    """
    from agentscope_systemd._contract import agent_list

    from . import _render
    from ._top import run_top, snapshot

    opts = options(ctx)
    with fleet_of(ctx) as fleet:
        if opts.json:
            screen = snapshot(fleet, time.time())
            emit_json("top", {**screen, "agents": agent_list(screen["agents"])})
        elif not sys.stdout.isatty():
            show(_render.ls_table([a.to_dict() for a in fleet.agents()]))
        else:
            run_top(fleet, interval)


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived: leave the monitor loop cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Stop:
    """The monitor's SIGTERM and SIGINT handler.

    Until the event loop runs, a signal raises :class:`_Stopped` at once
    (opening the fleet may wait on the bus). Once :meth:`defer` is called it
    only records the signal, and the loop stops at its next look
    (:meth:`check`): an exception raised there could land after an event
    left the queue and before it was printed, and lose it (CI, sd247, user
    manager: a guard kill in the log, missing from ``--json``). A second
    signal while stopping raises at once: it cuts the drain short.
    """

    #: how long the loop waits for an event before it looks again
    POLL = 0.2

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferred = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self._deferred and self.signum is None:
            self.signum = signum
            return
        raise _Stopped(signum)

    def defer(self) -> None:
        """From now on a first signal is a flag for :meth:`check`."""
        self._deferred = True

    def check(self) -> None:
        """Raise :class:`_Stopped` if a signal came."""
        if self.signum is not None:
            raise _Stopped(self.signum)

    def wait(self, due: float) -> float:
        """How long a loop may wait for an event: until ``due`` (its tick), at most :attr:`POLL`."""
        return min(self.POLL, max(0.0, due - time.monotonic()))


def monitor(
    ctx: typer.Context,
    interval: Annotated[float, _interval_option("samples")] = 2.0,
    top: Annotated[int, _top_option("Top processes kept per sample (0-10000).")] = 10,
    listen: Annotated[
        str | None,
        _monitor_option(
            "--listen",
            "Serve /health, /metrics and the read API (/v1/) on HOST:PORT (loopback) "
            "or on unix:PATH (a socket of mode 0600).",
            metavar="HOST:PORT|unix:PATH",
            envvar="AGENTSCOPE_MONITOR_LISTEN",
        ),
    ] = None,
    listen_any: Annotated[
        bool,
        _monitor_option(
            "--listen-any",
            "Allow --listen on an address other than loopback.",
            envvar="AGENTSCOPE_MONITOR_LISTEN_ANY",
        ),
    ] = False,
    guard: Annotated[
        bool,
        _monitor_option(
            "--guard/--no-guard",
            "Run the memory guard: kill an agent's runaway before the host thrashes.",
        ),
    ] = False,
    guard_mem_available: Annotated[
        float,
        _guard_percent(
            "--guard-mem-available", "Guard: act when MemAvailable is at most PCT % of MemTotal ..."
        ),
    ] = 10.0,
    guard_swap_free: Annotated[
        float,
        _guard_percent(
            "--guard-swap-free",
            "... and SwapFree at most PCT % of SwapTotal (no swap counts as 0 %).",
        ),
    ] = 20.0,
    guard_psi_full: Annotated[
        str,
        _monitor_option(
            "--guard-psi-full",
            "Guard: or act when PSI memory full avg10 stays at PCT % or more; 'off'.",
            metavar="PCT|off",
        ),
    ] = "60",
    guard_psi_seconds: Annotated[
        float,
        _monitor_option(
            "--guard-psi-seconds",
            "Guard: how long PSI full must stay over --guard-psi-full: a time span "
            "(10, 30s, 1min; at most 1h).",
            metavar="SPAN",
            parser=duration_option("--guard-psi-seconds", 0, 3600),
        ),
    ] = 10.0,
    guard_process: Annotated[
        bool,
        _monitor_option(
            "--guard-process",
            "Guard: run in a small process of its own, not a thread of the monitor.",
        ),
    ] = False,
    reclaim_escaped: Annotated[
        bool,
        _monitor_option(
            "--reclaim-escaped",
            "Move an agent's processes that left its scope back into it (and say so).",
        ),
    ] = False,
) -> None:
    """Run the monitor in the foreground, recording and printing its events.

    Stops cleanly on SIGTERM (exit 0) and SIGINT (Ctrl-C: exit 130), after
    printing the events the monitor already has (a guard kill of a moment
    ago included; at most 10 s, and a second signal stops at once). Under
    systemd (Type=notify, $NOTIFY_SOCKET set) it sends READY=1, then
    WATCHDOG=1 and a STATUS= line every tick (at least twice per
    WatchdogSec=); started by systemd, it
    writes the reason it stopped on an error to monitor-FLEET.fatal.log in
    the state directory. With --guard it also runs the memory guard
    (docs/guard.md) and prints its kills; as root the monitor then sets its
    own oom_score_adj to -1000, so the kernel never picks the guard. An
    agent's process that lives outside its scope (systemd-run --scope, tmux's
    pane scopes) is printed once as an escaped event; with --reclaim-escaped
    it is moved back first, and the event says whether that worked
    (docs/escapes.md).

    Examples:

    \b
      agentscope monitor --guard --listen 127.0.0.1:9101
      agentscope monitor --interval 5s --guard-psi-seconds 30s
    """
    import contextlib
    import signal

    from ._http import FaceState, HttpFace, parse_listen, start_face
    from ._notify import Notifier

    opts = options(ctx)
    address = parse_listen(listen, any_address=listen_any) if listen is not None else None
    # Checked also when the guard is off: a bad value in the unit's
    # environment is refused now, not when the guard is next turned on.
    checked = _guard_config(
        guard_mem_available,
        guard_swap_free,
        guard_psi_full,
        guard_psi_seconds,
        process=guard_process,
    )
    guard_config = checked if guard else False
    notifier = Notifier()
    fatal = _monitor_fatal_log(opts)
    from agentscope_systemd import RegistryError

    stop = _Stop()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    face: HttpFace | None = None
    interrupted = False
    try:
        with contextlib.ExitStack() as stack:
            try:
                fleet = stack.enter_context(fleet_of(ctx))
            except RegistryError as exc:
                if not guard_config:
                    raise
                # The guard must not depend on the registry (issue #25): it
                # runs alone, and says its kills are not being recorded.
                _guard_alone(opts, guard_config, exc, interval, notifier, stop)
                return
            stream = stack.enter_context(
                fleet.monitor(
                    interval=interval, top=top, guard=guard_config, reclaim_escaped=reclaim_escaped
                )
            )
            state = None
            if address is not None:
                from agentscope_systemd import __version__

                state = FaceState(fleet.name, fleet.manager, interval, __version__)
                if guard_config:
                    state.guard = stream.guard_running
                # The read API's events come from this fleet, whose core reads
                # its registry off its loop (agentscope_systemd/_cli/_readapi.py says why not a
                # registry of the face's own); the face closes before it.
                face = start_face(address, state, fleet)
                stack.callback(face.close)
                sys.stderr.write(f"serving /health, /metrics and /v1/ on {face.url}\n")
                sys.stderr.flush()
            _monitor_loop(fleet, stream, interval, notifier, opts.json, stop, state)
    except _Stopped as stopped:
        if stopped.signum == signal.SIGINT:  # Ctrl-C: 130 once stopped cleanly
            interrupted = True
    except BaseException as exc:
        if fatal is not None and not isinstance(exc, KeyboardInterrupt | SystemExit):
            fatal.record(exc, where=f"agentscope monitor --fleet {opts.fleet}")
        raise
    finally:
        if face is not None:
            face.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        # Best effort: a stale socket must not hide why the monitor stopped.
        with contextlib.suppress(Failed):
            notifier.send(STOPPING=1)
        if fatal is not None:
            fatal.uninstall()
    if interrupted:
        raise Interrupted("interrupted; the monitor stopped cleanly")


def _guard_config(
    mem_available: float, swap_free: float, psi_full: str, psi_seconds: float, *, process: bool
) -> Any:
    """The GuardConfig of ``monitor --guard``'s options.

    Raises:
        BadInput: --guard-psi-full is neither a number nor 'off'.
        InvalidConfig: a value out of its range (exit 2, naming the option's field).
    """
    from agentscope_systemd import GuardConfig, _numbers

    psi: float | None
    if psi_full.strip().lower() == "off":
        psi = None
    else:
        try:
            psi = _numbers.real("--guard-psi-full", psi_full, low=0, high=100, above_low=True)
        except ValueError:
            raise BadInput(
                f"--guard-psi-full {psi_full!r} is not a percentage above 0 and at most 100; "
                "give e.g. 60, or 'off'"
            ) from None
    # A process that runs only the monitor may keep the kernel's OOM killer
    # off itself; root can, others cannot lower it (proc(5), oom_score_adj:
    # lowering it needs CAP_SYS_RESOURCE).
    return GuardConfig(
        mem_available_percent=mem_available,
        swap_free_percent=swap_free,
        psi_full_percent=psi,
        psi_full_seconds=psi_seconds,
        oom_score_adj=-1000 if os.geteuid() == 0 else None,
        process=process,
    )


def _monitor_fatal_log(opts: Options) -> FatalLog | None:
    """The fatal-reason log of a monitor that systemd started, else None.

    Only under systemd ($INVOCATION_ID): there nobody watches the terminal,
    and "why did it stop" must have an answer on disk. A log that cannot be
    opened costs the monitor nothing: it says so and runs without.
    """
    if not os.environ.get("INVOCATION_ID"):
        return None
    import faulthandler

    from agentscope_systemd import default_registry_path
    from agentscope_systemd._paths import open_under
    from agentscope_systemd.watchdog import install_fatal_log

    manager = opts.resolved_manager
    state_dir = default_registry_path("system" if manager == "system" else "user").parent
    name = f"monitor-{opts.fleet}.fatal.log"
    path = state_dir / name
    # Nothing a monitor writes is for other users (rotated logs included).
    os.umask(0o077)
    try:
        os.close(open_under(state_dir, (name,)))  # 0600, and not through a symlink
        fatal = install_fatal_log(path)
        # A watchdog kill (SIGABRT) or a crash in C code never reaches the
        # hooks above: faulthandler writes every thread's Python stack, which
        # shows where the loop was stuck.
        faults = path.open("a", encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"agentscope monitor: no fatal log at {path}: {exc}\n")
        return None
    faulthandler.enable(faults, all_threads=True)
    _FAULT_FILES.append(faults)  # the fd must stay open for faulthandler
    return fatal


_FAULT_FILES: list[Any] = []


_END = object()
#: At SIGTERM/SIGINT, how long the events the monitor already has may take to
#: come out: its close stops the guard and waits for the sample in flight.
_DRAIN_TIMEOUT = 10.0


def _guard_alone(
    opts: Options,
    config: Any,
    reason: Exception,
    interval: float,
    notifier: Notifier,
    stop: _Stop,
    *,
    slice_path: Any = None,
    proc_root: Any = None,
    cgroup_root: Any = None,
    until: Callable[[], bool] = lambda: False,
) -> None:
    """The registry cannot be opened: the guard alone over the agents slice, until a signal.

    Its kills and holds are printed and logged, not recorded; it says so
    first (stderr, STATUS=). ``slice_path`` and the roots default to the
    manager's agents slice on this host; ``until`` ends it (tests).
    """
    import contextlib
    import queue
    from pathlib import Path

    from agentscope_systemd import _names
    from agentscope_systemd._contract import json_line, monitor_event_dict
    from agentscope_systemd._guard._guardthread import Guard
    from agentscope_systemd._managers import _scope

    from . import _render

    if slice_path is None:
        slice_path = Path(_scope.slice_cgroup(opts.resolved_manager, _names.DEFAULT_SLICE))
    note = (
        f"the registry cannot be opened ({reason}): the memory guard runs alone; "
        "its kills are not being recorded"
    )
    sys.stderr.write(f"agentscope monitor: {note}\n")
    sys.stderr.flush()
    inbox: queue.Queue[Any] = queue.Queue(maxsize=1024)
    roots = {k: v for k, v in (("proc_root", proc_root), ("cgroup_root", cgroup_root)) if v}
    guard = Guard(config, slice_path, on_kill=inbox.put_nowait, on_held=inbox.put_nowait, **roots)
    guard.start()
    period = min(interval, notifier.watchdog / 2) if notifier.watchdog else interval
    notifier.send(READY=1, STATUS=note)

    def show_event(item: Any) -> None:
        if opts.json:
            line = json_line(monitor_event_dict(opts.fleet, item))
        else:
            line = _render.event_line(item.to_dict())
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    stop.defer()
    due = time.monotonic() + period
    try:
        while not until():
            stop.check()
            with contextlib.suppress(queue.Empty):
                show_event(inbox.get(timeout=stop.wait(due)))
            if time.monotonic() >= due:
                notifier.send(WATCHDOG=1, STATUS=note)
                due = time.monotonic() + period
    finally:
        guard.stop()
        while not inbox.empty():  # a kill of a moment ago still goes out
            show_event(inbox.get_nowait())


def _monitor_loop(
    fleet: Fleet,
    stream: BlockingMonitor,
    interval: float,
    notifier: Notifier,
    as_json: bool,
    stop: _Stop,
    face: FaceState | None = None,
) -> None:
    import queue
    import threading

    from agentscope_systemd._contract import json_line, monitor_event_dict

    from . import _render

    # The events arrive on a thread of their own so that ticks (WATCHDOG=1,
    # STATUS=) go out on time even while no event comes. The queue is bounded
    # and the thread stops with the loop: a stream that never ends must not
    # outlive the command or fill memory.
    inbox: queue.Queue[object] = queue.Queue(maxsize=1024)
    ended = threading.Event()
    # sd_watchdog_enabled(3): ping at half the interval the manager asked for.
    period = min(interval, notifier.watchdog / 2) if notifier.watchdog else interval

    def deliver(item: object) -> bool:
        while not ended.is_set():
            try:
                inbox.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for event in stream:
                if not deliver(event):
                    return
        except BaseException as exc:  # handed to the main thread, which raises it
            deliver(exc)
        deliver(_END)

    def print_event(item: Any) -> None:
        data = item.to_dict()
        if face is not None:
            face.event(data)
        if as_json:  # the shape events --json prints of the same event
            line = json_line(monitor_event_dict(fleet.name, item))
        else:
            line = _render.event_line(data)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    try:  # from here on, any way out (a signal included) stops the pump
        threading.Thread(target=pump, name="agentscope-monitor", daemon=True).start()
        notifier.send(READY=1, STATUS=_sample(fleet, face))
        stop.defer()
        due = time.monotonic() + period
        while True:
            stop.check()
            try:
                item = inbox.get(timeout=stop.wait(due))
            except queue.Empty:
                item = None
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                print_event(item)
            elif time.monotonic() < due:
                continue  # nothing came yet: look for a stop again
            # One sample a period, however many events come: a burst of
            # events must not turn into a burst of full samples.
            if time.monotonic() >= due:
                notifier.send(WATCHDOG=1, STATUS=_sample(fleet, face))
                due = time.monotonic() + period
            if face is not None:  # the watch's own failures, logged by the library
                face.watch(
                    getattr(stream, "failures", 0), getattr(stream, "consecutive_failures", 0)
                )
    except _Stopped:
        # A stop, not a loss: the guard's kill of a moment ago may still be on
        # its way (CI, bookworm: killed, then missing from --json). Closing the
        # stream ends it after every event it already has; print those first.
        _drain(stream, inbox, print_event)
        raise
    finally:
        ended.set()


def _drain(
    stream: BlockingMonitor, inbox: queue.Queue[object], print_event: Callable[[Any], None]
) -> None:
    """Close ``stream`` and show what it still yields, for at most :data:`_DRAIN_TIMEOUT`."""
    import queue

    stream.close()
    deadline = time.monotonic() + _DRAIN_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        try:
            item = inbox.get(timeout=left)
        except queue.Empty:
            break
        if item is _END or isinstance(item, BaseException):
            return
        print_event(item)
    sys.stderr.write("agentscope monitor: stopped before its last events came out\n")


def _sample(fleet: Fleet, face: FaceState | None) -> str:
    """The STATUS= line; with an HTTP face, also a memory report (no /proc scan) for it.

    A report that fails is counted as a scrape error, not fatal: the files
    of a scope can vanish mid-read. The agents query stays fatal as before.
    """
    from agentscope_systemd import AgentscopeError

    from ._fleet import agent_dicts

    agents = fleet.agents()
    status = _status(fleet, agents)
    if face is not None:
        data = agent_dicts(fleet, agents)
        try:
            report = fleet.report(top=0).to_dict()
        except (OSError, ValueError, AgentscopeError) as exc:
            face.failed(exc)
        else:
            face.sampled(data, report, status)
    return status


def _status(fleet: Fleet, listed: Sequence[Any]) -> str:
    from ._render import format_bytes

    agents = [a.to_dict() for a in listed]
    states: dict[str, int] = {}
    for a in agents:
        states[str(a.get("state"))] = states.get(str(a.get("state")), 0) + 1
    memory = sum(a.get("memory_current") or 0 for a in agents)
    kills = sum(a.get("oom_kills") or 0 for a in agents)
    detail = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return (
        f"fleet {fleet.name}: {len(agents)} agents"
        + (f" ({detail})" if detail else "")
        + f", {format_bytes(memory)}, {kills} OOM kills"
    )
