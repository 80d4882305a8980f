"""Tests for agentscope_systemd._monitor._escape over fake /proc and cgroup trees."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from agentscope_systemd import BusError
from agentscope_systemd._events import Escaped, Event
from agentscope_systemd._fleet._fleet import AsyncFleet
from agentscope_systemd._monitor import _monitor
from agentscope_systemd._monitor._escape import (
    MAX_CGROUP,
    Escapee,
    Mover,
    clean,
    find_escapes,
    read_children,
    unit_of_cgroup,
    write_procs,
)
from agentscope_systemd._monitor._monitor import Monitor
from agentscope_systemd._monitor._report import build_report
from tests.fakefs import (
    holding_kernel,
    make_cgroup,
    make_cgroup_root,
    make_meminfo,
    make_proc,
    remove,
    set_children,
)
from tests.fakesystemd import FakeSystemd, end_children

SLICE = (
    "user.slice/user-1000.slice/user@1000.service/app.slice/app-agentscope.slice/"
    "app-agentscope-agents.slice"
)
SCOPE = "agentscope-f-a-000001.scope"
OTHER = "agentscope-f-b-000002.scope"
SCOPE_CG = f"/{SLICE}/{SCOPE}"
RUN_SCOPE = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r0123abcd.scope"


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    cgroup_root = make_cgroup_root(tmp_path / "cgroup")
    slice_path = make_cgroup(cgroup_root, SLICE)
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    return cgroup_root, slice_path, proc_root


def agent_with_child(proc: Path, child_cgroup: str, *, comm: str = "sleep") -> None:
    """Agent 100 (sh) in SCOPE with child 101 living in ``child_cgroup``."""
    make_proc(proc, 100, comm="sh", cgroup=SCOPE_CG, start_time=500)
    make_proc(proc, 101, comm=comm, cgroup=child_cgroup, ppid=100, start_time=600)
    set_children(proc, 100, [101])


def test_systemd_run_scope_child_is_an_escapee(roots: tuple[Path, Path, Path]) -> None:
    cgroup_root, slice_path, proc = roots
    agent_with_child(proc, RUN_SCOPE)
    found = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    assert found == (
        Escapee(
            scope=SCOPE,
            pid=101,
            start_time=600,
            ppid=100,
            comm="sleep",
            cgroup=RUN_SCOPE,
            to_unit="run-r0123abcd.scope",
            rss=100 * 4096,
        ),
    )


def test_children_in_the_scope_or_another_agents_are_not_escapes(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    make_proc(proc, 100, comm="sh", cgroup=SCOPE_CG)
    make_proc(proc, 101, cgroup=SCOPE_CG, ppid=100)  # its own child, listed in the scope
    make_proc(proc, 102, cgroup=SCOPE_CG, ppid=100)  # forked in after cgroup.procs was read
    make_proc(proc, 103, cgroup=f"/{SLICE}/{OTHER}", ppid=100)  # a nested agentscope exec
    make_proc(proc, 104, cgroup=RUN_SCOPE, ppid=103)  # the nested agent's escape, not ours
    set_children(proc, 100, [101, 102, 103])
    set_children(proc, 103, [104])
    found = find_escapes(slice_path, {SCOPE: [100, 101]}, cgroup_root=cgroup_root, proc_root=proc)
    assert found == ()


def test_grandchild_of_an_escapee_and_a_thread_child_are_found(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    tmux = "/user.slice/user-1000.slice/user@1000.service/tmux-spawn-1b2c.scope"
    agent_with_child(proc, tmux, comm="bash")
    make_proc(proc, 102, comm="node", cgroup=tmux, ppid=101)
    set_children(proc, 101, [102])
    # Forked by a second thread of the agent: listed in that thread's file only.
    make_proc(proc, 103, comm="python3", cgroup=RUN_SCOPE, ppid=100)
    set_children(proc, 100, [103], tid=150)
    found = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    assert [(e.pid, e.comm, e.to_unit) for e in found] == [
        (101, "bash", "tmux-spawn-1b2c.scope"),
        (102, "node", "tmux-spawn-1b2c.scope"),
        (103, "python3", "run-r0123abcd.scope"),
    ]


def test_a_reparented_escapee_is_followed_by_pid_and_start_time(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    agent_with_child(proc, RUN_SCOPE)
    first = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    # The agent's shell exits; its escapee is reparented to init.
    remove(proc / "100")
    make_proc(proc, 101, comm="sleep", cgroup=RUN_SCOPE, ppid=1, start_time=600)
    again = find_escapes(slice_path, {}, follow=first, cgroup_root=cgroup_root, proc_root=proc)
    assert [(e.scope, e.pid, e.ppid) for e in again] == [(SCOPE, 101, 1)]
    # Its pid reused by another process: not the escapee any more.
    make_proc(proc, 101, comm="sleep", cgroup=RUN_SCOPE, ppid=1, start_time=9999)
    reused = find_escapes(slice_path, {}, follow=first, cgroup_root=cgroup_root, proc_root=proc)
    assert reused == ()


def test_a_followed_escapee_moved_back_is_not_counted(roots: tuple[Path, Path, Path]) -> None:
    cgroup_root, slice_path, proc = roots
    agent_with_child(proc, RUN_SCOPE)
    first = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    make_proc(proc, 101, comm="sleep", cgroup=SCOPE_CG, ppid=100, start_time=600)
    again = find_escapes(
        slice_path, {SCOPE: [100, 101]}, follow=first, cgroup_root=cgroup_root, proc_root=proc
    )
    assert again == ()


def test_vanished_processes_are_left_out(roots: tuple[Path, Path, Path]) -> None:
    cgroup_root, slice_path, proc = roots
    agent_with_child(proc, RUN_SCOPE)
    make_proc(proc, 102, cgroup=RUN_SCOPE, ppid=100)
    set_children(proc, 100, [101, 102, 103])  # 103 exited before its cgroup was read
    remove(proc / "102" / "stat")  # 102 exits between its cgroup and its stat
    found = find_escapes(
        slice_path, {SCOPE: [100, 99]}, cgroup_root=cgroup_root, proc_root=proc
    )  # 99 left the scope
    assert [e.pid for e in found] == [101]
    assert read_children(99, proc) == []


def test_untrusted_comm_and_cgroup_are_cleaned_and_bounded(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    long_path = "/evil.slice/" + "x" * 2000 + "/\x1b[31mred.scope"
    agent_with_child(proc, long_path, comm="a\x1b[2Jb[red]")
    (found,) = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    assert found.comm == "a?[2Jb[red]"[:15]
    assert len(found.cgroup) == MAX_CGROUP
    assert found.cgroup.isprintable()
    assert found.to_unit is None  # an escape character is no unit name


def test_the_walk_is_bounded(roots: tuple[Path, Path, Path]) -> None:
    cgroup_root, slice_path, proc = roots
    # A chain of 50 escapees, each the child of the one before.
    make_proc(proc, 100, comm="sh", cgroup=SCOPE_CG)
    for pid in range(101, 151):
        make_proc(proc, pid, cgroup=RUN_SCOPE, ppid=pid - 1)
        set_children(proc, pid - 1, [pid])
    found = find_escapes(
        slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc, max_processes=10
    )
    assert len(found) == 10


def test_unit_of_cgroup() -> None:
    assert unit_of_cgroup("/user.slice/user-1000.slice/session-3.scope") == "session-3.scope"
    assert unit_of_cgroup("/system.slice/foo.service/sub") == "foo.service"
    assert unit_of_cgroup("/system.slice/run-u7.scope") == "run-u7.scope"
    assert unit_of_cgroup("/a\\x2db.slice/x y.scope") is None
    assert unit_of_cgroup("/") is None
    assert clean("ok\ttab", 4) == "ok?t"


# ---------------------------------------------------------------------------
# The monitor: each escapee reported once, moved back with reclaim_escaped


@pytest.fixture
def audit_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit at every sample, and read the tree atomically with fakefs's changes."""
    monkeypatch.setattr(_monitor, "ESCAPE_AUDIT_EVERY", 0.0)
    monkeypatch.setattr(_monitor, "_collect", holding_kernel(_monitor._collect))


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def escaped(got: list[Event]) -> list[Escaped]:
    return [e for e in got if isinstance(e, Escaped)]


