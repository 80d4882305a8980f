"""Tests of the SQLite registry (agentscope_systemd/_registry/_registry.py) on the host."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentscope_systemd._errors import AgentExists, AgentscopeError
from agentscope_systemd._fleet._reconcile_plan import Revival
from agentscope_systemd._registry import (
    _registry,
    _registry_file,
    _registry_history,
    _registry_schema,
)
from agentscope_systemd._registry._registry import (
    SCHEMA_VERSION,
    AgentRecord,
    AgentState,
    InvalidTransition,
    LiveScope,
    ReconcilePlan,
    Registry,
    RegistryCorrupt,
    RegistryError,
    UnitNotFound,
    default_registry_path,
    reconcile,
)

REPO = Path(__file__).resolve().parent.parent
DAY = 86400.0

# Version 1 of the schema exactly as released. Frozen here on purpose: if a
# change edits step 1 instead of appending a step, test_migrates_from_v1 fails.
V1_SCHEMA = [
    "PRAGMA application_id = 1097290595",
    """CREATE TABLE agents (
        id INTEGER PRIMARY KEY, fleet TEXT NOT NULL, name TEXT NOT NULL,
        unit TEXT NOT NULL UNIQUE, pid INTEGER NOT NULL, start_time INTEGER NOT NULL,
        argv TEXT NOT NULL, cwd TEXT NOT NULL, created REAL NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('starting', 'running', 'frozen', 'stopping',
                                             'exited', 'failed', 'lost')),
        exit_status INTEGER, exited REAL, oom_kills INTEGER NOT NULL DEFAULT 0,
        memory_current INTEGER, memory_peak INTEGER)""",
    """CREATE UNIQUE INDEX agents_open_name ON agents (fleet, name)
        WHERE state NOT IN ('exited', 'failed', 'lost')""",
    "CREATE INDEX agents_fleet_name_created ON agents (fleet, name, created)",
    """CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,
        fleet TEXT NOT NULL, agent TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL)""",
    "CREATE INDEX events_fleet_agent_ts ON events (fleet, agent, ts)",
    "CREATE INDEX events_ts ON events (ts)",
    "PRAGMA user_version = 1",
]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "agentscope" / "agentscope.db"


@pytest.fixture
def reg(db: Path) -> Iterator[Registry]:
    with Registry(db) as r:
        yield r


def launch(
    reg: Registry,
    name: str,
    *,
    fleet: str = "ci",
    unit: str | None = None,
    pid: int = 4242,
    start_time: int = 777,
    state: AgentState = "starting",
    created: float | None = None,
) -> AgentRecord:
    unit = unit or f"agentscope-{fleet}-{name}-{abs(hash(name)) % 0xFFFFFF:06x}.scope"
    return reg.record_launch(
        fleet, name, unit, pid, start_time, ["claude", "--resume"], "/src", state, created=created
    )


def raw(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    return conn


# ------------------------------------------------------------------ paths


def test_default_path_user_honours_xdg_state_home() -> None:
    env = {"XDG_STATE_HOME": "/x/state", "HOME": "/home/u"}
    assert default_registry_path("user", env) == Path("/x/state/agentscope/agentscope.db")


@pytest.mark.parametrize("env", [{"HOME": "/home/u"}, {"HOME": "/home/u", "XDG_STATE_HOME": "rel"}])
def test_default_path_user_falls_back_to_local_state(env: dict[str, str]) -> None:
    assert default_registry_path("user", env) == Path(
        "/home/u/.local/state/agentscope/agentscope.db"
    )


def test_default_path_system() -> None:
    assert default_registry_path("system", {}) == Path("/var/lib/agentscope/agentscope.db")


def test_default_path_rejects_other_managers() -> None:
    with pytest.raises(ValueError, match="'system' or 'user'"):
        default_registry_path("session", {})  # type: ignore[arg-type]


# ------------------------------------------------------------- schema, files


def test_schema_and_pragmas(reg: Registry, db: Path) -> None:
    conn = raw(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x41675363
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema")}
        assert {"agents", "events", "agents_open_name"} <= names
    finally:
        conn.close()


def test_new_files_are_private(db: Path) -> None:
    with Registry(db) as r:
        launch(r, "a")  # a write makes the -wal and -shm files exist
        for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


def test_modes_are_fixed_on_open(db: Path) -> None:
    Registry(db).close()
    db.parent.chmod(0o755)
    db.chmod(0o644)
    Registry(db).close()
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_directory_of_the_callers_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    Registry(shared / "reg.db").close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "reg.db").stat().st_mode) == 0o600


def test_data_survives_reopen(db: Path) -> None:
    with Registry(db) as r:
        rec = launch(r, "a")
        r.record_event("ci", "a", "launched", {"argv": ["claude"]})
    with Registry(db) as r:
        assert r.by_unit(rec.unit) == rec
        assert [e.kind for e in r.events("ci")] == ["launched"]


def test_closed_registry_refuses_calls(db: Path) -> None:
    r = Registry(db)
    r.close()
    r.close()  # idempotent
    assert r.closed
    with pytest.raises(RegistryError, match="closed"):
        r.agents("ci")


# ---------------------------------------------------------------- migrations


def make_v1(path: Path) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    conn = raw(path)
    try:
        for statement in V1_SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO agents (fleet, name, unit, pid, start_time, argv, cwd, created, state)"
            " VALUES ('ci', 'old', 'u-old', 12, 34, '[\"claude\"]', '/w', 100.0, 'running')"
        )
        conn.execute(
            "INSERT INTO events (ts, fleet, agent, kind, detail)"
            " VALUES (101.0, 'ci', 'old', 'launched', '{\"pid\": 12}')"
        )
    finally:
        conn.close()


def test_migrates_from_v1(db: Path) -> None:
    make_v1(db)
    with Registry(db) as r:
        (old,) = r.agents("ci")
        assert (old.unit, old.pid, old.start_time, old.argv) == ("u-old", 12, 34, ("claude",))
        assert r.events("ci")[0].detail == {"pid": 12}
        # The rules of the current schema hold on the migrated file.
        with pytest.raises(AgentExists):
            launch(r, "old", unit="u-new")
    conn = raw(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_forward_migration_steps_run_in_order(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_v1(db)
    step2 = ("ALTER TABLE agents ADD COLUMN note TEXT", "UPDATE agents SET note = 'v2'")
    monkeypatch.setattr(_registry_schema, "_MIGRATIONS", [*_registry_schema._MIGRATIONS, step2])
    with Registry(db) as r:
        assert r.get("ci", "old") is not None
    conn = raw(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert conn.execute("SELECT note FROM agents").fetchall() == [("v2",)]
    finally:
        conn.close()


def test_newer_schema_is_refused(db: Path) -> None:
    Registry(db).close()
    conn = raw(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RegistryError, match="newer than this agentscope knows"):
        Registry(db)


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = raw(path)
    conn.execute("CREATE TABLE agents (x)")
    conn.close()
    with pytest.raises(RegistryError, match="not an agentscope registry"):
        Registry(path)


# ------------------------------------------------------------ corruption


def test_garbage_file_gives_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "agentscope.db"
    path.write_bytes(b"this is not sqlite, just garbage bytes\x00\xff" * 100)
    with pytest.raises(RegistryCorrupt) as info:
        Registry(path)
    err = info.value
    assert isinstance(err, AgentscopeError)
    assert err.path == path
    assert f"mv {path} {path}.corrupt" in str(err)
    assert "rebuild it from what systemd still runs" in str(err)


def test_truncated_database_gives_clear_error(db: Path) -> None:
    with Registry(db) as r:
        for i in range(300):
            r.record_event("ci", f"a{i}", "tick", {"pad": "x" * 200})
    size = db.stat().st_size
    assert size > 8 * 4096
    with db.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(RegistryCorrupt, match=r"move it aside: mv .*agentscope\.db"):
        Registry(db)


def test_damaged_page_is_caught_at_open(db: Path) -> None:
    with Registry(db) as r:
        for i in range(300):
            r.record_event("ci", f"a{i}", "tick", {"pad": "x" * 200})
    pages = db.stat().st_size // 4096
    with db.open("r+b") as f:  # the schema page survives; a leaf of events does not
        f.seek((pages - 1) * 4096)
        f.write(b"\xa5" * 4096)
    with pytest.raises(RegistryCorrupt, match=f"Page {pages}.*mv {db} {db}.corrupt"):
        Registry(db)


def test_unopenable_path_gives_registry_error(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(RegistryError, match=r"dir\.db"):
        Registry(tmp_path / "dir.db")


# ------------------------------------------------------------ launches, states


def test_record_launch_returns_the_stored_row(reg: Registry) -> None:
    rec = reg.record_launch(
        "ci", "a", "u-a", 99, 123456, ["claude", "-p", "x y"], "/w", created=50.0
    )
    assert rec.to_dict() == {
        "id": rec.id,
        "fleet": "ci",
        "name": "a",
        "unit": "u-a",
        "pid": 99,
        "start_time": 123456,
        "argv": ["claude", "-p", "x y"],
        "cwd": "/w",
        "created": 50.0,
        "state": "starting",
        "exit_status": None,
        "exited": None,
        "oom_kills": 0,
        "memory_current": None,
        "memory_peak": None,
        "reap_after": 10.0,
        "lingering": None,
    }
    json.dumps(rec.to_dict())
    assert reg.by_unit("u-a") == rec
    assert reg.get("ci", "a") == rec
    assert reg.by_unit("nope") is None
    assert reg.get("ci", "nope") is None


def test_launch_state_must_be_open(reg: Registry) -> None:
    with pytest.raises(ValueError, match="open state"):
        launch(reg, "a", state="exited")


@pytest.mark.parametrize(
    ("path", "final"),
    [
        (["running", "frozen", "running", "stopping", "exited"], "exited"),
        (["running", "failed"], "failed"),
        (["frozen", "stopping", "lost"], "lost"),
        (["stopping", "exited"], "exited"),
        (["lost"], "lost"),
    ],
)
def test_allowed_transitions(reg: Registry, path: list[str], final: str) -> None:
    rec = launch(reg, "a")
    for state in path:
        rec = reg.set_state(rec.unit, state)  # type: ignore[arg-type]
    assert rec.state == final
    assert reg.by_unit(rec.unit) == rec


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["stopping"], "running"),
        (["stopping"], "frozen"),
        (["running"], "starting"),
        (["exited"], "running"),
        (["failed"], "starting"),
        (["lost"], "exited"),
        (["exited"], "failed"),
    ],
)
def test_forbidden_transitions_raise_and_leave_the_row(
    reg: Registry, before: list[str], after: str
) -> None:
    rec = launch(reg, "a")
    for state in before:
        exited = 10.0 if state in ("exited", "failed", "lost") else None
        rec = reg.set_state(rec.unit, state, exited=exited)  # type: ignore[arg-type]
    with pytest.raises(InvalidTransition) as info:
        reg.set_state(rec.unit, after)  # type: ignore[arg-type]
    assert (info.value.current, info.value.requested, info.value.unit) == (
        before[-1],
        after,
        rec.unit,
    )
    assert reg.by_unit(rec.unit) == rec


def test_closing_stores_exit_and_first_close_wins(reg: Registry) -> None:
    rec = launch(reg, "a")
    before = time.time()
    closed = reg.set_state(rec.unit, "exited", exit_status=3)
    assert closed.exit_status == 3
    assert closed.exited is not None
    assert closed.exited >= before
    assert closed.closed
    again = reg.set_state(rec.unit, "exited", exit_status=0, exited=1.0)
    assert again == closed


def test_set_state_records_its_event_in_the_same_transaction(reg: Registry) -> None:
    rec = launch(reg, "a")
    running = reg.set_state(rec.unit, "running", event="launched", detail={"pid": rec.pid})
    assert running.state == "running"
    closed = reg.set_state(rec.unit, "exited", exit_status=0, event="exited", detail={"status": 0})
    assert closed.exit_status == 0
    events = reg.events(rec.fleet, agent="a")
    assert [(e.kind, e.detail) for e in events] == [
        ("launched", {"pid": rec.pid}),
        ("exited", {"status": 0}),
    ]
    # A refused move records nothing: the event goes with the state or not at all.
    with pytest.raises(InvalidTransition):
        reg.set_state(rec.unit, "running", event="launched", detail={})
    assert len(reg.events(rec.fleet, agent="a")) == 2


def test_exit_figures_need_a_closed_state(reg: Registry) -> None:
    rec = launch(reg, "a")
    with pytest.raises(ValueError, match="closed state"):
        reg.set_state(rec.unit, "running", exit_status=0)
    with pytest.raises(ValueError, match="unknown state"):
        reg.set_state(rec.unit, "zombie")  # type: ignore[arg-type]


def test_writes_to_an_unknown_unit_raise(reg: Registry) -> None:
    for call in (
        lambda: reg.set_state("ghost", "running"),
        lambda: reg.update_memory("ghost", 1, 2),
        lambda: reg.add_oom_kills("ghost", 1),
        lambda: reg.delete("ghost"),
    ):
        with pytest.raises(UnitNotFound, match="ghost"):
            call()


def test_memory_and_oom_figures(reg: Registry) -> None:
    rec = launch(reg, "a")
    assert reg.update_memory(rec.unit, 100, 200).memory_current == 100
    reg.update_memory(rec.unit, 50, None)
    reg.add_oom_kills(rec.unit, 2)
    reg.set_state(rec.unit, "failed", exit_status=-9)
    reg.add_oom_kills(rec.unit, 1)  # a late memory.events read still counts
    got = reg.by_unit(rec.unit)
    assert got is not None
    assert (got.memory_current, got.memory_peak, got.oom_kills) == (50, None, 3)
    with pytest.raises(ValueError, match="only add up"):
        reg.add_oom_kills(rec.unit, -1)


# ---------------------------------------------------------------- uniqueness


def test_one_open_row_per_name(reg: Registry) -> None:
    first = launch(reg, "a", unit="u1")
    with pytest.raises(AgentExists) as info:
        launch(reg, "a", unit="u2")
    assert (info.value.fleet, info.value.name, info.value.unit) == ("ci", "a", "u1")
    assert reg.by_unit("u2") is None
    launch(reg, "a", fleet="other", unit="u3")  # another fleet may use the name
    reg.set_state(first.unit, "exited", exit_status=0)
    second = launch(reg, "a", unit="u4")  # the name is free again once closed
    assert reg.get("ci", "a") == second
    assert [r.unit for r in reg.agents("ci", include_closed=True)] == ["u1", "u4"]
    assert [r.unit for r in reg.agents("ci")] == ["u4"]
    assert {r.unit for r in reg.agents(None)} == {"u3", "u4"}


def test_a_unit_is_recorded_once(reg: Registry) -> None:
    launch(reg, "a", unit="u1")
    with pytest.raises(RegistryError, match="already recorded") as info:
        launch(reg, "b", unit="u1")
    assert not isinstance(info.value, AgentExists)


# ---------------------------------------------------------------- events


def test_events_filters(reg: Registry) -> None:
    e1 = reg.record_event("ci", "a", "launched", {"pid": 1}, ts=10.0)
    e2 = reg.record_event("ci", "b", "oom", {"killed": 2}, ts=20.0)
    e3 = reg.record_event("ci", None, "reconciled", {"adopted": 1}, ts=30.0)
    e4 = reg.record_event("web", "a", "oom", {}, ts=40.0)
    assert reg.events() == [e1, e2, e3, e4]
    assert reg.events("ci") == [e1, e2, e3]
    assert reg.events(kind="oom") == [e2, e4]
    assert reg.events(since=20.0) == [e2, e3, e4]
    assert reg.events("ci", agent="a") == [e1]
    assert reg.events(after_id=e2.id) == [e3, e4]
    assert reg.events(limit=2) == [e1, e2]
    assert reg.events("ci", after_id=e1.id, limit=1) == [e2]
    assert e3.to_dict() == {
        "schema": "agentscope.event/1",
        "id": e3.id,
        "ts": 30.0,
        "fleet": "ci",
        "agent": None,
        "kind": "reconciled",
        "detail": {"adopted": 1},
    }
    json.dumps([e.to_dict() for e in reg.events()])


def test_follow_by_after_id_sees_each_event_once(db: Path) -> None:
    with Registry(db) as writer, Registry(db) as follower:
        seen: list[int] = []
        last = 0
        for batch in range(3):
            for i in range(batch + 1):
                writer.record_event("ci", "a", "tick", {"i": i})
            new = follower.events("ci", after_id=last)
            seen += [e.id for e in new]
            last = new[-1].id
        assert len(seen) == len(set(seen)) == 6
        assert follower.events("ci", after_id=last) == []


def test_event_detail_must_be_json(reg: Registry) -> None:
    with pytest.raises(TypeError):
        reg.record_event("ci", "a", "bad", {"x": object()})
    assert reg.events() == []


# ---------------------------------------------------------------- gc, delete


def test_gc_prunes_old_closed_rows_and_their_events(reg: Registry) -> None:
    now = 100 * DAY
    old = launch(reg, "old", unit="u-old", created=now - 20 * DAY)
    reg.record_event("ci", "old", "launched", {}, ts=now - 20 * DAY)
    reg.set_state(old.unit, "exited", exit_status=0, exited=now - 10 * DAY)
    recent = launch(reg, "recent", unit="u-recent", created=now - 20 * DAY)
    reg.record_event("ci", "recent", "launched", {}, ts=now - 20 * DAY)
    reg.set_state(recent.unit, "lost", exited=now - 1 * DAY)
    launch(reg, "running", unit="u-running", created=now - 30 * DAY)
    reg.record_event("ci", "running", "launched", {}, ts=now - 30 * DAY)
    # "a" ran long ago and was relaunched: only the old launch goes.
    a1 = launch(reg, "a", unit="u-a1", created=now - 9 * DAY)
    reg.record_event("ci", "a", "launched", {"n": 1}, ts=now - 9 * DAY)
    reg.set_state(a1.unit, "failed", exit_status=1, exited=now - 8 * DAY)
    launch(reg, "a", unit="u-a2", created=now - 7.5 * DAY)
    reg.record_event("ci", "a", "launched", {"n": 2}, ts=now - 7.5 * DAY)
    reg.record_event("ci", None, "reconciled", {}, ts=now - 8 * DAY)
    reg.record_event("ci", None, "reconciled", {}, ts=now - 1 * DAY)

    assert reg.gc(now=now) == 2
    assert {r.unit for r in reg.agents("ci", include_closed=True)} == {
        "u-recent",
        "u-running",
        "u-a2",
    }
    left = [(e.agent, e.kind, e.detail) for e in reg.events("ci")]
    assert left == [
        ("recent", "launched", {}),
        ("running", "launched", {}),
        ("a", "launched", {"n": 2}),
        (None, "reconciled", {}),
    ]
    assert reg.gc(now=now) == 0
    assert reg.gc(retention_seconds=0, now=now) == 1  # "recent" closed a day ago


def test_event_ids_are_not_reused_after_gc(reg: Registry) -> None:
    e = reg.record_event("ci", None, "x", {}, ts=1.0)
    assert reg.gc(now=100 * DAY) == 0
    assert reg.events() == []
    assert reg.record_event("ci", None, "y", {}).id > e.id


def test_delete_removes_the_row_and_its_events_only(reg: Registry) -> None:
    a1 = launch(reg, "a", unit="u1", created=10.0)
    reg.record_event("ci", "a", "launched", {"n": 1}, ts=10.0)
    reg.set_state(a1.unit, "exited", exited=11.0)
    a2 = launch(reg, "a", unit="u2", created=20.0)
    reg.record_event("ci", "a", "launched", {"n": 2}, ts=20.0)
    reg.delete(a2.unit)
    assert reg.by_unit("u2") is None
    assert reg.get("ci", "a") == reg.by_unit("u1")
    assert [e.detail for e in reg.events()] == [{"n": 1}]


# ------------------------------------------------------------- reconciliation


def rec(unit: str, pid: int, start: int, state: str = "running", name: str = "") -> AgentRecord:
    return AgentRecord(
        id=pid,
        fleet="ci",
        name=name or unit,
        unit=unit,
        pid=pid,
        start_time=start,
        argv=("claude",),
        cwd="/",
        created=1.0,
        state=state,  # type: ignore[arg-type]
        exit_status=None,
        exited=None,
        oom_kills=0,
        memory_current=None,
        memory_peak=None,
    )


def scope(unit: str, **procs: int) -> LiveScope:
    times = {int(p.lstrip("p")): t for p, t in procs.items()}
    return LiveScope(unit=unit, pids=tuple(times), start_times=times)


def test_reconcile_sorts_rows_into_the_plan() -> None:
    ok = rec("u-ok", 10, 100)
    gone = rec("u-gone", 11, 110)
    reused = rec("u-reused", 12, 120)
    headless = rec("u-headless", 13, 130)
    closed = rec("u-closed", 14, 140, state="exited")
    live = {
        "u-ok": scope("u-ok", p10=100, p99=900),
        "u-reused": scope("u-reused", p12=121),  # same pid, another process
        "u-headless": scope("u-headless", p50=500),  # leftovers only
        "u-closed": scope("u-closed", p14=140),  # closed, yet it runs: reopened
        "u-stray": scope("u-stray", p60=600),
    }
    plan = reconcile([ok, gone, reused, headless, closed], live)
    assert plan.adopt == (ok,)
    assert plan.close == (gone,)
    assert plan.reused == (reused,)
    assert plan.headless == (headless,)
    assert plan.revive == (Revival(closed, 14, 140),)
    assert [s.unit for s in plan.unknown] == ["u-stray"]
    assert plan.closures == (
        (gone, "scope-gone"),
        (reused, "pid-reused"),
        (headless, "process-gone"),
    )


def test_reconcile_never_adopts_a_reused_pid() -> None:
    row = rec("u", 10, 100)
    for start in (99, 101, 0):
        plan = reconcile([row], {"u": scope("u", p10=start)})
        assert plan.adopt == ()
        assert plan.reused == (row,)


def test_reconcile_pid_that_vanished_mid_read_is_not_adopted() -> None:
    row = rec("u", 10, 100)
    live = {"u": LiveScope("u", pids=(10,), start_times={})}
    plan = reconcile([row], live)
    assert plan.adopt == ()
    assert plan.headless == (row,)


def test_reconcile_reopens_a_closed_row_only_while_its_scope_runs() -> None:
    lost = rec("u-lost", 10, 100, state="lost")
    exited = rec("u-exited", 11, 110, state="exited")  # its first process left children
    stopping = rec("u-stopping", 12, 120, state="exited")
    empty = rec("u-empty", 13, 130, state="lost")
    live = {
        "u-lost": scope("u-lost", p10=100, p20=200),
        "u-exited": scope("u-exited", p31=310, p30=300),
        "u-stopping": LiveScope("u-stopping", (12,), {12: 120}, "deactivating"),
        "u-empty": scope("u-empty"),
    }
    plan = reconcile([lost, exited, stopping, empty], live)
    # Its own process if it runs, else the scope's first, as a found scope's.
    assert plan.revive == (Revival(lost, 10, 100), Revival(exited, 30, 300))
    # A scope being stopped keeps its row closed; an empty one is for the caller to stop.
    assert [s.unit for s in plan.unknown] == ["u-empty", "u-stopping"]
    assert plan.closures == ()
    assert reconcile([lost], {}) == ReconcilePlan()  # gone: closed stays closed


def test_reopen_moves_a_closed_row_back_to_running_once(reg: Registry) -> None:
    a = launch(reg, "a", unit="u-a", pid=10, start_time=100, state="running")
    reg.set_state(a.unit, "exited", exit_status=0, exited=50.0)
    again = reg.reopen(a.unit, 30, 300, detail={"pids": [30]})
    assert (again.state, again.pid, again.start_time) == ("running", 30, 300)
    assert (again.exit_status, again.exited) == (None, None)
    assert reg.reopen(a.unit, 30, 300) == again  # open already: as it is, no event
    (event,) = reg.events("ci", kind="reopened")
    assert event.detail == {"unit": "u-a", "pid": 30, "pids": [30], "was": "exited"}
    with pytest.raises(UnitNotFound):
        reg.reopen("u-none", 1, 1)


def test_reopen_leaves_the_name_to_its_open_row(reg: Registry) -> None:
    old = launch(reg, "a", unit="u-old", state="running")
    reg.set_state(old.unit, "lost")
    new = launch(reg, "a", unit="u-new", state="running")
    with pytest.raises(AgentExists) as info:
        reg.reopen(old.unit, 10, 100)
    assert info.value.unit == new.unit
    assert [(r.unit, r.state) for r in reg.agents("ci", include_closed=True)] == [
        ("u-old", "lost"),
        ("u-new", "running"),
    ]
    assert reg.events("ci", kind="reopened") == []


def test_reconcile_of_nothing() -> None:
    assert reconcile([], {}) == ReconcilePlan()


def test_live_scope_start_time_lookup() -> None:
    s = LiveScope("u", pids=(10, 11), start_times={10: 100, 12: 120})
    assert (s.start_time(10), s.start_time(11), s.start_time(12)) == (100, None, None)


def test_apply_closures_closes_as_lost_with_reasons(reg: Registry) -> None:
    ok = launch(reg, "ok", unit="u-ok", pid=10, start_time=100)
    gone = launch(reg, "gone", unit="u-gone", pid=11, start_time=110)
    reused = launch(reg, "reused", unit="u-reused", pid=12, start_time=120)
    raced = launch(reg, "raced", unit="u-raced", pid=13, start_time=130)
    live = {"u-ok": scope("u-ok", p10=100), "u-reused": scope("u-reused", p12=999)}
    plan = reconcile(reg.agents("ci"), live)
    assert plan.close == (gone, raced)
    # Meanwhile the monitor saw "raced" exit and knew its status: keep it.
    reg.set_state(raced.unit, "exited", exit_status=7)

    closed = reg.apply_closures(plan, now=500.0)
    assert [(r.unit, r.state, r.exited) for r in closed] == [
        ("u-gone", "lost", 500.0),
        ("u-reused", "lost", 500.0),
    ]
    raced_now = reg.by_unit(raced.unit)
    assert raced_now is not None
    assert (raced_now.state, raced_now.exit_status) == ("exited", 7)
    assert [r.unit for r in reg.agents("ci")] == [ok.unit]
    assert [(e.agent, e.detail["reason"], e.detail["pid"]) for e in reg.events(kind="lost")] == [
        ("gone", "scope-gone", 11),
        ("reused", "pid-reused", 12),
    ]
    assert reg.apply_closures(plan) == []  # applying twice changes nothing
    assert reused.unit not in {r.unit for r in reg.agents("ci")}


# ---------------------------------------------------------------- concurrency

WRITER = textwrap.dedent(
    """
    import os, sys, time
    from agentscope_systemd._registry._registry import Registry
    path, worker, go, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    while not os.path.exists(go):
        time.sleep(0.001)
    with Registry(path) as reg:
        for i in range(n):
            if i % 2 == 0:
                reg.record_launch("ci", f"w{worker}-{i}", f"unit-{worker}-{i}", 1000 + i, i,
                                  ["claude", str(i)], "/src")
            else:
                reg.record_event("ci", f"w{worker}-{i - 1}", "tick", {"i": i})
                # read-then-write transactions race differently from inserts
                reg.set_state(f"unit-{worker}-{i - 1}", "running")
    """
)


def test_concurrent_writers_lose_nothing(db: Path, tmp_path: Path) -> None:
    workers, writes = 4, 250
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "error", "-c", WRITER, str(db), str(w), str(go), str(writes)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    go.touch()  # every writer opens (creating the file) and writes at once
    results = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert (p.returncode, out, err) == (0, "", "")
    with Registry(db) as r:
        agents = r.agents("ci")
        events = r.events("ci")
    assert len(agents) == len({a.unit for a in agents}) == workers * writes // 2
    assert {a.state for a in agents} == {"running"}
    assert len(events) == len({e.id for e in events}) == workers * writes // 2
    for w in range(workers):
        assert sorted(e.detail["i"] for e in events if e.agent.startswith(f"w{w}-")) == list(  # type: ignore[union-attr]
            range(1, writes, 2)
        )


def test_threads_share_one_registry(reg: Registry) -> None:
    def work(i: int) -> None:
        launch(reg, f"t{i}", unit=f"u{i}")
        reg.record_event("ci", f"t{i}", "tick", {"i": i})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(64)))
    assert len(reg.agents("ci")) == 64
    assert len(reg.events("ci")) == 64


def test_lock_held_past_timeout_is_a_registry_error(db: Path) -> None:
    Registry(db).close()
    holder = raw(db)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with Registry(db, timeout=0.1) as r:
            start = time.monotonic()
            with pytest.raises(RegistryError, match="stayed locked"):
                r.record_event("ci", None, "x", {})
            assert time.monotonic() - start < 2.0
            assert r.events() == []  # reads do not wait for writers in WAL mode
    finally:
        holder.close()


def test_writer_waits_for_a_short_lock(db: Path) -> None:
    Registry(db).close()
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.2, holder.execute, ("ROLLBACK",))
    release.start()
    try:
        with Registry(db, timeout=5.0) as r:
            r.record_event("ci", None, "x", {})
            assert len(r.events()) == 1
    finally:
        release.join()
        holder.close()


def busy() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = sqlite3.SQLITE_BUSY
    return exc


def test_busy_results_that_skip_the_busy_handler_are_retried() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise busy()
        return "done"

    assert _registry_file._retry_busy(flaky, time.monotonic() + 5, sleep=lambda _: None) == "done"
    assert len(calls) == 3


def test_busy_retries_are_bounded() -> None:
    calls: list[int] = []

    def always_busy() -> None:
        calls.append(1)
        raise busy()

    with pytest.raises(sqlite3.OperationalError):
        _registry_file._retry_busy(always_busy, time.monotonic() + 60, sleep=lambda _: None)
    assert len(calls) == 8
    calls.clear()
    with pytest.raises(sqlite3.OperationalError):
        _registry_file._retry_busy(always_busy, time.monotonic() - 1, sleep=lambda _: None)
    assert len(calls) == 1


# ------------------------------------------------------- bounded history (#16)


def test_gc_of_one_fleet_leaves_the_others_alone(reg: Registry) -> None:
    now = 100 * DAY
    for fleet in ("ci", "other"):
        rec = launch(reg, "old", fleet=fleet, unit=f"u-{fleet}", created=now - 20 * DAY)
        reg.record_event(fleet, "old", "launched", {}, ts=now - 20 * DAY)
        reg.record_event(fleet, None, "reconciled", {}, ts=now - 20 * DAY)
        reg.set_state(rec.unit, "exited", exit_status=0, exited=now - 10 * DAY)
    assert reg.gc(now=now, fleet="ci") == 1
    assert reg.agents("ci", include_closed=True) == []
    assert reg.events("ci") == []
    assert [r.unit for r in reg.agents("other", include_closed=True)] == ["u-other"]
    assert [e.kind for e in reg.events("other")] == ["launched", "reconciled"]


def test_history_is_pruned_at_open_without_a_gc(db: Path) -> None:
    now = time.time()
    with Registry(db, retention_seconds=0) as r:  # 0: keep everything
        rec = launch(r, "old", unit="u-old", created=now - 40 * DAY)
        r.set_state(rec.unit, "exited", exit_status=0, exited=now - 40 * DAY)
        r.record_event("ci", None, "reconciled", {}, ts=now - 40 * DAY)
        r.record_event("ci", None, "reconciled", {"new": 1}, ts=now - 1 * DAY)
    with Registry(db, retention_seconds=0) as r:
        assert len(r.events("ci")) == 2
    with Registry(db) as r:  # the default retention: 30 days
        assert r.agents("ci", include_closed=True) == []
        assert [e.detail for e in r.events("ci")] == [{"new": 1}]


def test_retention_comes_from_the_environment(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    with Registry(db, retention_seconds=0) as r:
        r.record_event("ci", None, "reconciled", {}, ts=now - 3 * DAY)
        r.record_event("ci", None, "reconciled", {"new": 1}, ts=now)
    monkeypatch.setenv("AGENTSCOPE_RETENTION_DAYS", "5")
    with Registry(db) as r:
        assert len(r.events("ci")) == 2
    monkeypatch.setenv("AGENTSCOPE_RETENTION_DAYS", "2")
    with Registry(db) as r:
        assert [e.detail for e in r.events("ci")] == [{"new": 1}]
    monkeypatch.setenv("AGENTSCOPE_RETENTION_DAYS", "soon")
    assert Registry(db).retention_seconds == _registry.DEFAULT_RETENTION


def test_a_flood_of_events_keeps_only_the_newest(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry_history, "MAX_EVENTS", 50)
    with Registry(db) as r:
        for i in range(120):
            r.record_event("ci", None, "throttled", {"i": i})
    with Registry(db) as r:
        kept = r.events("ci")
    assert [e.detail["i"] for e in kept] == list(range(70, 120))


def test_events_until_agent_and_last_are_filters(reg: Registry) -> None:
    for i in range(10):
        reg.record_event("ci", "a" if i % 2 else "b", "k", {"i": i}, ts=1000.0 + i)
    assert [e.detail["i"] for e in reg.events("ci", until=1003.0)] == [0, 1, 2]
    assert [e.detail["i"] for e in reg.events("ci", agent="a", last=2)] == [7, 9]
    assert [e.detail["i"] for e in reg.events("ci", since=1002.0, until=1006.0, last=3)] == [
        3,
        4,
        5,
    ]


def test_events_refuse_a_filter_they_do_not_have(reg: Registry) -> None:
    # The filters are passed on as keywords (EventFilter): a misspelt one must
    # fail as a wrong keyword does, not be ignored and return every event.
    reg.record_event("ci", "a", "k", {}, ts=1000.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'agnet'"):
        reg.events("ci", agnet="b")  # type: ignore[call-arg]


def _poll_steps(reg: Registry, after_id: int) -> int:
    """SQLite VM steps (in thousands) one ``--follow`` poll takes."""
    conn = reg._conn
    assert conn is not None
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 1000)
    try:
        reg.events("ci", kind="oom_kill", after_id=after_id)
        reg.events("ci", after_id=after_id)
    finally:
        conn.set_progress_handler(None, 0)
    return steps[0]


def test_a_follow_poll_costs_the_same_on_a_long_history(db: Path) -> None:
    with Registry(db, retention_seconds=0) as r:
        conn = r._conn
        assert conn is not None

        def fill(n: int) -> int:
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO events (ts, fleet, agent, kind, detail)"
                " VALUES (?, 'ci', 'a', 'k', '{}')",
                [(float(i),) for i in range(n)],
            )
            conn.execute("COMMIT")
            last = r.events("ci", last=1)[0].id
            r.record_event("ci", "a", "oom_kill", {})
            return last

        small = _poll_steps(r, fill(1_000))
        large = _poll_steps(r, fill(100_000))
    assert large <= small + 2


def test_a_row_with_bad_json_is_shown_not_fatal(reg: Registry, db: Path) -> None:
    launch(reg, "a", unit="u-a")
    reg.record_event("ci", "a", "launched", {"ok": 1})
    conn = raw(db)
    conn.execute("UPDATE agents SET argv = '[not json'")
    conn.execute(
        "INSERT INTO events (ts, fleet, agent, kind, detail) VALUES (1, 'ci', 'a', 'x', '{bad')"
    )
    conn.execute(
        "INSERT INTO events (ts, fleet, agent, kind, detail) VALUES (2, 'ci', 'a', 'y', '[1]')"
    )
    conn.close()
    (rec,) = reg.agents("ci")
    assert rec.argv == ("<unreadable argv>",)
    details = [e.detail for e in reg.events("ci")]
    assert details == [{"ok": 1}, {"unreadable": "{bad"}, {"unreadable": "[1]"}]


@pytest.mark.parametrize("which", ["reg.db", "reg.db-wal", "reg.db-shm"])
def test_a_planted_symlink_is_neither_followed_nor_chmodded(tmp_path: Path, which: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    target = tmp_path / "victim"
    target.write_text("someone else's file\n")
    target.chmod(0o644)
    if which != "reg.db":
        Registry(shared / "reg.db").close()
        (shared / which).unlink(missing_ok=True)
    (shared / which).symlink_to(target)
    with pytest.raises(RegistryError, match="symbolic link"):
        Registry(shared / "reg.db")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "someone else's file\n"


# -- retention that a wrong clock cannot turn against the history (#31 item 2) ----------


def _history(db: Path, now: float) -> None:
    with Registry(db, retention_seconds=0) as r:
        for i in range(20):
            rec = launch(r, f"a{i}", unit=f"u-{i}", created=now - 2 * DAY)
            r.record_event("ci", f"a{i}", "launched", {}, ts=now - 2 * DAY)
            r.set_state(rec.unit, "exited", exit_status=0, exited=now - 1 * DAY)
            r.record_event("ci", f"a{i}", "exited", {}, ts=now - 1 * DAY)


def test_an_open_with_the_clock_far_ahead_deletes_no_history(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    _history(db, now)
    monkeypatch.setattr(_registry.time, "time", lambda: now + 40 * DAY)  # an RTC before NTP
    with Registry(db, retention_seconds=30 * DAY) as r:
        assert len(r.agents("ci", include_closed=True)) == 20
        assert len(r.events("ci")) == 40


def test_events_written_while_the_clock_was_behind_outlive_the_next_open(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    with Registry(db, retention_seconds=0) as r:
        r.record_event("ci", None, "reconciled", {"n": 1}, ts=now - 1 * DAY)
        # The clock 40 days behind: written after the one above, stamped before it.
        r.record_event("ci", None, "throttled", {"n": 2}, ts=now - 40 * DAY)
        r.record_event("ci", None, "throttled", {"n": 3}, ts=now - 40 * DAY)
    with Registry(db, retention_seconds=30 * DAY) as r:
        assert [e.detail["n"] for e in r.events("ci")] == [1, 2, 3]
        assert r.gc(30 * DAY) == 0
        assert len(r.events("ci")) == 3
        # Once the events written before them are old, they go too.
        r.gc(30 * DAY, now=now + 30 * DAY)
        assert r.events("ci") == []


def test_a_launch_under_way_is_judged_by_the_boot_clock(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_systemd._fleet import _reconcile_plan
    from agentscope_systemd._registry import _spool

    child = subprocess.Popen(["sleep", "30"])
    try:
        start = _spool.start_time(child.pid)
        assert start is not None
        # Created "40 days ago" by a wall clock that has since jumped forward.
        rec = launch(reg, "x", pid=child.pid, start_time=start, created=time.time() - 40 * DAY)
        assert _registry.in_flight(rec)
        boot = _reconcile_plan._boot_seconds()
        monkeypatch.setattr(_reconcile_plan, "_boot_seconds", lambda: boot + 200)
        assert not _registry.in_flight(rec)  # really older than the launch grace
    finally:
        child.kill()
        child.wait()
