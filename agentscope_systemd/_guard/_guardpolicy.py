"""The memory guard's decisions: when the host is short, how often to look, whom to kill.

Plain functions and frozen data over the /proc and cgroup readers, with no
thread, signal or clock of their own, so the host tests drive them over
fake trees and the guard loop (:mod:`agentscope_systemd._guard._guard`) stays small.

- :func:`read_host` takes a :class:`HostReading` (``/proc/meminfo``,
  ``/proc/pressure/memory``, and with :class:`HostReader` the zram devices
  and the refault counters of :mod:`agentscope_systemd._kernel._memsources`);
  :func:`under_pressure` says whether it is over a :class:`GuardConfig`'s
  thresholds; :class:`~agentscope_systemd._guard._guardclock.PressureClock`
  adds what needs time (PSI sustained for N seconds, thrashing over a
  window), over the host's counters and the nearest limit's, and the time
  of the crossing (for the reaction time a kill reports).
- :func:`next_interval` is the adaptive poll, as earlyoom's: the time the
  headroom left would last at the fill rate, clamped to the config's
  interval bounds.
- The slice's processes and the victim rule are in
  :mod:`agentscope_systemd._guard._guardscan` (re-exported here).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from .._dicts import as_dict
from .._errors import InvalidConfig
from .._kernel._cgroup import (
    _GONE_OR_UNSUPPORTED,
    _read_kernel_file,
    parse_limit,
    parse_pressure,
)
from .._kernel._memsources import MemSources, ZramMargin, ZramUse, zram_credit
from .._kernel._proc import PROC_ROOT, parse_meminfo
from ._guardevents import CMDLINE_LEN as CMDLINE_LEN
from ._guardevents import GuardHeld as GuardHeld
from ._guardevents import GuardKill as GuardKill
from ._guardevents import Trigger as Trigger
from ._guardscan import (
    SliceProcess,
    Victim,
    choose_victim,
    scan_slice_processes,
    scopes_of,
)

__all__ = [
    "GuardConfig",
    "GuardHeld",
    "GuardKill",
    "HostReader",
    "HostReading",
    "ScopeStall",
    "SliceProcess",
    "Trigger",
    "Victim",
    "acted_on",
    "choose_source",
    "choose_victim",
    "host_low",
    "limit_low",
    "next_interval",
    "own_limit_stall",
    "read_host",
    "read_scope_stalls",
    "scan_slice_processes",
    "under_pressure",
]

#: earlyoom's assumed worst-case fill rates (main.c, "adaptive sleep"): the
#: poll interval is the headroom left divided by these, or by the measured
#: rate when that is faster.
ASSUMED_MEM_FILL = 6000 << 20  # bytes/s
ASSUMED_SWAP_FILL = 800 << 20  # bytes/s
#: Near a memory limit above the agents the guard looks at least this often.
LIMIT_MIN_INTERVAL = 0.02


def _check_range(name: str, value: object, low: float, high: float, allowed: str) -> float:
    # bool is an int: "True %" is a caller's mistake, not 1 %.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfig(name, value, allowed)
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise InvalidConfig(name, value, allowed)
    return number


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """The guard's thresholds; ``GuardConfig()`` holds the defaults of docs/guard.md.

    The guard acts when ``MemAvailable <= mem_available_percent`` % of
    MemTotal *and* ``SwapFree <= swap_free_percent`` % of SwapTotal (a host
    without swap has 0 % free), as earlyoom does; on a host with zram swap
    also when the same holds with zram counted as the RAM it is (memory
    available plus what zram's free space would still save at its measured
    compression, and swap on disk only); when MemAvailable is at its
    threshold and PSI memory ``full`` was at least ``thrash_full_percent``
    % of the last second (a host swapping while it stalls, whatever
    SwapFree says); when the host *thrashes*: over the
    last ``thrash_seconds`` PSI memory ``full`` was at least
    ``thrash_full_percent`` % of the time and pages were refaulted or
    swapped in at ``thrash_refault_percent`` % of MemTotal per second or
    more (None turns it off); or when the host's PSI memory ``full`` avg10
    has stayed ``>= psi_full_percent`` for ``psi_full_seconds`` (as
    systemd-oomd does; None turns it off). It kills only when the agents
    slice is the cause (docs/guard.md, "Whose shortage"). It checks every
    ``min_interval`` to ``max_interval`` seconds, the faster the closer the
    host is to a threshold. ``descendant_share``: an agent's main process
    that is the runaway loses its largest descendant instead when that one
    holds at least this share of the main's size. ``lock_memory`` locks the
    guard's process in RAM where allowed. ``oom_score_adj`` (None: leave
    it) is set on the guard's process at start; only a process that runs
    nothing but the monitor should set it. ``process`` runs the guard in a
    small process of its own instead of a thread of the caller's
    (docs/guard.md says when that matters).

    Raises:
        InvalidConfig: a value out of its range (the message names it).
    """

    mem_available_percent: float = 10.0
    # Above systemd-oomd's swap rule (SwapUsedLimit=90%: it kills a whole
    # agent scope at 10 % free, the moment earlyoom's rule holds), with room for
    # the guard's reaction: docs/guard.md, "systemd-oomd".
    swap_free_percent: float = 20.0
    psi_full_percent: float | None = 60.0
    psi_full_seconds: float = 10.0
    min_interval: float = 0.1
    max_interval: float = 1.0
    descendant_share: float = 0.25
    lock_memory: bool = True
    oom_score_adj: int | None = None
    process: bool = False
    thrash_full_percent: float | None = 40.0
    thrash_seconds: float = 5.0
    thrash_refault_percent: float = 1.0

    def __post_init__(self) -> None:
        pct = "a number from 0 to 100 (percent)"
        _check_range("mem_available_percent", self.mem_available_percent, 0, 100, pct)
        _check_range("swap_free_percent", self.swap_free_percent, 0, 100, pct)
        for name in ("psi_full_percent", "thrash_full_percent"):
            if getattr(self, name) is not None:
                _check_range(
                    name,
                    getattr(self, name),
                    0.01,
                    100,
                    "a number above 0 and at most 100 (percent), or None to turn it off",
                )
        _check_range("psi_full_seconds", self.psi_full_seconds, 0, 3600, "from 0 to 3600 (seconds)")
        _check_range("thrash_seconds", self.thrash_seconds, 1, 60, "from 1 to 60 (seconds)")
        _check_range("thrash_refault_percent", self.thrash_refault_percent, 0, 100, pct)
        _check_range("min_interval", self.min_interval, 0.01, 10, "from 0.01 to 10 (seconds)")
        _check_range("max_interval", self.max_interval, 0.01, 60, "from 0.01 to 60 (seconds)")
        if self.max_interval < self.min_interval:
            raise InvalidConfig(
                "max_interval", self.max_interval, f"at least min_interval ({self.min_interval})"
            )
        _check_range("descendant_share", self.descendant_share, 0, 1, "from 0 to 1")
        for name in ("lock_memory", "process"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfig(name, getattr(self, name), "True or False")
        adj = self.oom_score_adj
        if adj is not None and (
            isinstance(adj, bool) or not isinstance(adj, int) or not -1000 <= adj <= 1000
        ):
            raise InvalidConfig("oom_score_adj", adj, "an integer from -1000 to 1000, or None")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the settings."""
        return as_dict(self)


