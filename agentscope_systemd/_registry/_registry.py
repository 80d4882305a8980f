"""The registry: an SQLite file that remembers every agent agentscope launched.

Agents outlive the manager process that started them; the next manager finds
them again here. Each launch is one row of ``agents`` (fleet, name, unit,
pid and pid start time, argv, cwd, state, exit and memory figures), and
everything worth telling a user later is one row of ``events``.

The file lives at :func:`default_registry_path`. It is opened in WAL mode
with a busy timeout; every write is one short ``BEGIN IMMEDIATE``
transaction, so a harness and several CLI invocations can share it.

This module is the store and its transactions. Around it: the records and
their lifecycle (:mod:`._records`), the pure reconciliation plan and the
in-flight rule (:mod:`._reconcile_plan`, whose closures
:meth:`Registry.apply_closures` carries out), the schema and its migrations
(:mod:`._registry_schema`), the file, its modes and sqlite3's errors
(:mod:`._registry_file`), the history kept bounded (:mod:`._registry_history`,
a part the registry holds), and the take-in of exec's spool
(:mod:`._spool_intake`). Their public names are re-exported here.

Its errors are drawn with every other in ``_errors.py``: ``AgentExists``
(an open row already holds that fleet and name), ``RegistryError`` and below
it ``RegistryCorrupt``, ``UnitNotFound`` (no row for that unit) and
``InvalidTransition`` (a state change the lifecycle does not allow).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar, Unpack

from .. import _numbers
from .._calls import _callevents
from .._errors import (
    AgentExists,
    InvalidTransition,
    RegistryCorrupt,
    RegistryError,
    UnitNotFound,
)
from .._fleet._reconcile_plan import (
    REASON_PID_REUSED,
    REASON_PROCESS_GONE,
    REASON_SCOPE_GONE,
    LiveScope,
    ReconcilePlan,
    in_flight,
    reconcile,
    stale,
)
from .._managers._scopeprops import DEFAULT_REAP_AFTER
from . import _spool, _spool_intake
from ._records import (
    _AGENT_COLUMNS,
    _EVENT_COLUMNS,
    _STATES,
    _TRANSITIONS,
    CLOSED_STATES,
    OPEN_STATES,
    AgentRecord,
    AgentState,
    EventFilter,
    EventRecord,
    _agent_from_row,
    _event_from_row,
    _insert_event,
    _name_holder,
    _reap_after_to_column,
)
from ._registry_file import (
    DEFAULT_RETENTION,
    _map_error,
    _prepare_files,
    _retention_from_env,
    _retry_busy,
    default_registry_path,
)
from ._registry_history import MAX_EVENTS, History
from ._registry_lifecycle import LifecycleStore
from ._registry_oom import OomPlanner, OomRecording, OomStore
from ._registry_schema import SCHEMA_VERSION, setup

__all__ = [
    "CLOSED_STATES",
    "DEFAULT_RETENTION",
    "MAX_EVENTS",
    "OPEN_STATES",
    "REASON_PID_REUSED",
    "REASON_PROCESS_GONE",
    "REASON_SCOPE_GONE",
    "SCHEMA_VERSION",
    "AgentRecord",
    "AgentState",
    "EventRecord",
    "InvalidTransition",
    "LiveScope",
    "OomPlanner",
    "OomRecording",
    "ReconcilePlan",
    "Registry",
    "RegistryCorrupt",
    "RegistryError",
    "UnitNotFound",
    "default_registry_path",
    "in_flight",
    "reconcile",
    "stale",
]

_T = TypeVar("_T")

#: How long a transaction waits for the write lock. Writes take milliseconds;
#: this rides out a loaded host (many launches at once from several processes
#: while the host is short of memory and its I/O stalls) and still fails in
#: bounded time. 5 s was seen to run out for 4 processes x 25 launches under TCG.
_DEFAULT_TIMEOUT: Final = 15.0


# ------------------------------------------------------------------ registry


class Registry(LifecycleStore, OomStore):
    """The registry file, opened: one connection, safe to share between threads.

    Each method is one short transaction. Use it as a context manager, or
    call :meth:`close`. The async core calls it from a worker thread.

    Example::

        with Registry(default_registry_path("user")) as reg:
            rec = reg.record_launch("ci", "claude-1", unit, pid, start, argv, cwd)
            reg.set_state(rec.unit, "running")

    Raises:
        RegistryCorrupt: the file is not a database or is damaged.
        RegistryError: the file cannot be created, opened or migrated, or it
            was written by a newer agentscope.
    """

    def __init__(
        self,
        path: os.PathLike[str] | str,
        *,
        timeout: float = _DEFAULT_TIMEOUT,
        retention_seconds: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._history = History(
            self._transaction,
            _retention_from_env(os.environ) if retention_seconds is None else retention_seconds,
        )
        self._lock = threading.Lock()
        self._spool = _spool.spool_dir(self.path)
        self._calls = _callevents.calls_dir(self.path)
        self._spool_lock = threading.Lock()
        self._spool_warned = False
        self._conn: sqlite3.Connection | None = None
        try:
            _prepare_files(self.path)
        except OSError as exc:
            raise _map_error(self.path, exc, timeout) from exc
        try:
            conn = sqlite3.connect(
                self.path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _map_error(self.path, exc, timeout) from exc
        try:
            setup(conn, self.path, timeout)
        except sqlite3.Error as exc:
            conn.close()
            raise _map_error(self.path, exc, timeout) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._history.prune()

    # -- lifecycle

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; later calls raise RegistryError. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._conn is None

    @property
    def retention_seconds(self) -> float:
        """How old a closed row or an event may grow before the registry prunes it (0: never)."""
        return self._history.retention_seconds

    def __repr__(self) -> str:
        return f"<Registry {str(self.path)!r}{' closed' if self.closed else ''}>"

    # -- setup and transactions

    def _transaction(self, body: Callable[[sqlite3.Connection], _T], *, write: bool) -> _T:
        self._take_spool()
        with self._lock:
            conn = self._conn
            if conn is None:
                raise RegistryError(self.path, f"the registry {self.path} is closed")

            def attempt() -> _T:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return result

            try:
                return _retry_busy(attempt, time.monotonic() + self.timeout)
            except sqlite3.Error as exc:
                raise _map_error(self.path, exc, self.timeout) from exc

    def _take_spool(self) -> None:
        """Record the launches ``agentscope exec`` left in the spool (see :mod:`._spool_intake`),
        then the calls' events (:mod:`._callevents`)."""
        why = _spool.check_dir(self._spool)
        if why is not None:
            if not self._spool_warned:
                self._spool_warned = True
                logging.getLogger("agentscope").warning(
                    "the spool %s %s: its entries are not believed; remove it (or choose "
                    "a registry path in a directory of your own)",
                    self._spool,
                    why,
                )
            return
        paths = _spool.pending(self._spool)
        calls = _spool.pending(self._calls)  # after the launches: a call names its agent's unit
        # Taking an entry runs transactions, which land here again: skip then.
        if not (paths or calls) or not self._spool_lock.acquire(blocking=False):
            return
        try:
            for path in paths:
                _spool_intake.take_entry(self, path)
            if calls:
                _callevents.take_all(self, self._calls)
        finally:
            self._spool_lock.release()

    def _row_by_unit(self, conn: sqlite3.Connection, unit: str) -> AgentRecord:
        row = conn.execute(
            f"SELECT {_AGENT_COLUMNS} FROM agents WHERE unit = ?", (unit,)
        ).fetchone()
        if row is None:
            raise UnitNotFound(self.path, unit)
        return _agent_from_row(row)

    # -- writes

    def record_launch(
        self,
        fleet: str,
        name: str,
        unit: str,
        pid: int,
        start_time: int,
        argv: Sequence[str],
        cwd: str,
        state: AgentState = "starting",
        *,
        created: float | None = None,
        reap_after: float | None = DEFAULT_REAP_AFTER,
    ) -> AgentRecord:
        """Record a new launch and return its row.

        ``start_time`` is field 22 of ``/proc/PID/stat``; ``created`` defaults
        to now; ``reap_after`` is its leftovers' grace (None: kept).

        Raises:
            AgentExists: an open row already has this (fleet, name).
            RegistryError: the unit is already recorded (unit names are unique).
            ValueError: ``state`` is not an open state.
        """
        if state not in OPEN_STATES:
            raise ValueError(
                f"a launch starts in an open state {sorted(OPEN_STATES)}, not {state!r}"
            )
        argv_json = json.dumps(list(argv))
        when = time.time() if created is None else created

        def body(conn: sqlite3.Connection) -> AgentRecord:
            try:
                cur = conn.execute(
                    "INSERT INTO agents (fleet, name, unit, pid, start_time, argv, cwd, created,"
                    " state, reap_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        fleet,
                        name,
                        unit,
                        pid,
                        start_time,
                        argv_json,
                        cwd,
                        when,
                        state,
                        _reap_after_to_column(reap_after),
                    ),
                )
            except sqlite3.IntegrityError as exc:
                holder = _name_holder(conn, fleet, name)
                if holder is not None:
                    raise AgentExists(fleet, name, holder) from exc
                raise RegistryError(
                    self.path, f"unit {unit} is already recorded in {self.path}: {exc}"
                ) from exc
            row = conn.execute(
                f"SELECT {_AGENT_COLUMNS} FROM agents WHERE id = ?", (cur.lastrowid,)
            ).fetchone()
            return _agent_from_row(row)

        return self._transaction(body, write=True)

    def set_state(
        self,
        unit: str,
        state: AgentState,
        *,
        exit_status: int | None = None,
        exited: float | None = None,
        event: str | None = None,
        detail: Mapping[str, Any] | None = None,
        only_on_change: bool = False,
    ) -> AgentRecord:
        """Move the row of ``unit`` to ``state`` and return the row as stored.

        Setting the state the row already has changes nothing (the first
        close wins: its exit status and time stay). Closing (exited, failed,
        lost) stores ``exit_status`` and ``exited`` (default: now).
        ``event`` (with ``detail``) also records that event about the row's
        agent, in the same transaction: a launch or an exit is then one
        commit instead of two. With ``only_on_change`` the event is recorded
        only if this call moved the row: of several processes closing one
        row, one records it.

        Raises:
            InvalidTransition: the lifecycle forbids the move, e.g. a closed
                row asked to reopen or to close again with another state.
            UnitNotFound: no row has that unit.
            ValueError: unknown state, or exit figures given for an open state.
        """
        if state not in _STATES:
            raise ValueError(f"unknown state {state!r}; one of {sorted(_STATES)}")
        closing = state in CLOSED_STATES
        if not closing and (exit_status is not None or exited is not None):
            raise ValueError("exit_status and exited go only with a closed state")
        detail_json = json.dumps(dict(detail or {}), sort_keys=True)

        def body(conn: sqlite3.Connection) -> AgentRecord:
            rec = self._row_by_unit(conn, unit)
            changed = rec.state != state
            if changed:
                if state not in _TRANSITIONS[rec.state]:
                    raise InvalidTransition(
                        self.path, unit, rec.state, state, closed=rec.state in CLOSED_STATES
                    )
                if closing:
                    when = time.time() if exited is None else exited
                    conn.execute(
                        "UPDATE agents SET state = ?, exit_status = ?, exited = ? WHERE id = ?",
                        (state, exit_status, when, rec.id),
                    )
                else:
                    conn.execute("UPDATE agents SET state = ? WHERE id = ?", (state, rec.id))
                rec = self._row_by_unit(conn, unit)
            if event is not None and (changed or not only_on_change):
                _insert_event(conn, time.time(), rec.fleet, rec.name, event, detail_json)
            return rec

        return self._transaction(body, write=True)

    def update_memory(
        self, unit: str, memory_current: int | None, memory_peak: int | None
    ) -> AgentRecord:
        """Store the last memory figures (bytes) read for ``unit``; any state.

        ``memory_peak`` is None where the kernel has no ``memory.peak``.

        Raises:
            UnitNotFound: no row has that unit.
        """
        return self._update_unit(
            unit, "memory_current = ?, memory_peak = ?", (memory_current, memory_peak)
        )

    def add_oom_kills(self, unit: str, n: int) -> AgentRecord:
        """Add ``n`` OOM kills to the count of ``unit``; any state.

        Raises:
            UnitNotFound: no row has that unit.
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"OOM kills only add up; got {n}")
        return self._update_unit(unit, "oom_kills = oom_kills + ?", (n,))

    def _update_unit(self, unit: str, assignments: str, values: tuple[Any, ...]) -> AgentRecord:
        """``UPDATE agents SET assignments`` on the row of ``unit``; the row as stored.

        Raises:
            UnitNotFound: no row has that unit.
        """

        def body(conn: sqlite3.Connection) -> AgentRecord:
            cur = conn.execute(f"UPDATE agents SET {assignments} WHERE unit = ?", (*values, unit))
            if cur.rowcount == 0:
                raise UnitNotFound(self.path, unit)
            return self._row_by_unit(conn, unit)

        return self._transaction(body, write=True)

    def record_event(
        self,
        fleet: str,
        agent: str | None,
        kind: str,
        detail: Mapping[str, Any],
        *,
        ts: float | None = None,
    ) -> EventRecord:
        """Record an event; ``agent`` None for one about the whole fleet.

        Raises:
            TypeError: ``detail`` does not serialise to JSON.
        """
        detail_json = json.dumps(dict(detail), sort_keys=True)
        when = time.time() if ts is None else ts

        def body(conn: sqlite3.Connection) -> EventRecord:
            event_id = _insert_event(conn, when, fleet, agent, kind, detail_json)
            return EventRecord(event_id, when, fleet, agent, kind, json.loads(detail_json))

        record = self._transaction(body, write=True)
        self._history.after_write()
        return record

    def apply_closures(self, plan: ReconcilePlan, *, now: float | None = None) -> list[AgentRecord]:
        """Close the rows a :class:`ReconcilePlan` found dead, as ``lost``.

        One transaction. Each closure also records a ``lost`` event whose
        detail holds the reason (``scope-gone``, ``pid-reused``,
        ``process-gone``), unit, pid and start time. A row closed meanwhile
        by another writer keeps its state: it knew better (an exit status)
        than we do. Returns the rows this call closed.
        """
        when = time.time() if now is None else now

        def body(conn: sqlite3.Connection) -> list[AgentRecord]:
            done: list[AgentRecord] = []
            for rec, reason in plan.closures:
                cur = conn.execute(
                    "UPDATE agents SET state = 'lost', exited = ? WHERE id = ? AND state IN"
                    " ('starting', 'running', 'frozen', 'stopping')",
                    (when, rec.id),
                )
                if cur.rowcount == 0:
                    continue
                detail = {
                    "reason": reason,
                    "unit": rec.unit,
                    "pid": rec.pid,
                    "start_time": rec.start_time,
                }
                conn.execute(
                    "INSERT INTO events (ts, fleet, agent, kind, detail) VALUES (?, ?, ?, ?, ?)",
                    (when, rec.fleet, rec.name, "lost", json.dumps(detail, sort_keys=True)),
                )
                done.append(self._row_by_unit(conn, rec.unit))
            return done

        return self._transaction(body, write=True)

    def gc(
        self,
        retention_seconds: float = 7 * 86400,
        now: float | None = None,
        *,
        fleet: str | None = None,
        max_events: int | None = None,
    ) -> int:
        """Prune closed rows that closed more than ``retention_seconds`` ago.

        Their events go with them: an event belongs to the latest launch of
        its (fleet, agent) created at or before it, so once those rows are
        gone, the events older than the cutoff that no remaining launch
        claims are deleted (fleet-wide ones included). Open rows are never
        pruned. ``fleet`` limits all this to one fleet (None: every fleet);
        ``max_events`` also drops the oldest events past that many. Returns
        the number of agent rows deleted.

        The wall clock may have been behind when events were written (#31):
        an event goes only if every event recorded before it (by id: ids
        only grow) is older than the cutoff too, and a closed row only if
        no event of its agent is kept that way. An explicit ``gc`` counts
        from ``now`` (the clock of the caller, who asked for it); the
        registry's own prune (at open, and every ten minutes of writes)
        counts from the earlier of the clock and the newest time recorded
        before it, so one open under a clock far ahead (an RTC before NTP)
        deletes nothing the registry did not already hold as old.
        """
        retention_seconds = _numbers.real(
            "retention_seconds", retention_seconds, low=0, high=100 * 365.25 * 86400
        )
        if now is not None:
            now = _numbers.real("now", now, low=-1e12, high=1e12)
        return self._history.gc(retention_seconds, now, fleet=fleet, max_events=max_events)

    def delete(self, unit: str) -> None:
        """Delete the row of ``unit`` and its events, whatever its state.

        For undoing a launch that never started; closed rows are better left
        to :meth:`gc`.

        Raises:
            UnitNotFound: no row has that unit.
        """

        def body(conn: sqlite3.Connection) -> None:
            rec = self._row_by_unit(conn, unit)
            nxt = conn.execute(
                "SELECT min(created) FROM agents WHERE fleet = ? AND name = ? AND created > ?",
                (rec.fleet, rec.name, rec.created),
            ).fetchone()[0]
            conn.execute(
                "DELETE FROM events WHERE fleet = ? AND agent = ? AND ts >= ?"
                " AND (? IS NULL OR ts < ?)",
                (rec.fleet, rec.name, rec.created, nxt, nxt),
            )
            conn.execute("DELETE FROM agents WHERE id = ?", (rec.id,))

        self._transaction(body, write=True)

    # -- reads

    def agents(self, fleet: str | None, *, include_closed: bool = False) -> list[AgentRecord]:
        """The rows of ``fleet`` (None: every fleet), oldest first; open ones only by default."""
        sql = f"SELECT {_AGENT_COLUMNS} FROM agents WHERE 1"
        args: list[Any] = []
        if fleet is not None:
            sql += " AND fleet = ?"
            args.append(fleet)
        if not include_closed:
            sql += " AND state IN ('starting', 'running', 'frozen', 'stopping')"
        sql += " ORDER BY created, id"
        rows = self._transaction(lambda c: c.execute(sql, args).fetchall(), write=False)
        return [_agent_from_row(r) for r in rows]

    def get(self, fleet: str, name: str) -> AgentRecord | None:
        """The latest row for ``name`` in ``fleet``, open or closed; None if none."""
        row = self._transaction(
            lambda c: c.execute(
                f"SELECT {_AGENT_COLUMNS} FROM agents WHERE fleet = ? AND name = ?"
                " ORDER BY created DESC, id DESC LIMIT 1",
                (fleet, name),
            ).fetchone(),
            write=False,
        )
        return None if row is None else _agent_from_row(row)

    def by_unit(self, unit: str) -> AgentRecord | None:
        """The row of ``unit``; None if none."""
        row = self._transaction(
            lambda c: c.execute(
                f"SELECT {_AGENT_COLUMNS} FROM agents WHERE unit = ?", (unit,)
            ).fetchone(),
            write=False,
        )
        return None if row is None else _agent_from_row(row)

    def events(self, fleet: str | None = None, **filters: Unpack[EventFilter]) -> list[EventRecord]:
        """Events in the order recorded (by id), filtered as :class:`EventFilter` says.

        ``events --follow`` polls with the last id it saw (``after_id``).
        Every filter runs in SQL: the cost is the rows returned, not the
        history's size.

        Raises:
            TypeError: a filter that is not one of :class:`EventFilter`'s.
            InvalidConfig: a bound out of range (not finite, negative, past 2^63).
        """
        unknown = filters.keys() - EventFilter.__optional_keys__
        if unknown:  # what Python says of an unexpected keyword
            raise TypeError(f"events() got an unexpected keyword argument {min(unknown)!r}")

        def count(name: str, value: int | None) -> int | None:
            # SQLite's integers are 64-bit: a larger bound overflowed in sqlite3.
            return None if value is None else _numbers.whole(name, value, low=0, high=2**63 - 1)

        def when(name: str, value: float | None) -> float | None:
            return None if value is None else _numbers.real(name, value, low=-1e12, high=1e12)

        agent, kind = filters.get("agent"), filters.get("kind")
        since, until = when("since", filters.get("since")), when("until", filters.get("until"))
        after_id = count("after_id", filters.get("after_id"))
        limit, last = count("limit", filters.get("limit")), count("last", filters.get("last"))
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE 1"
        args: list[Any] = []
        for clause, value in (
            (" AND fleet = ?", fleet),
            (" AND agent = ?", agent),
            (" AND ts >= ?", since),
            (" AND ts < ?", until),
            (" AND kind = ?", kind),
            (" AND id > ?", after_id),
        ):
            if value is not None:
                sql += clause
                args.append(value)
        if last is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT ?) ORDER BY id"
            args.append(last)
        else:
            sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = self._transaction(lambda c: c.execute(sql, args).fetchall(), write=False)
        return [_event_from_row(r) for r in rows]
