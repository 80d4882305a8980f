"""Tests for the memory guard (agentscope_systemd._guard._guardpolicy and ._guard) over fake trees.

The victim rule and the thresholds are plain functions over fake /proc and
cgroup trees. The kill path is exercised on real processes of the test (a
``sleep`` it starts): the fake tree points at its real pid, so the pidfd,
the start-time re-check against the tree and the SIGKILL are all real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from agentscope_systemd import (
    AsyncFleet,
    GuardConfig,
    GuardKill,
    HostUnderPressure,
    InvalidConfig,
)
from agentscope_systemd._events import Event
from agentscope_systemd._guard import _guard, _guardlock, _guardnames
from agentscope_systemd._guard._guard import kill_process, run_guard
from agentscope_systemd._guard._guardcause import CauseTracker
from agentscope_systemd._guard._guardclock import PressureClock
from agentscope_systemd._guard._guardpolicy import (
    HostReader,
    HostReading,
    ScopeStall,
    SliceProcess,
    choose_victim,
    next_interval,
    own_limit_stall,
    read_host,
    read_scope_stalls,
    scan_slice_processes,
    under_pressure,
)
from agentscope_systemd._guard._guardproc import GuardChild
from agentscope_systemd._guard._guardscan import Scan
from agentscope_systemd._guard._guardthread import Guard, admit
from agentscope_systemd._monitor._monitor import Monitor
from tests.fakefs import (
    PAGE,
    format_pressure,
    holding_kernel,
    make_cgroup,
    make_cgroup_root,
    make_host_pressure,
    make_meminfo,
    make_proc,
    write,
)

SLICE = "app.slice/app-agentscope.slice/app-agentscope-agents.slice"
MIB_PAGES = (1 << 20) // PAGE
WAIT = 10.0


def unit_agent(unit: str) -> str | None:
    prefix = "agentscope-f-"
    if not unit.startswith(prefix) or not unit.endswith(".scope"):
        return None
    return unit[len(prefix) : -len("-000000.scope")]


@dataclass
class Tree:
    cg: Path
    proc: Path
    slice: Path

    def scope(
        self,
        agent: str,
        procs: dict[int, tuple[str, int, int]],
        *,
        sub: dict[str, list[int]] | None = None,
        token: str = "a1b2c3",
        swap_kb: dict[int, int] | None = None,
        oom_score_adj: dict[int, int] | None = None,
        hidden: int = 0,
    ) -> str:
        """A scope of processes pid -> (comm, MiB, start time); ``sub``: pids in sub-cgroups."""
        unit = f"agentscope-f-{agent}-{token}.scope"
        in_sub = {pid for pids in (sub or {}).values() for pid in pids}
        for pid, (comm, mib, start) in procs.items():
            make_proc(
                self.proc,
                pid,
                comm=comm,
                cmdline=(comm, "--work"),
                rss_pages=mib * MIB_PAGES,
                cgroup=f"/{SLICE}/{unit}",
                start_time=start,
                swap_kb=(swap_kb or {}).get(pid, 0),
                oom_score_adj=(oom_score_adj or {}).get(pid, 800),
            )
        # The scope's charge is what its processes hold (plus ``hidden``: tmpfs, memfds).
        charged = sum(mib for _, mib, _ in procs.values()) << 20
        charged += sum((swap_kb or {}).values()) << 10
        make_cgroup(
            self.cg,
            f"{SLICE}/{unit}",
            procs=[p for p in procs if p not in in_sub],
            current=charged + hidden,
        )
        for name, pids in (sub or {}).items():
            make_cgroup(self.cg, f"{SLICE}/{unit}/{name}", procs=pids)
        return unit

    def host(self, available_pct: float, swap_free_pct: float = 0.0, psi_full: float = 0) -> None:
        total = 8_000_000
        make_meminfo(
            self.proc,
            total_kb=total,
            available_kb=int(total * available_pct / 100),
            swap_total_kb=1_000_000,
            swap_free_kb=int(1_000_000 * swap_free_pct / 100),
        )
        make_host_pressure(self.proc, format_pressure((psi_full, 0, 0, 0), (psi_full, 0, 0, 0)))

    def scan(self, **kw: object) -> list[SliceProcess]:
        return scan_slice_processes(self.slice, self.proc, **kw)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The guard's reads see each fakefs change whole (as kernel files are generated).

    Its lock files go to the test's directory, not the user's runtime one.
    """
    monkeypatch.setattr(_guard, "scan_candidates", holding_kernel(_guard.scan_candidates))
    monkeypatch.setattr(HostReader, "read", holding_kernel(HostReader.read))
    monkeypatch.setattr(CauseTracker, "sample", holding_kernel(CauseTracker.sample))
    monkeypatch.setattr(CauseTracker, "blame", holding_kernel(CauseTracker.blame))
    monkeypatch.setattr(_guardlock, "default_lock_dir", lambda: tmp_path / "locks")


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    cg = make_cgroup_root(tmp_path / "cg")
    make_cgroup(cg, "app.slice")
    make_cgroup(cg, "app.slice/app-agentscope.slice")
    slice_path = make_cgroup(cg, SLICE)
    proc = tmp_path / "proc"
    t = Tree(cg, proc, slice_path)
    t.host(50, 50)
    # The host's largest process, outside the slice: the manager, a browser.
    make_proc(proc, 50, comm="python3", rss_pages=4000 * MIB_PAGES, cgroup="/user.slice/x.scope")
    return t