@pytest.mark.usefixtures("audit_often")
async def test_monitor_reports_each_escapee_once(roots: tuple[Path, Path, Path]) -> None:
    cgroup_root, slice_path, proc = roots
    make_cgroup(slice_path, SCOPE, procs=[100])
    agent_with_child(proc, RUN_SCOPE)
    # Another fleet's agent (unit_agent says None) with an escapee: its monitor's business.
    make_cgroup(slice_path, OTHER, procs=[200])
    make_proc(proc, 200, comm="sh", cgroup=f"/{SLICE}/{OTHER}")
    make_proc(proc, 201, comm="sleep", cgroup=RUN_SCOPE, ppid=200)
    set_children(proc, 200, [201])
    got: list[Event] = []
    mon = Monitor(
        slice_path=slice_path,
        unit_agent=lambda unit: "a" if unit == SCOPE else None,
        interval=0.02,
        cgroup_root=cgroup_root,
        proc_root=proc,
        kmsg=None,
        on_event=got.append,
    )
    async with mon:
        # Present when the monitor starts: reported with the baseline.
        assert [(e.agent, e.unit, e.pid, e.comm, e.to_unit) for e in escaped(got)] == [
            ("a", SCOPE, 101, "sleep", "run-r0123abcd.scope")
        ]
        assert escaped(got)[0].reclaimed is None  # not asked to move it back
        samples = mon.samples
        await wait_for(lambda: mon.samples >= samples + 5)
        assert len(escaped(got)) == 1
        # It exits; its pid comes back as another process that escapes: a new escapee.
        remove(proc / "101")
        await wait_for(lambda: mon.samples >= samples + 8)
        make_proc(proc, 101, comm="tmux", cgroup=RUN_SCOPE, ppid=100, start_time=700)
        await wait_for(lambda: len(escaped(got)) == 2)
        assert (escaped(got)[1].pid, escaped(got)[1].comm) == (101, "tmux")
        samples = mon.samples
        await wait_for(lambda: mon.samples >= samples + 5)
    assert len(escaped(got)) == 2


