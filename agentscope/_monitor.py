"""The memory-pressure monitor: OOM kills, throttling and pressure, per agent.

Every agent runs in its own scope under the agents slice with
``OOMPolicy=continue``, so the kernel's OOM killer kills one process and
systemd records nothing (FIELD-NOTES, "Scopes and OOMPolicy"). The
:class:`Monitor` turns the cgroup and /proc files into events:

- :class:`OomKill` as soon as a ``memory.events`` ``oom_kill`` counter moves
  (inotify, never a poll), naming the victim and its agent;
- :class:`Throttled` when a MemoryHigh holds agents in
  ``mem_cgroup_handle_over_high``, with the command that lifts it;
- :class:`Pressure` at most once per window while memory is short, with a
  :class:`MemoryReport` saying which processes (agents or not) hold it;
- :class:`AgentExited` and :class:`LimitFound` for context.

How it stays cheap. A *sample* reads the slice's files, then one directory
walk of its scopes reading three files each (``memory.current``,
``memory.events``, ``cgroup.procs``: :func:`scan_slice_counters`): O(agents),
never a pass over the host. ``memory.stat``, ``memory.peak`` and the
scopes' ``memory.pressure`` are report data, read only for a report. A
scope's processes are sized (``statm``) only when its ``memory.current``
moved by more than :data:`RSS_SLACK` or 2% since they last were, when its
``oom_kill`` counter moved or a kill awaits its victim, and at least every
:data:`FULL_PASS_EVERY` samples, so a victim's last-seen RSS is recent; a
pid not seen before is sized and named (``stat``) at once. Inotify watches
are synced only when the set of scopes changes. Samples run every
``interval`` seconds and, debounced, whenever inotify reports a change of
a watched ``memory.events`` or a scope appearing or vanishing, or a PSI
trigger fires. The host-wide /proc pass
(and ``smaps_rollup`` and ``cmdline`` for the top N) runs only when a
report is built. All reads run in a worker thread (``asyncio.to_thread``);
the loop only does bookkeeping.

How a kill is never missed nor counted twice. ``memory.events`` is
hierarchical and the kernel raises a counter in the cgroup first, then in
each ancestor (``memcg_memory_event`` in mm/memcontrol.c). A sample reads the
slice *before* its scopes, so every kill in the slice's count is already in
its scope's count, if that scope still exists. Kills are counted per scope
(new scopes start from 0, scopes present at start from their value then);
the slice's count, less the kills counted in scopes and the kills already
reported from the slice, is the number of kills whose scope vanished before
it could be read. Those are reported from the slice, with the agent of the
scope that just ended if exactly one did.

Naming the victim, best evidence first: the kernel's ``Killed process PID
(comm)`` line from ``/dev/kmsg`` (``source="kmsg"``), the launched child
that the fleet reaped with SIGKILL (``"reaped"``, via :meth:`Monitor.note_exit`),
else the largest process that left the scope since the last sample
(``"cgroup"``, :func:`oom_victims`). A victim still exiting is waited for
up to :data:`VICTIM_GRACE` seconds before the kill is reported without a name.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from inotify_simple import INotify, flags  # type: ignore[import-untyped]

from ._attribution import (
    KernelOomKill,
    PressureEvent,
    PressureSample,
    PressureWindow,
    SeenProcess,
    Throttle,
    counter_delta,
    detect_throttle,
    oom_victims,
    parse_oom_kill_line,
)
from ._cgroup import (
    _GONE_OR_UNSUPPORTED,
    CGROUP_ROOT,
    LimitHolder,
    MemoryEvents,
    _read_kernel_file,
    arm_psi_trigger,
    find_limit_holders,
    parse_memory_events,
    parse_pressure,
    read_cgroup_memory,
    read_scope_counters,
    scan_slice,
    scan_slice_counters,
)
from ._cgroup import Pressure as PsiPressure
from ._dicts import as_dict
from ._errors import AgentscopeError
from ._guard import Guard, GuardHandle, Protected
from ._guardpolicy import GuardConfig, GuardKill
from ._proc import (
    PROC_ROOT,
    MemInfo,
    ProcessInfo,
    SmapsRollup,
    host_pressure,
    read_meminfo,
    read_smaps_rollup,
    read_stat,
    read_statm_rss,
    top_processes,
)

__all__ = [
    "AgentExited",
    "AgentMemory",
    "Event",
    "LimitFound",
    "MemoryReport",
    "Monitor",
    "OomKill",
    "Pressure",
    "Throttled",
    "TopProcess",
    "build_report",
]

log = logging.getLogger("agentscope.monitor")

#: Wait this long after an inotify or PSI wake-up before sampling, so a burst
#: of changes (one kill raises the scope's and every ancestor's counter, each
#: notifying) is read once.
SETTLE = 0.05
#: Samples woken by events are at least this far apart (a throttled cgroup's
#: ``memory.events`` changes ~17 times a second: FIELD-NOTES).
MIN_GAP = 0.2
#: How long a counted kill waits for its victim to leave the scope (the
#: killed task may still be exiting when the counter moves).
VICTIM_GRACE = 1.0
#: Notes from the kernel log and from reaped children are kept this long.
NOTE_TTL = 120.0
#: A scope's processes are sized (``statm``) again when its memory.current
#: moved by more than this or 2% since they last were, and at least every
#: :data:`FULL_PASS_EVERY` samples, so a victim's last-seen RSS is recent
#: without a read per process per sample.
RSS_SLACK = 1 << 20
FULL_PASS_EVERY = 5

_Source = Literal["cgroup", "reaped", "kmsg"]


# ---------------------------------------------------------------------------
# Reports and events (plain data)


@dataclass(frozen=True, slots=True)
class AgentMemory:
    """One agent's scope at the time of a report (bytes; counters since the scope began).

    ``memory_peak`` is None on kernels before 5.19; ``processes`` counts the
    scope's own processes; ``oom_kills`` and ``high_events`` are the scope's
    ``memory.events`` ``oom_kill`` and ``high`` counters.
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return as_dict(self)


