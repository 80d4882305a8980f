"""The monitor face's read API: ``/v1/agents``, ``/v1/agents/NAME``, ``/v1/events``, ``/v1/report``.

A harness in any language reads the fleet without spawning the CLI. Each
body is exactly what the CLI's ``--json`` prints, built by the same
functions of :mod:`agentscope_systemd._contract` (docs/json.md, "The read API"):

- ``GET /v1/agents``: ``ls --json``'s array; ``GET /v1/agents/NAME`` one
  element of it (404 ``not_found`` when the fleet has no such agent);
- ``GET /v1/report``: ``report --json`` (the sample's report: its
  ``processes`` list is empty, the monitor does not scan /proc per sample);
- ``GET /v1/events``: ``events --json``'s JSON Lines, one event a line.

Agents and the report are the monitor's last sample (:class:`FaceState`),
at most one ``--interval`` old: a request costs no D-Bus call and no cgroup
read. Events are read through the monitor's own fleet (``Fleet.events``),
whose core reads its registry on a worker thread, off its event loop: a
slow read holds that request only. Not through a second registry
connection in the monitor's process: opening one opens and closes the
database's files, which drops the POSIX locks sqlite holds on them for the
monitor's connection (fcntl(2): a process's locks on a file go with any of
its descriptors), and a VM run saw the two then disagree.

``/v1/events`` takes ``after=ID`` (the events with a greater id, oldest
first), ``limit=N`` (at most N: the first N after ``after``, else the
newest N, like ``events --limit``), ``agent=NAME``, ``kind=KIND`` and
``wait=SECONDS``: a long poll that returns as soon as an event matches, or
empty when the wait is over. At most :data:`MAX_LONG_POLLS` wait at once
(a quarter of the face's connections): one more is answered 429 with a
``Retry-After``, so waiting clients can never take the slots a scrape needs.

Every refusal is the contract's ``error`` body, with the ``kind`` the CLI
gives the same mistake (:func:`agentscope_systemd._cli._errors.error_json`): 400 for a bad or
unknown parameter, 404 for no such agent or route, 503 before the first
sample (``starting``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentscope_systemd import AgentNotFound, _numbers
from agentscope_systemd._contract import agent_list, json_line, stamped
from agentscope_systemd._names import validate_name

from ._errors import BadInput, Failed, error_json

if TYPE_CHECKING:
    from ._fleet import HistoryLike
    from ._http import FaceState

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_LONG_POLLS",
    "MAX_WAIT",
    "Answer",
    "ReadApi",
]

DEFAULT_LIMIT = 100
"""Events per answer when ``limit`` is not given."""
MAX_LIMIT = 1000
"""The most events one answer holds: a page, however long the history."""
MAX_WAIT = 60.0
"""The longest long poll, in seconds."""
MAX_LONG_POLLS = 16
"""Long polls waiting at once (of the face's 64 connections)."""
#: How often a long poll reads the registry again. Other processes (a CLI's
#: run, stop, exec) write events the face hears nothing of; the monitor's own
#: events wake it at once.
_POLL_SECONDS = 0.25
_MAX_QUERY = 1024
_MAX_KIND = 64
_JSON = "application/json"
_JSON_LINES = "application/x-ndjson"
_EVENT_PARAMS = ("after", "limit", "wait", "agent", "kind")


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, content type, body, extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class _Busy(Failed):
    """Every long-poll slot is taken: 429, try again after a second."""

    def __init__(self) -> None:
        super().__init__(
            f"{MAX_LONG_POLLS} long polls are already waiting; retry after a second, "
            "or poll without wait",
            "busy",
        )


class _Starting(Failed):
    """No sample yet: 503 until the monitor's first (a moment after it starts)."""

    def __init__(self) -> None:
        super().__init__(
            "the monitor has not taken its first sample yet; retry in a second", "starting"
        )


class _NoRoute(Failed):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"no route {path[:200]!r}: the read API serves /v1/agents, /v1/agents/NAME, "
            "/v1/events and /v1/report",
            "not_found",
        )


