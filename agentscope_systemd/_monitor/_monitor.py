"""The memory-pressure monitor: OOM kills, throttling and pressure, per agent.

Every agent runs in its own scope under the agents slice with
``OOMPolicy=continue``, so the kernel's OOM killer kills one process and
systemd records nothing (docs/architecture.md, "An OOM kill"). The
:class:`Monitor` turns the cgroup and /proc files into events
(``_events.py``):

- :class:`OomKill` as soon as a ``memory.events`` ``oom_kill`` counter moves
  (inotify, never a poll), naming the victim and its agent;
- :class:`Throttled` when a MemoryHigh holds agents in
  ``mem_cgroup_handle_over_high``, with the command that lifts it;
- :class:`Pressure` at most once per window while memory is short, with a
  :class:`MemoryReport` saying which processes (agents or not) hold it;
- :class:`AgentExited` and :class:`LimitFound` for context.

This module is the asyncio glue: the watches (inotify, PSI triggers), the
wake-ups and the event queue; the kernel's log and systemd-oomd's lines are
followed by a part it holds (``_logwatch.py``). A sample's reads are in
``_sampling.py`` and run in a worker thread (``asyncio.to_thread``); the
counting of kills and the naming of victims, which do no I/O, are the
:class:`~agentscope_systemd._monitor._killcount.KillCounter`'s; reports are ``_report.py``'s.
Samples run every ``interval`` seconds and, debounced, whenever inotify
reports a change of a watched ``memory.events`` or a scope appearing or
vanishing, or a PSI trigger fires. The host-wide /proc pass (and
``smaps_rollup`` and ``cmdline`` for the top N) runs only when a report is
built.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import select
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path

from inotify_simple import INotify, flags  # type: ignore[import-untyped]

from .. import _numbers
from .._errors import AgentscopeError
from .._events import AgentExited, Escaped, Event, Pressure
from .._guard._guard import Protected
from .._guard._guardpolicy import GuardConfig, GuardHeld, GuardKill
from .._guard._guardthread import Guard, GuardHandle
from .._kernel._cgroup import CGROUP_ROOT
from .._kernel._proc import PROC_ROOT
from ._attribution import PressureSample, PressureWindow
from ._escape import Attach, Escapee, EscapeLedger, Mover
from ._killcount import KillCounter
from ._logwatch import LogWatch
from ._recovery import Baseline
from ._report import MemoryReport, build_report
from ._sampling import (
    _arm_psi,
    _collect,
    _detect_throttles,
    _Sample,
)

__all__ = ["Monitor"]

log = logging.getLogger("agentscope.monitor")

#: Wait this long after an inotify or PSI wake-up before sampling, so a burst
#: of changes (one kill raises the scope's and every ancestor's counter, each
#: notifying) is read once.
SETTLE = 0.05
#: Samples woken by events are at least this far apart (a throttled cgroup's
#: ``memory.events`` changes ~17 times a second: docs/oom-detection.md).
MIN_GAP = 0.2
#: The escape audit (:mod:`._escape`) runs at the first sample and then at
#: most this often (seconds): escapes are rare, and it reads every process's
#: ``children``.
ESCAPE_AUDIT_EVERY = 5.0


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
    killed anyway). Descendants of agents that live outside the agents
    slice come as :class:`Escaped` events, once each (docs/escapes.md);
    ``reclaim_escaped`` (an async ``(unit, pids)`` callable, the fleet's
    ``AttachProcessesToUnit``) moves each back into its scope first.

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
        journal: bool | None = None,
        recover: Callable[[Baseline], Awaitable[Iterable[Event]]] | None = None,
        reclaim_escaped: Attach | None = None,
        on_tick: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        # The one number grammar (_numbers): finite and bounded, no NaN (a
        # NaN interval made the sampler busy-loop).
        interval = _numbers.real("interval", interval, low=0.01, high=86400)
        top = _numbers.whole("top", top, low=0, high=10_000)
        pressure_some_avg10 = _numbers.real(
            "pressure_some_avg10", pressure_some_avg10, low=0, high=100
        )
        available_fraction = _numbers.real("available_fraction", available_fraction, low=0, high=1)
        pressure_window = _numbers.real("pressure_window", pressure_window, low=0, high=86400)
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
        # Called after each sample: the fleet reaps leftovers there (_reaper.py).
        self.on_tick = on_tick
        self.pressure_window = pressure_window
        self._window = PressureWindow(
            pressure_window,
            some_avg10_threshold=pressure_some_avg10,
            available_threshold=available_fraction,
        )
        if psi_triggers is None:
            psi_triggers = self.proc_root == PROC_ROOT and self.cgroup_root == CGROUP_ROOT
        self._psi_wanted = psi_triggers
        self._recover = recover
        if guard is True:
            guard = GuardConfig()
        if guard is not False and not isinstance(guard, GuardConfig):
            raise ValueError(f"guard must be True, False or a GuardConfig, not {guard!r}")
        self.guard_config: GuardConfig | None = guard or None
        self._guard_protect = guard_protect
        #: The running guard (None without one, or before start).
        self.guard: GuardHandle | None = None
        # Each scope's agent, as the last sample knew it: the guard names its
        # victims from this (its thread never waits on a registry).
        self._guard_names: dict[str, str] = {}
        self._reclaim = reclaim_escaped
        self._escapes = EscapeLedger()
        self._next_audit = 0.0  # loop time of the next escape audit
        self._state = "new"
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._queue_limit = 10_000
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._wake_handle: asyncio.TimerHandle | None = None
        self._last_sample = 0.0
        # Counting state (loop thread only).
        self._counter = KillCounter(
            slice_path=self.slice_path,
            unit_agent=unit_agent,
            manager=manager,
            throttle_window=pressure_window,
        )
        # Where /dev/kmsg is closed (a user, dmesg_restrict=1) the journal's
        # kernel messages name victims, if this user may read them.
        self._logs = LogWatch(
            self._counter,
            kmsg=kmsg,
            journal=kmsg == Path("/dev/kmsg") if journal is None else journal,
            slice_path=self.slice_path,
            cgroup_root=self.cgroup_root,
            unit_agent=unit_agent,
            emit=self._emit,
            wake=self._wake_soon,
        )
        self._window_report: MemoryReport | None = None
        # Kernel handles.
        self._inotify: INotify | None = None
        self._watches: dict[Path, int] = {}
        self._watched: frozenset[str] | None = None  # the scopes _watches were set for
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
        await self._logs.start(loop)
        if self._psi_wanted:
            paths = [self.proc_root / "pressure" / "memory", self.slice_path / "memory.pressure"]
            self._psi = await asyncio.to_thread(_arm_psi, paths)
            if self._psi is not None:
                loop.add_reader(self._psi[0].fileno(), self._on_psi)
        await self._sample_logged()
        if self._recover is not None:
            # Kills while no monitor ran, against this baseline: nothing between.
            for event in await self._recover(self.accounted()):
                self._emit(event)
        if self.guard_config is not None:
            await self._start_guard(loop, self.guard_config)
        self._task = loop.create_task(self._run(), name="agentscope-monitor")

    async def _start_guard(self, loop: asyncio.AbstractEventLoop, config: GuardConfig) -> None:
        def deliver(event: GuardKill | GuardHeld) -> None:
            # From the guard's thread. A stalled loop runs it when it wakes: the
            # event is queued, never lost; a closed loop cannot take it any more.
            try:
                loop.call_soon_threadsafe(self._emit_guard_event, event)
            except RuntimeError:
                log.warning("guard event after the monitor's loop closed: %r", event)

        def known_agent(unit: str) -> str | None:
            return self._guard_names.get(unit)

        # Both kinds take the owner's side of GuardBase alike; only the thread
        # arms the PSI trigger the monitor chose (the child decides in its process).
        kind: Callable[..., GuardHandle]
        if config.process:
            from .._guard._guardproc import GuardChild

            kind = GuardChild
        else:
            kind = functools.partial(Guard, psi_trigger=self._psi_wanted)
        self.guard = kind(
            config,
            self.slice_path,
            on_kill=deliver,
            on_held=deliver,
            unit_agent=known_agent,
            protected=self._guard_protect or (lambda: ((), ())),
            proc_root=self.proc_root,
            cgroup_root=self.cgroup_root,
        )
        # mlockall, or spawning the guard process, are not for the loop's thread.
        await asyncio.to_thread(self.guard.start)

    def _emit_guard_event(self, event: GuardKill | GuardHeld) -> None:
        if isinstance(event, GuardKill):
            self._counter.note_guard_kill(event.pid)
            if event.agent is None:
                # A scope no sample had named yet: named now, after the kill,
                # on the loop (the fleet's lookup may read its registry).
                event = replace(event, agent=self.unit_agent(event.unit))
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
        await self._logs.close()
        if self._psi is not None:
            poller, fds = self._psi
            if loop is not None:
                loop.remove_reader(poller.fileno())
            poller.close()
            for fd in fds:
                os.close(fd)
            self._psi = None
        self._queue.put_nowait(None)

    def accounted(self) -> Baseline:
        """The counters whose kills this monitor has reported (see ``KillCounter.accounted``)."""
        return self._counter.accounted()

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
        return await build_report(
            self.slice_path,
            self.unit_agent,
            top=self.top if top is None else top,
            cgroup_root=self.cgroup_root,
            proc_root=self.proc_root,
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
        self._counter.note_exit(unit, pid, returncode, comm, now)
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
                    self._counter.note_scope_created(event.name)
                if event.mask & flags.DELETE:
                    self._counter.note_scope_deleted(event.name)
        # Any change, or a queue overflow (IN_Q_OVERFLOW), is followed by a
        # full sample, so nothing depends on reading every event.
        if events:
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
            if self._counter.pending:
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
        plans = self._counter.plans()
        assert self._loop is not None
        follow = None
        if self._loop.time() >= self._next_audit:
            follow = self._escapes.current
            self._next_audit = self._loop.time() + ESCAPE_AUDIT_EVERY
        sample = await asyncio.to_thread(
            _collect,
            self.slice_path,
            self.cgroup_root,
            self.proc_root,
            plans,
            self._inotify,
            self._watches,
            self._watched,
            follow,
        )
        if sample.watches is not None:
            self._watches = sample.watches
            self._watched = frozenset(sample.scopes)
        now = time.time()
        events, candidates = self._counter.count(sample, now)
        self._guard_names = self._counter.agents()
        for event in events:
            self._emit(event)
        if candidates:
            throttles = await asyncio.to_thread(
                _detect_throttles, candidates, self.cgroup_root, self.proc_root
            )
            for event in self._counter.report_throttles(throttles, now):
                self._emit(event)
        if sample.escapes is not None:
            await self._report_escapes(sample.escapes, now)
        await self._pressure(sample)
        if self.on_tick is not None:
            await self.on_tick()

    async def _report_escapes(self, found: tuple[Escapee, ...], now: float) -> None:
        """Report each new escapee once; with ``reclaim_escaped``, after moving it back.

        Only this fleet's agents' (``unit_agent``): the fleet's tmux server and
        other fleets' agents share the slice, and their own monitors speak for them.
        """
        new = self._escapes.update(e for e in found if self.unit_agent(e.scope) is not None)
        if not new:
            return
        outcome: dict[int, str | None] = {}
        if self._reclaim is not None:
            mover = Mover(
                self._reclaim,
                self.slice_path,
                cgroup_root=self.cgroup_root,
                proc_root=self.proc_root,
            )
            outcome = await mover.reclaim(new)
        for e in new:
            tried = e.pid in outcome
            error = outcome.get(e.pid)
            self._emit(
                Escaped(
                    ts=now,
                    agent=self.unit_agent(e.scope),
                    unit=e.scope,
                    pid=e.pid,
                    start_time=e.start_time,
                    comm=e.comm,
                    cgroup=e.cgroup,
                    to_unit=e.to_unit,
                    rss=e.rss,
                    reclaimed=(error is None) if tried else None,
                    reclaim_error=error,
                )
            )

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