def victim_pid(tree: Tree, share: float = 0.25, **kw: object) -> int | None:
    victim = choose_victim(tree.scan(**kw), share)
    return None if victim is None else victim.process.pid


# -- the victim rule ------------------------------------------------------


def test_a_descendant_runaway_is_killed_not_the_agent(tree: Tree) -> None:
    tree.scope("a", {10: ("claude", 200, 100), 11: ("pytest", 900, 200)})
    tree.scope("b", {20: ("claude", 300, 100)}, token="d4e5f6")
    assert victim_pid(tree) == 11


def test_the_main_runaway_yields_to_a_large_enough_descendant(tree: Tree) -> None:
    # main 800 MiB is the largest, its child holds 250 MiB >= 0.25 x 800.
    tree.scope("a", {10: ("claude", 800, 100), 11: ("node", 250, 200), 12: ("sh", 2, 300)})
    victim = choose_victim(tree.scan(), 0.25)
    assert victim is not None
    assert (victim.process.pid, victim.runaway.pid, victim.main.pid) == (11, 10, 10)
    assert not victim.is_main


def test_the_main_process_is_killed_only_when_no_descendant_qualifies(tree: Tree) -> None:
    tree.scope("a", {10: ("claude", 800, 100), 11: ("node", 100, 200)})
    victim = choose_victim(tree.scan(), 0.25)
    assert victim is not None
    assert victim.is_main
    assert victim.process.pid == 10
    # The rule is the share: at 0.1 the same child qualifies.
    assert victim_pid(tree, share=0.1) == 11


def test_never_a_process_of_another_agent(tree: Tree) -> None:
    # a's main is the runaway; b's big child must not be taken instead.
    tree.scope("a", {10: ("claude", 900, 100), 11: ("sh", 1, 200)})
    tree.scope("b", {20: ("claude", 10, 100), 21: ("node", 850, 200)}, token="d4e5f6")
    assert victim_pid(tree) == 10


def test_nothing_outside_the_slice_and_the_largest_host_process_is_safe(tree: Tree) -> None:
    # pid 50 (4 GB, outside) is the host's largest; only slice processes count.
    tree.scope("a", {10: ("claude", 20, 100)})
    pids = {p.pid for p in tree.scan()}
    assert pids == {10}
    assert victim_pid(tree) == 10
    # The slice's sibling (the monitor's slice) is never looked into.
    make_cgroup(tree.cg, "app.slice/app-agentscope.slice/agentscope-monitor.scope", procs=[50])
    assert victim_pid(tree) == 10


def test_protected_pids_units_own_process_and_unkillable_are_never_chosen(tree: Tree) -> None:
    own = os.getpid()
    tree.scope(
        "a",
        {10: ("claude", 100, 100), 11: ("huge", 3000, 200), own: ("python3", 5000, 150)},
        oom_score_adj={11: -1000},
    )
    tmux = tree.scope("tmux", {30: ("tmux", 6000, 50)}, token="ffffff")
    tree.scope("b", {40: ("node", 2000, 100), 41: ("sh", 900, 200)}, token="d4e5f6")
    # Another fleet's tmux server (its scope has no token): never, even unlisted.
    make_proc(tree.proc, 60, comm="tmux: server", rss_pages=7000 * MIB_PAGES, oom_score_adj=200)
    make_cgroup(tree.cg, f"{SLICE}/agentscope-other-tmux.scope", procs=[60])
    # 11 is -1000, own is this process, 30's unit is protected, 40 is protected:
    assert victim_pid(tree, protected_pids={40}, protected_units={tmux}) == 41
    # Ineligible processes still decide which one is the main: own (start 150)
    # is not a's main, 10 (start 100) is.
    victim = choose_victim(tree.scan(protected_pids={40, 41}, protected_units={tmux}), 0.25)
    assert victim is not None
    assert victim.main.pid == 10
    assert victim.process.pid == 10


