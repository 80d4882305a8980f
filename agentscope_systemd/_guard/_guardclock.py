"""The guard's rules that need time: PSI held, thrashing over a window, a stall over a second.

:class:`PressureClock` is fed every reading (:class:`~._guardpolicy.HostReading`)
and says which trigger holds, since when (the crossing, for the reaction
time a kill reports) and whose shortage it is: the host's, or the nearest
memory limit's (:meth:`~._guardpolicy.HostReading.limit_view`: its own
``memory.pressure`` and ``memory.stat`` counters, read by
:mod:`agentscope_systemd._guard._guardlimit`). The same rules run over each,
with no thread, signal or clock of their own (docs/guard.md, "What it
watches, and when it acts" and "Under a memory limit").
"""

from __future__ import annotations

from collections import deque
from typing import Final

from .._kernel._proc import PAGE_SIZE
from ._guardevents import Trigger
from ._guardpolicy import (
    GuardConfig,
    HostReading,
    choose_source,
    host_low,
    limit_low,
    memory_low,
    psi_high,
)

__all__ = [
    "STALL_SECONDS",
    "SWAP_OUT_PERCENT",
    "SWAP_STALL_PERCENT",
    "PressureClock",
    "thrash_rates",
    "thrashing",
]

#: "Memory gone and the host stalling" (:meth:`PressureClock.update`): with
#: MemAvailable at its threshold, over the last STALL_SECONDS either PSI full
#: held ``thrash_full_percent`` of the time, or it held SWAP_STALL_PERCENT while
#: pages went out to swap at SWAP_OUT_PERCENT of MemTotal a second. Measured
#: in bench_squeeze.py (trixie, 768 MB, TCG, Ubuntu's profile): once
#: MemAvailable was gone the host swapped out at 1-6 % of MemTotal a second
#: with PSI full at 5-35 % per half second, in bursts, for 65 s until
#: earlyoom's SwapFree 10 %, its siblings' heartbeats silent for seconds.
STALL_SECONDS: Final = 1.0
SWAP_STALL_PERCENT: Final = 10.0
SWAP_OUT_PERCENT: Final = 1.0
#: "Memory gone and swap not taking it" (:meth:`_Stalls.gone_and_not_swapping`):
#: MemAvailable at its threshold for STALL_SECONDS while pages went out to
#: swap at less than SWAP_OUT_PERCENT of MemTotal a second. Measured in
#: bench_squeeze.py (trixie, 768 MB, TCG, Ubuntu's profile, 2026-12-03 and
#: -04): with the swap file empty the kernel reclaimed page cache, programs'
#: code included, from MemAvailable's 10 % down to 3-4 % with nothing going
#: out to swap and PSI at zero, while every sibling fell silent for over a
#: second; at half the threshold (this rule's first figure) the runaway died
#: 3.9-8.4 s after the crossing and siblings were silent 2.2-2.6 s. Free swap
#: that the kernel does not use is no room.


def _paged_percent(old: int, new: int, mem_total: int, span: float) -> float:
    """Pages counted between two readings, as % of MemTotal per second (>= 0)."""
    return max(100.0 * (new - old) * PAGE_SIZE / mem_total / span, 0.0)


def _stall_percent(old: HostReading, new: HostReading) -> float | None:
    """PSI full's share of the time between two readings, in % (None: no counter or no time)."""
    span = new.ts - old.ts
    if span <= 0 or new.psi_full_total is None or old.psi_full_total is None:
        return None
    return max(100.0 * (new.psi_full_total - old.psi_full_total) / (span * 1e6), 0.0)


def _swap_out_percent(old: HostReading, new: HostReading) -> float | None:
    """Pages swapped out between two readings, % of MemTotal per second (None: no counter)."""
    span = new.ts - old.ts
    if span <= 0 or new.swap_outs is None or old.swap_outs is None or not new.mem_total:
        return None
    return _paged_percent(old.swap_outs, new.swap_outs, new.mem_total, span)


def thrash_rates(old: HostReading, new: HostReading) -> tuple[float, float] | None:
    """(PSI full % of the time, refaults + swap-ins % of MemTotal per second) between two.

    None when either reading lacks a counter, or no time passed.
    """
    stall = _stall_percent(old, new)
    if stall is None or new.refaults is None or old.refaults is None or not new.mem_total:
        return None
    return stall, _paged_percent(old.refaults, new.refaults, new.mem_total, new.ts - old.ts)


