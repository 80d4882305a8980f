"""/proc readers, and the monitor's attribution logic built on them.

The attribution tests (OOM victims, pressure window, throttling) live here
too, since they run over the same fake /proc trees.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from fakefs import (
    PAGE,
    format_pressure,
    make_cgroup,
    make_cgroup_root,
    make_host_pressure,
    make_meminfo,
    make_proc,
    stat_line,
)
from hypothesis import given
from hypothesis import strategies as st

from agentscope_systemd._kernel import _cgroup
from agentscope_systemd._kernel._cgroup import MemoryEvents
from agentscope_systemd._kernel._proc import (
    MemInfo,
    ProcStat,
    host_pressure,
    iter_pids,
    parse_stat,
    read_cgroup,
    read_cmdline,
    read_meminfo,
    read_oom_score_adj,
    read_smaps_rollup,
    read_stat,
    read_statm_rss,
    read_wchan,
    same_process,
    top_processes,
)
from agentscope_systemd._monitor._attribution import (
    PressureSample,
    PressureWindow,
    SeenProcess,
    counter_delta,
    detect_throttle,
    is_throttled,
    oom_victims,
    parse_oom_kill_line,
)

AGENTS = "/app.slice/app-agentscope.slice/app-agentscope-agents.slice"


def agent_of(cgroup: str) -> str | None:
    """A stand-in for the lead's naming: agentscope-<fleet>-<agent>-<6hex>.scope."""
    parent, _, unit = cgroup.rpartition("/")
    if parent != AGENTS or not unit.startswith("agentscope-"):
        return None
    return unit.removesuffix(".scope").split("-")[2]


# --- stat ------------------------------------------------------------------


def test_read_stat(tmp_path: Path) -> None:
    make_proc(tmp_path, 4242, comm="python3", state="D", ppid=17, start_time=987654)
    assert read_stat(4242, tmp_path) == ProcStat(4242, "python3", "D", 17, 987654, 4194560, 0)


def test_same_process_is_pid_and_start_time(tmp_path: Path) -> None:
    make_proc(tmp_path, 4242, start_time=1000)
    make_proc(tmp_path, 4243, start_time=1000, state="Z")
    assert same_process(4242, 1000, tmp_path) == read_stat(4242, tmp_path)
    assert same_process(4242, 999, tmp_path) is None  # the pid reused by another process
    assert same_process(4244, 1000, tmp_path) is None  # gone
    assert same_process(4243, 1000, tmp_path) is None  # a zombie runs nothing
    assert same_process(4243, 1000, tmp_path, zombie=True) is not None


def test_every_identity_check_refuses_a_reused_pid(tmp_path: Path) -> None:
    # One rule (same_process) for the reaper, the process mode's scopes, the
    # escape audit and Agent.alive (and the guard's kill): each must take a
    # pid now held by another process (another start time) for gone.
    from agentscope_systemd._fleet._agent import Agent
    from agentscope_systemd._fleet._reaper import main_alive
    from agentscope_systemd._kernel._proctrees import tree_members
    from agentscope_systemd._managers._procscopes import signal_process
    from agentscope_systemd._monitor._escape import Escapee, _still_escapee
    from agentscope_systemd._registry._records import AgentRecord

    me, mine = os.getpid(), read_stat(os.getpid())
    assert mine is not None
    make_proc(tmp_path, me, start_time=mine.start_time + 1)  # the pid, another process
    row = AgentRecord(
        1,
        "f",
        "a",
        "u",
        me,
        mine.start_time,
        (),
        "/",
        0.0,
        "running",
        None,
        None,
        0,
        None,
        None,
    )
    assert not main_alive(row, tmp_path)
    assert tree_members({me: mine.start_time}, {}, tmp_path) == {}
    assert not signal_process(me, mine.start_time, 0, tmp_path)
    escapee = Escapee("u", me, mine.start_time, 1, "c", "/x", None, 0)
    assert _still_escapee(escapee, "/u", tmp_path) == (
        "the process exited (its pid is not the escapee's any more)"
    )
    agent = Agent("f", "a", "u", me, None, start_time=mine.start_time + 1)
    assert not agent.alive()
    agent.start_time = mine.start_time
    assert agent.alive()


