"""``agentscope exec``: move this very process into a new agent scope, then exec.

Like ``systemd-run --scope``: the command keeps this process's PID, stdio
and signals. Started from :func:`cli.main.main` before typer or rich are
imported, so it parses its arguments with argparse and prints plainly.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from . import _fleet
from ._errors import BadInput, Failed
from ._parse import parse_size

__all__ = ["exec_command", "parse_exec_args", "resolve_command", "run_exec"]

USAGE = "agentscope exec NAME [--memory-max SIZE] [--quiet] -- CMD [ARGS...]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{message}; usage: {USAGE}")


def parse_exec_args(args: Sequence[str]) -> argparse.Namespace:
    """NAME, --memory-max, --quiet and the command of ``exec``.

    Raises:
        BadInput: bad usage, or no command.
    """
    args = list(args)
    own, cmd = (
        (args[: args.index("--")], args[args.index("--") + 1 :])
        if "--" in args
        else (
            args,
            None,
        )
    )
    parser = _Parser(prog="agentscope exec", usage=USAGE, add_help=False)
    parser.add_argument("name")
    parser.add_argument("--memory-max", dest="memory_max")
    parser.add_argument("-q", "--quiet", action="store_true")
    if cmd is None:
        parser.add_argument("cmd", nargs=argparse.REMAINDER)
        ns = parser.parse_args(own)
    else:
        ns = parser.parse_args(own)
        ns.cmd = cmd
    return ns


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
    found = shutil.which(prog, path=path)
    if found is None:
        raise BadInput(f"{prog!r} not found on PATH ({path})")
    return found


def run_exec(
    opts: _fleet.Options,
    args: Sequence[str],
    *,
    execv: Callable[[str, list[str]], object] | None = None,
) -> None:
    """Parse ``exec``'s arguments and run :func:`exec_command`."""
    ns = parse_exec_args(args)
    exec_command(opts, ns.name, ns.cmd, memory_max=ns.memory_max, quiet=ns.quiet, execv=execv)


def exec_command(
    opts: _fleet.Options,
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
    size = parse_size(memory_max) if memory_max is not None else None
    path = resolve_command(cmd[0])
    fleet = _fleet.open_fleet(opts)
    try:
        agent = fleet.adopt(os.getpid(), name, memory_max=size)
    finally:
        fleet.close()
    if not (quiet or opts.json):
        sys.stderr.write(f"Running as unit: {agent.unit}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        (execv or os.execv)(path, list(cmd))
    except OSError as exc:
        raise Failed(f"cannot exec {cmd[0]!r} in {agent.unit}: {exc}", "exec_failed") from exc
