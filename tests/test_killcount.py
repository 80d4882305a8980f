"""Tests for _monitor/_killcount.py: the monitor's kill counting, fed samples by hand.

The :class:`KillCounter` does no I/O, so these tests build the samples a
monitor would read (the slice's and each scope's ``memory.events``, the
scopes' processes) and check the events it returns: which kills, in which
scope, with which victim, and each once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from agentscope_systemd._events import Event, LimitFound, OomKill, Throttled
from agentscope_systemd._kernel._cgroup import LimitHolder, MemoryEvents
from agentscope_systemd._monitor import _killcount
from agentscope_systemd._monitor._attribution import KernelOomKill, SeenProcess, Throttle
from agentscope_systemd._monitor._killcount import (
    FULL_PASS_EVERY,
    JOURNAL_GRACE,
    NOTE_TTL,
    VICTIM_GRACE,
    KillCounter,
)
from agentscope_systemd._monitor._sampling import _Sample, _ScopeSample

SLICE = Path("/sys/fs/cgroup/app.slice/app-agentscope-agents.slice")
ALICE = "agentscope-f-alice-a1b2c3.scope"
BOB = "agentscope-f-bob-d4e5f6.scope"
CAROL = "agentscope-f-carol-a7b8c9.scope"
STRANGER = "run-u42.scope"

Procs = Mapping[int, tuple[str, int]]  # pid -> (comm, rss)


def unit_agent(unit: str) -> str | None:
    """The fleet ``f``'s agents: ``agentscope-f-NAME-XXXXXX.scope``."""
    if not unit.startswith("agentscope-f-"):
        return None
    return unit.removeprefix("agentscope-f-").rsplit("-", 1)[0]


def events(oom_kill: int = 0, high: int = 0) -> MemoryEvents:
    return MemoryEvents(low=0, high=high, max=0, oom=oom_kill, oom_kill=oom_kill)


def scope(procs: Procs, oom_kill: int = 0, high: int = 0) -> _ScopeSample:
    seen = {pid: SeenProcess(pid, 1000 + pid, comm, rss) for pid, (comm, rss) in procs.items()}
    return _ScopeSample(
        current=sum(rss for _, rss in procs.values()),
        events=events(oom_kill, high),
        procs=seen,
        passed=True,
    )


def sample(
    slice_kills: int | None,
    scopes: Mapping[str, _ScopeSample],
    *,
    slice_high: int = 0,
    slice_own_high: int = 0,
    ancestors: tuple[tuple[Path, MemoryEvents], ...] = (),
    limits: tuple[LimitHolder, ...] = (),
) -> _Sample:
    """A sample; ``slice_kills`` None: the slice is gone. ``slice_high`` is its
    hierarchical ``high``, ``slice_own_high`` its own (memory.events.local)."""
    return _Sample(
        slice_events=None if slice_kills is None else events(slice_kills, slice_high),
        slice_own=None if slice_kills is None else events(0, slice_own_high),
        slice_pressure=None,
        scopes=dict(scopes),
        ancestors=ancestors,
        limits=limits,
        meminfo=None,
        host_pressure=None,
        watches=None,
    )


def counter(**kw: object) -> KillCounter:
    return KillCounter(slice_path=SLICE, unit_agent=unit_agent, **kw)  # type: ignore[arg-type]


def kills(got: list[Event]) -> list[tuple[str | None, str | None, int | None, str | None, str]]:
    """(agent, unit, pid, comm, source) of each OomKill, in order."""
    return [(e.agent, e.unit, e.pid, e.comm, e.source) for e in got if isinstance(e, OomKill)]


def count(c: KillCounter, s: _Sample, now: float) -> list[Event]:
    got, _ = c.count(s, now)
    return got


BOTH = {101: ("sh", 4096), 102: ("python3", 9 << 20)}
SH = {101: ("sh", 4096)}


def test_a_kill_is_counted_once_and_names_the_largest_process_gone() -> None:
    c = counter()
    assert count(c, sample(0, {ALICE: scope(BOTH)}), 0.0) == []  # the baseline
    got = count(c, sample(1, {ALICE: scope(SH, oom_kill=1)}), 1.0)
    assert kills(got) == [("alice", ALICE, 102, "python3", "cgroup")]
    (kill,) = got
    assert isinstance(kill, OomKill)
    assert kill.rss_last_seen == 9 << 20
    # The same counters again, the slice's included: nothing new.
    for t in (2.0, 3.0, 10.0):
        assert count(c, sample(1, {ALICE: scope(SH, oom_kill=1)}), t) == []


