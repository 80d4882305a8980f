"""The fleet's registry glue: registry calls off the event loop, and row closing.

:class:`RegistryGlue` is a part of :class:`._fleet.AsyncFleet` (a mixin):
every :class:`._registry.Registry` call runs in a worker thread
(:meth:`_db`), events are recorded with the fleet's name, and a row whose
scope is gone is closed as ``exited`` (seen here) or ``lost``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _claim, _numbers
from ._errors import InvalidTransition
from ._registry import AgentRecord, EventRecord, Registry

if TYPE_CHECKING:
    from ._agent import Agent

__all__ = ["RegistryGlue"]

T = TypeVar("T")
P = ParamSpec("P")


class RegistryGlue:
    """The registry half of AsyncFleet; what it uses of the fleet is declared here."""

    if TYPE_CHECKING:
        name: str
        _agents: dict[str, Agent]
        _registry: Registry | None
        _terminals: dict[str, str]

        def _check_open(self) -> None: ...

    async def _db(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one registry call off the event loop."""
        assert self._registry is not None, "fleet not open"
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _event(self, agent: str | None, kind: str, **detail: Any) -> None:
        assert self._registry is not None
        await self._db(self._registry.record_event, self.name, agent, kind, detail)

    def _mark_running(self, unit: str, **event: dict[str, Any]) -> None:
        """Row to running, and the event that says why: one transaction."""
        assert self._registry is not None
        ((kind, detail),) = event.items()
        self._registry.set_state(unit, "running", event=kind, detail={"unit": unit, **detail})

    async def events(
        self,
        *,
        agent: str | None = None,
        since: float | None = None,
        until: float | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[EventRecord]:
        """The fleet's recorded events, oldest first (``after_id`` for following,
        ``last`` for the newest few); see :meth:`Registry.events`."""
        self._check_open()
        assert self._registry is not None
        return await self._db(
            self._registry.events,
            self.name,
            agent=agent,
            since=since,
            until=until,
            kind=kind,
            after_id=after_id,
            limit=limit,
            last=last,
        )

    async def gc(self, retention_seconds: float = 7 * 86400) -> int:
        """Prune this fleet's exited agents older than the retention, and their events."""
        retention_seconds = _numbers.real(
            "retention_seconds", retention_seconds, low=0, high=100 * 365.25 * 86400
        )
        self._check_open()
        assert self._registry is not None
        return await self._db(self._registry.gc, retention_seconds, fleet=self.name)

    async def _close_gone(self, rec: AgentRecord) -> AgentRecord:
        """Close the row of an agent whose scope is gone: exited if seen, else lost."""
        return await self._db(self._close_row, rec)

    def _close_row(self, rec: AgentRecord) -> AgentRecord:
        """:meth:`_close_gone` in a worker thread, and the fleet's close of a stale
        holder of a name (``_claim.Close``); every move records its event once."""
        registry = self._registry
        assert registry is not None
        try:
            if rec.unit in self._terminals:  # it ended in (or with) its tmux window
                detail = {"unit": rec.unit, "pid": rec.pid, "status": None}
                return registry.set_state(
                    rec.unit, "exited", event="exited", detail=detail, only_on_change=True
                )
            agent = self._agents.get(rec.name)
            if agent is not None and agent.unit == rec.unit and agent.popen is not None:
                status = agent.popen.poll()
                if status is not None:
                    agent.state = "exited"
                    return registry.set_state(rec.unit, "exited", exit_status=status)
            if rec.lingering is not None:  # its main process was seen ending: its status is known
                detail = {"unit": rec.unit, "pid": rec.pid, "status": rec.exit_status}
                return registry.set_state(
                    rec.unit,
                    "exited",
                    exit_status=rec.exit_status,
                    event="exited",
                    detail=detail,
                    only_on_change=True,
                )
            return _claim.close_lost(registry, rec)
        except InvalidTransition:  # closed meanwhile, otherwise: that close stands
            return registry.by_unit(rec.unit) or rec
