"""Tests for agentscope_systemd._monitor._monitor over fake cgroupfs and /proc trees.

inotify works on the tmp_path files, so a kill is simulated the way the
kernel shows one: the scope's (and the slice's) ``memory.events`` is
rewritten with a higher ``oom_kill`` and the victim leaves ``cgroup.procs``
and /proc.

No test relies on timing luck. The monitor's reads hold the fake kernel's
lock (:data:`tests.fakefs.KERNEL`, see the ``kernel`` fixture), so a sample
sees every change made through fakefs, or under ``with KERNEL:``, either
not at all or whole, as with real kernel files; and the tests wait for
conditions (an event, or a sample that began after a change), never for a
fixed time.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentscope_systemd import AgentscopeError
from agentscope_systemd._events import (
    AgentExited,
    Event,
    LimitFound,
    OomKill,
    Pressure,
    Throttled,
)
from agentscope_systemd._kernel._cgroup import LimitHolder, MemoryEvents
from agentscope_systemd._kernel._proc import exec_comm
from agentscope_systemd._monitor import _killcount, _monitor, _report, _sampling
from agentscope_systemd._monitor._attribution import PressureEvent, PressureSample, PressureWindow
from agentscope_systemd._monitor._monitor import Monitor
from agentscope_systemd._monitor._report import MemoryReport, build_report
from tests.fakefs import (
    KERNEL,
    PAGE,
    format_memory_events,
    format_pressure,
    holding_kernel,
    make_cgroup,
    make_cgroup_root,
    make_host_pressure,
    make_meminfo,
    make_proc,
    remove,
    write,
)

SLICE = "app.slice/app-agentscope.slice/app-agentscope-agents.slice"
SLICE_NAME = "app-agentscope-agents.slice"
WAIT = 10.0  # generous bound for an event to arrive (a loaded CI box); tests finish far sooner


def unit_agent(unit: str) -> str | None:
    """``agentscope-f-NAME-1a2b3c.scope`` -> NAME (fleet ``f`` only)."""
    prefix = "agentscope-f-"
    if not unit.startswith(prefix) or not unit.endswith(".scope"):
        return None
    return unit[len(prefix) : -len("-000000.scope")]


def events(oom_kill: int = 0, high: int = 0) -> MemoryEvents:
    return MemoryEvents(low=0, high=high, max=0, oom=oom_kill, oom_kill=oom_kill)


@dataclass
class Tree:
    cg: Path
    proc: Path
    slice: Path

    def scope(self, agent: str, pids: dict[int, tuple[str, int]], token: str = "a1b2c3") -> Path:
        """A scope with processes pid -> (comm, rss pages)."""
        unit = f"agentscope-f-{agent}-{token}.scope"
        for pid, (comm, pages) in pids.items():
            make_proc(
                self.proc,
                pid,
                comm=comm,
                cmdline=(comm, "--work"),
                rss_pages=pages,
                cgroup=f"/{SLICE}/{unit}",
                start_time=1000 + pid,
            )
        return make_cgroup(
            self.cg,
            f"{SLICE}/{unit}",
            current=sum(p for _, p in pids.values()) * PAGE,
            procs=pids,
            peak=1 << 20,
        )

    def set_events(self, path: Path, ev: MemoryEvents, own: MemoryEvents | None = None) -> None:
        """``memory.events``; ``own`` also ``memory.events.local`` (its own limit's events)."""
        write(path / "memory.events", format_memory_events(ev))
        if own is not None:
            write(path / "memory.events.local", format_memory_events(own))

    def kill(self, scope: Path, pid: int, scope_kills: int, slice_kills: int) -> None:
        """What the kernel shows of an OOM kill: counters up, victim gone (one step)."""
        with KERNEL:
            # The kernel's order: the counters (the scope's, then its
            # ancestors'), then the victim exits.
            self.set_events(scope, events(oom_kill=scope_kills))
            self.set_events(self.slice, events(oom_kill=slice_kills))
            procs = [p for p in (scope / "cgroup.procs").read_text().split() if p != str(pid)]
            write(scope / "cgroup.procs", "".join(f"{p}\n" for p in procs))
            remove(self.proc / str(pid))


@dataclass
class Reads:
    """The monitor's samples as the fake kernel sees them."""

    collects: int = 0  # samples that have begun reading the tree


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch) -> Reads:
    """Make the monitor's reads atomic with the fakefs changes (as kernel files are).

    Every read of the tree runs in a worker thread through one of these
    three functions; holding :data:`KERNEL` there, a sample never sees a
    half-written file nor half of a change the test makes in one step.
    """
    reads = Reads()
    collect = _monitor._collect

    @holding_kernel
    def counted_collect(*args: object) -> object:
        reads.collects += 1
        return collect(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_monitor, "_collect", counted_collect)
    monkeypatch.setattr(_monitor, "_detect_throttles", holding_kernel(_monitor._detect_throttles))
    monkeypatch.setattr(_report, "_build_report_sync", holding_kernel(_report._build_report_sync))
    return reads