@pytest.mark.parametrize(
    ("state", "flags", "signals", "dying"),
    [
        ("S", 0x400100, 0, False),
        ("R", 0x400100, 1 << 8, True),  # SIGKILL queued, not yet acted on
        ("D", 0x400104, 0, True),  # PF_EXITING: on its way out
        ("Z", 0x400100, 0, True),
        ("S", 0x400100, 1 << 14, False),  # SIGTERM pending is no sentence
    ],
)
def test_dying(tmp_path: Path, state: str, flags: int, signals: int, dying: bool) -> None:
    make_proc(tmp_path, 9, state=state, flags=flags, signals=signals)
    stat = read_stat(9, tmp_path)
    assert stat is not None
    assert stat.dying is dying


@pytest.mark.parametrize(
    "comm", ["tmux: server", "a) S 1 (b", "((()))", ") R 99 ", "Web Content", "naïve"]
)
def test_comm_with_spaces_and_parentheses(tmp_path: Path, comm: str) -> None:
    make_proc(tmp_path, 7, comm=comm, state="S", ppid=3, start_time=555)
    stat = read_stat(7, tmp_path)
    assert stat is not None
    assert (stat.comm, stat.state, stat.ppid, stat.start_time) == (comm, "S", 3, 555)


@given(
    # Anything but NUL may be set with prctl(PR_SET_NAME), newlines and ")" included.
    comm=st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=15),
    start_time=st.integers(0, 2**63),
    ppid=st.integers(0, 2**22),
)
def test_stat_fields_survive_any_comm(comm: str, start_time: int, ppid: int) -> None:
    stat = parse_stat(stat_line(99, comm, "R", ppid, start_time))
    assert (stat.pid, stat.comm, stat.ppid, stat.start_time) == (99, comm, ppid, start_time)


def test_truncated_stat_is_refused() -> None:
    with pytest.raises(ValueError, match="stat"):
        parse_stat(b"12 (sh) S 1 2 3\n")


def test_process_gone_gives_none_everywhere(tmp_path: Path) -> None:
    assert read_stat(31337, tmp_path) is None
    assert read_statm_rss(31337, tmp_path) is None
    assert read_cmdline(31337, tmp_path) is None
    assert read_wchan(31337, tmp_path) is None
    assert read_cgroup(31337, tmp_path) is None
    assert read_oom_score_adj(31337, tmp_path) is None
    assert read_smaps_rollup(31337, tmp_path) is None


def test_esrch_while_reading_counts_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_proc(tmp_path, 8)

    def esrch(fd: int, size: int) -> bytes:
        raise ProcessLookupError(errno.ESRCH, "No such process")

    monkeypatch.setattr(_cgroup, "_os_read", esrch)
    assert read_stat(8, tmp_path) is None
    assert read_cmdline(8, tmp_path) is None


# --- sizes -------------------------------------------------------------------


def test_statm_rss_in_bytes(tmp_path: Path) -> None:
    make_proc(tmp_path, 5, rss_pages=2560)
    assert read_statm_rss(5, tmp_path, page_size=4096) == 10 * 2**20
    assert read_statm_rss(5, tmp_path, page_size=16384) == 40 * 2**20


def test_smaps_rollup_in_bytes(tmp_path: Path) -> None:
    make_proc(
        tmp_path,
        6,
        smaps_kb={"Rss": 10616, "Pss": 2811, "Pss_Anon": 1200, "Anonymous": 1300, "Swap": 64},
    )
    rollup = read_smaps_rollup(6, tmp_path)
    assert rollup is not None
    assert (rollup.rss, rollup.pss, rollup.anonymous, rollup.swap) == (
        10616 * 1024,
        2811 * 1024,
        1300 * 1024,
        64 * 1024,
    )
    assert dict(rollup.fields) == {
        "Rss": 10616 * 1024,
        "Pss": 2811 * 1024,
        "Pss_Anon": 1200 * 1024,
        "Anonymous": 1300 * 1024,
        "Swap": 64 * 1024,
    }