def test_kills_before_the_baseline_are_not_reported() -> None:
    c = counter()
    assert count(c, sample(3, {ALICE: scope(SH, oom_kill=3)}), 0.0) == []
    assert count(c, sample(3, {ALICE: scope(SH, oom_kill=3)}), 1.0) == []
    # A scope that appears later is a new cgroup: its every kill is news.
    both = {ALICE: scope(SH, oom_kill=3), BOB: scope({}, oom_kill=1)}
    assert count(c, sample(4, both), 2.0) == []  # its victim may still be leaving
    got = count(c, sample(4, both), 2.0 + VICTIM_GRACE)
    assert kills(got) == [("bob", BOB, None, None, "cgroup")]


def test_a_kill_in_a_scope_that_vanished_in_the_same_tick_is_its_agents() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH), BOB: scope(SH)}), 0.0)
    # Alice's scope ended before this sample read it; only the slice counted the kill.
    got = count(c, sample(1, {BOB: scope(SH)}), 1.0)
    assert kills(got) == [("alice", ALICE, 102, "python3", "cgroup")]
    assert count(c, sample(1, {BOB: scope(SH)}), 2.0) == []


def test_a_kill_in_a_scope_never_sampled_is_named_from_inotify() -> None:
    c = counter()
    count(c, sample(0, {BOB: scope(SH)}), 0.0)
    # Born and killed between two samples: inotify saw it come and go.
    c.note_scope_created(CAROL)
    c.note_scope_deleted(CAROL)
    got = count(c, sample(1, {BOB: scope(SH)}), 1.0)
    assert kills(got) == [("carol", CAROL, None, None, "cgroup")]


def test_slice_only_kill_with_several_scopes_gone_names_no_scope() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH), BOB: scope(BOTH), CAROL: scope(SH)}), 0.0)
    got = count(c, sample(1, {CAROL: scope(SH)}), 1.0)
    # Two scopes ended: guessing the one would be a lie.
    assert kills(got) == [(None, None, None, None, "cgroup")]


def test_slice_only_kill_is_tied_to_its_scope_by_the_kernel_log() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH), BOB: scope(SH), CAROL: scope(SH)}), 0.0)
    c.note_kernel_task(102, "/app.slice/app-agentscope-agents.slice/" + ALICE)
    c.note_kernel_kill(KernelOomKill(102, "python3", memcg=True), 0.5)
    got = count(c, sample(1, {CAROL: scope(SH)}), 1.0)
    assert kills(got) == [("alice", ALICE, 102, "python3", "kmsg")]


def test_a_victim_never_sampled_is_named_by_the_kernel_logs_cgroup() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(SH), BOB: scope(SH)}), 0.0)
    # Forked and killed between two samples: only the kernel's lines know it.
    c.note_kernel_task(555, "/app.slice/app-agentscope-agents.slice/" + BOB)
    c.note_kernel_kill(KernelOomKill(555, "cc1plus", memcg=True), 0.5)
    got = count(c, sample(1, {ALICE: scope(SH), BOB: scope(SH, oom_kill=1)}), 1.0)
    assert kills(got) == [("bob", BOB, 555, "cc1plus", "kmsg")]


def test_a_pending_kill_whose_scope_ends_is_reported_once() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    assert count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 1.0) == []  # victim listed
    got = count(c, sample(1, {}), 1.1)  # the scope ended: its last processes all left
    assert kills(got) == [("alice", ALICE, 102, "python3", "cgroup")]
    assert count(c, sample(1, {}), 5.0) == []


def test_a_stranger_scopes_kill_is_reported_without_an_agent() -> None:
    c = counter()
    count(c, sample(0, {STRANGER: scope(BOTH)}), 0.0)
    got = count(c, sample(1, {STRANGER: scope(SH, oom_kill=1)}), 1.0)
    assert kills(got) == [(None, STRANGER, 102, "python3", "cgroup")]


