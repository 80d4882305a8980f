"""The registry's history kept bounded: ``gc``, and the prune nobody has to run.

:class:`History` is a part :class:`._registry.Registry` holds: it owns the
retention and when it last pruned, and runs its deletes through the
registry's transactions. ``gc`` prunes when asked; the registry prunes
itself at open and at most every ten minutes of writes, so a history no
one collects still stays bounded (by age and by :data:`MAX_EVENTS`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

from .._errors import RegistryError

__all__ = ["MAX_EVENTS", "History"]

_T = TypeVar("_T")

MAX_EVENTS: Final = 200_000
"""Events the registry keeps at most (the oldest go first), whatever their age."""
_PRUNE_EVERY: Final = 600.0  # seconds between two automatic prunes of one opener


class Transaction(Protocol):
    """The registry's one way to its database: ``body`` in one transaction."""

    def __call__(self, body: Callable[[sqlite3.Connection], _T], *, write: bool) -> _T: ...


class History:
    """The part of a registry that prunes closed rows and old events."""

    def __init__(self, transaction: Transaction, retention_seconds: float) -> None:
        self._transaction = transaction
        #: How old a closed row or an event may grow before a prune takes it (0: kept).
        self.retention_seconds = retention_seconds
        self._pruned = -_PRUNE_EVERY

    def after_write(self) -> None:
        """Prune if the last prune of this opener is ten minutes old."""
        if time.monotonic() - self._pruned >= _PRUNE_EVERY:
            self.prune()

    def prune(self) -> None:
        """Keep the history bounded without anyone running ``gc``: at open, and
        at most every ten minutes of writes. Best effort: a registry busy with
        other writers is pruned next time."""
        self._pruned = time.monotonic()
        if self.retention_seconds <= 0:
            return
        cutoff = time.time() - self.retention_seconds

        def due(conn: sqlite3.Connection) -> bool:
            # Read first: most opens have nothing to prune and must not queue
            # behind another writer for the write lock.
            low, high, oldest = conn.execute(
                "SELECT min(id), max(id), min(ts) FROM events"
            ).fetchone()
            closed = conn.execute(
                "SELECT 1 FROM agents WHERE state IN ('exited', 'failed', 'lost')"
                " AND coalesce(exited, created) < ? LIMIT 1",
                (cutoff,),
            ).fetchone()
            return bool(closed) or (
                oldest is not None and (oldest < cutoff or high - low >= MAX_EVENTS)
            )

        try:
            if self._transaction(due, write=False):
                self.gc(self.retention_seconds, None, max_events=MAX_EVENTS, anchored=True)
        except RegistryError as exc:
            logging.getLogger("agentscope").debug("registry not pruned: %s", exc)

    def gc(
        self,
        retention_seconds: float,
        now: float | None,
        *,
        fleet: str | None = None,
        max_events: int | None = None,
        anchored: bool = False,
    ) -> int:
        """See :meth:`._registry.Registry.gc`; ``anchored``: the registry's own prune."""
        clock = time.time() if now is None else now
        scope, args = ("", ()) if fleet is None else (" AND fleet = ?", (fleet,))

        def body(conn: sqlite3.Connection) -> int:
            newest = None
            if anchored:
                newest = conn.execute(
                    "SELECT max(t) FROM (SELECT max(ts) AS t FROM events"
                    " UNION ALL SELECT max(coalesce(exited, created)) FROM agents)"
                ).fetchone()[0]
            cutoff = min(clock, clock if newest is None else newest) - retention_seconds
            # The first event (by id) at or after the cutoff: it and every later
            # one are kept, whatever their own ts says.
            keep_from = conn.execute(
                "SELECT coalesce((SELECT min(id) FROM events WHERE ts >= ?),"
                " (SELECT coalesce(max(id), 0) + 1 FROM events))",
                (cutoff,),
            ).fetchone()[0]
            cur = conn.execute(
                "DELETE FROM agents WHERE state IN ('exited', 'failed', 'lost')"
                f" AND coalesce(exited, created) < ?{scope} AND NOT EXISTS ("
                " SELECT 1 FROM events e WHERE e.fleet = agents.fleet"
                " AND e.agent = agents.name AND e.id >= ?)",
                (cutoff, *args, keep_from),
            )
            conn.execute(
                f"DELETE FROM events WHERE ts < ? AND id < ?{scope} AND NOT EXISTS ("
                " SELECT 1 FROM agents a WHERE a.fleet = events.fleet"
                " AND a.name = events.agent AND a.created <= events.ts)",
                (cutoff, keep_from, *args),
            )
            if max_events is not None:
                # ids only grow (AUTOINCREMENT): the span is a cheap upper
                # bound of the count, checked before any scan.
                low, high = conn.execute("SELECT min(id), max(id) FROM events").fetchone()
                if low is not None and high - low >= max_events:
                    conn.execute(
                        "DELETE FROM events WHERE id <= (SELECT id FROM events"
                        " ORDER BY id DESC LIMIT 1 OFFSET ?)",
                        (max_events,),
                    )
            return cur.rowcount

        return self._transaction(body, write=True)
