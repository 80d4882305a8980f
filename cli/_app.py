"""The typer app: every command but the ``exec`` fast path starts here.

Commands reach the library only through :func:`._fleet.open_fleet`, print
JSON (``--json``) or rich output from :mod:`._render`, and raise; the
exceptions become exit codes in one place, :func:`._errors.report_error`.
"""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from . import _doctor, _fleet, _render
from ._errors import BadInput, Failed, report_error
from ._exec import exec_command
from ._fleet import FleetLike, Options
from ._notify import Notifier
from ._parse import parse_duration, parse_env, parse_signal, parse_since, parse_size

if TYPE_CHECKING:
    from agentscope.watchdog import FatalLog

    from ._http import FaceState

__all__ = ["app", "run_app"]

app = typer.Typer(
    name="agentscope",
    help="Run every AI coding agent in its own systemd scope, and see which one ate the memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Manager(enum.StrEnum):
    user = "user"
    system = "system"


# -- plumbing ---------------------------------------------------------------


def _opts(ctx: typer.Context) -> Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Options) else Options()


@contextlib.contextmanager
def _fleet_of(ctx: typer.Context) -> Iterator[FleetLike]:
    fleet = _fleet.open_fleet(_opts(ctx))
    try:
        yield fleet
    finally:
        fleet.close()


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False)


def _version(ctx: typer.Context, value: bool) -> None:
    if not value:
        return
    from agentscope import __version__

    if _opts(ctx).json or "--json" in sys.argv[1:]:
        _emit_json({"version": __version__})
    else:
        sys.stdout.write(f"agentscope {__version__}\n")
    raise typer.Exit()


def _valid_agent(value: str | None) -> str | None:
    # Checked as parsed: before any file is created or any bus is reached,
    # so a bad name is always exit 2 and never leaves a stray log file.
    from agentscope._names import validate_name

    return None if value is None else validate_name("agent", value)


def _valid_fleet(value: str) -> str:
    from agentscope._names import validate_name

    return validate_name("fleet", value)


@app.callback()
def _globals(
    ctx: typer.Context,
    manager: Annotated[
        Manager | None,
        typer.Option(help="The systemd manager: system when root, else user.", show_default=False),
    ] = None,
    fleet: Annotated[
        str, typer.Option(help="The fleet to act on.", callback=_valid_fleet)
    ] = "default",
    json_: Annotated[
        bool, typer.Option("--json", help="Print JSON only on stdout; errors as JSON on stderr.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and the library's debug log.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_version
        ),
    ] = False,
) -> None:
    """Run every AI coding agent in its own systemd scope, and see which one ate the memory."""
    ctx.obj = Options(
        manager=manager.value if manager is not None else "auto",
        fleet=fleet,
        json=json_,
        debug=debug,
    )