def test_a_victim_still_listed_is_waited_for_then_reported_unnamed() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    assert count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 1.0) == []
    assert c.pending  # the monitor samples again soon
    plans = c.plans()
    assert plans[ALICE].pending
    assert plans[ALICE].force
    assert count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 1.0 + VICTIM_GRACE / 2) == []
    got = count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 1.0 + VICTIM_GRACE)
    assert kills(got) == [("alice", ALICE, None, None, "cgroup")]
    assert not c.pending
    assert count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 5.0) == []


def test_a_victim_that_leaves_within_the_grace_is_named() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    assert count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 1.0) == []
    got = count(c, sample(1, {ALICE: scope(SH, oom_kill=1)}), 1.2)
    assert kills(got) == [("alice", ALICE, 102, "python3", "cgroup")]


def test_the_reaped_child_is_the_victim_but_not_one_the_guard_killed() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH), BOB: scope(BOTH)}), 0.0)
    c.note_exit(ALICE, 101, -9, "claude", 0.5)  # the launched child, SIGKILLed
    c.note_guard_kill(201)
    c.note_exit(BOB, 201, -9, "node", 0.5)  # the guard's kill: not an OOM victim
    c.note_exit(BOB, 101, 0, "sh", 0.5)  # a clean exit names nothing
    got = count(c, sample(2, {ALICE: scope(BOTH, oom_kill=1), BOB: scope(SH, oom_kill=1)}), 1.0)
    assert sorted(kills(got)) == [
        ("alice", ALICE, 101, "claude", "reaped"),
        ("bob", BOB, 102, "python3", "cgroup"),
    ]


def test_notes_older_than_their_ttl_are_pruned() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    c.note_kernel_kill(KernelOomKill(102, "python3", memcg=True), 0.0)
    c.note_exit(ALICE, 101, -9, "sh", 0.0)
    later = NOTE_TTL + 1.0
    count(c, sample(0, {ALICE: scope(BOTH)}), later)  # prunes them
    assert c._kernel_kills == {}
    assert c._reaped == {}
    got = count(c, sample(1, {ALICE: scope(SH, oom_kill=1)}), later + 1.0)
    # Named from the cgroup, not from the stale kernel line.
    assert kills(got) == [("alice", ALICE, 102, "python3", "cgroup")]


def test_fresh_notes_are_kept() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    c.note_kernel_kill(KernelOomKill(102, "python3", memcg=True), 0.0)
    count(c, sample(0, {ALICE: scope(BOTH)}), NOTE_TTL - 1.0)
    got = count(c, sample(1, {ALICE: scope(SH, oom_kill=1)}), NOTE_TTL - 0.5)
    assert kills(got) == [("alice", ALICE, 102, "python3", "kmsg")]


def test_task_lines_without_their_kill_line_are_bounded() -> None:
    c = counter()
    count(c, sample(0, {}), 0.0)
    for pid in range(1000):
        c.note_kernel_task(pid, "/x.slice/y.scope")
    count(c, sample(0, {}), 1.0)
    assert len(c._kernel_memcg) <= 64


# -- a user's monitor: the kernel's word comes late, through the journal -------------

MEMCG = "/user.slice/user-1000.slice/user@1000.service/app.slice/app-agentscope-agents.slice/"


def journal_counter() -> KillCounter:
    c = counter()
    c.victim_grace, c.await_kernel, c.kernel_log = JOURNAL_GRACE, True, True  # as the monitor
    return c


def kmsg_counter() -> KillCounter:
    c = counter()
    c.kernel_log = True  # root's monitor reads /dev/kmsg
    return c


def journal_line(c: KillCounter, unit: str, pid: int, comm: str, now: float) -> None:
    c.note_kernel_task(pid, MEMCG + unit)
    c.note_kernel_kill(KernelOomKill(pid, comm, memcg=True, rss=300 << 20), now, "journal")


def test_a_scope_that_ends_with_its_victim_still_waits_for_the_journal() -> None:
    # Seen on sid under load: the tool call (never sampled) and then the agent's
    # shell were OOM-killed; the scope ended before journald passed either line on.
    c = journal_counter()
    count(c, sample(0, {ALICE: scope(SH)}), 0.0)
    c.note_exit(ALICE, 101, -9, "sh", 0.9)
    assert kills(count(c, sample(2, {ALICE: scope({}, oom_kill=2)}), 1.0)) == [
        ("alice", ALICE, 101, "sh", "reaped")
    ]
    assert count(c, sample(2, {}), 1.5) == []  # ended: the tail's kill is held, not guessed
    assert c.accounted().slice_oom_kill == 1  # the held kill is not reported yet
    journal_line(c, ALICE, 102, "tail", 4.0)
    journal_line(c, ALICE, 101, "sh", 4.0)  # reported already, as reaped
    got = count(c, sample(2, {}), 4.2)
    assert kills(got) == [("alice", ALICE, 102, "tail", "journal")]
    (kill,) = got
    assert isinstance(kill, OomKill)
    assert kill.rss_last_seen == 300 << 20
    assert c.accounted().slice_oom_kill == 2
    assert count(c, sample(2, {}), 4.4) == []