@dataclass(frozen=True, slots=True)
class HostReading:
    """Host memory at one moment: meminfo in bytes, PSI avg10 in percent (None: no PSI).

    ``zram_swap_total``/``zram_swap_free`` are the zram devices' share of
    SwapTotal/SwapFree and ``zram_credit`` the RAM their free space would
    still save (:func:`~agentscope_systemd._kernel._memsources.zram_credit`):
    at the dearer of zram's average cost and ``zram_marginal_cost``, what
    the pages it stored lately cost
    (:class:`~agentscope_systemd._kernel._memsources.ZramMargin`), and none
    while that is not known (None); ``psi_full_total`` (microseconds),
    ``refaults`` and ``swap_outs`` (pages) are the kernel's counters since
    boot, for rates over a window (None: not read).
    ``limit_*`` are the nearest memory limit above the agents (a container's,
    a slice's or service's ``MemoryMax``: :mod:`agentscope_systemd._guard._guardlimit`):
    its cgroup (relative to the cgroup root; None: no limit), the limit, the
    memory still available under it (the limit less what reclaim cannot give
    back) and its swap, all in bytes; ``limit_at_wall``: it reached its
    ``memory.high`` or ``memory.max`` since the last reading, near its
    threshold. ``limit_psi_full_avg10`` and ``limit_psi_full_total`` are
    that cgroup's own ``memory.pressure`` (None: not read, or no such file),
    ``limit_refaults`` and ``limit_swap_outs`` its ``memory.stat`` counters
    (None: not counted there); :meth:`limit_view` gives them as a reading
    of their own, so that the host's rules apply under the limit.
    """

    ts: float
    mem_total: int
    mem_available: int
    swap_total: int
    swap_free: int
    psi_some_avg10: float | None
    psi_full_avg10: float | None
    zram_swap_total: int = 0
    zram_swap_free: int = 0
    zram_credit: int = 0
    zram_marginal_cost: float | None = None
    psi_full_total: int | None = None
    refaults: int | None = None
    swap_outs: int | None = None
    limit_path: str | None = None
    limit_bytes: int = 0
    limit_available: int = 0
    limit_swap_total: int = 0
    limit_swap_free: int = 0
    limit_at_wall: bool = False
    limit_psi_full_avg10: float | None = None
    limit_psi_full_total: int | None = None
    limit_refaults: int | None = None
    limit_swap_outs: int | None = None

    def limit_view(self) -> HostReading | None:
        """The nearest limit as a host of its own (None: no limit), for the host's rules.

        Its "MemTotal" is the limit, its "MemAvailable" what is available
        under it, its swap and PSI the cgroup's: :func:`psi_high`,
        thrashing and "short and stalling"
        (:mod:`agentscope_systemd._guard._guardclock`) and
        :func:`own_limit_stall` then read the
        limit as they read the host (docs/guard.md, "Under a memory limit").
        """
        if self.limit_path is None or self.limit_bytes <= 0:
            return None
        return HostReading(
            ts=self.ts,
            mem_total=self.limit_bytes,
            mem_available=self.limit_available,
            swap_total=self.limit_swap_total,
            swap_free=self.limit_swap_free,
            psi_some_avg10=None,
            psi_full_avg10=self.limit_psi_full_avg10,
            psi_full_total=self.limit_psi_full_total,
            refaults=self.limit_refaults,
            swap_outs=self.limit_swap_outs,
            limit_path=self.limit_path,
        )

    def figures_of(self, source: str) -> HostReading:
        """The figures of the shortage ``source`` names: this reading, or the limit's.

        ``source`` is ``"host"`` or a limit's cgroup, as
        :attr:`~agentscope_systemd._guard._guardclock.PressureClock.source`
        says; a limit's is :meth:`limit_view`.
        """
        view = None if source == "host" else self.limit_view()
        return view or self

    @property
    def mem_available_percent(self) -> float:
        """MemAvailable as a percentage of MemTotal."""
        return 100.0 * self.mem_available / self.mem_total if self.mem_total else 0.0

    @property
    def swap_free_percent(self) -> float:
        """SwapFree as a percentage of SwapTotal; 0 without swap (as earlyoom counts it)."""
        return 100.0 * self.swap_free / self.swap_total if self.swap_total else 0.0

    @property
    def available_percent(self) -> float:
        """MemAvailable plus zram's credit, as a percentage of MemTotal (zram as RAM)."""
        avail = self.mem_available + self.zram_credit
        return 100.0 * avail / self.mem_total if self.mem_total else 0.0

    @property
    def disk_swap_free_percent(self) -> float:
        """SwapFree of the swap that is not zram; 0 without any."""
        total = self.swap_total - self.zram_swap_total
        free = self.swap_free - self.zram_swap_free
        return 100.0 * free / total if total > 0 else 0.0

    @property
    def limit_available_percent(self) -> float:
        """Memory available under the nearest limit, as a percentage of it (100: no limit)."""
        return 100.0 * self.limit_available / self.limit_bytes if self.limit_bytes else 100.0

    @property
    def limit_swap_free_percent(self) -> float:
        """The swap the nearest limit's cgroup may still use, as a percentage; 0 without."""
        total = self.limit_swap_total
        return 100.0 * self.limit_swap_free / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the reading, with the percentages."""
        return {
            **as_dict(self),
            "mem_available_percent": self.mem_available_percent,
            "swap_free_percent": self.swap_free_percent,
            "available_percent": self.available_percent,
        }


def _reading(
    meminfo: bytes,
    psi: bytes | None,
    now: float,
    zram: ZramUse | None = None,
    refaults: int | None = None,
    zram_marginal_cost: float | None = None,
) -> HostReading:
    mem = parse_meminfo(meminfo)
    pressure = None if psi is None else parse_pressure(psi)
    full = None if pressure is None else pressure.full
    zram = zram or ZramUse()
    return HostReading(
        ts=now,
        mem_total=mem.mem_total,
        mem_available=mem.mem_available,
        swap_total=mem.swap_total,
        swap_free=mem.swap_free,
        psi_some_avg10=None if pressure is None else pressure.some.avg10,
        psi_full_avg10=None if full is None else full.avg10,
        zram_swap_total=min(zram.swap_total, mem.swap_total),
        zram_swap_free=min(zram.swap_free, mem.swap_free),
        zram_credit=zram_credit(zram, zram_marginal_cost),
        zram_marginal_cost=zram_marginal_cost,
        psi_full_total=None if full is None else full.total,
        refaults=refaults,
    )


def read_host(proc_root: Path = PROC_ROOT, *, now: float = 0.0) -> HostReading:
    """Read ``/proc/meminfo`` and ``/proc/pressure/memory`` once (see :class:`HostReader`).

    ``now`` is stored as the reading's ``ts`` (the guard passes its
    monotonic clock).

    Raises:
        OSError: ``/proc/meminfo`` unreadable (not a procfs).
        ValueError: a file not in its documented format.
    """
    base = os.fspath(proc_root)
    data = _read_kernel_file(base + "/meminfo", frozenset())
    assert data is not None  # nothing tolerated: an error raised
    psi = _read_kernel_file(base + "/pressure/memory", _GONE_OR_UNSUPPORTED)
    return _reading(data, psi, now)


class HostReader:
    """:func:`read_host` with the files kept open: what the guard reads at every poll.

    ``pread`` at offset 0 makes the kernel generate a seq file afresh, so an
    open file gives the same as opening it again, for half the cost and no
    ``open`` (no path walk, no allocation) in a squeeze. Besides meminfo and
    PSI it reads the zram swap devices (only while there is swap) and the
    refault counters (:class:`~agentscope_systemd._kernel._memsources.MemSources`). Close it
    with :meth:`close`.

    Raises:
        OSError: (on creation) ``/proc/meminfo`` cannot be opened.
    """

    def __init__(self, proc_root: Path = PROC_ROOT, sys_root: Path | None = None) -> None:
        base = os.fspath(proc_root)
        self._meminfo = os.open(base + "/meminfo", os.O_RDONLY | os.O_CLOEXEC)
        self._psi: int | None = None
        try:
            self._psi = os.open(base + "/pressure/memory", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in _GONE_OR_UNSUPPORTED:
                os.close(self._meminfo)
                raise
        # A fake /proc gets a fake /sys beside it (or none), never the host's.
        if sys_root is None:
            sys_root = Path("/sys") if proc_root == PROC_ROOT else Path(proc_root).parent / "sys"
        self._sources = MemSources(Path(proc_root), sys_root)
        self._last_full_total: int | None = None
        self._last_refaults: int | None = None
        self._last_swap_outs: int | None = None
        self._zram_margin = ZramMargin()

    def read(self, now: float) -> HostReading:
        """A reading now.

        Raises:
            OSError: meminfo unreadable; ValueError: a file not in its format.
        """
        meminfo = os.pread(self._meminfo, 16384, 0)
        psi = None
        if self._psi is not None:
            try:
                psi = os.pread(self._psi, 4096, 0)
            except OSError as exc:  # PSI switched off for good (cgroup.pressure, Linux 6.5+)
                if exc.errno not in _GONE_OR_UNSUPPORTED:
                    raise
        reading = _reading(meminfo, psi, now)
        # The refault counters matter only to the thrash rule, which needs
        # PSI full stalls: on a host that stalled not at all since the last
        # reading, /proc/vmstat (the dearest of these files) is not read.
        # Not read, the last count stands: a reading without one would end
        # the thrash rule's whole window when it becomes the window's base
        # (seen: readings ten times as often as the stall counter moved left
        # the base without a count for seconds, and thrashing never fired).
        full_total = reading.psi_full_total
        if full_total is not None and full_total != self._last_full_total:
            self._last_refaults, self._last_swap_outs = self._sources.paging()
        if full_total is not None:
            reading = replace(reading, refaults=self._last_refaults, swap_outs=self._last_swap_outs)
        self._last_full_total = full_total
        if reading.swap_total:
            zram = self._sources.zram()
            if zram.swap_total:
                margin = self._zram_margin.update(now, zram)
                reading = replace(
                    _reading(meminfo, psi, now, zram, reading.refaults, margin),
                    swap_outs=reading.swap_outs,
                )
        return reading

    def close(self) -> None:
        """Close the files."""
        for fd in (self._meminfo, self._psi):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._meminfo, self._psi = -1, None
        self._sources.close()


def memory_low(reading: HostReading, config: GuardConfig) -> bool:
    """The host's memory (:func:`host_low`) or the nearest limit's (:func:`limit_low`) is short."""
    return host_low(reading, config) or limit_low(reading, config)


def limit_low(reading: HostReading, config: GuardConfig) -> bool:
    """Under the nearest limit, memory and swap both at or under the host's thresholds.

    The same rule as the host's, inside the limit: what its cgroup may still
    use before the kernel's OOM killer acts there; or, within 1.5x of the
    memory threshold, the cgroup reached its limit since the last reading
    (the page cache counted as available is being reclaimed: the OOM killer
    is next). docs/guard.md, "Under a memory limit".
    """
    return (
        reading.limit_bytes > 0
        and (
            reading.limit_available_percent <= config.mem_available_percent or reading.limit_at_wall
        )
        and reading.limit_swap_free_percent <= config.swap_free_percent
    )


def _margin(mem: float, swap: float, config: GuardConfig) -> float:
    """How far a memory reading is from its thresholds (<= 0: over both)."""
    return max(mem - config.mem_available_percent, swap - config.swap_free_percent)


def acted_on(reading: HostReading, config: GuardConfig) -> str:
    """Which shortage the memory threshold answers: ``"host"``, or the nearest limit's cgroup.

    The one nearer to exhaustion when both hold.
    """
    return choose_source(reading, config, host_low(reading, config), limit_low(reading, config))


def choose_source(reading: HostReading, config: GuardConfig, host: bool, limit: bool) -> str:
    """``"host"`` or the nearest limit's cgroup, as a rule holds for one, the other or both.

    Where both hold, the one nearer to exhaustion (memory and swap against
    the thresholds); neither: ``"host"``.
    """
    if not limit or reading.limit_path is None:
        return "host"
    if host:
        host_margin = min(
            _margin(reading.mem_available_percent, reading.swap_free_percent, config),
            _margin(reading.available_percent, reading.disk_swap_free_percent, config),
        )
        mem = 0.0 if reading.limit_at_wall else reading.limit_available_percent
        if host_margin < _margin(mem, reading.limit_swap_free_percent, config):
            return "host"
    return reading.limit_path


def host_low(reading: HostReading, config: GuardConfig) -> bool:
    """MemAvailable and SwapFree both at or under their thresholds, with or without zram.

    The first rule is earlyoom's (main.c: ``m.MemAvailablePercent <=
    args.mem_term_percent && m.SwapFreePercent <= args.swap_term_percent``),
    so the guard never acts later than earlyoom. The second counts zram as
    RAM: available = MemAvailable + what zram's free space would still
    save, swap = the swap on disk only (zram-only: none, so 0 % free).
    """
    if (
        reading.mem_available_percent <= config.mem_available_percent
        and reading.swap_free_percent <= config.swap_free_percent
    ):
        return True
    return (
        reading.zram_swap_total > 0
        and reading.available_percent <= config.mem_available_percent
        and reading.disk_swap_free_percent <= config.swap_free_percent
    )


def psi_high(reading: HostReading, config: GuardConfig) -> bool:
    """PSI ``full`` avg10 at or over its threshold now (not yet "sustained")."""
    return (
        config.psi_full_percent is not None
        and reading.psi_full_avg10 is not None
        and reading.psi_full_avg10 >= config.psi_full_percent
    )


def under_pressure(reading: HostReading, config: GuardConfig) -> Trigger | None:
    """Which threshold ``reading`` is over right now: ``"memory"``, ``"psi"`` or None.

    The host's or the nearest limit's (its own ``memory.pressure``). Memory
    wins when both are. The PSI threshold must also hold for
    ``psi_full_seconds``, and thrashing is a rate over a window:
    :class:`~agentscope_systemd._guard._guardclock.PressureClock` keeps that time.
    """
    if memory_low(reading, config):
        return "memory"
    view = reading.limit_view()
    if psi_high(reading, config) or (view is not None and psi_high(view, config)):
        return "psi"
    return None


def _room(avail: float, total: float, pct: float) -> float:
    return avail - total * pct / 100


def next_interval(reading: HostReading, prev: HostReading | None, config: GuardConfig) -> float:
    """Seconds until the next reading: the headroom left over the fill rate, clamped.

    As earlyoom: the time RAM would take to fill down to its threshold at
    :data:`ASSUMED_MEM_FILL` (or at the rate measured since ``prev``, when
    faster), kept within [``min_interval``, ``max_interval``]. Free swap
    adds nothing to that time: at MemAvailable's threshold the rules for
    memory gone (swap not taking pages, or the host stalling while it does;
    :mod:`._guardclock`) start counting, whatever SwapFree says (measured:
    a swap file's room kept the guard polling every 0.7-1 s near the
    crossing, and it acted 2 s after it); under it the host is short and
    the guard reads at ``min_interval``. PSI ``full`` at half
    its threshold (or the thrash threshold) or more, the host's or the
    nearest limit's, polls at ``min_interval``.
    """
    low, high = config.min_interval, config.max_interval
    fulls = [f for f in (reading.psi_full_avg10, reading.limit_psi_full_avg10) if f is not None]
    watch = [p for p in (config.psi_full_percent, config.thrash_full_percent) if p is not None]
    if any(full >= p / 2 for full in fulls for p in watch):
        return low
    mem_rate = float(ASSUMED_MEM_FILL)
    if prev is not None and reading.ts > prev.ts:
        fell = prev.mem_available - reading.mem_available
        mem_rate = max(mem_rate, fell / (reading.ts - prev.ts))
    mem_pct = config.mem_available_percent
    # zram counted as RAM is never less than MemAvailable: its room to the
    # threshold comes no sooner than RAM's.
    seconds = max(_room(reading.mem_available, reading.mem_total, mem_pct), 0.0) / mem_rate
    interval = min(max(seconds, low), high)
    if reading.limit_bytes:
        # The nearest limit's headroom, at the same fill rate (or the rate measured under it).
        rate = float(ASSUMED_MEM_FILL)
        if prev is not None and prev.limit_path == reading.limit_path and reading.ts > prev.ts:
            fell = prev.limit_available - reading.limit_available
            rate = max(rate, fell / (reading.ts - prev.ts))
        room = max(_room(reading.limit_available, reading.limit_bytes, mem_pct), 0.0) / rate
        room += max(
            _room(reading.limit_swap_free, reading.limit_swap_total, config.swap_free_percent), 0.0
        ) / float(ASSUMED_SWAP_FILL)
        # A limit is small beside a host's RAM: its last tenth fills in
        # milliseconds (a 400 MiB container's 40 MiB at 3 GB/s, a tool call's
        # bursts: docs/guard.md, "How often"), and the kernel's OOM killer inside a cgroup
        # does not wait for minutes of thrashing as the host's does. So near a
        # limit (twice its threshold) the guard looks as often as every
        # LIMIT_MIN_INTERVAL (jr2's ADR-0061 polls 10-20 ms), below the
        # config's min_interval; farther, no more often than that.
        near = reading.limit_available_percent <= 2 * mem_pct
        interval = min(interval, max(room, min(low, LIMIT_MIN_INTERVAL) if near else low))
    return interval


# ---------------------------------------------------------------------------
# A stall that is one scope's own limit

#: A scope whose ``memory.current`` is this share of its own lowest limit is at it.
OWN_LIMIT_SHARE: Final = 0.9
#: A scope at its limit whose PSI full avg10 is this share of the host's or
#: more makes the host's stall.
OWN_STALL_SHARE: Final = 0.5


@dataclass(frozen=True, slots=True)
class ScopeStall:
    """A scope's memory stall (PSI full avg10, %) and its own limit (bytes).

    ``limit`` is the lower of ``memory.high`` and ``memory.max`` (None: neither).
    """

    unit: str
    full_avg10: float
    current: int
    limit: int | None

    @property
    def at_own_limit(self) -> bool:
        """It reclaims against a limit of its own, not the host's shortage."""
        return self.limit is not None and self.current >= self.limit * OWN_LIMIT_SHARE