def test_smaps_rollup_of_a_kernel_thread_is_none(tmp_path: Path) -> None:
    make_proc(tmp_path, 2, comm="kthreadd", cmdline=(), rss_pages=0)
    (tmp_path / "2" / "smaps_rollup").write_bytes(b"")
    assert read_smaps_rollup(2, tmp_path) is None


def test_another_users_smaps_rollup_and_wchan_are_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_proc(tmp_path, 9, smaps_kb={"Rss": 4})
    real_open = _cgroup._os_open

    def denied(file: str | Path, flags: int) -> int:
        if Path(file).name in ("smaps_rollup", "wchan"):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, flags)

    monkeypatch.setattr(_cgroup, "_os_open", denied)
    assert read_smaps_rollup(9, tmp_path) is None
    assert read_wchan(9, tmp_path) is None
    assert read_stat(9, tmp_path) is not None
    # Denial is only "unknown" for detail files: stat must not hide it.
    monkeypatch.setattr(
        _cgroup,
        "_os_open",
        lambda f, flags: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no", str(f))),
    )
    with pytest.raises(PermissionError):
        read_stat(9, tmp_path)


# --- names, cgroup, wchan, oom_score_adj ---------------------------------


def test_cmdline_short_form(tmp_path: Path) -> None:
    make_proc(tmp_path, 10, cmdline=["python3", "-m", "agent", "--task", "x" * 200])
    full = read_cmdline(10, tmp_path, max_len=300)
    assert full == "python3 -m agent --task " + "x" * 200
    short = read_cmdline(10, tmp_path, max_len=30)
    assert short is not None
    assert len(short) == 30
    assert short.endswith("...")


def test_cmdline_of_a_kernel_thread_is_empty(tmp_path: Path) -> None:
    make_proc(tmp_path, 2, comm="kthreadd", cmdline=())
    assert read_cmdline(2, tmp_path) == ""


def test_cgroup_v2_line(tmp_path: Path) -> None:
    make_proc(tmp_path, 11, cgroup=f"{AGENTS}/agentscope-f-alice-1a2b3c.scope")
    assert read_cgroup(11, tmp_path) == f"{AGENTS}/agentscope-f-alice-1a2b3c.scope"


def test_cgroup_of_a_zombie_whose_scope_was_removed(tmp_path: Path) -> None:
    make_proc(tmp_path, 12)
    (tmp_path / "12" / "cgroup").write_text("0::/app.slice/x.scope (deleted)\n")
    assert read_cgroup(12, tmp_path) == "/app.slice/x.scope"


def test_cgroup_on_a_v1_only_host(tmp_path: Path) -> None:
    make_proc(tmp_path, 13, cgroup=None)
    assert read_cgroup(13, tmp_path) is None


def test_wchan(tmp_path: Path) -> None:
    make_proc(tmp_path, 14, wchan="mem_cgroup_handle_over_high")
    make_proc(tmp_path, 15, wchan="0")  # another user's, or running
    assert read_wchan(14, tmp_path) == "mem_cgroup_handle_over_high"
    assert read_wchan(15, tmp_path) is None


def test_oom_score_adj(tmp_path: Path) -> None:
    make_proc(tmp_path, 16, oom_score_adj=800)
    make_proc(tmp_path, 17, oom_score_adj=-1000)
    assert read_oom_score_adj(16, tmp_path) == 800
    assert read_oom_score_adj(17, tmp_path) == -1000


# --- host memory -------------------------------------------------------------


def test_meminfo_in_bytes(tmp_path: Path) -> None:
    make_meminfo(
        tmp_path, total_kb=2_000_000, available_kb=150_000, swap_total_kb=0, swap_free_kb=0
    )
    info = read_meminfo(tmp_path)
    assert info == MemInfo(2_000_000 * 1024, 150_000 * 1024, 0, 0)
    assert info.available_fraction == pytest.approx(0.075)


