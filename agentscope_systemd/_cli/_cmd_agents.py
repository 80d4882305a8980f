"""The agent commands: run, exec, ls, stop, kill, freeze, thaw, attach, logs, send.

rich, the renderers and what only one command needs are imported by that
command: ``ls --json`` prints without rich (issue 28).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from . import _fleet
from ._context import emit_json, fleet_of, options, said, valid_agent
from ._direct import TIMEOUT, signal_agent, stop_agents
from ._errors import BadInput, Failed
from ._exec import exec_command, launch_controls
from ._options import Options
from ._parse import parse_env, parse_size, whole_option

__all__ = ["attach", "exec_", "freeze", "kill", "logs", "ls", "run", "send", "stop", "thaw"]


# The options and arguments more than one command takes, declared once.
_NEW_AGENT = typer.Argument(metavar="NAME", help="The agent's name.", callback=valid_agent)
_AGENT = typer.Argument(metavar="NAME", help="The agent.", callback=valid_agent)
_TMUX_AGENT = typer.Argument(
    metavar="NAME", help="The agent (launched with run --tmux).", callback=valid_agent
)
_MEMORY_MAX = typer.Option(
    help="Cap the agent's memory: SIZE, 50% of RAM, or infinity.", metavar="SIZE"
)
_CMD = typer.Argument(
    metavar="-- CMD [ARGS]...",
    help="The command and its arguments; every word after CMD is its own, options included.",
)
_TASKS_MAX = typer.Option(
    metavar="N", help="At most N processes and threads in its scope (TasksMax)."
)
_CPU_WEIGHT = typer.Option(
    metavar="N", help="Its share of CPU, 1-10000 (CPUWeight; systemd's default 100)."
)
_IO_WEIGHT = typer.Option(metavar="N", help="Its share of I/O, 1-10000 (IOWeight).")
_PROPERTY = typer.Option(
    "--property",
    "-p",
    metavar="NAME=VALUE",
    help="A systemd property of its scope, one of AllowedCPUs, CPUQuota, CPUWeight, "
    "IOWeight, MemoryMax, MemorySwapMax, TasksMax.",
)
_REAP_AFTER = typer.Option(
    metavar="SPAN|keep",
    help="How long the processes it leaves in its scope may run on after its main "
    "process ends, then they are stopped: a time span (default 10, 30s, 5min); keep: never.",
)


def run(
    ctx: typer.Context,
    name: Annotated[str, _NEW_AGENT],
    cmd: Annotated[list[str], _CMD],
    cwd: Annotated[Path | None, typer.Option(help="The agent's working directory.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="K=V added to the agent's environment.")
    ] = None,
    memory_max: Annotated[str | None, _MEMORY_MAX] = None,
    log: Annotated[
        Path | None, typer.Option(help="Where the agent's stdout and stderr go.")
    ] = None,
    tmux: Annotated[
        bool,
        typer.Option(
            "--tmux", help="Run it in a window of the fleet's tmux session instead of a log file."
        ),
    ] = False,
    tasks_max: Annotated[str | None, _TASKS_MAX] = None,
    cpu_weight: Annotated[str | None, _CPU_WEIGHT] = None,
    io_weight: Annotated[str | None, _IO_WEIGHT] = None,
    prop: Annotated[list[str] | None, _PROPERTY] = None,
    reap_after: Annotated[str | None, _REAP_AFTER] = None,
    call_shell: Annotated[
        bool,
        typer.Option(
            "--call-shell",
            help="Give it a SHELL (agentscope-shell) whose every -c runs as a tool call "
            "(docs/calls.md).",
        ),
    ] = False,
) -> None:
    """Launch CMD as agent NAME, detached, its output going to a log file (or a tmux window).

    Examples:

    \b
      agentscope run claude-1 --memory-max 4G -- claude
      agentscope run builder --tmux -p CPUQuota=200% --reap-after 1min -- codex
    """
    import subprocess

    opts = options(ctx)
    size = parse_size(memory_max) if memory_max is not None else None
    controls = launch_controls(tasks_max, cpu_weight, io_weight, prop or [], reap_after)
    extra = parse_env(env or [])
    agent_env = {**os.environ, **extra} if extra else None
    _check_command(cmd, agent_env, cwd)
    if tmux and log is not None:
        raise BadInput("--log and --tmux do not mix: a tmux agent's output is its window")
    if log is not None:
        _check_log(log)
    # One launch for both outputs: only where its output goes differs (a
    # tmux window, or the log file, open until the launch has passed it on).
    with fleet_of(ctx) as fleet, contextlib.ExitStack() as held:
        output: dict[str, Any] = {"terminal": "tmux"}
        if not tmux:
            log_path, fd = _open_log(opts, name, log)
            out = held.enter_context(open(fd, "ab"))
            output = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": out}
        agent = fleet.launch(
            name,
            cmd,
            cwd=str(cwd) if cwd is not None else None,
            env=agent_env,
            memory_max=size,
            call_shell=call_shell,
            **output,
            **controls,
        )
    where = {"tmux": agent.name} if tmux else {"log": str(log_path)}
    result = {"name": agent.name, "unit": agent.unit, "pid": agent.pid, **where}
    _print_launched(opts, result, agent.property_issues)


def _check_command(cmd: list[str], env: dict[str, str] | None, cwd: Path | None) -> None:
    """The command, cwd and env of ``run``, checked before the bus is reached (as exec does).

    Raises:
        LaunchError: an empty argv or program, no such program, a cwd that is
            not a directory (exit 2, nothing created).
    """
    from agentscope_systemd._fleet._launchargs import check_argv

    check_argv(cmd, env, str(cwd) if cwd is not None else None)


def _print_launched(opts: Options, result: dict[str, Any], issues: list[dict[str, Any]]) -> None:
    # What systemd did not take of the controls was logged (stderr) already.
    if opts.json:
        emit_json("launched", {**result, "property_issues": issues} if issues else result)
    else:
        for key, value in result.items():
            sys.stdout.write(f"{key:<5} {value}\n")


def _check_log(log: Path) -> None:
    """``--log`` names a regular file, or nothing yet: checked before the bus is reached (#31).

    A FIFO there would hang the open for ever (no reader), a directory or a
    device is no log; each was refused only after the fleet connected.
    """
    try:
        mode = log.stat().st_mode
    except FileNotFoundError:
        return  # made by _open_log, its directories too
    except OSError as exc:
        raise BadInput(f"--log {log}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(mode):
        raise BadInput(f"--log {log} is not a regular file: name a file for the agent's output")


def _open_log(opts: Options, name: str, log: Path | None) -> tuple[Path, int]:
    """The agent's log file, opened for appending (0600): where it is, its fd.

    The default one is built by :func:`open_under`, which never leaves the
    log directory nor follows a symlink planted in it; one named with
    ``--log`` is where the caller said.
    """
    from agentscope_systemd._paths import open_under

    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            # O_NONBLOCK: a FIFO put there since _check_log fails at once, not hangs.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(log, flags, 0o600)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file")
            os.set_blocking(fd, True)
            return log, fd
        base, parts = _fleet.log_location(opts, name)
        return base.joinpath(*parts), open_under(base, parts)
    except OSError as exc:
        where = log if log is not None else _fleet.default_log_path(opts, name)
        raise Failed(
            f"cannot open the agent's log {where}: {exc.strerror or exc}; "
            "check that its directory is yours, or pass --log",
            "failed",
        ) from exc


def exec_(
    ctx: typer.Context,
    name: Annotated[str, _NEW_AGENT],
    cmd: Annotated[list[str], _CMD],
    memory_max: Annotated[str | None, _MEMORY_MAX] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not name the unit.")] = False,
    tasks_max: Annotated[str | None, _TASKS_MAX] = None,
    cpu_weight: Annotated[str | None, _CPU_WEIGHT] = None,
    io_weight: Annotated[str | None, _IO_WEIGHT] = None,
    prop: Annotated[list[str] | None, _PROPERTY] = None,
    reap_after: Annotated[str | None, _REAP_AFTER] = None,
    fallback: Annotated[
        str | None,
        typer.Option(
            metavar="run|fail",
            help="Where no scope can be made (no systemd manager, or it refused the scope): "
            "run CMD unconfined, saying so on stderr (run), or exit 125 (fail, the default). "
            "Also $AGENTSCOPE_EXEC_FALLBACK.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Move this process into a new agent scope NAME and exec CMD there.

    CMD keeps the PID, stdio and signals, like systemd-run --scope. Exits
    with CMD's status; its own failures are 125 (agentscope failed), 126 (CMD
    cannot run) and 127 (CMD not found).

    Examples:

    \b
      agentscope exec claude-1 --memory-max 4G -- claude
      agentscope exec builder --reap-after 30s --fallback run -- npm test
    """
    from ._exec import fallback_mode

    mode = fallback_mode(fallback)
    controls = launch_controls(tasks_max, cpu_weight, io_weight, prop or [], reap_after)
    exec_command(
        options(ctx),
        name,
        cmd,
        memory_max=memory_max,
        quiet=quiet,
        controls=controls,
        fallback=mode,
    )


def ls(ctx: typer.Context) -> None:
    """List the fleet's agents.

    Examples:

    \b
      agentscope ls
      agentscope --json ls
    """
    from ._direct import list_agents

    list_agents(options(ctx))


def stop(
    ctx: typer.Context,
    name: Annotated[
        str | None, typer.Argument(metavar="NAME", help="The agent to stop.", callback=valid_agent)
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every agent of the fleet.")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            help="From SIGTERM to SIGKILL: a time span (10, 500ms, 1min; at most 1d).",
            parser=TIMEOUT,
            metavar="SPAN",
        ),
    ] = 10.0,
) -> None:
    """Stop an agent (SIGTERM, then SIGKILL after the timeout), or all of them.

    Examples:

    \b
      agentscope stop claude-1
      agentscope stop --all --timeout 30s
    """
    stop_agents(options(ctx), name, all_, timeout)


