"""Every failure of the command line becomes an exit code and a message here.

This is the one place that maps exceptions to exit codes::

    0  ok
    1  the operation failed        BusError, AgentExists, HostUnderPressure, TmuxError,
                               other AgentscopeError, OSError
    2  bad usage or bad input      usage errors, BadInput, InvalidName, InvalidConfig,
                               LaunchError (its other kinds), ModeUnsupported
    3  no such agent               AgentNotFound
    4  systemd unreachable         SystemdUnavailable (ModeUnavailable: a mode forced
                               where it cannot work)
  130  interrupted                 Ctrl-C (KeyboardInterrupt, Interrupted), as a shell
                               reports SIGINT, in every command

``exec`` becomes its command, whose status any number may be: its own
failures are those of coreutils' ``env`` and ``docker run`` instead
(:func:`exec_status`)::

  125  agentscope failed           everything above but 130
  126  the command cannot run      CannotRun (not executable, exec refused)
  127  the command is not found    CommandNotFound
  130  interrupted                 before the exec

With ``--json`` the message goes to stderr as ``{"schema": "agentscope.error/1",
"error": ..., "kind": ...}``.
Kept free of typer and rich, and of any import its ``exec`` fast path
(which raises :class:`BadInput`) does not need before it execs.
"""

from __future__ import annotations

import sys

from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TextIO

__all__ = [
    "EXIT_CANNOT_RUN",
    "EXIT_COMMAND_NOT_FOUND",
    "EXIT_EXEC_FAILED",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "BadInput",
    "CannotRun",
    "CommandNotFound",
    "Failed",
    "Interrupted",
    "classify",
    "error_json",
    "exec_status",
    "report_error",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT
# exec's own (coreutils env(1), timeout(1), docker run): no command's status collides.
EXIT_EXEC_FAILED = 125
EXIT_CANNOT_RUN = 126
EXIT_COMMAND_NOT_FOUND = 127


class BadInput(ValueError):
    """Input the user can correct (a size, a time, a signal, a missing binary): exit 2."""


class Failed(Exception):
    """An operation of the command line itself failed: exit 1 with ``kind``."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind


class CommandNotFound(Failed):
    """``exec``'s command is not there (not on ``$PATH``, no such file): exec exits 127."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "command_not_found")


class CannotRun(Failed):
    """``exec``'s command is there but cannot run (not executable, exec refused): exit 126."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "cannot_run")


class Interrupted(Exception):
    """Ctrl-C inside a command: exit 130 like a shell, whatever typer version runs it.

    Typer (by version) turns a KeyboardInterrupt into a silent exit 130 or
    into click's ``Abort``; the commands raise this instead (``_app``
    wraps each one), so the message and ``--json``'s error line come out too.
    """


def classify(exc: BaseException) -> tuple[int, str]:
    """The exit code and the ``kind`` word of an exception."""
    if isinstance(exc, KeyboardInterrupt | Interrupted):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, BadInput):
        return EXIT_USAGE, "bad_input"
    if isinstance(exc, Failed):
        return EXIT_FAILED, exc.kind
    if "typer" in sys.modules:
        import typer

        if isinstance(exc, typer.Abort):  # older typer: click's answer to Ctrl-C
            return EXIT_INTERRUPTED, "interrupted"
        if isinstance(exc, typer.TyperException):  # click's usage errors and friends
            code = getattr(exc, "exit_code", EXIT_FAILED)
            return code, "usage" if code == EXIT_USAGE else "failed"
    if "agentscope_systemd._errors" in sys.modules:  # else no error of the library was raised
        import agentscope_systemd as a

        table: list[tuple[type[BaseException], int, str]] = [
            (a.InvalidName, EXIT_USAGE, "invalid_name"),
            (a.InvalidConfig, EXIT_USAGE, "invalid_config"),
            # Conditions of the host, not of the input (the first match wins):
            # a LaunchError's other kinds are a bad argv, cwd or env.
            (a.HostUnderPressure, EXIT_FAILED, "host_under_pressure"),
            (a.TmuxUnavailable, EXIT_FAILED, "tmux_unavailable"),
            (a.TmuxError, EXIT_FAILED, "tmux_error"),
            (a.LaunchError, EXIT_USAGE, "launch_error"),
            (a.ModeUnsupported, EXIT_USAGE, "mode_unsupported"),
            (a.AgentNotFound, EXIT_NOT_FOUND, "not_found"),
            (a.ModeUnavailable, EXIT_UNAVAILABLE, "mode_unavailable"),
            (a.SystemdUnavailable, EXIT_UNAVAILABLE, "systemd_unavailable"),
            (a.AgentExists, EXIT_FAILED, "agent_exists"),
            (a.BusError, EXIT_FAILED, "bus_error"),
            (a.AgentscopeError, EXIT_FAILED, "error"),
        ]
        for cls, code, kind in table:
            if isinstance(exc, cls):
                return code, kind
    if isinstance(exc, OSError):
        return EXIT_FAILED, "os_error"
    return EXIT_FAILED, "internal"


def exec_status(exc: BaseException) -> int:
    """``exec``'s exit code for ``exc``: 127, 126, 130, else 125 (agentscope failed)."""
    if isinstance(exc, CommandNotFound):
        return EXIT_COMMAND_NOT_FOUND
    if isinstance(exc, CannotRun):
        return EXIT_CANNOT_RUN
    if classify(exc)[0] == EXIT_INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_EXEC_FAILED


def _message(exc: BaseException, kind: str) -> str:
    text = str(exc)
    if kind == "usage" and hasattr(exc, "format_message"):
        text = str(exc.format_message())
    if kind == "interrupted":
        text = text if isinstance(exc, Interrupted) and text else "interrupted"
    if kind == "internal":
        text = (
            f"{type(exc).__name__}: {text} (a bug in agentscope; rerun with --debug to see where)"
        )
    return text or type(exc).__name__


def error_json(exc: BaseException) -> tuple[int, dict[str, object]]:
    """The exit code of ``exc`` and the contract's error body for it (``--json``'s stderr line;
    the read API's 4xx answers)."""
    from agentscope_systemd._contract import error_body

    code, kind = classify(exc)
    return code, error_body(_message(exc, kind), kind)


def report_error(
    exc: BaseException, *, json_mode: bool, debug: bool, stream: TextIO | None = None
) -> int:
    """Write ``exc`` to stderr (JSON or one line) and return its exit code."""
    out = stream if stream is not None else sys.stderr
    code, body = error_json(exc)
    if debug:
        import traceback

        traceback.print_exception(exc, file=out)
    if json_mode:
        import json

        out.write(json.dumps(body) + "\n")
    else:
        out.write(f"agentscope: error: {body['error']}\n")
    out.flush()
    return code
