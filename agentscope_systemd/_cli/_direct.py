"""``ls``, ``events``, ``stop`` and ``kill`` without typer: their plain command lines.

A harness polls the first two and stops or signals its agents with the
others (issue 28): typer and its click cost every call about 45 ms natively
before the command starts, and a second or more in the test bed's TCG
guests. :func:`direct_args` reads the command lines these commands take in
their plain spellings; anything else (``--help``, an unknown or repeated
option, an option without its value, a value the option's own parser or
check refuses) gives None, and typer then reads the whole line and says what
is wrong, as it always did.

The commands' bodies are here, :func:`list_agents`, :func:`print_events`,
:func:`stop_agents` and :func:`signal_agent`, and the typer commands
(``_cmd_agents.ls``, ``stop`` and ``kill``, ``_cmd_monitor.events``) call
them: both paths print the same thing and fail the same way, which
``tests/test_cli_direct.py`` compares over the fake fleet and registry.
"""

from __future__ import annotations

import contextlib
import sys
import time

from .._typecheck import TYPE_CHECKING
from . import _fleet
from ._errors import BadInput, Failed, Interrupted
from ._options import Options
from ._parse import duration_option, parse_since, whole_option
from ._words import option_value

if TYPE_CHECKING:  # annotations only
    from collections.abc import Sequence
    from typing import Any

    from agentscope_systemd import Fleet
    from agentscope_systemd._registry._records import EventRecord

__all__ = [
    "DIRECT",
    "MAX_EVENTS",
    "direct_args",
    "list_agents",
    "print_events",
    "run_direct",
    "signal_agent",
    "stop_agents",
]

#: The bounds of ``events --limit`` (docs/cli.md lists them).
MAX_EVENTS = 10**9
LIMIT = whole_option("--limit", 0, MAX_EVENTS)
#: ``stop --timeout``: a time span from SIGTERM to SIGKILL.
TIMEOUT = duration_option("--timeout", 0, 86400)
_EVENTS_PAGE = 1000

#: The commands read here, and their options: a flag's value is True.
DIRECT: dict[str, dict[str, str]] = {
    "ls": {},
    "events": {
        "--follow": "follow",
        "-f": "follow",
        "--since": "since",
        "--until": "until",
        "--kind": "kind",
        "--agent": "agent",
        "--limit": "limit",
    },
    "stop": {"--timeout": "timeout", "--all": "all_"},
    "kill": {"--signal": "signal_", "-s": "signal_"},
}
#: The commands that take one argument, and its field.
_ARGUMENT = {"stop": "name", "kill": "name"}
_FLAGS = ("--follow", "-f", "--all")


def direct_args(opts: Options, command: str, args: Sequence[str]) -> dict[str, Any] | None:
    """``command``'s arguments as its body takes them; None where typer must read them.

    None also for a fleet name or a value that typer's checks refuse: typer
    then reports it exactly as it does today.
    """
    from agentscope_systemd._names import validate_name

    try:
        validate_name("fleet", opts.fleet)
    except Exception:  # typer's check of --fleet says so
        return None
    names = DIRECT.get(command)
    if names is None:
        return None
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key = arg.partition("=")[0]
        field = names.get(key)
        if not arg.startswith("-") and command in _ARGUMENT:
            field, key = _ARGUMENT[command], ""
        if field is None or field in values:
            return None
        if key in _FLAGS:
            if arg != key:  # a flag takes no value
                return None
            values[field] = True
        elif not key:
            values[field] = arg
        else:
            taken = option_value(args, i)
            if taken is None:
                return None
            _, values[field], i = taken
        i += 1
    if command == "events":
        return _events_values(values)
    if command == "stop":
        return _stop_values(values)
    if command == "kill":
        return _kill_values(values)
    return values


def _events_values(values: dict[str, Any]) -> dict[str, Any] | None:
    """The events options checked as typer checks them (None where one is refused)."""
    from ._context import valid_agent

    out: dict[str, Any] = {
        "follow": values.get("follow", False),
        "since": values.get("since"),
        "until": values.get("until"),
        "kind": values.get("kind"),
        "agent": values.get("agent"),
        "limit": values.get("limit"),
    }
    try:
        out["agent"] = valid_agent(out["agent"])
        if out["limit"] is not None:
            out["limit"] = LIMIT(out["limit"])
    except Exception:  # typer reports the refusal
        return None
    return out


def _stop_values(values: dict[str, Any]) -> dict[str, Any] | None:
    """The stop arguments checked as typer checks them (None where one is refused)."""
    from ._context import valid_agent

    try:
        return {
            "name": valid_agent(values.get("name")),
            "all_": values.get("all_", False),
            "timeout": TIMEOUT(values["timeout"]) if "timeout" in values else 10.0,
        }
    except Exception:  # typer reports the refusal
        return None


def _kill_values(values: dict[str, Any]) -> dict[str, Any] | None:
    """The kill arguments checked as typer checks them (None where one is refused or missing)."""
    from ._context import valid_agent

    if "name" not in values:
        return None  # typer says the argument is missing
    try:
        return {"name": valid_agent(values["name"]), "signal_": values.get("signal_", "TERM")}
    except Exception:  # typer reports the refusal
        return None