async def sampled(mon: Monitor, reads: Reads, count: int = 1) -> None:
    """Wait until ``count`` samples that began after now (so after the last change) are done.

    Samples run one at a time, each reading the tree once, so the Nth read
    belongs to the Nth sample. A wake-up is needed for a sample to run: a
    short ``interval``, or a change of a watched ``memory.events``.
    """
    with KERNEL:  # no read in flight: every read counted so far saw the old tree
        target = reads.collects + count
    await wait_for(lambda: mon.samples + mon.failures >= target)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    cg = make_cgroup_root(tmp_path / "cg")
    make_cgroup(cg, "app.slice")
    make_cgroup(cg, "app.slice/app-agentscope.slice")
    slice_path = make_cgroup(cg, SLICE)
    proc = tmp_path / "proc"
    make_meminfo(proc)
    make_host_pressure(proc, format_pressure((0, 0, 0, 0), (0, 0, 0, 0)))
    # A big process that is not an agent.
    make_proc(
        proc,
        50,
        comm="firefox",
        cmdline=("firefox",),
        rss_pages=50_000,
        cgroup="/user.slice/user-1000.slice/session-1.scope",
    )
    return Tree(cg, proc, slice_path)


def monitor(tree: Tree, **kw: object) -> tuple[Monitor, list[Event]]:
    got: list[Event] = []
    options: dict[str, object] = {
        "slice_path": tree.slice,
        "unit_agent": unit_agent,
        "interval": 0.05,
        "cgroup_root": tree.cg,
        "proc_root": tree.proc,
        "kmsg": None,
        "on_event": got.append,
        "pressure_window": 0.5,
    }
    options.update(kw)
    return Monitor(**options), got  # type: ignore[arg-type]


async def wait_for(cond: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def kills(got: list[Event]) -> list[OomKill]:
    return [e for e in got if isinstance(e, OomKill)]


async def test_oom_kill_names_agent_and_victim(tree: Tree, kernel: Reads) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000), 103: ("node", 500)})
    tree.scope("bob", {201: ("sleep", 10)}, token="d4e5f6")
    mon, got = monitor(tree)
    async with mon:
        await sampled(mon, kernel, 2)
        assert kills(got) == []
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        await wait_for(lambda: bool(kills(got)))
        await sampled(mon, kernel, 3)  # several more samples: still one kill
    (kill,) = kills(got)
    assert (kill.agent, kill.unit, kill.pid, kill.comm) == (
        "alice",
        "agentscope-f-alice-a1b2c3.scope",
        102,
        "python3",
    )
    assert kill.rss_last_seen == 9000 * PAGE
    assert kill.source == "cgroup"
    assert mon.failures == 0


async def test_kill_is_event_driven_not_polled(tree: Tree) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000)})
    mon, got = monitor(tree, interval=60.0)  # no periodic sample during the test
    async with mon:
        start = time.monotonic()
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        await wait_for(lambda: bool(kills(got)))
        # Long before the first periodic sample: inotify woke the monitor.
        assert time.monotonic() - start < WAIT < mon.interval
    assert kills(got)[0].comm == "python3"


async def test_kill_whose_scope_vanished_is_reported_from_slice(tree: Tree, kernel: Reads) -> None:
    scope = tree.scope("carol", {301: ("cargo", 7000)})
    tree.scope("bob", {201: ("sleep", 10)}, token="d4e5f6")
    mon, got = monitor(tree)
    async with mon:
        # The only process is killed and the scope is gone before it is read.
        with KERNEL:
            tree.set_events(tree.slice, events(oom_kill=1))
            remove(tree.proc / "301")
            remove(scope)
        await wait_for(lambda: bool(kills(got)))
        await sampled(mon, kernel, 3)
    (kill,) = kills(got)
    assert (kill.agent, kill.unit, kill.pid, kill.comm) == (
        "carol",
        "agentscope-f-carol-a1b2c3.scope",
        301,
        "cargo",
    )


async def test_kill_in_scope_never_sampled_names_scope_from_inotify(tree: Tree) -> None:
    tree.scope("bob", {201: ("sleep", 10)}, token="d4e5f6")
    mon, got = monitor(tree, interval=60.0)
    async with mon:
        with KERNEL:  # all between two samples: the scope is never read
            scope = tree.scope("dave", {401: ("java", 100)})
            tree.set_events(tree.slice, events(oom_kill=1))
            remove(tree.proc / "401")
            remove(scope)
        await wait_for(lambda: bool(kills(got)))
    (kill,) = kills(got)
    assert (kill.agent, kill.pid) == ("dave", None)


