"""Memory reports: who holds the memory, per agent and host-wide.

A :class:`MemoryReport` is the data a :class:`~agentscope_systemd.Pressure` event
carries and ``fleet.report()`` returns: the host's figures and PSI, each
agent's scope, and the largest processes host-wide (agents or not). The
host-wide /proc pass (and ``smaps_rollup`` for the top N) runs only here,
in a worker thread, with an escape audit (:mod:`._escape`) so that an
agent's processes outside its scope count under it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._calls._calls import CALL_PREFIX
from .._dicts import Record
from .._kernel._cgroup import CGROUP_ROOT, read_cgroup_memory, scan_slice
from .._kernel._cgroup import Pressure as PsiPressure
from .._kernel._proc import (
    PROC_ROOT,
    MemInfo,
    ProcessInfo,
    SmapsRollup,
    host_pressure,
    read_meminfo,
    read_smaps_rollup,
    top_processes,
)
from ._escape import Escapee, find_escapes

__all__ = ["AgentMemory", "CallMemory", "MemoryReport", "TopProcess", "build_report", "read_calls"]


@dataclass(frozen=True, slots=True)
class CallMemory(Record):
    """One tool call running in an agent's scope (``call-LABEL-N``, docs/calls.md).

    Its own cgroup's figures: the call's processes and their children
    together (``processes``), ``memory_peak`` None before Linux 5.19.
    """

    call: str
    memory_current: int
    memory_peak: int | None
    processes: int
    oom_kills: int


def read_calls(scope_dir: Path) -> tuple[CallMemory, ...]:
    """The calls running in the scope at ``scope_dir``, by name; those gone meanwhile left out."""
    try:
        with os.scandir(scope_dir) as it:
            names = sorted(e.name for e in it if e.name.startswith(CALL_PREFIX) and e.is_dir())
    except OSError:
        return ()
    calls = []
    for name in names:
        try:
            memory = read_cgroup_memory(scope_dir / name)
        except (OSError, ValueError):
            memory = None  # not readable as a call (someone else's cgroup): not listed
        if memory is not None:
            calls.append(
                CallMemory(
                    name, memory.current, memory.peak, len(memory.pids), memory.events.oom_kill
                )
            )
    return tuple(calls)


@dataclass(frozen=True, slots=True)
class AgentMemory(Record):
    """One agent's scope at the time of a report (bytes; counters since the scope began).

    ``memory_peak`` is None on kernels before 5.19; ``processes`` counts the
    scope's own processes; ``oom_kills`` and ``high_events`` are the scope's
    ``memory.events`` ``oom_kill`` and ``high`` counters. ``escaped`` counts
    the agent's descendants that live outside the agents slice and
    ``escaped_rss`` their RSS (bytes): memory the scope's figures miss.
    ``calls`` are its tool calls running now, each with its own figures
    (included in the scope's: memory is counted up the tree).
    """

    agent: str
    unit: str
    memory_current: int
    memory_peak: int | None
    anon: int
    file: int
    processes: int
    oom_kills: int
    high_events: int
    escaped: int = 0
    escaped_rss: int = 0
    calls: tuple[CallMemory, ...] = ()


@dataclass(frozen=True, slots=True)
class TopProcess:
    """One of the host's largest processes; ``smaps`` None when unreadable (other user, gone).

    ``escaped``: it lives outside the agents slice but descends from the
    agent named in ``process.agent``.
    """

    process: ProcessInfo
    smaps: SmapsRollup | None
    escaped: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the :class:`ProcessInfo` fields, ``pss``, ``swap``, ``escaped``."""
        return {
            **self.process.to_dict(),
            "pss": None if self.smaps is None else self.smaps.pss,
            "swap": None if self.smaps is None else self.smaps.swap,
            "escaped": self.escaped,
        }


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Who holds the memory: host figures, PSI, the agents, the largest processes.

    ``host`` is None only where /proc has no meminfo (a fake tree);
    ``host_pressure``/``slice_pressure`` None without PSI (or the slice gone).
    ``top`` lists the largest processes host-wide, largest first, with
    ``agent`` None for processes that belong to no agent of the fleet, so a
    report can say the biggest process is not an agent. ``escaped`` lists
    the agents' descendants that live outside the slice (docs/escapes.md).
    """

    ts: float
    host: MemInfo | None
    host_pressure: PsiPressure | None
    slice_pressure: PsiPressure | None
    slice_memory_current: int | None
    agents: tuple[AgentMemory, ...]
    top: tuple[TopProcess, ...]
    escaped: tuple[Escapee, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the report."""
        return {
            "ts": self.ts,
            "host": None if self.host is None else self.host.to_dict(),
            "pressure": None if self.host_pressure is None else self.host_pressure.to_dict(),
            "slice_pressure": (
                None if self.slice_pressure is None else self.slice_pressure.to_dict()
            ),
            "slice_memory_current": self.slice_memory_current,
            "agents": [a.to_dict() for a in self.agents],
            "processes": [p.to_dict() for p in self.top],
            "escaped": [e.to_dict() for e in self.escaped],
        }


def _agent_of_cgroup(
    slice_name: str, unit_agent: Callable[[str], str | None]
) -> Callable[[str], str | None]:
    """Map a ``/proc/PID/cgroup`` path to an agent: the unit right below the slice."""

    def agent_of(cgroup: str) -> str | None:
        parts = cgroup.split("/")
        try:
            i = parts.index(slice_name)
        except ValueError:
            return None
        return unit_agent(parts[i + 1]) if i + 1 < len(parts) else None

    return agent_of


def _build_report_sync(
    slice_path: Path,
    unit_agent: Callable[[str], str | None],
    top: int,
    proc_root: Path,
    cgroup_root: Path = CGROUP_ROOT,
) -> MemoryReport:
    ts = time.time()
    try:
        host: MemInfo | None = read_meminfo(proc_root)
    except FileNotFoundError:
        host = None  # not a procfs (a test tree without meminfo)
    slice_memory = read_cgroup_memory(slice_path)
    scopes = scan_slice(slice_path)
    escapes = find_escapes(
        slice_path,
        {unit: memory.pids for unit, memory in scopes.items()},
        cgroup_root=cgroup_root,
        proc_root=proc_root,
    )
    escaped: dict[str, list[Escapee]] = {}
    for e in escapes:
        escaped.setdefault(e.scope, []).append(e)
    agents = []
    for unit, memory in scopes.items():
        agent = unit_agent(unit)
        if agent is None:
            continue
        outside = escaped.get(unit, [])
        agents.append(
            AgentMemory(
                agent=agent,
                unit=unit,
                memory_current=memory.current,
                memory_peak=memory.peak,
                anon=memory.anon,
                file=memory.file,
                processes=len(memory.pids),
                oom_kills=memory.events.oom_kill,
                high_events=memory.events.high,
                escaped=len(outside),
                escaped_rss=sum(e.rss for e in outside),
                calls=read_calls(slice_path / unit),
            )
        )
    agents.sort(key=lambda a: (-a.memory_current, a.unit))
    biggest = top_processes(top, proc_root, _agent_of_cgroup(slice_path.name, unit_agent))
    # An escapee counts under its agent, marked as such.
    whose = {(e.pid, e.start_time): e.scope for e in escapes}
    listed = []
    for p in biggest:
        scope = whose.get((p.pid, p.start_time))
        if scope is not None:
            p = dataclasses.replace(p, agent=unit_agent(scope))
        listed.append(TopProcess(p, read_smaps_rollup(p.pid, proc_root), scope is not None))
    return MemoryReport(
        ts=ts,
        host=host,
        host_pressure=host_pressure(proc_root),
        slice_pressure=None if slice_memory is None else slice_memory.pressure,
        slice_memory_current=None if slice_memory is None else slice_memory.current,
        agents=tuple(agents),
        top=tuple(listed),
        escaped=escapes,
    )


async def build_report(
    slice_path: Path,
    unit_agent: Callable[[str], str | None],
    *,
    top: int = 10,
    cgroup_root: Path = CGROUP_ROOT,
    proc_root: Path = PROC_ROOT,
) -> MemoryReport:
    """Take a :class:`MemoryReport` now, without a running :class:`~agentscope_systemd.Monitor`.

    ``slice_path`` is the agents slice's cgroup directory; ``unit_agent``
    maps a scope's unit name to its agent (None: not an agent of this fleet).
    The host-wide /proc pass runs in a worker thread. ``cgroup_root`` is the
    v2 hierarchy ``slice_path`` is in (what ``/proc/PID/cgroup`` paths are
    relative to, for the escape audit).

    Raises:
        OSError: a failure other than processes or cgroups vanishing.
        ValueError: a kernel file not in its documented format.
    """
    return await asyncio.to_thread(
        _build_report_sync, slice_path, unit_agent, top, proc_root, cgroup_root
    )