def test_sub_cgroups_are_scanned_and_swap_counts(tree: Tree) -> None:
    tree.scope(
        "a",
        {10: ("claude", 100, 100), 11: ("node", 100, 200), 12: ("java", 150, 300)},
        sub={"tools/x": [11], "y": [12]},
        swap_kb={11: 200 * 1024},
    )
    sizes = {p.pid: (p.rss, p.swap) for p in tree.scan()}
    assert sizes[11] == (100 << 20, 200 << 20)
    assert set(sizes) == {10, 11, 12}
    assert victim_pid(tree) == 11  # 300 MiB with its swap beats java's 150


def test_ties_go_to_the_lower_pid_and_the_older_main(tree: Tree) -> None:
    tree.scope("a", {10: ("claude", 50, 100), 13: ("x", 400, 300), 12: ("y", 400, 300)})
    assert victim_pid(tree) == 12
    # Two processes started in the same tick: the lower pid is the main.
    procs = [
        SliceProcess(21, 100, "a", "u", 500, 0),
        SliceProcess(20, 100, "b", "u", 100, 0),
    ]
    victim = choose_victim(procs, 0.25)
    assert victim is not None
    assert victim.main.pid == 20
    assert victim.process.pid == 21


def test_vanished_processes_and_scopes_are_skipped(tree: Tree) -> None:
    unit = tree.scope("a", {10: ("claude", 50, 100), 11: ("node", 500, 200)})
    # 11 exited after cgroup.procs listed it; 99 is listed but never existed.
    for name in ("stat", "status", "oom_score_adj", "cmdline"):
        (tree.proc / "11" / name).unlink()
    write(tree.slice / unit / "cgroup.procs", "10\n11\n99\n")
    assert {p.pid for p in tree.scan()} == {10}
    assert scan_slice_processes(tree.slice / "gone.slice", tree.proc) == []


def test_dying_processes_are_not_chosen_again(tree: Tree) -> None:
    tree.scope("a", {10: ("claude", 50, 100)})
    make_proc(
        tree.proc,
        11,
        comm="node",
        rss_pages=900 * MIB_PAGES,
        start_time=200,
        signals=1 << 8,  # SIGKILL pending: the guard's last victim, still exiting
        oom_score_adj=800,
    )
    write(tree.slice / "agentscope-f-a-a1b2c3.scope" / "cgroup.procs", "10\n11\n")
    assert victim_pid(tree) == 10


def test_no_eligible_process_means_no_victim(tree: Tree) -> None:
    assert victim_pid(tree) is None
    tree.scope("a", {10: ("claude", 50, 100)})
    assert victim_pid(tree, protected_pids={10}) is None


# -- thresholds and config ------------------------------------------------


def reading(
    avail: float,
    swap_free: float = 0.0,
    psi_full: float | None = 0.0,
    ts: float = 0.0,
    swap_total: int = 1 << 30,
) -> HostReading:
    total = 8 << 30
    return HostReading(
        ts=ts,
        mem_total=total,
        mem_available=int(total * avail / 100),
        swap_total=swap_total,
        swap_free=int(swap_total * swap_free / 100),
        psi_some_avg10=psi_full,
        psi_full_avg10=psi_full,
    )


def test_memory_threshold_needs_both_ram_and_swap_low() -> None:
    config = GuardConfig()
    assert under_pressure(reading(9, 9), config) == "memory"
    assert under_pressure(reading(9, 50), config) is None  # swap still to fill
    assert under_pressure(reading(11, 0), config) is None
    # No swap counts as 0 % free.
    assert under_pressure(reading(9, 0, swap_total=0), config) == "memory"
    assert under_pressure(reading(10, 10), config) == "memory"  # "<=", as earlyoom


def test_psi_threshold_must_be_sustained_and_restarts_after_a_kill() -> None:
    config = GuardConfig(psi_full_seconds=5)
    clock = PressureClock(config)
    assert clock.update(reading(50, 50, psi_full=70, ts=100)) is None
    assert clock.update(reading(50, 50, psi_full=70, ts=104)) is None
    assert clock.update(reading(50, 50, psi_full=70, ts=105.5)) == "psi"
    assert clock.crossed_at == 105  # 100 + 5 s sustained
    clock.restart(106)
    assert clock.update(reading(50, 50, psi_full=70, ts=107)) is None  # counts from the kill
    assert clock.update(reading(50, 50, psi_full=70, ts=111.5)) == "psi"
    # A dip under the threshold starts the count again.
    assert clock.update(reading(50, 50, psi_full=10, ts=112)) is None
    assert clock.update(reading(50, 50, psi_full=70, ts=113)) is None
    # Off: PSI never triggers.
    off = PressureClock(GuardConfig(psi_full_percent=None))
    assert off.update(reading(50, 50, psi_full=100, ts=0)) is None
    assert off.update(reading(50, 50, psi_full=100, ts=100)) is None


