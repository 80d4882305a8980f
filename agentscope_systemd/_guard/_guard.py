"""The memory guard: kill an agent's runaway before the host thrashes.

The decisions are in :mod:`agentscope_systemd._guard._guardpolicy`; this module does what
they decide, in a loop that must keep running while the rest of the
process stalls (the manager's event loop is the first thing a squeeze
freezes: issue #20). So:

- :func:`run_guard` is one plain blocking loop, with no asyncio in it: a
  thread (:class:`Guard`, what ``Monitor(guard=...)`` starts) or a process
  of its own runs it. It reads the host with raw ``os.read`` calls, sleeps
  in ``epoll`` on a PSI trigger (where the kernel permits one) and a stop
  pipe, and polls at the adaptive interval otherwise.
- :func:`prepare_process` and :func:`kill_process` (from
  :mod:`agentscope_systemd._guard._guardkill`) lock the guard's pages and kill a victim
  after re-checking its start time and its scope.
- :class:`~agentscope_systemd._guard._guardcause.CauseTracker` says whether the agents
  slice caused a shortage; :class:`~agentscope_systemd._guard._guardlock.SliceLock` lets
  one guard act per slice.
- :class:`~agentscope_systemd._guard._guardlimit.LimitWatch` reads the memory limits
  above the agents (a container's, a ``MemoryMax``): the guard acts on the
  host's shortage or the nearest limit's, whichever comes first.
- In process mode (a slice outside the cgroupfs: the fleet's mirror of
  process trees, :mod:`agentscope_systemd._kernel._proctrees`) the agents' trees are walked
  at each choice, the limits are those over the manager's own cgroup
  (which the agents share), and a victim is re-checked by pidfd and start
  time only (docs/guard.md, "In each manager mode").
- :func:`admit` is the fleet's admission control over its guards.
"""

from __future__ import annotations

import logging
import os
import select
import time
from collections.abc import Callable, Collection
from dataclasses import KW_ONLY, dataclass, fields, replace
from pathlib import Path
from typing import Literal

from .._kernel._cgroup import CGROUP_ROOT, arm_psi_trigger
from .._kernel._proc import PROC_ROOT
from .._kernel._proctrees import ProcessTrees, is_mirror, mirrored_agent
from . import _guardlock
from ._guardcause import Blame, CauseTracker
from ._guardclock import PressureClock
from ._guardkill import _kill, _Killed, _say_once, kill_process, prepare_process
from ._guardlimit import LimitWatch
from ._guardlock import RETRY_EVERY, SliceLock
from ._guardnames import CmdlineBook
from ._guardpolicy import (
    CMDLINE_LEN,
    GuardConfig,
    GuardHeld,
    GuardKill,
    HostReader,
    HostReading,
    SliceProcess,
    Trigger,
    next_interval,
    own_limit_stall,
    read_scope_stalls,
)
from ._guardscan import measure, pick_victim, scan_candidates

__all__ = [
    "Protected",
    "kill_process",
    "prepare_process",
    "run_guard",
]

log = logging.getLogger("agentscope.guard")

#: After a kill, wait up to this long for the victim to exit (its pidfd
#: becomes readable) before looking again: one squeeze, one kill, unless
#: the host is still short once the victim's memory is back.
VICTIM_WAIT = 1.0
#: A process smaller than this share of MemTotal is not worth a kill: when
#: nothing in the slice is that large, the memory is held elsewhere and
#: killing the fleet's small processes one by one would not give it back.
MIN_VICTIM_SHARE = 0.01
#: Near the threshold (within this factor of it) the victim is chosen at
#: every reading, ahead of the crossing; such a choice serves for this long.
NEAR_FACTOR = 1.5
PREPARED_FOR = 1.0
#: Near the threshold the slice is scanned again at most this often: the
#: scan's cost is bounded (docs/benchmarks.md, bench_guard_scan.py).
NEAR_RESCAN = 0.6
#: How many past victims are remembered (never chosen again while listed).
KILLED_KEPT = 256
# ---------------------------------------------------------------------------
# The loop