def test_a_late_line_for_a_reaped_victim_names_no_later_kill() -> None:
    c = journal_counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    c.note_exit(ALICE, 101, -9, "sh", 0.9)
    assert kills(count(c, sample(1, {ALICE: scope({102: BOTH[102]}, oom_kill=1)}), 1.0)) == [
        ("alice", ALICE, 101, "sh", "reaped")
    ]
    journal_line(c, ALICE, 101, "sh", 2.0)  # its line, late
    got = count(c, sample(2, {ALICE: scope({102: BOTH[102]}, oom_kill=2)}), 3.0)
    assert kills(got) == []  # a second kill: sh's line must not name it
    journal_line(c, ALICE, 555, "cc1plus", 3.5)
    assert kills(count(c, sample(2, {ALICE: scope({102: BOTH[102]}, oom_kill=2)}), 3.6)) == [
        ("alice", ALICE, 555, "cc1plus", "journal")
    ]


def test_a_held_kill_with_no_line_is_reported_unnamed_once_its_grace_is_over() -> None:
    c = journal_counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    assert count(c, sample(1, {ALICE: scope(BOTH, oom_kill=1)}), 1.0) == []
    assert count(c, sample(1, {}), 1.2) == []  # ended; python3 left too, but is not guessed
    assert count(c, sample(1, {}), 1.0 + JOURNAL_GRACE / 2) == []
    got = count(c, sample(1, {}), 1.0 + JOURNAL_GRACE)
    assert kills(got) == [("alice", ALICE, 102, "python3", "cgroup")]
    assert c.accounted().slice_oom_kill == 1
    assert count(c, sample(1, {}), 2.0 + JOURNAL_GRACE) == []


def test_a_slice_only_kill_waits_for_the_journal_then_guesses() -> None:
    c = journal_counter()
    count(c, sample(0, {ALICE: scope(BOTH), BOB: scope({202: ("node", 5 << 20)})}), 0.0)
    # Both scopes ended unread; one kill in the slice, no line yet.
    assert count(c, sample(1, {}), 1.0) == []
    assert c.accounted().slice_oom_kill == 0
    journal_line(c, BOB, 202, "node", 2.0)
    assert kills(count(c, sample(1, {}), 2.1)) == [("bob", BOB, 202, "node", "journal")]
    assert c.accounted().slice_oom_kill == 1
    # One more, never named: after the grace, no scope to name (two ended).
    count(c, sample(1, {CAROL: scope(SH)}), 3.0)
    assert count(c, sample(2, {}), 4.0) == []
    got = count(c, sample(2, {}), 4.0 + JOURNAL_GRACE)
    assert kills(got) == [("carol", CAROL, 101, "sh", "cgroup")]


def test_a_slice_only_kill_with_two_scopes_gone_waits_for_the_kernels_line() -> None:
    # Seen in CI (trixie, root): the kill's scope and another ended in one
    # sample, the kmsg line not read yet: the kill went out with no agent.
    c = kmsg_counter()
    count(c, sample(0, {ALICE: scope(BOTH), BOB: scope({202: ("node", 5 << 20)})}), 0.0)
    assert count(c, sample(1, {}), 1.0) == []
    journal_line(c, BOB, 202, "node", 1.1)  # (the same lines come from kmsg)
    assert kills(count(c, sample(1, {}), 1.2)) == [("bob", BOB, 202, "node", "journal")]
    # No line within the grace: unnamed, as before.
    count(c, sample(1, {ALICE: scope(BOTH), CAROL: scope(SH)}), 2.0)
    assert count(c, sample(2, {}), 3.0) == []
    got = count(c, sample(2, {}), 3.0 + VICTIM_GRACE)
    assert kills(got) == [(None, None, None, None, "cgroup")]