@dataclass(frozen=True, slots=True)
class TopProcess:
    """One of the host's largest processes; ``smaps`` None when unreadable (other user, gone)."""

    process: ProcessInfo
    smaps: SmapsRollup | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the :class:`ProcessInfo` fields, plus ``pss`` and ``swap``."""
        return {
            **self.process.to_dict(),
            "pss": None if self.smaps is None else self.smaps.pss,
            "swap": None if self.smaps is None else self.smaps.swap,
        }


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Who holds the memory: host figures, PSI, the agents, the largest processes.

    ``host`` is None only where /proc has no meminfo (a fake tree);
    ``host_pressure``/``slice_pressure`` None without PSI (or the slice gone).
    ``top`` lists the largest processes host-wide, largest first, with
    ``agent`` None for processes that belong to no agent of the fleet, so a
    report can say the biggest process is not an agent.
    """

    ts: float
    host: MemInfo | None
    host_pressure: PsiPressure | None
    slice_pressure: PsiPressure | None
    slice_memory_current: int | None
    agents: tuple[AgentMemory, ...]
    top: tuple[TopProcess, ...]

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
        }


@dataclass(frozen=True, slots=True)
class OomKill:
    """The OOM killer killed a process in the agents slice.

    ``source`` says how the victim is known: ``"kmsg"`` (the kernel log
    named it), ``"reaped"`` (the fleet reaped its launched child with
    SIGKILL) or ``"cgroup"`` (the largest process that left the scope, or
    nothing: ``pid`` and ``comm`` are then None). ``agent`` and ``unit`` are
    None when the kill was only visible in the slice's counter and the scope
    could not be told; ``agent`` alone is None for a scope that is not one
    of this fleet's. ``rss_last_seen`` is the victim's RSS at the last sample.
    """

    kind: ClassVar[str] = "oom_kill"
    ts: float
    agent: str | None
    unit: str | None
    pid: int | None
    comm: str | None
    rss_last_seen: int | None
    source: _Source

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {"kind": self.kind, **as_dict(self)}


@dataclass(frozen=True, slots=True)
class Throttled:
    """A MemoryHigh is throttling agents: their allocations sleep in the kernel.

    ``unit`` is the cgroup whose ``high`` counter rose by
    ``high_events_delta``; ``d_state_pids`` the agents' processes seen
    stalled in ``mem_cgroup_handle_over_high`` (may be empty: another user's
    wchan is hidden); ``limit_unit`` the nearest unit with MemoryHigh set,
    and ``fix`` the command that lifts it until reboot (None when no holder
    was found).
    """

    kind: ClassVar[str] = "throttled"
    ts: float
    unit: str
    high_events_delta: int
    d_state_pids: tuple[int, ...]
    limit_unit: str | None
    fix: str | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {"kind": self.kind, **as_dict(self)}


@dataclass(frozen=True, slots=True)
class Pressure:
    """Memory pressure crossed a threshold during a window.

    ``report`` was taken when the window opened (the first sample over a
    threshold); ``window`` holds the window's span and its worst sample.
    """

    kind: ClassVar[str] = "pressure"
    ts: float
    report: MemoryReport
    window: PressureEvent | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {"kind": self.kind, **as_dict(self)}


@dataclass(frozen=True, slots=True)
class AgentExited:
    """The fleet reaped an agent's launched child; ``status`` as Popen.returncode (-9: SIGKILL)."""

    kind: ClassVar[str] = "agent_exited"
    ts: float
    agent: str | None
    unit: str
    pid: int
    status: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {"kind": self.kind, **as_dict(self)}


@dataclass(frozen=True, slots=True)
class LimitFound:
    """A MemoryHigh or MemoryMax on the agents slice or an ancestor (reported once per value)."""

    kind: ClassVar[str] = "limit_found"
    ts: float
    unit: str
    limits: LimitHolder

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {
            "kind": self.kind,
            "ts": self.ts,
            "unit": self.unit,
            "limits": {"MemoryHigh": self.limits.high, "MemoryMax": self.limits.max},
            "path": str(self.limits.path),
        }


Event = OomKill | Throttled | Pressure | AgentExited | LimitFound | GuardKill


# ---------------------------------------------------------------------------
# Reports (blocking part, run in a worker thread)


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
) -> MemoryReport:
    ts = time.time()
    try:
        host: MemInfo | None = read_meminfo(proc_root)
    except FileNotFoundError:
        host = None  # not a procfs (a test tree without meminfo)
    slice_memory = read_cgroup_memory(slice_path)
    agents = []
    for unit, memory in scan_slice(slice_path).items():
        agent = unit_agent(unit)
        if agent is None:
            continue
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
            )
        )
    agents.sort(key=lambda a: (-a.memory_current, a.unit))
    biggest = top_processes(top, proc_root, _agent_of_cgroup(slice_path.name, unit_agent))
    return MemoryReport(
        ts=ts,
        host=host,
        host_pressure=host_pressure(proc_root),
        slice_pressure=None if slice_memory is None else slice_memory.pressure,
        slice_memory_current=None if slice_memory is None else slice_memory.current,
        agents=tuple(agents),
        top=tuple(TopProcess(p, read_smaps_rollup(p.pid, proc_root)) for p in biggest),
    )


async def build_report(
    slice_path: Path,
    unit_agent: Callable[[str], str | None],
    *,
    top: int = 10,
    cgroup_root: Path = CGROUP_ROOT,
    proc_root: Path = PROC_ROOT,
) -> MemoryReport:
    """Take a :class:`MemoryReport` now, without a running :class:`Monitor`.

    ``slice_path`` is the agents slice's cgroup directory; ``unit_agent``
    maps a scope's unit name to its agent (None: not an agent of this fleet).
    The host-wide /proc pass runs in a worker thread. ``cgroup_root`` is
    accepted for symmetry with :class:`Monitor` (the slice path is absolute).

    Raises:
        OSError: a failure other than processes or cgroups vanishing.
        ValueError: a kernel file not in its documented format.
    """
    del cgroup_root
    return await asyncio.to_thread(_build_report_sync, slice_path, unit_agent, top, proc_root)


# ---------------------------------------------------------------------------
# Sampling (blocking part, run in a worker thread)


@dataclass(frozen=True, slots=True)
class _ScopePlan:
    """What the worker needs to know of a scope from earlier samples (loop thread builds it)."""

    seen: Mapping[int, SeenProcess]  # as last sampled
    pass_current: int  # memory.current at the last per-process pass
    oom_kill: int  # the last counter read
    force: bool  # read every process's statm this time
    pending: bool = False  # kills wait for their victims: tell the dying from the living
    # First seen last time: named again once, in case that was between a fork and its exec.
    recheck: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class _ScopeSample:
    current: int
    events: MemoryEvents
    procs: dict[int, SeenProcess]  # live processes (RSS > 0) by pid
    passed: bool  # every process's statm was read (else unchanged ones kept their last RSS)