def run_app(args: Sequence[str], opts: Options) -> int:
    """Run the typer app on ``args``; return the exit code (errors already reported)."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=list(args), prog_name="agentscope", standalone_mode=False, obj=opts)
    except (Exception, KeyboardInterrupt) as exc:
        if isinstance(exc, typer.TyperException) and not opts.json and hasattr(exc, "show"):
            exc.show()  # click's own usage message, with the "Try --help" hint
            return int(getattr(exc, "exit_code", 2))
        return report_error(exc, json_mode=opts.json, debug=opts.debug)
    return rv if isinstance(rv, int) else 0


# -- commands -----------------------------------------------------------------

_CMD = typer.Argument(metavar="-- CMD [ARGS]...", help="The command and its arguments.")


@app.command()
def run(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The agent's name.", callback=_valid_agent)],
    cmd: Annotated[list[str], _CMD],
    cwd: Annotated[Path | None, typer.Option(help="The agent's working directory.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="K=V added to the agent's environment.")
    ] = None,
    memory_max: Annotated[
        str | None, typer.Option(help="Cap the agent's memory: bytes or K/M/G/T (1024s).")
    ] = None,
    log: Annotated[
        Path | None, typer.Option(help="Where the agent's stdout and stderr go.")
    ] = None,
    tmux: Annotated[
        bool,
        typer.Option(
            "--tmux", help="Run it in a window of the fleet's tmux session instead of a log file."
        ),
    ] = False,
) -> None:
    """Launch CMD as agent NAME, detached, its output going to a log file (or a tmux window)."""
    opts = _opts(ctx)
    size = parse_size(memory_max) if memory_max is not None else None
    extra = parse_env(env or [])
    agent_env = {**os.environ, **extra} if extra else None
    if tmux:
        if log is not None:
            raise BadInput("--log and --tmux do not mix: a tmux agent's output is its window")
        with _fleet_of(ctx) as fleet:
            agent = fleet.launch(
                name,
                cmd,
                cwd=str(cwd) if cwd is not None else None,
                env=agent_env,
                memory_max=size,
                terminal="tmux",
            )
        _print_launched(
            opts, {"name": agent.name, "unit": agent.unit, "pid": agent.pid, "tmux": agent.name}
        )
        return
    with _fleet_of(ctx) as fleet:
        log_path, fd = _open_log(opts, name, log)
        with open(fd, "ab") as out:
            agent = fleet.launch(
                name,
                cmd,
                cwd=str(cwd) if cwd is not None else None,
                env=agent_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                memory_max=size,
            )
    result = {"name": agent.name, "unit": agent.unit, "pid": agent.pid, "log": str(log_path)}
    _print_launched(opts, result)


def _print_launched(opts: Options, result: dict[str, Any]) -> None:
    if opts.json:
        _emit_json(result)
    else:
        for key, value in result.items():
            sys.stdout.write(f"{key:<5} {value}\n")


@app.command("exec")
def exec_(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The agent's name.", callback=_valid_agent)],
    cmd: Annotated[list[str], _CMD],
    memory_max: Annotated[
        str | None, typer.Option(help="Cap the agent's memory (needs adopt() support).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not name the unit.")] = False,
) -> None:
    """Move this process into a new agent scope NAME and exec CMD there.

    CMD keeps the PID, stdio and signals, like systemd-run --scope.
    """
    exec_command(_opts(ctx), name, cmd, memory_max=memory_max, quiet=quiet)


@app.command("ls")
def ls(ctx: typer.Context) -> None:
    """List the fleet's agents."""
    with _fleet_of(ctx) as fleet:
        agents = [a.to_dict() for a in fleet.agents()]
    if _opts(ctx).json:
        _emit_json(agents)
    elif not agents:
        sys.stdout.write(f"no agents in fleet {_opts(ctx).fleet!r}\n")
    else:
        _console().print(_render.ls_table(agents))