def test_the_kernels_line_names_a_slice_only_kill_in_a_scope_no_sample_saw_end() -> None:
    c = kmsg_counter()
    count(c, sample(0, {ALICE: scope(SH)}), 0.0)
    # Carol's scope came, was killed and went between two samples, and
    # inotify has not told yet: only the kernel's line knows it.
    journal_line(c, CAROL, 303, "cc1plus", 0.5)
    got = count(c, sample(1, {ALICE: scope(SH)}), 1.0)
    assert kills(got) == [("carol", CAROL, 303, "cc1plus", "journal")]


def test_a_live_scopes_kernel_line_is_not_taken_for_a_slice_only_kill() -> None:
    c = kmsg_counter()
    count(c, sample(0, {ALICE: scope(SH), BOB: scope(BOTH), CAROL: scope(SH)}), 0.0)
    # Bob's kill happened after this sample read his counter; the slice's
    # kill is one of the two scopes that ended.
    journal_line(c, BOB, 102, "python3", 0.9)
    got = count(c, sample(1, {BOB: scope(BOTH)}), 1.0)
    assert kills(got) == []
    got = count(c, sample(2, {BOB: scope(SH, oom_kill=1)}), 1.0 + VICTIM_GRACE)
    assert kills(got) == [
        ("bob", BOB, 102, "python3", "journal"),
        (None, None, None, None, "cgroup"),
    ]


# -- throttling and limits ---------------------------------------------------------

USER_SLICE = Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice")
HOLDER = LimitHolder(USER_SLICE / "app-agentscope.slice", high=1 << 30, max=None)


def throttle(delta: int, pids: tuple[int, ...] = (102,)) -> Throttle:
    return Throttle(SLICE / ALICE, delta, pids, HOLDER)


def test_a_throttle_is_reported_once_per_window_with_its_fix() -> None:
    c = counter(throttle_window=30.0)
    (first,) = c.report_throttles([throttle(3)], 100.0)
    assert isinstance(first, Throttled)
    assert (first.unit, first.high_events_delta, first.d_state_pids) == (ALICE, 3, (102,))
    assert first.limit_unit == "app-agentscope.slice"
    assert first.fix == (
        "systemctl --user set-property --runtime app-agentscope.slice MemoryHigh=infinity"
    )
    # Within the window: held back, its count and pids carried to the next one.
    assert c.report_throttles([throttle(2, (103,))], 110.0) == []
    assert c.report_throttles([throttle(1, (102,))], 120.0) == []
    (second,) = c.report_throttles([throttle(1, (104,))], 131.0)
    assert isinstance(second, Throttled)
    assert (second.high_events_delta, second.d_state_pids) == (4, (102, 103, 104))


def test_a_system_manager_fix_has_no_user_flag() -> None:
    c = counter(manager="system")
    (event,) = c.report_throttles([throttle(1)], 1.0)
    assert isinstance(event, Throttled)
    assert event.fix == "systemctl set-property --runtime app-agentscope.slice MemoryHigh=infinity"
    (event,) = c.report_throttles([Throttle(SLICE / BOB, 1, (), None)], 1.0)
    assert isinstance(event, Throttled)
    assert event.fix is None
    assert event.limit_unit is None


@pytest.mark.parametrize("first_high", [0, 5])
def test_a_scopes_high_rise_flags_it_for_the_throttle_check(first_high: int) -> None:
    c = counter()
    count(c, sample(first_high, {ALICE: scope(BOTH, high=first_high)}, slice_high=first_high), 0)
    _, candidates = c.count(sample(0, {ALICE: scope(BOTH, high=first_high)}), 1.0)
    assert candidates == []
    s = sample(first_high + 2, {ALICE: scope(BOTH, high=first_high + 2)})
    _, candidates = c.count(s, 2.0)
    # The scope's own rise; the slice's equal rise is the scope's, not the slice's.
    assert [cand.path for cand in candidates] == [SLICE / ALICE]
    assert sorted(candidates[0].pids) == [101, 102]