def read_scope_stalls(slice_path: Path) -> list[ScopeStall]:
    """Each scope under the agents slice: its PSI full avg10, ``memory.current`` and limit.

    Scopes that vanish meanwhile, or whose kernel has no PSI, are left out.
    """
    scopes = scopes_of(slice_path)
    found = []
    for unit, path in scopes:
        psi = _read_kernel_file(path + "/memory.pressure", _GONE_OR_UNSUPPORTED)
        current = _read_kernel_file(path + "/memory.current")
        high = _read_kernel_file(path + "/memory.high")
        top = _read_kernel_file(path + "/memory.max")
        if psi is None or current is None or high is None or top is None:
            continue
        full = parse_pressure(psi).full
        limits = [v for v in (parse_limit(high), parse_limit(top)) if v is not None]
        found.append(
            ScopeStall(
                unit,
                0.0 if full is None else full.avg10,
                int(current.strip()),
                min(limits) if limits else None,
            )
        )
    return found


def own_limit_stall(
    scopes: Iterable[ScopeStall], reading: HostReading, config: GuardConfig
) -> ScopeStall | None:
    """The scope whose reclaim under its own limit is the host's PSI stall, or None.

    PSI full counts the time when every task that wants to run waits for
    memory. On a quiet host, one scope reclaiming under its own
    ``memory.high`` or ``memory.max`` holds it high while MemAvailable is
    ample: that is the scope's limit at work (the monitor reports it as
    throttled), not a host about to thrash, and killing the largest agent
    would kill a sibling (measured in a VM: a 96 MiB tool call under
    ``MemoryHigh=48M`` held host PSI full over 60% for 10 s with 64% of
    memory available). So: a scope at its own limit with at least
    :data:`OWN_STALL_SHARE` of the host's full avg10, on a host with at least
    twice its memory threshold available. Under a limit above the agents,
    ``reading`` is :meth:`HostReading.limit_view`: the limit's own PSI and
    what is available under it.
    """
    host = reading.psi_full_avg10
    if host is None or reading.mem_available_percent < 2 * config.mem_available_percent:
        return None
    local = [s for s in scopes if s.at_own_limit and s.full_avg10 >= OWN_STALL_SHARE * host]
    return max(local, key=lambda s: s.full_avg10, default=None)