@dataclass(frozen=True, slots=True)
class _Sample:
    slice_events: MemoryEvents | None  # None: the slice is gone
    slice_pressure: PsiPressure | None
    scopes: dict[str, _ScopeSample]
    ancestors: tuple[tuple[Path, MemoryEvents], ...]  # nearest first
    limits: tuple[LimitHolder, ...]
    meminfo: MemInfo | None
    host_pressure: PsiPressure | None
    watches: dict[Path, int] | None  # None: the same scopes as before, watches unchanged


_DIR_MASK = flags.CREATE | flags.DELETE | flags.ONLYDIR
_FILE_MASK = flags.MODIFY


def _ancestors(slice_path: Path, cgroup_root: Path) -> list[Path]:
    """The cgroups above the slice, nearest first, up to (not including) the root."""
    if not slice_path.is_relative_to(cgroup_root):
        return []
    result = []
    current = slice_path.parent
    while current != cgroup_root and current.is_relative_to(cgroup_root):
        result.append(current)
        current = current.parent
    return result


_enospc_logged = False  # an ENOSPC from inotify was logged (once is enough)


_MAX_THROTTLED = 1024  # units whose throttling the monitor remembers at once
_MAX_THROTTLED_PIDS = 64  # pids one throttled event names


def _sync_watches(
    inotify: INotify | None, watches: Mapping[Path, int], wanted: Mapping[Path, int]
) -> dict[Path, int]:
    """Add and remove inotify watches so that exactly ``wanted`` (path -> mask) is watched."""
    if inotify is None:
        return {}
    result = {p: wd for p, wd in watches.items() if p in wanted}
    for path, wd in watches.items():
        if path not in wanted:
            # EINVAL: the kernel already dropped it (the file was removed).
            with contextlib.suppress(OSError):
                inotify.rm_watch(wd)
    for path, mask in wanted.items():
        if path in result:
            continue
        try:
            result[path] = inotify.add_watch(path, mask)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                continue  # vanished since the listing
            if exc.errno == errno.ENOSPC:
                # Once per process: the same paths fail again at every sync.
                global _enospc_logged
                level = logging.DEBUG if _enospc_logged else logging.WARNING
                _enospc_logged = True
                log.log(
                    level,
                    "cannot watch %s: fs.inotify.max_user_watches reached; kills there are "
                    "seen from the slice's counter only (said once)",
                    path,
                )
                continue
            raise
    return result