def test_meminfo_without_memavailable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:  1000 kB\nMemFree:  10 kB\n")
    with pytest.raises(ValueError, match="MemAvailable"):
        read_meminfo(tmp_path)


def test_host_pressure(tmp_path: Path) -> None:
    make_host_pressure(tmp_path, format_pressure((15.0, 5.0, 1.0, 123), (2.0, 1.0, 0.0, 45)))
    pressure = host_pressure(tmp_path)
    assert pressure is not None
    assert pressure.some.avg10 == 15.0
    assert pressure.full is not None


def test_host_without_psi(tmp_path: Path) -> None:
    assert host_pressure(tmp_path) is None


def test_iter_pids_lists_processes_only(tmp_path: Path) -> None:
    for pid in (1, 42, 1000):
        make_proc(tmp_path, pid)
    (tmp_path / "self").mkdir()
    (tmp_path / "sys").mkdir()
    make_meminfo(tmp_path)
    assert sorted(iter_pids(tmp_path)) == [1, 42, 1000]


# --- top_processes ---------------------------------------------------------


def test_top_processes_names_the_largest_and_their_agents(tmp_path: Path) -> None:
    make_proc(tmp_path, 1, comm="systemd", rss_pages=3000, cgroup="/init.scope")
    make_proc(tmp_path, 2, comm="kthreadd", cmdline=(), rss_pages=0, cgroup="/")
    make_proc(
        tmp_path,
        100,
        comm="node",
        cmdline=["node", "agent.js"],
        rss_pages=250_000,
        cgroup=f"{AGENTS}/agentscope-f-alice-1a2b3c.scope",
        start_time=5000,
    )
    make_proc(
        tmp_path,
        200,
        comm="python3",
        rss_pages=100_000,
        cgroup=f"{AGENTS}/agentscope-f-bob-4d5e6f.scope",
    )
    make_proc(tmp_path, 300, comm="firefox", rss_pages=150_000, cgroup="/user.slice/x.scope")
    top = top_processes(3, tmp_path, agent_of, page_size=PAGE)
    assert [(p.pid, p.comm, p.agent) for p in top] == [
        (100, "node", "alice"),
        (300, "firefox", None),
        (200, "python3", "bob"),
    ]
    assert top[0].rss == 250_000 * PAGE
    assert top[0].cmdline == "node agent.js"
    assert top[0].start_time == 5000
    assert json.loads(json.dumps(top[0].to_dict()))["agent"] == "alice"


def test_top_processes_steps_past_processes_that_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for pid, pages in ((10, 900), (20, 800), (30, 700), (40, 600)):
        make_proc(tmp_path, pid, comm=f"p{pid}", rss_pages=pages)
    # pid 10 exits after its statm was read, before its stat is.
    import agentscope_systemd._kernel._proc as proc

    real = proc.read_statm_rss

    def statm_then_exit(pid: int, root: Path, *, page_size: int) -> int | None:
        rss = real(pid, root, page_size=page_size)
        if pid == 10:
            shutil.rmtree(root / "10")
        return rss

    monkeypatch.setattr(proc, "read_statm_rss", statm_then_exit)
    top = top_processes(2, tmp_path, page_size=PAGE)
    assert [p.pid for p in top] == [20, 30]
    assert all(p.agent is None for p in top)


def test_top_processes_when_fewer_exist(tmp_path: Path) -> None:
    make_proc(tmp_path, 1, rss_pages=10)
    assert [p.pid for p in top_processes(5, tmp_path, page_size=PAGE)] == [1]
    assert top_processes(0, tmp_path) == []


def test_kernel_thread_shows_its_comm_for_cmdline(tmp_path: Path) -> None:
    # A process that emptied its argv but has memory (rare, but seen with daemons).
    make_proc(tmp_path, 3, comm="weird", cmdline=(), rss_pages=10)
    assert top_processes(1, tmp_path, page_size=PAGE)[0].cmdline == "[weird]"


