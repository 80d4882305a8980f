"""The fleet's launch path: the steps that start an agent once its arguments are checked.

:class:`Launcher` is a part :class:`._fleet.AsyncFleet` holds. In order:
admission (the guard's pressure), the name refused if it runs, the agents
slice's stale limits cleared (once), then :meth:`Launcher._spawn_in_scope`:
fork a child that waits at a gate (``_spawn``) or open its tmux pane,
record the launch (the name's claim), ``start_scope`` through the fleet's
manager, and let the child exec. Any failure on the way aborts the child
before it execs, so nothing runs outside its scope and nothing is left over.
A step added to every launch (a leaf cgroup for tool calls, say) goes in
:meth:`Launcher._spawn_in_scope`, between the scope's start and the release.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from .. import _names
from .._errors import AgentExists, LaunchError, RegistryError
from .._kernel import _fdlimit
from .._kernel._proc import read_stat
from .._managers._manager import ScopeRequest
from .._registry import _claim
from .._registry._registry import Registry
from ._fleet_registry import FleetPart
from ._fleet_tmux import TmuxChild
from ._spawn import GatedChild, spawn_gated

if TYPE_CHECKING:
    from .._managers._manager import Controls
    from ._agent import Agent
    from ._fleet_monitor import Monitors
    from ._fleet_tmux import Terminals

__all__ = ["LaunchArgs", "Launcher", "Stdio"]

log = logging.getLogger("agentscope")

Stdio = int | IO[Any] | None


class LaunchArgs(NamedTuple):
    """A launch's arguments as :meth:`.AsyncFleet.launch` checked them, handed on as one."""

    name: str
    argv: Sequence[str]
    cwd: str | None
    env: Mapping[str, str] | None
    stdio: tuple[Stdio, Stdio, Stdio]
    controls: Controls
    terminal: str | None
    reap_after: float | None


def _spawn_slots() -> asyncio.Semaphore:
    """How many launches fork at once.

    Each launch in flight holds a thread inside Popen until its exec; a few
    at a time keep the GIL (and the event loop) free for the rest.
    """
    return asyncio.Semaphore(max(4, 2 * (os.cpu_count() or 1)))


