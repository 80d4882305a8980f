# ruff: noqa: F811
"""The guard in process and cgroup modes, under the container's own limit (issue #27 item 3).

Fake cgroup and /proc trees (tests/fakefs.py), real victim processes. In
process mode the agents are process trees recorded in the fleet's mirror
(:mod:`agentscope_systemd._managers._procscopes`), all in the manager's own cgroup: in a
container that cgroup is the root of its cgroup namespace, whose
``memory.max`` the kubelet pairs with ``memory.oom.group`` 1. The guard
kills the runaway tool call before that limit, names its agent, and never
touches the manager, a sibling agent or a process that is no agent's.
"""

# The fixtures (kernel, sleeper, whole_reads) are test_guard's and test_guard_limit's.

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentscope_systemd import GuardKill
from agentscope_systemd._guard._guardlimit import LimitWatch
from agentscope_systemd._guard._guardpolicy import GuardHeld
from agentscope_systemd._kernel._proctrees import MEMBERS, SCOPE_META, ProcessTrees, is_mirror
from agentscope_systemd._managers._procscopes import mirror_root
from agentscope_systemd._names import describe
from tests.fakefs import make_cgroup, make_cgroup_root, make_proc, write
from tests.test_guard import (  # noqa: F401 (fixtures)
    FAST,
    MIB_PAGES,
    WAIT,
    Tree,
    kernel,
    sleeper,
    start_guard,
    wait_until,
)
from tests.test_guard_limit import MIB, set_limit, whole_reads  # noqa: F401 (fixture)

AGENTS = "app-agentscope-agents.slice"


def unit_of(agent: str) -> str:
    return f"agentscope-f-{agent}-a1b2c3.scope"


def proc(tree: Tree, pid: int, comm: str, mib: int, start: int, ppid: int, cgroup: str) -> None:
    make_proc(
        tree.proc,
        pid,
        comm=comm,
        cmdline=(comm, "--work"),
        rss_pages=mib * MIB_PAGES,
        cgroup=cgroup,
        start_time=start,
        ppid=ppid,
        oom_score_adj=800,
    )


def record(tree: Tree, agent: str, members: dict[int, int]) -> Path:
    """The mirror's record of ``agent`` as the manager last listed it (pid -> start time)."""
    d = tree.slice / unit_of(agent)
    d.mkdir(parents=True, exist_ok=True)
    write(d / SCOPE_META, json.dumps({"description": describe("f", agent)}))
    write(d / MEMBERS, "".join(f"{p} {s}\n" for p, s in members.items()))
    write(d / "cgroup.procs", "".join(f"{p}\n" for p in members))
    return d


@pytest.fixture
def container(tmp_path: Path) -> Tree:
    """A container in process mode: its cgroup namespace's root, /proc, and the fleet's mirror.

    The manager (this process, 300 MiB) is in the container's own cgroup
    (``/``), as every process there is.
    """
    cg = make_cgroup_root(tmp_path / "cg")
    mirror = mirror_root(tmp_path / "run") / AGENTS
    mirror.mkdir(parents=True)
    tree = Tree(cg, tmp_path / "proc", mirror)
    tree.host(50, 50)  # the host has memory to spare: only the container's limit is near
    proc(tree, os.getpid(), "python3", 300, 50, 1, "/")
    return tree


def fleet_of_two(
    tree: Tree, sleeper: subprocess.Popen[bytes], cgroup: str = "/"
) -> tuple[dict[str, int], dict[str, subprocess.Popen[bytes]]]:
    """Agent ``a`` (a shell and a tool call spawned since its last listing), agent ``b``,
    and a helper of the harness that is no agent's, larger than any of them; all in the
    manager's ``cgroup``."""
    manager = os.getpid()
    popens = {
        "a": sleeper.start_another(),  # type: ignore[attr-defined]
        "tool": sleeper,
        "b": sleeper.start_another(),  # type: ignore[attr-defined]
        "helper": sleeper.start_another(),  # type: ignore[attr-defined]
    }
    pids = {k: p.pid for k, p in popens.items()}
    proc(tree, pids["a"], "claude", 200, 100, manager, cgroup)
    proc(tree, pids["tool"], "pytest", 900, 200, pids["a"], cgroup)
    proc(tree, pids["b"], "claude", 250, 110, manager, cgroup)
    proc(tree, pids["helper"], "indexer", 1000, 60, manager, cgroup)
    # The mirror knows a's shell only (the tool call came after the last
    # listing), and a member of a that exited since (no /proc entry left).
    record(tree, "a", {pids["a"]: 100, 999_001: 90})
    record(tree, "b", {pids["b"]: 110})
    # A process that exits while the guard walks /proc: listed, its files gone.
    (tree.proc / "999002").mkdir()
    return pids, popens


