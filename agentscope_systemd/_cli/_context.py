"""What every command takes from typer's context, and how it prints.

The global options ride on the root context's ``obj``; a command opens its
fleet with :func:`fleet_of`, which closes it on every way out.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _fleet
from ._options import Options

if TYPE_CHECKING:  # rich is imported by what prints with it, not by --json
    import typer
    from rich.console import Console, RenderableType

    from agentscope_systemd import Fleet

    from ._fleet import HistoryLike

__all__ = [
    "console",
    "emit_json",
    "fleet_of",
    "history_of",
    "options",
    "said",
    "show",
    "valid_agent",
    "write_json",
]


def options(ctx: typer.Context) -> Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Options) else Options()


def fleet_of(ctx: typer.Context) -> contextlib.closing[Fleet]:
    """The fleet the global options name, open, closed on the way out."""
    return contextlib.closing(_fleet.open_fleet(options(ctx)))


def history_of(ctx: typer.Context) -> contextlib.closing[HistoryLike]:
    """The fleet's recorded history (the registry file alone: no bus), closed on the way out."""
    return contextlib.closing(_fleet.open_history(options(ctx)))


def emit_json(shape: str, data: Mapping[str, Any]) -> None:
    """Print ``data`` as the contract's ``shape`` (docs/json.md): its ``schema`` field first."""
    from agentscope_systemd._contract import stamped

    write_json(stamped(shape, data))


def write_json(data: Any) -> None:
    from agentscope_systemd._contract import json_line

    sys.stdout.write(json_line(data) + "\n")
    sys.stdout.flush()


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def show(renderable: RenderableType, out: Console | None = None) -> None:
    """Print a table or view at its full width: a unit name is never folded.

    Wider than the terminal (or than the 80 columns rich assumes when stdout
    is a pipe) if it must: a line a terminal wraps, or that ``grep`` and
    ``cut`` read whole, beats a name split over four lines.
    """
    from rich.measure import Measurement

    out = out if out is not None else console()
    # Measured as if the screen had no edge: a measurement is capped at the width.
    needed = Measurement.get(out, out.options.update_width(_NO_EDGE), renderable).maximum
    size = out.size
    if needed <= size.width:
        out.print(renderable)
        return
    # Width and height both: rich holds a dumb terminal (TERM=dumb, as on a
    # serial console or in an editor's shell) at 80 columns unless both are
    # set (rich/console.py, Console.size); a width alone folded the demo's
    # unit names in the VM console. The size the console had is set back.
    out.size = (needed, size.height)
    try:
        out.print(renderable)
    finally:
        out.size = size


_NO_EDGE = 100_000


def said(ctx: typer.Context, shape: str, data: dict[str, Any], text: str) -> None:
    if options(ctx).json:
        emit_json(shape, data)
    else:
        sys.stdout.write(text + "\n")


def valid_agent(value: str | None) -> str | None:
    # Checked as parsed: before any file is created or any bus is reached,
    # so a bad name is always exit 2 and never leaves a stray log file.
    from agentscope_systemd._names import validate_name

    return None if value is None else validate_name("agent", value)