async def test_no_double_counting_over_many_samples(tree: Tree, kernel: Reads) -> None:
    a = tree.scope("alice", {101: ("a1", 100), 102: ("a2", 200), 103: ("a3", 300)})
    b = tree.scope("bob", {201: ("b1", 900)}, token="d4e5f6")
    mon, got = monitor(tree)
    async with mon:
        tree.kill(a, 103, scope_kills=1, slice_kills=1)
        await wait_for(lambda: len(kills(got)) >= 1)
        await sampled(mon, kernel, 2)
        tree.kill(a, 102, scope_kills=2, slice_kills=2)
        await wait_for(lambda: len(kills(got)) >= 2)
        await sampled(mon, kernel, 2)
        # bob's only process dies and his scope vanishes; the slice has the count.
        with KERNEL:
            tree.set_events(tree.slice, events(oom_kill=3))
            remove(tree.proc / "201")
            remove(b)
        await wait_for(lambda: len(kills(got)) >= 3)
        await sampled(mon, kernel, 2)
        # A counter rewrite with no new kill (another counter moved).
        tree.set_events(tree.slice, MemoryEvents(0, 0, 5, 3, 3))
        await sampled(mon, kernel, 3)
    assert sorted((k.agent, k.comm) for k in kills(got)) == [
        ("alice", "a2"),
        ("alice", "a3"),
        ("bob", "b1"),
    ]


async def test_slice_counter_read_before_scope_is_not_counted_twice(
    tree: Tree, kernel: Reads
) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000)})
    mon, got = monitor(tree, interval=60.0)
    async with mon:
        # The scope shows the kill before the slice does (a sample between the two
        # kernel increments): counted once, in the scope.
        with KERNEL:
            tree.set_events(scope, events(oom_kill=1))
            write(scope / "cgroup.procs", "101\n")
        await wait_for(lambda: bool(kills(got)))
        tree.set_events(tree.slice, events(oom_kill=1))
        await sampled(mon, kernel)  # the write woke the monitor (interval is 60 s)
    assert [k.comm for k in kills(got)] == ["python3"]


async def test_victim_named_by_kernel_log(tree: Tree, tmp_path: Path) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000), 103: ("node", 500)})
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        mon, got = monitor(tree, kmsg=fifo)
        async with mon:
            # The kernel killed node (say, by oom_score_adj), not the largest.
            os.write(
                writer,
                b"3,999,123,-;Memory cgroup out of memory: Killed process 103 "
                b"(node) total-vm:1kB, anon-rss:1kB\n SUBSYSTEM=x\n",
            )
            await asyncio.sleep(0.1)
            tree.kill(scope, 103, scope_kills=1, slice_kills=1)
            await wait_for(lambda: bool(kills(got)))
    finally:
        os.close(writer)
    (kill,) = kills(got)
    assert (kill.pid, kill.comm, kill.source, kill.rss_last_seen) == (
        103,
        "node",
        "kmsg",
        500 * PAGE,
    )


async def test_reaped_sigkill_names_victim_and_exit_event(tree: Tree) -> None:
    scope = tree.scope("alice", {101: ("python3", 9000), 102: ("claude", 100)})
    mon, got = monitor(tree, interval=60.0)
    async with mon:
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        mon.note_exit("agentscope-f-alice-a1b2c3.scope", 102, -9)
        await wait_for(lambda: bool(kills(got)))
    exited = [e for e in got if isinstance(e, AgentExited)]
    assert exited == [
        AgentExited(exited[0].ts, "alice", "agentscope-f-alice-a1b2c3.scope", 102, -9)
    ]
    (kill,) = kills(got)
    assert (kill.pid, kill.comm, kill.source) == (102, "claude", "reaped")


async def test_reaped_child_never_sampled_is_named_from_its_launch(tree: Tree) -> None:
    # Killed before any sample saw it (a 200 MB allocation under a 64 MB cap):
    # the launcher knows what it exec'd.
    scope = tree.scope("solo", {})
    mon, got = monitor(tree, interval=60.0)
    async with mon:
        with KERNEL:
            tree.set_events(scope, events(oom_kill=1))
            tree.set_events(tree.slice, events(oom_kill=1))
        mon.note_exit(scope.name, 555, -9, comm=exec_comm("/usr/bin/python3"))
        await wait_for(lambda: bool(kills(got)))
    (kill,) = kills(got)
    assert (kill.agent, kill.pid, kill.comm, kill.source) == ("solo", 555, "python3", "reaped")


async def test_reaped_child_sampled_before_its_exec_gets_its_exec_name(tree: Tree) -> None:
    # Sampled while it waited in the launch gate under its parent's name.
    scope = tree.scope("solo", {555: ("python", 2000)})
    mon, got = monitor(tree, interval=60.0)
    async with mon:
        await wait_for(lambda: mon.samples >= 1)
        tree.kill(scope, 555, scope_kills=1, slice_kills=1)
        mon.note_exit(scope.name, 555, -9, comm=exec_comm("python3"))
        await wait_for(lambda: bool(kills(got)))
    (kill,) = kills(got)
    assert (kill.pid, kill.comm, kill.source) == (555, "python3", "reaped")


