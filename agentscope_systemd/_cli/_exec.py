"""``agentscope exec``: move this very process into a new agent scope, then exec.

Like ``systemd-run --scope``: the command keeps this process's PID, stdio
and signals. Started from :func:`agentscope_systemd._cli.main.main` before anything else is
imported, and meant to cost about what systemd-run costs: its arguments
are parsed by hand (argparse costs ~0.1 s under TCG), the command is found
on ``$PATH`` by hand (shutil likewise), and the scope is made by
:func:`agentscope_systemd._managers._exec.adopt_self`, which needs neither asyncio, dbus-fast
nor SQLite. When that fast path cannot tell that all is ordinary, the
library's :meth:`Fleet.adopt` does the work.

Its own failures exit 125 (agentscope failed), 126 (the command cannot
run) or 127 (not found), like coreutils' ``env`` and ``docker run``: any
other status is the command's. Where no scope can be made, ``--fallback
run`` (or ``AGENTSCOPE_EXEC_FALLBACK=run``) runs the command unconfined
instead of failing.
"""

from __future__ import annotations

import os
import sys

from .._typecheck import TYPE_CHECKING
from ._errors import BadInput, CannotRun, CommandNotFound
from ._options import Options
from ._words import Words

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable, Sequence
    from typing import Any

__all__ = [
    "HELP",
    "VALUED",
    "ExecHelp",
    "exec_command",
    "fallback_mode",
    "launch_controls",
    "parse_exec_args",
    "resolve_command",
    "run_exec",
]

# The usage, in lines that --help prints under each other (80 columns).
_USAGE_LINES = (
    "agentscope exec NAME [--memory-max SIZE] [--tasks-max N] [--cpu-weight N]",
    "[--io-weight N] [-p NAME=VALUE]... [--reap-after SPAN|keep]",
    "[--fallback run|fail] [--quiet] -- CMD [ARGS...]",
)
USAGE = " ".join(_USAGE_LINES)
_HELP_USAGE = "\n         ".join(_USAGE_LINES)

#: Where a harness sets exec's --fallback once for every exec it starts.
FALLBACK_ENV = "AGENTSCOPE_EXEC_FALLBACK"
FALLBACKS = ("fail", "run")

# exec's options that take a value, and the ExecArgs field each fills.
VALUED = {
    "--memory-max": "memory_max",
    "--tasks-max": "tasks_max",
    "--cpu-weight": "cpu_weight",
    "--io-weight": "io_weight",
    "--reap-after": "reap_after",
    "--fallback": "fallback",
    "--property": "properties",
    "-p": "properties",
}


class ExecArgs:
    """What ``exec`` was given."""

    __slots__ = (
        "cmd",
        "cpu_weight",
        "fallback",
        "io_weight",
        "memory_max",
        "name",
        "properties",
        "quiet",
        "reap_after",
        "tasks_max",
    )

    def __init__(self, name: str, cmd: list[str], memory_max: str | None, quiet: bool) -> None:
        self.name, self.cmd, self.memory_max, self.quiet = name, cmd, memory_max, quiet
        self.tasks_max: str | None = None
        self.cpu_weight: str | None = None
        self.io_weight: str | None = None
        self.reap_after: str | None = None
        self.fallback: str | None = None
        self.properties: list[str] = []


HELP = f"""Usage: {_HELP_USAGE}

  Move this process into a new agent scope NAME, then exec CMD in it: CMD keeps
  this PID, stdio and signals, like systemd-run --scope. Everything after CMD
  is CMD's own.

Options:
  --memory-max SIZE     cap the agent's scope (MemoryMax, no swap), e.g. 4G
  --tasks-max N         at most N processes and threads (TasksMax)
  --cpu-weight N        its share of CPU, 1-10000 (CPUWeight; systemd's
                        default 100)
  --io-weight N         its share of I/O, 1-10000 (IOWeight)
  -p, --property NAME=VALUE
                        a systemd property of its scope: AllowedCPUs, CPUQuota,
                        CPUWeight, IOWeight, MemoryMax, MemorySwapMax, TasksMax
  --reap-after SPAN|keep
                        stop what CMD leaves in its scope this long after CMD
                        ends: a time span (default 10, 30s, 5min); keep: never
  --fallback run|fail   where no scope can be made (no systemd manager, or it
                        refused the scope): run CMD unconfined, saying so in
                        one line on stderr (run), or exit 125 (fail, the
                        default); also ${FALLBACK_ENV}
  -q, --quiet           do not print "Running as unit: ..."
  -h, --help            show this message and exit

Exit status: CMD's own (128+N if a signal N ended it); 125 if agentscope
failed (bad usage, no systemd manager, the scope refused), 126 if CMD cannot
run, 127 if CMD is not found.

Examples:
  agentscope exec claude-1 --memory-max 4G -- claude
  agentscope exec builder --reap-after 30s --fallback run -- npm test
"""