def test_the_crossing_is_interpolated_between_readings() -> None:
    clock = PressureClock(GuardConfig())
    assert clock.update(reading(30, 0, ts=10.0)) is None
    assert clock.update(reading(5, 0, ts=11.0)) == "memory"
    # From 30 % to 5 % in 1 s: 10 % was crossed at 0.8 s.
    assert clock.crossed_at == pytest.approx(10.8)
    assert clock.update(reading(4, 0, ts=11.2)) == "memory"
    assert clock.crossed_at == pytest.approx(10.8)  # the same squeeze


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mem_available_percent": 101}, "mem_available_percent"),
        ({"mem_available_percent": -1}, "mem_available_percent"),
        ({"swap_free_percent": float("nan")}, "swap_free_percent"),
        ({"psi_full_percent": 0}, "psi_full_percent"),
        ({"psi_full_percent": 150}, "psi_full_percent"),
        ({"psi_full_seconds": -1}, "psi_full_seconds"),
        ({"min_interval": 0}, "min_interval"),
        ({"min_interval": 2.0, "max_interval": 1.0}, "max_interval"),
        ({"descendant_share": 1.5}, "descendant_share"),
        ({"mem_available_percent": True}, "mem_available_percent"),
        ({"mem_available_percent": "10"}, "mem_available_percent"),
        ({"oom_score_adj": -1001}, "oom_score_adj"),
    ],
)
def test_config_out_of_range_names_the_field_and_range(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidConfig) as info:
        GuardConfig(**changes)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value)
    assert "must be" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_the_poll_interval_shrinks_as_memory_falls() -> None:
    config = GuardConfig()
    roomy = next_interval(reading(99, 80), None, config)
    near = next_interval(reading(10.5, 5), None, config)
    assert roomy == config.max_interval
    assert near == config.min_interval
    # Free swap does not put the next reading off: at MemAvailable's
    # threshold the rules for memory gone act whatever SwapFree says.
    assert next_interval(reading(10.5, 100), None, config) == config.min_interval
    assert next_interval(reading(8, 100), None, config) == config.min_interval
    middle = next_interval(reading(12, 5), None, config)  # 164 MiB over at 6000 MiB/s
    assert config.min_interval <= middle < roomy
    # A fill faster than earlyoom's assumed rate polls sooner still.
    fast_prev = reading(40, 0, ts=0.0)
    fast = next_interval(reading(20, 0, ts=0.1), fast_prev, GuardConfig(min_interval=0.01))
    slow = next_interval(reading(20, 0, ts=0.1), None, GuardConfig(min_interval=0.01))
    assert fast < slow
    # PSI near its threshold polls at the minimum.
    assert next_interval(reading(80, 80, psi_full=40), None, config) == config.min_interval


def test_read_host_reads_meminfo_and_psi(tree: Tree) -> None:
    tree.host(7.5, 2.0, psi_full=12.5)
    host = read_host(tree.proc, now=3.0)
    assert host.ts == 3.0
    assert host.mem_available_percent == pytest.approx(7.5, abs=0.01)
    assert host.swap_free_percent == pytest.approx(2.0, abs=0.01)
    assert host.psi_full_avg10 == 12.5
    reader = HostReader(tree.proc)
    try:
        assert reader.read(4.0) == replace(host, ts=4.0)
        tree.host(3.0, 1.0)  # the kept-open files show the change
        assert reader.read(5.0).mem_available_percent == pytest.approx(3.0, abs=0.01)
    finally:
        reader.close()
    (tree.proc / "pressure" / "memory").unlink()
    assert read_host(tree.proc).psi_full_avg10 is None
    reader = HostReader(tree.proc)
    assert reader.read(6.0).psi_full_avg10 is None
    reader.close()


# -- the kill, on real processes ------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sleep", "60"])
        procs.append(p)
        return p

    first = start()
    first.start_another = start  # type: ignore[attr-defined]
    yield first
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_kill_process_rechecks_the_start_time(tree: Tree, sleeper: subprocess.Popen[bytes]) -> None:
    make_proc(tree.proc, sleeper.pid, start_time=4242)
    # A different start time: the pid was reused, nothing is signalled.
    assert kill_process(sleeper.pid, 1111, tree.proc) is None
    assert sleeper.poll() is None
    released = kill_process(sleeper.pid, 4242, tree.proc)
    assert released is not None  # signalled (released: the kernel's process_mrelease)
    assert sleeper.wait(WAIT) == -signal.SIGKILL