async def test_process_seen_between_fork_and_exec_is_named_after_its_exec(tree: Tree) -> None:
    # A shell forked a child and the first sample caught it before its exec.
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("sh", 100)})
    mon, got = monitor(tree, interval=60.0)
    async with mon:
        await wait_for(lambda: mon.samples >= 1)
        with KERNEL:
            make_proc(
                tree.proc,
                102,
                comm="python3",
                rss_pages=100,
                cgroup=f"/{SLICE}/{scope.name}",
                start_time=1000 + 102,
            )
            tree.set_events(scope, events())  # any change wakes the monitor
        await wait_for(lambda: mon.samples >= 2)
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        await wait_for(lambda: bool(kills(got)))
    (kill,) = kills(got)
    assert (kill.pid, kill.comm) == (102, "python3")


def test_exec_comm_is_the_kernels() -> None:
    assert exec_comm("python3") == "python3"
    assert exec_comm("/opt/x/bin/a-very-long-agent-name") == "a-very-long-age"
    assert len(exec_comm("/x/" + "é" * 20).encode()) <= 15


async def test_victim_still_exiting_is_awaited(
    tree: Tree, kernel: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However slow the samples, the victim leaves well within the grace.
    monkeypatch.setattr(_killcount, "VICTIM_GRACE", 6 * WAIT)
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000)})
    mon, got = monitor(tree)
    async with mon:
        with KERNEL:
            tree.set_events(scope, events(oom_kill=1))
            tree.set_events(tree.slice, events(oom_kill=1))
        await sampled(mon, kernel, 3)
        assert kills(got) == []  # counted, victim not gone yet
        with KERNEL:
            write(scope / "cgroup.procs", "101\n")
            remove(tree.proc / "102")
        await wait_for(lambda: bool(kills(got)))
    assert [k.comm for k in kills(got)] == ["python3"]


async def test_victim_dying_but_still_listed_is_named_at_once(
    tree: Tree, kernel: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under load an OOM victim stays in cgroup.procs, with its file pages, for
    # longer than the grace; its SIGKILL tells it from the living at once.
    monkeypatch.setattr(_killcount, "VICTIM_GRACE", 60.0)
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000)})
    mon, got = monitor(tree)
    async with mon:
        await sampled(mon, kernel, 2)
        with KERNEL:
            make_proc(
                tree.proc,
                102,
                comm="python3",
                rss_pages=2000,
                cgroup=f"/{SLICE}/{scope.name}",
                start_time=1000 + 102,
                signals=1 << 8,
            )
            tree.set_events(scope, events(oom_kill=1))
            tree.set_events(tree.slice, events(oom_kill=1))
        await wait_for(lambda: bool(kills(got)))
    (kill,) = kills(got)
    assert (kill.pid, kill.comm, kill.agent) == (102, "python3", "alice")
    assert kill.rss_last_seen == 9000 * PAGE


def grow(tree: Tree, scope: Path, pid: int, comm: str, pages: int, scope_pages: int) -> None:
    """Set a process's RSS and its scope's memory.current, in pages (one step)."""
    with KERNEL:
        make_proc(
            tree.proc,
            pid,
            comm=comm,
            rss_pages=pages,
            cgroup=f"/{SLICE}/{scope.name}",
            start_time=1000 + pid,
        )
        write(scope / "memory.current", f"{scope_pages * PAGE}\n")


async def test_growing_victim_is_named_with_its_recent_rss(tree: Tree, kernel: Reads) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 1000), 103: ("node", 500)})
    mon, got = monitor(tree)
    async with mon:
        await sampled(mon, kernel, 2)
        # The scope's memory.current follows the growth: the next sample sizes it.
        grow(tree, scope, 102, "python3", 60_000, 60_600)
        await sampled(mon, kernel)
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        await wait_for(lambda: bool(kills(got)))
        # RSS that moves while memory.current does not (pages shared, or
        # moved between processes) is caught by the periodic pass.
        grow(tree, scope, 103, "node", 700, 60_600 - 59_000)
        await sampled(mon, kernel)
        grow(tree, scope, 101, "sh", 900, 60_600 - 59_000)  # memory.current unchanged
        await sampled(mon, kernel, _killcount.FULL_PASS_EVERY + 1)
        tree.kill(scope, 101, scope_kills=2, slice_kills=2)
        await wait_for(lambda: len(kills(got)) >= 2)
    first, second = kills(got)
    assert (first.pid, first.comm, first.rss_last_seen) == (102, "python3", 60_000 * PAGE)
    assert (second.pid, second.comm, second.rss_last_seen) == (101, "sh", 900 * PAGE)
    assert mon.failures == 0


