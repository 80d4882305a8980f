# ruff: noqa: F811
"""The guard reads the limit's own ``memory.pressure`` (issue #27 item 3): fake trees, real victims.

Inside a container ``/proc/pressure/memory`` is the whole host's: a
container with swap allowed thrashes at its limit while the host is calm
and while the memory rule waits for the limit's swap to fill. So the
nearest limit's PSI comes with its reading, and the host's PSI, thrash and
"short and stalling" rules apply under it, the kill naming that limit.
"""

# The fixtures (kernel, sleeper, tree, container, whole_reads) are test_guard's,
# test_guard_limit's and test_guard_modes'.

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentscope_systemd import GuardConfig
from agentscope_systemd._contract import monitor_event_dict
from agentscope_systemd._guard._guardclock import PressureClock
from agentscope_systemd._guard._guardpolicy import (
    GuardHeld,
    HostReading,
    ScopeStall,
    next_interval,
    own_limit_stall,
    under_pressure,
)
from tests.fakefs import PAGE, format_pressure, make_cgroup, remove, write
from tests.test_contract import validate
from tests.test_guard import (  # noqa: F401 (fixtures)
    FAST,
    SLICE,
    WAIT,
    Tree,
    _throttle,
    kernel,
    kills_or_none,
    sleeper,
    start_guard,
    tree,
    wait_until,
)
from tests.test_guard_limit import (  # noqa: F401 (fixture)
    MIB,
    PARENT,
    host_reading,
    one_kill,
    runaway,
    set_limit,
    watch,
    whole_reads,
)
from tests.test_guard_modes import alive, container, fleet_of_two  # noqa: F401 (fixture)

#: PSI over its threshold held this long (the default's 10 s would make slow tests).
QUICK_PSI = replace(FAST, psi_full_seconds=0.2)


def stall(cgroup: Path, full: float, total_us: int = 0) -> None:
    """The cgroup's ``memory.pressure``: ``full`` avg10 (%), its ``total`` (µs)."""
    write(
        cgroup / "memory.pressure", format_pressure((full, 0, 0, total_us), (full, 0, 0, total_us))
    )


def limited(
    ts: float,
    *,
    psi: float | None = 0.0,
    full_s: float = 0.0,
    refaults: int = 0,
    avail: float = 50.0,
    swap_free: float = 80.0,
    path: str = "/",
    host_psi: float = 0.0,
    host_avail: float = 50.0,
) -> HostReading:
    """A calm host (8 GiB) under a 400 MiB limit with 1 GiB of swap allowed."""
    limit = 400 * MIB
    return replace(
        host_reading(),
        ts=ts,
        mem_available=int(8000 * MIB * host_avail / 100),
        psi_full_avg10=host_psi,
        psi_full_total=0,
        refaults=0,
        limit_path=path,
        limit_bytes=limit,
        limit_available=int(limit * avail / 100),
        limit_swap_total=1 << 30,
        limit_swap_free=int((1 << 30) * swap_free / 100),
        limit_psi_full_avg10=psi,
        limit_psi_full_total=int(full_s * 1e6),
        limit_refaults=refaults,
    )


# -- the reading ----------------------------------------------------------------


def test_the_nearest_limits_memory_pressure_and_paging_come_with_its_reading(tree: Tree) -> None:
    config = GuardConfig()
    set_limit(tree, "app.slice", current_mib=1000, max_mib=4000)
    stall(tree.cg / "app.slice", 5.0, 1_000)
    parent = set_limit(tree, PARENT, current_mib=1100, max_mib=1200)  # the nearer
    stall(parent, 72.5, 3_000_000)
    stat = (parent / "memory.stat").read_text()
    write(parent / "memory.stat", stat + "workingset_refault_anon 7\nworkingset_refault_file 5\n")
    limits = watch(tree)
    got = limits.apply(host_reading(), config)
    assert got.limit_path == "/" + PARENT
    assert (got.limit_psi_full_avg10, got.limit_psi_full_total) == (72.5, 3_000_000)
    assert got.limit_refaults == 12
    assert got.psi_full_avg10 == 0.0  # the host's own figure is untouched
    # The file is kept open: a new stall is read (one pread at offset 0).
    stall(parent, 80.0, 4_000_000)
    write(parent / "memory.stat", stat + "workingset_refault_anon 70\nworkingset_refault_file 5\n")
    got = limits.apply(host_reading(), config)
    assert (got.limit_psi_full_avg10, got.limit_psi_full_total, got.limit_refaults) == (
        80.0,
        4_000_000,
        75,
    )
    # The view the host's rules read: the limit as a host of its own.
    view = got.limit_view()
    assert view is not None
    assert (view.mem_total, view.psi_full_avg10, view.psi_full_total, view.refaults) == (
        1200 * MIB,
        80.0,
        4_000_000,
        75,
    )
    assert view.mem_available_percent == pytest.approx(got.limit_available_percent)
    assert host_reading().limit_view() is None  # no limit, no view
    limits.close()


