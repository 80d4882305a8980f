"""The fleet's reconciliation with systemd when it opens.

:class:`Reconciler` is a part :class:`._fleet.AsyncFleet` holds:
the fleet's live scopes in one listing (by Description), and ``open()``'s
reconciliation of the registry's rows with them: adopt, record what was
found, close what is gone, reopen a closed row whose scope runs, finish the
launches of a manager that died, stop scopes that hold nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import AgentExists, RegistryError
from .._managers._scopefiles import cgroup_present, read_scopes
from .._registry import _claim
from .._registry._registry import AgentRecord, LiveScope, in_flight, reconcile
from ._fleet_registry import FleetPart
from ._reconcile_plan import Revival

if TYPE_CHECKING:
    from ._reaper import Reaper

__all__ = ["Reconciler"]

log = logging.getLogger("agentscope")


@dataclass(eq=False, repr=False)
class Reconciler(FleetPart):
    """The fleet's part that lists its live scopes and reconciles its rows with them at open."""

    _reaper: Reaper

    async def live(self) -> dict[str, tuple[str, str]]:
        """This fleet's scopes systemd runs: {unit: (agent name, active state)}; one call."""
        live: dict[str, tuple[str, str]] = {}
        for listed in await self._manager.list_scopes():
            if listed.owner is not None and listed.owner[0] == self.name:
                live[listed.unit] = (listed.owner[1], listed.active)
                self._roster.unit_names.setdefault(listed.unit, listed.owner[1])
            else:  # the pattern of fleet a also matches fleet a-b's scopes
                self._roster.foreign.add(listed.unit)
        return live

    async def reconcile(self, policy: str) -> None:
        """Adopt, record, close, reopen and stop as the registry and the listing say (at open).

        ``policy`` is the fleet's: ``adopt`` its running agents, or ``stop`` them.
        """
        assert self._store.registry is not None
        # Rows before units: a row is written before its scope starts, so every
        # row read here whose scope runs is in the listing taken after it (the
        # other order closed launches that finished in between as lost).
        rows = await self._store.call(self._store.registry.agents, self.name)
        live = await self.live()
        slice_dir = await self._manager.slice_cgroup()
        # A launch in flight (here or in another process) may show its scope
        # before the child is in it (the start job is still running): leave
        # such rows to their launcher.
        flying = await asyncio.to_thread(lambda: {r.unit for r in rows if in_flight(r)})
        rows = [r for r in rows if r.unit not in flying]
        # A tmux agent whose scope is gone ended in its window, and a
        # lingering one's main process was seen ending: exited, not lost.
        ended = [r for r in rows if r.unit in self._roster.terminals or r.lingering is not None]
        for rec in [r for r in ended if r.unit not in live]:
            await self._store.close_gone(rec)
        rows = [r for r in rows if (r in ended and r.unit in live) or r not in ended]
        scopes = await asyncio.to_thread(read_scopes, slice_dir, live)
        # Their launcher records them: not "found" here.
        scopes = {u: s for u, s in scopes.items() if u not in flying}
        # Rows of live scopes that could not be read are left as they are, and
        # so are rows of scopes not listed but whose cgroup is there (an exec's
        # scope that started after the listing, its launch taken in from the
        # spool as the rows were read): not gone.
        rows = [r for r in rows if r.unit not in live or r.unit in scopes]
        unlisted = [r.unit for r in rows if r.unit not in live and not r.closed]
        present = await asyncio.to_thread(cgroup_present, slice_dir, unlisted)
        rows = [r for r in rows if r.unit not in present]
        # A live scope no open row claims may have a closed row (closed while
        # its scope lived on): judged too, so that it is reopened once rather
        # than "found" again at every open.
        unclaimed = [u for u in scopes if u not in {r.unit for r in rows}]
        rows += await self._store.call(self._closed_rows, unclaimed)
        plan = reconcile(rows, scopes)
        # A row whose main process ended while its scope still holds
        # processes lingers (its leftovers are reaped when due, _reaper.py)
        # rather than closing as lost; one with an empty scope is closed.
        lingering = tuple(r for r in plan.headless if scopes[r.unit].pids)
        plan = dataclasses.replace(
            plan, headless=tuple(r for r in plan.headless if not scopes[r.unit].pids)
        )
        closed = await self._store.call(self._store.registry.apply_closures, plan)
        for rec in closed:
            log.info("agent %s (%s) is gone: closed as %s", rec.name, rec.unit, rec.state)
        for rec in plan.adopt:
            if rec.state == "starting":
                # Its launcher died after the exec, before the row said so:
                # the launch happened, and is recorded once.
                rec = await self._store.call(
                    self._store.registry.set_state,
                    rec.unit,
                    "running",
                    event="launched",
                    detail={"unit": rec.unit, "pid": rec.pid, "argv": list(rec.argv)},
                    only_on_change=True,
                )
                log.info("agent %s (%s) was launched by a manager that died", rec.name, rec.unit)
            self._roster.agents[rec.name] = self._roster.from_record(rec)
            self._roster.unit_names[rec.unit] = rec.name
        if lingering and policy != "stop":
            swept = await self._reaper.sweep(lingering)
            for rec in lingering:
                now = swept[rec.unit][0] if rec.unit in swept else rec
                if not now.closed:
                    self._roster.agents[now.name] = self._roster.from_record(now)
                    self._roster.unit_names[now.unit] = now.name
        elif lingering:  # stopped below with the others; closed as they are
            plan = dataclasses.replace(plan, headless=plan.headless + lingering)
            await self._store.call(self._store.registry.apply_closures, plan)
        # A scope that holds no process and no open row claims (the child of
        # a manager that died mid-start exited before systemd moved it: such
        # a scope never empties, so it stays active) is stopped, once.
        headless = {r.unit for r in plan.headless}
        empty = [s for s in plan.unknown if not s.pids]
        empty += [s for s in scopes.values() if s.unit in headless and not s.pids]
        for scope in empty:
            log.info("stopping %s: a scope of fleet %s with no process", scope.unit, self.name)
            await self._manager.stop_unit(scope.unit, 10)
        found: list[tuple[str, LiveScope]] = []
        for scope in plan.unknown:
            if not scope.pids:
                continue
            name = live[scope.unit][0]
            found.append((name, scope))
            log.warning("found agent %s (%s) that the registry did not know", name, scope.unit)
            await self._store.event(name, "found", unit=scope.unit, pids=list(scope.pids))
        if policy == "stop":
            units = [r.unit for r in plan.adopt] + [s.unit for _, s in found]
            units += [r.unit for r in plan.headless] + [v.row.unit for v in plan.revive]
            await asyncio.gather(*(self._manager.stop_unit(u, 10) for u in units))
            for rec in plan.adopt:
                await self._store.call(self._store.registry.set_state, rec.unit, "exited")
                await self._store.event(rec.name, "stopped", unit=rec.unit, reason="policy stop")
            self._roster.agents.clear()
            return
        for revival in plan.revive:
            await self._reopen(revival, scopes[revival.row.unit])
        for name, scope in found:
            if not scope.pids:
                continue
            pid = min(scope.pids)
            try:
                registry = self._store.open_registry
                record = functools.partial(
                    registry.record_launch,
                    self.name,
                    name,
                    scope.unit,
                    pid,
                    scope.start_times.get(pid, 0),
                    [],
                    "",
                    "running",
                )
                rec = await self._store.call(
                    _claim.claim, registry, record, slice_dir=slice_dir, close=self._store.close_row
                )
            except (AgentExists, RegistryError) as exc:
                # Its row was closed meanwhile, or the name is taken by another
                # row: report it, and let the fleet open all the same.
                log.warning("cannot record found agent %s (%s): %s", name, scope.unit, exc)
                continue
            self._roster.agents[name] = self._roster.from_record(rec)

    def _closed_rows(self, units: list[str]) -> list[AgentRecord]:
        """The closed rows of ``units`` (in a worker thread)."""
        assert self._store.registry is not None
        rows = (self._store.registry.by_unit(u) for u in units)
        return [r for r in rows if r is not None and r.closed and r.fleet == self.name]

    async def _reopen(self, revival: Revival, scope: LiveScope) -> None:
        """Reopen a closed row whose scope runs, as running, with its event once."""
        assert self._store.registry is not None
        row = revival.row
        try:
            rec = await self._store.call(
                self._store.registry.reopen,
                row.unit,
                revival.pid,
                revival.start_time,
                detail={"pids": list(scope.pids)},
            )
        except (AgentExists, RegistryError) as exc:
            # Another row of the name is open: that agent keeps the name.
            log.warning("cannot reopen agent %s (%s): %s", row.name, row.unit, exc)
            return
        log.warning(
            "agent %s (%s) was recorded %s but its scope runs: reopened as running",
            row.name,
            row.unit,
            row.state,
        )
        self._roster.agents[rec.name] = self._roster.from_record(rec)
        self._roster.unit_names[rec.unit] = rec.name
