"""The fleet's monitors: each monitor it makes, their events recorded, reports.

:class:`Monitors` is a part :class:`._fleet.AsyncFleet` holds:
``monitor()`` with its guard, escape reclaim, OOM recovery and leftover
sweep wired in, admission control, ``report()``, and recording the
monitor's events in the registry. Whose agent a unit is
(``unit_agent``) is the registry adapter's (:mod:`._fleet_registry`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import RegistryError
from . import _tmux
from ._fleet_registry import FleetPart

# The monitor, the guard, the report and the monitor's events are imported
# where they are used: a fleet opened to list its agents (``agentscope ls``)
# never runs them, and their modules cost a CLI call much of its start-up
# (issue 28, docs/benchmarks.md).
if TYPE_CHECKING:
    from .._events import Event as MonitorEvent
    from .._events import OomKill
    from .._guard._guardpolicy import GuardConfig
    from .._monitor._monitor import Monitor
    from .._monitor._recovery import Baseline
    from .._monitor._report import MemoryReport
    from ._fleet_recovery import OomRecovery
    from ._fleet_tmux import Terminals
    from ._reaper import Reaper

__all__ = ["Monitors"]

log = logging.getLogger("agentscope")


@dataclass(eq=False, repr=False)
class Monitors(FleetPart):
    """The fleet's monitors: made with the fleet's parts wired in, their events recorded.

    Held by the fleet: :meth:`monitor` makes one (``AsyncFleet.monitor``),
    :meth:`admit` is a launch's admission control, :meth:`note_exit` tells
    every monitor of an exit the fleet saw, :meth:`report` is
    ``AsyncFleet.report``.
    """

    _recovery: OomRecovery
    _reaper: Reaper
    _terminals: Terminals
    _monitors: weakref.WeakSet[Monitor] = field(init=False, default_factory=weakref.WeakSet)

    def monitor(
        self,
        interval: float,
        top: int,
        guard: bool | GuardConfig,
        reclaim_escaped: bool,
        options: dict[str, Any],
    ) -> Monitor:
        """See :meth:`.AsyncFleet.monitor` (the fleet is open; its defaults are there)."""
        # The slice may not exist yet (no agent so far): watch where it will be.
        slice_path = self._manager.expected_slice_cgroup()
        theirs = options.pop("on_event", None)
        if guard is not False:
            options.setdefault("guard_protect", self.guard_protected)
        if reclaim_escaped:
            options.setdefault("reclaim_escaped", self._manager.attach)

        def on_event(event: MonitorEvent) -> None:
            self._on_event(event, mon)
            if theirs is not None:
                theirs(event)

        async def recover(baseline: Baseline) -> list[OomKill]:
            return await self._recovery.on_monitor_start(mon, baseline)

        from .._monitor._monitor import Monitor

        mon = Monitor(
            slice_path=slice_path,
            unit_agent=self._store.unit_agent,
            on_tick=self._reaper.tick,
            interval=interval,
            top=top,
            manager=self._manager.manager,
            on_event=on_event,
            guard=guard,
            recover=recover,
            **options,
        )
        self._monitors.add(mon)
        return mon

    def guard_protected(self) -> tuple[frozenset[int], frozenset[str]]:
        """What a guard must never kill: this process and the fleet's tmux server (any thread)."""
        pids = {os.getpid()}
        tmux_pid = self._terminals.server.known_pid
        if tmux_pid is not None:
            pids.add(tmux_pid)
        return frozenset(pids), frozenset({_tmux.tmux_unit(self.name)})

    async def admit(self, wait: float) -> None:
        """Admission control: wait up to ``wait`` s for (or refuse on) pressure its guards see."""
        guards = [m.guard for m in list(self._monitors) if m.guard is not None]
        if guards:
            from .._guard._guardthread import admit

            await admit(guards, wait)

    def note_exit(self, unit: str, pid: int, status: int | None, comm: str | None) -> None:
        """Tell every monitor of this fleet that an agent's main process ended."""
        for mon in list(self._monitors):
            mon.note_exit(unit, pid, status, comm)

    async def report(self, top: int) -> MemoryReport:
        """See :meth:`.AsyncFleet.report` (``top`` checked)."""
        from .._monitor._report import build_report

        return await build_report(
            await self._manager.slice_cgroup(),
            self._store.unit_agent,
            top=top,
            cgroup_root=self._manager.cgroup_root,
        )

    def _on_event(self, event: MonitorEvent, mon: Monitor) -> None:
        from .._events import OomKill

        if isinstance(event, OomKill) and not event.recovered:
            self._recovery.note_live_kill(event)
        task = asyncio.get_running_loop().create_task(self.record_event(event, mon))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def record_event(self, event: MonitorEvent, mon: Monitor | None = None) -> None:
        if self._store.registry is None:
            return
        from .._contract import event_parts
        from .._events import AgentExited, OomKill
        from .._events import Pressure as MonitorPressure
        from .._guard._guardevents import GuardKill

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
