"""``call`` as a typer command: for ``--help`` listings and docs/cli.md.

A plain ``agentscope call ...`` never comes here: :func:`agentscope_systemd._cli.main.main`
dispatches it to :mod:`._call` before typer is imported. Global options
typer has to read (a ``--manager`` with a bad value) bring it here; it then
does what the fast path does.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .._calls._calls import DEFAULTS_ENV
from ._call import call_command
from ._context import options

__all__ = ["call"]


def _cap(metavar: str, what: str, key: str) -> Any:
    """A cap's option; a call that names none takes its agent's, from :data:`DEFAULTS_ENV`."""
    return typer.Option(metavar=metavar, help=f"{what}; default ${DEFAULTS_ENV[key]}.")


def call(
    ctx: typer.Context,
    cmd: Annotated[
        list[str], typer.Argument(metavar="-- CMD [ARGS]...", help="The command and its arguments.")
    ],
    memory_max: Annotated[
        str | None,
        _cap("SIZE", "Cap the call's memory (memory.max): 2G, 25%, infinity", "memory_max"),
    ] = None,
    memory_swap_max: Annotated[
        str | None,
        typer.Option(metavar="SIZE", help="The call's swap (memory.swap.max); default 0: none."),
    ] = None,
    tasks_max: Annotated[
        str | None, _cap("N", "At most N processes and threads in the call (pids.max)", "tasks_max")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(metavar="LABEL", help="The call's label in its cgroup's name (default cmd)."),
    ] = None,
) -> None:
    """Run CMD as a tool call of this process's agent: a cgroup of its own in the agent's scope.

    Run from inside an agent. A call that outgrows its cap is killed as a
    whole, never the agent; CMD keeps the PID, stdio and signals, and the
    call's cgroup is removed when it ends (docs/calls.md). Exits with CMD's
    status; its own failures are 125, 126 (CMD cannot run) and 127 (not found).

    Examples:

    \b
      agentscope call --memory-max 2G -- pytest -x
      agentscope call --name build --tasks-max 256 -- make -j8
    """
    call_command(
        options(ctx),
        cmd,
        memory_max=memory_max,
        memory_swap_max=memory_swap_max,
        tasks_max=tasks_max,
        name=name,
    )