def _near(reading: HostReading, config: GuardConfig) -> bool:
    """Within :data:`NEAR_FACTOR` of the memory threshold (the host's or a limit's).

    MemAvailable alone is enough on the host, whatever SwapFree says: a
    swapless host counts as 0 % free, and on a host with swap the rules for
    memory gone (swap not taking it, or the host stalling while it does:
    :mod:`._guardclock`) act at MemAvailable's threshold too.
    """
    mem, swap = NEAR_FACTOR * config.mem_available_percent, NEAR_FACTOR * config.swap_free_percent
    # zram counted as RAM (``available_percent``) never shows less than
    # MemAvailable alone: the first test covers it.
    return reading.mem_available_percent <= mem or bool(
        reading.limit_bytes
        and reading.limit_available_percent <= mem
        and reading.limit_swap_free_percent <= swap
    )


def _scale(reading: HostReading) -> int:
    """The memory a victim is measured against: MemTotal, or a smaller limit above the agents."""
    if reading.limit_bytes:
        return min(reading.mem_total, reading.limit_bytes)
    return reading.mem_total


def _sanitise(text: str) -> str:
    """A cmdline as one printable line (another user's process names it as it likes)."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean[:CMDLINE_LEN]


Protected = Callable[[], tuple[Collection[int], Collection[str]]]


@dataclass(eq=False)
class _Loop:
    """The state of one :func:`run_guard` call: its arguments, then what it keeps."""

    config: GuardConfig
    slice_path: Path
    proc_root: Path
    unit_agent: Callable[[str], str | None]
    protected: Protected
    on_kill: Callable[[GuardKill], None]
    on_reading: Callable[[HostReading, Trigger | None], None] | None
    _: KW_ONLY
    cgroup_root: Path
    lock: SliceLock
    on_held: Callable[[GuardHeld], None] | None = None
    on_relay: Callable[[GuardKill], None] | None = None

    def __post_init__(self) -> None:
        self.cgroup_root = Path(self.cgroup_root)
        # Process mode: the "slice" is a mirror of process trees, the agents
        # share the manager's cgroup and its limits (_proctrees, _guardlimit).
        self.trees = is_mirror(self.slice_path, self.cgroup_root)
        self.limits = LimitWatch(
            self.cgroup_root, self.slice_path, self.proc_root, shared=self.trees
        )
        # Where the agents are charged, for whose shortage: the slice, or in
        # process mode the cgroup they share with the manager (its own, from
        # /proc/self/cgroup): that cgroup against those beside it.
        self.charged = Path(self.limits.chain[0]) if self.trees else self.slice_path
        self.cause = CauseTracker(self.cgroup_root, self.charged)
        # The first charges now: a squeeze under way at the first reading is
        # then blamed on who grew since, not on size alone (_guardcause).
        self.cause.sample(time.monotonic())
        # Whose shortage under a limit: the slice against the rest of the
        # limited cgroup (one tracker per limit, the root's is self.cause).
        self.limit_causes: dict[str, CauseTracker] = {}
        self.clock = PressureClock(self.config)
        self.prev: HostReading | None = None
        self.host = HostReader(self.proc_root)
        # (pid, start time) of the last kills: a victim still listed (a zombie
        # its parent has not reaped, one stuck exiting) is never chosen again.
        self.killed: dict[tuple[int, int], None] = {}
        # (when, victim) chosen near the threshold, for the kill.
        self.ready: tuple[float, SliceProcess | None] | None = None
        # The victims' command lines, read by a thread of their own: a read
        # of /proc/PID/cmdline can wait seconds in a squeeze (_guardnames).
        self.names = CmdlineBook(self.proc_root, CMDLINE_LEN)
        # Said once per squeeze: the guard held its hand (reset when it clears).
        self.held = False
        # The last reading was over a threshold and nothing was killed.
        self.idle_trigger = False
        # pid -> (start time, comm) of the slice's processes, from scan to scan.
        self.known: dict[int, tuple[int, str]] = {}

    def _skipped(self, path: str, exc: OSError) -> None:
        _say_once(f"skip:{path}", "cannot list %s (%s): scanning the rest", path, exc)

    def step(self) -> tuple[float, _Killed | None]:
        """One reading, and a kill if it calls for one: (seconds to sleep, the kill)."""
        now = time.monotonic()
        reading = self.limits.apply(self.host.read(now), self.config)
        for ceiling in self.limits.manager_only:
            _say_once(
                f"manager-limit:{ceiling.path}",
                "the manager runs under a memory limit of %d MiB (%s of %s) that its agents "
                "are not charged to: no kill of an agent's process relieves it",
                (ceiling.limit or 0) >> 20,
                ceiling.kind,
                self.limits.rel(ceiling.path),
            )
        trigger = self.clock.update(reading)
        if self.on_reading is not None:
            self.on_reading(reading, trigger)
        prev, self.prev = self.prev, reading
        acting = self.lock.try_acquire(now)
        if not acting:
            self.relay()
        # The charges of the slice and of what is outside it, for "whose
        # shortage" (at most once a second; a few dozen small reads). Under a
        # trigger the blame before a kill reads them itself.
        if trigger is None or not acting:
            self.cause.sample(now)
            if reading.limit_path is not None:
                self._cause_of(reading.limit_path).sample(now)
        self.idle_trigger = False
        if trigger is None:
            self.held = False
        elif acting:
            killed = self.act(reading, trigger)
            if killed is not None:
                return 0.0, killed
            # Nothing killed: scan again at the slow pace, not ten times a
            # second on a host that is short.
            self.idle_trigger = True
            return self.config.max_interval, None
        if acting and _near(reading, self.config):
            # Choose ahead, so that at the crossing the kill is a pidfd and a
            # signal, not a scan: every read of the scan lets go of the GIL,
            # and each time the guard thread may wait for it behind the loop.
            # At most once per NEAR_RESCAN: the scan's cost stays bounded.
            if self.ready is None or now - self.ready[0] >= NEAR_RESCAN:
                self.ready = (now, self.choose(reading))
        else:
            self.ready = None
        interval = next_interval(reading, prev, self.config)
        # A guard standing by tries the lock again within RETRY_EVERY.
        return (interval if acting else min(interval, RETRY_EVERY)), None

    def _cause_of(self, limit_path: str) -> CauseTracker:
        """Whose shortage under the limit of ``limit_path`` (relative to the cgroup root)."""
        if limit_path == "/":
            return self.cause
        tracker = self.limit_causes.get(limit_path)
        if tracker is None:
            root = self.cgroup_root / limit_path.lstrip("/")
            tracker = CauseTracker(root, self.charged, names=self.cgroup_root)
            self.limit_causes[limit_path] = tracker
        return tracker

    def choose(self, reading: HostReading) -> SliceProcess | None:
        """Scan the slice: the victim, or None (none worth a kill).

        Its command line is asked of :attr:`names`, never read here.
        """
        pids, units = self.protected()
        scan = scan_candidates(
            self.slice_path,
            self.proc_root,
            floor=int(_scale(reading) * MIN_VICTIM_SHARE),
            protected_pids=pids,
            protected_units=units,
            excluded=self.killed,
            on_skip=self._skipped,
            known=self.known,
            # Process mode: each agent's tree now, a tool call spawned since
            # the last listing included (no lock: /proc and the mirror's files).
            members=ProcessTrees(self.proc_root).pids if self.trees else None,
        )
        if scan.unheld is not None:
            unit, amount = scan.unheld
            _say_once(
                f"unheld:{unit}",
                "%s holds %d MiB that no process maps and none holds open (tmpfs files): "
                "no kill gives it back; the largest process is chosen instead",
                self.unit_agent(unit) or unit,
                amount >> 20,
            )
        victim = pick_victim(scan.processes, self.config.descendant_share, self.proc_root)
        if victim is None:
            return None
        proc = victim.process
        self.names.want(proc.pid, proc.start_time)
        return proc

    def _hold(self, reading: HostReading, trigger: Trigger, blame: Blame, source: str) -> None:
        """Say once per squeeze that the shortage is not the fleet's, and what is."""
        if self.held:
            return
        self.held = True
        # The figures of the shortage: the host's, or the limit's own.
        seen = reading.figures_of(source)
        log.warning(
            "the %s is short (%s: %.1f%% available, PSI full %.0f%%) but not because of "
            "the agents: %s holds %d MiB (grew %d MiB in %.0f s; the agents slice %d MiB, "
            "grew %d MiB): nothing killed; the kernel, earlyoom or systemd-oomd may act",
            "host" if source == "host" else f"memory limit of {source}",
            trigger,
            seen.mem_available_percent,
            seen.psi_full_avg10 or 0.0,
            blame.culprit or "nothing",
            blame.culprit_bytes >> 20,
            blame.culprit_growth >> 20,
            blame.window,
            blame.slice_bytes >> 20,
            blame.slice_growth >> 20,
        )
        if self.on_held is not None:
            self.on_held(
                GuardHeld(
                    ts=time.time(),
                    trigger=trigger,
                    reason=blame.reason,
                    culprit=blame.culprit,
                    culprit_bytes=blame.culprit_bytes,
                    culprit_growth=blame.culprit_growth,
                    culprit_full_avg10=blame.culprit_full_avg10,
                    slice_bytes=blame.slice_bytes,
                    slice_growth=blame.slice_growth,
                    mem_available_percent=round(reading.mem_available_percent, 2),
                    swap_free_percent=round(reading.swap_free_percent, 2),
                    psi_full_avg10=reading.psi_full_avg10,
                    limit=source,
                )
            )

    def act(self, reading: HostReading, trigger: Trigger) -> _Killed | None:
        """Kill the victim (the one chosen near the threshold, if fresh); None: none."""
        ready, self.ready = self.ready, None
        pressure = None
        # The host's shortage or the nearest limit's (PressureClock.source):
        # under a limit its own PSI and headroom, read as the host's are.
        source = self.clock.source
        seen = reading.figures_of(source)
        if trigger != "memory":
            stall = own_limit_stall(read_scope_stalls(self.slice_path), seen, self.config)
            if stall is not None:
                # Its own limit at work, with memory to spare: no other
                # agent's process is to pay for it (the monitor reports the
                # throttle, with its fix).
                _say_once(
                    f"own:{stall.unit}",
                    "the %s's memory pressure (PSI full %.0f%%) is %s reclaiming under its "
                    "own limit of %d MiB, with %.0f%% of memory available: nothing killed",
                    "host" if source == "host" else f"memory limit of {source}",
                    seen.psi_full_avg10 or 0.0,
                    self.unit_agent(stall.unit) or stall.unit,
                    (stall.limit or 0) >> 20,
                    seen.mem_available_percent,
                )
                return None
            pressure = (seen.psi_full_avg10 or 0.0, 0.0)
        if source == "host":
            blame = self.cause.blame(reading.ts, reading.mem_total, pressure)
        else:  # the slice against the rest of the limited cgroup
            blame = self._cause_of(source).blame(reading.ts, reading.limit_bytes, pressure)
        if not blame.fleet:
            self._hold(reading, trigger, blame, source)
            return None
        for _ in range(3):  # a victim gone between the scan and the kill: look again
            if ready is not None and reading.ts - ready[0] <= PREPARED_FOR:
                chosen = ready[1]
            else:
                chosen = self.choose(reading)
            ready = None
            if chosen is None:
                _say_once(
                    f"none:{self.slice_path}",
                    "the %s is under memory pressure (%s) but no process of the agents "
                    "slice holds %d MiB or more: nothing to kill",
                    "host" if source == "host" else f"memory limit of {source}",
                    trigger,
                    int(_scale(reading) * MIN_VICTIM_SHARE) >> 20,
                )
                return None
            proc = chosen
            if (proc.pid, proc.start_time) in self.killed:
                continue
            # Its size now (one read), not at the scan.
            measured = measure(proc.pid, self.proc_root)
            if measured is not None:
                proc = replace(proc, rss=measured[1], swap=measured[2])
            try:
                # The victim is the process that was chosen (pidfd, start
                # time) and, where agents are cgroups, still in its scope; a
                # process tree's member stays one (_proctrees).
                killed = _kill(
                    proc.pid,
                    proc.start_time,
                    self.proc_root,
                    in_scope=None if self.trees else (self.slice_path.name, proc.unit),
                    slice_dir=None if self.trees else self.slice_path,
                )
            except PermissionError as exc:  # not ours to kill: the next largest then
                _say_once(f"eperm:{proc.pid}", "cannot kill pid %d: %s", proc.pid, exc)
                self.killed[proc.pid, proc.start_time] = None
                continue
            if killed is None:
                continue
            self.killed[proc.pid, proc.start_time] = None
            while len(self.killed) > KILLED_KEPT:
                del self.killed[next(iter(self.killed))]
            # Read ahead by the names thread if it had the time; else its comm.
            cmdline = self.names.get(proc.pid, proc.start_time) or proc.comm
            self.report(reading, trigger, proc, cmdline, killed, source)
            return killed
        return None

    def report(
        self,
        reading: HostReading,
        trigger: Trigger,
        proc: SliceProcess,
        cmdline: str,
        killed: _Killed,
        source: str = "host",
    ) -> None:
        """After the kill: the event (names from the cache given as ``unit_agent``)."""
        on_limit = source != "host"
        crossed = self.clock.crossed_at
        reaction = killed.signalled_at - (crossed if crossed is not None else reading.ts)
        agent = self.unit_agent(proc.unit)
        if agent is None and self.trees:
            # Process mode: no sample names a scope of the mirror; the
            # fleet's record of it does (a read of its runtime directory).
            agent = mirrored_agent(self.slice_path / proc.unit)
        event = GuardKill(
            ts=time.time(),
            agent=agent,
            unit=proc.unit,
            pid=proc.pid,
            comm=_sanitise(proc.comm),
            cmdline=_sanitise(cmdline),
            rss=proc.rss,
            swap=proc.swap,
            trigger=trigger,
            mem_available_percent=round(reading.mem_available_percent, 2),
            swap_free_percent=round(reading.swap_free_percent, 2),
            psi_full_avg10=reading.psi_full_avg10,
            psi_some_avg10=reading.psi_some_avg10,
            reaction_seconds=round(max(reaction, 0.0), 4),
            released=killed.released,
            limit=source,
            limit_bytes=reading.limit_bytes if on_limit else None,
            limit_available_percent=(
                round(reading.limit_available_percent, 2) if on_limit else None
            ),
            call=killed.call,
            processes=killed.processes,
            limit_psi_full_avg10=reading.limit_psi_full_avg10 if on_limit else None,
        )
        where = (
            f"the memory limit of {source} ({reading.limit_bytes >> 20} MiB, "
            f"{reading.limit_available_percent:.1f}% available)"
            if on_limit
            else f"the host (MemAvailable {event.mem_available_percent:.1f}%)"
        )
        whole = (
            f" with its call {killed.call} ({killed.processes} processes)" if killed.call else ""
        )
        log.warning(
            "guard killed pid %d (%s)%s of %s: %d MiB, %s on %s, %.0f ms",
            proc.pid,
            event.comm,
            whole,
            event.agent or proc.unit,
            proc.size >> 20,
            trigger,
            where,
            event.reaction_seconds * 1000,
        )
        self.on_kill(event)
        self.lock.note_kill(event.to_dict())

    def relay(self) -> None:
        """Standing by: the acting guard's kills of agents it could not name but this guard can.

        The acting guard's fleet records the kills it names; one of another
        fleet's agent it does not, and that fleet's guard, standing by,
        tells it here, named (``on_relay``, when given, gets every such kill
        unnamed and decides itself: a guard process's parent does).
        """
        for item in self.lock.new_kills():
            if item.get("agent") is not None:
                continue  # the acting guard named it: its own fleet records it
            unit = item.get("unit")
            if not isinstance(unit, str):
                continue
            agent = None if self.on_relay is not None else self.unit_agent(unit)
            if agent is None and self.on_relay is None:
                continue  # not one of ours: its own fleet's guard tells it
            names = {f.name for f in fields(GuardKill)}
            known = {k: v for k, v in item.items() if k in names}
            try:
                event = GuardKill(**{**known, "agent": agent})
            except (TypeError, ValueError):
                continue
            (self.on_relay or self.on_kill)(event)


