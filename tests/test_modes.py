"""Manager modes (issue #27): which one ``auto`` picks and why, forced ones refused, process mode.

Selection runs over fake trees (tests/fakefs.py): a fake /proc for PID 1's
name, a fake cgroup v2 root, a real unix socket standing for a bus that
answers. Process mode runs real processes (``sleep``, ``sh``) under a
:class:`ProcessManager` whose mirror is in ``tmp_path``: it is the mode of
this project's own development machine, a container without systemd.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import agentscope_systemd
from agentscope_systemd._fleet._fleet import AsyncFleet
from agentscope_systemd._kernel import _container
from agentscope_systemd._managers._cgroupmode import CgroupManager, default_agent_max
from agentscope_systemd._managers._modes import check_forced, choose_mode, parse_manager
from agentscope_systemd._managers._procscopes import ProcessManager
from agentscope_systemd._registry._registry import Registry
from tests.fakefs import make_cgroup, make_cgroup_root, write
from tests.fakesystemd import end_children
from tests.test_cli import run, run_json


@pytest.fixture(autouse=True)
def _reap_agents() -> Iterator[None]:
    yield
    end_children()


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake /proc whose PID 1 is systemd and this process at ``/app``; returns /proc."""
    proc = tmp_path / "proc"
    for d in ("1", str(os.getpid())):
        (proc / d).mkdir(parents=True)
    write(proc / "1" / "comm", "systemd\n")
    write(proc / str(os.getpid()) / "cgroup", "0::/app\n")
    monkeypatch.setattr(_container, "PROC_ROOT", proc)
    monkeypatch.setattr(_container, "FS_ROOT", tmp_path / "root")
    monkeypatch.delenv("container", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return proc


def cgroup_tree(tmp_path: Path, *, delegated: bool) -> Path:
    """A cgroup v2 root with this process's cgroup ``/app``, writable when ``delegated``."""
    root = make_cgroup_root(tmp_path / "cg")
    (root / "app").mkdir()
    write(root / "app" / "cgroup.procs", f"{os.getpid()}\n")
    if delegated:
        write(root / "app" / "cgroup.subtree_control", "")
    return root


def bus_env(tmp_path: Path, *, answers: bool) -> dict[str, str]:
    """A system bus address; a socket that takes connections when ``answers``."""
    path = tmp_path / "bus"
    if answers:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen(4)
        _keep.append(sock)
    else:
        path.write_text("")  # a stale socket file: nothing listens
    return {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={path}", "XDG_RUNTIME_DIR": str(tmp_path)}


_keep: list[socket.socket] = []


def test_auto_takes_systemd_where_pid_1_is_systemd_and_its_bus_answers(
    host: Path, tmp_path: Path
) -> None:
    choice = choose_mode(
        "auto",
        cgroup_root=cgroup_tree(tmp_path, delegated=True),
        env=bus_env(tmp_path, answers=True),
    )
    assert (choice.mode, choice.forced) == ("systemd", False)
    assert choice.reason == "PID 1 is systemd and its bus answers"


@pytest.mark.skipif(os.geteuid() != 0, reason="the system bus is root's flavour")
def test_auto_on_a_systemd_host_whose_bus_does_not_answer_stays_systemd_and_says_so(
    host: Path, tmp_path: Path
) -> None:
    # Even with its own cgroup writable: on a systemd host the cgroups are
    # systemd's, and the open then fails with SystemdUnavailable (exit 4).
    choice = choose_mode(
        "auto",
        cgroup_root=cgroup_tree(tmp_path, delegated=True),
        env=bus_env(tmp_path, answers=False),
    )
    assert (choice.mode, choice.forced) == ("systemd", False)
    assert "PID 1 is systemd, but no system bus answers at unix:path=" in choice.reason


def test_auto_in_a_container_with_a_read_only_cgroupfs_is_process_mode(
    host: Path, tmp_path: Path
) -> None:
    write(host / "1" / "comm", "bash\n")
    (tmp_path / "root").mkdir()
    write(tmp_path / "root" / ".dockerenv", "")
    choice = choose_mode(
        cgroup_root=cgroup_tree(tmp_path, delegated=False), env=bus_env(tmp_path, answers=True)
    )
    assert choice.mode == "process"
    assert choice.reason.startswith(
        "PID 1 is 'bash', not systemd: a container (docker: /.dockerenv)"
    )
    # A cgroup v1 host (this development machine's kind) says so instead.
    v1 = choose_mode(cgroup_root=tmp_path / "tmpfs", env={})
    assert v1.mode == "process"
    assert "is not a cgroup v2 mount" in v1.reason


def test_auto_where_its_own_cgroup_is_writable_is_cgroup_mode(host: Path, tmp_path: Path) -> None:
    write(host / "1" / "comm", "bash\n")
    choice = choose_mode(cgroup_root=cgroup_tree(tmp_path, delegated=True), env={})
    assert choice.mode == "cgroup"
    assert "its own cgroup /app is writable" in choice.reason


def test_manager_spellings_and_bad_ones(tmp_path: Path) -> None:
    assert parse_manager("system") == ("systemd", "system")
    assert parse_manager("user") == ("systemd", "user")
    assert parse_manager("process")[0] == "process"
    with pytest.raises(agentscope_systemd.InvalidConfig, match="manager"):
        parse_manager("docker")
    with pytest.raises(agentscope_systemd.InvalidConfig):
        AsyncFleet("t", "docker", registry=tmp_path / "r.db")
    result = run("--manager", "docker", "ls")
    assert result.code == 2


async def test_a_forced_cgroup_mode_that_cannot_work_fails_at_open_creating_nothing(
    host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(host / "1" / "comm", "bash\n")
    registry = tmp_path / "state" / "registry.db"
    choice = choose_mode("cgroup", cgroup_root=cgroup_tree(tmp_path, delegated=False))
    assert choice.forced
    with pytest.raises(agentscope_systemd.ModeUnavailable) as caught:
        check_forced(choice, cgroup_root=tmp_path / "cg")
    assert "the cgroup manager mode cannot work here" in str(caught.value)
    assert "--manager process" in str(caught.value)
    fleet = AsyncFleet("t", "cgroup", registry=registry, tmux_dir=tmp_path / "tmux")
    with pytest.raises(agentscope_systemd.ModeUnavailable):
        await fleet.open()
    assert not registry.exists()
    assert not (tmp_path / "tmux").exists()
    # The CLI: exit 4 (no manager), its own kind.
    result = run("--json", "--manager", "cgroup", "ls")
    assert (result.code, json.loads(result.stderr)["kind"]) == (4, "mode_unavailable")


# -- process mode ---------------------------------------------------------------


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return list(p.cmdline())
    except psutil.Error:
        return []


def process_fleet(tmp_path: Path) -> AsyncFleet:
    return AsyncFleet(
        "t",
        "process",
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _manager=ProcessManager("user", "t", "app-agentscope-agents.slice", tmp_path / "run"),
    )


async def _wait_for(predicate: object, seconds: float = 5.0) -> None:
    assert callable(predicate)
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def test_process_mode_launches_lists_and_stops_whole_process_trees(tmp_path: Path) -> None:
    async with process_fleet(tmp_path) as fleet:
        assert fleet.mode == "process"
        tree = await fleet.launch(
            "tree", ["sh", "-c", "sleep 300 & echo $! > child; wait"], cwd=tmp_path
        )
        lone = await fleet.launch("lone", ["sleep", "300"])
        await _wait_for(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text())
        child = int((tmp_path / "child").read_text())
        assert {a.name: a.state for a in await fleet.agents()} == {
            "tree": "running",
            "lone": "running",
        }
        with pytest.raises(agentscope_systemd.AgentExists):
            await fleet.launch("lone", ["sleep", "1"])
        # The mirror holds the tree's members: its shell and the child.
        procs = (
            (
                tmp_path
                / "run"
                / "process-scopes"
                / "app-agentscope-agents.slice"
                / tree.unit
                / "cgroup.procs"
            )
            .read_text()
            .split()
        )
        assert sorted(map(int, procs)) == sorted([tree.pid, child])
        await fleet.stop("tree", timeout=5)
        assert (_running(tree.pid), _running(child)) == (False, False)
        assert _running(lone.pid)
        await fleet.kill("lone", signal.SIGKILL)
        await _wait_for(lambda: not _running(lone.pid))
        states = {a.name: a.state for a in await fleet.agents(all=True)}
        assert states == {"tree": "exited", "lone": "exited"}
    with Registry(tmp_path / "registry.db") as reg:
        kinds = [e.kind for e in reg.events("t", agent="tree")]
    assert (kinds[0], kinds[-1]) == ("launched", "stopped")


async def test_process_mode_refuses_what_needs_a_cgroup_naming_the_mode(tmp_path: Path) -> None:
    async with process_fleet(tmp_path) as fleet:
        with pytest.raises(
            agentscope_systemd.ModeUnsupported, match="process manager mode"
        ) as caught:
            await fleet.launch("capped", ["sleep", "300"], memory_max=100 << 20)
        assert "MemoryMax" in str(caught.value)
        assert "--manager cgroup" in str(caught.value)
        # Nothing is left of the refused launch: no row, no process, no scope.
        assert await fleet.agents(all=True) == []
        assert not [p for p in psutil.Process().children() if _cmdline(p) == ["sleep", "300"]]
        agent = await fleet.launch("a", ["sleep", "300"])
        with pytest.raises(agentscope_systemd.ModeUnsupported, match="freez"):
            await fleet.freeze("a")
        with pytest.raises(agentscope_systemd.ModeUnsupported):
            await fleet.call("a", ["true"])
        assert _running(agent.pid)
        assert {a.name: a.state for a in await fleet.agents()} == {"a": "running"}


async def test_a_second_fleet_object_finds_process_mode_agents_and_their_leftovers(
    tmp_path: Path,
) -> None:
    async with process_fleet(tmp_path) as first:
        keep = await first.launch("keep", ["sleep", "300"])
        # Its main process ends at once; the child it leaves is reparented away.
        left = await first.launch(
            "left",
            ["sh", "-c", "sleep 300 & echo $! > orphan; sleep 0.5"],
            cwd=tmp_path,
            reap_after="keep",
        )
        await _wait_for(
            lambda: (tmp_path / "orphan").exists() and (tmp_path / "orphan").read_text()
        )
        orphan = int((tmp_path / "orphan").read_text())
        # Seen once by a listing, the child stays a member after its parent ends.
        await first.agents()
        assert left.popen is not None
        await asyncio.to_thread(left.popen.wait)
    async with process_fleet(tmp_path) as second:
        agents = {a.name: a for a in await second.agents()}
        assert (agents["keep"].pid, agents["keep"].state) == (keep.pid, "running")
        assert agents["left"].state == "lingering"
        await second.stop("left", timeout=5)
        await _wait_for(lambda: not _running(orphan))
        assert _running(keep.pid)


def test_doctor_says_the_mode_and_a_container_in_process_mode_is_no_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_systemd._cli import _doctor
    from tests.test_container import container_facts

    box = tmp_path / "root"
    (box / "proc" / "1").mkdir(parents=True)
    write(box / "proc" / "1" / "comm", "bash\n")
    write(box / ".dockerenv", "")
    monkeypatch.setattr(_container, "PROC_ROOT", box / "proc")
    monkeypatch.setattr(_container, "FS_ROOT", box)
    reason = "PID 1 is 'bash', not systemd: a container (docker: /.dockerenv); read-only"
    facts = container_facts(box, tmp_path, mode="process", mode_reason=reason)
    monkeypatch.setattr(_doctor, "gather", lambda opts: facts)
    result, data = run_json("doctor")
    assert result.code == 0, result.stdout  # the fleet runs here: not "systemd unreachable"
    assert data["mode"] == "process"
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["manager_mode"]["detail"] == f"process: {reason}"
    assert checks["systemd"]["status"] == "warn"
    assert "process manager mode" in checks["container"]["detail"]
    # The systemd mode forced there: the failure and exit 4 as before.
    facts = container_facts(box, tmp_path, mode="systemd", mode_reason="--manager systemd")
    monkeypatch.setattr(_doctor, "gather", lambda opts: facts)
    result, data = run_json("doctor")
    assert result.code == 4
    assert {c["name"]: c["status"] for c in data["checks"]}["systemd"] == "fail"


# -- cgroup mode -----------------------------------------------------------------


def test_the_default_agent_cap_leaves_the_manager_its_headroom_or_is_reported() -> None:

    # 400 MiB: 10 % is under the 64 MiB floor, so 64 MiB stay with the manager.
    assert default_agent_max(400 << 20) == ((400 - 64) << 20, None)
    assert default_agent_max(8 << 30) == ((8 << 30) - int((8 << 30) * 0.10), None)
    assert default_agent_max(None) == (None, None)
    cap, note = default_agent_max(150 << 20)
    assert cap is None
    assert note is not None
    assert "150 MiB" in note
    assert "leaves no room" in note


def delegated_base(tmp_path: Path, limit: int) -> tuple[Path, CgroupManager]:
    """A base cgroup ``/app`` holding this process under ``limit``, and a manager over it."""
    root = make_cgroup_root(tmp_path / "cg")
    base = make_cgroup(root, "app", procs=[os.getpid()], max=limit)
    write(base / "cgroup.subtree_control", "")
    make_cgroup(root, "app/agentscope-manager")
    write(make_cgroup(root, "app/app-agentscope-agents.slice") / "cgroup.subtree_control", "")
    manager = CgroupManager(
        "user",
        "t",
        "app-agentscope-agents.slice",
        tmp_path / "run",
        cgroup_root=root,
        own_cgroup="/app",
    )
    return base, manager


def test_cgroup_mode_moves_the_manager_into_a_leaf_and_enables_controllers(
    tmp_path: Path,
) -> None:
    base, manager = delegated_base(tmp_path, 400 << 20)
    leaf, agents = base / "agentscope-manager", base / "app-agentscope-agents.slice"
    asyncio.run(manager.connect())
    assert (leaf / "cgroup.procs").read_text() == str(os.getpid())
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (agents / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert asyncio.run(manager.slice_cgroup()) == agents
    assert manager.default_max == (400 - 64) << 20
    assert manager.limit_note is None
    # Its units are found in a /proc/PID/cgroup path, at any depth.
    unit = "agentscope-t-a-000000.scope"
    assert manager.unit_of_cgroup(f"/app/app-agentscope-agents.slice/{unit}/agent") == unit
    assert manager.unit_of_cgroup("/app/agentscope-manager") is None


def test_cgroup_mode_under_a_limit_with_no_room_reports_it(tmp_path: Path) -> None:
    _base, manager = delegated_base(tmp_path, 100 << 20)
    asyncio.run(manager.connect())
    assert manager.default_max is None
    assert manager.limit_note is not None
    assert "100 MiB" in manager.limit_note
