"""Entry point of the ``agentscope`` command.

``exec`` and ``call`` take a fast path that imports neither typer nor rich (nor
logging, nor anything it can do without): it moves this process into a
scope and execs, so its start-up is the command's. ``--version`` is
answered before typer is imported, and so are ``ls``, ``events`` and ``stop``
given in their plain spellings (:mod:`._direct`). Every other command goes through the
typer app in :mod:`._app`, which imports only the module of the command
that runs.
"""

from __future__ import annotations

import sys

from .._typecheck import TYPE_CHECKING
from ._options import MANAGER_FLAGS, Options, choose_manager
from ._words import option_value

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable, Sequence
    from typing import NoReturn

__all__ = ["hoist_globals", "main", "print_version", "split_globals", "version_only"]

_VALUED = ("--manager", "--fleet")
_FLAGS = ("--json", "--debug", *MANAGER_FLAGS)


def hoist_globals(args: Sequence[str]) -> list[str]:
    """Move global options given after the command to the front.

    Harnesses write ``agentscope ls --json`` as often as ``agentscope --json
    ls``; both mean the same. Only what comes before the agent's command
    moves: what follows ``--``, or the command of ``run``, ``exec`` or
    ``call`` given without ``--``, is the agent's own command line. For
    ``run`` a ``--`` is put before that command, so that typer leaves its
    options to the agent (``agentscope run b mytool -v --json``).
    """
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    start, command = _agent_command_start(args)
    if command == "run" and start < end:
        args.insert(start, "--")  # click would read mytool's -v as run's (issue 28)
    end = min(end, start)
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < end:
        arg = args[i]
        key, eq, _ = arg.partition("=")
        if arg in _FLAGS:
            front.append(arg)
        elif key in _VALUED and i > 0 and (eq or i + 1 < end):
            front.append(arg)
            if not eq:
                i += 1
                front.append(args[i])
        else:
            rest.append(arg)
        i += 1
    return [*front, *rest, *args[end:]]


#: ``run``'s options that take a value (tests/test_cli.py checks them against the command).
RUN_VALUED = (
    "--cwd",
    "--env",
    "--memory-max",
    "--log",
    "--tasks-max",
    "--cpu-weight",
    "--io-weight",
    "--property",
    "-p",
    "--reap-after",
)


def _agent_command_start(args: Sequence[str]) -> tuple[int, str | None]:
    """Where the agent's command begins in ``run``, ``exec`` or ``call`` given without
    ``--`` (else len(args)), and which of them ``args`` run (None: another).

    ``agentscope exec b mytool --json`` gives ``--json`` to ``mytool``: what follows
    the agent's command is the agent's, never ours.
    """
    from ._exec import VALUED as EXEC_VALUED

    valued: dict[str, Sequence[str]] = {"exec": tuple(EXEC_VALUED), "run": RUN_VALUED}
    if "call" in args:  # not imported on exec's path
        from ._call import VALUED as CALL_VALUED

        valued["call"] = tuple(CALL_VALUED)
    i, command, name_seen = 0, None, False
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        key = arg.partition("=")[0]
        if arg in _FLAGS or arg in ("-q", "--quiet", "-h", "--help"):
            pass
        elif key in _VALUED or (command is not None and key in valued[command]):
            i += 0 if "=" in arg else 1
        elif command is not None and arg.startswith("-") and arg != "-":
            pass  # a flag of the command's (run --tmux); a bad one is the command's to refuse
        elif command is None:
            if arg not in valued:
                return len(args), None
            command = arg
            name_seen = arg == "call"  # call has no NAME: its next word is the command
        elif not name_seen:
            name_seen = True
        else:
            return i, command
        i += 1
    return len(args), command