@pytest.fixture
async def fake_fleet(tmp_path: Path) -> AsyncIterator[tuple[AsyncFleet, FakeSystemd, Path]]:
    bus = FakeSystemd(tmp_path / "cgroup")
    proc = tmp_path / "proc"
    proc.mkdir()
    bus.proc_root = proc
    fleet = AsyncFleet(
        "f",
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _bus=bus,
    )
    async with fleet:
        yield fleet, bus, proc
    # Agents outlive a closed fleet by design: kill and reap what the test left.
    end_children()
    bus.close()


async def escape_from_agent(
    fleet: AsyncFleet, bus: FakeSystemd, proc: Path
) -> tuple[str, subprocess.Popen[bytes]]:
    """A real agent; a real ``sleep`` shown in the fake /proc as its child in another scope."""
    agent = await fleet.launch("a", ["sleep", "60"], stdout=subprocess.DEVNULL)
    scope_cg = "/" + bus.units[agent.unit].cgroup.relative_to(bus.cgroup_root).as_posix()
    escapee = subprocess.Popen(["sleep", "60"])
    make_proc(proc, agent.pid, comm="sleep", cgroup=scope_cg)
    make_proc(proc, escapee.pid, comm="sleep", cgroup=RUN_SCOPE, ppid=agent.pid)
    set_children(proc, agent.pid, [escapee.pid])
    return agent.unit, escapee


