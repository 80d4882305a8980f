"""The memory guard's decisions: when the host is short, how often to look, whom to kill.

Plain functions and frozen data over the /proc and cgroup readers, with no
thread, signal or clock of their own, so the host tests drive them over
fake trees and the guard loop (:mod:`agentscope._guard`) stays small.

- :func:`read_host` takes a :class:`HostReading` (``/proc/meminfo`` and
  ``/proc/pressure/memory``); :func:`under_pressure` says whether it is
  over a :class:`GuardConfig`'s thresholds, and :class:`PressureClock`
  adds the "sustained for N seconds" of the PSI threshold and the time of
  the crossing (for the reaction time a kill reports).
- :func:`next_interval` is the adaptive poll, as earlyoom's: the time the
  headroom left would last at the fill rate, clamped to the config's
  interval bounds.
- :func:`scan_slice_processes` lists every process of the agents slice's
  scopes (recursively) with its size (VmRSS + VmSwap); :func:`choose_victim`
  applies the victim rule of docs/guard.md to that list.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from ._cgroup import (
    _GONE,
    _GONE_OR_UNSUPPORTED,
    _read_kernel_file,
    parse_limit,
    parse_pressure,
    parse_procs,
)
from ._dicts import as_dict
from ._errors import InvalidConfig
from ._proc import PROC_ROOT, parse_meminfo, read_oom_score_adj, read_stat, read_vm_sizes
from ._tmux import is_tmux_unit

__all__ = [
    "GuardConfig",
    "GuardKill",
    "HostReader",
    "HostReading",
    "PressureClock",
    "ScopeStall",
    "SliceProcess",
    "Trigger",
    "Victim",
    "choose_victim",
    "next_interval",
    "own_limit_stall",
    "read_host",
    "read_scope_stalls",
    "scan_slice_processes",
    "under_pressure",
]

Trigger = Literal["memory", "psi"]

#: earlyoom's assumed worst-case fill rates (main.c, "adaptive sleep"): the
#: poll interval is the headroom left divided by these, or by the measured
#: rate when that is faster.
ASSUMED_MEM_FILL = 6000 << 20  # bytes/s
ASSUMED_SWAP_FILL = 800 << 20  # bytes/s
#: A process never chosen: the kernel's own "unkillable" mark.
OOM_SCORE_ADJ_MIN = -1000
#: A victim's cmdline in a GuardKill is cut to this many characters.
CMDLINE_LEN = 200


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
    without swap has 0 % free), as earlyoom does; or when the host's PSI
    memory ``full`` avg10 has stayed ``>= psi_full_percent`` for
    ``psi_full_seconds`` (as systemd-oomd does; None turns it off). It
    checks every ``min_interval`` to ``max_interval`` seconds, the faster
    the closer the host is to a threshold. ``descendant_share``: an agent's
    main process that is the runaway loses its largest descendant instead
    when that one holds at least this share of the main's size.
    ``lock_memory`` locks the guard's process in RAM where allowed.
    ``oom_score_adj`` (None: leave it) is set on the guard's process at
    start; only a process that runs nothing but the monitor should set it.
    ``process`` runs the guard in a small process of its own instead of a
    thread of the caller's (docs/guard.md says when that matters).

    Raises:
        InvalidConfig: a value out of its range (the message names it).
    """

    mem_available_percent: float = 10.0
    swap_free_percent: float = 10.0
    psi_full_percent: float | None = 60.0
    psi_full_seconds: float = 10.0
    min_interval: float = 0.1
    max_interval: float = 1.0
    descendant_share: float = 0.25
    lock_memory: bool = True
    oom_score_adj: int | None = None
    process: bool = False

    def __post_init__(self) -> None:
        pct = "a number from 0 to 100 (percent)"
        _check_range("mem_available_percent", self.mem_available_percent, 0, 100, pct)
        _check_range("swap_free_percent", self.swap_free_percent, 0, 100, pct)
        if self.psi_full_percent is not None:
            _check_range(
                "psi_full_percent",
                self.psi_full_percent,
                0.01,
                100,
                "a number above 0 and at most 100 (percent), or None for no PSI threshold",
            )
        _check_range("psi_full_seconds", self.psi_full_seconds, 0, 3600, "from 0 to 3600 (seconds)")
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
    """Host memory at one moment: meminfo in bytes, PSI avg10 in percent (None: no PSI)."""

    ts: float
    mem_total: int
    mem_available: int
    swap_total: int
    swap_free: int
    psi_some_avg10: float | None
    psi_full_avg10: float | None

    @property
    def mem_available_percent(self) -> float:
        """MemAvailable as a percentage of MemTotal."""
        return 100.0 * self.mem_available / self.mem_total if self.mem_total else 0.0

    @property
    def swap_free_percent(self) -> float:
        """SwapFree as a percentage of SwapTotal; 0 without swap (as earlyoom counts it)."""
        return 100.0 * self.swap_free / self.swap_total if self.swap_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the reading, with the percentages."""
        return {
            **as_dict(self),
            "mem_available_percent": self.mem_available_percent,
            "swap_free_percent": self.swap_free_percent,
        }


def _reading(meminfo: bytes, psi: bytes | None, now: float) -> HostReading:
    mem = parse_meminfo(meminfo)
    pressure = None if psi is None else parse_pressure(psi)
    return HostReading(
        ts=now,
        mem_total=mem.mem_total,
        mem_available=mem.mem_available,
        swap_total=mem.swap_total,
        swap_free=mem.swap_free,
        psi_some_avg10=None if pressure is None else pressure.some.avg10,
        psi_full_avg10=None if pressure is None or pressure.full is None else pressure.full.avg10,
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
    """:func:`read_host` with both files kept open: what the guard reads at every poll.

    ``pread`` at offset 0 makes the kernel generate a seq file afresh, so an
    open file gives the same as opening it again, for half the cost and no
    ``open`` (no path walk, no allocation) in a squeeze. Close it with
    :meth:`close`.

    Raises:
        OSError: (on creation) ``/proc/meminfo`` cannot be opened.
    """

    def __init__(self, proc_root: Path = PROC_ROOT) -> None:
        base = os.fspath(proc_root)
        self._meminfo = os.open(base + "/meminfo", os.O_RDONLY | os.O_CLOEXEC)
        self._psi: int | None = None
        try:
            self._psi = os.open(base + "/pressure/memory", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in _GONE_OR_UNSUPPORTED:
                os.close(self._meminfo)
                raise

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
        return _reading(meminfo, psi, now)

    def close(self) -> None:
        """Close the files."""
        for fd in (self._meminfo, self._psi):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._meminfo, self._psi = -1, None


def memory_low(reading: HostReading, config: GuardConfig) -> bool:
    """MemAvailable and SwapFree both at or under their thresholds."""
    return (
        reading.mem_available_percent <= config.mem_available_percent
        and reading.swap_free_percent <= config.swap_free_percent
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

    Memory wins when both are. The PSI threshold must also hold for
    ``psi_full_seconds``: :class:`PressureClock` keeps that time.
    """
    if memory_low(reading, config):
        return "memory"
    if psi_high(reading, config):
        return "psi"
    return None