def kill(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The agent to signal.", callback=valid_agent)
    ],
    signal_: Annotated[str, typer.Option("--signal", "-s", help="TERM, SIGKILL, 9, ...")] = "TERM",
) -> None:
    """Send a signal to every process of an agent.

    Examples:

    \b
      agentscope kill builder --signal KILL
    """
    signal_agent(options(ctx), name, signal_)


def _freezer(frozen: bool, done: str, doc: str) -> Callable[..., None]:
    """``freeze`` or ``thaw``: one command, the freezer set one way or the other."""

    def command(ctx: typer.Context, name: Annotated[str, _AGENT]) -> None:
        with fleet_of(ctx) as fleet:
            (fleet.freeze if frozen else fleet.thaw)(name)
        said(ctx, "state", {"name": name, "frozen": frozen}, f"{done} {name}")

    command.__name__ = command.__qualname__ = "freeze" if frozen else "thaw"
    command.__doc__ = doc
    return command


freeze = _freezer(
    True,
    "froze",
    """Freeze every process of an agent (cgroup freezer).

    Examples:

    \b
      agentscope freeze builder
    """,
)
thaw = _freezer(
    False,
    "thawed",
    """Thaw a frozen agent.

    Examples:

    \b
      agentscope thaw builder
    """,
)


