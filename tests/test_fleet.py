"""Real AsyncFleets over a fake systemd manager (tests/fakesystemd.py).

The processes are real children of the test; their scopes are directories
of a fake cgroup tree. These test the fleet's own logic: launch, adopt,
stop escalation, reconcile, listing, the OOMPolicy fallback, slice limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_systemd import (
    AgentExists,
    AgentNotFound,
    AgentscopeError,
    BusError,
    InvalidConfig,
    LaunchError,
)
from agentscope_systemd._fleet._fleet import AsyncFleet
from agentscope_systemd._registry._registry import Registry
from tests.fakesystemd import FakeSystemd, end_children


@pytest.fixture(autouse=True)
def _reap_agents() -> Iterator[None]:
    """Agents outlive a closed fleet by design: kill and reap what a test left."""
    yield
    end_children()


# Ignores SIGTERM, so only the SIGKILL of the stop escalation ends it.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
]


def make_fleet(tmp_path: Path, bus: FakeSystemd, name: str = "t") -> AsyncFleet:
    return AsyncFleet(
        name,
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _bus=bus,
    )


@pytest.fixture
def bus(tmp_path: Path) -> FakeSystemd:
    return FakeSystemd(tmp_path / "cgroup")


@pytest.fixture
async def fleet(tmp_path: Path, bus: FakeSystemd) -> AsyncIterator[AsyncFleet]:
    async with make_fleet(tmp_path, bus) as f:
        yield f
    await stop_everything(bus)


async def stop_everything(bus: FakeSystemd) -> None:
    await bus.connect()
    for unit in list(bus.units):
        with contextlib.suppress(BusError):  # it ended meanwhile
            await bus.call("KillUnit", "ssi", [unit, "all", 9])
    for _ in range(200):
        if not bus.units:
            break
        await asyncio.sleep(0.01)
    bus.close()
    # Agents outlive a closed fleet, which no longer reaps them: reap them here.
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


async def test_launch_puts_the_child_in_its_scope_and_records_it(
    fleet: AsyncFleet, bus: FakeSystemd, tmp_path: Path
) -> None:
    agent = await fleet.launch("a", ["sleep", "30"])
    assert bus.scope_pids(agent.unit) == [agent.pid]
    start = next(c for c in bus.calls if c.member == "StartTransientUnit")
    props = {k: v.value for k, v in start.body[2]}
    assert props["OOMPolicy"] == "continue"
    assert props["Description"] == "agentscope agent a of fleet t"
    assert "PIDFDs" in props  # systemd 257: the process by pidfd
    with Registry(tmp_path / "registry.db") as reg:
        rec = reg.get("t", "a")
        assert rec is not None
        assert rec.state == "running"
        assert rec.pid == agent.pid
        assert [e.kind for e in reg.events("t", agent="a")] == ["launched"]
    assert Path(f"/proc/{agent.pid}/oom_score_adj").read_text().strip() == "800"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"memory_max": -1}, "MemoryMax = -1 is out of range"),
        ({"memory_max": 2**64}, "MemoryMax = 18446744073709551616 is out of range"),
        ({"memory_max": "1G"}, "memory_max = '1G'"),
        ({"tasks_max": 0}, "TasksMax = 0 is out of range"),
        ({"tasks_max": "8"}, "tasks_max = '8'"),
        ({"terminal": "screen"}, "terminal = 'screen' is not allowed"),
    ],
)
async def test_bad_arguments_are_one_kind_of_error_and_start_nothing(
    fleet: AsyncFleet, bus: FakeSystemd, kwargs: dict[str, Any], match: str
) -> None:
    # memory_max was a LaunchError and tasks_max an InvalidConfig (#30).
    with pytest.raises(InvalidConfig, match=match):
        await fleet.launch("a", ["sleep", "30"], **kwargs)
    if "terminal" not in kwargs:  # adopt takes the same controls, refused alike
        with pytest.raises(InvalidConfig, match=match):
            await fleet.adopt(os.getpid(), "a", **kwargs)
    assert bus.units == {}
    assert await fleet.agents(all=True) == []


async def test_a_second_launch_of_a_running_name_is_refused(fleet: AsyncFleet) -> None:
    await fleet.launch("a", ["sleep", "30"])
    with pytest.raises(AgentExists):
        await fleet.launch("a", ["sleep", "30"])


async def test_a_failed_start_job_leaves_no_row_and_no_process(
    fleet: AsyncFleet, bus: FakeSystemd
) -> None:
    bus.start_results["a"] = "failed"
    with pytest.raises(LaunchError, match="job result 'failed'"):
        await fleet.launch("a", ["sleep", "30"])
    assert bus.units == {}
    assert await fleet.agents(all=True) == []


async def test_old_systemd_refuses_oompolicy_once_then_launches_without(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bus = FakeSystemd(tmp_path / "cgroup", version="252")
    caplog.set_level(logging.WARNING, "agentscope")
    async with make_fleet(tmp_path, bus) as fleet:
        a = await fleet.launch("a", ["sleep", "30"])
        b = await fleet.launch("b", ["sleep", "30"])
    starts = [c for c in bus.calls if c.member == "StartTransientUnit"]
    with_policy = ["OOMPolicy" in {k for k, _ in c.body[2]} for c in starts]
    assert with_policy == [True, False, False]  # refused once, then never asked again
    assert "PIDs" in {k for k, _ in starts[-1].body[2]}  # before 255: PIDs
    assert bus.scope_pids(a.unit) == [a.pid]
    assert bus.scope_pids(b.unit) == [b.pid]
    assert sum("refuses OOMPolicy" in r.getMessage() for r in caplog.records) == 1
    await stop_everything(bus)


async def test_stop_escalates_to_sigkill_after_the_timeout(
    fleet: AsyncFleet, bus: FakeSystemd, tmp_path: Path
) -> None:
    agent = await fleet.launch("a", STUBBORN)
    await asyncio.sleep(0.3)  # the SIGTERM handler is set
    await fleet.stop("a", timeout=0.5)
    assert agent.unit not in bus.units
    assert [c.body[2] for c in bus.calls if c.member == "KillUnit"] == [9]
    assert agent.returncode == -9
    with Registry(tmp_path / "registry.db") as reg:
        rec = reg.by_unit(agent.unit)
        assert rec is not None
        assert rec.state == "exited"
        assert rec.exit_status == -9


async def test_stop_of_an_unknown_agent_raises(fleet: AsyncFleet) -> None:
    with pytest.raises(AgentNotFound):
        await fleet.stop("nobody")


async def test_listing_closes_a_row_whose_scope_went_as_exited(
    fleet: AsyncFleet, bus: FakeSystemd
) -> None:
    agent = await fleet.launch("a", ["sleep", "0.1"])
    assert await agent.wait() == 0
    for _ in range(100):
        if agent.unit not in bus.units:
            break
        await asyncio.sleep(0.01)
    assert await fleet.agents() == []
    (rec,) = await fleet.agents(all=True)
    assert (rec.state, rec.returncode) == ("exited", 0)


async def test_an_exit_seen_more_than_once_is_recorded_once(
    fleet: AsyncFleet, bus: FakeSystemd
) -> None:
    # One exit transition (FleetRegistry.mark_exited): the exit watcher, a
    # listing that finds the scope gone and the reaper may each see an exit;
    # the first records it, with its one "exited" event (a tmux agent got two).
    agent = await fleet.launch("a", ["sleep", "0.1"])
    assert await agent.wait() == 0
    await asyncio.gather(*list(fleet._tasks))
    await fleet._listing.record_exit(agent, 0)  # seen again, as by a second watcher
    rec = await fleet._store.call(fleet._store.open_registry.by_unit, agent.unit)
    assert rec is not None
    await fleet._store.close_gone(rec)  # and by a listing
    kinds = [e.kind for e in await fleet.events(agent="a")]
    assert kinds.count("exited") == 1
    (listed,) = await fleet.agents(all=True)
    assert (listed.state, listed.returncode) == ("exited", 0)


async def test_listing_reads_figures_from_the_scope_files(
    fleet: AsyncFleet, bus: FakeSystemd
) -> None:
    agent = await fleet.launch("a", ["sleep", "30"])
    (bus.units[agent.unit].cgroup / "memory.current").write_text("12345\n")
    (listed,) = await fleet.agents()
    assert (listed.name, listed.state, listed.memory_current) == ("a", "running", 12345)


async def test_adopt_moves_a_process_and_its_children(fleet: AsyncFleet, bus: FakeSystemd) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30; wait"])
    try:
        for _ in range(100):  # both its children are forked
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if len(children) == 2:
                break
            await asyncio.sleep(0.01)
        agent = await fleet.adopt(proc.pid, "adopted")
        assert sorted(bus.scope_pids(agent.unit)) == sorted([proc.pid, *map(int, children)])
        (listed,) = await fleet.agents()
        assert (listed.name, listed.state, listed.pid) == ("adopted", "running", proc.pid)
    finally:
        proc.kill()
        proc.wait()


async def test_adopt_moves_a_late_child_although_systemd_refuses_the_attach(
    fleet: AsyncFleet, bus: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd refuses AttachProcessesToUnit for a scope without Delegate=yes
    # (measured on 247-262): a child forked while the scope was made is moved
    # through cgroup.procs instead, and the adopt does not fail half-done.
    from agentscope_systemd._fleet import _fleet_adopt as fleet_module

    bus.attach_refusal = (
        "org.freedesktop.DBus.Error.InvalidArgs",
        "Process migration not available on non-delegated units.",
    )
    proc = subprocess.Popen(["sleep", "30"])
    late = subprocess.Popen(["sleep", "30"])
    real_tree = fleet_module._process_tree
    calls = 0

    def tree(pid: int) -> tuple[Any, list[int]]:
        nonlocal calls
        calls += 1
        root, pids = real_tree(pid)
        return (root, pids) if calls == 1 else (root, [*pids, late.pid])

    monkeypatch.setattr(fleet_module, "_process_tree", tree)
    try:
        agent = await fleet.adopt(proc.pid, "adopted")
        procs = (bus.units[agent.unit].cgroup / "cgroup.procs").read_text().split()
        assert str(late.pid) in procs
        (listed,) = await fleet.agents()
        assert (listed.name, listed.state) == ("adopted", "running")
    finally:
        for p in (proc, late):
            p.kill()
            p.wait()


async def test_adopt_of_no_process_raises(fleet: AsyncFleet) -> None:
    with pytest.raises(LaunchError, match="no process"):
        await fleet.adopt(2**22 - 1, "x")


# -- processes never adopted (#31 item 3) --------------------------------------------------


@pytest.mark.parametrize(
    ("pid", "why"),
    [
        (1, "PID 1"),
        (os.getppid(), "an ancestor of this process"),
        (0, "out of range"),
        (-5, "out of range"),
        (2**22 + 1, "out of range"),
        (True, "not a number"),
        ("٣", "not a number"),
    ],
)
async def test_adopt_refuses_what_must_never_be_an_agent(
    fleet: AsyncFleet, bus: FakeSystemd, pid: object, why: str
) -> None:
    if type(pid) is int and pid == 1 and why != "PID 1":  # True == 1 is the bool case
        # Started by PID 1 itself (a container's entry point, a detached
        # shell): this process's only ancestor is PID 1, refused as PID 1.
        pytest.skip("this process's parent is PID 1: no other ancestor to adopt")
    with pytest.raises(InvalidConfig, match=why):
        await fleet.adopt(pid, "x")  # type: ignore[arg-type]
    assert bus.units == {} or all(not u.startswith("agentscope-") for u in bus.units)
    assert await fleet.agents(all=True) == []


def test_a_process_may_adopt_itself_as_exec_does() -> None:
    # `agentscope exec` adopts its own pid and then execs its command: the
    # rule refuses the manager's ancestors, never the manager itself.
    from agentscope_systemd._fleet._fleet_adopt import _never_adopted

    assert _never_adopted(os.getpid()) is None
    assert _never_adopted(os.getppid()) is not None


def test_a_user_may_not_adopt_another_users_process() -> None:
    # A non-root fleet (the user manager's) refuses a process of another
    # user, a system service's main process among them (#31), by its reason.
    if os.geteuid() != 0:
        pytest.skip("needs root to run the check as another user")
    roots = subprocess.Popen(["sleep", "30"])
    try:
        # Imports first (this Python's files may be root's alone; psutil is
        # imported where a process is looked at), then nobody's uid.
        code = (
            "import os, sys, psutil; "
            "from agentscope_systemd._fleet._fleet_adopt import _never_adopted; "
            "os.setegid(65534); os.seteuid(65534); print(_never_adopted(int(sys.argv[1])))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(roots.pid)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout
        assert "not your process (it runs as uid 0)" in out
    finally:
        roots.kill()
        roots.wait()


async def test_adopt_refuses_a_kernel_thread(fleet: AsyncFleet) -> None:
    try:
        comm = Path("/proc/2/comm").read_text().strip()
    except OSError:
        pytest.skip("no pid 2 here (a PID namespace)")
    if comm != "kthreadd":
        pytest.skip("pid 2 is not kthreadd here")
    with pytest.raises(InvalidConfig, match="kernel thread"):
        await fleet.adopt(2, "x")
    assert await fleet.agents(all=True) == []


async def test_adopt_refuses_a_services_main_process(
    fleet: AsyncFleet, bus: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_systemd._fleet import _fleet_adopt

    proc = subprocess.Popen(["sleep", "30"])
    try:
        monkeypatch.setattr(
            _fleet_adopt,
            "read_cgroup",
            lambda pid, *a: "/system.slice/ssh.service" if pid == proc.pid else None,
        )
        asked: list[str] = []

        async def call(member: str, signature: str = "", body: Any = (), **kw: Any) -> list[Any]:
            asked.append(member)
            assert (member, list(body)) == ("GetUnit", ["ssh.service"])
            return ["/org/freedesktop/systemd1/unit/ssh_2eservice"]

        async def get_property(path: str, interface: str, name: str) -> Any:
            assert (interface, name) == ("org.freedesktop.systemd1.Service", "MainPID")
            return proc.pid

        monkeypatch.setattr(bus, "call", call)
        monkeypatch.setattr(bus, "get_property", get_property)
        with pytest.raises(InvalidConfig, match=r"main process of ssh\.service"):
            await fleet.adopt(proc.pid, "x")
        assert asked == ["GetUnit"]  # nothing started
        monkeypatch.undo()
        assert await fleet.agents(all=True) == []
    finally:
        proc.kill()
        proc.wait()


async def test_reopen_adopts_running_agents_and_closes_gone_ones(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    async with make_fleet(tmp_path, bus) as first:
        keep = await first.launch("keep", ["sleep", "30"])
        gone = await first.launch("gone", ["sleep", "30"])
    await bus.call("KillUnit", "ssi", [gone.unit, "all", 9])
    assert gone.popen is not None
    gone.popen.wait()
    for _ in range(100):
        if gone.unit not in bus.units:
            break
        await asyncio.sleep(0.01)
    async with make_fleet(tmp_path, bus) as second:
        listed = {a.name: a for a in await second.agents(all=True)}
        assert listed["keep"].state == "running"
        assert listed["keep"].pid == keep.pid
        assert listed["gone"].state == "lost"
    await stop_everything(bus)


async def test_a_scope_the_listing_missed_is_not_gone_while_its_cgroup_is_there(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    # Seen on systemd 247 under chaos: an exec's scope has its cgroup (so the
    # registry takes the launch in from the spool as running) before systemd
    # lists the unit; a listing in between must not close the row as lost.
    async with make_fleet(tmp_path, bus) as first:
        agent = await first.launch("a", ["sleep", "30"])
    hidden = bus.units.pop(agent.unit)  # not listed; its cgroup stays
    assert (bus.slice_dir / agent.unit).is_dir()
    async with make_fleet(tmp_path, bus) as second:
        registry = second._store.open_registry
        rows = {r.name: r for r in await second._store.call(registry.agents, "t")}
        assert rows["a"].state == "running"
        await second.agents(all=True)  # the listing does not close it either
        assert [e.kind for e in await second.events(agent="a")] == ["launched"]
        bus.units[agent.unit] = hidden  # listed again
        (listed,) = await second.agents()
        assert (listed.name, listed.state, listed.pid) == ("a", "running", agent.pid)
    # Gone for real (no unit, no cgroup): closed, once.
    bus.units.pop(agent.unit)
    assert agent.popen is not None
    agent.popen.kill()
    agent.popen.wait()
    (bus.slice_dir / agent.unit / "cgroup.procs").unlink()
    for child in (bus.slice_dir / agent.unit).iterdir():
        child.unlink()
    (bus.slice_dir / agent.unit).rmdir()
    async with make_fleet(tmp_path, bus) as third:
        (row,) = await third.agents(all=True)
        assert row.state == "lost"
    await stop_everything(bus)


async def test_reopen_records_a_scope_the_registry_does_not_know(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        bus.crash_scope("agentscope-t-x-abcdef.scope", "t", "x", [proc.pid])
        async with make_fleet(tmp_path, bus) as fleet:
            (agent,) = await fleet.agents()
            assert (agent.name, agent.pid, agent.state) == ("x", proc.pid, "running")
            assert [e.kind for e in await fleet.events(agent="x")] == ["found"]
    finally:
        proc.kill()
        proc.wait()
        await stop_everything(bus)


async def test_stale_slice_limits_are_cleared_before_the_first_launch(
    fleet: AsyncFleet, bus: FakeSystemd
) -> None:
    bus.slice_props["MemoryHigh"] = 1 << 30
    await fleet.launch("a", ["sleep", "30"])
    assert await fleet.slice_limits() == {
        "MemoryHigh": None,
        "MemoryMax": None,
        "MemorySwapMax": None,
    }
    events = await fleet.events(kind="limits_cleared")
    assert [e.detail["limits"] for e in events] == [{"MemoryHigh": 1 << 30}]


def orphan(argv: list[str]) -> tuple[int, int]:
    """A process whose parent died (as an agent whose manager died): (pid, start time)."""
    out = subprocess.run(
        ["sh", "-c", '"$@" </dev/null >/dev/null 2>&1 & echo $!', "sh", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout)
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return pid, int(stat[stat.rindex(b")") + 2 :].split()[19])


async def test_a_row_left_starting_by_a_dead_manager_is_running_at_the_next_open(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    # A manager died after its child exec'd in the scope, before the row said
    # running: the child lives on, reparented.
    pid, start = orphan(["sleep", "30"])
    unit = "agentscope-t-a-abcdef.scope"
    try:
        with Registry(tmp_path / "registry.db") as reg:
            reg.record_launch("t", "a", unit, pid, start, ["sleep", "30"], "/")
        bus.crash_scope(unit, "t", "a", [pid])
        async with make_fleet(tmp_path, bus) as fleet:
            (agent,) = await fleet.agents()
            assert (agent.state, agent.pid) == ("running", pid)
            assert [e.kind for e in await fleet.events(agent="a")] == ["launched"]
        async with make_fleet(tmp_path, bus) as fleet:  # once
            assert [e.kind for e in await fleet.events(agent="a")] == ["launched"]
            await fleet.stop("a", timeout=2)
            assert bus.units == {}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        await stop_everything(bus)


async def test_fleet_a_does_not_claim_the_agents_of_fleet_a_b(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    async with make_fleet(tmp_path, bus, "a-b") as ab, make_fleet(tmp_path, bus, "a") as a:
        agent = await ab.launch("c", ["sleep", "30"])
        # agentscope-a-b-c-XXXXXX.scope reads as fleet a's agent "b-c" by prefix.
        assert ab.unit_agent(agent.unit) == "c"
        assert a.unit_agent(agent.unit) is None
        assert await a.agents() == []
        (report,) = [r for r in (await ab.agents()) if r.unit == agent.unit]
        assert report.name == "c"
    await stop_everything(bus)


@pytest.mark.parametrize("result", ["canceled", "failed"])
async def test_a_stop_job_that_did_not_finish_is_not_recorded_as_exited(
    fleet: AsyncFleet, bus: FakeSystemd, tmp_path: Path, result: str
) -> None:
    agent = await fleet.launch("a", ["sleep", "30"])
    bus.stop_results["a"] = result
    with pytest.raises(AgentscopeError, match=f"ended '{result}'"):
        await fleet.stop("a", timeout=2)
    (listed,) = await fleet.agents()
    assert (listed.state, listed.pid) == ("running", agent.pid)
    kinds = [e.kind for e in await fleet.events(agent="a")]
    assert kinds == ["launched", "stop_failed"]
    await fleet.stop("a", timeout=2)  # the next stop does it
    assert [a.state for a in await fleet.agents(all=True)] == ["exited"]


async def test_out_of_fds_for_the_exit_watch_the_launch_still_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = FakeSystemd(tmp_path / "cgroup", version="252")  # PIDs: no pidfd for the start

    real = os.pidfd_open

    def emfile(pid: int, flags: int = 0) -> int:
        if pid == os.getpid():  # the gate's pidfd of its parent: not the one under test
            return real(pid, flags)
        raise OSError(24, "Too many open files")

    async with make_fleet(tmp_path, bus) as fleet:
        monkeypatch.setattr(os, "pidfd_open", emfile)
        agent = await fleet.launch("a", ["sleep", "0.2"])
        assert await agent.wait() == 0
        for _ in range(100):
            if [a.state for a in await fleet.agents(all=True)] == ["exited"]:
                break
            await asyncio.sleep(0.05)
        (listed,) = await fleet.agents(all=True)
        assert (listed.state, listed.returncode) == ("exited", 0)
    await stop_everything(bus)


def test_a_closed_blocking_fleet_keeps_no_pidfd(tmp_path: Path) -> None:
    from agentscope_systemd._fleet._blocking import Fleet

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    launched: list[subprocess.Popen[bytes]] = []

    def one_cycle(i: int) -> None:
        fleet = Fleet(
            "t",
            registry=tmp_path / "registry.db",
            manager_oom_score_adj=None,
            tmux_dir=tmp_path / "tmux",
            _bus=FakeSystemd(tmp_path / "cgroup"),
        )
        try:
            popen = fleet.launch(f"a{i}", ["sleep", "30"])._agent.popen
            assert popen is not None
            launched.append(popen)
        finally:
            fleet.close()

    try:
        one_cycle(0)
        before = fds()
        for i in range(1, 6):
            one_cycle(i)
        assert fds() - before < 5  # one pidfd per agent kept, before: +5
    finally:
        for popen in launched:
            popen.kill()
            popen.wait()


def test_a_closed_blocking_fleet_says_it_is_closed(tmp_path: Path) -> None:
    from agentscope_systemd._fleet._blocking import Fleet

    fleet = Fleet(
        "t",
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _bus=FakeSystemd(tmp_path / "cgroup"),
    )
    assert fleet.agents() == []
    where = fleet.slice_cgroup()
    assert where.name == "app-agentscope-agents.slice"
    assert where.is_relative_to(tmp_path / "cgroup")
    fleet.close()
    fleet.close()  # twice: harmless
    for call in (fleet.agents, lambda: fleet.launch("a", ["true"]), lambda: fleet.stop("a")):
        with pytest.raises(AgentscopeError, match="fleet 't' is closed; open a new Fleet"):
            call()


async def test_an_empty_scope_a_dead_manager_left_is_stopped_at_open(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    # Its child exited before systemd moved it in: no process, no row, active.
    bus.crash_scope("agentscope-t-x-abcdef.scope", "t", "x", [])
    async with make_fleet(tmp_path, bus) as fleet:
        assert bus.units == {}
        assert await fleet.agents(all=True) == []
        assert [e.kind for e in await fleet.events()] == []
    await stop_everything(bus)


async def test_concurrent_launches_on_a_systemd_without_scope_oompolicy_warn_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Five launches in flight at once are all refused OOMPolicy: one warning,
    # and the fleet asks without it from then on.
    bus = FakeSystemd(tmp_path / "cgroup", version="252")
    caplog.set_level(logging.WARNING, "agentscope")
    async with make_fleet(tmp_path, bus) as fleet:
        agents = await asyncio.gather(*(fleet.launch(f"a{i}", ["sleep", "30"]) for i in range(5)))
        assert all(bus.scope_pids(a.unit) == [a.pid] for a in agents)
        later = await fleet.launch("later", ["sleep", "30"])
        (start,) = [c for c in bus.calls if c.member == "StartTransientUnit"][-1:]
        assert "OOMPolicy" not in {k for k, _ in start.body[2]}
        assert bus.scope_pids(later.unit) == [later.pid]
    assert sum("refuses OOMPolicy" in r.getMessage() for r in caplog.records) == 1
    await stop_everything(bus)


async def test_a_name_whose_scope_systemd_has_not_loaded_yet_is_still_held(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    # systemd 247 makes an exec's scope's cgroup (and the registry takes the
    # launch in as running) before it loads the unit. A launch or an adopt of
    # that name meanwhile asked systemd, heard "no such unit", closed the
    # running row as lost and started a second agent of the name.
    async with make_fleet(tmp_path, bus) as first:
        agent = await first.launch("a", ["sleep", "30"])
    hidden = bus.units.pop(agent.unit)  # GetUnit: NoSuchUnit; its cgroup stays
    proc = subprocess.Popen(["sleep", "30"])
    try:
        async with make_fleet(tmp_path, bus) as second:
            with pytest.raises(AgentExists):
                await second.launch("a", ["sleep", "30"])
            with pytest.raises(AgentExists):
                await second.adopt(proc.pid, "a")
            assert bus.units == {}  # no second scope
            bus.units[agent.unit] = hidden
            (listed,) = await second.agents(all=True)
            assert (listed.unit, listed.state, listed.pid) == (agent.unit, "running", agent.pid)
            assert [e.kind for e in await second.events(agent="a")] == ["launched"]
    finally:
        proc.kill()
        proc.wait()
        await stop_everything(bus)


async def test_a_name_whose_scope_is_gone_is_claimed_by_the_next_launch(
    fleet: AsyncFleet, tmp_path: Path
) -> None:
    # Another manager's row, recorded after this fleet opened: its agent
    # ended unseen and its scope went.
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = "agentscope-t-a-000000.scope"
    with Registry(tmp_path / "registry.db") as reg:
        reg.record_launch("t", "a", gone, dead.pid, 1, ["true"], "/", "running")
    new = await fleet.launch("a", ["sleep", "30"])
    rows = {r.unit: r.state for r in await fleet.agents(all=True)}
    assert rows == {gone: "lost", new.unit: "running"}
    assert [e.kind for e in await fleet.events(agent="a")] == ["lost", "launched"]


async def test_a_closed_row_whose_scope_runs_is_reopened_once(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    # Closed while its scope lived on (a listing that missed the scope, as
    # systemd 247 does with an exec's): every open reported it "found" again
    # and could not record it, its unit being taken by the closed row.
    async with make_fleet(tmp_path, bus) as first:
        agent = await first.launch("a", ["sleep", "30"])
    with Registry(tmp_path / "registry.db") as reg:
        reg.set_state(agent.unit, "lost", event="lost", detail={"unit": agent.unit})
    async with make_fleet(tmp_path, bus) as second:
        (listed,) = await second.agents()
        assert (listed.unit, listed.state, listed.pid) == (agent.unit, "running", agent.pid)
    async with make_fleet(tmp_path, bus) as third:
        assert [e.kind for e in await third.events(agent="a")] == ["launched", "lost", "reopened"]
        (listed,) = await third.agents(all=True)
        assert (listed.state, listed.returncode) == ("running", None)
        await third.stop("a", timeout=2)
        assert bus.units == {}
        assert [a.state for a in await third.agents(all=True)] == ["exited"]
    await stop_everything(bus)
