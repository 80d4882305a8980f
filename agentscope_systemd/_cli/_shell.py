"""``agentscope-shell``: the ``SHELL`` of an agent launched with ``call_shell=True`` (#26).

``agentscope-shell -c CMD`` (any ``-c`` form a shell takes: ``-lc``,
``-ec``...) runs the agent's real shell (``$AGENTSCOPE_REAL_SHELL``, else
/bin/sh) with the same arguments as a tool call labelled ``shell``, exactly
as ``agentscope call --name shell -- REAL_SHELL ARGS...`` would: the
agent's call caps, the whole call killed if it outgrows them, the exit
status the shell's. Anything else, or a shell started inside a call
already, is the real shell itself (:mod:`agentscope_systemd._calls._callshell`).
Failures exit as ``call``'s: 125, 126, 127, with one line on stderr.
"""

from __future__ import annotations

import os
import sys

from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import NoReturn

__all__ = ["main", "run_shell"]

LABEL = "shell"


def run_shell(
    args: Sequence[str],
    *,
    execv: Callable[[str, list[str]], object] | None = None,
    proc_root: str = "/proc",
    cgroup_root: str = "/sys/fs/cgroup",
) -> None:
    """Run the real shell with ``args``: as a call when it runs a command string.

    ``execv`` (``os.execv`` when None) and the roots are for tests.
    """
    from agentscope_systemd._calls import _calls
    from agentscope_systemd._calls._callshell import REAL_SHELL_ENV, real_shell, runs_command

    shell = real_shell(os.environ.get(REAL_SHELL_ENV))
    argv = [shell, *args]
    if runs_command(args):
        cgroup = _calls.own_cgroup("self", proc_root)
        try:
            _, unit = _calls.find_scope(cgroup)
        except _calls.NotInAgent:
            unit = None  # call_command says so, with its exit status
        if unit is None or _calls.call_in(cgroup or "", unit) is None:
            from ._call import call_command
            from ._options import Options

            call_command(
                Options(), argv, name=LABEL, execv=execv,
                cgroup_root=cgroup_root, proc_root=proc_root,
            )  # fmt: skip
            return
    # Not a command string, or inside a call already: the shell itself, in
    # the cgroup it was started in (a call's caps stay its caps).
    (os.execv if execv is None else execv)(shell, argv)


def main() -> NoReturn:
    """The ``agentscope-shell`` console script."""
    try:
        run_shell(sys.argv[1:])
    except (Exception, KeyboardInterrupt) as exc:
        from ._errors import exec_status, report_error

        report_error(exc, json_mode=False, debug=False)
        sys.exit(exec_status(exc))
    sys.exit(0)  # reached only with a stand-in exec