@app.command()
def stop(
    ctx: typer.Context,
    name: Annotated[
        str | None, typer.Argument(help="The agent to stop.", callback=_valid_agent)
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every agent of the fleet.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds from SIGTERM to SIGKILL.", min=0)] = 10.0,
) -> None:
    """Stop an agent (SIGTERM, then SIGKILL after the timeout), or all of them."""
    opts = _opts(ctx)
    if (name is None) == (not all_):
        raise BadInput("give an agent NAME or --all, not both")
    with _fleet_of(ctx) as fleet:
        if name is not None:
            fleet.stop(name, timeout=timeout)
            if opts.json:
                _emit_json({"stopped": [name], "failed": []})
            else:
                sys.stdout.write(f"stopped {name}\n")
            return
        stopped, failed = _stop_all(fleet, timeout, progress=not opts.json and sys.stderr.isatty())
    if opts.json:
        _emit_json({"stopped": stopped, "failed": failed})
    else:
        sys.stdout.write(f"stopped {len(stopped)} agent(s)\n")
    if failed:
        raise Failed("could not stop " + ", ".join(f"{f['name']} ({f['error']})" for f in failed))


def _stop_all(
    fleet: FleetLike, timeout: float, *, progress: bool
) -> tuple[list[str], list[dict[str, str]]]:
    from agentscope import AgentNotFound, AgentscopeError

    names = [a.name for a in fleet.agents()]
    stopped: list[str] = []
    failed: list[dict[str, str]] = []
    with Progress(console=_console(stderr=True), disable=not progress, transient=True) as bar:
        task = bar.add_task("stopping", total=len(names))
        for name in names:
            bar.update(task, description=f"stopping {escape(name)}")
            try:
                fleet.stop(name, timeout=timeout)
            except AgentNotFound:
                pass  # it ended by itself meanwhile
            except AgentscopeError as exc:
                failed.append({"name": name, "error": str(exc), "kind": type(exc).__name__})
                continue
            finally:
                bar.advance(task)
            stopped.append(name)
    return stopped, failed


@app.command()
def kill(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The agent to signal.", callback=_valid_agent)],
    signal_: Annotated[str, typer.Option("--signal", "-s", help="TERM, SIGKILL, 9, ...")] = "TERM",
) -> None:
    """Send a signal to every process of an agent."""
    sig = parse_signal(signal_)
    with _fleet_of(ctx) as fleet:
        fleet.kill(name, sig)
    if _opts(ctx).json:
        _emit_json({"name": name, "signal": sig.name})
    else:
        sys.stdout.write(f"sent {sig.name} to {name}\n")


@app.command()
def freeze(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The agent.", callback=_valid_agent)],
) -> None:
    """Freeze every process of an agent (cgroup freezer)."""
    with _fleet_of(ctx) as fleet:
        fleet.freeze(name)
    _said(ctx, {"name": name, "frozen": True}, f"froze {name}")


@app.command()
def thaw(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The agent.", callback=_valid_agent)],
) -> None:
    """Thaw a frozen agent."""
    with _fleet_of(ctx) as fleet:
        fleet.thaw(name)
    _said(ctx, {"name": name, "frozen": False}, f"thawed {name}")


def _said(ctx: typer.Context, data: dict[str, Any], text: str) -> None:
    if _opts(ctx).json:
        _emit_json(data)
    else:
        sys.stdout.write(text + "\n")


@app.command()
def attach(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="The agent (launched with run --tmux).", callback=_valid_agent)
    ],
    read_only: Annotated[
        bool, typer.Option("--read-only", "-r", help="Watch only: keys are not sent.")
    ] = False,
) -> None:
    """Attach this terminal to a tmux agent's window (detach: C-b d)."""
    with _fleet_of(ctx) as fleet:
        argv = fleet.attach_command(name, read_only=read_only)
    if _opts(ctx).json:
        _emit_json({"name": name, "command": argv})
        return
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # tmux takes over the terminal; nothing of ours is left


@app.command()
def logs(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="The agent (launched with run --tmux).", callback=_valid_agent)
    ],
    lines: Annotated[int, typer.Option("--lines", "-n", help="How many lines.", min=0)] = 100,
) -> None:
    """Print the last lines of a tmux agent's window."""
    with _fleet_of(ctx) as fleet:
        text = fleet.logs(name, lines)
    if _opts(ctx).json:
        _emit_json({"name": name, "lines": text})
    else:
        sys.stdout.write("".join(line + "\n" for line in text))


@app.command()
def send(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="The agent (launched with run --tmux).", callback=_valid_agent)
    ],
    text: Annotated[str, typer.Argument(help="What to type, literally.")],
    enter: Annotated[bool, typer.Option("--enter", help="Press Enter after the text.")] = False,
) -> None:
    """Type TEXT into a tmux agent's window."""
    with _fleet_of(ctx) as fleet:
        fleet.send(name, text, enter=enter)
    _said(ctx, {"name": name, "sent": text, "enter": enter}, f"sent to {name}")


@app.command()
def report(
    ctx: typer.Context,
    top: Annotated[int, typer.Option(help="How many top processes to show.", min=0)] = 10,
) -> None:
    """The memory report: per agent, and the top processes with their agents."""
    with _fleet_of(ctx) as fleet:
        data = fleet.report(top=top).to_dict()
    if _opts(ctx).json:
        _emit_json(data)
    else:
        _console().print(_render.report_view(data))