@pytest.mark.usefixtures("audit_often")
@pytest.mark.parametrize("refused", [False, True])
async def test_reclaim_moves_an_escapee_back_or_says_why_not(
    fake_fleet: tuple[AsyncFleet, FakeSystemd, Path], refused: bool
) -> None:
    fleet, bus, proc = fake_fleet
    unit, escapee = await escape_from_agent(fleet, bus, proc)
    if refused:
        bus.attach_refusal = (
            "org.freedesktop.DBus.Error.AccessDenied",
            f"Process {escapee.pid} not owned by client's UID. Refusing.",
        )
    got: list[Event] = []
    try:
        mon = fleet.monitor(
            interval=0.02,
            reclaim_escaped=True,
            cgroup_root=bus.cgroup_root,
            proc_root=proc,
            kmsg=None,
            psi_triggers=False,
            on_event=got.append,
        )
        async with mon:
            await wait_for(lambda: bool(escaped(got)))
            samples = mon.samples
            await wait_for(lambda: mon.samples >= samples + 5)
        (event,) = escaped(got)
        assert (event.agent, event.unit, event.pid) == ("a", unit, escapee.pid)
        attaches = [c.body for c in bus.calls if c.member == "AttachProcessesToUnit"]
        assert attaches == [[unit, "", [escapee.pid]]]
        if refused:
            assert event.reclaimed is False
            assert event.reclaim_error is not None
            assert "not owned by client's UID" in event.reclaim_error
        else:
            assert event.reclaimed is True
            assert event.reclaim_error is None
            assert escapee.pid in bus.scope_pids(unit)
        # The fleet recorded it, with where it went and whether it came back.
        (record,) = await fleet.events(kind="escaped")
        assert record.agent == "a"
        assert record.detail["to_unit"] == "run-r0123abcd.scope"
        assert record.detail["reclaimed"] is (not refused)
    finally:
        escapee.kill()
        escapee.wait()


async def test_reclaim_accepted_but_not_moved_is_not_called_a_success(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    agent_with_child(proc, RUN_SCOPE)
    (e,) = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    moved: list[tuple[str, list[int]]] = []

    async def attach(unit: str, pids: Sequence[int]) -> None:
        moved.append((unit, list(pids)))  # says yes, moves nothing

    outcome = await Mover(attach, slice_path, cgroup_root=cgroup_root, proc_root=proc).reclaim([e])
    assert moved == [(SCOPE, [101])]
    assert outcome[101] is not None
    assert RUN_SCOPE in outcome[101]


NOT_DELEGATED = BusError(
    "AttachProcessesToUnit",
    "org.freedesktop.DBus.Error.InvalidArgs",
    "Process migration not available on non-delegated units.",
)


@pytest.mark.parametrize("allowed", [True, False])
async def test_a_non_delegated_scope_takes_its_escapee_back_through_cgroup_procs(
    roots: tuple[Path, Path, Path], allowed: bool
) -> None:
    cgroup_root, slice_path, proc = roots
    make_cgroup(slice_path, SCOPE, procs=[100])
    agent_with_child(proc, RUN_SCOPE)
    (e,) = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)

    async def attach(unit: str, pids: Sequence[int]) -> None:
        raise NOT_DELEGATED  # what systemd 257 answers for every agent scope

    written: list[tuple[str, int]] = []

    def write(base: Path, scope: str, pid: int) -> None:
        # What the kernel does with the write: the process is in the scope now.
        assert base == slice_path
        written.append((scope, pid))
        if not allowed:
            raise PermissionError(13, "Permission denied")
        make_proc(proc, pid, comm="sleep", cgroup=SCOPE_CG, ppid=100, start_time=600)

    outcome = await Mover(
        attach, slice_path, cgroup_root=cgroup_root, proc_root=proc, write=write
    ).reclaim([e])
    assert written == [(SCOPE, 101)]
    if allowed:
        assert outcome == {101: None}
    else:
        assert outcome[101] is not None
        assert "Permission denied" in outcome[101]


def test_write_procs_writes_the_pid_into_the_scope_only(roots: tuple[Path, Path, Path]) -> None:
    _cgroup_root, slice_path, _proc = roots
    scope = make_cgroup(slice_path, SCOPE, procs=[100])
    write_procs(slice_path, SCOPE, 101)
    assert (scope / "cgroup.procs").read_text() == "101\n"  # the kernel would append it
    for bad in ("../../x.scope", "a/b.scope", "x.service", "x\n.scope"):
        with pytest.raises(ValueError, match="not a scope unit's name"):
            write_procs(slice_path, bad, 101)