# --- OOM attribution ---------------------------------------------------------


def seen(pid: int, comm: str, rss: int, start_time: int = 1000) -> SeenProcess:
    return SeenProcess(pid=pid, start_time=start_time, comm=comm, rss=rss)


def test_oom_victim_is_the_largest_process_that_left() -> None:
    previous = {
        10: seen(10, "bash", 5 * 2**20),
        11: seen(11, "python3", 900 * 2**20),
        12: seen(12, "rg", 80 * 2**20),
    }
    victims = oom_victims(previous, {10: 1000, 12: 1000}, oom_kill_delta=1)
    assert [v.comm for v in victims] == ["python3"]


def test_oom_victims_limited_to_the_kill_count() -> None:
    previous = {pid: seen(pid, f"w{pid}", pid * 100) for pid in range(1, 6)}
    victims = oom_victims(previous, {1: 1000}, oom_kill_delta=2)
    assert [v.pid for v in victims] == [5, 4]
    assert oom_victims(previous, {1: 1000}, oom_kill_delta=0) == ()


def test_reused_pid_is_not_taken_for_the_survivor() -> None:
    previous = {10: seen(10, "python3", 900, start_time=1000), 11: seen(11, "sh", 1)}
    # pid 10 was killed and reused by a new process (new start time).
    victims = oom_victims(previous, {10: 2000, 11: 1000}, oom_kill_delta=1)
    assert [v.comm for v in victims] == ["python3"]
    # With bare pids the reuse cannot be seen; the small one is all that left.
    assert [v.comm for v in oom_victims(previous, {10}, oom_kill_delta=1)] == ["sh"]


def test_no_victims_when_nobody_left() -> None:
    previous = {10: seen(10, "python3", 900)}
    assert oom_victims(previous, {10: 1000}, oom_kill_delta=1) == ()


@given(
    st.dictionaries(st.integers(1, 500), st.integers(0, 2**40), max_size=30),
    st.sets(st.integers(1, 500)),
    st.integers(0, 40),
)
def test_oom_victims_properties(sizes: dict[int, int], alive: set[int], delta: int) -> None:
    previous = {pid: seen(pid, "x", rss) for pid, rss in sizes.items()}
    victims = oom_victims(previous, {pid: 1000 for pid in alive}, delta)
    left = [p for p in previous.values() if p.pid not in alive]
    assert len(victims) == min(delta, len(left))
    assert all(v.pid not in alive for v in victims)
    assert [v.rss for v in victims] == sorted((v.rss for v in victims), reverse=True)
    if victims:
        assert victims[0].rss == max(p.rss for p in left)


def test_counter_delta() -> None:
    assert counter_delta(3, 5) == 2
    assert counter_delta(None, 5) == 0
    assert counter_delta(5, 1) == 1  # a new cgroup of the same name


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[ 1234.567890] Out of memory: Killed process 1234 (python3) total-vm:2048kB, "
            "anon-rss:1024kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:40kB "
            "oom_score_adj:800",
            (1234, "python3", False),
        ),
        (
            "Nov 29 12:00:00 host kernel: Memory cgroup out of memory: Killed process 99 "
            "(tmux: server) total-vm:100kB, anon-rss:1kB",
            (99, "tmux: server", True),
        ),
        (
            "Memory cgroup out of memory: Killed process 7 (a) b (c) total-vm:1kB",
            (7, "a) b (c", True),
        ),
        ("Out of memory: Killed process 8 (node)", (8, "node", False)),
    ],
)
def test_kernel_oom_lines(line: str, expected: tuple[int, str, bool]) -> None:
    kill = parse_oom_kill_line(line)
    assert kill is not None
    assert (kill.pid, kill.comm, kill.memcg) == expected


