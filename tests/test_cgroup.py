"""cgroup v2 readers and parsers, over fake cgroupfs trees."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from fakefs import format_memory_events, format_pressure, make_cgroup, make_cgroup_root, write
from hypothesis import given
from hypothesis import strategies as st

from agentscope_systemd._kernel import _cgroup
from agentscope_systemd._kernel._cgroup import (
    MemoryEvents,
    PressureLine,
    cgroup_path_for_unit,
    cgroup_v2_mounted,
    find_limit_holders,
    memory_controller_enabled,
    parse_limit,
    parse_memory_events,
    parse_memory_stat,
    parse_pressure,
    parse_procs,
    read_cgroup_memory,
    read_scope_counters,
    scan_slice,
    scan_slice_counters,
    user_manager_cgroup,
)

AGENTS = "app.slice/app-agentscope.slice/app-agentscope-agents.slice"
SCOPE = "agentscope-fleet-alice-1a2b3c.scope"

# --- memory.events ---------------------------------------------------------


def test_memory_events_from_a_6_12_kernel() -> None:
    events = parse_memory_events(b"low 0\nhigh 17\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n")
    assert events == MemoryEvents(low=0, high=17, max=4, oom=2, oom_kill=1, oom_group_kill=0)


def test_memory_events_before_5_17_have_no_group_kill() -> None:
    events = parse_memory_events(b"low 0\nhigh 0\nmax 0\noom 3\noom_kill 3\n")
    assert events.oom_kill == 3
    assert events.oom_group_kill is None


def test_memory_events_ignore_counters_of_newer_kernels() -> None:
    data = b"low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\noom_group_kill 0\nsock_throttled 9\n"
    assert parse_memory_events(data).oom_kill == 2


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"low 0\nhigh 0\nmax 0\noom 0\n", "oom_kill"),
        (b"low 0\nhigh x\nmax 0\noom 0\noom_kill 0\n", "not an integer"),
        (b"", "missing"),
    ],
)
def test_memory_events_that_are_not_memory_events_are_refused(data: bytes, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_memory_events(data)


counters = st.integers(min_value=0, max_value=2**63 - 1)


@given(
    st.builds(
        MemoryEvents,
        low=counters,
        high=counters,
        max=counters,
        oom=counters,
        oom_kill=counters,
        oom_group_kill=st.none() | counters,
    )
)
def test_memory_events_round_trip(events: MemoryEvents) -> None:
    assert parse_memory_events(format_memory_events(events)) == events


def test_memory_events_serialize_to_json() -> None:
    events = parse_memory_events(b"low 0\nhigh 1\nmax 2\noom 3\noom_kill 4\n")
    assert json.loads(json.dumps(events.to_dict())) == {
        "low": 0,
        "high": 1,
        "max": 2,
        "oom": 3,
        "oom_kill": 4,
        "oom_group_kill": None,
    }


# --- memory.stat, memory.pressure, cgroup.procs, limits -------------------


def test_memory_stat_keeps_anon_file_and_every_field() -> None:
    stat = parse_memory_stat(b"anon 1234\nfile 5678\nkernel 99\nsock 0\npgfault 42\n")
    assert (stat.anon, stat.file) == (1234, 5678)
    assert stat.fields["kernel"] == 99
    assert stat.fields["pgfault"] == 42
    with pytest.raises(TypeError):
        stat.fields["anon"] = 0  # type: ignore[index]


def test_memory_stat_without_anon_is_refused() -> None:
    with pytest.raises(ValueError, match="anon"):
        parse_memory_stat(b"file 1\nkernel 2\n")


def test_pressure_with_some_and_full() -> None:
    pressure = parse_pressure(
        b"some avg10=61.25 avg60=20.00 avg300=4.10 total=6012345\n"
        b"full avg10=30.50 avg60=10.00 avg300=2.00 total=3000000\n"
    )
    assert pressure.some == PressureLine(61.25, 20.0, 4.1, 6012345)
    assert pressure.full is not None
    assert pressure.full.avg10 == 30.5


def test_pressure_without_full_line() -> None:
    pressure = parse_pressure(b"some avg10=1.00 avg60=0.50 avg300=0.10 total=77\n")
    assert pressure.some.total == 77
    assert pressure.full is None
    assert pressure.to_dict()["full"] is None


@given(
    st.tuples(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100), st.integers(0, 2**63 - 1)),
    st.none()
    | st.tuples(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100), st.integers(0, 2**63 - 1)),
)
def test_pressure_round_trip_to_two_decimals(
    some: tuple[float, float, float, int], full: tuple[float, float, float, int] | None
) -> None:
    parsed = parse_pressure(format_pressure(some, full))
    assert parsed.some.avg10 == pytest.approx(some[0], abs=0.005)
    assert parsed.some.total == some[3]
    assert (parsed.full is None) == (full is None)
    if full is not None and parsed.full is not None:
        assert parsed.full.avg300 == pytest.approx(full[2], abs=0.005)


@pytest.mark.parametrize(
    "data", [b"", b"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", b"some avg10=1\n"]
)
def test_malformed_pressure_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="pressure"):
        parse_pressure(data)


def test_procs() -> None:
    assert parse_procs(b"12\n345\n6\n") == (12, 345, 6)
    assert parse_procs(b"") == ()


def test_limits() -> None:
    assert parse_limit(b"max\n") is None
    assert parse_limit(b"33554432\n") == 32 * 2**20


# --- read_cgroup_memory ----------------------------------------------------


def test_read_cgroup_memory_of_a_scope(tmp_path: Path) -> None:
    events = MemoryEvents(low=0, high=5, max=1, oom=1, oom_kill=1, oom_group_kill=0)
    path = make_cgroup(
        tmp_path,
        f"{AGENTS}/{SCOPE}",
        current=100 * 2**20,
        peak=150 * 2**20,
        events=events,
        stat={"anon": 90 * 2**20, "file": 10 * 2**20, "kernel": 4096},
        procs=[4242, 4243],
        pressure=format_pressure((12.5, 3.0, 1.0, 4_000_000)),
    )
    memory = read_cgroup_memory(path)
    assert memory is not None
    assert memory.current == 100 * 2**20
    assert memory.peak == 150 * 2**20
    assert memory.events == events
    assert (memory.anon, memory.file) == (90 * 2**20, 10 * 2**20)
    assert memory.pids == (4242, 4243)
    assert memory.pressure is not None
    assert memory.pressure.some.avg10 == 12.5
    assert memory.pressure.full is None
    report = json.loads(json.dumps(memory.to_dict()))
    assert report["pids"] == [4242, 4243]
    assert report["events"]["high"] == 5


def test_kernel_before_5_19_has_no_peak(tmp_path: Path) -> None:
    path = make_cgroup(tmp_path, SCOPE, current=4096, peak=None)
    memory = read_cgroup_memory(path)
    assert memory is not None
    assert memory.current == 4096
    assert memory.peak is None


def test_cgroup_removed_before_the_read(tmp_path: Path) -> None:
    assert read_cgroup_memory(tmp_path / "gone.scope") is None


def test_cgroup_losing_its_files_mid_read(tmp_path: Path) -> None:
    # memory.current read fine, then the scope went away: the rest is ENOENT.
    path = make_cgroup(tmp_path, SCOPE, current=4096, peak=8192)
    for name in ("memory.events", "memory.stat", "cgroup.procs"):
        (path / name).unlink()
    assert read_cgroup_memory(path) is None


def test_enodev_from_a_removed_cgroup_counts_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_cgroup(tmp_path, SCOPE, current=4096)
    real_open = _cgroup._os_open

    def open_then_enodev(file: str | Path, flags: int) -> int:
        if Path(file).name == "memory.events":
            raise OSError(errno.ENODEV, "No such device", str(file))
        return real_open(file, flags)

    monkeypatch.setattr(_cgroup, "_os_open", open_then_enodev)
    assert read_cgroup_memory(path) is None
    assert read_scope_counters(path) is None


def test_other_read_failures_are_not_mistaken_for_vanishing(tmp_path: Path) -> None:
    path = make_cgroup(tmp_path, SCOPE, current=4096)
    (path / "memory.stat").unlink()
    (path / "memory.stat").mkdir()  # reading a directory: EISDIR, a real failure
    with pytest.raises(IsADirectoryError):
        read_cgroup_memory(path)


def test_psi_disabled_gives_no_pressure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_cgroup(tmp_path, SCOPE, current=4096)
    real = _cgroup._read_kernel_file

    def eopnotsupp(file: Path, tolerate: frozenset[int] = _cgroup._GONE) -> bytes | None:
        if file.name == "memory.pressure":
            if errno.EOPNOTSUPP in tolerate:
                return None
            raise OSError(errno.EOPNOTSUPP, "Operation not supported", str(file))
        return real(file, tolerate)

    monkeypatch.setattr(_cgroup, "_read_kernel_file", eopnotsupp)
    memory = read_cgroup_memory(path)
    assert memory is not None
    assert memory.pressure is None


def test_root_cgroup_has_no_memory_figures(tmp_path: Path) -> None:
    root = make_cgroup_root(tmp_path)
    assert read_cgroup_memory(root) is None
    assert memory_controller_enabled(root)


# --- scan_slice ------------------------------------------------------------


def test_scan_slice_reads_each_agent_scope(tmp_path: Path) -> None:
    slice_path = make_cgroup(tmp_path, AGENTS, current=300)
    make_cgroup(tmp_path, f"{AGENTS}/agentscope-f-alice-000001.scope", current=100, procs=[10])
    make_cgroup(tmp_path, f"{AGENTS}/agentscope-f-bob-000002.scope", current=200, procs=[20])
    make_cgroup(tmp_path, f"{AGENTS}/nested.slice", current=5)  # not an agent
    scopes = scan_slice(slice_path)
    assert sorted(scopes) == [
        "agentscope-f-alice-000001.scope",
        "agentscope-f-bob-000002.scope",
    ]
    assert scopes["agentscope-f-bob-000002.scope"].current == 200
    assert scopes["agentscope-f-alice-000001.scope"].pids == (10,)


def test_scan_slice_skips_a_scope_that_vanishes(tmp_path: Path) -> None:
    slice_path = make_cgroup(tmp_path, AGENTS)
    make_cgroup(tmp_path, f"{AGENTS}/agentscope-f-alice-000001.scope", current=100)
    dying = make_cgroup(tmp_path, f"{AGENTS}/agentscope-f-bob-000002.scope", current=200)
    # Listed by the kernel, but the files are gone by the time they are read.
    for child in dying.iterdir():
        child.unlink()
    assert list(scan_slice(slice_path)) == ["agentscope-f-alice-000001.scope"]


def test_scan_of_a_slice_that_does_not_exist_is_empty(tmp_path: Path) -> None:
    assert scan_slice(tmp_path / AGENTS) == {}


def test_scan_slice_counters_reads_only_the_per_tick_files(tmp_path: Path) -> None:
    slice_path = make_cgroup(tmp_path, AGENTS, current=300)
    alice = make_cgroup(
        tmp_path,
        f"{AGENTS}/agentscope-f-alice-000001.scope",
        current=100,
        procs=[10, 11],
        events=MemoryEvents(0, 4, 0, 1, 1),
    )
    make_cgroup(tmp_path, f"{AGENTS}/agentscope-f-bob-000002.scope", current=200, procs=[20])
    dying = make_cgroup(tmp_path, f"{AGENTS}/agentscope-f-carl-000003.scope", current=1)
    (dying / "cgroup.procs").unlink()  # vanishing mid-read
    make_cgroup(tmp_path, f"{AGENTS}/nested.slice", current=5)  # not an agent
    # The report files are not needed: a sample must not read them.
    for name in ("memory.stat", "memory.peak", "memory.pressure"):
        (alice / name).unlink(missing_ok=True)
    scopes = scan_slice_counters(slice_path)
    assert list(scopes) == ["agentscope-f-alice-000001.scope", "agentscope-f-bob-000002.scope"]
    counters = scopes["agentscope-f-alice-000001.scope"]
    assert (counters.current, counters.pids) == (100, (10, 11))
    assert (counters.events.high, counters.events.oom_kill) == (4, 1)
    assert scan_slice_counters(tmp_path / "gone.slice") == {}
    write(alice / "memory.current", "lots\n")
    with pytest.raises(ValueError, match=r"memory\.current"):
        read_scope_counters(alice)


# --- paths -----------------------------------------------------------------


def test_slice_dashes_are_the_hierarchy() -> None:
    root = Path("/sys/fs/cgroup")
    assert cgroup_path_for_unit(root, "app-agentscope-agents.slice") == root / AGENTS
    assert cgroup_path_for_unit(root, "app-agentscope-agents.slice", SCOPE) == (
        root / AGENTS / SCOPE
    )
    assert cgroup_path_for_unit(root, "system.slice", "cron.service") == (
        root / "system.slice/cron.service"
    )
    assert cgroup_path_for_unit(root, "-.slice", "init.scope") == root / "init.scope"


def test_user_manager_tree() -> None:
    manager = user_manager_cgroup(1000, Path("/sys/fs/cgroup"))
    assert manager == Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service")
    assert cgroup_path_for_unit(manager, "app-agentscope-agents.slice", SCOPE) == (
        manager / AGENTS / SCOPE
    )


@pytest.mark.parametrize(
    "name", ["app-agentscope-agents", "-app.slice", "app-.slice", "app--x.slice", ".slice"]
)
def test_bad_slice_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="slice"):
        cgroup_path_for_unit(Path("/sys/fs/cgroup"), name)


def test_unit_with_a_slash_is_refused() -> None:
    with pytest.raises(ValueError, match="unit"):
        cgroup_path_for_unit(Path("/sys/fs/cgroup"), "app.slice", "../etc")


# --- limit holders -----------------------------------------------------------


def test_find_limit_holders_names_the_slice_that_throttles(tmp_path: Path) -> None:
    make_cgroup_root(tmp_path)
    make_cgroup(tmp_path, "app.slice")
    make_cgroup(tmp_path, "app.slice/app-agentscope.slice", max=8 * 2**30)
    make_cgroup(tmp_path, AGENTS, high=2 * 2**30)
    scope = make_cgroup(tmp_path, f"{AGENTS}/{SCOPE}")
    holders = find_limit_holders(tmp_path, scope)
    assert [h.unit for h in holders] == ["app-agentscope-agents.slice", "app-agentscope.slice"]
    assert holders[0].high == 2 * 2**30
    assert holders[0].max is None
    assert holders[1].max == 8 * 2**30
    assert holders[1].high is None


def test_find_limit_holders_takes_a_proc_cgroup_path(tmp_path: Path) -> None:
    make_cgroup_root(tmp_path)
    make_cgroup(tmp_path, "app.slice")
    make_cgroup(tmp_path, "app.slice/app-agentscope.slice")
    make_cgroup(tmp_path, AGENTS)
    make_cgroup(tmp_path, f"{AGENTS}/{SCOPE}", high=32 * 2**20)
    holders = find_limit_holders(tmp_path, f"/{AGENTS}/{SCOPE}")
    assert [(h.unit, h.high) for h in holders] == [(SCOPE, 32 * 2**20)]
    assert holders[0].to_dict()["unit"] == SCOPE


def test_no_limits_anywhere(tmp_path: Path) -> None:
    make_cgroup_root(tmp_path)
    make_cgroup(tmp_path, "app.slice")
    scope = make_cgroup(tmp_path, f"app.slice/{SCOPE}")
    assert find_limit_holders(tmp_path, scope) == ()


def test_limit_holders_of_a_vanished_scope_still_name_its_ancestors(tmp_path: Path) -> None:
    make_cgroup_root(tmp_path)
    make_cgroup(tmp_path, "app.slice", high=10**9)
    holders = find_limit_holders(tmp_path, f"/app.slice/{SCOPE}")
    assert [h.unit for h in holders] == ["app.slice"]


# --- hierarchy checks --------------------------------------------------------


def test_cgroup_v2_detection(tmp_path: Path) -> None:
    assert cgroup_v2_mounted(make_cgroup_root(tmp_path / "v2"))
    hybrid = tmp_path / "hybrid"
    (hybrid / "memory").mkdir(parents=True)
    (hybrid / "unified").mkdir()
    assert not cgroup_v2_mounted(hybrid)


def test_memory_controller_enabled(tmp_path: Path) -> None:
    with_memory = make_cgroup(tmp_path, "a.slice")
    without = make_cgroup(tmp_path, "b.slice", controllers="cpu pids", memory_files=False)
    assert memory_controller_enabled(with_memory)
    assert not memory_controller_enabled(without)
    assert read_cgroup_memory(without) is None
    assert not memory_controller_enabled(tmp_path / "gone.slice")


def test_to_dict_gives_plain_json_values() -> None:
    # Paths, tuples, read-only mappings and nested records all come out as
    # JSON values, so `report --json` and the events never fail to encode.
    from agentscope_systemd._kernel._cgroup import LimitHolder
    from agentscope_systemd._monitor._attribution import Throttle

    holder = LimitHolder(Path("/sys/fs/cgroup/x.slice"), 1 << 30, None)
    throttle = Throttle(Path("/sys/fs/cgroup/x.slice/a.scope"), 3, (7, 8), holder)
    assert json.loads(json.dumps(throttle.to_dict())) == {
        "cgroup": "/sys/fs/cgroup/x.slice/a.scope",
        "high_delta": 3,
        "pids": [7, 8],
        "limit": {
            "path": "/sys/fs/cgroup/x.slice",
            "unit": "x.slice",
            "high": 1 << 30,
            "max": None,
        },
    }
    stat = parse_memory_stat(b"anon 1\nfile 2\nshmem 3\n")
    assert json.loads(json.dumps(stat.to_dict())) == {
        "anon": 1,
        "file": 2,
        "fields": {"anon": 1, "file": 2, "shmem": 3},
    }
