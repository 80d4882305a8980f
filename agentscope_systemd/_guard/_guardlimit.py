"""The memory limits above the fleet: a container's, a slice's, a service's ``MemoryMax``.

``/proc/meminfo`` says nothing of a cgroup's limit (rfjakob/earlyoom#331):
in a 400 MiB container on a large host MemAvailable stays high while the
kernel's OOM killer acts inside the container, and with ``memory.oom.group``
1 (written by the kubelet on every container since Kubernetes 1.28,
kubernetes#117793) it kills all of the container at once, manager and
agents (issue #27: Podman exit 137, 8 s into a runaway). So the guard also
reads the limits of the cgroups its agents are charged to: the agents slice
and each of its ancestors, up to the root of the hierarchy it sees, which
in a container's cgroup namespace is the container's own cgroup
(Documentation/admin-guide/cgroup-v2.rst, "Namespace"). The manager's own
cgroup (``/proc/self/cgroup``) and its ancestors are read too: a limit over
the manager that its agents are not charged to (a harness service's
``MemoryMax`` on a systemd host, where agents live in their own slice) is
one no kill of an agent's process relieves, and the guard says so once.
In process mode (:mod:`._procscopes`) there is no slice: the agents are
process trees in the manager's own cgroup, charged where the manager is,
so the limits over the manager's cgroup are theirs (``shared``): in a
container, the container's own ``memory.max``; on a systemd host, the
``MemoryMax`` of the scope or service the harness runs in.

Under a limit, *available* is the limit less what reclaim cannot give back:
``memory.current`` less the page cache that is not shared memory (``file``
- ``shmem`` of ``memory.stat``) and reclaimable slab; its swap is what
``memory.swap.max`` still allows, within the host's free swap. The guard's
own thresholds apply to these as to the host's (:func:`._guardpolicy.limit_low`);
:class:`LimitWatch` gives the nearest limit at each reading, and wakes the
guard (inotify on ``memory.events``) when a limited cgroup reaches
``memory.high`` or ``memory.max``. The nearest limit's own
``memory.pressure`` (and, when its stall counter moved, the refault and
swap-out counters of its ``memory.stat``) come with it, so that the host's
PSI, thrash and "short and stalling" rules apply under the limit too: in a
container ``/proc/pressure/memory`` is the whole host's, calm while the
container thrashes at its limit with swap to spare.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._kernel._cgroup import (
    _GONE_OR_DENIED,
    CgroupCeiling,
    _read_kernel_file,
    cgroup_chain,
    parse_memory_events,
    parse_memory_stat,
    parse_pressure,
    read_ceiling,
)
from .._kernel._memsources import parse_vmstat_refaults
from .._kernel._proc import PROC_ROOT, read_cgroup
from ._guardpolicy import GuardConfig, HostReading

__all__ = ["LimitReading", "LimitWatch", "read_limit"]

log = logging.getLogger("agentscope.guard")

#: The limits of the chain are read again this often (``set-property`` may change them).
REFRESH_EVERY = 1.0
#: Within this factor of the memory threshold, ``memory.stat`` is read for what
#: reclaim would give back; farther, ``memory.current`` alone is enough.
NEAR_FACTOR = 1.5
#: At most this much of a ``memory.pressure`` is read (two lines of ~70 bytes).
PRESSURE_READ = 4096


@dataclass(frozen=True, slots=True)
class LimitReading:
    """One limited cgroup at one moment (bytes).

    ``path`` is the cgroup relative to the cgroup root the guard reads
    (``/``: the root itself, a container's own cgroup); ``kind`` the file
    that sets ``limit`` (``memory.max`` or ``memory.high``); ``available``
    what it may still take before the limit (page cache counted as
    reclaimable); ``swap_total``/``swap_free`` its swap (0: none).
    ``walls`` counts the times it reached its ``memory.high`` or
    ``memory.max`` (``memory.events``; None: not read, far from it), and
    ``at_wall`` says it did since the last reading, near its threshold.
    ``psi_full_avg10`` (%) and ``psi_full_total`` (µs) are its own
    ``memory.pressure`` ``full`` line, ``refaults`` and ``swap_outs``
    (pages) the counters of its ``memory.stat`` (None: not read, absent or
    unreadable).
    """

    path: str
    kind: str
    limit: int
    current: int
    available: int
    swap_total: int
    swap_free: int
    walls: int | None = None
    at_wall: bool = False
    psi_full_avg10: float | None = None
    psi_full_total: int | None = None
    refaults: int | None = None
    swap_outs: int | None = None

    @property
    def available_percent(self) -> float:
        """:attr:`available` as a percentage of the limit."""
        return 100.0 * self.available / self.limit if self.limit else 0.0

    @property
    def swap_free_percent(self) -> float:
        """:attr:`swap_free` as a percentage of :attr:`swap_total`; 0 without swap."""
        return 100.0 * self.swap_free / self.swap_total if self.swap_total > 0 else 0.0

    def margin(self, config: GuardConfig) -> float:
        """How far from the guard's thresholds (<= 0: over both); lower is nearer."""
        return max(
            (0.0 if self.at_wall else self.available_percent) - config.mem_available_percent,
            self.swap_free_percent - config.swap_free_percent,
        )


def _int_file(path: str) -> int | None:
    try:
        data = _read_kernel_file(path, _GONE_OR_DENIED)
    except OSError:
        return None
    value = None if data is None else data.strip()
    return int(value) if value is not None and value.isdigit() else None


def _walls(path: str) -> int | None:
    """``high`` + ``max`` of the cgroup's ``memory.events`` (None: unreadable)."""
    try:
        data = _read_kernel_file(path + "/memory.events", _GONE_OR_DENIED)
        if data is None:
            return None
        events = parse_memory_events(data)
    except (OSError, ValueError):
        return None
    return events.high + events.max


def _reclaimable(path: str) -> int:
    """Page cache that is not shared memory, and reclaimable slab (0: unreadable)."""
    try:
        data = _read_kernel_file(path + "/memory.stat", _GONE_OR_DENIED)
        if data is None:
            return 0
        fields = parse_memory_stat(data).fields
    except (OSError, ValueError):
        return 0
    cache = max(fields.get("file", 0) - fields.get("shmem", 0), 0)
    return cache + max(fields.get("slab_reclaimable", 0), 0)


def _paging(path: str) -> tuple[int | None, int | None]:
    """(refaults + swap-ins, swap-outs) of the cgroup's ``memory.stat``; None: not counted.

    ``memory.stat`` names its counters as ``/proc/vmstat`` does
    (``workingset_refault_anon``, ``pswpin``, ``pswpout``: the last two
    only on recent kernels; Documentation/admin-guide/cgroup-v2.rst).
    """
    try:
        data = _read_kernel_file(path + "/memory.stat", _GONE_OR_DENIED)
        if data is None:
            return None, None
        return parse_vmstat_refaults(data), parse_memory_stat(data).fields.get("pswpout")
    except (OSError, ValueError):
        return None, None


def read_limit(
    ceiling: CgroupCeiling,
    rel: str,
    host_swap: tuple[int, int],
    near_percent: float,
) -> LimitReading | None:
    """Read what is charged against ``ceiling`` now; None when the cgroup is gone.

    ``host_swap`` is the host's (SwapTotal, SwapFree): a cgroup's swap is
    never more than that. Page cache is counted as reclaimable only when
    ``memory.current`` leaves ``near_percent`` % of the limit or less
    (farther, one read of ``memory.current`` is all a reading costs).
    """
    limit = ceiling.limit
    if limit is None or limit <= 0:
        return None
    current = _int_file(ceiling.path + "/memory.current")
    if current is None:
        return None
    available = max(limit - current, 0)
    walls = None
    if 100.0 * available / limit <= near_percent:
        used = max(current - _reclaimable(ceiling.path), 0)
        available = min(max(limit - used, 0), limit)
        if 100.0 * available / limit <= near_percent:
            walls = _walls(ceiling.path)
    host_total, host_free = host_swap
    if host_total <= 0 or ceiling.swap_max == 0:
        total = free = 0
    elif ceiling.swap_max is None:
        total, free = host_total, host_free
    else:
        used_swap = _int_file(ceiling.path + "/memory.swap.current") or 0
        total = min(ceiling.swap_max, host_total)
        free = max(min(ceiling.swap_max - used_swap, host_free), 0)
    return LimitReading(rel, ceiling.kind, limit, current, available, total, free, walls)


class LimitWatch:
    """The limits above the agents slice, read at each of the guard's readings.

    :meth:`apply` puts the nearest limit into a :class:`HostReading`; the
    chain's limits are found again every :data:`REFRESH_EVERY` s. An
    inotify descriptor (:meth:`fileno`) becomes readable when a limited
    cgroup's ``memory.events`` changes (it reached ``memory.high`` or
    ``memory.max``: the kernel notifies at most every 10 ms per file), so a
    guard that sleeps in ``epoll`` wakes at the wall. Every read tolerates
    a cgroup that vanished or a file that is absent, unreadable or not in its
    format (it then counts as no limit). Close with :meth:`close`.
    ``shared`` (process mode): the agents share the cgroup of process
    ``pid`` (this one by default), whose limits are then theirs.
    """

    def __init__(
        self,
        cgroup_root: Path,
        slice_path: Path,
        proc_root: Path = PROC_ROOT,
        *,
        pid: int | None = None,
        notify: bool = True,
        shared: bool = False,
    ) -> None:
        self.root = os.fspath(cgroup_root).rstrip("/") or "/"
        try:
            own = read_cgroup(os.getpid() if pid is None else pid, proc_root)
        except OSError:
            own = None
        self.manager_chain = () if own is None else cgroup_chain(cgroup_root, own)
        # Process mode: the agents are charged where the manager is (its own
        # cgroup; unknown: the root, in a container its own cgroup).
        self.chain = (
            (self.manager_chain or cgroup_chain(cgroup_root, "/"))
            if shared
            else cgroup_chain(cgroup_root, slice_path)
        )
        self.ceilings: tuple[CgroupCeiling, ...] = ()
        #: Limits over the manager that its agents are not charged to.
        self.manager_only: tuple[CgroupCeiling, ...] = ()
        self._next = float("-inf")
        self._notify: Any = None  # an inotify_simple.INotify
        self._watches: dict[str, int] = {}
        # Each limited cgroup's memory.events high + max at the last near reading.
        self._walls: dict[str, int] = {}
        # Each limited cgroup's memory.pressure, kept open (one pread a reading).
        self._psi: dict[str, int] = {}
        # Each limited cgroup's last (PSI full total, refaults, swap-outs).
        self._paged: dict[str, tuple[int, int | None, int | None]] = {}
        if notify:
            try:
                from inotify_simple import INotify  # type: ignore[import-untyped]

                self._notify = INotify()
            except OSError as exc:  # no inotify instances left: poll only
                log.info("no inotify for the memory limits (%s): polling only", exc)

    def rel(self, path: str) -> str:
        """``path`` relative to the cgroup root, as ``/proc/PID/cgroup`` names it."""
        return path[len(self.root) :] or "/" if path.startswith(self.root) else path

    def refresh(self, now: float, *, force: bool = False) -> None:
        """Find the chain's limits again, unless done less than :data:`REFRESH_EVERY` s ago."""
        if not force and now < self._next:
            return
        self._next = now + REFRESH_EVERY
        ceilings = [c for p in self.chain if (c := read_ceiling(p)) is not None and c.limit]
        self.ceilings = tuple(ceilings)
        mine = set(self.chain)
        self.manager_only = tuple(
            c
            for p in self.manager_chain
            if p not in mine and (c := read_ceiling(p)) is not None and c.limit
        )
        self._rewatch()
        self._reopen()

    def _reopen(self) -> None:
        """Keep ``memory.pressure`` open for each limited cgroup, and only for those."""
        wanted = {c.path for c in self.ceilings}
        for path in [p for p in self._psi if p not in wanted]:
            os.close(self._psi.pop(path))
            self._paged.pop(path, None)
        for path in wanted - self._psi.keys():
            try:
                # O_NONBLOCK: as _read_kernel_file, a FIFO in a tree that is
                # not the kernel's never hangs the guard.
                flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
                self._psi[path] = os.open(path + "/memory.pressure", flags)
            except OSError:  # gone, no PSI (psi=0), not ours to read: no reading
                continue

    def _pressure(self, found: LimitReading, path: str) -> LimitReading:
        """``found`` with its cgroup's PSI ``full`` and paging counters (unchanged: none).

        One ``pread`` of the open ``memory.pressure``; ``memory.stat`` is
        read for the counters only when the stall counter moved (a cgroup
        that did not stall cannot thrash; the last counts stand, as
        :class:`~._guardpolicy.HostReader` keeps the host's). A file that
        went (the cgroup was removed: ENODEV), reads EOPNOTSUPP
        (``cgroup.pressure`` 0) or is not in its format is no reading; the
        file is opened again at the next :meth:`refresh` (within a second).
        """
        fd = self._psi.get(path)
        if fd is None:
            return found
        try:
            full = parse_pressure(os.pread(fd, PRESSURE_READ, 0)).full
        except OSError:
            os.close(self._psi.pop(path))
            self._paged.pop(path, None)
            return found
        except ValueError:
            return found
        if full is None:
            return found
        last = self._paged.get(path)
        if last is None or last[0] != full.total:
            refaults, swap_outs = _paging(path)
            if last is not None:
                # Not read this time (a failed read): the last count stands.
                refaults = last[1] if refaults is None else refaults
                swap_outs = last[2] if swap_outs is None else swap_outs
            last = (full.total, refaults, swap_outs)
            self._paged[path] = last
        return replace(
            found,
            psi_full_avg10=full.avg10,
            psi_full_total=full.total,
            refaults=last[1],
            swap_outs=last[2],
        )

    def _rewatch(self) -> None:
        notify = self._notify
        if notify is None:
            return
        from inotify_simple import flags

        wanted = {c.path for c in self.ceilings}
        for path in [p for p in self._watches if p not in wanted]:
            # A cgroup that went took its watch with it.
            with contextlib.suppress(OSError):
                notify.rm_watch(self._watches.pop(path))
        for path in wanted - self._watches.keys():
            try:
                self._watches[path] = notify.add_watch(path + "/memory.events", flags.MODIFY)
            except OSError:  # gone, or no such file (no memory controller): polled only
                continue

    def nearest(self, reading: HostReading, config: GuardConfig) -> LimitReading | None:
        """The limit nearest to exhaustion now (None: no limit above the agents)."""
        self.refresh(reading.ts)
        near = NEAR_FACTOR * config.mem_available_percent
        best: LimitReading | None = None
        best_path = ""
        for ceiling in self.ceilings:
            found = read_limit(
                ceiling, self.rel(ceiling.path), (reading.swap_total, reading.swap_free), near
            )
            if found is not None:
                # At the wall with little left that reclaim can give back: the
                # page cache counted as available is what the kernel is
                # reclaiming now, and its OOM killer comes next.
                last = self._walls.pop(ceiling.path, None)
                if found.walls is not None:
                    self._walls[ceiling.path] = found.walls
                    if last is not None and found.walls > last:
                        found = replace(found, at_wall=True)
            if found is not None and (best is None or found.margin(config) < best.margin(config)):
                best, best_path = found, ceiling.path
        return None if best is None else self._pressure(best, best_path)

    def apply(self, reading: HostReading, config: GuardConfig) -> HostReading:
        """``reading`` with the nearest limit's figures (unchanged without a limit)."""
        found = self.nearest(reading, config)
        if found is None:
            return reading
        return replace(
            reading,
            limit_path=found.path,
            limit_bytes=found.limit,
            limit_available=found.available,
            limit_swap_total=found.swap_total,
            limit_swap_free=found.swap_free,
            limit_at_wall=found.at_wall,
            limit_psi_full_avg10=found.psi_full_avg10,
            limit_psi_full_total=found.psi_full_total,
            limit_refaults=found.refaults,
            limit_swap_outs=found.swap_outs,
        )

    def fileno(self) -> int | None:
        """The inotify descriptor to wait on (None: none; the guard polls)."""
        return None if self._notify is None else int(self._notify.fileno())

    def drain(self) -> None:
        """Read the pending inotify events (what changed is read at the next reading)."""
        if self._notify is not None:
            with contextlib.suppress(OSError):
                self._notify.read(timeout=0)

    def close(self) -> None:
        """Close the inotify descriptor and the ``memory.pressure`` files."""
        if self._notify is not None:
            self._notify.close()
            self._notify = None
        self._watches.clear()
        for fd in self._psi.values():
            os.close(fd)
        self._psi.clear()
        self._paged.clear()