async def test_statm_of_an_unchanged_scope_is_not_read_every_sample(
    tree: Tree, kernel: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: dict[int, int] = {}
    read_statm_rss = _sampling.read_statm_rss

    def counted(pid: int, proc_root: Path) -> int | None:
        reads[pid] = reads.get(pid, 0) + 1
        return read_statm_rss(pid, proc_root)

    monkeypatch.setattr(_sampling, "read_statm_rss", counted)
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 1000)})
    mon, _ = monitor(tree)
    async with mon:
        await sampled(mon, kernel, 3 * _killcount.FULL_PASS_EVERY)
        with KERNEL:
            samples = kernel.collects
            statm_reads = reads[102]
        # Once when first seen, then once per FULL_PASS_EVERY samples.
        assert statm_reads <= samples // _killcount.FULL_PASS_EVERY + 2 < samples
        # memory.current moved by more than 2% (and 1 MiB): sized at the next sample.
        with KERNEL:
            write(scope / "memory.current", f"{2000 * PAGE}\n")
            before = reads[102]
        await sampled(mon, kernel)
        assert reads[102] > before
    assert mon.failures == 0


async def test_unnamed_kill_reported_after_grace(tree: Tree) -> None:
    scope = tree.scope("alice", {101: ("sh", 100)})
    mon, got = monitor(tree)
    async with mon:
        with KERNEL:
            tree.set_events(scope, events(oom_kill=1))
            tree.set_events(tree.slice, events(oom_kill=1))
        await wait_for(lambda: bool(kills(got)))
    (kill,) = kills(got)
    assert (kill.agent, kill.pid, kill.comm) == ("alice", None, None)


async def test_throttle_names_slice_limit_holder(tree: Tree, kernel: Reads) -> None:
    write(tree.slice / "memory.high", f"{1 << 30}\n")
    tree.scope("alice", {101: ("python3", 9000), 102: ("sh", 10)})
    make_proc(
        tree.proc,
        101,
        comm="python3",
        state="D",
        wchan="mem_cgroup_handle_over_high",
        cgroup=f"/{SLICE}/agentscope-f-alice-a1b2c3.scope",
        start_time=1101,
    )
    # A window far longer than the test: the second rise is surely within it.
    mon, got = monitor(tree, pressure_window=60.0)
    async with mon:
        tree.set_events(tree.slice, events(high=17), own=events(high=17))
        await wait_for(lambda: any(isinstance(e, Throttled) for e in got))
        # Still throttled: within the window.
        tree.set_events(tree.slice, events(high=40), own=events(high=40))
        await sampled(mon, kernel, 2)
    (throttled,) = [e for e in got if isinstance(e, Throttled)]
    assert throttled.unit == SLICE_NAME
    assert throttled.high_events_delta == 17
    assert throttled.d_state_pids == (101,)
    assert throttled.limit_unit == SLICE_NAME
    assert throttled.fix == f"systemctl set-property --runtime {SLICE_NAME} MemoryHigh=infinity"
    (limit,) = [e for e in got if isinstance(e, LimitFound)]
    assert (limit.unit, limit.limits.high, limit.limits.max) == (SLICE_NAME, 1 << 30, None)


USER_BASE = "user.slice/user-1000.slice/user@1000.service"
ALICE_UNIT = "agentscope-f-alice-a1b2c3.scope"


def user_tree(tmp_path: Path, *, app_high: int | None, scope_high: int | None) -> Tree:
    """A user manager's levels down to the agents slice, and alice's scope with
    one process stalled in ``mem_cgroup_handle_over_high``."""
    cg = make_cgroup_root(tmp_path / "cg")
    for rel in ("user.slice", "user.slice/user-1000.slice", USER_BASE):
        make_cgroup(cg, rel)
    make_cgroup(cg, f"{USER_BASE}/app.slice", high=app_high)
    make_cgroup(cg, f"{USER_BASE}/app.slice/app-agentscope.slice")
    slice_path = make_cgroup(cg, f"{USER_BASE}/{SLICE}")
    proc = tmp_path / "proc"
    make_meminfo(proc)
    make_proc(
        proc,
        101,
        comm="python3",
        state="D",
        wchan="mem_cgroup_handle_over_high",
        cgroup=f"/{USER_BASE}/{SLICE}/{ALICE_UNIT}",
    )
    make_cgroup(cg, f"{USER_BASE}/{SLICE}/{ALICE_UNIT}", procs=[101], current=4096, high=scope_high)
    return Tree(cg, proc, slice_path)


async def test_throttle_by_ancestor_under_user_manager(tmp_path: Path) -> None:
    t = user_tree(tmp_path, app_high=1 << 29, scope_high=None)
    mon, got = monitor(t)
    async with mon:
        # Over app.slice's own limit: its local counter rose, not ours.
        t.set_events(t.slice.parent.parent, events(high=5), own=events(high=5))
        await wait_for(lambda: any(isinstance(e, Throttled) for e in got))
    (throttled,) = [e for e in got if isinstance(e, Throttled)]
    assert (throttled.unit, throttled.limit_unit, throttled.d_state_pids) == (
        "app.slice",
        "app.slice",
        (101,),
    )
    assert throttled.fix == "systemctl --user set-property --runtime app.slice MemoryHigh=infinity"