def test_a_limit_without_a_readable_memory_pressure_has_no_psi_reading(tree: Tree) -> None:
    config = GuardConfig()
    parent = set_limit(tree, PARENT, current_mib=1100, max_mib=1200)
    remove(parent / "memory.pressure")  # psi=0 on the kernel's command line
    limits = watch(tree)
    got = limits.apply(host_reading(), config)
    assert got.limit_path == "/" + PARENT  # the limit itself is read as before
    assert (got.limit_psi_full_avg10, got.limit_psi_full_total, got.limit_refaults) == (
        None,
        None,
        None,
    )
    # The file appears: opened at the next refresh of the limits.
    stall(parent, 64.0)
    limits.refresh(0.0, force=True)
    assert limits.apply(host_reading(), config).limit_psi_full_avg10 == 64.0
    # Not in its format: no reading, and the next one in its format is read.
    write(parent / "memory.pressure", "full avg10=x\n")
    assert limits.apply(host_reading(), config).limit_psi_full_avg10 is None
    stall(parent, 65.0)
    assert limits.apply(host_reading(), config).limit_psi_full_avg10 == 65.0
    limits.close()
    # A file that will not read (EISDIR here; ENODEV after an rmdir, EOPNOTSUPP
    # with cgroup.pressure 0 on a real cgroupfs): no reading, no crash.
    remove(parent / "memory.pressure")
    (parent / "memory.pressure").mkdir()
    limits = watch(tree)
    for _ in range(2):
        got = limits.apply(host_reading(), config)
        assert (got.limit_path, got.limit_psi_full_avg10) == ("/" + PARENT, None)
    limits.close()


# -- the rules, under the limit --------------------------------------------------


def test_the_psi_rule_holds_under_a_limit_with_the_host_calm_and_names_it() -> None:
    config = GuardConfig(psi_full_seconds=5)
    clock = PressureClock(config)
    assert under_pressure(limited(100, psi=70), config) == "psi"
    assert clock.update(limited(100, psi=70)) is None
    assert clock.update(limited(104, psi=70)) is None
    assert clock.update(limited(105.5, psi=70)) == "psi"
    assert (clock.source, clock.crossed_at) == ("/", 105)
    clock.restart(105.6)  # one stall, one kill: it counts again from the kill
    assert clock.update(limited(107, psi=70)) is None
    # The same figures on a limit without a PSI reading: nothing.
    blind = PressureClock(config)
    for ts in (100, 106):
        assert blind.update(limited(ts, psi=None)) is None
    # The nearest limit changes: its count starts again.
    moved = PressureClock(config)
    moved.update(limited(100, psi=70, path="/a.slice"))
    assert moved.update(limited(105.5, psi=70, path="/b.slice")) is None
    assert moved.update(limited(110.5, psi=70, path="/b.slice")) == "psi"
    assert moved.source == "/b.slice"


def test_where_the_host_and_the_limit_both_stall_the_nearer_to_exhaustion_is_named() -> None:
    config = GuardConfig(psi_full_seconds=0)
    # The limit has 15 % available and 10 % of its swap, the host 50 % and
    # no swap: the limit's is acted on.
    clock = PressureClock(config)
    assert clock.update(limited(1, psi=70, avail=15, swap_free=10, host_psi=70)) == "psi"
    assert clock.source == "/"
    # The host has 12 % available, the limit 60 %: the host's.
    host = PressureClock(config)
    assert host.update(limited(1, psi=70, avail=60, host_psi=70, host_avail=12)) == "psi"
    assert host.source == "host"
    # The host alone stalls: the host's, as before.
    alone = PressureClock(config)
    assert alone.update(limited(1, psi=0, avail=15, host_psi=70)) == "psi"
    assert alone.source == "host"


