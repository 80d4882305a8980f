"""The registry's records: a launch's row, an event's row, and a row's lifecycle.

:class:`AgentRecord` and :class:`EventRecord` are what :class:`._registry.Registry`
returns; the states and the moves allowed between them are the lifecycle
``Registry.set_state`` enforces. Rows are parsed here, tolerating one damaged
by another writer; the errors about one row are here too. No I/O.

Lifecycle of a row (``set_state``)::

    starting  -> running, frozen, stopping, or a closed state
    running   -> frozen, stopping, or a closed state
    frozen    -> running, stopping, or a closed state
    stopping  -> a closed state
    exited, failed, lost (closed) -> nothing, but for ``reopen``: a
              reconciliation that finds the row's scope running reopens it
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, TypedDict, TypeVar, get_args

from .._contract import event_envelope
from .._dicts import Record, as_dict
from .._managers._scopeprops import DEFAULT_REAP_AFTER

__all__ = [
    "CLOSED_STATES",
    "OPEN_STATES",
    "AgentRecord",
    "AgentState",
    "EventRecord",
]

_T = TypeVar("_T")

AgentState = Literal["starting", "running", "frozen", "stopping", "exited", "failed", "lost"]
"""The state of one launch. ``exited``, ``failed`` and ``lost`` are closed."""

OPEN_STATES: Final[frozenset[str]] = frozenset({"starting", "running", "frozen", "stopping"})
CLOSED_STATES: Final[frozenset[str]] = frozenset({"exited", "failed", "lost"})
_STATES: Final[frozenset[str]] = frozenset(get_args(AgentState))
assert _STATES == OPEN_STATES | CLOSED_STATES

# Allowed moves between distinct states; setting the current state again is a
# no-op and always allowed. Closed states have no way out.
_TRANSITIONS: Final[Mapping[str, frozenset[str]]] = {
    "starting": frozenset({"running", "frozen", "stopping"}) | CLOSED_STATES,
    "running": frozenset({"frozen", "stopping"}) | CLOSED_STATES,
    "frozen": frozenset({"running", "stopping"}) | CLOSED_STATES,
    "stopping": CLOSED_STATES,
    "exited": frozenset(),
    "failed": frozenset(),
    "lost": frozenset(),
}


@dataclass(frozen=True, slots=True)
class AgentRecord(Record):
    """One launch as the registry stores it (one row of ``agents``)."""

    id: int
    fleet: str
    name: str
    unit: str
    pid: int
    start_time: int
    """Field 22 of ``/proc/PID/stat``: clock ticks after boot the process started."""
    argv: tuple[str, ...]
    cwd: str
    created: float
    state: AgentState
    exit_status: int | None
    exited: float | None
    oom_kills: int
    memory_current: int | None
    memory_peak: int | None
    reap_after: float | None = DEFAULT_REAP_AFTER
    """Seconds its leftovers may outlive its main process; None: kept (``keep``)."""
    lingering: float | None = None
    """When its main process was seen gone while its scope still held processes."""

    @property
    def closed(self) -> bool:
        """Whether the row is closed (exited, failed or lost) and so final."""
        return self.state in CLOSED_STATES


# A row is read with its record's fields as its columns, in order: the record
# is the one list of them (a new column is a new field, and nothing else).
_AGENT_FIELDS: Final = tuple(f.name for f in fields(AgentRecord))
_AGENT_COLUMNS: Final = ", ".join(_AGENT_FIELDS)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One event (one row of ``events``); ``agent`` is None for fleet-wide events."""

    id: int
    ts: float
    fleet: str
    agent: str | None
    kind: str
    detail: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-ready dict: the contract's ``agentscope.event`` shape."""
        return event_envelope(**as_dict(self))  # its fields are the envelope's


_EVENT_COLUMNS: Final = ", ".join(f.name for f in fields(EventRecord))


class EventFilter(TypedDict, total=False):
    """The filters of a read of recorded events, each optional (None: no filter).

    ``agent`` and ``kind`` match exactly; ``since`` <= ``ts`` < ``until``
    (unix seconds); ``after_id`` keeps the ids after it (for following);
    ``limit`` keeps the first ones and ``last`` the newest ones (still oldest
    first). :meth:`Registry.events` applies them; ``AsyncFleet.events`` and
    the command line pass them on, typed by this one list.
    """

    agent: str | None
    since: float | None
    until: float | None
    kind: str | None
    after_id: int | None
    limit: int | None
    last: int | None


def _json_or(raw: Any, fallback: Callable[[Any], _T], kind: type) -> Any:
    """``raw`` parsed as JSON of ``kind``, or ``fallback(raw)``: one damaged
    row (another writer, a disk fault) must not make ``ls`` or ``events`` fail."""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return fallback(raw)
    return value if isinstance(value, kind) else fallback(raw)


def _unreadable(raw: Any) -> dict[str, Any]:
    return {"unreadable": str(raw)[:200]}


def _agent_from_row(row: Sequence[Any]) -> AgentRecord:
    """A row selected as ``_AGENT_COLUMNS``; two columns are stored otherwise than held."""
    values = dict(zip(_AGENT_FIELDS, row, strict=True))
    argv = _json_or(values["argv"], lambda raw: ["<unreadable argv>"], list)
    values["argv"] = tuple(str(a) for a in argv)
    values["reap_after"] = _reap_after_from_column(values["reap_after"])
    return AgentRecord(**values)


def _reap_after_from_column(value: float | None) -> float | None:
    if value is None:
        return DEFAULT_REAP_AFTER
    return None if value < 0 else float(value)


def _reap_after_to_column(value: float | None) -> float:
    return -1.0 if value is None else float(value)


def _event_from_row(row: Sequence[Any]) -> EventRecord:
    """A row selected as ``_EVENT_COLUMNS``; its detail is stored as JSON."""
    id_, ts, fleet, agent, kind, detail = row
    return EventRecord(id_, ts, fleet, agent, kind, _json_or(detail, _unreadable, dict))


def _insert_event(
    conn: sqlite3.Connection, ts: float, fleet: str, agent: str | None, kind: str, detail: str
) -> int:
    cur = conn.execute(
        "INSERT INTO events (ts, fleet, agent, kind, detail) VALUES (?, ?, ?, ?, ?)",
        (ts, fleet, agent, kind, detail),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def _name_holder(conn: sqlite3.Connection, fleet: str, name: str) -> str | None:
    """The unit of the open row that holds ``name`` (the partial unique index's rule)."""
    row = conn.execute(
        "SELECT unit FROM agents WHERE fleet = ? AND name = ? AND state IN"
        " ('starting', 'running', 'frozen', 'stopping')",
        (fleet, name),
    ).fetchone()
    return None if row is None else str(row[0])