def _moved(current: int, before: int) -> bool:
    """memory.current moved enough since the last per-process pass to read them again."""
    return abs(current - before) > max(RSS_SLACK, before // 50)


def _collect(
    slice_path: Path,
    cgroup_root: Path,
    proc_root: Path,
    plans: Mapping[str, _ScopePlan],
    inotify: INotify | None,
    watches: Mapping[Path, int],
    watched: frozenset[str] | None,
) -> _Sample:
    """One sample: the slice first, then its scopes (the order the kill count relies on).

    Per scope, ``memory.current``, ``memory.events`` and ``cgroup.procs``
    every time; ``statm`` of its processes only when its plan says so, its
    ``memory.current`` moved (:func:`_moved`) or its ``oom_kill`` counter did,
    and otherwise only for pids not seen before (``stat`` too, once per pid
    while it stays listed). ``watched`` names the scopes ``watches`` were
    set for; the watches are synced (and returned) only when the scopes
    found differ.
    """
    slice_counters = read_scope_counters(slice_path)
    slice_pressure = None
    if slice_counters is not None:
        data = _read_kernel_file(slice_path / "memory.pressure", _GONE_OR_UNSUPPORTED)
        slice_pressure = None if data is None else parse_pressure(data)
    scopes: dict[str, _ScopeSample] = {}
    for unit, counters in scan_slice_counters(slice_path).items():
        plan = plans.get(unit)
        seen: Mapping[int, SeenProcess] = {} if plan is None else plan.seen
        counted = plan is not None and plan.oom_kill != counters.events.oom_kill
        passed = (
            plan is None or plan.force or counted or _moved(counters.current, plan.pass_current)
        )
        # A kill is counted now or still waits for its victim: a victim that
        # is still listed while it dies counts as gone, so it can be named.
        killing = plan is not None and (plan.pending or counted)
        procs: dict[int, SeenProcess] = {}
        for pid in counters.pids:
            last = seen.get(pid)
            recheck = plan is not None and pid in plan.recheck
            if last is not None and not passed and not recheck:
                procs[pid] = last
                continue
            rss = read_statm_rss(pid, proc_root)
            if not rss:  # None: gone; 0: a zombie, as good as gone
                continue
            if last is None or killing or recheck:
                stat = read_stat(pid, proc_root)
                if stat is None or (killing and stat.dying):
                    continue
                if last is None or last.comm != stat.comm:
                    procs[pid] = SeenProcess(pid, stat.start_time, stat.comm, rss)
                    continue
            procs[pid] = (
                last if last.rss == rss else SeenProcess(pid, last.start_time, last.comm, rss)
            )
        scopes[unit] = _ScopeSample(counters.current, counters.events, procs, passed)
    ancestors = []
    for path in _ancestors(slice_path, cgroup_root):
        data = _read_kernel_file(path / "memory.events")
        if data is not None:
            ancestors.append((path, parse_memory_events(data)))
    try:
        meminfo: MemInfo | None = read_meminfo(proc_root)
    except FileNotFoundError:
        meminfo = None  # not a procfs (a test tree without meminfo)
    synced = None
    if watched is None or scopes.keys() != watched:
        wanted: dict[Path, int] = {
            slice_path: _DIR_MASK,
            slice_path / "memory.events": _FILE_MASK,
        }
        wanted.update((slice_path / unit / "memory.events", _FILE_MASK) for unit in scopes)
        synced = _sync_watches(inotify, watches, wanted)
    return _Sample(
        slice_events=None if slice_counters is None else slice_counters.events,
        slice_pressure=slice_pressure,
        scopes=scopes,
        ancestors=tuple(ancestors),
        limits=find_limit_holders(cgroup_root, slice_path),
        meminfo=meminfo,
        host_pressure=host_pressure(proc_root),
        watches=synced,
    )


@dataclass(frozen=True, slots=True)
class _ThrottleCandidate:
    path: Path
    previous: MemoryEvents | None
    current: MemoryEvents
    pids: tuple[int, ...]
    needs_stalled: bool  # an ancestor's rise may be a sibling's: count it only if agents stall


def _detect_throttles(
    candidates: Iterable[_ThrottleCandidate], cgroup_root: Path, proc_root: Path
) -> list[Throttle]:
    found = []
    for c in candidates:
        throttle = detect_throttle(
            c.path, c.previous, c.current, c.pids, cgroup_root=cgroup_root, proc_root=proc_root
        )
        if throttle is not None and (throttle.pids or not c.needs_stalled):
            found.append(throttle)
    return found


def _arm_psi(paths: Iterable[Path]) -> tuple[select.epoll, list[int]] | None:
    """Open PSI triggers on ``paths`` and an epoll watching them for EPOLLPRI.

    asyncio's add_reader cannot wait for POLLPRI, but an epoll fd is itself
    readable when one of its fds is ready, so the loop watches the epoll fd.
    None when no trigger could be set (no PSI, or not permitted).
    """
    fds = [fd for fd in map(arm_psi_trigger, paths) if fd is not None]
    if not fds:
        return None
    poller = select.epoll()
    for fd in fds:
        poller.register(fd, select.EPOLLPRI)
    return poller, fds


def _parse_oom_task_line(line: str) -> tuple[int, str] | None:
    """(pid, task_memcg) from the kernel's ``oom-kill:constraint=...`` summary line.

    mm/oom_kill.c (dump_oom_summary, Linux 4.19+) prints it right before
    ``Killed process``: ``oom-kill:constraint=CONSTRAINT_MEMCG,...,
    oom_memcg=/a.slice/x.scope,task_memcg=/a.slice/x.scope,task=python3,pid=1234,uid=0``.
    """
    _, sep, rest = line.partition("oom-kill:")
    if not sep:
        return None
    fields = dict(item.partition("=")[::2] for item in rest.strip().split(","))
    memcg, pid = fields.get("task_memcg"), fields.get("pid", "")
    if memcg is None or not pid.isdigit():
        return None
    return int(pid), memcg


def _open_kmsg(path: Path) -> int | None:
    """Open the kernel log for non-blocking reads from its current end; None when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # EPERM/EACCES with kernel.dmesg_restrict=1 for non-root: kills are
        # then named from the cgroup and the reaped child only.
        log.debug("kernel log %s not readable: %s", path, exc)
        return None
    # /dev/kmsg: SEEK_END skips the backlog (Documentation/ABI/testing/dev-kmsg).
    with contextlib.suppress(OSError):
        os.lseek(fd, 0, os.SEEK_END)
    return fd


# ---------------------------------------------------------------------------
# The monitor


@dataclass(slots=True)
class _ScopeState:
    """What the monitor remembers of one scope between samples (loop thread only)."""

    unit: str
    agent: str | None
    oom_kill: int
    high: int
    events: MemoryEvents | None = None
    seen: dict[int, SeenProcess] = field(default_factory=dict)
    pending: int = 0  # kills counted whose victim is not named yet
    pending_since: float = 0.0
    pending_seen: dict[int, SeenProcess] = field(default_factory=dict)
    pass_current: int = 0  # memory.current when its processes were last all sized
    pass_tick: int = 0  # ... at that sample (Monitor._tick)
    new: frozenset[int] = frozenset()  # pids first seen in the last sample


class Monitor:
    """Watch the agents slice for OOM kills, throttling and memory pressure.

    Use it as ``async with Monitor(...) as monitor`` and iterate it for
    events, or pass ``on_event``. One consumer should iterate; events are
    buffered (the oldest dropped past 10,000) when nobody does. All reads
    run in a worker thread; a failed sample is logged and the next one runs.

    ``slice_path`` is the agents slice's cgroup directory, ``unit_agent``
    maps a scope's unit name to its agent (None: not this fleet's; its kills
    are still reported, with ``agent=None``). ``pressure_some_avg10``
    (percent) and ``available_fraction`` (of MemTotal) are the pressure
    thresholds; ``pressure_window`` seconds bounds :class:`Pressure` events
    (and repeated :class:`Throttled` events for one limit) to one per window.
    ``kmsg=None`` skips the kernel log. ``manager`` ("auto", "system",
    "user") picks the ``systemctl`` of a throttle's fix: "auto" adds
    ``--user`` for limits held by units below a ``user@UID.service``.
    ``psi_triggers`` None arms PSI triggers only on the real /proc and
    cgroupfs (a trigger is a write, which a test tree must not receive).
    ``guard`` (True, or a :class:`GuardConfig`) runs the memory guard in
    its own thread while the monitor runs (docs/guard.md): its kills come
    as :class:`GuardKill` events; ``guard_protect`` returns the pids and
    scope units it must never kill (the process running it is never
    killed anyway).

    Example::

        async with Monitor(slice_path=path, unit_agent=agent_of) as monitor:
            async for event in monitor:
                print(event.to_dict())

    Raises:
        AgentscopeError: :meth:`start` on a monitor that was started before.
        ValueError: bad thresholds or interval.
    """

    def __init__(
        self,
        *,
        slice_path: Path,
        unit_agent: Callable[[str], str | None],
        interval: float = 2.0,
        top: int = 10,
        pressure_some_avg10: float = 10.0,
        available_fraction: float = 0.10,
        pressure_window: float = 30.0,
        cgroup_root: Path = CGROUP_ROOT,
        proc_root: Path = PROC_ROOT,
        kmsg: Path | None = Path("/dev/kmsg"),
        on_event: Callable[[Event], None] | None = None,
        manager: str = "auto",
        psi_triggers: bool | None = None,
        guard: bool | GuardConfig = False,
        guard_protect: Protected | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        if manager not in ("auto", "system", "user"):
            raise ValueError(f"manager must be 'auto', 'system' or 'user', not {manager!r}")
        self.slice_path = Path(slice_path)
        self.unit_agent = unit_agent
        self.interval = interval
        self.top = top
        self.cgroup_root = Path(cgroup_root)
        self.proc_root = Path(proc_root)
        self.kmsg = kmsg
        self.manager = manager
        self.on_event = on_event
        self.pressure_window = pressure_window
        self._window = PressureWindow(
            pressure_window,
            some_avg10_threshold=pressure_some_avg10,
            available_threshold=available_fraction,
        )
        if psi_triggers is None:
            psi_triggers = self.proc_root == PROC_ROOT and self.cgroup_root == CGROUP_ROOT
        self._psi_wanted = psi_triggers
        if guard is True:
            guard = GuardConfig()
        if guard is not False and not isinstance(guard, GuardConfig):
            raise ValueError(f"guard must be True, False or a GuardConfig, not {guard!r}")
        self.guard_config: GuardConfig | None = guard or None
        self._guard_protect = guard_protect
        #: The running guard (None without one, or before start).
        self.guard: GuardHandle | None = None
        self._guard_killed: set[int] = set()  # pids the guard killed: not OOM victims
        self._state = "new"
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._queue_limit = 10_000
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._wake_handle: asyncio.TimerHandle | None = None
        self._last_sample = 0.0
        # Counting state (loop thread only).
        self._first = True
        self._scopes: dict[str, _ScopeState] = {}
        self._slice_events: MemoryEvents | None = None
        self._ancestor_events: dict[Path, MemoryEvents] = {}
        self._slice_kills = 0  # kills counted in the slice's counter since start
        self._scope_kills = 0  # ... in scopes' counters
        self._slice_only_kills = 0  # ... reported from the slice alone
        self._kernel_kills: dict[int, tuple[float, KernelOomKill]] = {}
        # pid -> the cgroup the kernel's "oom-kill:...,task_memcg=" line named
        self._kernel_memcg: dict[int, str] = {}
        # unit -> pid -> (when reaped, comm known from the launch or None)
        self._reaped: dict[str, dict[int, tuple[float, str | None]]] = {}
        self._created: set[str] = set()
        self._deleted: set[str] = set()
        self._limits_seen: set[tuple[str, int | None, int | None]] = set()
        self._throttle_next: dict[tuple[str, str | None], float] = {}
        self._throttle_acc: dict[tuple[str, str | None], tuple[int, set[int]]] = {}
        self._window_report: MemoryReport | None = None
        # Kernel handles.
        self._inotify: INotify | None = None
        self._watches: dict[Path, int] = {}
        self._watched: frozenset[str] | None = None  # the scopes _watches were set for
        self._tick = 0  # samples applied
        self._kmsg_fd: int | None = None
        self._kmsg_rest = b""
        self._psi: tuple[select.epoll, list[int]] | None = None
        #: Samples taken and samples that failed, for health checks.
        self.samples = 0
        self.failures = 0
        #: Failed samples in a row; 0 after a good one (see ``healthy``).
        self.consecutive_failures = 0

    # -- lifecycle ------------------------------------------------------

    async def __aenter__(self) -> Monitor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Take the baseline sample, set the watches, and start monitoring.

        Returns once the baseline is taken: kills and events from then on
        are reported, none from before.

        Raises:
            AgentscopeError: the monitor was started before.
            OSError: inotify is unavailable (``fs.inotify.max_user_instances``).
        """
        if self._state != "new":
            raise AgentscopeError(
                f"this Monitor is {self._state}; create a new Monitor to watch again"
            )
        self._state = "running"
        loop = self._loop = asyncio.get_running_loop()
        self._inotify = INotify(nonblocking=True)
        loop.add_reader(self._inotify.fileno(), self._on_inotify)
        if self.kmsg is not None:
            self._kmsg_fd = await asyncio.to_thread(_open_kmsg, self.kmsg)
            if self._kmsg_fd is not None:
                try:
                    loop.add_reader(self._kmsg_fd, self._on_kmsg)
                except (OSError, ValueError) as exc:  # e.g. a regular file: epoll refuses it
                    log.debug("cannot poll the kernel log %s: %s", self.kmsg, exc)
                    os.close(self._kmsg_fd)
                    self._kmsg_fd = None
        if self._psi_wanted:
            paths = [self.proc_root / "pressure" / "memory", self.slice_path / "memory.pressure"]
            self._psi = await asyncio.to_thread(_arm_psi, paths)
            if self._psi is not None:
                loop.add_reader(self._psi[0].fileno(), self._on_psi)
        await self._sample_logged()
        if self.guard_config is not None:
            await self._start_guard(loop, self.guard_config)
        self._task = loop.create_task(self._run(), name="agentscope-monitor")

    async def _start_guard(self, loop: asyncio.AbstractEventLoop, config: GuardConfig) -> None:
        def deliver(event: GuardKill) -> None:
            # From the guard's thread. A stalled loop runs it when it wakes: the
            # kill is queued, never lost; a closed loop cannot take it any more.
            try:
                loop.call_soon_threadsafe(self._emit_guard_kill, event)
            except RuntimeError:
                log.warning("guard kill after the monitor's loop closed: %r", event)

        protected = self._guard_protect or (lambda: ((), ()))
        if config.process:
            from ._guardproc import GuardChild

            self.guard = GuardChild(
                config,
                self.slice_path,
                on_kill=deliver,
                unit_agent=self.unit_agent,
                protected=protected,
                proc_root=self.proc_root,
            )
        else:
            self.guard = Guard(
                config,
                self.slice_path,
                on_kill=deliver,
                unit_agent=self.unit_agent,
                protected=protected,
                proc_root=self.proc_root,
                psi_trigger=self._psi_wanted,
            )
        # mlockall, or spawning the guard process, are not for the loop's thread.
        await asyncio.to_thread(self.guard.start)

    def _emit_guard_kill(self, event: GuardKill) -> None:
        self._guard_killed.add(event.pid)
        self._emit(event)

    async def aclose(self) -> None:
        """Stop monitoring, report a pressure window still open, end the event iterators."""
        if self._state == "closed":
            return
        was_running = self._state == "running"
        self._state = "closed"
        if self.guard is not None:
            await asyncio.to_thread(self.guard.stop)
            # Kills it delivered while stopping are in the loop's queue: run them.
            await asyncio.sleep(0)
        if self._wake_handle is not None:
            self._wake_handle.cancel()
            self._wake_handle = None
        if self._task is not None:
            # Let the sample in flight finish (its thread uses the inotify fd).
            self._wake.set()
            await self._task
            self._task = None
        if was_running:
            await self._flush_pressure()
        loop = self._loop
        if self._inotify is not None:
            if loop is not None:
                loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
        if self._kmsg_fd is not None:
            if loop is not None:
                loop.remove_reader(self._kmsg_fd)
            os.close(self._kmsg_fd)
            self._kmsg_fd = None
        if self._psi is not None:
            poller, fds = self._psi
            if loop is not None:
                loop.remove_reader(poller.fileno())
            poller.close()
            for fd in fds:
                os.close(fd)
            self._psi = None
        self._queue.put_nowait(None)

    @property
    def healthy(self) -> bool:
        """False once 3 samples in a row failed (what a health check should report)."""
        return self.consecutive_failures < 3

    def __aiter__(self) -> AsyncIterator[Event]:
        """Events as they happen, until the monitor is closed.

        Raises:
            AgentscopeError: the monitor was never started (it would wait forever).
        """
        if self._state == "new":
            raise AgentscopeError(
                "the monitor is not started: use 'async with fleet.monitor() as m: "
                "async for event in m' (or 'await m.start()' first)"
            )
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while True:
            item = await self._queue.get()
            if item is None:
                self._queue.put_nowait(None)  # end the other iterators too
                return
            yield item

    async def report(self, top: int | None = None) -> MemoryReport:
        """Take a :class:`MemoryReport` now (works before start and after close).

        Raises:
            OSError: a failure other than processes or cgroups vanishing.
            ValueError: a kernel file not in its documented format.
        """
        return await asyncio.to_thread(
            _build_report_sync,
            self.slice_path,
            self.unit_agent,
            self.top if top is None else top,
            self.proc_root,
        )

    def note_exit(
        self, unit: str, pid: int, returncode: int | None, comm: str | None = None
    ) -> None:
        """Tell the monitor that the fleet reaped the launched child ``pid`` of ``unit``.

        Emits :class:`AgentExited`; a SIGKILL exit (``returncode == -9``)
        names the victim of an OOM kill counted in that scope. ``comm`` is
        the child's name as the launcher knows it (see :func:`exec_comm`),
        used when no sample saw the child. Call it from the event loop's
        thread.
        """
        now = time.time()
        if returncode == -signal.SIGKILL and pid not in self._guard_killed:
            self._reaped.setdefault(unit, {})[pid] = (now, comm)
        self._emit(AgentExited(now, self.unit_agent(unit), unit, pid, returncode))

    # -- event plumbing ---------------------------------------------------

    def _emit(self, event: Event) -> None:
        if self._queue.qsize() >= self._queue_limit:
            dropped = self._queue.get_nowait()
            log.warning("monitor event queue full; dropped %r", dropped)
        self._queue.put_nowait(event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                # The callback is the caller's code: its bug must not stop the monitor.
                log.exception("on_event callback failed for %r", event)

    def _wake_soon(self) -> None:
        """Sample shortly (debounced): something changed."""
        if self._wake_handle is not None or self._loop is None or self._state != "running":
            return
        loop = self._loop
        delay = max(SETTLE, self._last_sample + MIN_GAP - loop.time())
        self._wake_handle = loop.call_later(delay, self._fire_wake)

    def _fire_wake(self) -> None:
        self._wake_handle = None
        self._wake.set()

    def _on_inotify(self) -> None:
        assert self._inotify is not None
        try:
            events = self._inotify.read(timeout=0)
        except BlockingIOError:
            return
        slice_wd = self._watches.get(self.slice_path)
        for event in events:
            if event.wd == slice_wd and event.name.endswith(".scope"):
                if event.mask & flags.CREATE:
                    self._created.add(event.name)
                if event.mask & flags.DELETE:
                    self._deleted.add(event.name)
        # Any change, or a queue overflow (IN_Q_OVERFLOW), is followed by a
        # full sample, so nothing depends on reading every event.
        if events:
            self._wake_soon()

    def _on_kmsg(self) -> None:
        fd = self._kmsg_fd
        assert fd is not None
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten before we read them
            except OSError as exc:
                log.debug("kernel log read failed, no longer reading it: %s", exc)
                chunk = b""
            if not chunk:  # EOF (a pipe in tests) or error: stop watching
                assert self._loop is not None
                self._loop.remove_reader(fd)
                os.close(fd)
                self._kmsg_fd = None
                return
            self._kmsg_lines(chunk)

    def _kmsg_lines(self, chunk: bytes) -> None:
        # /dev/kmsg gives one record per read: "prio,seq,usec,flags;message\n"
        # followed by " KEY=value" continuation lines.
        data = self._kmsg_rest + chunk
        lines = data.split(b"\n")
        self._kmsg_rest = lines.pop()
        now = time.time()
        found = False
        for raw in lines:
            if raw.startswith(b" "):
                continue
            _, sep, message = raw.partition(b";")
            text = (message if sep else raw).decode("utf-8", "replace")
            task = _parse_oom_task_line(text)
            if task is not None:
                self._kernel_memcg[task[0]] = task[1]
                continue
            kill = parse_oom_kill_line(text)
            if kill is not None:
                self._kernel_kills[kill.pid] = (now, kill)
                found = True
        if found:
            self._wake_soon()

    def _on_psi(self) -> None:
        assert self._psi is not None
        poller, fds = self._psi
        for fd, mask in poller.poll(0):
            if mask & select.EPOLLERR:  # the cgroup was removed: its trigger is dead
                poller.unregister(fd)
                fds.remove(fd)
                os.close(fd)
        self._wake_soon()

    # -- the sampling loop ------------------------------------------------

    async def _run(self) -> None:
        assert self._loop is not None
        while self._state == "running":
            timeout = self.interval
            if any(s.pending for s in self._scopes.values()):
                timeout = min(timeout, MIN_GAP)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            if self._state != "running":
                return
            await self._sample_logged()

    async def _sample_logged(self) -> None:
        assert self._loop is not None
        self._last_sample = self._loop.time()
        try:
            await self._sample()
        except Exception:
            # A monitor must outlive one bad sample (a file in an unexpected
            # state, a reader bug): count it, log it, sample again next tick.
            self.failures += 1
            self.consecutive_failures += 1
            log.exception("monitor sample failed; retrying in %.1f s", self.interval)
        else:
            self.samples += 1
            self.consecutive_failures = 0

    async def _sample(self) -> None:
        tick = self._tick
        plans = {
            unit: _ScopePlan(
                s.seen,
                s.pass_current,
                s.oom_kill,
                # A kill waiting for its victim: size every process, so one
                # that is exiting (RSS 0) counts as gone as soon as it is.
                s.pending > 0 or tick - s.pass_tick >= FULL_PASS_EVERY,
                s.pending > 0,
                s.new,
            )
            for unit, s in self._scopes.items()
        }
        sample = await asyncio.to_thread(
            _collect,
            self.slice_path,
            self.cgroup_root,
            self.proc_root,
            plans,
            self._inotify,
            self._watches,
            self._watched,
        )
        if sample.watches is not None:
            self._watches = sample.watches
            self._watched = frozenset(sample.scopes)
        now = time.time()
        candidates = self._count(sample, now)
        self._first = False
        self._tick = tick + 1
        if candidates:
            throttles = await asyncio.to_thread(
                _detect_throttles, candidates, self.cgroup_root, self.proc_root
            )
            self._report_throttles(throttles, now)
        await self._pressure(sample)

    def _count(self, sample: _Sample, now: float) -> list[_ThrottleCandidate]:
        """Apply one sample: kills, limits; returns the cgroups to check for throttling."""
        first = self._first
        self._prune_notes(now)
        # The slice, read first.
        slice_prev = self._slice_events
        slice_high_delta = 0
        if sample.slice_events is not None:
            events = sample.slice_events
            if not first:
                prev_kills = 0 if slice_prev is None else slice_prev.oom_kill
                self._slice_kills += counter_delta(prev_kills, events.oom_kill)
                prev_high = 0 if slice_prev is None else slice_prev.high
                slice_high_delta = counter_delta(prev_high, events.high)
            self._slice_events = events
        else:
            # Gone: a slice that comes back is a new cgroup, counting from 0.
            self._slice_events = None
        # Its scopes.
        candidates: list[_ThrottleCandidate] = []
        scope_high_total = 0
        all_pids: list[int] = []
        for unit, scope in sample.scopes.items():
            events = scope.events
            state = self._scopes.get(unit)
            if state is None:
                # Present at start: counted from now. Appeared later: a new
                # cgroup, whose every kill and high event is news.
                base = events if first else None
                state = _ScopeState(
                    unit=unit,
                    agent=self.unit_agent(unit),
                    oom_kill=0 if base is None else base.oom_kill,
                    high=0 if base is None else base.high,
                    # Spread the scopes' periodic passes over the samples.
                    pass_tick=self._tick - len(self._scopes) % FULL_PASS_EVERY,
                )
                self._scopes[unit] = state
            if scope.passed:
                state.pass_current, state.pass_tick = scope.current, self._tick
            kills = counter_delta(state.oom_kill, events.oom_kill)
            high = counter_delta(state.high, events.high)
            if kills:
                if not state.pending:
                    state.pending_since = now
                state.pending += kills
                state.pending_seen.update(state.seen)
                self._scope_kills += kills
            if high:
                scope_high_total += high
                candidates.append(
                    _ThrottleCandidate(
                        self.slice_path / unit, state.events, events, tuple(scope.procs), False
                    )
                )
            state.oom_kill, state.high, state.events = events.oom_kill, events.high, events
            state.new = frozenset(scope.procs.keys() - state.seen.keys())
            state.seen = scope.procs
            all_pids.extend(scope.procs)
            if state.pending:
                alive = {pid: p.start_time for pid, p in scope.procs.items()}
                self._name_kills(state, alive, now)
        # Scopes that ended since the last sample.
        ended: dict[str, _ScopeState | None] = {}
        for unit in [u for u in self._scopes if u not in sample.scopes]:
            state = self._scopes.pop(unit)
            if state.pending:
                state.pending_seen.update(state.seen)
                self._name_kills(state, {}, now, final=True)
            ended[unit] = state
        for unit in (self._created | self._deleted) - sample.scopes.keys():
            ended.setdefault(unit, None)
        self._created.clear()
        self._deleted.clear()
        # Kills only the slice saw: their scope vanished before it was read.
        slice_only = self._slice_kills - self._scope_kills - self._slice_only_kills
        if slice_only > 0:
            self._slice_only_kills += slice_only
            self._report_slice_only(slice_only, ended, now)
        # Throttling: a rise not explained by the level below is this level's own.
        if sample.slice_events is not None and slice_high_delta > scope_high_total:
            candidates.append(
                _ThrottleCandidate(
                    self.slice_path,
                    slice_prev,
                    sample.slice_events,
                    tuple(all_pids),
                    False,
                )
            )
        below = slice_high_delta
        for path, events in sample.ancestors:
            prev = self._ancestor_events.get(path)
            self._ancestor_events[path] = events
            if first or prev is None:
                below = 0
                continue
            delta = counter_delta(prev.high, events.high)
            if delta > below and all_pids:
                candidates.append(_ThrottleCandidate(path, prev, events, tuple(all_pids), True))
            below = delta
        # Limits on the slice and above.
        for holder in sample.limits:
            key = (holder.unit, holder.high, holder.max)
            if key not in self._limits_seen:
                self._limits_seen.add(key)
                self._emit(LimitFound(now, holder.unit, holder))
        return candidates

    # -- naming victims ---------------------------------------------------

    def _prune_notes(self, now: float) -> None:
        for pid, (ts, _) in list(self._kernel_kills.items()):
            if now - ts > NOTE_TTL:
                del self._kernel_kills[pid]
                self._kernel_memcg.pop(pid, None)
        if len(self._kernel_memcg) > 4 * len(self._kernel_kills) + 64:
            self._kernel_memcg.clear()  # task lines whose "Killed process" line never came
        for unit, notes in list(self._reaped.items()):
            for pid, (ts, _) in list(notes.items()):
                if now - ts > NOTE_TTL:
                    del notes[pid]
            if not notes:
                del self._reaped[unit]

    def _victims(
        self,
        unit: str,
        seen: Mapping[int, SeenProcess],
        alive: Mapping[int, int],
        count: int,
    ) -> list[tuple[int, str | None, int | None, _Source]]:
        """Up to ``count`` victims in ``unit`` as (pid, comm, last RSS, source), best first."""
        found: list[tuple[int, str | None, int | None, _Source]] = []
        reaped = self._reaped.get(unit, {})
        for pid in list(self._kernel_kills):
            if len(found) >= count:
                break
            # A victim born and killed between two samples was never seen; the
            # kernel's own line then says which cgroup it was in.
            memcg = self._kernel_memcg.get(pid, "")
            if pid in seen or pid in reaped or memcg.endswith("/" + unit):
                _, kill = self._kernel_kills.pop(pid)
                self._kernel_memcg.pop(pid, None)
                reaped.pop(pid, None)
                last = seen.get(pid)
                found.append((pid, kill.comm, None if last is None else last.rss, "kmsg"))
        for pid in list(reaped):
            if len(found) >= count:
                break
            _, comm = reaped.pop(pid)
            last = seen.get(pid)
            # The launcher's word first: a sample may have seen the child in the
            # launch gate, before its exec, still named like its parent.
            found.append(
                (
                    pid,
                    comm if comm is not None or last is None else last.comm,
                    None if last is None else last.rss,
                    "reaped",
                )
            )
        named = {pid for pid, *_ in found}
        rest = {pid: p for pid, p in seen.items() if pid not in named}
        for p in oom_victims(rest, alive, count - len(found)):
            found.append((p.pid, p.comm, p.rss, "cgroup"))
        return found

    def _name_kills(
        self, state: _ScopeState, alive: Mapping[int, int], now: float, *, final: bool = False
    ) -> None:
        """Report the scope's pending kills whose victims are known (all of them once due)."""
        for pid, comm, rss, source in self._victims(
            state.unit, state.pending_seen, alive, state.pending
        ):
            state.pending -= 1
            state.pending_seen.pop(pid, None)
            self._emit(OomKill(now, state.agent, state.unit, pid, comm, rss, source))
        if state.pending and (final or now - state.pending_since >= VICTIM_GRACE):
            for _ in range(state.pending):
                self._emit(OomKill(now, state.agent, state.unit, None, None, None, "cgroup"))
            state.pending = 0
        if not state.pending:
            state.pending_seen.clear()

    def _report_slice_only(
        self, count: int, ended: Mapping[str, _ScopeState | None], now: float
    ) -> None:
        # A kernel log line or a reaped child can tie a kill to one of the
        # ended scopes even when several ended.
        for unit, state in ended.items():
            if count <= 0:
                break
            seen = {} if state is None else state.seen
            agent = self.unit_agent(unit) if state is None else state.agent
            for pid, comm, rss, source in self._victims(unit, seen, {}, count)[:count]:
                if source == "cgroup":
                    continue  # a guess: only when this is the one scope that ended (below)
                count -= 1
                self._emit(OomKill(now, agent, unit, pid, comm, rss, source))
        if count <= 0:
            return
        if len(ended) == 1:
            ((unit, state),) = ended.items()
            seen = {} if state is None else state.seen
            agent = self.unit_agent(unit) if state is None else state.agent
            victims = oom_victims(seen, {}, count)
            for p in victims:
                self._emit(OomKill(now, agent, unit, p.pid, p.comm, p.rss, "cgroup"))
            for _ in range(count - len(victims)):
                self._emit(OomKill(now, agent, unit, None, None, None, "cgroup"))
            return
        for _ in range(count):
            self._emit(OomKill(now, None, None, None, None, None, "cgroup"))

    # -- throttling -------------------------------------------------------

    def _fix(self, holder: LimitHolder) -> str:
        """The command that lifts the holder's MemoryHigh until reboot.

        Units below a ``user@UID.service`` belong to that user's manager
        (``--user``); the units above it, and all others, to the system's.
        """
        above = holder.path.parent.parts
        user = self.manager != "system" and any(
            part.startswith("user@") and part.endswith(".service") for part in above
        )
        manager = " --user" if user else ""
        return f"systemctl{manager} set-property --runtime {holder.unit} MemoryHigh=infinity"

    def _report_throttles(self, throttles: Iterable[Throttle], now: float) -> None:
        # Remember only units throttled within a window, at most _MAX_THROTTLED:
        # the state is as big as what is throttled now, not all it ever saw.
        for key, until in list(self._throttle_next.items()):
            if until <= now and key not in self._throttle_acc:
                del self._throttle_next[key]
        while len(self._throttle_next) > _MAX_THROTTLED:
            oldest = min(self._throttle_next, key=self._throttle_next.__getitem__)
            del self._throttle_next[oldest]
            self._throttle_acc.pop(oldest, None)
        for t in throttles:
            limit_unit = None if t.limit is None else t.limit.unit
            key = (t.cgroup.name, limit_unit)
            delta, pids = self._throttle_acc.pop(key, (0, set()))
            delta += t.high_delta
            pids.update(t.pids)
            if len(pids) > _MAX_THROTTLED_PIDS:
                pids = set(sorted(pids)[:_MAX_THROTTLED_PIDS])
            if now < self._throttle_next.get(key, 0.0):
                self._throttle_acc[key] = (delta, pids)  # reported with the next one
                continue
            self._throttle_next[key] = now + self.pressure_window
            fix = None if t.limit is None else self._fix(t.limit)
            self._emit(Throttled(now, t.cgroup.name, delta, tuple(sorted(pids)), limit_unit, fix))

    # -- pressure ---------------------------------------------------------

    async def _pressure(self, sample: _Sample) -> None:
        if sample.meminfo is None:
            return
        avg10 = 0.0 if sample.host_pressure is None else sample.host_pressure.some.avg10
        slice_psi = sample.slice_pressure
        if slice_psi is not None:
            avg10 = max(avg10, slice_psi.some.avg10)
        point = PressureSample(avg10, sample.meminfo.available_fraction)
        opened_report = self._window_report
        closed = self._window.add(point)
        if closed is not None:
            self._window_report = None
            report = opened_report if opened_report is not None else await self.report()
            self._emit(Pressure(time.time(), report, closed))
        if self._window.is_high(point) and self._window_report is None:
            self._window_report = await self.report()

    async def _flush_pressure(self) -> None:
        closed = self._window.flush()
        if closed is None:
            return
        report = self._window_report
        self._window_report = None
        if report is None:
            try:
                report = await self.report()
            except (OSError, ValueError):
                log.exception("no report for the last pressure window")
                return
        self._emit(Pressure(time.time(), report, closed))
