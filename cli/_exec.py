"""``agentscope exec``: move this very process into a new agent scope, then exec.

Like ``systemd-run --scope``: the command keeps this process's PID, stdio
and signals. Started from :func:`cli.main.main` before anything else is
imported, and meant to cost about what systemd-run costs: its arguments
are parsed by hand (argparse costs ~0.1 s under TCG), the command is found
on ``$PATH`` by hand (shutil likewise), and the scope is made by
:func:`agentscope._exec.adopt_self`, which needs neither asyncio, dbus-fast
nor SQLite. When that fast path cannot tell that all is ordinary, the
library's :meth:`Fleet.adopt` does the work.
"""

from __future__ import annotations

import os
import sys

from ._errors import BadInput, Failed
from ._options import Options

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: collections and typing cost imports
    from collections.abc import Callable, Sequence

__all__ = ["HELP", "ExecHelp", "exec_command", "parse_exec_args", "resolve_command", "run_exec"]

USAGE = "agentscope exec NAME [--memory-max SIZE] [--quiet] -- CMD [ARGS...]"


class ExecArgs:
    """What ``exec`` was given."""

    __slots__ = ("cmd", "memory_max", "name", "quiet")

    def __init__(self, name: str, cmd: list[str], memory_max: str | None, quiet: bool) -> None:
        self.name, self.cmd, self.memory_max, self.quiet = name, cmd, memory_max, quiet


HELP = f"""Usage: {USAGE}

  Move this process into a new agent scope NAME, then exec CMD in it: CMD keeps
  this PID, stdio and signals, like systemd-run --scope. Everything after CMD
  is CMD's own.

Options:
  --memory-max SIZE  cap the agent's scope (MemoryMax, no swap), e.g. 4G
  -q, --quiet        do not print "Running as unit: ..."
  -h, --help         show this message and exit
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
    args = list(args)
    name: str | None = None
    memory_max: str | None = None
    quiet = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            raise ExecHelp
        if arg in ("-q", "--quiet"):
            quiet = True
        elif arg == "--memory-max" or arg.startswith("--memory-max="):
            if "=" in arg:
                memory_max = arg.partition("=")[2]
            elif i + 1 < len(args):
                i += 1
                memory_max = args[i]
            else:
                raise _usage("--memory-max needs a size")
        elif arg.startswith("-") and arg != "-":
            raise _usage(f"unknown option {arg}")
        elif name is None:
            name = arg
        else:
            break  # the command, given without "--"
        i += 1
    if name is None:
        raise _usage("the agent NAME is missing")
    return ExecArgs(name, args[i:], memory_max, quiet)


def resolve_command(prog: str, env: dict[str, str] | None = None) -> str:
    """The executable ``prog`` names, on ``$PATH`` unless it holds a slash.

    Raises:
        BadInput: not found, or not executable.
    """
    if os.sep in prog:
        if not os.path.isfile(prog):
            raise BadInput(f"{prog!r}: no such file")
        if not os.access(prog, os.X_OK):
            raise BadInput(f"{prog!r} is not executable (chmod +x it)")
        return prog
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", prog)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise BadInput(f"{prog!r} not found on PATH ({path})")


def run_exec(
    opts: Options,
    args: Sequence[str],
    *,
    execv: Callable[[str, list[str]], object] | None = None,
) -> None:
    """Parse ``exec``'s arguments and run :func:`exec_command`."""
    ns = parse_exec_args(args)
    exec_command(opts, ns.name, ns.cmd, memory_max=ns.memory_max, quiet=ns.quiet, execv=execv)


def exec_command(
    opts: Options,
    name: str,
    cmd: Sequence[str],
    *,
    memory_max: str | None = None,
    quiet: bool = False,
    execv: Callable[[str, list[str]], object] | None = None,
) -> None:
    """Adopt this process as agent ``name``, then exec ``cmd`` (never returns on success).

    ``execv`` is the exec itself (``os.execv`` when None); tests pass a stand-in.

    Raises:
        BadInput: no command, a bad size, a command not found (no scope is made);
        Failed: the exec itself failed (the process is in its scope by then).
        and whatever :meth:`Fleet.adopt` raises.
    """
    if not cmd:
        raise BadInput(f"no command to run; usage: {USAGE}")
    size = None
    if memory_max is not None:
        from ._parse import parse_size

        size = parse_size(memory_max)
    path = resolve_command(cmd[0])
    unit = _adopt(opts, name, list(cmd), size)
    if not (quiet or opts.json):
        sys.stderr.write(f"Running as unit: {unit}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        (execv or os.execv)(path, list(cmd))
    except OSError as exc:
        raise Failed(f"cannot exec {cmd[0]!r} in {unit}: {exc}", "exec_failed") from exc


def _adopt(opts: Options, name: str, cmd: list[str], size: int | None) -> str:
    """This process in a new scope of agent ``name``: the fast path, else the library's."""
    from agentscope import _exec

    try:
        return _exec.adopt_self(
            opts.fleet, name, cmd, manager=opts.manager, memory_max=size, warn=_warn
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
        return fleet.adopt(os.getpid(), name, memory_max=size).unit
    finally:
        fleet.close()


def _warn(message: str) -> None:
    # The format of the "agentscope" logger's handler (cli._logging.setup_logging).
    sys.stderr.write(f"agentscope: WARNING: {message}\n")