@pytest.mark.parametrize(
    "line",
    [
        "oom_reaper: reaped process 1234 (python3), now anon-rss:0kB, file-rss:0kB",
        "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "Killed process 12 (sh) total-vm:1kB",  # no OOM prefix: not the OOM killer
        "Out of memory: Killed process abc (sh) total-vm:1kB",
        "",
    ],
)
def test_other_kernel_lines_are_not_kills(line: str) -> None:
    assert parse_oom_kill_line(line) is None


# --- pressure window -----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def calm() -> PressureSample:
    return PressureSample(some_avg10=0.5, available_fraction=0.6)


def test_one_event_per_window_with_its_worst_sample() -> None:
    clock = Clock()
    window = PressureWindow(30.0, clock=clock)
    events = []
    for avg10 in (12.0, 40.0, 25.0, 11.0):  # four high samples within 30 s
        events.append(window.add(PressureSample(avg10, 0.5)))
        clock.now += 5
    assert events == [None, None, None, None]
    clock.now = 131.0
    event = window.add(calm())
    assert event is not None
    assert event.worst.some_avg10 == 40.0
    assert event.worst.at == 105.0
    assert (event.started, event.samples) == (100.0, 4)
    assert window.add(calm()) is None  # nothing more until pressure returns


def test_sustained_pressure_gives_one_event_per_window() -> None:
    clock = Clock()
    window = PressureWindow(30.0, clock=clock)
    events = []
    for _ in range(91):  # one sample a second for 90 s
        event = window.add(PressureSample(20.0, 0.5))
        if event is not None:
            events.append(event)
        clock.now += 1
    assert len(events) == 3
    assert [e.started for e in events] == [100.0, 130.0, 160.0]


def test_calm_samples_give_no_event() -> None:
    clock = Clock()
    window = PressureWindow(30.0, clock=clock)
    for _ in range(100):
        assert window.add(calm()) is None
        clock.now += 1
    assert window.flush() is None


def test_low_memavailable_alone_is_pressure() -> None:
    clock = Clock()
    window = PressureWindow(30.0, clock=clock)
    window.add(PressureSample(some_avg10=0.0, available_fraction=0.08))
    window.add(PressureSample(some_avg10=0.0, available_fraction=0.03))
    window.add(PressureSample(some_avg10=0.0, available_fraction=0.09))
    clock.now += 30
    event = window.poll()
    assert event is not None
    assert event.worst.available_fraction == 0.03


def test_thresholds_are_configurable() -> None:
    clock = Clock()
    window = PressureWindow(10.0, some_avg10_threshold=50.0, available_threshold=0.02, clock=clock)
    window.add(PressureSample(some_avg10=40.0, available_fraction=0.05))
    clock.now += 11
    assert window.poll() is None
    window.add(PressureSample(some_avg10=50.0, available_fraction=0.05))
    clock.now += 11
    assert window.poll() is not None


def test_flush_reports_an_unfinished_window() -> None:
    clock = Clock()
    window = PressureWindow(30.0, clock=clock)
    window.add(PressureSample(15.0, 0.5))
    clock.now += 3
    assert window.poll() is None
    event = window.flush()
    assert event is not None
    assert (event.started, event.ended) == (100.0, 103.0)
    assert window.flush() is None


def test_sample_from_host_readings(tmp_path: Path) -> None:
    make_meminfo(tmp_path, total_kb=1000, available_kb=50)
    make_host_pressure(tmp_path, format_pressure((22.0, 1.0, 0.0, 9)))
    sample = PressureSample.from_readings(host_pressure(tmp_path), read_meminfo(tmp_path))
    assert (sample.some_avg10, sample.available_fraction) == (22.0, 0.05)
    assert PressureWindow().is_high(sample)


@pytest.mark.parametrize(
    "kwargs", [{"window": 0}, {"some_avg10_threshold": 0}, {"available_threshold": 1.5}]
)
def test_nonsense_window_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        PressureWindow(**kwargs)  # type: ignore[arg-type]


# --- throttling ------------------------------------------------------------


