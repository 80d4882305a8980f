"""The fleet's monitor part: naming its agents' units, its monitors, reports.

:class:`MonitorGlue` is a part of :class:`._fleet.AsyncFleet` (a mixin):
``unit_agent`` (whose agent a unit is, for the monitor's and the report's
attribution), ``monitor()`` with its guard, escape reclaim, OOM recovery and
leftover sweep wired in, admission control, ``report()``, and recording the
monitor's events in the registry.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _numbers, _tmux
from ._contract import event_parts
from ._errors import RegistryError
from ._events import AgentExited, OomKill
from ._events import Event as MonitorEvent
from ._events import Pressure as MonitorPressure
from ._guard import admit
from ._guardpolicy import GuardConfig, GuardKill
from ._monitor import Monitor
from ._recovery import Baseline
from ._report import MemoryReport, build_report

if TYPE_CHECKING:
    from ._fleet_recovery import OomRecovery
    from ._fleet_registry import FleetRegistry, Roster
    from ._fleet_tmux import Terminals
    from ._manager import ScopeManager
    from ._reaper import Reaper

__all__ = ["MonitorGlue"]

log = logging.getLogger("agentscope")

T = TypeVar("T")
P = ParamSpec("P")


class MonitorGlue:
    """The monitoring half of AsyncFleet; what it uses of the fleet is declared here."""

    if TYPE_CHECKING:
        _roster: Roster
        _store: FleetRegistry
        _reaper: Reaper
        name: str
        manager: str
        admission_wait: float
        _manager: ScopeManager
        _closed: bool
        _monitors: Any
        _tasks: set[asyncio.Task[Any]]
        _terminals: Terminals
        _recovery: OomRecovery

        def _check_open(self) -> None: ...
        async def slice_cgroup(self) -> Path: ...

    def unit_agent(self, unit: str) -> str | None:
        """The name of this fleet's agent in ``unit``, None if it is not one (thread-safe)."""
        known = self._roster.unit_names.get(unit)
        if known is not None:
            return known
        if unit in self._roster.foreign or not unit.startswith(f"agentscope-{self.name}-"):
            return None
        # The unit name cannot say (fleet a-b's agent c and fleet a's agent
        # b-c share it): the registry's row, or the scope's Description in a
        # listing (_live), says whose agent it is.
        registry = self._store.registry
        if registry is None:
            return None
        try:
            rec = registry.by_unit(unit)
        except RegistryError:
            return None
        if rec is None:
            return None  # not recorded (yet): no claim
        if rec.fleet != self.name:
            self._roster.foreign.add(unit)
            return None
        self._roster.unit_names[unit] = rec.name
        return rec.name

    def monitor(
        self,
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: bool | GuardConfig = False,
        reclaim_escaped: bool = False,
        **options: Any,
    ) -> Monitor:
        """A memory monitor for this fleet: ``async with fleet.monitor() as m: async for e in m``.

        Events (OOM kills, throttling, pressure, exits, limits found, guard
        kills) are also recorded in the registry. ``guard`` (True or a
        :class:`GuardConfig`) runs the memory guard with the monitor
        (docs/guard.md); it never kills this process or the fleet's tmux
        server, and while it sees the host short, :meth:`launch` and
        :meth:`adopt` wait ``admission_wait`` seconds, then raise
        :class:`HostUnderPressure`. An agent's descendant that lives outside
        its scope is reported once as an ``escaped`` event; with
        ``reclaim_escaped`` the monitor first moves it back into the agent's
        scope (``AttachProcessesToUnit``) and the event says whether that
        worked (docs/escapes.md). ``options`` go to :class:`Monitor`.
        """
        self._check_open()
        # The slice may not exist yet (no agent so far): watch where it will be.
        slice_path = self._manager.expected_slice_cgroup()
        theirs = options.pop("on_event", None)
        if guard is not False:
            options.setdefault("guard_protect", self._guard_protected)
        if reclaim_escaped:
            options.setdefault("reclaim_escaped", self._attach)

        def on_event(event: MonitorEvent) -> None:
            self._on_monitor_event(event, mon)
            if theirs is not None:
                theirs(event)

        async def recover(baseline: Baseline) -> list[OomKill]:
            return await self._recovery.on_monitor_start(mon, baseline)

        mon = Monitor(
            slice_path=slice_path,
            unit_agent=self.unit_agent,
            on_tick=self._reaper.tick,
            interval=interval,
            top=top,
            manager=self.manager,
            on_event=on_event,
            guard=guard,
            recover=recover,
            **options,
        )
        self._monitors.add(mon)
        return mon

    async def _attach(self, unit: str, pids: Sequence[int]) -> None:
        """Move ``pids`` into ``unit``'s cgroup (systemd 238+; BusError when refused)."""
        await self._manager.attach(unit, pids)

    def _guard_protected(self) -> tuple[frozenset[int], frozenset[str]]:
        """What a guard must never kill: this process and the fleet's tmux server (any thread)."""
        pids = {os.getpid()}
        tmux_pid = self._terminals.server.known_pid
        if tmux_pid is not None:
            pids.add(tmux_pid)
        return frozenset(pids), frozenset({_tmux.tmux_unit(self.name)})

    async def _admit(self) -> None:
        """Admission control: wait for (or refuse on) pressure this fleet's guards see."""
        guards = [m.guard for m in list(self._monitors) if m.guard is not None]
        if guards:
            await admit(guards, self.admission_wait)

    async def report(self, top: int = 10) -> MemoryReport:
        """A memory report now: host, PSI, every agent, the top processes with their agent."""
        top = _numbers.whole("top", top, low=0, high=10_000)
        self._check_open()
        return await build_report(
            await self.slice_cgroup(),
            self.unit_agent,
            top=top,
            cgroup_root=self._manager.cgroup_root,
        )

    def _on_monitor_event(self, event: MonitorEvent, mon: Monitor) -> None:
        if isinstance(event, OomKill) and not event.recovered:
            self._recovery.note_live_kill(event)
        task = asyncio.get_running_loop().create_task(self._record_monitor_event(event, mon))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record_monitor_event(self, event: MonitorEvent, mon: Monitor | None = None) -> None:
        if self._store.registry is None:
            return
        agent, kind, ts, detail = event_parts(event)
        try:
            if isinstance(event, OomKill):
                if not event.recovered:  # a recovered kill was recorded as it was found
                    await self._recovery.store_live_kill(mon, event, agent, detail, ts)
                return
            if isinstance(event, GuardKill) and agent is None:
                # Another fleet's agent (the slice is shared): that fleet's
                # guard tells it, named, and that fleet records it (docs/guard.md).
                return
            if not isinstance(event, AgentExited):  # exits are recorded by the fleet
                if isinstance(event, MonitorPressure):
                    detail.pop("report", None)  # a whole report per event would bloat the file
                # Dated as the monitor dated it: events --json and monitor --json
                # print the same event alike (agentscope.event).
                await self._store.call(
                    self._store.registry.record_event, self.name, agent, kind, detail, ts=ts
                )
        except RegistryError as exc:
            log.warning("could not record %s: %s", event.kind, exc)