def split_globals(args: Sequence[str]) -> tuple[Options, str | None, list[str]] | None:
    """The global options, the command and its arguments; None if they do not parse simply.

    None sends the whole command line to typer, which then reports what is wrong.
    """
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        key = arg.partition("=")[0]
        if key in _VALUED:
            taken = option_value(args, i)
            if taken is None:
                return None
            _, values[key], i = taken
        elif arg in _FLAGS:
            flags.add(arg)
        elif arg.startswith("-"):
            return None
        else:
            break
        i += 1
    try:
        manager = choose_manager(values.get("--manager"), *(f for f in flags if f in MANAGER_FLAGS))
    except ValueError:  # BadInput: typer then reports it, exit 2
        return None
    opts = Options(
        manager=manager,
        fleet=values.get("--fleet", "default"),
        json="--json" in flags,
        debug="--debug" in flags,
    )
    command = args[i] if i < len(args) else None
    return opts, command, list(args[i + 1 :])


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run the agentscope command line and exit with its status."""
    try:
        _main(argv)
    except KeyboardInterrupt as exc:  # Ctrl-C between the commands: while importing, say
        from ._errors import report_error

        args = sys.argv[1:] if argv is None else argv
        sys.exit(report_error(exc, json_mode="--json" in args, debug="--debug" in args))


def print_version(as_json: bool) -> None:
    """``--version``'s line (``agentscope.version/1`` with ``--json``)."""
    from agentscope_systemd import __version__

    if as_json:
        import json

        from agentscope_systemd._contract import stamped

        sys.stdout.write(json.dumps(stamped("version", {"version": __version__})) + "\n")
    else:
        sys.stdout.write(f"agentscope {__version__}\n")
    sys.stdout.flush()


def version_only(args: Sequence[str]) -> bool | None:
    """Whether ``args`` ask for the version alone, and in JSON: None if they ask for more.

    ``--version`` is eager: typer prints it whatever the values of the other
    global options. Anything else (a command, an unknown option, an option
    without its value) goes to typer, which also says what is wrong.
    """
    seen, as_json, i = False, False, 0
    while i < len(args):
        arg = args[i]
        key, eq, _ = arg.partition("=")
        if arg == "--version":
            seen = True
        elif key in _VALUED and not eq:
            if i + 1 >= len(args):
                return None
            i += 1  # its value, whatever it looks like
        elif key not in _VALUED and arg not in _FLAGS:
            return None
        as_json = as_json or arg == "--json"
        i += 1
    return as_json if seen else None


def _command_word(args: Sequence[str]) -> str | None:
    """The command ``args`` name: the first word that is not a global option or its value."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
        if arg in _VALUED:
            i += 1
        i += 1
    return None


def _manager_auto(args: Sequence[str]) -> bool:
    """Whether ``--manager auto`` is given: exec takes it, typer's ``--manager`` refuses it."""
    return any(
        arg == "--manager=auto" or (arg == "--manager" and args[i + 1 : i + 2] == ["auto"])
        for i, arg in enumerate(args)
    )


def _run_fast(command: str, opts: Options, args: Sequence[str]) -> NoReturn:
    """``exec`` or ``call``: nothing imported but what it needs, its own exit codes."""
    run: Callable[[Options, Sequence[str]], None]
    asked_help: type[Exception]
    if command == "exec":
        from ._exec import HELP, ExecHelp, run_exec

        run, help_text, asked_help = run_exec, HELP, ExecHelp
    else:
        from ._call import HELP as CALL_HELP
        from ._call import CallHelp, run_call

        run, help_text, asked_help = run_call, CALL_HELP, CallHelp
    try:
        run(opts, args)
    except asked_help:
        sys.stdout.write(help_text)
        sys.exit(0)
    except (Exception, KeyboardInterrupt) as exc:
        from ._errors import exec_status, report_error

        report_error(exc, json_mode=opts.json, debug=opts.debug)
        sys.exit(exec_status(exc))
    sys.exit(0)  # reached only with a stand-in exec


def _main(argv: Sequence[str] | None) -> NoReturn:
    args = hoist_globals(sys.argv[1:] if argv is None else argv)
    split = split_globals(args)
    opts = (
        split[0] if split is not None else Options(json="--json" in args, debug="--debug" in args)
    )
    if split is not None and split[1] in ("exec", "call"):
        _run_fast(split[1], opts, split[2])
    version = version_only(args)
    if version is not None:
        print_version(as_json=version)
        sys.exit(0)
    from ._logging import setup_logging

    setup_logging(opts.debug)
    command = split[1] if split is not None else None
    if split is not None and command is not None and not _manager_auto(args):
        from ._direct import DIRECT, direct_args, run_direct

        values = direct_args(opts, command, split[2]) if command in DIRECT else None
        if values is not None:
            sys.exit(run_direct(opts, command, values))
    from ._app import run_app

    code = run_app(args, opts)
    if code not in (0, 130) and _command_word(args) in ("exec", "call"):
        # exec or call with global options typer had to read: they were bad. Its own code.
        from ._errors import EXIT_EXEC_FAILED

        code = EXIT_EXEC_FAILED
    sys.exit(code)