def test_thrashing_under_a_limit_is_measured_against_the_limit() -> None:
    config = GuardConfig(thrash_seconds=5)
    per_s = int(0.02 * (400 * MIB) / PAGE)  # 2 % of the limit a second: 2 % of nothing for 8 GiB
    clock = PressureClock(config)
    assert clock.update(limited(0, psi=30)) is None
    assert clock.update(limited(3, psi=30, full_s=2.0, refaults=3 * per_s)) is None
    assert clock.update(limited(5, psi=30, full_s=3.0, refaults=5 * per_s)) == "thrash"
    assert clock.source == "/"
    # Stalled without refaults under the limit (reclaim that progresses): no.
    quiet = PressureClock(config)
    quiet.update(limited(0, psi=30))
    assert quiet.update(limited(5, psi=30, full_s=4.0, refaults=10)) is None


def test_short_and_stalling_under_a_limit_acts_before_its_swap_fills() -> None:
    # A container allowed swap (80 % of it free), 8 % of its limit left, and
    # stalled 60 % of the last second: the memory rule waits for swap, this does not.
    config = GuardConfig()
    clock = PressureClock(config)
    assert clock.update(limited(0.0, psi=30, avail=8)) is None
    assert clock.update(limited(0.5, psi=30, avail=8, full_s=0.3)) is None
    assert clock.update(limited(1.0, psi=30, avail=8, full_s=0.6)) == "memory"
    assert (clock.source, clock.crossed_at) == ("/", 1.0)
    # With room under the limit a stall is not this rule's.
    spare = PressureClock(config)
    spare.update(limited(0.0, psi=30, avail=30))
    assert spare.update(limited(1.0, psi=30, avail=30, full_s=0.9)) is None


def test_a_scope_at_its_own_limit_is_no_stall_of_the_limit_above_it() -> None:
    config = GuardConfig()
    under = limited(0, psi=66, avail=40).limit_view()
    assert under is not None
    at_limit = ScopeStall("docs.scope", 66.0, 47 << 20, 48 << 20)
    assert own_limit_stall([at_limit], under, config) == at_limit
    short = limited(0, psi=66, avail=15).limit_view()
    assert short is not None
    assert own_limit_stall([at_limit], short, config) is None  # the limit is short too


# -- the guard acting on it -------------------------------------------------------


