"""The fleet's adopt: a running process and its descendants moved into a new scope.

:class:`Adopter` is a part :class:`._fleet.AsyncFleet` holds. The same
checks and name claim as a launch (through the fleet's :class:`._fleet_launch.Launcher`),
then the manager's ``start_scope`` with the
process tree's PIDs; children forked meanwhile are moved after it
(``_escape.Mover.move_into``), and every process gets the agents' oom_score_adj.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

from .. import _names, _numbers
from .._errors import InvalidConfig, LaunchError
from .._kernel import _fdlimit
from .._kernel._proc import read_cgroup, read_stat
from .._managers._manager import ScopeRequest
from .._managers._scopefiles import write_oom_score_adj
from .._monitor._escape import Mover
from ._agent import Agent
from ._fleet_registry import FleetPart

# psutil walks a process tree to adopt it, and only then: opening a fleet to
# list it (``agentscope ls``) does not pay for its import (issue 28).
if TYPE_CHECKING:
    import psutil

    from .._managers._manager import Controls
    from ._agent import Agent
    from ._fleet_launch import Launcher
    from ._fleet_monitor import Monitors

__all__ = ["Adopter"]

log = logging.getLogger("agentscope")


@dataclass(eq=False, repr=False)
class Adopter(FleetPart):
    """The fleet's adopt (see the module's docstring); one per fleet object."""

    _monitors: Monitors
    _launcher: Launcher
    _: KW_ONLY
    agent_oom_score_adj: int

    async def adopt(
        self,
        pid: int,
        name: str,
        controls: Controls,
        grace: float | None,
        *,
        admission_wait: float,
    ) -> Agent:
        """See :meth:`.AsyncFleet.adopt` (its arguments checked, ``pid`` by :meth:`adoptable`)."""
        import psutil

        try:  # a walk of /proc: off the loop, as every read of many files
            root, pids = await asyncio.to_thread(_process_tree, pid)
        except psutil.NoSuchProcess as exc:
            raise LaunchError(f"no process with pid {pid} to adopt") from exc
        await self._monitors.admit(admission_wait)
        await self._launcher.refuse_running(name)
        await self._launcher.clear_slice_limits_once()
        unit = _names.scope_unit_name(self.name, name)
        assert self._store.registry is not None
        argv, cwd = await asyncio.to_thread(_identity, root)
        _fdlimit.make_room(len(pids) + _fdlimit.LAUNCH_FDS)  # a pidfd each for systemd
        registry = self._store.registry
        start = await self._launcher.record_launch(registry, name, unit, pid, argv, cwd, grace)
        try:
            issues = await self._manager.start_scope(ScopeRequest(unit, name, pids, controls))
        except BaseException:
            await self._store.call(registry.delete, unit)
            raise
        await self._store.call(self._store.mark_running, unit, adopted={"pid": pid, "pids": pids})
        # Children forked while the scope was being made: move them too.
        try:
            _root, now = await asyncio.to_thread(_process_tree, pid)
        except psutil.NoSuchProcess:
            now = []
        late = [p for p in now if p not in pids]
        if late:
            # systemd refuses AttachProcessesToUnit for a scope without
            # Delegate=yes (every agent scope): move_into then writes each pid
            # into the scope's cgroup.procs, as the escape audit's reclaim does.
            slice_path = await self._manager.slice_cgroup()
            mover = Mover(self._manager.attach, slice_path, cgroup_root=self._manager.cgroup_root)
            moved = await mover.move_into(unit, late)
            stuck = {p: why for p, why in moved.items() if why is not None}
            if stuck:
                log.warning(
                    "adopted %s, but %d process(es) forked while its scope was made stay "
                    "outside it (the monitor reports them as escaped): %s",
                    name,
                    len(stuck),
                    "; ".join(f"{p}: {why}" for p, why in sorted(stuck.items())[:8]),
                )
        adj = self.agent_oom_score_adj
        await asyncio.to_thread(lambda: [write_oom_score_adj(p, adj) for p in [*pids, *late]])
        agent = self._roster.new(name, unit, pid, None, start)
        agent.reap_after = grace
        agent.property_issues = issues
        self._roster.agents[name] = agent
        self._roster.unit_names[unit] = name
        if issues:
            await self._store.event(name, "properties_not_applied", unit=unit, issues=issues)
        return agent

    async def adoptable(self, pid: object) -> int:
        """``pid`` if it may be adopted; InvalidConfig naming why not (#31)."""
        allowed = (
            "the pid of a process of yours that is not PID 1, a kernel thread, an "
            "ancestor of this manager, nor a systemd service's main process"
        )
        number = _numbers.whole("pid", pid, low=1, high=_PID_MAX, allowed=allowed)
        why = await asyncio.to_thread(_never_adopted, number)
        if why is None:
            why = await self._service_main(number)
        if why is not None:
            raise InvalidConfig("pid", number, allowed, problem=f"is refused: {why}")
        return number

    async def _service_main(self, pid: int) -> str | None:
        """Why ``pid`` is a systemd service's main process (systemd's MainPID), or None."""
        cgroup = await asyncio.to_thread(read_cgroup, pid)
        unit = self._manager.unit_of_cgroup(cgroup) if cgroup is not None else None
        if unit is None or await self._manager.main_pid(unit) != pid:
            return None
        return (
            f"it is the main process of {unit}; adopting it would take the service's "
            "processes out of it: stop the service or change its unit instead"
        )


_PID_MAX = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT
_PF_KTHREAD = 0x00200000  # include/linux/sched.h


def _never_adopted(pid: int) -> str | None:
    """Why ``pid`` is never an agent (read from /proc), or None."""
    if pid == 1:
        return "PID 1 is the system's init; every process descends from it"
    # This process itself is not refused: adopting it makes it the agent, which
    # is what `agentscope exec` does (its command keeps its pid); its
    # ancestors are, since the manager would move into the scope with them.
    me = os.getpid()
    stat = read_stat(pid)
    if stat is not None and (pid == 2 or stat.ppid == 2 or stat.flags & _PF_KTHREAD):
        return "it is a kernel thread"
    ancestor, hops = read_stat(me), 0
    while ancestor is not None and ancestor.ppid > 1 and hops < 4096:
        if ancestor.ppid == pid:
            return (
                "it is an ancestor of this process: adopting it would move the fleet's "
                "manager into the agent's scope"
            )
        ancestor, hops = read_stat(ancestor.ppid), hops + 1
    mine = os.geteuid()
    if mine != 0:
        import psutil

        # Another user's process (a system service's main process under a
        # user manager, say): neither the user manager nor the kernel would
        # move it, and the refusal would come after the name was claimed.
        try:
            owner = psutil.Process(pid).uids().real
        except psutil.Error:
            owner = mine  # gone: the tree walk that follows says so
        if owner != mine:
            return (
                f"it is not your process (it runs as uid {owner}): only a fleet of the "
                "system manager, as root, adopts another user's processes"
            )
    return None


def _process_tree(pid: int) -> tuple[psutil.Process, list[int]]:
    """A process and its descendants' PIDs (it first); raises psutil.NoSuchProcess."""
    import psutil

    root = psutil.Process(pid)
    return root, [pid, *(c.pid for c in root.children(recursive=True))]


def _identity(root: psutil.Process) -> tuple[list[str], str]:
    """Its argv and cwd (another user's argv and cwd may be hidden from us)."""
    import psutil

    try:
        return root.cmdline(), root.cwd()
    except psutil.Error:
        return [], ""