@app.command()
def events(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events.")
    ] = False,
    since: Annotated[
        str | None, typer.Option(help="Unix seconds, ISO 8601, or ago like 10m, 2h, 1d.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only events before this (same forms as --since).")
    ] = None,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    agent: Annotated[str | None, typer.Option(help="Only events of this agent.")] = None,
    limit: Annotated[
        int | None, typer.Option(help="Only the newest N events that match.", min=0)
    ] = None,
) -> None:
    """Print the fleet's recorded events (OOM kills, throttling, starts, exits)."""
    opts = _opts(ctx)
    now = time.time()
    start = parse_since(since, now) if since is not None else None
    end = parse_since(until, now) if until is not None else None
    filters: dict[str, Any] = {"kind": kind, "agent": agent}
    with _fleet_of(ctx) as fleet:
        if limit is not None:
            last = _print_events(
                fleet.events(since=start, until=end, last=limit, **filters), opts.json
            )
        else:
            # Page by id: memory stays one page, however long the history.
            last = None
            while True:
                page = fleet.events(
                    since=start, until=end, after_id=last, limit=_EVENTS_PAGE, **filters
                )
                last = _print_events(page, opts.json) or last
                if len(page) < _EVENTS_PAGE:
                    break
        if follow and last is None:
            # Follow from the newest event of any kind: a poll then costs the
            # new events only, never a rescan of the history.
            newest = fleet.events(last=1)
            last = newest[0].id if newest else 0
        try:
            while follow:
                time.sleep(1.0)
                last = _print_events(fleet.events(after_id=last, **filters), opts.json) or last
        except KeyboardInterrupt:
            return


_EVENTS_PAGE = 1000


def _print_events(records: Sequence[_fleet.EventLike], as_json: bool) -> int | None:
    last = None
    for record in records:
        data = record.to_dict()
        sys.stdout.write(
            (json.dumps(data, default=str) if as_json else _render.event_line(data)) + "\n"
        )
        last = record.id
    sys.stdout.flush()
    return last