def _crossing(prev: float, cur: float, threshold: float, t0: float, t1: float) -> float:
    """When a value falling from ``prev`` (at t0) to ``cur`` (at t1) crossed ``threshold``.

    Linear between the two readings; ``t1`` when it was already under at t0
    or did not fall.
    """
    if prev <= threshold or prev <= cur:
        return t1 if prev > threshold else t0
    return t0 + (t1 - t0) * (prev - threshold) / (prev - cur)


class PressureClock:
    """Whether the host *is* under pressure, and since when: the thresholds over time.

    Feed it every reading with :meth:`update`. It returns the trigger once
    a threshold holds (memory at once; PSI after ``psi_full_seconds``
    over), and :attr:`crossed_at` the estimated moment the threshold was
    crossed (interpolated between the last reading over and the first
    under, so a poll's own delay counts in the reaction time). After a kill
    call :meth:`restart`: PSI's avg10 decays over seconds, so the PSI time
    counts again from the kill rather than killing a second process for the
    same squeeze.
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.crossed_at: float | None = None
        self._prev: HostReading | None = None
        self._psi_since: float | None = None

    def restart(self, now: float) -> None:
        """Count the PSI time again from ``now`` (after a kill)."""
        # Still over at the kill: the stall goes on from now, not from its start.
        high = self._prev is not None and psi_high(self._prev, self.config)
        self._psi_since = now if high else None
        self.crossed_at = None

    def update(self, reading: HostReading) -> Trigger | None:
        """The trigger that holds at ``reading``, or None; sets :attr:`crossed_at`."""
        config, prev = self.config, self._prev
        self._prev = reading
        now = reading.ts
        if memory_low(reading, config):
            if self.crossed_at is None:
                self.crossed_at = now
                if prev is not None and not memory_low(prev, config):
                    self.crossed_at = max(
                        _crossing(
                            prev.mem_available_percent,
                            reading.mem_available_percent,
                            config.mem_available_percent,
                            prev.ts,
                            now,
                        ),
                        _crossing(
                            prev.swap_free_percent,
                            reading.swap_free_percent,
                            config.swap_free_percent,
                            prev.ts,
                            now,
                        ),
                    )
            return "memory"
        if psi_high(reading, config):
            if self._psi_since is None:
                self._psi_since = now
            due = self._psi_since + config.psi_full_seconds
            if now >= due:
                if self.crossed_at is None:
                    self.crossed_at = due
                return "psi"
            self.crossed_at = None
            return None
        self._psi_since = None
        self.crossed_at = None
        return None


def next_interval(reading: HostReading, prev: HostReading | None, config: GuardConfig) -> float:
    """Seconds until the next reading: the headroom left over the fill rate, clamped.

    As earlyoom: the time RAM would take to fill down to its threshold at
    :data:`ASSUMED_MEM_FILL` (or at the rate measured since ``prev``, when
    faster), plus the same for swap, kept within
    [``min_interval``, ``max_interval``]. PSI ``full`` at half its threshold
    or more polls at ``min_interval``.
    """
    low, high = config.min_interval, config.max_interval
    if psi_high(reading, config) or (
        config.psi_full_percent is not None
        and reading.psi_full_avg10 is not None
        and reading.psi_full_avg10 >= config.psi_full_percent / 2
    ):
        return low
    mem_room = reading.mem_available - reading.mem_total * config.mem_available_percent / 100
    swap_room = reading.swap_free - reading.swap_total * config.swap_free_percent / 100
    mem_rate, swap_rate = float(ASSUMED_MEM_FILL), float(ASSUMED_SWAP_FILL)
    if prev is not None and reading.ts > prev.ts:
        span = reading.ts - prev.ts
        mem_rate = max(mem_rate, (prev.mem_available - reading.mem_available) / span)
        swap_rate = max(swap_rate, (prev.swap_free - reading.swap_free) / span)
    seconds = max(mem_room, 0.0) / mem_rate + max(swap_room, 0.0) / swap_rate
    return min(max(seconds, low), high)


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


def _scopes_of(slice_path: Path) -> list[tuple[str, str]]:
    """(unit, path) of each ``*.scope`` directly under the slice; [] without the slice."""
    try:
        with os.scandir(slice_path) as it:
            return sorted((e.name, e.path) for e in it if e.name.endswith(".scope"))
    except OSError as exc:
        if exc.errno in _GONE or exc.errno == errno.ENOTDIR:
            return []
        raise


def read_scope_stalls(slice_path: Path) -> list[ScopeStall]:
    """Each scope under the agents slice: its PSI full avg10, ``memory.current`` and limit.

    Scopes that vanish meanwhile, or whose kernel has no PSI, are left out.
    """
    scopes = _scopes_of(slice_path)
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
    twice its memory threshold available.
    """
    host = reading.psi_full_avg10
    if host is None or reading.mem_available_percent < 2 * config.mem_available_percent:
        return None
    local = [s for s in scopes if s.at_own_limit and s.full_avg10 >= OWN_STALL_SHARE * host]
    return max(local, key=lambda s: s.full_avg10, default=None)