async def test_a_scope_throttled_on_while_sampled_is_not_its_ancestors_throttle(
    tmp_path: Path, kernel: Reads
) -> None:
    # Seen in CI (sid, user manager, under load): a scope under its own MemoryHigh
    # kept throttling while a sample read the slice, the scopes, then the
    # levels above, so app.slice's hierarchical count rose more than the
    # slice's had, and passed for app.slice's own throttle (no limit, no fix).
    t = user_tree(tmp_path, app_high=None, scope_high=1 << 20)
    mon, got = monitor(t)
    async with mon:
        with KERNEL:
            t.set_events(t.slice / ALICE_UNIT, events(high=3))
            t.set_events(t.slice, events(high=3))
            for level in t.slice.parents:
                if level.is_relative_to(t.cg) and level != t.cg:
                    t.set_events(level, events(high=9))  # read later: risen further
        await wait_for(lambda: any(isinstance(e, Throttled) for e in got))
        await sampled(mon, kernel, 2)
    assert [(e.unit, e.limit_unit) for e in got if isinstance(e, Throttled)] == [
        (ALICE_UNIT, ALICE_UNIT)
    ]


async def test_scope_rise_alone_is_not_a_slice_throttle(tree: Tree, kernel: Reads) -> None:
    scope = tree.scope("alice", {101: ("python3", 9000)})
    write(scope / "memory.high", f"{1 << 20}\n")
    mon, got = monitor(tree)
    async with mon:
        with KERNEL:
            tree.set_events(scope, events(high=3))
            tree.set_events(tree.slice, events(high=3))  # hierarchical: the same three
        await wait_for(lambda: any(isinstance(e, Throttled) for e in got))
        await sampled(mon, kernel, 2)
    (throttled,) = [e for e in got if isinstance(e, Throttled)]
    assert throttled.unit == throttled.limit_unit == "agentscope-f-alice-a1b2c3.scope"
    assert throttled.d_state_pids == ()