def throttle_tree(tmp_path: Path, *, slice_high: int | None, scope_high: int | None) -> Path:
    cgroups = tmp_path / "cgroup"
    make_cgroup_root(cgroups)
    make_cgroup(cgroups, "app.slice")
    make_cgroup(cgroups, "app.slice/app-agentscope.slice")
    make_cgroup(cgroups, AGENTS, high=slice_high)
    return make_cgroup(cgroups, f"{AGENTS}/agentscope-f-alice-1a2b3c.scope", high=scope_high)


def events(high: int) -> MemoryEvents:
    return MemoryEvents(low=0, high=high, max=0, oom=0, oom_kill=0, oom_group_kill=0)


def test_throttle_by_the_slices_memory_high(tmp_path: Path) -> None:
    scope = throttle_tree(tmp_path, slice_high=2**30, scope_high=None)
    proc = tmp_path / "proc"
    make_proc(proc, 50, state="D", wchan="mem_cgroup_handle_over_high")
    make_proc(proc, 51, state="D", wchan="folio_wait_bit_common")  # disk I/O, not throttling
    make_proc(proc, 52, state="S", wchan="do_select")
    # The kernel counts `high` on the slice over its limit, not on the scope.
    throttle = detect_throttle(
        scope,
        events(0),
        events(0),
        [50, 51, 52, 53],  # 53 already exited
        cgroup_root=tmp_path / "cgroup",
        proc_root=proc,
    )
    assert throttle is not None
    assert throttle.pids == (50,)
    assert throttle.high_delta == 0
    assert throttle.limit is not None
    assert throttle.limit.unit == "app-agentscope-agents.slice"
    assert json.loads(json.dumps(throttle.to_dict()))["limit"]["high"] == 2**30


def test_throttle_by_the_scopes_own_high_with_hidden_wchan(tmp_path: Path) -> None:
    scope = throttle_tree(tmp_path, slice_high=None, scope_high=32 * 2**20)
    proc = tmp_path / "proc"
    make_proc(proc, 60, state="D", wchan="0")  # another user's process: wchan hidden
    throttle = detect_throttle(
        scope, events(100), events(117), [60], cgroup_root=tmp_path / "cgroup", proc_root=proc
    )
    assert throttle is not None
    assert throttle.high_delta == 17
    assert throttle.pids == ()
    assert throttle.limit is not None
    assert throttle.limit.unit == "agentscope-f-alice-1a2b3c.scope"


def test_no_throttle_without_either_sign(tmp_path: Path) -> None:
    scope = throttle_tree(tmp_path, slice_high=2**30, scope_high=None)
    proc = tmp_path / "proc"
    make_proc(proc, 70, state="D", wchan="folio_wait_bit_common")
    assert (
        detect_throttle(
            scope, events(4), events(4), [70], cgroup_root=tmp_path / "cgroup", proc_root=proc
        )
        is None
    )
    # First sample: no previous events to compare with.
    assert (
        detect_throttle(
            scope, None, events(4), [70], cgroup_root=tmp_path / "cgroup", proc_root=proc
        )
        is None
    )


def test_is_throttled() -> None:
    assert is_throttled("D", "mem_cgroup_handle_over_high")
    assert is_throttled("D", "__mem_cgroup_handle_over_high")
    assert not is_throttled("S", "mem_cgroup_handle_over_high")
    assert not is_throttled("D", None)


def test_a_stat_line_is_split_in_one_place() -> None:
    # One /proc/PID/stat reader: _statline.split_stat, under parse_stat and
    # under exec's fast-path start time (_spool.start_time). A split written
    # anywhere else looks for the comm's closing b")" itself.
    import ast

    from agentscope_systemd._kernel import _statline
    from agentscope_systemd._registry import _spool

    package = Path(_statline.__file__).parent.parent
    splits = [
        path.relative_to(package).as_posix()
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == b")"
    ]
    assert splits == ["_kernel/_statline.py"]
    me = read_stat(os.getpid())
    assert me is not None
    assert _spool.start_time(os.getpid()) == me.start_time