def start_guard(
    tree: Tree, config: GuardConfig, **kw: object
) -> tuple[list[GuardKill], Callable[[], None]]:
    got: list[GuardKill] = []
    r, w = os.pipe()
    thread = threading.Thread(
        target=run_guard,
        args=(config, tree.slice),
        kwargs={
            "stop_fd": r,
            "on_kill": got.append,
            "unit_agent": unit_agent,
            "proc_root": tree.proc,
            "cgroup_root": tree.cg,
            **kw,
        },
        daemon=True,
    )
    thread.start()

    def stop() -> None:
        os.write(w, b"x")
        thread.join(WAIT)
        assert not thread.is_alive()
        os.close(r)
        os.close(w)

    return got, stop


def kills_or_none(tree: Tree, config: GuardConfig, *, kill: bool) -> list[GuardKill]:
    """The guard's kills: its first waited for (``kill``), or none over half a second."""
    got, stop = start_guard(tree, config)
    try:
        if kill:
            wait_until(lambda: len(got) == 1)
        else:
            time.sleep(0.5)
    finally:
        stop()
    return got


def wait_until(cond: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


FAST = GuardConfig(min_interval=0.01, max_interval=0.05, lock_memory=False)


def test_the_guard_kills_the_runaway_tool_call_and_says_so(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    tool = sleeper.pid
    agent = sleeper.start_another()  # type: ignore[attr-defined]
    tree.scope("a", {agent.pid: ("claude", 200, 100), tool: ("pytest", 900, 200)})
    got: list[GuardKill] = []

    def on_kill(kill: GuardKill) -> None:
        got.append(kill)
        tree.host(40, 40)  # the memory came back

    _, stop = start_guard(tree, FAST, on_kill=on_kill)
    try:
        time.sleep(0.1)
        assert got == []
        assert sleeper.poll() is None
        tree.host(5, 1)
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        wait_until(lambda: len(got) == 1)
        time.sleep(0.2)
    finally:
        stop()
    (kill,) = got
    assert (kill.agent, kill.pid, kill.comm, kill.trigger) == ("a", tool, "pytest", "memory")
    assert kill.unit == "agentscope-f-a-a1b2c3.scope"
    assert kill.rss == 900 << 20
    # Crossed at once, no choice made ahead: the command line if the names
    # thread read it before the kill, else the comm (see the tests below).
    assert kill.cmdline in ("pytest --work", "pytest")
    assert kill.mem_available_percent == pytest.approx(5, abs=0.01)
    assert 0 <= kill.reaction_seconds < 5
    assert agent.poll() is None  # the agent itself lives on
    assert kill.to_dict()["kind"] == "guard_kill"


def test_one_squeeze_one_kill_two_runaways_two_kills(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    a_tool, b_tool = sleeper.pid, sleeper.start_another().pid  # type: ignore[attr-defined]
    tree.scope("a", {1: ("claude", 10, 100), a_tool: ("node", 900, 200)})
    tree.scope("b", {2: ("claude", 10, 100), b_tool: ("node", 800, 200)}, token="d4e5f6")
    got, stop = start_guard(tree, FAST)
    try:
        tree.host(5, 1)
        wait_until(lambda: len(got) == 2)  # still short after the first: the second goes too
        tree.host(40, 40)
        time.sleep(0.3)
        assert len(got) == 2
    finally:
        stop()
    assert [k.pid for k in got] == [a_tool, b_tool]


def test_the_guard_waits_for_the_memory_before_a_second_kill(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    a_tool, b_tool = sleeper.pid, sleeper.start_another().pid  # type: ignore[attr-defined]
    tree.scope("a", {1: ("claude", 10, 100), a_tool: ("node", 900, 200)})
    tree.scope("b", {2: ("claude", 10, 100), b_tool: ("node", 800, 200)}, token="d4e5f6")
    got: list[GuardKill] = []

    def on_kill(kill: GuardKill) -> None:
        got.append(kill)
        tree.host(40, 40)  # the victim's memory is back at once (process_mrelease)

    _, stop = start_guard(tree, FAST, on_kill=on_kill)
    try:
        tree.host(5, 1)
        wait_until(lambda: len(got) == 1)
        time.sleep(0.3)
    finally:
        stop()
    assert [k.pid for k in got] == [a_tool]


def _throttle(tree: Tree, unit: str, pids: list[int], *, limit_mib: int | None, psi: float) -> None:
    """The scope ``unit`` reclaiming: PSI full avg10 ``psi``, at ``limit_mib`` (its MemoryHigh)."""
    make_cgroup(
        tree.cg,
        f"{SLICE}/{unit}",
        procs=pids,
        current=(limit_mib or 100) << 20,
        high=None if limit_mib is None else limit_mib << 20,
        pressure=format_pressure((psi, psi, 0, 0), (psi, psi, 0, 0)),
    )


def test_a_stall_is_a_scopes_own_limit_only_at_that_limit_on_a_host_with_memory() -> None:
    config = GuardConfig()
    ample, short = reading(64, 50, psi_full=66), reading(15, 50, psi_full=66)
    at_limit = ScopeStall("docs.scope", 66.0, 47 << 20, 48 << 20)
    assert own_limit_stall([at_limit], ample, config) == at_limit
    assert own_limit_stall([at_limit], short, config) is None  # the host is short too
    below = ScopeStall("docs.scope", 66.0, 20 << 20, 48 << 20)
    unlimited = ScopeStall("docs.scope", 66.0, 900 << 20, None)
    quiet = ScopeStall("docs.scope", 10.0, 47 << 20, 48 << 20)  # not what stalls the host
    for scope in (below, unlimited, quiet):
        assert own_limit_stall([scope], ample, config) is None, scope
    assert own_limit_stall([at_limit], reading(64, 50, psi_full=None), config) is None


def test_read_scope_stalls_reads_psi_and_the_lower_limit(tree: Tree) -> None:
    unit = tree.scope("docs", {3: ("python3", 47, 100)})
    _throttle(tree, unit, [3], limit_mib=48, psi=66.2)
    make_cgroup(tree.cg, f"{SLICE}/agentscope-f-x-000001.scope", max=32 << 20, high=64 << 20)
    stalls = {s.unit: s for s in read_scope_stalls(tree.slice)}
    assert stalls[unit] == ScopeStall(unit, 66.2, 48 << 20, 48 << 20)
    assert stalls["agentscope-f-x-000001.scope"].limit == 32 << 20
    assert read_scope_stalls(tree.slice / "gone") == []


@pytest.mark.parametrize("limited", [True, False])
def test_a_scope_throttled_by_its_own_limit_costs_no_sibling_its_tool_call(
    tree: Tree, sleeper: subprocess.Popen[bytes], limited: bool
) -> None:
    # docs reclaims under its own MemoryHigh on a quiet host: host PSI full is
    # high, MemAvailable 64%. The largest process is indexer's, an innocent.
    indexer = sleeper.pid
    tree.scope("indexer", {1: ("claude", 10, 100), indexer: ("python3", 900, 200)})
    docs = tree.scope("docs", {2: ("python3", 96, 100)}, token="d4e5f6")
    _throttle(tree, docs, [2], limit_mib=48 if limited else None, psi=66)
    tree.host(64, 50, psi_full=66)
    # With no limit of docs' own the stall is the host's: the largest goes.
    got = kills_or_none(tree, replace(FAST, psi_full_seconds=0.05), kill=not limited)
    if limited:
        assert got == []
        assert sleeper.poll() is None
    else:
        assert [(k.pid, k.trigger) for k in got] == [(indexer, "psi")]


def test_nothing_worth_killing_kills_nothing(tree: Tree, sleeper: subprocess.Popen[bytes]) -> None:
    # Short of memory, but the slice holds only small processes: the memory is elsewhere.
    tree.scope("a", {sleeper.pid: ("sh", 1, 100)})
    got, stop = start_guard(tree, FAST)
    try:
        tree.host(5, 1)
        time.sleep(0.3)
    finally:
        stop()
    assert got == []
    assert sleeper.poll() is None


async def test_monitor_guard_events_reach_the_loop_even_after_a_stall(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    make_meminfo(tree.proc)
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("pytest", 900, 200)})
    got: list[Event] = []
    mon = Monitor(
        slice_path=tree.slice,
        unit_agent=unit_agent,
        interval=0.05,
        cgroup_root=tree.cg,
        proc_root=tree.proc,
        kmsg=None,
        on_event=got.append,
        guard=FAST,
    )
    async with mon:
        assert mon.guard is not None
        assert mon.guard.running
        tree.host(5, 1)
        # The loop is stalled (a blocking call on it): the guard kills anyway.
        deadline = time.monotonic() + WAIT
        while sleeper.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not any(isinstance(e, GuardKill) for e in got)  # queued, not yet delivered
        tree.host(40, 40)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if any(isinstance(e, GuardKill) for e in got):
                break
    kills = [e for e in got if isinstance(e, GuardKill)]
    assert [k.pid for k in kills] == [sleeper.pid]
    assert mon.guard is not None
    assert not mon.guard.running
    assert mon.guard.kills == 1


def test_monitor_guard_option_is_validated(tree: Tree) -> None:
    with pytest.raises(ValueError, match="guard must be"):
        Monitor(slice_path=tree.slice, unit_agent=unit_agent, guard="yes")  # type: ignore[arg-type]


# -- admission control ------------------------------------------------------


async def test_admission_waits_then_refuses_with_the_figures(tree: Tree) -> None:
    guard = Guard(FAST, tree.slice, on_kill=lambda k: None, proc_root=tree.proc)
    guard.start()
    try:
        await admit([guard], 0.0)  # 50 % available: admitted at once
        tree.host(5, 1)
        await asyncio.to_thread(wait_until, lambda: guard.trigger == "memory")
        started = time.monotonic()
        with pytest.raises(HostUnderPressure) as info:
            await admit([guard], 0.2)
        assert time.monotonic() - started >= 0.2
        assert info.value.mem_available_percent == pytest.approx(5, abs=0.01)
        assert "admission_wait" in str(info.value)
        assert "MemAvailable 5.0%" in str(info.value)

        async def clear_soon() -> None:
            await asyncio.sleep(0.1)
            tree.host(40, 40)

        task = asyncio.create_task(clear_soon())
        await admit([guard], 5.0)  # waits until the guard sees it clear
        await task
    finally:
        await asyncio.to_thread(guard.stop)
    assert not guard.running


# -- the fleet: protected pids, the registry, admission ---------------------


@pytest.fixture
async def fleet(tree: Tree, tmp_path: Path) -> AsyncIterator[AsyncFleet]:
    """An AsyncFleet with a registry and no bus (the host has no systemd).

    Only what the guard touches is real: its monitor, the registry, the
    launch's admission step (which runs before any bus call).
    """
    f = AsyncFleet("f", "user", registry=tmp_path / "reg.db", tmux_dir=tmp_path / "tmux")
    await f._store.open()
    f._manager._slice_cgroup = tree.slice  # type: ignore[attr-defined]  # where the fake slice is
    yield f
    await f.aclose()


async def test_a_fleets_guard_kill_is_recorded_even_while_the_loop_stalls(
    tree: Tree, fleet: AsyncFleet, sleeper: subprocess.Popen[bytes]
) -> None:
    make_meminfo(tree.proc)
    unit = tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("pytest", 900, 200)})
    # The fleet's own agent: its registry row says so (a unit name alone does not).
    fleet._store.open_registry.record_launch("f", "a", unit, 1, 100, ["claude"], "/", "running")
    mon = fleet.monitor(
        interval=0.05, guard=FAST, cgroup_root=tree.cg, proc_root=tree.proc, kmsg=None
    )
    async with mon:
        tree.host(5, 1)
        # The loop stalls (a blocking call on it) through the whole kill.
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        tree.host(40, 40)
        for _ in range(500):
            await asyncio.sleep(0.01)
            if await fleet.events(kind="guard_kill"):
                break
    (record,) = await fleet.events(kind="guard_kill")
    assert record.agent == "a"
    assert record.detail["pid"] == sleeper.pid
    assert record.detail["comm"] == "pytest"
    assert record.detail["trigger"] == "memory"
    assert record.detail["unit"] == "agentscope-f-a-a1b2c3.scope"


async def test_the_fleet_protects_its_own_process_and_tmux_server(fleet: AsyncFleet) -> None:
    pids, units = fleet._monitors.guard_protected()
    assert os.getpid() in pids
    assert units == {"agentscope-f-tmux.scope"}


async def test_a_launch_under_pressure_is_refused_before_anything_exists(
    tree: Tree, fleet: AsyncFleet
) -> None:
    mon = fleet.monitor(
        interval=0.05, guard=FAST, cgroup_root=tree.cg, proc_root=tree.proc, kmsg=None
    )
    async with mon:
        tree.host(5, 1)
        guard = mon.guard
        assert guard is not None
        await asyncio.to_thread(wait_until, lambda: guard.trigger == "memory")
        with pytest.raises(HostUnderPressure) as info:
            await fleet.launch("b", ["sleep", "60"])
        assert info.value.swap_free_percent == pytest.approx(1, abs=0.01)
    assert await asyncio.to_thread(fleet._store.open_registry.agents, "f") == []
    assert await fleet.events(agent="b") == []  # (the monitor's pressure window may be there)


def test_admission_wait_is_validated() -> None:
    with pytest.raises(InvalidConfig, match="admission_wait"):
        AsyncFleet("f", "user", admission_wait=-1)


# -- the guard as a process of its own ------------------------------------


async def test_a_guard_process_kills_and_reports_through_the_monitor(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    make_meminfo(tree.proc)
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("pytest", 900, 200)})
    got: list[Event] = []
    mon = Monitor(
        slice_path=tree.slice,
        unit_agent=unit_agent,
        interval=0.05,
        cgroup_root=tree.cg,
        proc_root=tree.proc,
        kmsg=None,
        on_event=got.append,
        guard=replace(FAST, process=True),
    )
    async with mon:
        child = mon.guard
        assert isinstance(child, GuardChild)
        assert child.running
        assert child.pid != os.getpid()
        tree.host(5, 1)
        await asyncio.to_thread(sleeper.wait, WAIT)
        tree.host(40, 40)
        for _ in range(500):
            await asyncio.sleep(0.01)
            if any(isinstance(e, GuardKill) for e in got):
                break
        assert child.trigger in ("memory", None)  # the state lines arrive too
    kills = [e for e in got if isinstance(e, GuardKill)]
    assert [(k.pid, k.agent, k.comm) for k in kills] == [(sleeper.pid, "a", "pytest")]
    assert sleeper.returncode == -signal.SIGKILL
    assert not child.running  # stopped with the monitor


