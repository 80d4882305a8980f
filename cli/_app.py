"""The typer app: every command but the ``exec`` fast path starts here.

The commands live by concern in ``_cmd_agents``, ``_cmd_monitor`` and
``_cmd_admin``; this module holds the global options and registers them,
in the order ``--help`` lists them.

Commands reach the library only through :func:`._fleet.open_fleet`, print
JSON (``--json``) or rich output from :mod:`._render`, and raise; the
exceptions become exit codes in one place, :func:`._errors.report_error`.
"""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from . import _cmd_admin, _cmd_agents, _cmd_monitor
from ._context import emit_json, options
from ._errors import Interrupted, report_error
from ._fleet import Options
from ._options import choose_manager

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


# -- global options -----------------------------------------------------------


def _version(ctx: typer.Context, value: bool) -> None:
    if not value:
        return
    from agentscope import __version__

    if options(ctx).json or "--json" in sys.argv[1:]:
        emit_json("version", {"version": __version__})
    else:
        sys.stdout.write(f"agentscope {__version__}\n")
    raise typer.Exit()


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
    user: Annotated[
        bool, typer.Option("--user", help="Your user manager: --manager user.")
    ] = False,
    system: Annotated[
        bool, typer.Option("--system", help="The system manager (root): --manager system.")
    ] = False,
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
    flags = [flag for flag, given in (("--user", user), ("--system", system)) if given]
    ctx.obj = Options(
        manager=choose_manager(manager.value if manager is not None else None, *flags),
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

_COMMANDS = (
    ("run", _cmd_agents.run),
    ("exec", _cmd_agents.exec_),
    ("ls", _cmd_agents.ls),
    ("stop", _cmd_agents.stop),
    ("kill", _cmd_agents.kill),
    ("freeze", _cmd_agents.freeze),
    ("thaw", _cmd_agents.thaw),
    ("attach", _cmd_agents.attach),
    ("logs", _cmd_agents.logs),
    ("send", _cmd_agents.send),
    ("report", _cmd_monitor.report),
    ("events", _cmd_monitor.events),
    ("top", _cmd_monitor.top),
    ("monitor", _cmd_monitor.monitor),
    ("doctor", _cmd_admin.doctor),
    ("gc", _cmd_admin.gc),
    ("install", _cmd_admin.install),
    ("uninstall", _cmd_admin.uninstall),
    ("demo", _cmd_admin.demo),
)


def _interruptible(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with Ctrl-C raised as :class:`Interrupted` (exit 130 and its message)."""

    @functools.wraps(command)  # typer reads the options from the wrapped signature
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt as exc:
            raise Interrupted from exc

    return wrapper


for _name, _command in _COMMANDS:
    app.command(_name)(_interruptible(_command))