class ExecHelp(Exception):
    """``exec -h``/``--help``: print :data:`HELP` and exit 0."""


def _usage(message: str) -> BadInput:
    return BadInput(f"{message}; usage: {USAGE}")


def parse_exec_args(args: Sequence[str]) -> ExecArgs:
    """NAME, --memory-max, --quiet and the command of ``exec``.

    The command follows ``--``, or the first word that is not an option.

    Raises:
        BadInput: bad usage.
    """
    words = Words(args)
    name: str | None = None
    values: dict[str, str] = {}
    properties: list[str] = []
    quiet = False
    for arg in words.options(ExecHelp):
        if arg in ("-q", "--quiet"):
            quiet = True
        elif (arg.partition("=")[0] in VALUED and arg.startswith("--")) or arg == "-p":
            option = arg.partition("=")[0]
            value = words.value(option)
            if value is None:
                raise _usage(f"{option} needs a value")
            if VALUED[option] == "properties":
                properties.append(value)
            else:
                values[VALUED[option]] = value
        elif arg.startswith("-") and arg != "-":
            raise _usage(f"unknown option {arg}")
        elif name is None:
            name = arg
        else:
            break  # the command, given without "--"
    if name is None:
        raise _usage("the agent NAME is missing")
    ns = ExecArgs(name, words.rest(), values.pop("memory_max", None), quiet)
    for field, value in values.items():
        setattr(ns, field, value)
    ns.properties = properties
    return ns


def fallback_mode(option: str | None, env: dict[str, str] | None = None) -> str:
    """``run`` or ``fail``: what ``--fallback``, else ``$AGENTSCOPE_EXEC_FALLBACK``, says.

    Raises:
        BadInput: a value that is neither (an empty variable counts as unset).
    """
    if option is not None:
        if option not in FALLBACKS:
            raise BadInput(f"--fallback takes run or fail, not {option!r}")
        return option
    value = (env if env is not None else os.environ).get(FALLBACK_ENV, "")
    if value and value not in FALLBACKS:
        raise BadInput(f"{FALLBACK_ENV}={value!r} is not run or fail (unset it for fail)")
    return value or "fail"


def launch_controls(
    tasks_max: str | None = None,
    cpu_weight: str | None = None,
    io_weight: str | None = None,
    properties: Sequence[str] = (),
    reap_after: str | None = None,
) -> dict[str, Any]:
    """The resource controls and ``reap_after`` of ``run`` and ``exec``, checked.

    Returns the keywords for ``launch``/``adopt``. Checked here, before any
    I/O (a fleet is not even opened for a bad value).

    Raises:
        BadInput: a number that is not one, ``-p`` without ``NAME=VALUE``, or
            a property given twice; InvalidConfig: a value out of its range.
    """
    from agentscope_systemd import _numbers
    from agentscope_systemd._managers import _scopeprops

    kw: dict[str, Any] = {}
    for key, option, value in (
        ("tasks_max", "--tasks-max", tasks_max),
        ("cpu_weight", "--cpu-weight", cpu_weight),
        ("io_weight", "--io-weight", io_weight),
    ):
        if value is not None:
            # The one number grammar: ASCII digits only; the range is build()'s.
            if not _numbers.is_digits(value.strip()):
                raise BadInput(f"{option} takes a whole number (ASCII digits), not {value!r}")
            kw[key] = _numbers.whole(option, value, low=0, high=_numbers.MAX_SIZE)
    props: dict[str, str] = {}
    for item in properties:
        prop, eq, value = item.partition("=")
        if not eq or not prop:
            raise BadInput(f"-p takes NAME=VALUE (e.g. -p TasksMax=512), not {item!r}")
        if prop in props:
            raise BadInput(f"-p {prop} is given twice")
        props[prop] = value
    if props:
        kw["properties"] = props
    _scopeprops.build(**kw)
    if reap_after is not None:
        grace = _scopeprops.parse_reap_after(reap_after)
        kw["reap_after"] = "keep" if grace is None else grace
    return kw


def resolve_command(prog: str, env: dict[str, str] | None = None) -> str:
    """The executable ``prog`` names, on ``$PATH`` unless it holds a slash.

    Raises:
        CommandNotFound: no such file, or not on ``$PATH``;
        CannotRun: there, but not an executable file.
    """
    if os.sep in prog:
        if not os.path.lexists(prog):
            raise CommandNotFound(f"{prog!r}: no such file")
        if not os.path.isfile(prog):
            raise CannotRun(f"{prog!r} is not a file one can run")
        if not os.access(prog, os.X_OK):
            raise CannotRun(f"{prog!r} is not executable (chmod +x it)")
        return prog
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", prog)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CommandNotFound(f"{prog!r} not found on PATH ({path})")