@dataclass(eq=False, repr=False)
class Launcher(FleetPart):
    """The fleet's launch path (see the module's docstring); one per fleet object."""

    _monitors: Monitors
    _terminals: Terminals
    _: KW_ONLY
    agent_oom_score_adj: int
    _slice_checked: bool = field(init=False, default=False)
    _slice_lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    _spawn_slots: asyncio.Semaphore = field(init=False, default_factory=_spawn_slots)

    async def launch(self, args: LaunchArgs, *, admission_wait: float, streams: bool) -> Agent:
        """See :meth:`.AsyncFleet.launch` (its arguments checked)."""
        name, argv, terminal, grace = args.name, args.argv, args.terminal, args.reap_after
        await self._monitors.admit(admission_wait)
        if terminal is not None:
            # Before the pane: a running tmux agent's window would otherwise
            # make it fail as WindowExists instead of AgentExists.
            await self.refuse_running(name)
        else:
            # The registry's open row is checked when the launch is recorded
            # (record_launch): no trip to the registry before the fork.
            self.refuse_known(name)
        await self.clear_slice_limits_once()
        # Registry writes of this fleet still in flight (an exit just seen)
        # would otherwise run during the fork and the gate, where they and the
        # fork slow each other down (the GIL, and copy-on-write faults on every
        # page they touch while the child shares them): let them finish first.
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        unit = _names.scope_unit_name(self.name, name)
        async with self._spawn_slots:
            popen, pid, start, issues = await self._spawn_in_scope(unit, args)
        agent = self._roster.new(name, unit, pid, popen, start)
        agent.argv = list(argv)
        agent.terminal = terminal
        agent.reap_after = grace
        agent.property_issues = issues
        self._roster.unit_names[unit] = name
        launched: dict[str, Any] = {"pid": agent.pid, "argv": list(argv)}
        if terminal is not None:
            self._roster.terminals[unit] = terminal
            launched["terminal"] = terminal
        try:
            await self._store.call(self._store.mark_running, unit, launched=launched)
        finally:
            # Watched only now: an exit recorded before the row says running
            # (a command that ends at once) made the move to running fail as
            # InvalidTransition. Nothing can reap the child meanwhile (it is
            # not in _agents yet), so the pidfd still finds it, a zombie at worst.
            self._roster.agents[name] = agent
            agent._watch_exit()
        if issues:
            await self._store.event(name, "properties_not_applied", unit=unit, issues=issues)
        if streams and popen is not None:  # the blocking facade reads the plain pipes instead
            await agent._attach_streams()
        log.debug("launched %s as %s (pid %d)", name, unit, agent.pid)
        return agent

    async def _spawn_in_scope(
        self, unit: str, args: LaunchArgs
    ) -> tuple[subprocess.Popen[bytes] | None, int, int, list[dict[str, Any]]]:
        """Fork the gated child (or open its tmux pane), record it, make its scope, let it exec.

        Returns the Popen (None for a tmux pane, the tmux server's child),
        the PID, its start time as recorded and what systemd did not take of
        ``controls``.
        """
        name, argv, cwd, env, stdio, controls, terminal, reap_after = args
        # This launch's own reference: cleanup must work even if the fleet is
        # closed meanwhile (a gather of launches cancelled at shutdown).
        registry = self._store.registry
        assert registry is not None
        child: GatedChild | TmuxChild
        # Each agent keeps a pidfd here: past the soft fd limit, raise it (_fdlimit).
        _fdlimit.make_room()
        for attempt in range(2):
            try:
                if terminal is not None:
                    child = await self._terminals.open_pane(unit, name, argv, cwd, env)
                else:
                    child = await spawn_gated(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdin=stdio[0],
                        stdout=stdio[1],
                        stderr=stdio[2],
                        oom_score_adj=self.agent_oom_score_adj,
                        # delegated: into the scope's agent leaf (#26); a process
                        # mode scope has no cgroup of its own (#27)
                        into_leaf=self._manager.mode != "process",
                    )
                break
            except OSError as exc:
                if not _fdlimit.out_of_descriptors(exc):
                    raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
                # Descriptors nobody counted fill the table: raise the limit and
                # try once more (nothing was started), else say what to do.
                if attempt or not _fdlimit.make_room(force=True):
                    raise _fdlimit.no_room(argv[0], exc) from exc
        recorded = False
        try:
            start = await self.record_launch(
                registry, name, unit, child.pid, argv, cwd or os.getcwd(), reap_after
            )
            recorded = True
            issues = await self._manager.start_scope(
                ScopeRequest(unit, name, [child.pid], controls)
            )
        except BaseException as exc:
            await child.abort()
            if recorded:
                try:
                    await asyncio.to_thread(registry.delete, unit)
                except RegistryError as err:  # closed meanwhile: reconciliation closes the row
                    log.debug("could not forget %s: %s", unit, err)
            if _fdlimit.out_of_descriptors(exc):  # the pidfd systemd was to get
                raise _fdlimit.no_room(argv[0], exc) from exc
            raise
        try:
            popen = await child.release()
        except (OSError, LaunchError) as exc:
            # The exec failed inside the scope: the scope ends with its only process.
            await self._store.call(registry.set_state, unit, "failed")
            await self._store.event(name, "failed", unit=unit, error=str(exc))
            raise LaunchError(f"cannot exec {argv[0]!r}: {exc}") from exc
        return popen, child.pid, start, issues

    async def record_launch(
        self,
        registry: Registry,
        name: str,
        unit: str,
        pid: int,
        argv: Sequence[str],
        cwd: str,
        reap_after: float | None,
    ) -> int:
        """Record the launch (state starting) before its scope exists; the start time recorded.

        Every launch path that starts a scope records through here: a
        library or tmux launch, and an adopt.

        The name is claimed by the one rule of every launch path
        (:func:`._claim.claim`): another launch of the same name, in this
        process or another, fails here with nothing started; a stale row of
        the name (its scope gone, its launcher not at work) is closed, and the
        launch recorded after all.
        """
        stat = await asyncio.to_thread(read_stat, pid)
        start = stat.start_time if stat else 0
        record = functools.partial(
            registry.record_launch,
            self.name,
            name,
            unit,
            pid,
            start,
            list(argv),
            cwd,
            reap_after=reap_after,
        )
        slice_dir = await self._manager.slice_cgroup()
        await self._store.call(
            _claim.claim, registry, record, slice_dir=slice_dir, close=self._store.close_row
        )
        return start

    def refuse_known(self, name: str) -> None:
        """AgentExists if this fleet object runs an agent of that name (no I/O)."""
        known = self._roster.agents.get(name)
        if known is not None and known.alive() and known.state != "exited":
            raise AgentExists(self.name, name, known.unit)

    async def refuse_running(self, name: str) -> None:
        """AgentExists if an agent of that name runs, here or as the registry says."""
        # The registry is the fleet's memory across processes: its open row
        # names the running agent, so no listing of systemd's units is needed
        # (ListUnitsByPatterns costs systemd O(units) per launch).
        self.refuse_known(name)
        assert self._store.registry is not None
        slice_dir = await self._manager.slice_cgroup()
        held = await self._store.call(
            _claim.holder, self._store.registry, self.name, name, slice_dir, self._store.close_row
        )
        if held is not None:
            raise AgentExists(self.name, name, held.unit)

    async def clear_slice_limits_once(self) -> None:
        """:meth:`clear_slice_limits`, once per fleet object."""
        if self._slice_checked:
            return
        async with self._slice_lock:
            if not self._slice_checked:
                await self.clear_slice_limits()
                self._slice_checked = True

    async def clear_slice_limits(self) -> dict[str, int]:
        """See :meth:`.AsyncFleet.clear_slice_limits`."""
        stale = await self._manager.clear_slice_limits()
        if stale and self._store.registry is not None:
            await self._store.event(None, "limits_cleared", slice=self._manager.slice, limits=stale)
        return stale
