"""The fleet's adopt: a running process and its descendants moved into a new scope.

:class:`AdoptGlue` is a part of :class:`._fleet.AsyncFleet` (a mixin). The
same checks and name claim as a launch, then ``StartTransientUnit`` with the
process tree's PIDs; children forked meanwhile are moved after it
(``_escape.move_into``), and every process gets the agents' oom_score_adj.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import psutil

from . import _claim, _fdlimit, _names, _numbers, _scopeprops
from ._agent import Agent
from ._bus import SystemdBus
from ._errors import AgentscopeError, InvalidConfig, LaunchError
from ._escape import move_into, unit_of_cgroup
from ._launchargs import check_memory_max
from ._proc import ProcStat, read_cgroup, read_stat
from ._reaper import DEFAULT_REAP_AFTER
from ._registry import AgentRecord, Registry
from ._scopefiles import write_oom_score_adj

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._fleet import AsyncFleet
    from ._systemd import Scopes

__all__ = ["AdoptGlue"]

log = logging.getLogger("agentscope")

T = TypeVar("T")
P = ParamSpec("P")


class AdoptGlue:
    """The adopting half of AsyncFleet; what it uses of the fleet is declared here."""

    if TYPE_CHECKING:
        name: str
        agent_oom_score_adj: int
        _agents: dict[str, Agent]
        _bus: SystemdBus
        _registry: Registry | None
        _scopes: Scopes
        _unit_names: dict[str, str]

        async def _db(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...
        async def _event(self, agent: str | None, kind: str, **detail: Any) -> None: ...
        def _check_open(self) -> None: ...
        async def _admit(self) -> None: ...
        async def _attach(self, unit: str, pids: Sequence[int]) -> None: ...
        async def _clear_slice_limits(self) -> None: ...
        async def _refuse_running(self, name: str) -> None: ...
        def _close_row(self, rec: AgentRecord) -> AgentRecord: ...
        def _mark_running(self, unit: str, **event: dict[str, Any]) -> None: ...
        async def slice_cgroup(self) -> Path: ...
        def _fleet(self) -> AsyncFleet: ...  # ReconcileGlue's

    async def adopt(
        self,
        pid: int,
        name: str,
        *,
        memory_max: int | None = None,
        tasks_max: int | None = None,
        cpu_weight: int | None = None,
        io_weight: int | None = None,
        properties: Mapping[str, str | int] | None = None,
        reap_after: float | str = DEFAULT_REAP_AFTER,
    ) -> Agent:
        """Move a running process and all its descendants into a new agent scope.

        ``memory_max`` (bytes), the other resource controls and
        ``reap_after`` are as for :meth:`launch`; ``pid`` is the main process.

        Some processes are never adopted, since their whole tree would move
        into the agent's scope (its cap, its stop, its reaper): PID 1, a
        kernel thread, an ancestor of this process (the manager would move
        with it), and the main process of a systemd service. This process
        itself may be adopted: it then becomes the agent, as ``agentscope
        exec`` does before it execs its command.

        Raises:
            InvalidName, InvalidConfig (also: a process that is never
            adopted, before anything is created), AgentExists, LaunchError
            (no such process), BusError, HostUnderPressure (as for
            :meth:`launch`).
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        pid = await self._adoptable(pid)
        controls = _scopeprops.build(
            memory_max=check_memory_max(memory_max),
            tasks_max=tasks_max,
            cpu_weight=cpu_weight,
            io_weight=io_weight,
            properties=properties,
        )
        grace = _scopeprops.parse_reap_after(reap_after)
        try:  # a walk of /proc: off the loop, as every read of many files
            root, pids = await asyncio.to_thread(_process_tree, pid)
        except psutil.NoSuchProcess as exc:
            raise LaunchError(f"no process with pid {pid} to adopt") from exc
        await self._admit()
        await self._refuse_running(name)
        await self._clear_slice_limits()
        unit = _names.scope_unit_name(self.name, name)
        assert self._registry is not None
        stat, argv, cwd = await asyncio.to_thread(_identity, root)
        _fdlimit.make_room(len(pids) + _fdlimit.LAUNCH_FDS)  # a pidfd each for systemd
        await self._db(
            _claim.claim,
            self._registry,
            self.name,
            name,
            unit,
            pid,
            stat.start_time if stat else 0,
            argv,
            cwd,
            slice_dir=await self.slice_cgroup(),
            close=self._close_row,
            reap_after=grace,
        )
        try:
            issues = await self._scopes.start_scope(unit, name, pids, controls)
        except BaseException:
            await self._db(self._registry.delete, unit)
            raise
        await self._db(self._mark_running, unit, adopted={"pid": pid, "pids": pids})
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
            moved = await move_into(
                unit,
                late,
                self._attach,
                await self.slice_cgroup(),
                cgroup_root=self._bus.cgroup_root,
            )
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
        agent = Agent(self._fleet(), name, unit, pid, None)
        agent.reap_after = grace
        agent.property_issues = issues
        self._agents[name] = agent
        self._unit_names[unit] = name
        if issues:
            await self._event(name, "properties_not_applied", unit=unit, issues=issues)
        return agent

    async def _adoptable(self, pid: object) -> int:
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
        unit = unit_of_cgroup(cgroup) if cgroup is not None else None
        if unit is None or not unit.endswith(".service"):
            return None
        try:
            (path,) = await self._bus.call("GetUnit", "s", [unit])
            main = await self._bus.get_property(path, _SERVICE, "MainPID")
        except AgentscopeError:
            return None  # not known to this manager: it cannot be its main process
        if main != pid:
            return None
        return (
            f"it is the main process of {unit}; adopting it would take the service's "
            "processes out of it: stop the service or change its unit instead"
        )


_PID_MAX = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT
_PF_KTHREAD = 0x00200000  # include/linux/sched.h
_SERVICE = "org.freedesktop.systemd1.Service"


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
    root = psutil.Process(pid)
    return root, [pid, *(c.pid for c in root.children(recursive=True))]


def _identity(root: psutil.Process) -> tuple[ProcStat | None, list[str], str]:
    """Its stat, argv and cwd (another user's argv and cwd may be hidden from us)."""
    try:
        argv, cwd = root.cmdline(), root.cwd()
    except psutil.Error:
        argv, cwd = [], ""
    return read_stat(root.pid), argv, cwd