# ---------------------------------------------------------------------------
# The victim


@dataclass(frozen=True, slots=True)
class SliceProcess:
    """One process of an agent scope, as the guard sized it (bytes).

    ``unit`` is the scope directly under the agents slice that holds it (at
    any depth); ``eligible`` False for the processes that are never chosen
    (protected, the guard's own, ``oom_score_adj`` -1000, already dying).
    """

    pid: int
    start_time: int
    comm: str
    unit: str
    rss: int
    swap: int
    eligible: bool = True

    @property
    def size(self) -> int:
        """RSS + swap: what killing it gives back."""
        return self.rss + self.swap


@dataclass(frozen=True, slots=True)
class Victim:
    """The process to kill; ``main`` is its agent's main process (may be the victim itself)."""

    process: SliceProcess
    main: SliceProcess
    runaway: SliceProcess

    @property
    def is_main(self) -> bool:
        """The agent's main process itself is the victim."""
        return self.process.pid == self.main.pid


def _scope_procs(scope: str) -> Iterable[int]:
    """Every pid in the cgroup ``scope`` and its sub-cgroups (vanished ones skipped)."""
    stack = [scope]
    while stack:
        path = stack.pop()
        data = _read_kernel_file(path + "/cgroup.procs")
        if data is not None:
            yield from parse_procs(data)
        try:
            with os.scandir(path) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except OSError as exc:
            if exc.errno not in _GONE and exc.errno != errno.ENOTDIR:
                raise