def run_exec(
    opts: Options,
    args: Sequence[str],
    *,
    execv: Callable[[str, list[str]], object] | None = None,
) -> None:
    """Parse ``exec``'s arguments and run :func:`exec_command`."""
    ns = parse_exec_args(args)
    fallback = fallback_mode(ns.fallback)
    controls = launch_controls(
        ns.tasks_max, ns.cpu_weight, ns.io_weight, ns.properties, ns.reap_after
    )
    exec_command(
        opts,
        ns.name,
        ns.cmd,
        memory_max=ns.memory_max,
        quiet=ns.quiet,
        execv=execv,
        controls=controls,
        fallback=fallback,
    )


def exec_command(
    opts: Options,
    name: str,
    cmd: Sequence[str],
    *,
    memory_max: str | None = None,
    quiet: bool = False,
    execv: Callable[[str, list[str]], object] | None = None,
    controls: dict[str, Any] | None = None,
    fallback: str = "fail",
) -> None:
    """Adopt this process as agent ``name``, then exec ``cmd`` (never returns on success).

    ``execv`` is the exec itself (``os.execv`` when None); tests pass a
    stand-in. ``controls`` are :func:`launch_controls`'s keywords. With
    ``fallback="run"``, a scope that cannot be made (:func:`no_scope_here`)
    is said in one line on stderr and ``cmd`` runs unconfined all the same.

    Raises:
        BadInput: no command, a bad size (no scope is made);
        CommandNotFound, CannotRun: before the scope is made, or by the exec;
        and whatever :meth:`Fleet.adopt` raises.
    """
    if not cmd:
        raise BadInput(f"no command to run; usage: {USAGE}")
    size = None
    if memory_max is not None:
        from ._parse import parse_size

        size = parse_size(memory_max)
    path = resolve_command(cmd[0])
    unit: str | None = None
    try:
        unit = _adopt(opts, name, list(cmd), size, controls or {})
    except Exception as exc:
        if fallback != "run" or not no_scope_here(exc):
            raise
        sys.stderr.write(
            f"agentscope: WARNING: no scope for agent {name!r} ({exc}); "
            f"running {cmd[0]!r} unconfined (fallback: run)\n"
        )
    if unit is not None and not (quiet or opts.json):
        sys.stderr.write(f"Running as unit: {unit}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        (execv or os.execv)(path, list(cmd))
    except OSError as exc:
        where = f" in {unit}" if unit is not None else ""
        message = f"cannot exec {cmd[0]!r}{where}: {exc}"
        if isinstance(exc, FileNotFoundError):
            raise CommandNotFound(message) from exc
        raise CannotRun(message) from exc


def no_scope_here(exc: BaseException) -> bool:
    """Whether ``exc`` says that no scope can be made here, which ``--fallback run`` covers.

    No systemd manager reachable (or not answering in time), a manager that
    refused the scope, or a scope whose start job failed. Not bad input, not
    a name already taken, not a guard that holds the host short of memory:
    those fail whatever the fallback.
    """
    import agentscope_systemd

    if isinstance(exc, agentscope_systemd.HostUnderPressure):
        return False
    return isinstance(
        exc,
        agentscope_systemd.SystemdUnavailable
        | agentscope_systemd.BusError
        | agentscope_systemd.LaunchError,
    )


def _adopt(
    opts: Options, name: str, cmd: list[str], size: int | None, controls: dict[str, Any]
) -> str:
    """This process in a new scope of agent ``name``: the fast path, else the library's."""
    from agentscope_systemd._managers import _exec

    try:
        return _exec.adopt_self(
            opts.fleet,
            name,
            cmd,
            manager=opts.manager,
            memory_max=size,
            warn=_warn,
            **controls,
        )
    except _exec.SlowPath as exc:
        slow = str(exc)
    from . import _fleet
    from ._logging import setup_logging

    setup_logging(opts.debug)
    if opts.debug:
        sys.stderr.write(f"agentscope: DEBUG: exec takes the slow path: {slow}\n")
    fleet = _fleet.open_fleet(opts)
    try:
        unit = fleet.adopt(os.getpid(), name, memory_max=size, **controls).unit
    finally:
        fleet.close()
    # Still its scope's only process, as on the fast path: into the agent leaf (#26).
    from agentscope_systemd._calls import _calls

    why = _calls.settle_process(os.getpid())
    if why is not None:
        _calls.say_not_isolated(why, _warn)
    return unit


def _warn(message: str) -> None:
    # The format of the "agentscope" logger's handler (._logging.setup_logging).
    sys.stderr.write(f"agentscope: WARNING: {message}\n")