def run_guard(
    config: GuardConfig,
    slice_path: Path,
    *,
    stop_fd: int,
    on_kill: Callable[[GuardKill], None],
    unit_agent: Callable[[str], str | None] = lambda unit: None,
    protected: Protected = lambda: ((), ()),
    on_reading: Callable[[HostReading, Trigger | None], None] | None = None,
    proc_root: Path = PROC_ROOT,
    psi_trigger: bool | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    lock_dir: Path | Literal["default"] | None = "default",
    on_held: Callable[[GuardHeld], None] | None = None,
    on_relay: Callable[[GuardKill], None] | None = None,
    on_first: Callable[[], None] | None = None,
) -> None:
    """Guard the agents slice ``slice_path`` until ``stop_fd`` is readable.

    Blocking: run it in a thread (:class:`Guard`) or a process of its own.
    ``on_kill`` gets each :class:`GuardKill` (called from this loop: keep it
    quick, e.g. ``loop.call_soon_threadsafe``), ``on_held`` each
    :class:`GuardHeld` (the host short, but not because of the agents);
    ``on_reading`` every reading and the trigger it gave; ``protected``
    returns the pids and scope units never to kill, asked before each
    choice; ``unit_agent`` names a victim's agent after the kill and must
    not block (a cache: the guard's thread never waits on a registry).
    ``psi_trigger`` None arms a PSI trigger only on the real /proc (a
    trigger is a write). ``lock_dir`` holds the one-guard-per-slice lock
    (:mod:`agentscope_systemd._guard._guardlock`; ``"default"``: /run or
    $XDG_RUNTIME_DIR, None: no lock); while another guard holds it, that
    guard's kills of agents it could not name go to ``on_kill`` when
    ``unit_agent`` names them (or, unfiltered, to ``on_relay``). A reading
    or scan that fails is logged and the loop goes on. ``on_first`` is
    called once, after the first step (read or failed).
    """
    directory = _guardlock.default_lock_dir() if lock_dir == "default" else lock_dir
    lock = SliceLock(slice_path, directory)
    loop = _Loop(
        config,
        slice_path,
        proc_root,
        unit_agent,
        protected,
        on_kill,
        on_reading,
        cgroup_root=cgroup_root,
        lock=lock,
        on_held=on_held,
        on_relay=on_relay,
    )
    poller = select.epoll()
    poller.register(stop_fd, select.EPOLLIN)
    psi_fd = None
    if psi_trigger or (psi_trigger is None and proc_root == PROC_ROOT):
        psi_fd = arm_psi_trigger(proc_root / "pressure" / "memory")
        if psi_fd is not None:
            poller.register(psi_fd, select.EPOLLPRI)
    # A limited cgroup at its memory.high or memory.max wakes the guard at
    # once. Edge-triggered: while it waits for a victim to exit, the wakes
    # that keep coming do not make the wait spin.
    limit_fd = loop.limits.fileno()
    if limit_fd is not None:
        poller.register(limit_fd, select.EPOLLIN | select.EPOLLET)
    failures = 0
    standby_said = False
    try:
        while True:
            try:
                timeout, killed = loop.step()
                failures = 0
            except (OSError, ValueError) as exc:
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.error("guard reading failed (%d in a row): %s", failures, exc)
                timeout, killed = config.max_interval, None
            if on_first is not None:
                first, on_first = on_first, None
                first()
            if lock.note is not None:
                _say_once(f"lock:{lock.path}", "%s", lock.note)
            elif not lock.held and not standby_said:
                standby_said = True
                log.info("another guard watches %s: standing by", slice_path)
            elif lock.held and standby_said:
                standby_said = False
                log.info("the other guard of %s ended: this one acts now", slice_path)
            if killed is not None:
                try:
                    if _wait_exit(poller, killed, stop_fd):
                        return
                finally:
                    os.close(killed.pidfd)
                loop.clock.restart(time.monotonic())
                continue
            deadline = time.monotonic() + timeout
            while True:
                woke = poller.poll(max(deadline - time.monotonic(), 0.0))
                for fd, mask in woke:
                    if fd == stop_fd:
                        return
                    if fd == psi_fd and mask & select.EPOLLERR:
                        poller.unregister(psi_fd)
                        os.close(psi_fd)
                        psi_fd = None
                    if fd == limit_fd:
                        loop.limits.drain()
                # A limit's wake-up does not hurry a guard that has just held
                # its hand or found nothing to kill: it looks again at its pace.
                if not (loop.idle_trigger and woke and all(fd == limit_fd for fd, _ in woke)):
                    break
    finally:
        lock.release()
        loop.limits.close()
        loop.names.close()
        loop.host.close()
        poller.close()
        if psi_fd is not None:
            os.close(psi_fd)


def _wait_exit(poller: select.epoll, killed: _Killed, stop_fd: int) -> bool:
    """Wait for the victim to exit (its pidfd readable), at most VICTIM_WAIT; True: stop."""
    poller.register(killed.pidfd, select.EPOLLIN)
    try:
        deadline = killed.signalled_at + VICTIM_WAIT
        while (left := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(left))
            if stop_fd in ready:
                return True
            if killed.pidfd in ready:
                return False
        return False
    finally:
        poller.unregister(killed.pidfd)