def scan_slice_processes(
    slice_path: Path,
    proc_root: Path = PROC_ROOT,
    *,
    protected_pids: Collection[int] = (),
    protected_units: Collection[str] = (),
) -> list[SliceProcess]:
    """Every process of every scope under the agents slice, sized, for :func:`choose_victim`.

    Reads each ``*.scope`` directly under ``slice_path`` and its sub-cgroups
    (``cgroup.procs``), then for each pid ``stat`` and ``status`` (VmRSS,
    VmSwap) and ``oom_score_adj``. Processes and cgroups that vanish
    meanwhile are left out; a missing slice gives ``[]``. Protected pids,
    scopes in ``protected_units`` and every fleet's tmux server scope, the
    caller's own process, ``oom_score_adj`` -1000 and processes already
    dying are listed with ``eligible=False``
    (they still count for which process is an agent's main one).

    Raises:
        OSError: other than processes or cgroups vanishing.
    """
    scopes = _scopes_of(slice_path)
    own = os.getpid()
    found: list[SliceProcess] = []
    for unit, path in scopes:
        shielded = unit in protected_units or is_tmux_unit(unit)
        for pid in _scope_procs(path):
            stat = read_stat(pid, proc_root)
            sizes = read_vm_sizes(pid, proc_root)
            adj = read_oom_score_adj(pid, proc_root)
            if stat is None or sizes is None or adj is None:
                continue  # exited meanwhile
            eligible = not (
                shielded
                or pid == own
                or pid in protected_pids
                or adj <= OOM_SCORE_ADJ_MIN
                or stat.dying
            )
            found.append(
                SliceProcess(pid, stat.start_time, stat.comm, unit, sizes[0], sizes[1], eligible)
            )
    return found


def _larger(p: SliceProcess) -> tuple[int, int]:
    """Sort key: the larger size first, then the lower pid."""
    return (-p.size, p.pid)


def choose_victim(processes: Sequence[SliceProcess], descendant_share: float) -> Victim | None:
    """The process the guard kills among ``processes``, or None when none is eligible.

    The runaway is the largest eligible process (ties: the lower pid); its
    agent is its scope, whose main process is the oldest one there
    (earliest start time, then lowest pid). A runaway that is not the main
    process is the victim. A runaway that is the main process yields to
    that agent's largest eligible other process when it holds at least
    ``descendant_share`` of the main's size; else the main process is the
    victim. Never a process of another scope than the runaway's.
    """
    eligible = [p for p in processes if p.eligible and p.size > 0]
    if not eligible:
        return None
    runaway = min(eligible, key=_larger)
    same = [p for p in processes if p.unit == runaway.unit]
    main = min(same, key=lambda p: (p.start_time, p.pid))
    if runaway.pid != main.pid:
        return Victim(runaway, main, runaway)
    others = [p for p in eligible if p.unit == runaway.unit and p.pid != main.pid]
    if others:
        child = min(others, key=_larger)
        if child.size >= descendant_share * main.size:
            return Victim(child, main, runaway)
    return Victim(main, main, runaway)


@dataclass(frozen=True, slots=True)
class GuardKill:
    """The guard killed a process of an agent before the kernel had to.

    ``rss`` and ``swap`` are its sizes (bytes) at the kill; ``trigger`` the
    threshold that held (``"memory"``: MemAvailable and SwapFree, ``"psi"``:
    sustained PSI full) and the figures of the reading that decided it;
    ``reaction_seconds`` the time from the threshold crossing to the
    signal; ``released`` whether ``process_mrelease`` reaped its memory at
    once. ``agent`` is None for a scope that is not one of this fleet's.
    """

    kind: ClassVar[str] = "guard_kill"
    ts: float
    agent: str | None
    unit: str
    pid: int
    comm: str
    cmdline: str
    rss: int
    swap: int
    trigger: Trigger
    mem_available_percent: float
    swap_free_percent: float
    psi_full_avg10: float | None
    psi_some_avg10: float | None
    reaction_seconds: float
    released: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {"kind": self.kind, **as_dict(self)}