async def test_pressure_one_event_per_window_with_worst(
    tree: Tree, kernel: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The window's clock is the test's: a slow sample cannot close it early.
    now = [0.0]
    window = functools.partial(PressureWindow, clock=lambda: now[0])
    monkeypatch.setattr(_monitor, "PressureWindow", window)
    tree.scope("alice", {101: ("python3", 9000)})
    mon, got = monitor(tree, pressure_window=0.6)
    async with mon:
        for avg10 in (20.0, 45.0, 15.0):
            make_host_pressure(tree.proc, format_pressure((avg10, 1, 1, 1)))
            await sampled(mon, kernel)
            now[0] += 0.12
        make_host_pressure(tree.proc, format_pressure((0, 0, 0, 0)))
        now[0] += 0.6  # the window has elapsed
        await wait_for(lambda: any(isinstance(e, Pressure) for e in got))
        now[0] += 0.7  # another window: calm, so no event
        await sampled(mon, kernel, 2)
    (pressure,) = [e for e in got if isinstance(e, Pressure)]
    assert pressure.window is not None
    assert pressure.window.worst.some_avg10 == 45.0
    assert pressure.report.agents[0].agent == "alice"


async def test_pressure_from_low_available_memory_flushed_on_close(
    tree: Tree, kernel: Reads
) -> None:
    mon, got = monitor(tree, pressure_window=30.0)
    async with mon:
        make_meminfo(tree.proc, total_kb=8_000_000, available_kb=400_000)
        await sampled(mon, kernel)
    (pressure,) = [e for e in got if isinstance(e, Pressure)]
    assert pressure.window is not None
    assert pressure.window.worst.available_fraction == pytest.approx(0.05)


async def test_processes_and_scopes_vanish_mid_scan(tree: Tree, kernel: Reads) -> None:
    scopes = [tree.scope(f"a{i}", {1000 + i: ("sh", 10 + i)}, token=f"{i:06x}") for i in range(8)]
    mon, got = monitor(tree, interval=0.01)
    async with mon:
        # Removed file by file, not in one step: samples may land mid-removal
        # (that is the point), and must take it for a vanishing cgroup or process.
        for i, scope in enumerate(scopes):
            if i % 2:
                shutil.rmtree(scope)
            else:
                shutil.rmtree(tree.proc / str(1000 + i))  # listed, but no /proc entry
            await asyncio.sleep(0.01)
        # A scope whose memory files go one at a time.
        late = tree.scope("late", {2000: ("sh", 10)})
        for name in ("memory.stat", "cgroup.procs", "memory.events", "memory.current"):
            (late / name).unlink()
            await asyncio.sleep(0.01)
        await wait_for(lambda: mon.samples > 5)
        await sampled(mon, kernel, 2)
        report = await mon.report()
    assert mon.failures == 0
    assert mon.samples > 5
    assert kills(got) == []
    assert sorted(a.agent for a in report.agents) == ["a0", "a2", "a4", "a6"]


async def test_report_contents_and_non_agent_top(tree: Tree) -> None:
    tree.scope("alice", {101: ("python3", 9000), 102: ("sh", 100)})
    make_proc(
        tree.proc,
        101,
        comm="python3",
        cmdline=("python3", "-m", "agent"),
        rss_pages=9000,
        cgroup=f"/{SLICE}/agentscope-f-alice-a1b2c3.scope",
        smaps_kb={"Rss": 36000, "Pss": 30000, "Swap": 12},
    )
    tree.scope("zed", {901: ("x", 1)}, token="999999")
    make_cgroup(tree.cg, f"{SLICE}/other-fleet.scope", procs=[])  # not this fleet's
    report = await build_report(
        tree.slice, unit_agent, top=3, cgroup_root=tree.cg, proc_root=tree.proc
    )
    assert report.host is not None
    assert report.host.mem_total == 8_000_000 * 1024
    assert [a.agent for a in report.agents] == ["alice", "zed"]
    alice = report.agents[0]
    assert (alice.processes, alice.memory_current, alice.memory_peak) == (2, 9100 * PAGE, 1 << 20)
    assert [(p.process.comm, p.process.agent) for p in report.top] == [
        ("firefox", None),
        ("python3", "alice"),
        ("sh", "alice"),
    ]
    assert report.top[1].process.cmdline == "python3 -m agent"
    assert report.top[1].smaps is not None
    assert report.top[1].smaps.pss == 30000 * 1024
    assert report.top[0].smaps is None
    assert report.host_pressure is not None
    assert report.slice_pressure is not None
    data = json.loads(json.dumps(report.to_dict()))
    assert data["processes"][0]["agent"] is None
    assert data["processes"][1]["pss"] == 30000 * 1024


def test_events_to_dict_json_round_trip(tmp_path: Path) -> None:
    report = MemoryReport(1.0, None, None, None, None, (), ())
    window = PressureEvent(1.0, 2.0, PressureSample(30.0, 0.5, 1.5), 3)
    holder = LimitHolder(tmp_path / SLICE_NAME, 1 << 30, None)
    samples: list[Event] = [
        OomKill(1.0, "alice", "u.scope", 7, "python3", 4096, "kmsg"),
        OomKill(1.0, None, None, None, None, None, "cgroup"),
        Throttled(1.0, SLICE_NAME, 3, (7, 8), SLICE_NAME, "systemctl ..."),
        Pressure(1.0, report, window),
        AgentExited(1.0, "alice", "u.scope", 7, -9),
        LimitFound(1.0, SLICE_NAME, holder),
    ]
    kinds = set()
    for event in samples:
        data = event.to_dict()
        assert json.loads(json.dumps(data)) == data
        assert data["ts"] == 1.0
        kinds.add(data["kind"])
    assert kinds == {"oom_kill", "throttled", "pressure", "exited", "limit_found"}
    assert samples[-1].to_dict()["limits"] == {"MemoryHigh": 1 << 30, "MemoryMax": None}


async def test_async_iteration_and_lifecycle(tree: Tree) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000)})
    mon, _ = monitor(tree, on_event=None)
    async with mon:
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        async with asyncio.timeout(WAIT):
            async for event in mon:
                if isinstance(event, OomKill):
                    break
    assert event.comm == "python3"
    assert [e async for e in mon] == []  # closed: iteration ends
    with pytest.raises(AgentscopeError, match="create a new Monitor"):
        await mon.start()


async def test_a_monitor_iterated_before_it_started_says_so(tree: Tree) -> None:
    mon, _ = monitor(tree, on_event=None)
    # Before: an iteration here waited for good, without a word.
    with pytest.raises(AgentscopeError, match="not started"):
        aiter(mon)


async def test_samples_failing_in_a_row_make_the_monitor_unhealthy(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    mon, _ = monitor(tree, on_event=None)
    async with mon:
        assert mon.healthy

        async def broken() -> None:
            raise OSError("a reader bug")

        monkeypatch.setattr(mon, "_sample", broken)
        await wait_for(lambda: mon.consecutive_failures >= 3)
        assert not mon.healthy
        monkeypatch.undo()
        await wait_for(lambda: mon.consecutive_failures == 0)
        assert mon.healthy


async def test_callback_error_does_not_stop_monitor(tree: Tree) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000)})

    def bad(event: Event) -> None:
        raise RuntimeError("boom")

    mon, _ = monitor(tree, on_event=bad)
    async with mon:
        tree.kill(scope, 102, scope_kills=1, slice_kills=1)
        async with asyncio.timeout(WAIT):
            event = await anext(aiter(mon))
    assert isinstance(event, OomKill)