def test_a_limit_whose_pressure_stays_high_is_killed_for_with_the_host_calm(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    agent, tool = runaway(tree, sleeper)
    # 17 % of the limit available, swap allowed: the memory rule does not hold.
    parent = set_limit(tree, PARENT, current_mib=1000, max_mib=1200, swap_max="max")
    tree.host(60, 50, psi_full=0)  # the host's PSI is calm throughout

    def squeeze() -> None:
        stall(parent, 80.0)
        stall(tree.slice, 80.0)  # the agents are what stalls

    def relief() -> None:
        stall(parent, 0.0)
        stall(tree.slice, 0.0)

    kill = one_kill(tree, sleeper, squeeze, relief, QUICK_PSI)
    assert (kill.agent, kill.pid, kill.trigger) == ("a", tool, "psi")
    assert (kill.limit, kill.limit_bytes) == ("/" + PARENT, 1200 * MIB)
    assert kill.limit_psi_full_avg10 == 80.0
    assert kill.psi_full_avg10 == 0.0  # the host's, calm
    assert validate(monitor_event_dict("f", kill)) == "agentscope.event/1"  # the JSON contract
    assert kill.mem_available_percent == pytest.approx(60, abs=0.01)
    assert os.kill(agent, 0) is None  # the agent's shell lives on


def test_a_stall_of_the_manager_beside_the_agents_under_the_limit_costs_no_agent(
    tree: Tree, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    # The limit stalls, but what stalls is the harness beside the agents (its
    # own PSI full high, the agents' slice calm): nothing killed, said once.
    runaway(tree, sleeper)
    manager = make_cgroup(tree.cg, PARENT + "/manager.service", current=100 * MIB)
    parent = set_limit(tree, PARENT, current_mib=1000, max_mib=1200, swap_max="max")
    stall(parent, 80.0)
    stall(manager, 80.0)
    held: list[GuardHeld] = []
    got, stop = start_guard(tree, QUICK_PSI, on_held=held.append)
    try:
        wait_until(lambda: len(held) == 1)
        time.sleep(0.3)
    finally:
        stop()
    assert got == []
    assert sleeper.poll() is None
    (event,) = held
    assert (event.trigger, event.reason, event.limit) == ("psi", "pressure", "/" + PARENT)
    assert event.culprit == "/" + PARENT + "/manager.service"
    (said,) = [m for r in caplog.records if "not because of" in (m := r.getMessage())]
    assert f"memory limit of /{PARENT} is short (psi: 16.7% available, PSI full 80%)" in said


def test_a_limit_without_memory_pressure_kills_by_memory_only(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    _, tool = runaway(tree, sleeper)
    parent = set_limit(tree, PARENT, current_mib=800, max_mib=1200)
    remove(parent / "memory.pressure")
    kill = one_kill(
        tree,
        sleeper,
        lambda: set_limit(tree, PARENT, current_mib=1150, max_mib=1200),
        lambda: set_limit(tree, PARENT, current_mib=250, max_mib=1200),
        QUICK_PSI,
    )
    assert (kill.pid, kill.trigger, kill.limit) == (tool, "memory", "/" + PARENT)
    assert kill.limit_psi_full_avg10 is None


@pytest.mark.parametrize("own_limit", [True, False])
def test_a_scope_throttled_by_its_own_limit_costs_no_sibling_under_the_limit_above(
    tree: Tree, sleeper: subprocess.Popen[bytes], own_limit: bool
) -> None:
    # docs reclaims under its own MemoryHigh inside a limit with 40 % to
    # spare: the limit's PSI full is high. The largest
    # process is indexer's, an innocent.
    indexer = sleeper.pid
    tree.scope("indexer", {1: ("claude", 10, 100), indexer: ("python3", 900, 200)})
    docs = tree.scope("docs", {2: ("python3", 96, 100)}, token="d4e5f6")
    _throttle(tree, docs, [2], limit_mib=48 if own_limit else None, psi=66)
    parent = set_limit(tree, PARENT, current_mib=720, max_mib=1200, swap_max="max")
    stall(parent, 66.0)
    stall(tree.slice, 66.0)
    # The host calm, its MemAvailable 15 %: a check of the host's figures
    # (not twice the threshold) would take docs' stall for a shortage.
    tree.host(15, 50, psi_full=0)
    # With no limit of docs' own the stall is the limit's: the largest goes.
    got = kills_or_none(tree, QUICK_PSI, kill=not own_limit)
    if own_limit:
        assert got == []
        assert sleeper.poll() is None
    else:
        assert [(k.pid, k.trigger, k.limit) for k in got] == [(indexer, "psi", "/" + PARENT)]


def test_a_container_with_swap_stalling_at_its_limit_loses_the_tool_call(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # Process mode in a container allowed the host's swap (half of it free):
    # 6 % of its limit left, the memory rule waits for swap. Then it stalls
    # 60 % of the time (its own memory.pressure), the host calm.
    pids, popens = fleet_of_two(container, sleeper)
    set_limit(container, "", current_mib=1880, max_mib=2000, swap_max="max")
    stall(container.cg, 0.0)
    done = threading.Event()

    def stalling() -> None:
        start = time.monotonic()
        while not done.is_set():
            stall(container.cg, 30.0, int(0.6e6 * (time.monotonic() - start)))
            time.sleep(0.02)

    stalls = threading.Thread(target=stalling, daemon=True)
    try:
        kill = one_kill(
            container,
            sleeper,
            stalls.start,  # before it, a second at 6 % kills nothing (one_kill asserts it)
            lambda: (done.set(), set_limit(container, "", current_mib=980, max_mib=2000)),
            unit_agent=lambda unit: None,
        )
    finally:
        done.set()
        if stalls.is_alive():
            stalls.join(WAIT)
    assert sleeper.wait(WAIT) == -signal.SIGKILL
    assert (kill.agent, kill.pid, kill.trigger, kill.limit) == ("a", pids["tool"], "memory", "/")
    assert kill.psi_full_avg10 == 0.0  # the host's PSI never moved
    assert alive(popens["a"], popens["b"], popens["helper"])


def test_a_container_whose_pressure_stays_high_is_killed_for_by_psi(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    pids, popens = fleet_of_two(container, sleeper)
    set_limit(container, "", current_mib=1600, max_mib=2000, swap_max="max")  # 20 % left
    stall(container.cg, 0.0)
    kill = one_kill(
        container,
        sleeper,
        lambda: stall(container.cg, 75.0),
        lambda: stall(container.cg, 0.0),
        QUICK_PSI,
        unit_agent=lambda unit: None,
    )
    assert (kill.agent, kill.pid, kill.trigger, kill.limit) == ("a", pids["tool"], "psi", "/")
    assert kill.limit_psi_full_avg10 == 75.0
    assert alive(popens["a"], popens["b"], popens["helper"])


def test_the_guard_polls_fast_while_a_limit_stalls() -> None:
    config = GuardConfig()
    assert next_interval(limited(0, psi=0), None, config) > config.min_interval
    assert next_interval(limited(0, psi=35), None, config) == config.min_interval