class ReadApi:
    """The routes under ``/v1/``, over a face's state and the fleet's recorded history.

    ``history`` is borrowed (its owner closes it, after the face); None
    serves ``/v1/events`` as 404. Thread-safe: each request runs on its own thread.
    """

    def __init__(
        self,
        state: FaceState,
        history: HistoryLike | None,
        *,
        max_long_polls: int = MAX_LONG_POLLS,
    ) -> None:
        self._state = state
        self._history = history
        self._max_polls = max_long_polls
        self._polls = threading.BoundedSemaphore(max_long_polls)
        self._closed = threading.Event()

    def close(self) -> None:
        """End every long poll now (each answers what it has); idempotent.

        Waits (at most 5 s) until no poll reads the history any more: its
        owner closes it next.
        """
        if self._closed.is_set():
            return
        self._closed.set()
        self._state.wake()
        deadline = time.monotonic() + 5.0
        for _ in range(self._max_polls):
            self._polls.acquire(timeout=max(0.0, deadline - time.monotonic()))

    def answer(self, path: str, query: str) -> Answer:
        """The answer to ``GET path?query`` (``path`` under ``/v1/``)."""
        try:
            return self._route(path, query)
        except Exception as exc:
            # One mapping of failures to kinds, the CLI's: a refusal here
            # reads as the same mistake made on the command line.
            return _error(exc)

    def _route(self, path: str, query: str) -> Answer:
        if len(query) > _MAX_QUERY:
            raise BadInput(f"the query is {len(query)} characters long; at most {_MAX_QUERY}")
        if path == "/v1/agents":
            _params(query, (), path)
            return _json(agent_list(self._sample().agents))
        if path.startswith("/v1/agents/"):
            _params(query, (), path)
            name = validate_name("agent", urllib.parse.unquote(path[len("/v1/agents/") :]))
            # A listing can hold a closing row and its successor: the later wins.
            rows = [a for a in self._sample().agents if a.get("name") == name]
            if not rows:
                raise AgentNotFound(self._state.fleet, name)
            return _json(stamped("agent", rows[-1]))
        if path == "/v1/report":
            _params(query, (), path)
            report = self._sample().report
            if report is None:
                raise Failed("the monitor's last report failed; see /health's last_error", "error")
            return _json(stamped("report", report))
        if path == "/v1/events" and self._history is not None:
            return self._events(_params(query, _EVENT_PARAMS, path))
        raise _NoRoute(path)

    def _sample(self) -> Any:
        sample, _ = self._state.read()
        if sample is None:
            raise _Starting()
        return sample

    def _events(self, params: Mapping[str, str]) -> Answer:
        assert self._history is not None
        big = 2**63 - 1  # SQLite's integers are 64-bit
        after = None
        if "after" in params:
            after = _numbers.whole("after", params["after"], low=0, high=big)
        count = _numbers.whole("limit", params.get("limit", DEFAULT_LIMIT), low=1, high=MAX_LIMIT)
        wait = _numbers.real("wait", params.get("wait", 0), low=0, high=MAX_WAIT)
        agent = validate_name("agent", params["agent"]) if "agent" in params else None
        kind = _kind(params["kind"]) if "kind" in params else None
        history = self._history

        def read() -> list[Any]:
            if after is None:  # the newest, like events --limit
                return list(history.events(last=count, agent=agent, kind=kind))
            return list(history.events(after_id=after, limit=count, agent=agent, kind=kind))

        records = read()
        if not records and wait:
            if not self._polls.acquire(blocking=False):
                raise _Busy()
            try:
                deadline = time.monotonic() + wait
                while not records and not self._closed.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._state.wait_event(min(left, _POLL_SECONDS))
                    if self._closed.is_set():
                        break
                    records = read()
            finally:
                self._polls.release()
        body = "".join(json_line(r.to_dict()) + "\n" for r in records)
        return Answer(200, _JSON_LINES, body.encode())


def _params(query: str, allowed: tuple[str, ...], path: str) -> dict[str, str]:
    """The query's parameters, each at most once and each one ``allowed``.

    Raises:
        BadInput: not a query string, a parameter twice, or one the route does not take.
    """
    try:
        pairs = urllib.parse.parse_qsl(
            query,
            keep_blank_values=True,
            strict_parsing=bool(query),
            max_num_fields=max(1, len(allowed)),
            errors="strict",
        )
    except (ValueError, UnicodeDecodeError):
        takes = ", ".join(allowed) if allowed else "no parameters"
        raise BadInput(f"{path} takes {takes}; not the query {query[:200]!r}") from None
    found: dict[str, str] = {}
    for key, value in pairs:
        if key not in allowed:
            takes = "takes " + ", ".join(allowed) if allowed else "takes no parameters"
            raise BadInput(f"{path} {takes}; not {key[:64]!r}")
        if key in found:
            raise BadInput(f"{path}: {key} given twice")
        found[key] = value
    return found


def _kind(value: str) -> str:
    """An event kind as the contract spells them (``^[a-z][a-z0-9_]*$``), at most 64 characters.

    Raises:
        BadInput: anything else.
    """
    ok = (
        0 < len(value) <= _MAX_KIND
        and value.isascii()
        and value[0].islower()
        and all(c.islower() or c.isdigit() or c == "_" for c in value)
    )
    if not ok:
        raise BadInput(
            f"kind {value[:_MAX_KIND]!r} is not an event kind: lower-case letters, digits "
            "and _, starting with a letter (docs/json.md lists them)"
        )
    return value


def _json(data: Any) -> Answer:
    return Answer(200, _JSON, (json_line(data) + "\n").encode())


#: The CLI's exit codes as HTTP statuses: bad input, no such agent, the rest.
_STATUS = {2: 400, 3: 404}


def _error(exc: Exception) -> Answer:
    code, body = error_json(exc)
    headers: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, _Busy):
        status, headers = 429, (("Retry-After", "1"),)
    elif isinstance(exc, _Starting):
        status, headers = 503, (("Retry-After", "1"),)
    elif isinstance(exc, _NoRoute):
        status = 404
    else:
        status = _STATUS.get(code, 500)
    return Answer(status, _JSON, (json.dumps(body) + "\n").encode(), headers)
