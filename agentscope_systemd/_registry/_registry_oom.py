"""The registry's part of OOM kills: live kills with what they account for, recovered ones.

:class:`OomStore` is a part of :class:`._registry.Registry` (a mixin). Each
method is one transaction: a live kill's event, its row's counts and the
fleet's watermark together (:meth:`OomStore.record_oom_kill`); the kills
missed while no monitor ran planned and stored together
(:meth:`OomStore.recover_oom_kills`), so two openers never record one twice.
The plan itself is pure (:mod:`._recovery`); the watermark is its JSON.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ._records import EventRecord, _insert_event, _json_or, _unreadable

__all__ = ["OomPlanner", "OomRecording", "OomStore"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class OomRecording:
    """What :meth:`OomStore.recover_oom_kills` stores: kill events (agent, detail),
    rows' new ``oom_kill_seen`` by unit, the fleet's new watermark (JSON)."""

    events: Sequence[tuple[str | None, Mapping[str, Any]]]
    seen: Mapping[str, int]
    mark: str


OomPlanner = Callable[
    [str | None, Mapping[str, tuple[str, int]], Mapping[str, frozenset[int]]], OomRecording
]
"""(stored watermark, rows by unit: (name, oom_kill_seen), recorded pids by unit) -> to store."""


def _mark(conn: sqlite3.Connection, fleet: str) -> str | None:
    row = conn.execute("SELECT mark FROM oom_marks WHERE fleet = ?", (fleet,)).fetchone()
    return None if row is None else str(row[0])


def _store_mark(conn: sqlite3.Connection, fleet: str, mark: str) -> None:
    conn.execute(
        "INSERT INTO oom_marks (fleet, mark) VALUES (?, ?)"
        " ON CONFLICT (fleet) DO UPDATE SET mark = excluded.mark",
        (fleet, mark),
    )


@dataclass(frozen=True, slots=True)
class _Kill:
    """One OOM kill to store: of ``fleet``'s ``agent`` (None: not told), at ``when``.

    The one value the steps of a store pass on (is it recorded already,
    did a recovery take it, record it): each used to take the four apart.
    """

    fleet: str
    agent: str | None
    detail: Mapping[str, Any]
    when: float

    def record(self, conn: sqlite3.Connection) -> EventRecord:
        """Its ``oom_kill`` event, recorded now."""
        detail_json = json.dumps(dict(self.detail), sort_keys=True)
        event_id = _insert_event(conn, self.when, self.fleet, self.agent, "oom_kill", detail_json)
        return self.event(event_id, self.when, json.loads(detail_json))

    def take_over(self, conn: sqlite3.Connection, event_id: int) -> EventRecord:
        """A recovered record brought up to this live report of its kill (time, agent, detail)."""
        new = dict(self.detail)
        conn.execute(
            "UPDATE events SET ts = ?, agent = ?, detail = ? WHERE id = ?",
            (self.when, self.agent, json.dumps(new, sort_keys=True), event_id),
        )
        return self.event(event_id, self.when, new)

    def event(self, event_id: int, ts: float, detail: Mapping[str, Any]) -> EventRecord:
        """The ``oom_kill`` event ``event_id`` as it is stored, under this kill's agent."""
        return EventRecord(event_id, ts, self.fleet, self.agent, "oom_kill", detail)


#: How many of a fleet's latest kill events a live kill is matched against.
_MATCH_WINDOW = 200


def _recorded_already(
    conn: sqlite3.Connection, kill: _Kill, seen: int | None
) -> EventRecord | None:
    """The event that already records this live kill, brought up to the live detail; or None.

    Another process may get there first: a fleet opened (a CLI call) between
    the kernel's kill and this monitor's store recovers it, and a second
    monitor of the fleet sees it too. Such a kill is known by its pid in its
    unit, or, unnamed, by its scope's counter: the row already accounts for
    ``seen`` kills. A recovered record of it takes the live detail (pid,
    comm, RSS, the monitor's time), so one row tells the most that is known.
    """
    fleet = kill.fleet
    unit, pid = kill.detail.get("unit"), kill.detail.get("pid")
    if not isinstance(unit, str):
        return None  # counted in the slice alone: the watermark keeps those apart
    same_unit: list[tuple[int, float, dict[str, Any]]] = []
    for event_id, ts, raw in conn.execute(
        "SELECT id, ts, detail FROM events WHERE fleet = ? AND kind = 'oom_kill'"
        " ORDER BY id DESC LIMIT ?",
        (fleet, _MATCH_WINDOW),
    ):
        old = _json_or(raw, _unreadable, dict)
        if old.get("unit") == unit:
            same_unit.append((event_id, ts, old))
    if isinstance(pid, int):
        for event_id, ts, old in same_unit:
            if old.get("pid") == pid:
                return kill.event(event_id, ts, old)
    if seen is None:
        return None
    row = conn.execute(
        "SELECT oom_kill_seen FROM agents WHERE unit = ? AND fleet = ?", (unit, fleet)
    ).fetchone()
    if row is None or row[0] < seen:
        return None  # a new kill
    if not same_unit:
        return None  # its record pruned with the old history: record it
    # Counted already. The newest recovered record that names no process is the
    # one that raced this store: it takes the live detail. Otherwise another
    # monitor recorded the kill.
    for event_id, _, old in same_unit:
        if old.get("recovered") is True and old.get("pid") is None:
            return kill.take_over(conn, event_id)
    event_id, ts, old = same_unit[0]
    return kill.event(event_id, ts, old)