def test_only_the_slices_own_counter_flags_the_slice() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    # The slice's hierarchical count rose more than its scope's (read at another
    # moment, the scope's throttle slowing down): not the slice's own limit.
    _, candidates = c.count(sample(0, {ALICE: scope(BOTH, high=2)}, slice_high=5), 1.0)
    assert [cand.path for cand in candidates] == [SLICE / ALICE]
    # Its own counter rose: its own MemoryHigh, whatever the scopes did.
    _, candidates = c.count(sample(0, {ALICE: scope(BOTH, high=2)}, slice_own_high=4), 2.0)
    assert [cand.path for cand in candidates] == [SLICE]
    assert (candidates[0].previous, candidates[0].current) == (events(), events(0, 4))


def test_a_limit_is_found_once_per_value() -> None:
    c = counter()
    holder = LimitHolder(SLICE.parent, high=1 << 30, max=None)
    got = count(c, sample(0, {}, limits=(holder,)), 0.0)
    assert [(e.unit, e.limits.high) for e in got if isinstance(e, LimitFound)] == [
        ("app.slice", 1 << 30)
    ]
    assert count(c, sample(0, {}, limits=(holder,)), 1.0) == []
    raised = LimitHolder(SLICE.parent, high=2 << 30, max=None)
    got = count(c, sample(0, {}, limits=(raised,)), 2.0)
    assert [e.limits.high for e in got if isinstance(e, LimitFound)] == [2 << 30]


def test_the_limits_seen_stay_bounded_however_often_they_change() -> None:
    # #31: a limit toggled for the monitor's life grew its record of values without end.
    c = counter()
    for i in range(2000):
        holder = LimitHolder(SLICE.parent, high=(i % 7 + 1) << 30, max=i + 1)
        count(c, sample(0, {}, limits=(holder,)), float(i))
    assert len(c._limits_seen) == 1
    for i in range(1000):
        count(c, sample(0, {}, limits=(LimitHolder(SLICE.parent / f"u{i}", 1, None),)), 1e4 + i)
    assert len(c._limits_seen) <= _killcount._MAX_LIMITS


def test_every_scope_is_sized_in_full_at_least_every_few_samples() -> None:
    c = counter()
    count(c, sample(0, {ALICE: scope(BOTH)}), 0.0)
    forced = []
    for i in range(3 * FULL_PASS_EVERY):
        force = c.plans()[ALICE].force
        forced.append(force)
        s = scope(BOTH)  # memory.current unchanged: only a forced pass reads every statm
        count(c, sample(0, {ALICE: _ScopeSample(s.current, s.events, s.procs, force)}), 1.0 + i)
    assert sum(forced) == 3
    assert forced.index(True) < FULL_PASS_EVERY


def test_a_victim_never_sampled_in_a_delegated_scopes_leaf_is_named_by_the_journal() -> None:
    # #26: an agent's processes live in its scope's "agent" leaf (a call in a
    # cgroup of its own): the kernel's task_memcg is below the scope, not it.
    # Seen in the VMs (bookworm to sid, user manager): the tool call, born and
    # killed between two samples, was reported unnamed after the grace.
    c = journal_counter()
    count(c, sample(0, {ALICE: scope(SH)}), 0.0)
    c.note_kernel_task(102, MEMCG + ALICE + "/agent")
    c.note_kernel_kill(KernelOomKill(102, "tail", memcg=True, rss=64 << 20), 0.5, "journal")
    got = count(c, sample(1, {ALICE: scope(SH, oom_kill=1)}), 1.0)
    assert kills(got) == [("alice", ALICE, 102, "tail", "journal")]


def test_a_kill_in_a_call_of_a_scope_that_ended_is_named_for_that_scope() -> None:
    c = journal_counter()
    count(c, sample(0, {}), 0.0)
    c.note_kernel_task(102, MEMCG + BOB + "/calls/c1")
    c.note_kernel_kill(KernelOomKill(102, "cc1plus", memcg=True, rss=64 << 20), 0.5, "journal")
    got = count(c, sample(1, {}), 1.0)  # counted in the slice only: the scope is gone
    assert kills(got) == [("bob", BOB, 102, "cc1plus", "journal")]


def test_a_kernel_line_of_a_cgroup_outside_the_slice_names_no_agent() -> None:
    c = journal_counter()
    count(c, sample(0, {ALICE: scope(SH)}), 0.0)
    c.note_kernel_task(102, "/other.slice/" + ALICE + "/agent")
    c.note_kernel_kill(KernelOomKill(102, "tail", memcg=True), 0.5, "journal")
    assert kills(count(c, sample(1, {ALICE: scope(SH)}), 1.0)) == []