def thrashing(old: HostReading, new: HostReading, config: GuardConfig) -> bool:
    """Both thrash rates over their thresholds between ``old`` and ``new``."""
    if config.thrash_full_percent is None:
        return False
    rates = thrash_rates(old, new)
    return (
        rates is not None
        and rates[0] >= config.thrash_full_percent
        and rates[1] >= config.thrash_refault_percent
    )


def _crossing(prev: float, cur: float, threshold: float, t0: float, t1: float) -> float:
    """When a value falling from ``prev`` (at t0) to ``cur`` (at t1) crossed ``threshold``.

    Linear between the two readings; ``t1`` when it was already under at t0
    or did not fall.
    """
    if prev <= threshold or prev <= cur:
        return t1 if prev > threshold else t0
    return t0 + (t1 - t0) * (prev - threshold) / (prev - cur)


class _Stalls:
    """The rules that need time, for one source: the host, or the nearest limit as one.

    The thrash window, the "short and stalling" look-back and the time PSI
    has held over its threshold, each over that source's own counters
    (:meth:`HostReading.limit_view` for a limit).
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.prev: HostReading | None = None
        self.psi_since: float | None = None
        self.window: deque[HostReading] = deque()

    def restart(self, now: float) -> None:
        """Count the PSI and thrash time again from ``now`` (after a kill)."""
        # Still over at the kill: the stall goes on from now, not from its start.
        high = self.prev is not None and psi_high(self.prev, self.config)
        self.psi_since = now if high else None
        self.window.clear()

    def _second_ago(self, reading: HostReading) -> HostReading | None:
        """The newest reading of the window at least STALL_SECONDS before ``reading``."""
        for old in reversed(self.window):
            if old.ts <= reading.ts - STALL_SECONDS:
                return old
        return None

    def short_and_stalling(self, reading: HostReading) -> bool:
        """MemAvailable at its threshold while the host stalled over the last STALL_SECONDS.

        earlyoom's rule waits for swap to fill as well; a host that swaps
        with MemAvailable gone stalls while it does (measured: Ubuntu's
        profile, a swap file as large as memory, 16-65 s from MemAvailable's
        10 % to SwapFree's 10-20 %, siblings silent for seconds). Stalling is
        what the guard is there to end: once MemAvailable is at its
        threshold, PSI full over the thrash threshold, or over
        SWAP_STALL_PERCENT while swap-out runs at SWAP_OUT_PERCENT, is a
        shortage whatever SwapFree says.
        """
        config = self.config
        if (
            config.thrash_full_percent is None
            or reading.psi_full_total is None
            or reading.mem_available_percent > config.mem_available_percent
        ):
            return False
        base = self._second_ago(reading)
        stall = None if base is None else _stall_percent(base, reading)
        if stall is None or base is None:
            return False
        if stall >= config.thrash_full_percent:
            return True
        if stall < SWAP_STALL_PERCENT:
            return False
        out = _swap_out_percent(base, reading)
        return out is not None and out >= SWAP_OUT_PERCENT

    def gone_and_not_swapping(self, reading: HostReading) -> bool:
        """MemAvailable at its threshold for STALL_SECONDS, swap not taking pages.

        earlyoom's rule counts free swap as room; a kernel that keeps its
        anonymous pages in RAM (swap-out under SWAP_OUT_PERCENT of MemTotal a
        second) leaves that room unused while MemAvailable is gone, and the
        host's page cache, its programs' code included, goes first: the host
        is then a swapless one, whose rule is MemAvailable alone. Swap that
        is taking pages is left to the stall rule (:meth:`short_and_stalling`).
        """
        floor = self.config.mem_available_percent
        if reading.swap_total <= 0 or reading.mem_available_percent > floor:
            return False
        base = self._second_ago(reading)
        if base is None or base.mem_available_percent > floor:
            return False
        out = _swap_out_percent(base, reading)
        return out is not None and out < SWAP_OUT_PERCENT

    def thrash(self, reading: HostReading) -> bool:
        """Thrashing over the last ``thrash_seconds`` (the oldest reading that old)."""
        window = self.window
        window.append(reading)
        span = self.config.thrash_seconds
        while len(window) > 2 and window[1].ts <= reading.ts - span:
            window.popleft()
        old = window[0]
        return reading.ts - old.ts >= span and thrashing(old, reading, self.config)

    def psi_due(self, reading: HostReading) -> float | None:
        """When PSI full will have held its threshold ``psi_full_seconds`` (None: not over now)."""
        if not psi_high(reading, self.config):
            self.psi_since = None
            return None
        if self.psi_since is None:
            self.psi_since = reading.ts
        return self.psi_since + self.config.psi_full_seconds


class PressureClock:
    """Whether the host or the nearest limit *is* under pressure, and since when.

    Feed it every reading with :meth:`update`. It returns the trigger once
    a threshold holds (memory at once; thrashing once its rates held over
    the last ``thrash_seconds``; PSI after ``psi_full_seconds`` over), and
    :attr:`crossed_at` the estimated moment the threshold was crossed
    (interpolated between the last reading over and the first under, so a
    poll's own delay counts in the reaction time). The rules that need time
    run twice: over the host's counters and over the nearest limit's
    (:meth:`HostReading.limit_view`: its ``memory.pressure`` and
    ``memory.stat``); :attr:`source` says which the trigger answers
    (``"host"`` or the limit's cgroup; both: the nearer to exhaustion,
    :func:`choose_source`). A limit that changes (another cgroup is the
    nearest) starts its count again. After a kill call :meth:`restart`:
    PSI's avg10 decays over seconds and the thrash window still holds the
    squeeze, so both count again from the kill rather than killing a second
    process for the same squeeze.
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.crossed_at: float | None = None
        self.source = "host"
        self._prev: HostReading | None = None
        self._host = _Stalls(config)
        self._limit = _Stalls(config)
        self._limit_path: str | None = None

    def restart(self, now: float) -> None:
        """Count the PSI and thrash time again from ``now`` (after a kill)."""
        self._host.restart(now)
        self._limit.restart(now)
        self.crossed_at = None

    def update(self, reading: HostReading) -> Trigger | None:
        """The trigger that holds at ``reading`` (None: none); sets the two attributes."""
        config, prev = self.config, self._prev
        self._prev = reading
        now = reading.ts
        view = reading.limit_view()
        path = None if view is None else view.limit_path
        if path != self._limit_path:  # another cgroup's counters, or none: count anew
            self._limit, self._limit_path = _Stalls(config), path
        host, limit = self._host, self._limit
        thrash = (host.thrash(reading), view is not None and limit.thrash(view))
        # "Gone and not swapping" is the host's alone: a limit's swap-out
        # count is read only when its stall counter moves (LimitWatch), so
        # "nothing went out" is not known there while it does not stall.
        stalling = (
            host.short_and_stalling(reading) or host.gone_and_not_swapping(reading),
            view is not None and limit.short_and_stalling(view),
        )
        host.prev, limit.prev = reading, view
        short = (
            host_low(reading, config) or stalling[0],
            limit_low(reading, config) or stalling[1],
        )
        if any(short):
            self.source = choose_source(reading, config, *short)
            if self.crossed_at is None:
                self.crossed_at = now
                if prev is not None and not memory_low(prev, config) and not any(stalling):
                    # The figures of the shortage that holds: the host's or the limit's.
                    on_host = host_low(reading, config)
                    mem = "mem_available_percent" if on_host else "limit_available_percent"
                    swap = "swap_free_percent" if on_host else "limit_swap_free_percent"
                    self.crossed_at = max(
                        _crossing(
                            getattr(prev, mem),
                            getattr(reading, mem),
                            config.mem_available_percent,
                            prev.ts,
                            now,
                        ),
                        _crossing(
                            getattr(prev, swap),
                            getattr(reading, swap),
                            config.swap_free_percent,
                            prev.ts,
                            now,
                        ),
                    )
                    self.crossed_at = min(self.crossed_at, now)
            return "memory"
        if any(thrash):
            self.source = choose_source(reading, config, *thrash)
            if self.crossed_at is None:
                self.crossed_at = now
            return "thrash"
        dues = (host.psi_due(reading), None if view is None else limit.psi_due(view))
        held = (dues[0] is not None and now >= dues[0], dues[1] is not None and now >= dues[1])
        if any(held):
            self.source = choose_source(reading, config, *held)
            if self.crossed_at is None:
                self.crossed_at = dues[0] if self.source == "host" else dues[1]
            return "psi"
        self.source = "host"
        self.crossed_at = None
        return None
