"""The typer app: every command but the ``exec`` fast path starts here.

The commands live by concern in ``_cmd_agents``, ``_cmd_monitor`` and
``_cmd_admin``; this module holds the global options and registers them,
in the order ``--help`` lists them. A command's module is imported, and its
click command built, only when that command runs or a listing of every
command (``--help``, docs/cli.md) asks for it: ``agentscope ls`` does not
pay for ``doctor``'s asyncio or ``monitor``'s HTTP face (issue 28).

Commands reach the library only through :func:`._fleet.open_fleet`, print
JSON (``--json``) or rich output from :mod:`._render`, and raise; the
exceptions become exit codes in one place, :func:`._errors.report_error`.
"""

from __future__ import annotations

import enum
import functools
import importlib
import sys
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Annotated, Any

import typer
import typer.core

from ._errors import Interrupted, report_error
from ._options import Options, choose_manager
from ._typerfast import QuickHelp, quicken

__all__ = ["app", "run_app"]

# -- commands -----------------------------------------------------------------

# Each command: the module and the function that define it, in --help's order.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("_cmd_agents", "run"),
    "exec": ("_cmd_agents", "exec_"),
    "call": ("_cmd_call", "call"),
    "ls": ("_cmd_agents", "ls"),
    "stop": ("_cmd_agents", "stop"),
    "kill": ("_cmd_agents", "kill"),
    "freeze": ("_cmd_agents", "freeze"),
    "thaw": ("_cmd_agents", "thaw"),
    "attach": ("_cmd_agents", "attach"),
    "logs": ("_cmd_agents", "logs"),
    "send": ("_cmd_agents", "send"),
    "report": ("_cmd_monitor", "report"),
    "events": ("_cmd_monitor", "events"),
    "top": ("_cmd_monitor", "top"),
    "monitor": ("_cmd_monitor", "monitor"),
    "doctor": ("_cmd_admin", "doctor"),
    "gc": ("_cmd_admin", "gc"),
    "install": ("_cmd_admin", "install"),
    "uninstall": ("_cmd_admin", "uninstall"),
    "demo": ("_cmd_admin", "demo"),
}


def _interruptible(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with Ctrl-C raised as :class:`Interrupted` (exit 130 and its message)."""

    @functools.wraps(command)  # typer reads the options from the wrapped signature
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt as exc:
            raise Interrupted from exc

    return wrapper


def build_command(name: str) -> Any:
    """The click command ``name``: its module imported and its typer command built now."""
    module, attr = COMMANDS[name]
    function = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
    single = typer.Typer(add_completion=False, rich_markup_mode=None)
    single.command(name, cls=_Command)(_interruptible(function))
    return quicken(typer.main.get_command(single))


class _LazyCommands(MutableMapping[str, Any]):
    """The root group's commands: every name known at once, each command built on first use."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in self._names:
                raise KeyError(name)
            self._built[name] = build_command(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self._names:
            self._names.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


class _Command(QuickHelp, typer.core.TyperCommand):
    """A command of the app: typer's, its help option converted without pydantic."""


class _LazyGroup(QuickHelp, typer.core.TyperGroup):
    """The root command: its subcommands come from :data:`COMMANDS`, built when asked for."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        given, self.commands = self.commands, _LazyCommands(list(COMMANDS))
        self.commands.update(given)  # none today: every command is in COMMANDS

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names alone: nothing is built for them

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return self.commands.get(cmd_name)


app = typer.Typer(
    cls=_LazyGroup,
    name="agentscope",
    help="Run every AI coding agent in its own systemd scope, and see which one ate the memory.",
    epilog="Examples:\n\n\b\n"
    "  agentscope run claude-1 --memory-max 4G -- claude\n"
    "  agentscope ls\n"
    "  agentscope monitor --guard\n\n"
    "agentscope COMMAND --help shows a command's own; man agentscope, docs/cli.md.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Manager(enum.StrEnum):
    auto = "auto"
    user = "user"
    system = "system"
    systemd = "systemd"
    cgroup = "cgroup"
    process = "process"


# -- global options -----------------------------------------------------------


def _version(ctx: typer.Context, value: bool) -> None:
    if not value:
        return
    from ._context import options
    from .main import print_version

    print_version(options(ctx).json or "--json" in sys.argv[1:])
    raise typer.Exit()


def _valid_fleet(value: str) -> str:
    from agentscope_systemd._names import validate_name

    return validate_name("fleet", value)


@app.callback()
def _globals(
    ctx: typer.Context,
    manager: Annotated[
        Manager | None,
        typer.Option(
            help="Who runs the agents: auto (systemd if it answers, else a delegated cgroup, "
            "else process trees), systemd, cgroup, process; or which systemd manager, "
            "system or user (auto: system when root).",
            show_default=False,
        ),
    ] = None,
    user: Annotated[
        bool, typer.Option("--user", help="Your user manager: --manager user.")
    ] = False,
    system: Annotated[
        bool, typer.Option("--system", help="The system manager (root): --manager system.")
    ] = False,
    fleet: Annotated[
        str, typer.Option(help="The fleet to act on.", metavar="NAME", callback=_valid_fleet)
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
    command = quicken(typer.main.get_command(app))  # the completion options came last
    try:
        rv = command.main(args=list(args), prog_name="agentscope", standalone_mode=False, obj=opts)
    except (Exception, KeyboardInterrupt) as exc:
        if isinstance(exc, typer.TyperException) and not opts.json and hasattr(exc, "show"):
            exc.show()  # click's own usage message, with the "Try --help" hint
            return int(getattr(exc, "exit_code", 2))
        return report_error(exc, json_mode=opts.json, debug=opts.debug)
    return rv if isinstance(rv, int) else 0