#: How far apart (seconds) a live kill and another process's recovery of it can be.
_RACE_WINDOW = 120.0


def _recovered_from_the_slice(conn: sqlite3.Connection, kill: _Kill) -> EventRecord | None:
    """The recovered record of this live kill that the slice's counter alone made,
    brought up to the live detail; or None.

    Called when the stored watermark's slice counter already covers the live
    kill: another process (a CLI call's open) recovered it after its scope was
    gone, so its record names no unit and no process. The newest such record
    near the kill's time is that one.
    """
    for event_id, raw in conn.execute(
        "SELECT id, detail FROM events WHERE fleet = ? AND kind = 'oom_kill' AND ts >= ?"
        " ORDER BY id DESC LIMIT ?",
        (kill.fleet, kill.when - _RACE_WINDOW, _MATCH_WINDOW),
    ):
        old = _json_or(raw, _unreadable, dict)
        if old.get("recovered") is True and old.get("unit") is None and old.get("pid") is None:
            return kill.take_over(conn, event_id)
    return None


class OomStore:
    """The OOM half of Registry; what it uses of the registry is declared here."""

    if TYPE_CHECKING:

        def _transaction(self, body: Callable[[sqlite3.Connection], _T], *, write: bool) -> _T: ...

    def oom_mark(self, fleet: str) -> str | None:
        """The fleet's stored OOM watermark (JSON, :class:`._recovery.Watermark`); None yet."""
        return self._transaction(lambda c: _mark(c, fleet), write=False)

    def record_oom_kill(
        self,
        fleet: str,
        agent: str | None,
        detail: Mapping[str, Any],
        *,
        seen: int | None = None,
        merge: Callable[[str | None], str] | None = None,
        covered: Callable[[str | None], bool] | None = None,
        ts: float | None = None,
    ) -> EventRecord:
        """Record one OOM kill the monitor saw, in one transaction with what it accounts for.

        Dated ``ts`` (the monitor's time of the kill), or now.

        The ``oom_kill`` event; the agent row of ``detail["unit"]`` in this
        fleet counts one kill more (when ``agent`` is known) and its
        ``oom_kill_seen`` is raised to ``seen``; ``merge`` turns the stored
        watermark into the one to store (never lower: ``_recovery.merge_marks``).
        ``covered`` tells from the stored watermark whether another process
        has counted this kill in the slice already (then its record is this one).
        """
        unit = detail.get("unit")
        kill = _Kill(fleet, agent, detail, time.time() if ts is None else ts)

        def body(conn: sqlite3.Connection) -> EventRecord:
            stored = _mark(conn, fleet)
            known = _recorded_already(conn, kill, seen)
            # A recovery that had the slice's counter alone named no agent: its
            # record takes the live detail and the row counts the kill now.
            taken = None
            if known is None and covered is not None and covered(stored):
                taken = _recovered_from_the_slice(conn, kill)
            record = known or taken or kill.record(conn)
            if isinstance(unit, str):
                conn.execute(
                    "UPDATE agents SET oom_kills = oom_kills + ?,"
                    " oom_kill_seen = max(oom_kill_seen, ?) WHERE unit = ? AND fleet = ?",
                    (0 if agent is None or known else 1, seen or 0, unit, fleet),
                )
            if merge is not None:
                _store_mark(conn, fleet, merge(stored))
            return record

        return self._transaction(body, write=True)

    def recover_oom_kills(
        self, fleet: str, units: Iterable[str], plan: OomPlanner
    ) -> list[EventRecord]:
        """Plan and record the OOM kills missed while no monitor ran: one transaction.

        ``plan`` gets the stored watermark, the fleet's rows and the pids of
        the kills already recorded in ``units``; what it returns is stored
        before the transaction ends.
        """
        wanted = frozenset(units)

        def body(conn: sqlite3.Connection) -> list[EventRecord]:
            rows = {
                unit: (name, seen)
                for unit, name, seen in conn.execute(
                    "SELECT unit, name, oom_kill_seen FROM agents WHERE fleet = ?", (fleet,)
                )
            }
            recorded: dict[str, set[int]] = {}
            if wanted:
                for (raw,) in conn.execute(
                    "SELECT detail FROM events WHERE fleet = ? AND kind = 'oom_kill'", (fleet,)
                ):
                    detail = _json_or(raw, _unreadable, dict)
                    unit, pid = detail.get("unit"), detail.get("pid")
                    if unit in wanted and isinstance(pid, int):
                        recorded.setdefault(unit, set()).add(pid)
            result = plan(_mark(conn, fleet), rows, {u: frozenset(p) for u, p in recorded.items()})
            when = time.time()
            done = []
            for agent, detail in result.events:
                done.append(_Kill(fleet, agent, detail, when).record(conn))
                unit = detail.get("unit")
                if agent is not None and isinstance(unit, str):
                    conn.execute(
                        "UPDATE agents SET oom_kills = oom_kills + 1 WHERE unit = ? AND fleet = ?",
                        (unit, fleet),
                    )
            for unit, seen in result.seen.items():
                conn.execute(
                    "UPDATE agents SET oom_kill_seen = max(oom_kill_seen, ?)"
                    " WHERE unit = ? AND fleet = ?",
                    (seen, unit, fleet),
                )
            _store_mark(conn, fleet, result.mark)
            return done

        return self._transaction(body, write=True)