def attach(
    ctx: typer.Context,
    name: Annotated[str, _TMUX_AGENT],
    read_only: Annotated[
        bool, typer.Option("--read-only", "-r", help="Watch only: keys are not sent.")
    ] = False,
) -> None:
    """Attach this terminal to a tmux agent's window (detach: C-b d).

    Examples:

    \b
      agentscope attach builder
      agentscope attach builder --read-only
    """
    with fleet_of(ctx) as fleet:
        argv = fleet.attach_command(name, read_only=read_only)
    if options(ctx).json:
        emit_json("attach", {"name": name, "command": argv})
        return
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # tmux takes over the terminal; nothing of ours is left


def logs(
    ctx: typer.Context,
    name: Annotated[str, _AGENT],
    lines: Annotated[
        int,
        typer.Option(
            "--lines",
            "-n",
            help="How many lines (0-10000000).",
            parser=whole_option("--lines", 0, 10_000_000),
        ),
    ] = 100,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what the agent writes.")
    ] = False,
    log: Annotated[
        Path | None, typer.Option(help="The log file, for an agent run with --log.")
    ] = None,
) -> None:
    """Print the last lines of an agent's output: the log file run wrote, or its tmux window.

    A tmux agent's lines are its window's; every other agent's are its log
    file's (the default one, or --log's), readable without systemd and after
    the agent is gone. --follow keeps reading the file (until Ctrl-C).

    Examples:

    \b
      agentscope logs builder -n 50
      agentscope logs builder --follow
    """
    from . import _logfile

    opts = options(ctx)
    if log is None and _is_tmux_agent(ctx, name):
        if follow:
            raise BadInput(f"{name} runs in a tmux window: watch it with attach --read-only {name}")
        with fleet_of(ctx) as fleet:
            text = fleet.logs(name, lines)
        if opts.json:
            emit_json("logs", {"name": name, "lines": text})
        else:
            sys.stdout.write("".join(line + "\n" for line in text))
        return
    path = log if log is not None else _fleet.default_log_path(opts, name)
    try:
        text, size = _logfile.tail(path, lines)
    except FileNotFoundError:
        raise Failed(
            f"no log file {path} for agent {name!r} in fleet {opts.fleet!r}; "
            "pass --log PATH if it was run with --log (a tmux agent's window ends with it)",
            "no_log",
        ) from None
    except OSError as exc:
        raise Failed(f"cannot read the log {path}: {exc.strerror or exc}", "os_error") from exc
    if opts.json and not follow:
        emit_json("logs", {"name": name, "log": str(path), "lines": text})
        return

    def emit(line: str) -> None:
        if opts.json:
            emit_json("log_line", {"name": name, "line": line})
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    for line in text:
        emit(line)
    if follow:
        _logfile.follow(path, size, emit)


def _is_tmux_agent(ctx: typer.Context, name: str) -> bool:
    """Whether ``name`` runs in a tmux window; False when systemd is out of reach.

    Without a bus a log file is still there to read: the reachable part of
    ``logs`` must not depend on the part that is not.
    """
    from agentscope_systemd import SystemdUnavailable

    try:
        with fleet_of(ctx) as fleet:
            listed = [a.to_dict() for a in fleet.agents() if a.name == name]
    except SystemdUnavailable:
        return False
    return any(a.get("terminal") == "tmux" for a in listed)


def send(
    ctx: typer.Context,
    name: Annotated[str, _TMUX_AGENT],
    text: Annotated[str, typer.Argument(metavar="TEXT", help="What to type, literally.")],
    enter: Annotated[bool, typer.Option("--enter", help="Press Enter after the text.")] = False,
) -> None:
    """Type TEXT into a tmux agent's window.

    Examples:

    \b
      agentscope send builder 'run the tests again' --enter
    """
    with fleet_of(ctx) as fleet:
        fleet.send(name, text, enter=enter)
    said(ctx, "send", {"name": name, "sent": text, "enter": enter}, f"sent to {name}")
