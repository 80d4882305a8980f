"""The fleet's agents as they are now: the exits its watch sees, and ``agents()``.

:class:`Listing` is a part :class:`._fleet.AsyncFleet` holds. An exit the
fleet's pidfd watch sees is recorded once (or, where the scope still holds
processes, the agent lingers: :mod:`._reaper`). A listing reads the live
scopes in one call (:meth:`._fleet_reconcile.Reconciler.live`) and the
registry's rows, sweeps leftovers, closes tmux rows whose window is gone and
rows whose scope is gone, and reads each live scope's figures from cgroupfs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import InvalidTransition, RegistryError
from .._kernel._proc import exec_comm
from .._managers._scopefiles import cgroup_present, read_figures
from .._registry._registry import CLOSED_STATES, in_flight
from ._agent import Agent
from ._fleet_registry import FleetPart

if TYPE_CHECKING:
    from ._fleet_monitor import Monitors
    from ._fleet_reconcile import Reconciler
    from ._fleet_tmux import Terminals
    from ._reaper import Reaper

__all__ = ["Listing"]

log = logging.getLogger("agentscope")


@dataclass(eq=False, repr=False)
class Listing(FleetPart):
    """The fleet's part that records the exits it sees and lists its agents."""

    _reconciler: Reconciler
    _reaper: Reaper
    _terminals: Terminals
    _monitors: Monitors

    def note_exit(self, agent: Agent, status: int | None) -> None:
        """A launched child was reaped: record it (from the pidfd callback)."""
        task = asyncio.get_running_loop().create_task(self.record_exit(agent, status))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def record_exit(self, agent: Agent, status: int | None) -> None:
        """Tell the monitors, then leave the agent lingering or record its exit once."""
        comm = exec_comm(agent.argv[0]) if agent.argv else None
        self._monitors.note_exit(agent.unit, agent.pid, status, comm)
        if self._store.registry is None:
            return
        try:
            if await self._reaper.main_exited(agent.unit, agent.pid, status):
                agent.state = "lingering"  # its scope holds processes: see _reaper
                return
        except (RegistryError, OSError) as exc:
            log.warning("could not look for leftovers of %s: %s", agent.name, exc)
        agent.state = "exited"
        try:
            await self._store.call(self._store.mark_exited, agent.unit, agent.pid, status)
        except InvalidTransition:
            pass  # already closed by a listing that saw the scope go first
        except RegistryError as exc:
            log.warning("could not record the exit of %s: %s", agent.name, exc)

    async def agents(self, include_closed: bool) -> list[Agent]:
        """See :meth:`._fleet.AsyncFleet.agents`."""
        registry = self._store.open_registry
        live = await self._reconciler.live()
        for agent in list(self._roster.agents.values()):
            ended = agent.state in ("exited", "lingering")
            if agent.popen is not None and not ended and not agent.alive():
                await self.record_exit(agent, agent.popen.returncode)
        rows = await self._store.call(registry.agents, self.name, include_closed=include_closed)
        # Main processes that ended unseen (exec'd, adopted, another
        # manager's): their leftovers linger, or are reaped when due.
        swept = await self._reaper.sweep([r for r in rows if r.unit in live])
        rows = [swept[r.unit][0] if r.unit in swept else r for r in rows]
        # A lingering tmux agent's window is gone with its main process:
        # its leftovers are the reaper's (reap_after), not killed here.
        windowed = [
            r
            for r in rows
            if r.unit in self._roster.terminals
            and r.unit in live
            and r.state not in CLOSED_STATES
            and r.lingering is None
        ]
        if windowed:
            closed = await self._terminals.close_windowless(windowed)
            rows = [closed.get(r.unit, r) for r in rows]
        slice_dir = await self._manager.slice_cgroup()
        unseen = [r for r in rows if not r.closed and r.unit not in live]
        # Not listed, yet not gone: a launch in flight, or a scope the listing
        # missed (its cgroup is there): left to the next listing.
        flying = await asyncio.to_thread(
            lambda: (
                {r.unit for r in unseen if in_flight(r)}
                | cgroup_present(slice_dir, (r.unit for r in unseen))
            )
        )
        out: list[Agent] = []
        for rec in rows:
            if not rec.closed and rec.unit not in live:
                if rec.unit in flying:
                    continue
                rec = await self._store.close_gone(rec)
            known = self._roster.agents.get(rec.name)
            if known is not None and known.unit == rec.unit:
                agent = known
                agent.state = rec.state
            else:
                agent = self._roster.from_record(rec)
            if not rec.closed:
                agent.state = "stopping" if live[rec.unit][1] == "deactivating" else rec.state
                if rec.lingering is not None and agent.state == "running":
                    agent.state = "lingering"
                    agent.leftovers = swept[rec.unit][1] if rec.unit in swept else 0
            out.append(agent)
        figures = await asyncio.to_thread(
            read_figures, slice_dir, [a.unit for a in out if a.state not in CLOSED_STATES]
        )
        for agent in out:
            fig = figures.get(agent.unit)
            if fig is None:
                continue
            if fig.memory_current is not None:
                agent.memory_current, agent.memory_peak = fig.memory_current, fig.memory_peak
            if fig.oom_kills is not None:
                agent.oom_kills = max(agent.oom_kills, fig.oom_kills)
            agent.calls = fig.calls
            if fig.frozen and agent.state == "running":
                agent.state = "frozen"
        return out
