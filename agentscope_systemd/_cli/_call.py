"""``agentscope call``: run a command as a tool call, a cgroup of its own in its agent's scope.

Run anywhere in an agent's process tree (#26, docs/calls.md). It finds its
agent from ``/proc/self/cgroup``, makes ``<scope>/call-LABEL-N`` with the
call's caps (:func:`agentscope_systemd._calls._calls.create_call`), forks the small process
that removes that cgroup once the call has ended
(:func:`agentscope_systemd._calls._calls.fork_remover`), moves itself in and execs the
command: the command keeps this PID, stdio and signals, and its exit status
is the call's.

Started from :func:`agentscope_systemd._cli.main.main` before anything else is imported, like
``exec``: no D-Bus, no asyncio, no SQLite, no typer. Its own failures exit
125 (agentscope failed, bad input included: a cap out of range creates
nothing), 126 (the command cannot run) or 127 (not found), as ``exec``'s.
"""

from __future__ import annotations

import os
import sys

from .._typecheck import TYPE_CHECKING
from ._errors import BadInput
from ._exec import resolve_command
from ._words import Words

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable, Sequence

    from ._options import Options

__all__ = ["HELP", "VALUED", "CallHelp", "call_command", "parse_call_args", "run_call"]

# The usage, in lines that --help prints under each other (80 columns).
_USAGE_LINES = (
    "agentscope call [--memory-max SIZE] [--memory-swap-max SIZE]",
    "[--tasks-max N] [--name LABEL] -- CMD [ARGS...]",
)
USAGE = " ".join(_USAGE_LINES)
_HELP_USAGE = "\n         ".join(_USAGE_LINES)

# call's options that take a value, and the keyword of _calls.call_limits each fills.
VALUED = {
    "--memory-max": "memory_max",
    "--memory-swap-max": "memory_swap_max",
    "--tasks-max": "tasks_max",
    "--name": "name",
}

HELP = f"""Usage: {_HELP_USAGE}

  Run CMD as a tool call of the agent this process belongs to: in a cgroup of
  its own inside the agent's scope (call-LABEL-N), with its own caps. A call
  that outgrows its memory cap is killed as a whole (all its processes), never
  the agent. CMD keeps this PID, stdio and signals; the cgroup is removed once
  the call has ended. Run it from inside an agent (its shell, its tools).

Options:
  --memory-max SIZE       cap the call's memory (memory.max), e.g. 2G, 25%
  --memory-swap-max SIZE  its swap (memory.swap.max; default 0: none)
  --tasks-max N           at most N processes and threads (pids.max)
  --name LABEL            the call's label in its cgroup's name (default cmd)
  -h, --help              show this message and exit

Without --memory-max or --tasks-max, the agent's defaults apply:
$AGENTSCOPE_CALL_MEMORY_MAX and $AGENTSCOPE_CALL_TASKS_MAX (Fleet.launch's
call_memory_max and call_tasks_max set them). Once CMD has exited, what it
left running in the call gets 10 s, then SIGTERM, then SIGKILL.

Where the agent's scope is not delegated (docs/calls.md), CMD runs in the
agent's own cgroup without the call's caps, and a line on stderr says why.

Exit status: CMD's own (128+N if a signal N ended it); 125 if agentscope
failed (bad usage, not inside an agent), 126 if CMD cannot run, 127 if CMD
is not found.

Examples:
  agentscope call --memory-max 2G -- pytest -x
  agentscope call --name build --tasks-max 256 -- make -j8
"""


class CallHelp(Exception):
    """``call -h``/``--help``: print :data:`HELP` and exit 0."""