@app.command()
def top(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.1)] = 1.0,
) -> None:
    """A live view of the fleet: agents with memory bars, PSI, recent events; q quits."""
    from ._top import run_top, snapshot

    opts = _opts(ctx)
    with _fleet_of(ctx) as fleet:
        if opts.json:
            _emit_json(snapshot(fleet, time.time()))
        elif not sys.stdout.isatty():
            _console().print(_render.ls_table([a.to_dict() for a in fleet.agents()]))
        else:
            run_top(fleet, interval)


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived: leave the monitor loop cleanly."""


@app.command()
def monitor(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(help="Seconds between samples.", min=0.1)] = 2.0,
    top: Annotated[int, typer.Option(help="Top processes kept per sample.", min=0)] = 10,
    listen: Annotated[
        str | None,
        typer.Option(
            help="Serve /health (JSON) and /metrics (Prometheus) on HOST:PORT (loopback).",
            envvar="AGENTSCOPE_MONITOR_LISTEN",
            show_default=False,
        ),
    ] = None,
    listen_any: Annotated[
        bool,
        typer.Option(
            "--listen-any",
            help="Allow --listen on an address other than loopback.",
            envvar="AGENTSCOPE_MONITOR_LISTEN_ANY",
        ),
    ] = False,
    guard: Annotated[
        bool,
        typer.Option(
            "--guard/--no-guard",
            help="Run the memory guard: kill an agent's runaway before the host thrashes.",
            envvar="AGENTSCOPE_GUARD",
        ),
    ] = False,
    guard_mem_available: Annotated[
        float,
        typer.Option(
            help="Guard: act when MemAvailable is at most PCT % of MemTotal ...",
            metavar="PCT",
            envvar="AGENTSCOPE_GUARD_MEM_AVAILABLE",
        ),
    ] = 10.0,
    guard_swap_free: Annotated[
        float,
        typer.Option(
            help="... and SwapFree at most PCT % of SwapTotal (no swap counts as 0 %).",
            metavar="PCT",
            envvar="AGENTSCOPE_GUARD_SWAP_FREE",
        ),
    ] = 10.0,
    guard_psi_full: Annotated[
        str,
        typer.Option(
            help="Guard: or act when PSI memory full avg10 stays at PCT % or more; 'off'.",
            metavar="PCT|off",
            envvar="AGENTSCOPE_GUARD_PSI_FULL",
        ),
    ] = "60",
    guard_psi_seconds: Annotated[
        float,
        typer.Option(
            help="Guard: how long PSI full must stay over --guard-psi-full, in seconds.",
            metavar="S",
            envvar="AGENTSCOPE_GUARD_PSI_SECONDS",
        ),
    ] = 10.0,
    guard_process: Annotated[
        bool,
        typer.Option(
            "--guard-process",
            help="Guard: run in a small process of its own, not a thread of the monitor.",
            envvar="AGENTSCOPE_GUARD_PROCESS",
        ),
    ] = False,
) -> None:
    """Run the monitor in the foreground, recording and printing its events.

    Exits cleanly on SIGTERM and SIGINT. Under systemd (Type=notify,
    $NOTIFY_SOCKET set) it sends READY=1, then WATCHDOG=1 and a STATUS= line
    every tick (at least twice per WatchdogSec=); started by systemd, it
    writes the reason it stopped on an error to monitor-FLEET.fatal.log in
    the state directory. With --guard it also runs the memory guard
    (docs/guard.md) and prints its kills; as root the monitor then sets its
    own oom_score_adj to -1000, so the kernel never picks the guard.
    """
    from ._http import FaceState, HttpFace, parse_listen, start_face

    opts = _opts(ctx)
    address = parse_listen(listen, any_address=listen_any) if listen is not None else None
    guard_config = (
        _guard_config(
            guard_mem_available,
            guard_swap_free,
            guard_psi_full,
            guard_psi_seconds,
            process=guard_process,
        )
        if guard
        else False
    )
    notifier = Notifier()
    fatal = _monitor_fatal_log(opts)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise _Stopped

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    face: HttpFace | None = None
    try:
        with (
            _fleet_of(ctx) as fleet,
            fleet.monitor(interval=interval, top=top, guard=guard_config) as stream,
        ):
            state = None
            if address is not None:
                from agentscope import __version__

                state = FaceState(fleet.name, fleet.manager, interval, __version__)
                if guard_config:
                    state.guard = lambda: stream.guard_running
                face = start_face(address, state)
                sys.stderr.write(f"serving /health and /metrics on {face.url}\n")
                sys.stderr.flush()
            _monitor_loop(fleet, stream, interval, notifier, opts.json, state)
    except _Stopped:
        pass
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


def _open_log(opts: Options, name: str, log: Path | None) -> tuple[Path, int]:
    """The agent's log file, opened for appending (0600): where it is, its fd.

    The default one is built by :func:`open_under`, which never leaves the
    log directory nor follows a symlink planted in it; one named with
    ``--log`` is where the caller said.
    """
    from agentscope._paths import open_under

    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            return log, os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        base, parts = _fleet.log_location(opts, name)
        return base.joinpath(*parts), open_under(base, parts)
    except OSError as exc:
        where = log if log is not None else _fleet.default_log_path(opts, name)
        raise Failed(
            f"cannot open the agent's log {where}: {exc.strerror or exc}; "
            "check that its directory is yours, or pass --log",
            "failed",
        ) from exc


def _guard_config(
    mem_available: float, swap_free: float, psi_full: str, psi_seconds: float, *, process: bool
) -> Any:
    """The GuardConfig of ``monitor --guard``'s options.

    Raises:
        BadInput: --guard-psi-full is neither a number nor 'off'.
        InvalidConfig: a value out of its range (exit 2, naming the option's field).
    """
    from agentscope import GuardConfig

    psi: float | None
    if psi_full.strip().lower() == "off":
        psi = None
    else:
        try:
            psi = float(psi_full)
        except ValueError:
            raise BadInput(
                f"--guard-psi-full {psi_full!r} is not a percentage; give e.g. 60, or 'off'"
            ) from None
    # A process that runs only the monitor may keep the kernel's OOM killer
    # off itself; root can, others cannot lower it (FIELD-NOTES).
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
    from agentscope import default_registry_path
    from agentscope._paths import open_under
    from agentscope.watchdog import install_fatal_log

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


def _monitor_loop(
    fleet: FleetLike,
    stream: Iterator[_fleet.Record],
    interval: float,
    notifier: Notifier,
    as_json: bool,
    face: FaceState | None = None,
) -> None:
    # The events arrive on a thread of their own so that ticks (WATCHDOG=1,
    # STATUS=) go out on time even while no event comes. The queue is bounded
    # and the thread stops with the loop: a stream that never ends must not
    # outlive the command or fill memory.
    inbox: queue.Queue[object] = queue.Queue(maxsize=1024)
    stop = threading.Event()
    # sd_watchdog_enabled(3): ping at half the interval the manager asked for.
    period = min(interval, notifier.watchdog / 2) if notifier.watchdog else interval

    def deliver(item: object) -> bool:
        while not stop.is_set():
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

    try:  # from here on, any way out (a signal included) stops the pump
        threading.Thread(target=pump, name="agentscope-monitor", daemon=True).start()
        notifier.send(READY=1, STATUS=_sample(fleet, face))
        due = time.monotonic() + period
        while True:
            try:
                item = inbox.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                data = item.to_dict()  # type: ignore[attr-defined]
                if face is not None:
                    face.event(data)
                line = json.dumps(data, default=str) if as_json else _render.event_line(data)
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            # One sample a period, however many events come: a burst of
            # events must not turn into a burst of full samples.
            if time.monotonic() >= due:
                notifier.send(WATCHDOG=1, STATUS=_sample(fleet, face))
                due = time.monotonic() + period
            if face is not None:  # the watch's own failures, logged by the library
                face.watch(
                    getattr(stream, "failures", 0), getattr(stream, "consecutive_failures", 0)
                )
    finally:
        stop.set()


def _sample(fleet: FleetLike, face: FaceState | None) -> str:
    """The STATUS= line; with an HTTP face, also a memory report (no /proc scan) for it.

    A report that fails is counted as a scrape error, not fatal: the files
    of a scope can vanish mid-read. The agents query stays fatal as before.
    """
    from agentscope import AgentscopeError

    agents = fleet.agents()
    status = _status(fleet, agents)
    if face is not None:
        data = [a.to_dict() for a in agents]
        try:
            report = fleet.report(top=0).to_dict()
        except (OSError, ValueError, AgentscopeError) as exc:
            face.failed(exc)
        else:
            face.sampled(data, report, status)
    return status


def _status(fleet: FleetLike, listed: Sequence[Any]) -> str:
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
        + f", {_render.format_bytes(memory)}, {kills} OOM kills"
    )


@app.command()
def doctor(
    ctx: typer.Context,
    fix: Annotated[bool, typer.Option(help="Clear the agents slice's runtime limits.")] = False,
) -> None:
    """Check this host for what agentscope needs, one line per check.

    Exits 1 when a check fails, 4 when systemd is unreachable.
    """
    opts = _opts(ctx)
    facts = _doctor.gather(opts)
    results = _doctor.checks(facts)
    if fix and any(c["name"] == "slice_limits" and c["status"] == "fail" for c in results):
        _clear_slice_limits(ctx)
        facts = _doctor.gather(opts)
        results = _doctor.checks(facts)
    version = facts.capabilities["systemd_version"] if facts.capabilities else None
    if opts.json:
        _emit_json({"systemd_version": version, "manager": facts.manager, "checks": results})
    else:
        _console().print(_render.doctor_view(version, facts.manager, results))
    if facts.capabilities is None:
        raise typer.Exit(4)
    if any(c["status"] == "fail" for c in results):
        raise typer.Exit(1)


def _clear_slice_limits(ctx: typer.Context) -> None:
    with _fleet_of(ctx) as fleet:
        fleet.clear_slice_limits()


@app.command()
def gc(
    ctx: typer.Context,
    retention: Annotated[
        str, typer.Option(help="Keep exited agents younger than this (10m, 2h, 7d).")
    ] = "7d",
) -> None:
    """Forget exited agents (and their records) older than the retention."""
    seconds = parse_duration(retention)
    with _fleet_of(ctx) as fleet:
        removed = fleet.gc(retention_seconds=seconds)
    _said(ctx, {"removed": removed, "retention_seconds": seconds}, f"removed {removed} agent(s)")


def _install_scope(ctx: typer.Context, system: bool, user: bool) -> str:
    if system and user:
        raise BadInput("choose one of --system and --user")
    if system or user:
        return "system" if system else "user"
    return _opts(ctx).resolved_manager


def _run_actions(actions: Sequence[Sequence[str]], as_json: bool) -> None:
    for argv in actions:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Failed(
                f"{' '.join(argv)} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}",
                "failed",
            )
        if not as_json:
            sys.stdout.write(f"ran: {' '.join(argv)}\n")


@app.command()
def install(
    ctx: typer.Context,
    system: Annotated[
        bool, typer.Option("--system", help="Install for the system manager (root).")
    ] = False,
    user: Annotated[bool, typer.Option("--user", help="Install for your user manager.")] = False,
    linger: Annotated[
        bool, typer.Option(help="Also enable linger (user managers at boot).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be written.")
    ] = False,
    mglru_protection: Annotated[
        bool,
        typer.Option(
            "--mglru-protection",
            help="Also turn on the kernel's MGLRU thrashing protection at boot "
            "(min_ttl_ms=1000, a tmpfiles.d line; --system only; uninstall removes it).",
        ),
    ] = False,
) -> None:
    """Install the agents slice (no memory limits) and the monitor service for --fleet."""
    from agentscope import install as inst

    scope = _install_scope(ctx, system, user)
    if scope == "system" and linger:
        raise BadInput("--linger is for a user install (--user): the system manager runs at boot")
    if scope == "system" and os.geteuid() != 0:
        raise BadInput("install --system needs root; use --user for your own manager")
    if mglru_protection and scope != "system":
        raise BadInput("--mglru-protection is host-wide: use it with install --system (root)")
    plan = inst.plan_install(
        scope,  # type: ignore[arg-type]
        systemd_version=inst.detect_systemd_version(),
        linger=linger,
        fleets=[_opts(ctx).fleet],
        mglru_min_ttl_ms=inst.MGLRU_MIN_TTL_DEFAULT if mglru_protection else None,
    )
    lines = inst.apply_plan(plan, dry_run=dry_run)
    if not dry_run:
        _run_actions(plan.actions, _opts(ctx).json)
    _said(ctx, {"scope": scope, "dry_run": dry_run, "done": lines}, "\n".join(lines))


@app.command()
def uninstall(
    ctx: typer.Context,
    system: Annotated[bool, typer.Option("--system", help="Remove the system install.")] = False,
    user: Annotated[bool, typer.Option("--user", help="Remove your user install.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be removed.")
    ] = False,
) -> None:
    """Remove exactly what install wrote (agents keep running)."""
    from agentscope import install as inst

    scope = _install_scope(ctx, system, user)
    manifest = inst.load_manifest(scope)  # type: ignore[arg-type]
    if manifest is None:
        raise Failed(f"nothing to uninstall: no {scope} install of agentscope found", "failed")
    plan = inst.plan_uninstall(manifest)
    lines = inst.apply_plan(plan, dry_run=dry_run)
    if not dry_run:
        _run_actions(plan.actions, _opts(ctx).json)
    _said(ctx, {"scope": scope, "dry_run": dry_run, "done": lines}, "\n".join(lines))


@app.command()
def demo(
    ctx: typer.Context,
    agents: Annotated[
        int, typer.Option(help="How many agents to launch (one of them runs away).", min=2)
    ] = 8,
    memory_max: Annotated[
        str, typer.Option(help="The runaway's own cap (SIZE), so this machine is never squeezed.")
    ] = "256M",
    global_oom: Annotated[
        bool,
        typer.Option(
            "--global-oom",
            help="No cap: let the tool call run the whole machine short, for the guard to "
            "catch. Only in a throwaway VM.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the kill.", min=1)] = 150.0,
) -> None:
    """Show what agentscope does: a fleet, a runaway agent, its kill named.

    Launches cheap agents (fleet "demo" unless --fleet), starts the monitor
    with its memory guard, lets one agent's tool call grow until it is killed
    (by the kernel in its capped scope; with --global-oom by the guard), then shows
    the survivors, the slice's limits and the memory report, and stops every
    agent it started (also on Ctrl-C). Exits 0 only if every outcome happened.
    """
    from ._demo import DemoSettings, run_demo

    cap = None if global_oom else parse_size(memory_max)
    run_demo(_opts(ctx), DemoSettings(agents=agents, memory_max=cap, timeout=timeout))