def test_kernel_oom_task_line_names_the_cgroup() -> None:
    from agentscope_systemd._monitor._sampling import _parse_oom_task_line

    line = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/app.slice/app-agentscope.slice/app-agentscope-agents.slice/"
        "agentscope-f-a-123456.scope,task_memcg=/app.slice/app-agentscope.slice/"
        "app-agentscope-agents.slice/agentscope-f-a-123456.scope,task=python3,pid=4242,uid=0"
    )
    pid, memcg = _parse_oom_task_line(line) or (0, "")
    assert pid == 4242
    assert memcg.endswith("/agentscope-f-a-123456.scope")
    assert _parse_oom_task_line("Memory cgroup out of memory: Killed process 1 (x)") is None
    assert _parse_oom_task_line("oom-kill:constraint=CONSTRAINT_NONE,task=x,pid=zz") is None


# -- bounded state (#16 item 13) --------------------------------------------------


def test_throttle_state_holds_only_what_is_throttled_now(tree: Tree) -> None:
    from agentscope_systemd._monitor._attribution import Throttle

    counter = _killcount.KillCounter(slice_path=tree.slice, unit_agent=lambda unit: None)
    window = counter.throttle_window
    got: list[Event] = []
    for i in range(3000):
        t = Throttle(tree.slice / f"agentscope-ci-a{i}-abc123.scope", 1, tuple(range(200)), None)
        got += counter.report_throttles([t], now=1000.0 + i * window * 2)
    assert len(got) == 3000  # each throttle was still told
    assert all(len(e.d_state_pids) <= 64 for e in got)  # type: ignore[union-attr]
    assert len(counter._throttle_next) <= 2
    assert len(counter._throttle_acc) <= 2


def test_enospc_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Full:
        def add_watch(self, path: Path, mask: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def rm_watch(self, wd: int) -> None:
            pass

    monkeypatch.setattr(_sampling, "_enospc_logged", False)
    wanted = {tmp_path / f"s{i}" / "memory.events": 1 for i in range(20)}
    with caplog.at_level(logging.WARNING, logger="agentscope.monitor"):
        for _ in range(5):
            assert _sampling._sync_watches(Full(), {}, wanted) == {}  # type: ignore[arg-type]
    assert len([r for r in caplog.records if "max_user_watches" in r.message]) == 1


# -- kernel lines a process cannot forge (#31 item 4) -----------------------------------

_SCOPE_MEMCG = "/app.slice/app-agentscope-agents.slice/agentscope-f-a-123456.scope"
_SUMMARY = (
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    f"oom_memcg={_SCOPE_MEMCG},task_memcg={_SCOPE_MEMCG},task={{comm}},pid=4242,uid=1000"
)


@pytest.mark.parametrize(
    "comm",
    ["q,task_memcg=/x", "a,pid=1", "a,uid=0", "x,task=y", ",task_memcg=/", "q,oom_memcg=/"],
)
def test_a_comm_cannot_rewrite_the_fields_after_it(comm: str) -> None:
    from agentscope_systemd._monitor._attribution import parse_oom_task_line

    task = parse_oom_task_line(_SUMMARY.format(comm=comm))
    assert task is not None
    assert (task.pid, task.memcg, task.comm) == (4242, _SCOPE_MEMCG, comm)


def test_a_cgroup_named_like_a_field_does_not_move_the_victim() -> None:
    from agentscope_systemd._monitor._attribution import parse_oom_task_line

    # A user's own cgroup "a,task_memcg=" with a child "root.scope" under it.
    own = "/user.slice/a,task_memcg=/root.scope"
    line = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={own},task_memcg={own},task=x,pid=5,uid=1000"
    )
    task = parse_oom_task_line(line)
    assert task is not None
    assert task.memcg == own
    # Two readings that name two cgroups: refused, not guessed.
    glob = (
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"global_oom,task_memcg={own},task=x,pid=5,uid=1000"
    )
    assert parse_oom_task_line(glob) is None


async def test_a_user_record_in_the_kmsg_names_no_victim(tree: Tree, tmp_path: Path) -> None:
    scope = tree.scope("alice", {101: ("sh", 100), 102: ("python3", 9000), 103: ("node", 500)})
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        mon, got = monitor(tree, kmsg=fifo)
        async with mon:
            # Facility 1 (user): what a write to /dev/kmsg from user space becomes.
            os.write(
                writer,
                b"12,999,123,-;Memory cgroup out of memory: Killed process 103 "
                b"(node) total-vm:1kB, anon-rss:1kB\n"
                b"Memory cgroup out of memory: Killed process 103 (node)\n",
            )
            await asyncio.sleep(0.1)
            tree.kill(scope, 102, scope_kills=1, slice_kills=1)
            await wait_for(lambda: bool(kills(got)))
    finally:
        os.close(writer)
    (kill,) = kills(got)
    # Not named by the forged line: the largest process, from the cgroup files.
    assert (kill.pid, kill.source) != (103, "kmsg")
