"""The exec spool: entries, the name claim, and the registry taking them in."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentscope_systemd._managers import _exec
from agentscope_systemd._registry import _claim, _spool
from agentscope_systemd._registry._registry import Registry, default_registry_path

ME = os.getpid()
MY_START = _spool.start_time(ME)
assert MY_START is not None


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def entry(
    tmp_path: Path, name: str = "builder", pid: int = ME, start: int | None = None, **kw: object
) -> _spool.Entry:
    unit = str(kw.get("unit", f"agentscope-f-{name}-abc123.scope"))
    return _spool.Entry(
        "f",
        name,
        unit,
        pid,
        MY_START if start is None else start,
        1_700_000_000.5,
        str(tmp_path / "slice"),
        "/srv/work dir",
        ["sh", "-c", "echo 'a b'\n", "caf\u00e9", os.fsdecode(b"\xff")],
    )


def test_an_entry_reads_back_whole(tmp_path: Path) -> None:
    e = entry(tmp_path)
    back = _spool.Entry.decode(e.encode())
    assert back is not None
    assert {s: getattr(back, s) for s in e.__slots__} == {s: getattr(e, s) for s in e.__slots__}


def test_the_grace_travels_in_the_entry_and_version_1_still_reads(tmp_path: Path) -> None:
    kept = entry(tmp_path)
    kept.reap_after = None
    back = _spool.Entry.decode(kept.encode())
    assert back is not None
    assert back.reap_after is None
    assert back.argv == kept.argv  # the grace sits before argv, never in it
    for grace in (1.5, 0.0, 1e-05, 604800.0):
        quick = entry(tmp_path)
        quick.reap_after = grace
        decoded = _spool.Entry.decode(quick.encode())
        assert decoded is not None, grace
        assert decoded.reap_after == pytest.approx(grace, abs=1e-6)
    fields = [
        b"agentscope-spool-1",
        b"f",
        b"n",
        b"agentscope-f-n-a1b2c3.scope",
        b"1",
        b"2",
        b"3.0",
        b"/s",
        b"/w",
    ]
    old = _spool.Entry.decode(b"\0".join([*fields, b"sleep", b"9"]))
    assert old is not None
    assert (old.reap_after, old.argv) == (10.0, ["sleep", "9"])


def test_an_execs_grace_reaches_its_row(tmp_path: Path, registry: Registry) -> None:
    e = entry(tmp_path)
    e.reap_after = None
    (tmp_path / "slice" / e.unit).mkdir()
    assert _spool.claim(spool_of(registry), e) is not None
    (row,) = registry.agents("f")
    assert row.reap_after is None


@pytest.mark.parametrize("data", [b"", b"junk", b"agentscope-spool-1\0f\0n", b"x\0" * 12])
def test_what_is_not_an_entry_reads_as_none(data: bytes) -> None:
    assert _spool.Entry.decode(data) is None


def test_a_name_is_claimed_once_while_its_process_lives(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    first = _spool.claim(spool, entry(tmp_path))
    assert first == f"{spool}/f+builder"
    again = entry(tmp_path, unit="agentscope-f-builder-def456.scope")
    assert _spool.claim(spool, again) is None
    assert os.listdir(spool) == ["f+builder"]  # no draft left behind
    read = _spool.read(first)
    assert read is not None
    assert read.unit == "agentscope-f-builder-abc123.scope"


def test_a_name_held_by_an_ended_process_is_freed(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool")
    _spool.claim(spool, entry(tmp_path, pid=_dead_pid(), start=1))
    second = entry(tmp_path, unit="agentscope-f-builder-def456.scope")
    assert _spool.claim(spool, second) == f"{spool}/f+builder"
    # The ended launch waits under its unit's name for the registry.
    assert sorted(os.listdir(spool)) == ["agentscope-f-builder-abc123.scope", "f+builder"]


def test_pending_is_empty_without_a_spool(tmp_path: Path) -> None:
    assert _spool.pending(str(tmp_path / "none")) == []


def test_the_spool_sits_next_to_the_default_registry() -> None:
    env = {"XDG_STATE_HOME": "/state", "HOME": "/home/u"}
    assert _spool.state_dir("user", env) == str(default_registry_path("user", env).parent)
    assert _spool.state_dir("user", {"XDG_STATE_HOME": "rel", "HOME": "/h"}) == (
        "/h/.local/state/agentscope"
    )
    assert _spool.state_dir("system") == "/var/lib/agentscope"


# -- the registry takes entries in ---------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    (tmp_path / "slice").mkdir()
    reg = Registry(tmp_path / "state" / "agentscope.db")
    yield reg
    reg.close()


def spool_of(registry: Registry) -> str:
    return _spool.spool_dir(registry.path)


def test_a_running_exec_becomes_a_running_row(tmp_path: Path, registry: Registry) -> None:
    e = entry(tmp_path)
    (tmp_path / "slice" / e.unit).mkdir()
    assert _spool.claim(spool_of(registry), e) is not None
    (row,) = registry.agents("f")
    assert (row.name, row.unit, row.pid, row.start_time) == ("builder", e.unit, ME, MY_START)
    assert (row.state, row.created, row.cwd, list(row.argv)) == (
        "running",
        e.created,
        e.cwd,
        e.argv,
    )
    (event,) = registry.events("f")
    assert (event.kind, event.ts, event.detail["via"], event.detail["unit"]) == (
        "adopted",
        e.created,
        "exec",
        e.unit,
    )
    assert _spool.pending(spool_of(registry)) == []


def test_an_exec_still_starting_is_left_to_its_process(tmp_path: Path, registry: Registry) -> None:
    e = entry(tmp_path)
    _spool.claim(spool_of(registry), e)
    assert registry.agents("f") == []
    assert len(_spool.pending(spool_of(registry))) == 1
    (tmp_path / "slice" / e.unit).mkdir()  # its scope is there now
    assert [r.state for r in registry.agents("f")] == ["running"]


def test_an_exec_that_ended_unseen_is_lost(tmp_path: Path, registry: Registry) -> None:
    _spool.claim(spool_of(registry), entry(tmp_path, pid=_dead_pid(), start=1))
    (row,) = registry.agents("f", include_closed=True)
    assert row.state == "lost"
    assert [e.kind for e in registry.events("f")] == ["adopted", "lost"]


def test_a_stale_row_of_the_name_is_closed_first(tmp_path: Path, registry: Registry) -> None:
    old = registry.record_launch("f", "builder", "agentscope-f-builder-000000.scope", 1, 1, [], "")
    e = entry(tmp_path)
    (tmp_path / "slice" / e.unit).mkdir()
    _spool.claim(spool_of(registry), e)
    rows = {r.unit: r.state for r in registry.agents("f", include_closed=True)}
    assert rows == {old.unit: "lost", e.unit: "running"}


def test_a_live_agent_of_the_name_keeps_it(tmp_path: Path, registry: Registry) -> None:
    old = registry.record_launch("f", "builder", "agentscope-f-builder-000000.scope", 1, 1, [], "")
    (tmp_path / "slice" / old.unit).mkdir()
    e = entry(tmp_path)
    (tmp_path / "slice" / e.unit).mkdir()
    _spool.claim(spool_of(registry), e)
    assert [(r.unit, r.state) for r in registry.agents("f")] == [(old.unit, "starting")]
    assert _spool.pending(spool_of(registry)) == []


def test_a_unit_recorded_already_is_not_recorded_twice(tmp_path: Path, registry: Registry) -> None:
    e = entry(tmp_path)
    (tmp_path / "slice" / e.unit).mkdir()
    registry.record_launch("f", "builder", e.unit, ME, MY_START, [], "", "running")
    _spool.claim(spool_of(registry), e)
    assert len(registry.agents("f")) == 1
    assert _spool.pending(spool_of(registry)) == []


def test_a_file_that_is_not_an_entry_is_dropped(registry: Registry) -> None:
    spool = Path(spool_of(registry))
    spool.mkdir()
    (spool / "f+junk").write_bytes(b"junk")
    assert registry.agents("f") == []
    assert _spool.pending(str(spool)) == []


def test_an_exec_claiming_the_name_during_a_take_in_keeps_its_claim(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = spool_of(registry)
    first = entry(tmp_path, pid=_dead_pid(), start=1)  # it ended: the name is free
    assert _spool.claim(spool, first) is not None
    second = entry(tmp_path, unit="agentscope-f-builder-def456.scope")
    claimed: list[str | None] = []
    real_state = _spool.Entry.state

    def state(self: _spool.Entry) -> str:
        # The take-in has read the first entry; a second exec claims the
        # name now (freeing the first under its unit's name).
        if not claimed:
            claimed.append(_spool.claim(spool, second))
        return real_state(self)

    monkeypatch.setattr(_spool.Entry, "state", state)
    registry.agents("f")
    assert claimed == [f"{spool}/f+builder"]
    held = _spool.read(f"{spool}/f+builder")
    assert held is not None
    assert held.unit == second.unit  # the second claim holds the name
    # A third exec of the name is refused while the second runs.
    third = entry(tmp_path, unit="agentscope-f-builder-aaaaaa.scope")
    assert _spool.claim(spool, third) is None


def test_concurrent_take_ins_record_one_lost_event(tmp_path: Path, registry: Registry) -> None:
    other = Registry(registry.path)
    try:
        e = entry(tmp_path, pid=_dead_pid(), start=1)
        _spool.claim(spool_of(registry), e)
        assert [r.state for r in registry.agents("f", include_closed=True)] == ["lost"]
        # Another process that read the same entry closes the same row too.
        row = other.by_unit(e.unit)
        assert row is not None
        _claim.close_lost(other, row)
        assert [ev.kind for ev in registry.events("f")] == ["adopted", "lost"]
    finally:
        other.close()


# -- what the exec fast path checks before it goes ahead -------------------------------


def slice_dir(tmp_path: Path, **files: str) -> Path:
    d = tmp_path / "agents.slice"
    d.mkdir()
    for name, text in {"memory.high": "max\n", "memory.max": "max\n", **files}.items():
        (d / name.replace("_", ".")).write_text(text)
    return d


def test_an_ordinary_slice_lets_exec_go_ahead(tmp_path: Path) -> None:
    d = slice_dir(tmp_path, memory_swap_max="max\n")
    (d / "agentscope-a-b-c-123abc.scope").mkdir()  # fleet a, agent b-c: another agent
    (d / "agentscope-a-bb-123abc.scope").mkdir()
    _exec._check_slice(str(d), "agentscope-a-b-")


@pytest.mark.parametrize("limit", ["memory_high", "memory_max", "memory_swap_max"])
def test_a_slice_limit_sends_exec_the_slow_way(tmp_path: Path, limit: str) -> None:
    d = slice_dir(tmp_path, **{limit: "104857600\n"})
    with pytest.raises(_exec.SlowPath, match=limit.replace("_", ".")):
        _exec._check_slice(str(d), "agentscope-a-b-")


def test_a_running_agent_of_the_name_sends_exec_the_slow_way(tmp_path: Path) -> None:
    d = slice_dir(tmp_path)
    (d / "agentscope-a-b-123abc.scope").mkdir()
    with pytest.raises(_exec.SlowPath, match="a scope of that name runs"):
        _exec._check_slice(str(d), "agentscope-a-b-")


def test_a_missing_slice_sends_exec_the_slow_way(tmp_path: Path) -> None:
    with pytest.raises(_exec.SlowPath, match="cannot read the agents slice"):
        _exec._check_slice(str(tmp_path / "none"), "agentscope-a-b-")


def test_a_spool_exec_cannot_write_sends_it_the_slow_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "spool").write_text("not a directory")
    d = slice_dir(tmp_path)
    monkeypatch.setattr(_exec._scope, "slice_cgroup", lambda manager, slice: str(d))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (tmp_path / "agentscope").symlink_to(state)
    with pytest.raises(_exec.SlowPath, match="cannot write the registry's spool"):
        _exec.adopt_self("f", "a", ["true"], manager="user")


def test_exec_before_any_registry_takes_the_slow_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = slice_dir(tmp_path)
    monkeypatch.setattr(_exec._scope, "slice_cgroup", lambda manager, slice: str(d))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "fresh"))
    with pytest.raises(_exec.SlowPath, match="no registry yet"):
        _exec.adopt_self("f", "a", ["true"], manager="user")
    assert not (tmp_path / "fresh").exists()  # the slow path creates it, with its modes


def test_a_full_spool_sends_exec_the_slow_way_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = slice_dir(tmp_path)
    monkeypatch.setattr(_exec._scope, "slice_cgroup", lambda manager, slice: str(d))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    spool = tmp_path / "agentscope" / "spool"
    spool.mkdir(parents=True)
    for i in range(_spool.MAX_PENDING):
        (spool / f"agentscope-f-a-{i:06x}.scope").write_bytes(b"")
    with pytest.raises(_exec.SlowPath, match="launches wait in the spool"):
        _exec.adopt_self("f", "a", ["true"], manager="user")
    registry = Registry(tmp_path / "agentscope" / "agentscope.db")
    registry.agents("f")  # what the slow path's fleet does first
    registry.close()
    assert _spool.pending(str(spool)) == []


@pytest.mark.parametrize("errno_", [24, 13])  # EMFILE, EACCES
def test_an_entry_that_cannot_be_read_now_is_kept(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch, errno_: int
) -> None:
    (tmp_path / "slice" / "agentscope-f-builder-abc123.scope").mkdir()
    path = _spool.claim(spool_of(registry), entry(tmp_path))
    assert path is not None

    def unreadable(*args: object, **kwargs: object) -> None:
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(_spool, "_open_entry", unreadable)
    assert registry.agents("f") == []
    assert os.path.exists(path)  # not taken for corrupt
    assert _spool.claim(spool_of(registry), entry(tmp_path, unit="u2")) is None
    monkeypatch.undo()
    assert [a.name for a in registry.agents("f")] == ["builder"]


def test_a_draft_left_by_a_killed_claim_is_removed(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    old, fresh = spool / ".agentscope-f-a-abc123.scope", spool / ".agentscope-f-b-abc123.scope"
    old.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    os.utime(old, (1_000_000.0, 1_000_000.0))
    assert _spool.pending(str(spool)) == []
    assert sorted(os.listdir(spool)) == [fresh.name]


def test_a_row_closed_otherwise_meanwhile_keeps_that_close(registry: Registry) -> None:
    row = registry.record_launch("f", "builder", "u-b", 1, 1, [], "", "running")
    registry.set_state(row.unit, "exited", exit_status=3)
    kept = _claim.close_lost(registry, row)
    assert (kept.state, kept.exit_status) == ("exited", 3)
    assert [e.kind for e in registry.events("f")] == []


# -- a spool and a registry file no one else can plant (#31 item 5) ---------------------


def _fields(e: _spool.Entry) -> list[bytes]:
    return e.encode().split(b"\0")


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (1, b"../etc"),  # fleet: not a name
        (1, b"-f"),
        (2, b"a b"),  # agent: not a name
        (2, b""),
        (3, b"sshd.service"),  # unit: not this agent's scope
        (3, b"agentscope-f-other-abc123.scope"),
        (3, b"agentscope-f-builder-ABC123.scope"),
        (3, b"agentscope-f-builder-abc1234.scope"),
        (4, b"0"),  # pid: 1 to PID_MAX_LIMIT
        (4, b"1"[:0]),
        (4, b"99999999999"),
        (4, "\u0663".encode()),
        (4, b"-5"),
        (5, b"-1"),  # start time
        (5, "\u00b2".encode()),
        (6, b"nan"),  # created
        (6, b"inf"),
        (7, b"relative/slice"),  # slice_dir
        (7, b"/sys/fs/cgroup/../../etc"),
        (8, b"relative"),  # cwd
        (9, b"nan"),  # reap_after
    ],
)
def test_each_field_of_an_entry_is_checked_before_it_is_believed(
    tmp_path: Path, index: int, value: bytes
) -> None:
    fields = _fields(entry(tmp_path))
    fields[index] = value
    assert _spool.Entry.decode(b"\0".join(fields)) is None


def test_an_entry_under_another_agents_name_is_not_believed(
    tmp_path: Path, registry: Registry
) -> None:
    spool = Path(spool_of(registry))
    spool.mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "slice" / "agentscope-f-builder-abc123.scope").mkdir(parents=True)
    (spool / "f+reviewer").write_bytes(entry(tmp_path).encode())
    assert registry.agents("f") == []
    assert not (spool / "f+reviewer").exists()  # taken for bad, removed


def test_a_spool_of_another_user_or_writable_by_others_is_not_believed(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Path(spool_of(registry))
    spool.mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "slice" / "agentscope-f-builder-abc123.scope").mkdir(parents=True)
    (spool / "f+builder").write_bytes(entry(tmp_path).encode())
    spool.chmod(0o777)
    assert _spool.check_dir(str(spool)) == "is writable by others (mode 0777)"
    assert _spool.pending(str(spool)) == []
    assert registry.agents("f") == []
    assert "its entries are not believed" in caplog.text
    with pytest.raises(PermissionError, match="writable by others"):
        _spool.claim(str(spool), entry(tmp_path, name="other"))
    spool.chmod(0o700)
    assert [a.name for a in registry.agents("f")] == ["builder"]


def test_a_spool_that_is_a_link_is_not_believed(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (tmp_path / "spool").symlink_to(real)
    assert _spool.check_dir(str(tmp_path / "spool")) is not None
    assert _spool.pending(str(tmp_path / "spool")) == []


def test_a_spool_of_another_owner_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "spool").mkdir(mode=0o700)
    monkeypatch.setattr(_spool.os, "geteuid", lambda: os.getuid() + 1)
    assert "belongs to uid" in (_spool.check_dir(str(tmp_path / "spool")) or "")


def test_a_fifo_in_the_spool_is_no_entry_and_does_not_hang(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    os.mkfifo(spool / "f+builder")
    held = _spool.read_held(str(spool / "f+builder"))
    assert held is not None
    assert held[0] is None


def test_a_claim_on_a_full_disk_leaves_no_draft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, os.strerror(28))  # ENOSPC

    monkeypatch.setattr(_spool.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        _spool.claim(str(spool), entry(tmp_path))
    assert list(spool.iterdir()) == []


def test_a_short_write_is_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = tmp_path / "spool"
    real = os.write
    monkeypatch.setattr(_spool.os, "write", lambda fd, data: real(fd, data[:7]))
    path = _spool.claim(str(spool), entry(tmp_path))
    monkeypatch.undo()
    assert path is not None
    assert _spool.read(path) is not None


@pytest.mark.parametrize("side", ["", "-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", ["fifo", "dir", "socket"])
def test_a_registry_file_that_is_not_regular_is_refused_at_once(
    tmp_path: Path, side: str, kind: str
) -> None:
    import socket

    from agentscope_systemd import RegistryError

    db = tmp_path / "r.db"
    odd = tmp_path / f"r.db{side}"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "dir":
        odd.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(odd))
        sock.close()
    with pytest.raises(RegistryError, match=r"not a regular file"):
        Registry(db)  # a FIFO at <db>-wal hung this open for ever
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]  # nothing created
