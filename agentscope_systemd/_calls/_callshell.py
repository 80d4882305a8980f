"""A ``SHELL`` whose every ``-c`` is a tool call (#26 item 4): ``Fleet.launch(call_shell=True)``.

Agents that run their tools through ``$SHELL -c "..."`` (coding agents do:
each tool call is one such shell) get ``SHELL`` set to the
``agentscope-shell`` command and their own shell kept in
``AGENTSCOPE_REAL_SHELL``. ``agentscope-shell -c CMD`` then runs the real
shell as ``agentscope call --name shell`` would: a cgroup of its own in the
agent's scope, the agent's call caps, killed as a whole if it outgrows
them. Anything else (an interactive shell, a script) is the real shell
itself, no call; so is a shell started inside a call already (``make``
running ``$SHELL -c`` for each recipe line stays in its call's caps).

Only :mod:`os`-level imports: the command starts on each tool call.
"""

from __future__ import annotations

import os
import sys

from .._errors import LaunchError
from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "REAL_SHELL_ENV",
    "SHELL_COMMAND",
    "call_shell_env",
    "real_shell",
    "runs_command",
    "shell_command",
]

SHELL_COMMAND = "agentscope-shell"
"""The console script installed with agentscope (pyproject.toml)."""
REAL_SHELL_ENV = "AGENTSCOPE_REAL_SHELL"
"""The agent's own shell, which ``agentscope-shell`` runs."""
DEFAULT_SHELL = "/bin/sh"
_MAX_PATH = 4096
# Shell options that take the next word as their value (POSIX sh, bash, zsh:
# "-o pipefail", "-O extglob"): that word is not the command string.
_VALUED = frozenset({"-o", "+o", "-O", "+O"})


def _usable(path: str | None) -> bool:
    """An absolute path to an executable file that is not agentscope-shell itself."""
    if not path or len(path) > _MAX_PATH or "\0" in path or not os.path.isabs(path):
        return False
    if os.path.basename(path) == SHELL_COMMAND:
        return False  # a SHELL already ours: never run it as the "real" one (a loop)
    return os.path.isfile(path) and os.access(path, os.X_OK)


def real_shell(value: str | None) -> str:
    """The shell to run: ``value`` (``$AGENTSCOPE_REAL_SHELL``) when usable, else /bin/sh."""
    return value if value is not None and _usable(value) else DEFAULT_SHELL


def runs_command(args: Sequence[str]) -> bool:
    """Whether a shell given ``args`` runs a command string (``-c``, ``-lc``, ``-ec``...).

    The options before the first operand are read as POSIX sh reads them:
    ``-c`` in a cluster of short options makes the shell run a command
    string; ``--`` or the first word that is no option ends them.
    """
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg or arg[0] not in "-+" or arg in ("-", "+"):
            return False
        if arg in _VALUED:
            i += 2
            continue
        if arg[0] == "-" and not arg.startswith("--") and "c" in arg[1:]:
            return True
        i += 1
    return False


def shell_command() -> str:
    """The path of the ``agentscope-shell`` command of this installation.

    Raises:
        LaunchError: it is not installed beside this Python's scripts.
    """
    import sysconfig  # launch's path only, not the shell's

    places = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    for place in places:
        if place:
            path = os.path.join(place, SHELL_COMMAND)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    raise LaunchError(
        f"call_shell=True needs the {SHELL_COMMAND} command, not found in "
        f"{' or '.join(p for p in places if p)}: reinstall agentscope, which installs it "
        "beside the agentscope command (nothing was started)"
    )


def call_shell_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` (None: this process's) with ``SHELL`` agentscope-shell and the real one kept.

    Raises:
        LaunchError: agentscope-shell is not installed.
    """
    out = dict(os.environ if env is None else env)
    previous = out.get("SHELL")
    if previous is not None and os.path.basename(previous) == SHELL_COMMAND:
        previous = out.get(REAL_SHELL_ENV)  # launched from an agent with call_shell itself
    out[REAL_SHELL_ENV] = real_shell(previous)
    out["SHELL"] = shell_command()
    return out