def test_a_guard_process_protects_its_parent_and_ends_with_its_stdin(tree: Tree) -> None:
    # The parent (this test) is in the slice and the largest: never chosen.
    tree.scope("a", {os.getpid(): ("python3", 900, 100)})
    tree.host(5, 1)
    child = GuardChild(FAST, tree.slice, on_kill=lambda k: None, proc_root=tree.proc)
    child.start()
    try:
        wait_until(lambda: child.trigger == "memory")
        assert child.last_reading is not None
        assert child.last_reading.mem_available_percent == pytest.approx(5, abs=0.01)
        time.sleep(0.2)
        assert child.kills == 0
    finally:
        child.stop()
    assert not child.running


def test_near_the_threshold_the_victim_is_chosen_before_the_crossing(
    tree: Tree, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("pytest", 900, 200)})
    scans: list[float] = []
    scan = _guard.scan_candidates

    def counted(*args: object, **kw: object) -> Scan:
        scans.append(time.monotonic())
        return scan(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_guard, "scan_candidates", counted)
    got: list[GuardKill] = []
    _, stop = start_guard(tree, FAST, on_kill=got.append)
    try:
        time.sleep(0.1)
        assert scans == []  # 50 % available: far from it, no scan
        tree.host(12, 1)  # near (under 1.5 x 10 %): a choice at every reading
        wait_until(lambda: len(scans) >= 2)
        tree.host(5, 1)
        wait_until(lambda: len(got) == 1)
        tree.host(40, 40)
    finally:
        stop()
    (kill,) = got
    assert kill.pid == sleeper.pid
    assert kill.rss == 900 << 20  # sized again at the kill
    assert sleeper.wait(WAIT) == -signal.SIGKILL
    assert kill.cmdline == "pytest --work"  # read ahead, near the threshold