def run_direct(opts: Options, command: str, values: dict[str, Any]) -> int:
    """Run ``command`` with its :func:`direct_args`; return the exit code (errors reported)."""
    from ._errors import report_error

    try:
        try:
            if command == "ls":
                list_agents(opts)
            elif command == "stop":
                stop_agents(opts, **values)
            elif command == "kill":
                signal_agent(opts, **values)
            else:
                print_events(opts, **values)
        except KeyboardInterrupt as exc:  # as _app's wrapper of every command does
            raise Interrupted from exc
    except Exception as exc:
        return report_error(exc, json_mode=opts.json, debug=opts.debug)
    return 0


def list_agents(opts: Options) -> None:
    """``agentscope ls``: the fleet's agents, as JSON or a table."""
    with contextlib.closing(_fleet.open_fleet(opts)) as fleet:
        agents = _fleet.agent_dicts(fleet, fleet.agents())  # each says which mode runs it (#27)
    if opts.json:
        from agentscope_systemd._contract import agent_list

        from ._context import write_json

        write_json(agent_list(agents))
    elif not agents:
        sys.stdout.write(f"no agents in fleet {opts.fleet!r}\n")
    else:
        from . import _render
        from ._context import show

        show(_render.ls_table(agents))


def stop_agents(opts: Options, name: str | None, all_: bool, timeout: float) -> None:
    """``agentscope stop``: one agent (SIGTERM, then SIGKILL after ``timeout``), or all."""
    if name is not None and all_:
        raise BadInput("give an agent NAME or --all, not both")
    if name is None and not all_:
        raise BadInput("name the agent to stop (agentscope stop NAME), or stop them all with --all")
    with contextlib.closing(_fleet.open_fleet(opts)) as fleet:
        if name is not None:
            fleet.stop(name, timeout=timeout)
            stopped: list[str] = [name]
            failed: list[dict[str, str]] = []
        else:
            progress = not opts.json and sys.stderr.isatty()
            stopped, failed = _stop_all(fleet, timeout, progress=progress)
    if opts.json:
        from ._context import emit_json

        emit_json("stop", {"stopped": stopped, "failed": failed})
    elif name is not None:
        sys.stdout.write(f"stopped {name}\n")
    else:
        sys.stdout.write(f"stopped {len(stopped)} agent(s)\n")
    if failed:
        raise Failed("could not stop " + ", ".join(f"{f['name']} ({f['error']})" for f in failed))


def signal_agent(opts: Options, name: str, signal_: str) -> None:
    """``agentscope kill``: send a signal to every process of an agent."""
    from ._parse import parse_signal

    sig = parse_signal(signal_)
    with contextlib.closing(_fleet.open_fleet(opts)) as fleet:
        fleet.kill(name, sig)
    if opts.json:
        from ._context import emit_json

        emit_json("kill", {"name": name, "signal": sig.name})
    else:
        sys.stdout.write(f"sent {sig.name} to {name}\n")


def _stop_all(
    fleet: Fleet, timeout: float, *, progress: bool
) -> tuple[list[str], list[dict[str, str]]]:
    from rich.markup import escape
    from rich.progress import Progress

    from agentscope_systemd import AgentNotFound, AgentscopeError

    from ._context import console

    names = [a.name for a in fleet.agents()]
    stopped: list[str] = []
    failed: list[dict[str, str]] = []
    with Progress(console=console(stderr=True), disable=not progress, transient=True) as bar:
        task = bar.add_task("stopping", total=len(names))
        for name in names:
            bar.update(task, description=f"stopping {escape(name)}")
            try:
                fleet.stop(name, timeout=timeout)
            except AgentNotFound:
                pass  # it ended by itself meanwhile
            except AgentscopeError as exc:
                failed.append({"name": name, "error": str(exc), "kind": type(exc).__name__})
                continue
            finally:
                bar.advance(task)
            stopped.append(name)
    return stopped, failed


def print_events(
    opts: Options,
    *,
    follow: bool = False,
    since: str | None = None,
    until: str | None = None,
    kind: str | None = None,
    agent: str | None = None,
    limit: int | None = None,
) -> None:
    """``agentscope events``: the fleet's recorded events, from its registry file alone."""
    now = time.time()
    start = parse_since(since, now) if since is not None else None
    end = parse_since(until, now) if until is not None else None
    filters: dict[str, Any] = {"kind": kind, "agent": agent}
    with contextlib.closing(_fleet.open_history(opts)) as history:
        if limit is not None:
            last = _print_events(
                history.events(since=start, until=end, last=limit, **filters), opts.json
            )
        else:
            # Page by id: memory stays one page, however long the history.
            last = None
            while True:
                page = history.events(
                    since=start, until=end, after_id=last, limit=_EVENTS_PAGE, **filters
                )
                last = _print_events(page, opts.json) or last
                if len(page) < _EVENTS_PAGE:
                    break
        if follow and last is None:
            # Follow from the newest event of any kind: a poll then costs the
            # new events only, never a rescan of the history.
            newest = history.events(last=1)
            last = newest[0].id if newest else 0
        while follow:  # until Ctrl-C: exit 130, as from every command
            time.sleep(1.0)
            last = _print_events(history.events(after_id=last, **filters), opts.json) or last


def _print_events(records: Sequence[EventRecord], as_json: bool) -> int | None:
    if as_json:
        from agentscope_systemd._contract import json_line
    else:
        from . import _render
    last = None
    for record in records:
        data = record.to_dict()
        sys.stdout.write((json_line(data) if as_json else _render.event_line(data)) + "\n")
        last = record.id
    sys.stdout.flush()
    return last
