# ruff: noqa: F811
"""The guard under a memory limit above the agents (issue #27): fake cgroup trees, real victims.

A container's own cgroup (the root of its cgroup namespace), a slice's or a
service's ``MemoryMax``: the kernel's OOM killer acts there while the
host's MemAvailable is fine, and with ``memory.oom.group`` 1 it takes the
whole container. The guard acts on whichever is nearer to exhaustion, the
host or the limit, and says which.
"""

# The fixtures (tree, sleeper, kernel) are test_guard's, imported by name.

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentscope_systemd import GuardConfig, GuardKill
from agentscope_systemd._guard._guardlimit import LimitWatch
from agentscope_systemd._guard._guardpolicy import (
    LIMIT_MIN_INTERVAL,
    GuardHeld,
    HostReading,
    acted_on,
    next_interval,
)
from agentscope_systemd._kernel._cgroup import cgroup_chain, read_ceiling
from tests.fakefs import holding_kernel, make_cgroup, make_proc, remove, write
from tests.test_guard import (  # noqa: F401 (fixtures)
    FAST,
    SLICE,
    Tree,
    kernel,
    sleeper,
    start_guard,
    tree,
    wait_until,
)

MIB = 1 << 20
PARENT = "app.slice/app-agentscope.slice"


@pytest.fixture(autouse=True)
def whole_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits are read whole, as the kernel generates its files."""
    monkeypatch.setattr(LimitWatch, "apply", holding_kernel(LimitWatch.apply))


def set_limit(
    tree: Tree,
    rel: str,
    *,
    current_mib: int,
    max_mib: int | None = None,
    high_mib: int | None = None,
    file_mib: int = 0,
    shmem_mib: int = 0,
    swap_max: str = "0",
    swap_current_mib: int = 0,
) -> Path:
    """Give the cgroup ``rel`` a limit and a charge (``swap_max`` "0": no swap, as Kubernetes)."""
    path = tree.cg / rel if rel else tree.cg
    stat = {
        "anon": (current_mib - file_mib) * MIB,
        "file": file_mib * MIB,
        "kernel": 0,
        "shmem": shmem_mib * MIB,
        "slab_reclaimable": 0,
    }
    write(path / "memory.current", f"{current_mib * MIB}\n")
    write(path / "memory.stat", "".join(f"{k} {v}\n" for k, v in stat.items()))
    write(path / "memory.max", "max\n" if max_mib is None else f"{max_mib * MIB}\n")
    write(path / "memory.high", "max\n" if high_mib is None else f"{high_mib * MIB}\n")
    write(path / "memory.swap.max", f"{swap_max}\n")
    write(path / "memory.swap.current", f"{swap_current_mib * MIB}\n")
    return path


def host_reading(
    total_mib: int = 8000, swap_total_mib: int = 0, swap_free_mib: int = 0
) -> HostReading:
    return HostReading(
        ts=100.0,
        mem_total=total_mib * MIB,
        mem_available=total_mib * MIB // 2,
        swap_total=swap_total_mib * MIB,
        swap_free=swap_free_mib * MIB,
        psi_some_avg10=0.0,
        psi_full_avg10=0.0,
    )


def watch(tree: Tree) -> LimitWatch:
    return LimitWatch(tree.cg, tree.slice, tree.proc, notify=False)


def one_kill(
    tree: Tree,
    sleeper: subprocess.Popen[bytes],
    squeeze: Callable[[], None],
    relief: Callable[[], None],
    config: GuardConfig = FAST,
    **kw: object,
) -> GuardKill:
    """The guard's one kill of the tool call after ``squeeze`` (``relief``: its memory back).

    ``kw`` goes to :func:`start_guard` (``unit_agent``, say).
    """
    got: list[GuardKill] = []

    def on_kill(kill: GuardKill) -> None:
        got.append(kill)
        relief()

    _, stop = start_guard(tree, config, on_kill=on_kill, **kw)
    try:
        time.sleep(1.0)
        assert got == []
        assert sleeper.poll() is None
        squeeze()
        assert sleeper.wait(10) == -signal.SIGKILL
        wait_until(lambda: len(got) == 1)
        time.sleep(0.2)
    finally:
        stop()
    (kill,) = got
    return kill


def runaway(tree: Tree, sleeper: subprocess.Popen[bytes]) -> tuple[int, int]:
    """Agent ``a``: its shell (200 MiB) and a tool call (900 MiB), both real processes."""
    agent = sleeper.start_another()  # type: ignore[attr-defined]
    tree.scope("a", {agent.pid: ("claude", 200, 100), sleeper.pid: ("pytest", 900, 200)})
    return agent.pid, sleeper.pid


# -- reading the limits ---------------------------------------------------------


def test_the_chain_runs_from_the_slice_to_the_root_and_refuses_dot_dot(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    assert cgroup_chain(root, root / "a.slice" / "b.slice") == (
        f"{root}/a.slice/b.slice",
        f"{root}/a.slice",
        f"{root}",
    )
    # A /proc/PID/cgroup path; "/" in a container's namespace is its own cgroup.
    assert cgroup_chain(root, "/system.slice/h.service") == (
        f"{root}/system.slice/h.service",
        f"{root}/system.slice",
        f"{root}",
    )
    assert cgroup_chain(root, "/") == (f"{root}",)
    # Outside the namespace (the kernel prints "/.."): the root alone, never a path above it.
    assert cgroup_chain(root, "/../../x.scope") == (f"{root}",)


def test_no_limit_changes_nothing(tree: Tree) -> None:
    # Every level "max" (the fakefs default): the reading is the host's alone.
    reading = host_reading()
    limits = watch(tree)
    assert limits.apply(reading, GuardConfig()) is reading
    assert limits.ceilings == ()


def test_a_limit_is_read_with_page_cache_as_reclaimable_and_shmem_not(tree: Tree) -> None:
    config = GuardConfig()
    limits = watch(tree)
    # At the wall, but 400 MiB of it page cache: the kernel reclaims that first.
    set_limit(tree, PARENT, current_mib=1000, max_mib=1000, file_mib=400)
    got = limits.apply(host_reading(), config)
    assert got.limit_path == "/" + PARENT
    assert got.limit_bytes == 1000 * MIB
    assert got.limit_available_percent == pytest.approx(40.0)
    assert acted_on(got, config) == "host"  # not short: nothing to act on
    # The same cache in tmpfs or a memfd (shmem) is not reclaimable without swap.
    set_limit(tree, PARENT, current_mib=1000, max_mib=1000, file_mib=400, shmem_mib=400)
    limits.refresh(0.0, force=True)
    got = limits.apply(host_reading(), config)
    assert got.limit_available_percent == pytest.approx(0.0)
    assert acted_on(got, config) == "/" + PARENT


def test_nested_limits_the_tightest_is_named_and_memory_high_counts(tree: Tree) -> None:
    config = GuardConfig()
    set_limit(tree, "app.slice", current_mib=1150, max_mib=4000)  # 71 % free
    set_limit(tree, PARENT, current_mib=1150, max_mib=1200)  # 4 % free
    got = watch(tree).apply(host_reading(), config)
    assert (got.limit_path, got.limit_bytes) == ("/" + PARENT, 1200 * MIB)
    # A MemoryHigh below the max is where the cgroup stalls: it is the limit.
    set_limit(tree, "app.slice", current_mib=1150, max_mib=4000, high_mib=1160)
    limits = watch(tree)
    got = limits.apply(host_reading(), config)
    assert (got.limit_path, got.limit_bytes) == ("/app.slice", 1160 * MIB)
    assert {c.kind for c in limits.ceilings} == {"memory.high", "memory.max"}


def test_a_containers_own_cgroup_is_the_root_and_its_swap_counts(tree: Tree) -> None:
    # Inside a cgroup namespace the root directory is the container's cgroup,
    # with its memory.max (a host's real root has none).
    config = GuardConfig()
    set_limit(tree, "", current_mib=380, max_mib=400, swap_max="max")
    # The container may use the host's swap: 100 of 1000 MiB free is 10 %.
    got = watch(tree).apply(host_reading(swap_total_mib=1000, swap_free_mib=100), config)
    assert (got.limit_path, got.limit_bytes) == ("/", 400 * MIB)
    assert got.limit_swap_free_percent == pytest.approx(10.0)
    assert acted_on(got, config) == "/"
    # memory.swap.max 300M with 100 MiB used: 200 free of 300, the host has more.
    set_limit(tree, "", current_mib=380, max_mib=400, swap_max=str(300 * MIB), swap_current_mib=100)
    got = watch(tree).apply(host_reading(swap_total_mib=1000, swap_free_mib=900), config)
    assert got.limit_swap_free_percent == pytest.approx(200 / 3)
    assert acted_on(got, config) == "host"  # swap left: the limit is not yet exhausted


def test_vanished_malformed_and_unreadable_files_count_as_no_limit(tree: Tree) -> None:
    config = GuardConfig()
    set_limit(tree, "app.slice", current_mib=990, max_mib=1000)
    write(tree.cg / "app.slice" / "memory.max", "a lot\n")
    assert read_ceiling(str(tree.cg / "app.slice")) is not None  # the file is there ...
    limits = watch(tree)
    assert limits.apply(host_reading(), config).limit_path is None  # ... but sets nothing
    # A limit whose memory.current is not a number, or gone, is left out.
    set_limit(tree, "app.slice", current_mib=990, max_mib=1000)
    write(tree.cg / "app.slice" / "memory.current", "\x00\n")
    limits.refresh(0.0, force=True)
    assert limits.apply(host_reading(), config).limit_path is None
    # A malformed memory.stat: page cache unknown, the charge counts whole.
    set_limit(tree, "app.slice", current_mib=990, max_mib=1000, file_mib=500)
    write(tree.cg / "app.slice" / "memory.stat", "anon twelve\n")
    limits.refresh(0.0, force=True)
    assert limits.apply(host_reading(), config).limit_available_percent == pytest.approx(1.0)
    # The slice and the limited cgroup vanish between two readings.
    remove(tree.cg / "app.slice")
    assert limits.apply(host_reading(), config).limit_path is None
    limits.refresh(0.0, force=True)
    assert limits.apply(host_reading(), config).limit_path is None
    limits.close()


def test_the_poll_interval_follows_the_limits_headroom(tree: Tree) -> None:
    config = GuardConfig()  # min_interval 0.1 s
    far = host_reading()
    assert next_interval(far, None, config) > 0.5  # 4 GB free: not soon
    set_limit(tree, PARENT, current_mib=1100, max_mib=1200)  # 100 MiB to the wall
    near = watch(tree).apply(far, config)
    # Near a limit the guard looks faster than its min_interval (a cgroup's
    # OOM killer does not wait for minutes of thrashing).
    assert next_interval(near, None, config) == LIMIT_MIN_INTERVAL


# -- the guard acting on it -----------------------------------------------------


def test_a_limit_nearer_than_the_host_triggers_and_the_kill_names_it(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    agent, tool = runaway(tree, sleeper)
    set_limit(tree, PARENT, current_mib=800, max_mib=1200)  # far from it yet
    kill = one_kill(
        tree,
        sleeper,
        lambda: set_limit(tree, PARENT, current_mib=1150, max_mib=1200),  # the host keeps 50 %
        lambda: set_limit(tree, PARENT, current_mib=250, max_mib=1200),
    )
    assert (kill.agent, kill.pid, kill.comm, kill.trigger) == ("a", tool, "pytest", "memory")
    assert kill.limit == "/" + PARENT
    assert kill.limit_bytes == 1200 * MIB
    assert kill.limit_available_percent == pytest.approx(100 * 50 / 1200, abs=0.01)
    assert kill.mem_available_percent == pytest.approx(50, abs=0.01)  # the host was fine
    assert os.kill(agent, 0) is None  # the agent's shell lives on
    assert kill.to_dict()["limit"] == "/" + PARENT


def test_a_host_nearer_than_the_limit_triggers_as_today(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    _, tool = runaway(tree, sleeper)
    set_limit(tree, PARENT, current_mib=600, max_mib=4000)
    kill = one_kill(tree, sleeper, lambda: tree.host(5, 1), lambda: tree.host(40, 40))
    assert (kill.pid, kill.limit, kill.limit_bytes, kill.limit_available_percent) == (
        tool,
        "host",
        None,
        None,
    )


def test_no_limit_near_the_wall_kills_nothing(tree: Tree, sleeper: subprocess.Popen[bytes]) -> None:
    runaway(tree, sleeper)
    # The same charge with no limit at all ("max" everywhere): nothing to act on.
    set_limit(tree, PARENT, current_mib=1150)
    got, stop = start_guard(tree, FAST)
    try:
        time.sleep(0.5)
    finally:
        stop()
    assert got == []
    assert sleeper.poll() is None


def test_under_a_limit_the_manager_growing_beside_the_agents_costs_no_agent(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # The limit holds the agents and the manager's own cgroup beside them:
    # when the manager is what grew, no agent's tool call is to pay for it.
    runaway(tree, sleeper)
    manager = make_cgroup(tree.cg, PARENT + "/manager.service", current=100 * MIB)
    set_limit(tree, PARENT, current_mib=1300, max_mib=3000)
    write(tree.slice / "memory.current", f"{1100 * MIB}\n")
    held: list[GuardHeld] = []
    got, stop = start_guard(tree, FAST, on_held=held.append)
    try:
        time.sleep(1.2)  # a first sample of the charges under the limit
        write(manager / "memory.current", f"{1800 * MIB}\n")
        set_limit(tree, PARENT, current_mib=2950, max_mib=3000)
        wait_until(lambda: len(held) == 1)
        time.sleep(0.2)
    finally:
        stop()
    assert got == []
    assert sleeper.poll() is None
    (event,) = held
    assert event.limit == "/" + PARENT
    assert event.culprit == "/" + PARENT + "/manager.service"


def test_a_limit_over_the_manager_only_is_said_once(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    # A harness service with MemoryMax on a systemd host: its agents live in
    # their own slice, outside it; no kill of theirs relieves it.
    make_cgroup(tree.cg, "system.slice/harness.service", current=100 * MIB, max=300 * MIB)
    make_proc(tree.proc, os.getpid(), cgroup="/system.slice/harness.service")
    limits = LimitWatch(tree.cg, tree.slice, tree.proc, notify=False)
    assert limits.apply(host_reading(), GuardConfig()).limit_path is None
    assert [c.path for c in limits.manager_only] == [f"{tree.cg}/system.slice/harness.service"]
    _, stop = start_guard(tree, FAST)
    try:
        time.sleep(0.3)
    finally:
        stop()
    said = [r.getMessage() for r in caplog.records if "not charged to" in r.getMessage()]
    assert len(said) == 1
    assert "300 MiB" in said[0]
    assert "/system.slice/harness.service" in said[0]


def test_the_guard_wakes_when_a_limited_cgroup_reaches_its_limit(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # A slow poll (every 3 s): the kill comes from memory.events' inotify wake-up.
    runaway(tree, sleeper)
    set_limit(tree, PARENT, current_mib=600, max_mib=1200)
    slow = GuardConfig(min_interval=3.0, max_interval=3.0, lock_memory=False)
    start = [0.0]

    def at_the_wall() -> None:
        set_limit(tree, PARENT, current_mib=1190, max_mib=1200)
        start[0] = time.monotonic()
        write(tree.cg / PARENT / "memory.events", "low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\n")

    kill = one_kill(
        tree,
        sleeper,
        at_the_wall,
        lambda: set_limit(tree, PARENT, current_mib=250, max_mib=1200),
        slow,
    )
    took = time.monotonic() - start[0]
    assert kill.limit == "/" + PARENT
    assert took < 1.0, took  # the kill came well before the next 3 s poll


def test_the_monitor_line_names_the_limit_and_the_hosts_line_is_as_before() -> None:
    from agentscope_systemd._cli import _render

    kill = {"pid": 7, "comm": "python3", "rss": 200 << 20, "swap": 0, "trigger": "memory"}
    kill |= {"mem_available_percent": 61.0, "swap_free_percent": 0.0, "released": True}
    on_limit = _render._guard_kill_text(
        kill | {"limit": "/x.slice", "limit_bytes": 300 << 20, "limit_available_percent": 9.6}
    )
    assert "limit=/x.slice(300.0MiB) available=9.60%" in on_limit
    assert "limit=" not in _render._guard_kill_text(kill | {"limit": "host"})


def test_at_the_wall_with_little_cache_left_the_guard_acts_before_its_threshold(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # 13 % "available", all of it page cache, and the cgroup reaches its
    # memory.max: the kernel reclaims that cache now and kills next.
    runaway(tree, sleeper)
    set_limit(tree, PARENT, current_mib=1190, max_mib=1200, file_mib=150)
    config = GuardConfig()
    limits = watch(tree)
    assert not limits.apply(host_reading(), config).limit_at_wall  # the first near reading
    events = tree.cg / PARENT / "memory.events"

    def wall(n: int) -> None:
        write(events, f"low 0\nhigh 0\nmax {n}\noom 0\noom_kill 0\n")

    assert not limits.apply(host_reading(), config).limit_at_wall  # nothing since
    wall(1)
    hit = limits.apply(host_reading(), config)
    assert hit.limit_at_wall
    assert acted_on(hit, config) == "/" + PARENT
    assert not limits.apply(host_reading(), config).limit_at_wall  # once per rise
    # Far from the threshold (much cache), reaching the limit is ordinary: no trigger.
    set_limit(tree, PARENT, current_mib=1190, max_mib=1200, file_mib=600)
    wall(2)
    limits.apply(host_reading(), config)
    wall(3)
    assert not limits.apply(host_reading(), config).limit_at_wall
    # The guard itself: killed at the wall, the event with the figures it saw.
    set_limit(tree, PARENT, current_mib=1190, max_mib=1200, file_mib=150)
    kill = one_kill(
        tree,
        sleeper,
        lambda: wall(4),
        lambda: set_limit(tree, PARENT, current_mib=250, max_mib=1200),
    )
    assert kill.limit == "/" + PARENT
    assert kill.limit_available_percent == pytest.approx(100 * 160 / 1200, abs=0.01)