def test_a_command_line_that_takes_seconds_to_read_does_not_delay_the_kill(
    tree: Tree, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a squeeze /proc/PID/cmdline waits for the process's argv pages to
    # come back from swap or zram (measured 0.5-2.1 s under zram, see
    # agentscope_systemd/_guard/_guardnames.py): the guard must kill first.
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("pytest", 900, 200)})
    slow_reads: list[int] = []

    def slow_cmdline(pid: int, proc_root: Path, max_len: int = 120) -> str | None:
        slow_reads.append(pid)
        time.sleep(3)
        return "pytest --work"

    monkeypatch.setattr(_guardnames, "read_cmdline", slow_cmdline)
    got: list[GuardKill] = []
    _, stop = start_guard(tree, FAST, on_kill=got.append)
    try:
        time.sleep(0.1)
        tree.host(5, 1)
        started = time.monotonic()
        wait_until(lambda: len(got) == 1, timeout=2.5)
        took = time.monotonic() - started
        tree.host(40, 40)
    finally:
        stop()
    (kill,) = got
    assert took < 2.0, took  # not the read's 3 s
    assert slow_reads == [sleeper.pid]  # asked for, off the guard's path
    assert (kill.pid, kill.comm, kill.cmdline) == (sleeper.pid, "pytest", "pytest")
    assert sleeper.wait(WAIT) == -signal.SIGKILL


def test_the_guard_watches_once_started(tree: Tree) -> None:
    # What a harness starts after Guard.start() is watched from its first
    # byte: the first reading (and the first charges of whose shortage) come
    # before start() returns, not a thread start-up later.
    tree.host(5, 1)
    guard = Guard(FAST, tree.slice, on_kill=lambda k: None, proc_root=tree.proc)
    guard.start()
    try:
        assert guard.last_reading is not None
        assert guard.trigger == "memory"
    finally:
        guard.stop()
