"""The registry's part of an agent's life after its launch: lingering, reaping, reopening.

:class:`LifecycleStore` is a part of :class:`._registry.Registry` (a mixin).
Each method is one transaction with its event, recorded only by the call
that made the move: of several processes that see the same scope at once,
one notes the agent lingering, one claims its reaping, one reopens its row.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .._errors import AgentExists
from ._records import AgentRecord, _insert_event, _name_holder

__all__ = ["LifecycleStore"]

_T = TypeVar("_T")


class LifecycleStore:
    """The lifecycle half of Registry; what it uses of the registry is declared here."""

    if TYPE_CHECKING:

        def _transaction(self, body: Callable[[sqlite3.Connection], _T], *, write: bool) -> _T: ...
        def _row_by_unit(self, conn: sqlite3.Connection, unit: str) -> AgentRecord: ...

    def reopen(
        self, unit: str, pid: int, start_time: int, *, detail: Mapping[str, Any] | None = None
    ) -> AgentRecord:
        """Reopen the closed row of ``unit`` as running: its scope runs after all.

        The one way out of a closed state (:meth:`set_state` refuses it),
        for a reconciliation that finds the scope of a closed row active with
        ``pid`` (started at ``start_time``) in it. Its exit figures are
        cleared. One transaction with a ``reopened`` event (``unit``, ``pid``,
        ``was``: the closed state, and ``detail``), recorded only if this call
        reopened the row: of several openers, one does. A row open already
        is returned as it is.

        Raises:
            AgentExists: another open row holds the agent's name.
            UnitNotFound: no row has that unit.
        """
        extra = dict(detail or {})

        def body(conn: sqlite3.Connection) -> AgentRecord:
            rec = self._row_by_unit(conn, unit)
            if not rec.closed:
                return rec
            try:
                conn.execute(
                    "UPDATE agents SET state = 'running', pid = ?, start_time = ?,"
                    " exit_status = NULL, exited = NULL WHERE id = ?",
                    (pid, start_time, rec.id),
                )
            except sqlite3.IntegrityError as exc:  # the partial unique index: the name
                holder = _name_holder(conn, rec.fleet, rec.name) or unit
                raise AgentExists(rec.fleet, rec.name, holder) from exc
            about = {**extra, "unit": unit, "pid": pid, "was": rec.state}
            _insert_event(
                conn,
                time.time(),
                rec.fleet,
                rec.name,
                "reopened",
                json.dumps(about, sort_keys=True),
            )
            return self._row_by_unit(conn, unit)

        return self._transaction(body, write=True)

    def note_lingering(
        self, unit: str, exit_status: int | None, *, detail: Mapping[str, Any]
    ) -> AgentRecord:
        """Record that the main process of ``unit`` ended while its scope holds processes.

        The row stays open (its scope runs) with ``lingering`` set to now and
        the main process's ``exit_status``, and a ``lingering`` event with
        ``detail`` is recorded, once: a row already lingering is returned as
        it is.

        Raises:
            UnitNotFound: no row has that unit.
        """
        detail_json = json.dumps(dict(detail), sort_keys=True)

        def body(conn: sqlite3.Connection) -> AgentRecord:
            rec = self._row_by_unit(conn, unit)
            if rec.closed or rec.lingering is not None:
                return rec
            now = time.time()
            conn.execute(
                "UPDATE agents SET lingering = ?, exit_status = ? WHERE id = ?",
                (now, exit_status, rec.id),
            )
            _insert_event(conn, now, rec.fleet, rec.name, "lingering", detail_json)
            return self._row_by_unit(conn, unit)

        return self._transaction(body, write=True)

    def claim_reap(self, unit: str, *, detail: Mapping[str, Any]) -> bool:
        """Claim the reaping of a lingering ``unit``: True for one caller only.

        Moves its open row to ``stopping`` and records the ``reaped`` event
        (``detail``: what is reaped) in one transaction, so that of the
        processes that see the leftovers at once (a fleet's exit watch, a
        monitor, another process's open) exactly one reaps and reports.

        Raises:
            UnitNotFound: no row has that unit.
        """
        detail_json = json.dumps(dict(detail), sort_keys=True)

        def body(conn: sqlite3.Connection) -> bool:
            rec = self._row_by_unit(conn, unit)
            if rec.closed or rec.state == "stopping" or rec.lingering is None:
                return False
            conn.execute("UPDATE agents SET state = 'stopping' WHERE id = ?", (rec.id,))
            _insert_event(conn, time.time(), rec.fleet, rec.name, "reaped", detail_json)
            return True

        return self._transaction(body, write=True)