def parse_call_args(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The options of ``call`` (keyword: text) and its command.

    The command follows ``--``, or is the first word that is not an option.

    Raises:
        CallHelp: ``-h``/``--help`` before the command.
        BadInput: bad usage.
    """
    words = Words(args)
    values: dict[str, str] = {}
    for arg in words.options(CallHelp):
        option = arg.partition("=")[0]
        if option in VALUED:
            value = words.value(option)
            if value is None:
                raise BadInput(f"{option} needs a value; usage: {USAGE}")
            if VALUED[option] in values:
                raise BadInput(f"{option} is given twice")
            values[VALUED[option]] = value
        elif arg.startswith("-") and arg != "-":
            raise BadInput(f"unknown option {arg}; usage: {USAGE}")
        else:
            break  # the command, given without "--"
    cmd = words.rest()
    if not cmd:
        raise BadInput(f"no command to run; usage: {USAGE}")
    return values, cmd


def run_call(
    opts: Options,
    args: Sequence[str],
    *,
    execv: Callable[[str, list[str]], object] | None = None,
) -> None:
    """Parse ``call``'s arguments and run :func:`call_command`."""
    values, cmd = parse_call_args(args)
    call_command(opts, cmd, execv=execv, **values)


def call_command(
    opts: Options,
    cmd: Sequence[str],
    *,
    memory_max: str | None = None,
    memory_swap_max: str | None = None,
    tasks_max: str | None = None,
    name: str | None = None,
    execv: Callable[[str, list[str]], object] | None = None,
    cgroup_root: str = "/sys/fs/cgroup",
    proc_root: str = "/proc",
) -> None:
    """Run ``cmd`` as a call of this process's agent (never returns on success).

    Everything is checked before the call's cgroup is made: the caps, the
    command, the agent. ``execv`` is the exec (``os.execv`` when None);
    tests pass a stand-in, and the roots point at a fake tree.

    Raises:
        InvalidConfig, InvalidName: a cap or label out of range;
        CommandNotFound, CannotRun: before anything is made, or by the exec;
        NotInAgent: this process is in no agentscope agent's scope;
        AgentscopeError: the call's cgroup cannot be made.
    """
    from agentscope_systemd._calls import _calls
    from agentscope_systemd._errors import AgentscopeError

    del opts  # --fleet and --manager do not matter: the agent is where this process is
    # Unnamed caps: the agent's defaults, given at its launch (Fleet.launch's call_memory_max).
    if memory_max is None:
        memory_max = os.environ.get(_calls.DEFAULTS_ENV["memory_max"]) or None
    if tasks_max is None:
        tasks_max = os.environ.get(_calls.DEFAULTS_ENV["tasks_max"]) or None
    limits = _calls.call_limits(
        memory_max=memory_max,
        memory_swap_max="0" if memory_swap_max is None else memory_swap_max,
        tasks_max=tasks_max,
        name=name,
    )
    path = resolve_command(cmd[0])
    scope, unit = _calls.find_scope(_calls.own_cgroup("self", proc_root))
    scope_dir = cgroup_root + scope
    why = _calls.delegation(scope_dir)
    if why is not None:
        sys.stderr.write(
            f"agentscope: WARNING: calls are not isolated in {unit}: {why}; "
            f"running {cmd[0]!r} in the agent's own cgroup, without the call's caps\n"
        )
    else:
        _calls.sweep(scope_dir)  # calls whose remover was killed: nothing accumulates
        try:
            call_dir = _calls.create_call(scope_dir, limits)
        except OSError as exc:
            raise AgentscopeError(
                f"cannot make a call's cgroup in {unit}: {exc.strerror or exc} "
                f"({exc.filename or scope_dir})"
            ) from exc
        from agentscope_systemd._calls import _callevents

        watch = _callevents.CallWatch(
            _callevents.calls_dir_of_scope(scope),
            unit,
            os.path.basename(call_dir),
            os.getpid(),
            _callevents.argv_summary(cmd),
            (limits.memory_max, limits.tasks_max),
        )
        sys.stdout.flush()
        sys.stderr.flush()
        _calls.fork_remover(call_dir, watch)
        try:
            _calls.enter(call_dir)
        except OSError as exc:
            raise AgentscopeError(
                f"cannot move into the call's cgroup {call_dir}: {exc.strerror or exc}"
            ) from exc
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        (execv or os.execv)(path, list(cmd))
    except OSError as exc:
        from ._errors import CannotRun, CommandNotFound

        message = f"cannot exec {cmd[0]!r} in a call of {unit}: {exc}"
        if isinstance(exc, FileNotFoundError):
            raise CommandNotFound(message) from exc
        raise CannotRun(message) from exc