@pytest.mark.usefixtures("audit_often")
async def test_report_counts_escapees_under_their_agent(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    make_cgroup(slice_path, SCOPE, procs=[100], current=1 << 20)
    make_proc(proc, 100, comm="sh", cgroup=SCOPE_CG, rss_pages=10, start_time=500)
    make_proc(proc, 101, comm="node", cgroup=RUN_SCOPE, ppid=100, rss_pages=9000, start_time=600)
    set_children(proc, 100, [101])
    make_meminfo(proc)
    report = await build_report(
        slice_path,
        lambda unit: "a" if unit == SCOPE else None,
        top=2,
        cgroup_root=cgroup_root,
        proc_root=proc,
    )
    (agent,) = report.agents
    assert (agent.agent, agent.processes, agent.escaped, agent.escaped_rss) == (
        "a",
        1,
        1,
        9000 * 4096,
    )
    biggest = report.top[0]
    assert (biggest.process.pid, biggest.process.agent, biggest.escaped) == (101, "a", True)
    assert report.top[1].escaped is False
    assert report.to_dict()["escaped"][0]["pid"] == 101


# -- identity checked at every act (#31 item 3) -------------------------------------------


def test_a_child_listed_but_not_its_parents_now_is_no_escapee(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    make_proc(proc, 100, comm="sh", cgroup=SCOPE_CG, start_time=500)
    # 101 ended after the children file was read; its pid is now root's sshd's.
    make_proc(proc, 101, comm="sshd", cgroup="/system.slice/ssh.service", ppid=1, start_time=9)
    set_children(proc, 100, [101])
    assert find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc) == ()


@pytest.mark.parametrize("change", ["reused", "reparented"])
async def test_reclaim_moves_only_the_same_descendant(
    roots: tuple[Path, Path, Path], change: str
) -> None:
    cgroup_root, slice_path, proc = roots
    make_cgroup(slice_path, SCOPE, procs=[100])
    agent_with_child(proc, RUN_SCOPE)
    (e,) = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    if change == "reused":  # it ended; its pid went to another process
        make_proc(proc, 101, comm="sshd", cgroup="/system.slice/ssh.service", ppid=1, start_time=7)
    else:  # its agent ended: reparented to init, no longer the agent's
        make_proc(proc, 101, comm="sleep", cgroup=RUN_SCOPE, ppid=1, start_time=600)
    asked: list[tuple[str, list[int]]] = []
    written: list[tuple[str, int]] = []

    async def attach(unit: str, pids: Sequence[int]) -> None:
        asked.append((unit, list(pids)))
        raise NOT_DELEGATED

    def write(base: Path, scope: str, pid: int) -> None:
        written.append((scope, pid))

    outcome = await Mover(
        attach, slice_path, cgroup_root=cgroup_root, proc_root=proc, write=write
    ).reclaim([e])
    assert (asked, written) == ([], [])  # neither systemd nor cgroup.procs was asked
    assert outcome[101] is not None
    assert ("exited" if change == "reused" else "no longer a descendant") in outcome[101]


async def test_reclaim_checks_again_right_before_the_write(
    roots: tuple[Path, Path, Path],
) -> None:
    cgroup_root, slice_path, proc = roots
    make_cgroup(slice_path, SCOPE, procs=[100])
    agent_with_child(proc, RUN_SCOPE)
    (e,) = find_escapes(slice_path, {SCOPE: [100]}, cgroup_root=cgroup_root, proc_root=proc)
    written: list[int] = []

    async def attach(unit: str, pids: Sequence[int]) -> None:
        # The pid is reused while systemd answers.
        make_proc(proc, 101, comm="sshd", cgroup="/system.slice/ssh.service", ppid=1, start_time=7)
        raise NOT_DELEGATED

    outcome = await Mover(
        attach,
        slice_path,
        cgroup_root=cgroup_root,
        proc_root=proc,
        write=lambda base, scope, pid: written.append(pid),
    ).reclaim([e])
    assert written == []
    assert "exited" in (outcome[101] or "")
