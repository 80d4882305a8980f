"""Kill counting: which OOM kills happened, in which scope, and who the victim was.

No I/O and no asyncio: a :class:`KillCounter` takes the monitor's samples
(:class:`~agentscope_systemd._monitor._sampling._Sample`), the notes the monitor passes on
(kernel log lines, reaped children, scopes created or deleted) and the
time, and returns the events to emit. The :class:`~agentscope_systemd.Monitor`
does the reading and the waiting.

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
that the fleet reaped with SIGKILL (``"reaped"``, via
:meth:`KillCounter.note_exit`), else the largest process that left the
scope since the last sample (``"cgroup"``, :func:`oom_victims`). A victim
still exiting is waited for up to :data:`VICTIM_GRACE` seconds before the
kill is reported without a name.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._events import Event, LimitFound, OomKill, Throttled, _Source
from .._kernel._cgroup import LimitHolder, MemoryEvents
from ._attribution import KernelOomKill, SeenProcess, Throttle, counter_delta, oom_victims
from ._recovery import Baseline, unit_of_memcg
from ._sampling import _Sample, _ScopePlan, _ThrottleCandidate

__all__ = ["KillCounter"]

#: How long a counted kill waits for its victim to leave the scope (the
#: killed task may still be exiting when the counter moves).
VICTIM_GRACE = 1.0
#: ... when the kernel's lines come through the journal (journald, then a
#: ``journalctl --follow``: later than /dev/kmsg's, seconds later on a loaded
#: host, which is when kills happen). Only a kill that no line names waits
#: this long; a named one is reported as its line arrives.
JOURNAL_GRACE = 10.0
#: Notes from the kernel log and from reaped children are kept this long.
NOTE_TTL = 120.0
#: A scope's processes are all sized at least every this many samples (see
#: :data:`~agentscope_systemd._monitor._sampling.RSS_SLACK`).
FULL_PASS_EVERY = 5

_MAX_THROTTLED = 1024  # units whose throttling the monitor remembers at once
_MAX_THROTTLED_PIDS = 64  # pids one throttled event names
_MAX_HELD = 1024  # ended scopes whose kills wait for the kernel's word at once
_MAX_LIMITS = 256  # units whose limits a monitor remembers (the slice and those above it)
_MAX_NAMED = 4096  # victims named without the kernel's line, remembered for NOTE_TTL


@dataclass(slots=True)
class _ScopeState:
    """What the counter remembers of one scope between samples."""

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
    pass_tick: int = 0  # ... at that sample (KillCounter._tick)
    new: frozenset[int] = frozenset()  # pids first seen in the last sample


@dataclass(slots=True)
class _SliceKills:
    """Kills only the slice counted, their scopes gone, waiting for the kernel's word."""

    since: float
    count: int
    ended: dict[str, _ScopeState | None]


