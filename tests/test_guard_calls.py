"""The guard and tool calls (#26): a runaway in a call takes its whole call, never the
agent's own process nor another call; the kill names agent and call."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentscope_systemd._calls._calls import call_in, kill_tree
from agentscope_systemd._guard._guardevents import GuardKill
from agentscope_systemd._guard._guardkill import _kill
from tests.fakefs import make_proc
from tests.test_guard import (
    FAST,
    MIB_PAGES,
    SLICE,
    WAIT,
    Tree,
    kernel,
    start_guard,
    tree,
    wait_until,
)

__all__ = ["kernel", "tree"]  # fixtures, used by name


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def agent_with_calls(tree: Tree, sleepers: list[subprocess.Popen[bytes]]) -> str:
    """Agent ``a``: its own process in ``agent``, a ``make`` and its runaway ``cc1`` in
    ``call-make-1``, a ``pytest`` in ``call-test-1``."""
    agent, make, cc1, other = (p.pid for p in sleepers)
    unit = tree.scope(
        "a",
        {agent: ("claude", 200, 100), make: ("make", 5, 101), cc1: ("cc1", 900, 102)}
        | {other: ("pytest", 300, 103)},
        sub={"agent": [agent], "call-make-1": [make, cc1], "call-test-1": [other]},
    )
    where = {agent: "agent", make: "call-make-1", cc1: "call-make-1", other: "call-test-1"}
    for pid, (comm, mib, start) in {
        agent: ("claude", 200, 100),
        make: ("make", 5, 101),
        cc1: ("cc1", 900, 102),
        other: ("pytest", 300, 103),
    }.items():
        make_proc(
            tree.proc,
            pid,
            comm=comm,
            cmdline=(comm,),
            rss_pages=mib * MIB_PAGES,
            cgroup=f"/{SLICE}/{unit}/{where[pid]}",
            start_time=start,
            oom_score_adj=800,
        )
    return unit


def test_call_in_names_the_scopes_call_and_nothing_else() -> None:
    unit = "agentscope-f-a-a1b2c3.scope"
    base = f"/{SLICE}/{unit}"
    assert call_in(f"{base}/call-make-1", unit) == "call-make-1"
    assert call_in(f"{base}/call-make-1/sub", unit) == "call-make-1"
    assert call_in(f"{base}/agent", unit) is None
    assert call_in(f"{base}/claude-code-bash", unit) is None
    assert call_in(base, unit) is None


def test_the_guard_kills_a_runaway_call_whole_and_names_agent_and_call(
    tree: Tree, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """Before Linux 5.14 (no cgroup.kill in the fake tree): pid by pid, each re-checked."""
    agent, make, cc1, other = sleepers
    agent_with_calls(tree, sleepers)
    got: list[GuardKill] = []

    def on_kill(kill: GuardKill) -> None:
        got.append(kill)
        tree.host(40, 40)

    _, stop = start_guard(tree, FAST, on_kill=on_kill)
    try:
        tree.host(5, 1)
        assert cc1.wait(WAIT) == -signal.SIGKILL
        assert make.wait(WAIT) == -signal.SIGKILL  # the rest of its call went with it
        wait_until(lambda: len(got) == 1)
        time.sleep(0.2)
    finally:
        stop()
    assert agent.poll() is None  # the agent's own process lives
    assert other.poll() is None  # and its other call
    (kill,) = got
    assert (kill.agent, kill.pid, kill.comm) == ("a", cc1.pid, "cc1")
    assert (kill.call, kill.processes) == ("call-make-1", 2)
    assert kill.to_dict()["call"] == "call-make-1"


def test_a_victim_of_the_agent_itself_is_killed_alone(
    tree: Tree, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    agent, make, cc1, other = sleepers
    unit = agent_with_calls(tree, sleepers)
    killed = _kill(agent.pid, 100, tree.proc, (tree.slice.name, unit), tree.slice)
    assert killed is not None
    os.close(killed.pidfd)
    assert (killed.call, killed.processes) == (None, 1)
    assert agent.wait(WAIT) == -signal.SIGKILL
    assert [p.poll() for p in (make, cc1, other)] == [None, None, None]


def test_with_cgroup_kill_the_kernel_kills_the_call_at_once(
    tree: Tree, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    """Linux 5.14+: one write to the call's cgroup.kill (the kernel's kill, not faked here)."""
    unit = agent_with_calls(tree, sleepers)
    scope = tree.slice / unit
    for name in ("call-make-1", "call-test-1", "agent"):
        (scope / name / "cgroup.kill").write_text("")
    assert sorted(kill_tree(str(scope / "call-make-1"), str(tree.proc))) == sorted(
        [sleepers[1].pid, sleepers[2].pid]
    )
    assert (scope / "call-make-1" / "cgroup.kill").read_text() == "1"
    assert (scope / "call-test-1" / "cgroup.kill").read_text() == ""
    assert (scope / "agent" / "cgroup.kill").read_text() == ""
    assert [p.poll() for p in sleepers] == [None] * 4  # no pid-by-pid kill besides


def test_pid_by_pid_a_process_moved_out_of_the_call_is_spared(
    tree: Tree, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    _agent, make, cc1, _other = sleepers
    unit = agent_with_calls(tree, sleepers)
    # Listed in the call, but /proc says it is in the agent's leaf now (moved meanwhile).
    make_proc(tree.proc, make.pid, comm="make", cgroup=f"/{SLICE}/{unit}/agent", start_time=101)
    assert kill_tree(str(tree.slice / unit / "call-make-1"), str(tree.proc)) == [cc1.pid]
    assert cc1.wait(WAIT) == -signal.SIGKILL
    assert make.poll() is None
    assert kill_tree(str(tree.slice / unit / "call-gone-1"), str(tree.proc)) == []


def test_a_refused_memory_lock_says_the_limit_and_how_to_lift_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # An unprivileged monitor (the user manager's demo, a harness as a user):
    # mlockall is refused past RLIMIT_MEMLOCK, and the warning names the limit
    # and the two ways to lift it instead of leaving the user to guess.
    import resource

    from agentscope_systemd._guard import _guardkill
    from agentscope_systemd._guard._guardpolicy import GuardConfig

    monkeypatch.setattr(_guardkill, "_lock_memory", lambda: "Cannot allocate memory")
    monkeypatch.setattr(_guardkill, "_said", set())
    monkeypatch.setattr(resource, "getrlimit", lambda which: (8 << 20, 8 << 20))
    notes = _guardkill.prepare_process(GuardConfig(oom_score_adj=None), tmp_path)
    assert len(notes) == 1
    assert "mlockall: Cannot allocate memory" in notes[0]
    assert "RLIMIT_MEMLOCK is 8192 KiB" in notes[0]
    assert "ulimit -l" in notes[0]
    assert "LimitMEMLOCK=" in notes[0]
    assert "CAP_IPC_LOCK" in notes[0]
    assert notes[0] in caplog.text


def test_a_refused_memory_lock_under_no_limit_does_not_blame_the_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import resource

    from agentscope_systemd._guard import _guardkill
    from agentscope_systemd._guard._guardpolicy import GuardConfig

    monkeypatch.setattr(_guardkill, "_lock_memory", lambda: "Operation not permitted")
    monkeypatch.setattr(_guardkill, "_said", set())
    infinity = resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda which: (infinity, infinity))
    (note,) = _guardkill.prepare_process(GuardConfig(oom_score_adj=None), tmp_path)
    assert "RLIMIT_MEMLOCK is unlimited, so the kernel refused for another reason" in note
    assert "ulimit -l" not in note