def harness_scope(tree: Tree) -> str:
    """A systemd host: the manager in a ``systemd-run --scope`` of its own (returned)."""
    scope = "system.slice/run-u7.scope"
    make_cgroup(tree.cg, "system.slice")
    make_cgroup(tree.cg, scope)
    proc(tree, os.getpid(), "python3", 300, 50, 1, "/" + scope)
    return scope


def one_kill(tree: Tree, squeeze: object, relief: object, **kw: object) -> GuardKill:
    got: list[GuardKill] = []

    def on_kill(kill: GuardKill) -> None:
        got.append(kill)
        relief()  # type: ignore[operator]

    _, stop = start_guard(tree, FAST, on_kill=on_kill, **kw)
    try:
        time.sleep(0.5)
        assert got == []
        squeeze()  # type: ignore[operator]
        wait_until(lambda: len(got) == 1)
        time.sleep(0.3)  # one squeeze, one kill
    finally:
        stop()
    (kill,) = got
    return kill


def alive(*procs: subprocess.Popen[bytes]) -> bool:
    return all(p.poll() is None for p in procs)


def test_a_mirror_is_told_from_a_cgroup_and_its_trees_include_what_spawned_since(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    pids, _ = fleet_of_two(container, sleeper)
    assert is_mirror(container.slice, container.cg)
    assert not is_mirror(container.cg / AGENTS, container.cg)
    trees = ProcessTrees(container.proc)
    # The tool call is a's, though the last listing did not know it; the
    # vanished member and the process that exited mid-walk are no one's.
    assert trees.pids(str(container.slice / unit_of("a"))) == sorted([pids["a"], pids["tool"]])
    assert trees.pids(str(container.slice / unit_of("b"))) == [pids["b"]]
    # A reused pid is no member: a's shell recorded with another start time.
    record(container, "b", {pids["b"]: 111})
    assert ProcessTrees(container.proc).pids(str(container.slice / unit_of("b"))) == []


def test_in_process_mode_the_containers_own_limit_is_the_agents(container: Tree) -> None:
    set_limit(container, "", current_mib=1200, max_mib=2000)
    watch = LimitWatch(container.cg, container.slice, container.proc, notify=False, shared=True)
    watch.refresh(0.0, force=True)
    assert [c.path for c in watch.ceilings] == [str(container.cg)]
    assert watch.manager_only == ()  # charged to the agents too: a kill of theirs relieves it


def test_process_mode_kills_the_runaway_tool_call_before_the_containers_limit(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    pids, popens = fleet_of_two(container, sleeper)
    set_limit(container, "", current_mib=1200, max_mib=2000)  # 40 % left: far from it
    kill = one_kill(
        container,
        lambda: set_limit(container, "", current_mib=1960, max_mib=2000),  # 2 % left
        lambda: set_limit(container, "", current_mib=1060, max_mib=2000),
        unit_agent=lambda unit: None,  # no sample has named a scope of the mirror
    )
    assert sleeper.wait(WAIT) == -signal.SIGKILL
    # Named (from the fleet's record of the scope): the agent, the process,
    # its size; the container's limit.
    assert (kill.agent, kill.unit, kill.pid, kill.comm) == (
        "a",
        unit_of("a"),
        pids["tool"],
        "pytest",
    )
    assert kill.rss == 900 * MIB
    assert (kill.limit, kill.limit_bytes) == ("/", 2000 * MIB)
    assert kill.limit_available_percent is not None
    assert kill.limit_available_percent < 5
    assert kill.mem_available_percent == pytest.approx(50, abs=0.01)  # the host was fine
    # The agent's shell, the sibling, the harness's larger helper and the manager live.
    assert alive(popens["a"], popens["b"], popens["helper"])


def test_process_mode_under_a_systemd_scopes_memory_max_acts_on_the_nearer_limit(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # A harness run in `systemd-run --scope -p MemoryMax=...` with manager
    # "process": its agents share its scope, whose limit is theirs; the
    # host's root has none.
    scope = harness_scope(container)
    pids, popens = fleet_of_two(container, sleeper, "/" + scope)
    set_limit(container, scope, current_mib=1200, max_mib=2000)
    kill = one_kill(
        container,
        lambda: set_limit(container, scope, current_mib=1960, max_mib=2000),
        lambda: set_limit(container, scope, current_mib=1060, max_mib=2000),
    )
    assert sleeper.wait(WAIT) == -signal.SIGKILL
    assert (kill.agent, kill.pid, kill.limit) == ("a", pids["tool"], "/" + scope)
    assert alive(popens["a"], popens["b"], popens["helper"])


def test_process_mode_on_a_systemd_host_a_hog_outside_the_harness_costs_no_agent(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # The host is short because of a hog in another cgroup: the agents'
    # cgroup (the harness's scope, shared with the manager) did not grow.
    scope = harness_scope(container)
    write(container.cg / scope / "memory.current", f"{1200 * MIB}\n")
    users = make_cgroup(container.cg, "user.slice", current=100 * MIB)
    hog = make_cgroup(container.cg, "user.slice/hog.scope", current=100 * MIB)
    _, popens = fleet_of_two(container, sleeper, "/" + scope)
    held: list[GuardHeld] = []
    got, stop = start_guard(container, FAST, on_held=held.append)
    try:
        time.sleep(1.2)  # a first sample of the charges
        for cgroup in (users, hog):  # charged to the hog's ancestors too, as the kernel does
            write(cgroup / "memory.current", f"{5000 * MIB}\n")
        container.host(5, 1)
        wait_until(lambda: len(held) == 1)
        time.sleep(0.3)
    finally:
        stop()
    assert got == []
    assert alive(*popens.values())
    (event,) = held
    assert event.culprit == "/user.slice/hog.scope"


def test_process_mode_with_no_agent_process_worth_a_kill_kills_nothing(
    container: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # The container is full of what is no agent's (the harness's helper):
    # the guard says so and leaves it to the kernel; it never kills outside
    # the agents' trees.
    proc(container, sleeper.pid, "indexer", 1900, 60, os.getpid(), "/")
    agent = sleeper.start_another()  # type: ignore[attr-defined]
    proc(container, agent.pid, "claude", 10, 100, os.getpid(), "/")
    record(container, "a", {agent.pid: 100})
    set_limit(container, "", current_mib=1980, max_mib=2000)
    got, stop = start_guard(container, FAST)
    try:
        time.sleep(0.6)
    finally:
        stop()
    assert got == []
    assert alive(sleeper, agent)


def test_cgroup_mode_kills_the_runaway_call_whole_under_the_containers_limit(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # A container with writable cgroups: the manager moved into a leaf, the
    # agents' cgroups beside it, the container's limit on the root.
    cg = make_cgroup_root(tmp_path / "cg")
    make_cgroup(cg, "agentscope-manager", current=300 * MIB)
    slice_dir = make_cgroup(cg, AGENTS, current=1600 * MIB)
    tree = Tree(cg, tmp_path / "proc", slice_dir)
    tree.host(50, 50)
    unit = unit_of("a")
    others = [sleeper.start_another() for _ in range(3)]  # type: ignore[attr-defined]
    agent, make, sibling = (p.pid for p in others)
    cc1 = sleeper.pid
    where = {agent: "agent", make: "call-make-1", cc1: "call-make-1"}
    make_cgroup(cg, f"{AGENTS}/{unit}", current=1300 * MIB)
    for leaf in ("agent", "call-make-1"):
        pids = [p for p, w in where.items() if w == leaf]
        make_cgroup(cg, f"{AGENTS}/{unit}/{leaf}", procs=pids)
    make_cgroup(cg, f"{AGENTS}/{unit_of('b')}", current=300 * MIB, procs=[sibling])
    for pid, comm, mib, start in (
        (agent, "claude", 200, 100),
        (make, "make", 5, 101),
        (cc1, "cc1", 1000, 102),
    ):
        proc(tree, pid, comm, mib, start, 1, f"/{AGENTS}/{unit}/{where[pid]}")
    proc(tree, sibling, "claude", 250, 110, 1, f"/{AGENTS}/{unit_of('b')}")
    proc(tree, os.getpid(), "python3", 300, 50, 1, "/agentscope-manager")
    set_limit(tree, "", current_mib=1900, max_mib=3000)
    kill = one_kill(
        tree,
        lambda: set_limit(tree, "", current_mib=2960, max_mib=3000),
        lambda: set_limit(tree, "", current_mib=1900, max_mib=3000),
    )
    assert sleeper.wait(WAIT) == -signal.SIGKILL
    assert (kill.agent, kill.pid, kill.comm, kill.limit) == ("a", cc1, "cc1", "/")
    assert (kill.call, kill.processes) == ("call-make-1", 2)  # the make above it too
    assert others[1].wait(WAIT) == -signal.SIGKILL  # the rest of its call went with it
    assert alive(others[0], others[2])  # the agent's own process, the sibling