class KillCounter:
    """The monitor's counting state: kills, victims, throttling, limits (no I/O).

    ``slice_path`` is the agents slice's cgroup directory, ``unit_agent``
    maps a unit to its agent; ``manager`` ("auto", "system", "user") picks
    the ``systemctl`` of a throttle's fix and ``throttle_window`` bounds
    repeated :class:`Throttled` events for one limit to one per window.
    Each sample: :meth:`plans` before reading, :meth:`count` after, then
    :meth:`report_throttles` with what the flagged cgroups showed. The
    ``note_*`` methods take what arrives between samples.
    """

    def __init__(
        self,
        *,
        slice_path: Path,
        unit_agent: Callable[[str], str | None],
        manager: str = "auto",
        throttle_window: float = 30.0,
    ) -> None:
        self.slice_path = slice_path
        self.unit_agent = unit_agent
        self.manager = manager
        self.throttle_window = throttle_window
        self._out: list[Event] = []  # events of the call in progress
        self._first = True
        self._tick = 0  # samples applied
        self._scopes: dict[str, _ScopeState] = {}
        self._slice_events: MemoryEvents | None = None
        self._slice_own: MemoryEvents | None = None  # its memory.events.local
        self._ancestor_events: dict[Path, MemoryEvents] = {}
        self._slice_kills = 0  # kills counted in the slice's counter since start
        self._scope_kills = 0  # ... in scopes' counters
        self._slice_only_kills = 0  # ... reported from the slice alone
        self._kernel_kills: dict[int, tuple[float, KernelOomKill]] = {}
        self._kernel_via: dict[int, _Source] = {}  # pid -> "kmsg" or "journal"
        #: How long a counted kill waits for its victim's name; with the
        #: journal as the kernel's log, the kernel's word is awaited that long
        #: before a guess from the processes that left (set by the monitor).
        self.victim_grace = VICTIM_GRACE
        self.await_kernel = False
        #: A kernel log (/dev/kmsg or the journal) is read (set by the monitor): a
        #: kill only the slice counted waits up to ``victim_grace`` for its word.
        self.kernel_log = False
        # pid -> the cgroup the kernel's "oom-kill:...,task_memcg=" line named
        self._kernel_memcg: dict[int, str] = {}
        # unit -> pid -> (when reaped, comm known from the launch or None)
        self._reaped: dict[str, dict[int, tuple[float, str | None]]] = {}
        self._guard_killed: set[int] = set()  # pids the guard killed: not OOM victims
        # Kills of ended scopes still waiting for the kernel's word (await_kernel):
        # a scope often ends with its victim, before journald has passed the line on.
        self._held: dict[str, _ScopeState] = {}
        self._slice_held: list[_SliceKills] = []
        # pid -> when it was named without the kernel's line (reaped, cgroup): that
        # line, arriving later, must not name another kill of the scope.
        self._named: dict[int, float] = {}
        self._created: set[str] = set()
        self._deleted: set[str] = set()
        # unit -> the (high, max) last reported: one entry per unit, whatever
        # its limits were set to over the monitor's life (#31), at most _MAX_LIMITS.
        self._limits_seen: dict[str, tuple[int | None, int | None]] = {}
        self._throttle_next: dict[tuple[str, str | None], float] = {}
        self._throttle_acc: dict[tuple[str, str | None], tuple[int, set[int]]] = {}

    @property
    def pending(self) -> bool:
        """Some counted kill still waits for its victim (sample again soon).

        Not the kills of ended scopes held for the kernel's word: no sample can
        name those sooner; the line wakes the monitor, or a sample after the
        grace reports them.
        """
        return any(s.pending for s in self._scopes.values())

    # -- notes between samples ----------------------------------------------

    def note_scope_created(self, unit: str) -> None:
        """Inotify saw the scope's cgroup appear."""
        self._created.add(unit)

    def note_scope_deleted(self, unit: str) -> None:
        """Inotify saw the scope's cgroup go."""
        self._deleted.add(unit)

    def note_kernel_task(self, pid: int, memcg: str) -> None:
        """The kernel log's ``oom-kill:`` line put ``pid`` in cgroup ``memcg``."""
        self._kernel_memcg[pid] = memcg

    def note_kernel_kill(self, kill: KernelOomKill, now: float, via: _Source = "kmsg") -> None:
        """The kernel log's ``Killed process`` line, read from ``via`` (kmsg or journal)."""
        if kill.pid in self._named:
            return  # its kill is reported already, named by other evidence
        self._kernel_kills[kill.pid] = (now, kill)
        self._kernel_via[kill.pid] = via

    def accounted(self) -> Baseline:
        """The counters whose kills are reported: the last sample's, less the kills
        still waiting for their victim (what a recovery must not count again)."""
        pending = sum(s.pending for s in self._scopes.values())
        pending += sum(s.pending for s in self._held.values())
        pending += sum(h.count for h in self._slice_held)
        slice_kills = 0 if self._slice_events is None else self._slice_events.oom_kill
        scopes = {u: s.oom_kill - s.pending for u, s in self._scopes.items()}
        return Baseline(None, slice_kills - pending, scopes)

    def agents(self) -> dict[str, str]:
        """The agent of each scope seen so far, by unit (the guard's names, known ahead)."""
        return {u: s.agent for u, s in self._scopes.items() if s.agent is not None}

    def note_guard_kill(self, pid: int) -> None:
        """The guard killed ``pid``: its SIGKILL exit is not an OOM victim's."""
        self._guard_killed.add(pid)

    def note_exit(
        self, unit: str, pid: int, returncode: int | None, comm: str | None, now: float
    ) -> None:
        """The fleet reaped ``pid`` of ``unit``: a SIGKILL names an OOM victim there."""
        if returncode == -signal.SIGKILL and pid not in self._guard_killed:
            self._reaped.setdefault(unit, {})[pid] = (now, comm)

    # -- samples --------------------------------------------------------------

    def plans(self) -> dict[str, _ScopePlan]:
        """What the next sample must know of each scope."""
        tick = self._tick
        return {
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

    def count(self, sample: _Sample, now: float) -> tuple[list[Event], list[_ThrottleCandidate]]:
        """Apply one sample: the events it shows, and the cgroups to check for throttling."""
        candidates = self._count(sample, now)
        self._first = False
        self._tick += 1
        return self._take(), candidates

    def report_throttles(self, throttles: Iterable[Throttle], now: float) -> list[Event]:
        """The :class:`Throttled` events due for what the flagged cgroups showed."""
        self._report_throttles(throttles, now)
        return self._take()

    def _take(self) -> list[Event]:
        # A count that raised half-way left its events here: they go out with
        # the next call's, late but never lost nor doubled.
        out, self._out = self._out, []
        return out

    def _emit(self, event: Event) -> None:
        self._out.append(event)

    def _count(self, sample: _Sample, now: float) -> list[_ThrottleCandidate]:
        """Apply one sample: kills, limits; returns the cgroups to check for throttling."""
        first = self._first
        self._prune_notes(now)
        # The slice, read first.
        slice_prev = self._slice_events
        if sample.slice_events is not None:
            events = sample.slice_events
            if not first:
                prev_kills = 0 if slice_prev is None else slice_prev.oom_kill
                self._slice_kills += counter_delta(prev_kills, events.oom_kill)
            self._slice_events = events
        else:
            # Gone: a slice that comes back is a new cgroup, counting from 0.
            self._slice_events = None
        own_prev, self._slice_own = self._slice_own, sample.slice_own
        slice_high_delta = 0
        if sample.slice_own is not None and not first:
            slice_high_delta = counter_delta(
                0 if own_prev is None else own_prev.high, sample.slice_own.high
            )
        # Its scopes.
        candidates: list[_ThrottleCandidate] = []
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
                self._name_kills(state, {}, now, final=not self.await_kernel)
                if state.pending:
                    self._hold(state, now)
            ended[unit] = state
        for unit, state in list(self._held.items()):
            if unit not in ended:  # (one that ended just now was tried above)
                self._name_kills(state, {}, now)
            if not state.pending:
                del self._held[unit]
        for unit in (self._created | self._deleted) - sample.scopes.keys():
            ended.setdefault(unit, None)
        self._created.clear()
        self._deleted.clear()
        # Kills only the slice saw: their scope vanished before it was read.
        slice_only = self._slice_kills - self._scope_kills - self._slice_only_kills
        if slice_only > 0:
            self._slice_only_kills += slice_only
            self._slice_held.append(_SliceKills(now, slice_only, ended))
        for held in list(self._slice_held):
            # With no word of the kernel's, a slice-only kill in a sample that saw
            # several scopes end (or none) has no agent: worth the wait (CI, trixie).
            due = not self.kernel_log or now - held.since >= self.victim_grace
            held.count = self._report_slice_only(
                held.count, held.ended, now, live=sample.scopes.keys(), guess=due
            )
            if held.count <= 0:
                self._slice_held.remove(held)
        # Throttling by the slice's or an ancestor's own MemoryHigh: their local
        # counters count only it. (The hierarchical ones, less the level below,
        # were a race: a scope throttled on while the sample read the levels one
        # after the other passed for its ancestor's throttle.)
        if sample.slice_own is not None and slice_high_delta > 0:
            candidates.append(
                _ThrottleCandidate(
                    self.slice_path, own_prev, sample.slice_own, tuple(all_pids), False
                )
            )
        for path, events in sample.ancestors:
            prev = self._ancestor_events.get(path)
            self._ancestor_events[path] = events
            if first or prev is None:
                continue
            if counter_delta(prev.high, events.high) > 0 and all_pids:
                candidates.append(_ThrottleCandidate(path, prev, events, tuple(all_pids), True))
        # Limits on the slice and above.
        for holder in sample.limits:
            limits = (holder.high, holder.max)
            if self._limits_seen.get(holder.unit) != limits:
                self._limits_seen.pop(holder.unit, None)  # re-inserted last: the newest
                if len(self._limits_seen) >= _MAX_LIMITS:
                    self._limits_seen.pop(next(iter(self._limits_seen)))
                self._limits_seen[holder.unit] = limits
                self._emit(LimitFound(now, holder.unit, holder))
        return candidates

    # -- naming victims ---------------------------------------------------

    def _hold(self, state: _ScopeState, now: float) -> None:
        """Keep an ended scope's unnamed kills until the kernel's word or their grace."""
        if len(self._held) >= _MAX_HELD:
            oldest = min(self._held, key=lambda u: self._held[u].pending_since)
            self._name_kills(self._held.pop(oldest), {}, now, final=True)
        self._held[state.unit] = state

    def _prune_notes(self, now: float) -> None:
        for pid, ts in list(self._named.items()):
            if now - ts > NOTE_TTL or len(self._named) > _MAX_NAMED:
                del self._named[pid]
        for pid, (ts, _) in list(self._kernel_kills.items()):
            if now - ts > NOTE_TTL:
                del self._kernel_kills[pid]
                self._kernel_memcg.pop(pid, None)
                self._kernel_via.pop(pid, None)
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
        *,
        guess: bool = True,
    ) -> list[tuple[int, str | None, int | None, _Source]]:
        """Up to ``count`` victims in ``unit`` as (pid, comm, last RSS, source), best first.

        ``guess`` False: only the kernel's word or a reaped child, no ``"cgroup"`` guess.
        """
        found: list[tuple[int, str | None, int | None, _Source]] = []
        reaped = self._reaped.get(unit, {})
        for pid in list(self._kernel_kills):
            if len(found) >= count:
                break
            # A victim born and killed between two samples was never seen; the
            # kernel's own line then says which cgroup it was in.
            memcg = self._kernel_memcg.get(pid, "")
            if pid in seen or pid in reaped or self._unit_of(memcg) == unit:
                _, kill = self._kernel_kills.pop(pid)
                self._kernel_memcg.pop(pid, None)
                via = self._kernel_via.pop(pid, "kmsg")
                reaped.pop(pid, None)
                last = seen.get(pid)
                # Never seen by a sample: its RSS as the kernel's line gave it.
                found.append((pid, kill.comm, kill.rss if last is None else last.rss, via))
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
        for p in oom_victims(rest, alive, count - len(found)) if guess else ():
            found.append((p.pid, p.comm, p.rss, "cgroup"))
        return found

    def _unit_of(self, memcg: str) -> str | None:
        """The scope of the slice that the kernel's ``task_memcg`` is in, or None.

        A delegated scope's processes are in its sub-cgroups (the agent's leaf,
        a call's cgroup: #26), so the victim's cgroup is the scope or below it.
        The slice is matched by its name: the kernel prints the path from the
        root of the whole hierarchy, which a cgroup namespace (a container)
        does not show its processes.
        """
        parts = memcg.split("/")
        if self.slice_path.name not in parts[:-1]:
            return None
        base = "/".join(parts[: parts.index(self.slice_path.name) + 1])
        return unit_of_memcg(memcg, base)

    def _name_kills(
        self, state: _ScopeState, alive: Mapping[int, int], now: float, *, final: bool = False
    ) -> None:
        """Report the scope's pending kills whose victims are known (all of them once due)."""
        due = final or now - state.pending_since >= self.victim_grace
        # The journal's line comes later than the counter: until it is due, wait
        # for the kernel's word rather than guess (a process that merely exited
        # in the same interval would pass for the victim).
        guess = not self.await_kernel or due
        for pid, comm, rss, source in self._victims(
            state.unit, state.pending_seen, alive, state.pending, guess=guess
        ):
            state.pending -= 1
            state.pending_seen.pop(pid, None)
            self._report(OomKill(now, state.agent, state.unit, pid, comm, rss, source))
        if state.pending and due:
            for _ in range(state.pending):
                self._emit(OomKill(now, state.agent, state.unit, None, None, None, "cgroup"))
            state.pending = 0
        if not state.pending:
            state.pending_seen.clear()

    def _report(self, kill: OomKill) -> None:
        if kill.pid is not None and kill.source in ("reaped", "cgroup"):
            self._named[kill.pid] = kill.ts
        self._emit(kill)

    def _report_slice_only(
        self,
        count: int,
        ended: Mapping[str, _ScopeState | None],
        now: float,
        *,
        live: Iterable[str] = (),
        guess: bool = True,
    ) -> int:
        """Report ``count`` kills of the ``ended`` scopes; return how many are left.

        ``live`` are the scopes the sample listed. ``guess`` False: only those
        the kernel's word or a reaped child names.
        """
        # A kernel log line or a reaped child can tie a kill to one of the
        # ended scopes even when several ended; the kernel's line also names
        # a scope of the slice that no sample saw end (not a live one: a kill
        # there is that scope's own, counted by its counter).
        units: dict[str, _ScopeState | None] = dict(ended)
        listed = set(live)
        for pid in self._kernel_kills:
            unit = self._unit_of(self._kernel_memcg.get(pid, ""))
            if unit is not None and unit not in listed:
                units.setdefault(unit, None)
        for unit, state in units.items():
            if count <= 0:
                break
            seen = {} if state is None else state.seen
            agent = self.unit_agent(unit) if state is None else state.agent
            for pid, comm, rss, source in self._victims(unit, seen, {}, count, guess=False):
                count -= 1
                self._report(OomKill(now, agent, unit, pid, comm, rss, source))
        if count <= 0 or not guess:
            return max(count, 0)
        if len(ended) == 1:
            ((unit, state),) = ended.items()
            seen = {} if state is None else state.seen
            agent = self.unit_agent(unit) if state is None else state.agent
            victims = oom_victims(seen, {}, count)
            for p in victims:
                self._report(OomKill(now, agent, unit, p.pid, p.comm, p.rss, "cgroup"))
            for _ in range(count - len(victims)):
                self._emit(OomKill(now, agent, unit, None, None, None, "cgroup"))
            return 0
        for _ in range(count):
            self._emit(OomKill(now, None, None, None, None, None, "cgroup"))
        return 0

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
            self._throttle_next[key] = now + self.throttle_window
            fix = None if t.limit is None else self._fix(t.limit)
            self._emit(Throttled(now, t.cgroup.name, delta, tuple(sorted(pids)), limit_unit, fix))
