"""The monitor's reads of the kernel's files (blocking: run in a worker thread).

How it stays cheap. A *sample* (:func:`_collect`) reads the slice's files,
then one directory walk of its scopes reading three files each
(``memory.current``, ``memory.events``, ``cgroup.procs``:
:func:`scan_slice_counters`): O(agents), never a pass over the host.
``memory.stat``, ``memory.peak`` and the scopes' ``memory.pressure`` are
report data, read only for a report. A scope's processes are sized
(``statm``) only when its ``memory.current`` moved by more than
:data:`RSS_SLACK` or 2% since they last were, when its ``oom_kill`` counter
moved or a kill awaits its victim, and at least every
:data:`~agentscope_systemd._monitor._killcount.FULL_PASS_EVERY` samples (the counter's plan
says when), so a victim's last-seen RSS is recent; a pid not seen before is
sized and named (``stat``) at once. Inotify watches are synced only when
the set of scopes changes.

Here too: the throttle check of the cgroups a sample flagged
(:func:`_detect_throttles`), arming PSI triggers (:func:`_arm_psi`), and
opening and parsing the kernel log (:func:`_open_kmsg`,
:func:`_parse_oom_task_line`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from inotify_simple import INotify, flags  # type: ignore[import-untyped]

from .._kernel._cgroup import (
    _GONE_OR_UNSUPPORTED,
    LimitHolder,
    MemoryEvents,
    _read_kernel_file,
    arm_psi_trigger,
    find_limit_holders,
    parse_memory_events,
    parse_pressure,
    read_scope_counters,
    scan_slice_counters,
)
from .._kernel._cgroup import Pressure as PsiPressure
from .._kernel._proc import MemInfo, host_pressure, read_meminfo, read_stat, read_statm_rss
from ._attribution import SeenProcess, Throttle, detect_throttle, parse_oom_task_line
from ._escape import Escapee, find_escapes

__all__: list[str] = []  # private to the monitor

log = logging.getLogger("agentscope.monitor")

#: A scope's processes are sized (``statm``) again when its memory.current
#: moved by more than this or 2% since they last were, and at least every
#: :data:`FULL_PASS_EVERY` samples, so a victim's last-seen RSS is recent
#: without a read per process per sample.
RSS_SLACK = 1 << 20


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
    slice_own: MemoryEvents | None  # the slice's memory.events.local (None: gone)
    slice_pressure: PsiPressure | None
    scopes: dict[str, _ScopeSample]
    # The cgroups above the slice, nearest first, with their memory.events.local,
    # whose ``high`` counts only their own limit's events (memory.events also
    # counts those below, read at another moment of the sample).
    ancestors: tuple[tuple[Path, MemoryEvents], ...]
    limits: tuple[LimitHolder, ...]
    meminfo: MemInfo | None
    host_pressure: PsiPressure | None
    watches: dict[Path, int] | None  # None: the same scopes as before, watches unchanged
    escapes: tuple[Escapee, ...] | None = None  # None: no escape audit this time


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


def _read_own_events(path: Path) -> MemoryEvents | None:
    """The cgroup's ``memory.events.local`` (Linux 5.2+): the events of its own
    limits only. None when the cgroup is gone or the file is missing."""
    data = _read_kernel_file(path / "memory.events.local")
    return None if data is None else parse_memory_events(data)


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
    follow: tuple[Escapee, ...] | None = None,
) -> _Sample:
    """One sample: the slice first, then its scopes (the order the kill count relies on).

    Per scope, ``memory.current``, ``memory.events`` and ``cgroup.procs``
    every time; ``statm`` of its processes only when its plan says so, its
    ``memory.current`` moved (:func:`_moved`) or its ``oom_kill`` counter did,
    and otherwise only for pids not seen before (``stat`` too, once per pid
    while it stays listed). ``watched`` names the scopes ``watches`` were
    set for; the watches are synced (and returned) only when the scopes
    found differ. ``follow`` (the escapees known so far) asks for an escape
    audit (:func:`find_escapes`) over the scopes' processes.
    """
    slice_counters = read_scope_counters(slice_path)
    slice_own = _read_own_events(slice_path)
    slice_pressure = None
    if slice_counters is not None:
        data = _read_kernel_file(slice_path / "memory.pressure", _GONE_OR_UNSUPPORTED)
        slice_pressure = None if data is None else parse_pressure(data)
    scopes: dict[str, _ScopeSample] = {}
    listed = scan_slice_counters(slice_path)
    for unit, counters in listed.items():
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
        local = _read_own_events(path)
        if local is not None:
            ancestors.append((path, local))
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
    escapes = None
    if follow is not None:
        own = {unit: counters.pids for unit, counters in listed.items()}
        escapes = find_escapes(
            slice_path, own, follow=follow, cgroup_root=cgroup_root, proc_root=proc_root
        )
    return _Sample(
        slice_events=None if slice_counters is None else slice_counters.events,
        slice_own=slice_own,
        slice_pressure=slice_pressure,
        scopes=scopes,
        ancestors=tuple(ancestors),
        limits=find_limit_holders(cgroup_root, slice_path),
        meminfo=meminfo,
        host_pressure=host_pressure(proc_root),
        watches=synced,
        escapes=escapes,
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
    """(pid, task_memcg) from the kernel's ``oom-kill:`` line (:func:`parse_oom_task_line`)."""
    task = parse_oom_task_line(line)
    return None if task is None else (task.pid, task.memcg)


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
