"""The JSON contract (docs/json.md): every --json output validates against its schema.

The commands run over the real library (``agentscope_systemd.Fleet``, its registry
and monitor events) on the fake systemd manager and cgroup tree, so what is
validated is what a harness would read. The schemas are checked strictly
here (no field the schema does not name): a field added to an output must be
added to its schema, which is what keeps docs/json.md true.
"""

from __future__ import annotations

import ast
import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from agentscope_systemd import _contract
from agentscope_systemd._cli import _fleet
from agentscope_systemd._cli._app import app
from agentscope_systemd._events import AgentExited, LimitFound, OomKill, Pressure, Throttled
from agentscope_systemd._fleet._fleet import AsyncFleet
from tests.fakefleet import fake_fleet
from tests.fakesystemd import FakeSystemd
from tests.test_cli import run

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"


def _strict(schema: Any) -> Any:
    """``schema`` with every object closed to the fields it names."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["unevaluatedProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _registry(strict: bool) -> Registry[Any]:
    schemas = _contract.load_schemas(SCHEMAS)
    resources = [
        (sid, Resource.from_contents(_strict(s) if strict else copy.deepcopy(s)))
        for sid, s in schemas.items()
    ]
    return Registry[Any]().with_resources(resources)


REGISTRY = _registry(strict=True)


def validate(data: Any) -> str:
    """Validate one output against the schema its ``schema`` field names; return that name."""
    name = data["schema"]
    shape = name.removeprefix("agentscope.").partition("/")[0]
    schema = REGISTRY.contents(f"urn:agentscope:schema:{shape}")
    Draft202012Validator(schema, registry=REGISTRY).validate(data)
    return str(name)


# -- the schemas themselves -------------------------------------------------------


def test_every_schema_file_is_a_valid_2020_12_schema_of_a_shape_in_the_contract() -> None:
    schemas = _contract.load_schemas(SCHEMAS)
    shapes = {sid.rpartition(":")[2] for sid in schemas if sid.count(":") == 3}
    assert shapes == set(_contract.VERSIONS)
    for sid, schema in schemas.items():
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", sid
        Draft202012Validator.check_schema(schema)
    for shape, version in _contract.VERSIONS.items():
        field = schemas[f"urn:agentscope:schema:{shape}"]["properties"]["schema"]
        assert field == {"const": f"agentscope.{shape}/{version}"}, shape


def test_a_wrong_version_or_a_missing_field_fails_validation() -> None:
    from jsonschema import ValidationError

    good = _contract.stamped("kill", {"name": "a", "signal": "SIGTERM"})
    validate(good)
    with pytest.raises(ValidationError):
        validate({**good, "schema": "agentscope.kill/2"})
    with pytest.raises(ValidationError):
        validate({"schema": "agentscope.kill/1", "name": "a"})
    with pytest.raises(ValidationError):  # strict here: a new field needs its schema entry
        validate({**good, "new_field": 1})


# -- the commands over the real library -------------------------------------------


@pytest.fixture
def real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    """``open_fleet`` gives a real ``agentscope_systemd.Fleet`` on one fake manager and tree."""
    with fake_fleet(tmp_path, monkeypatch) as bus:
        yield bus


def json_of(*args: str, code: int = 0) -> Any:
    result = run("--manager", "user", "--json", *args)
    assert result.code == code, result
    return json.loads(result.stdout)


# -- nothing without a schema ------------------------------------------------------

#: The shape each command prints with --json. A new command fails the test
#: below until its output has a schema and is listed here.
COMMAND_SHAPES: dict[str, str | None] = {
    "run": "launched",
    "exec": None,  # it becomes the agent's command: nothing of ours on stdout
    "call": None,  # it becomes the call's command, as exec does
    "ls": "agent",  # an array, each element stamped
    "stop": "stop",
    "kill": "kill",
    "freeze": "state",
    "thaw": "state",
    "attach": "attach",
    "logs": "logs",
    "send": "send",
    "report": "report",
    "events": "event",  # one per line
    "top": "top",
    "monitor": "event",  # one per line
    "doctor": "doctor",
    "gc": "gc",
    "install": "install",
    "uninstall": "install",
    "demo": "demo",
}


def test_every_command_has_the_schema_of_its_json_output() -> None:
    import typer

    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert commands == set(COMMAND_SHAPES)
    for shape in COMMAND_SHAPES.values():
        assert shape is None or (SCHEMAS / f"{shape}.json").is_file(), shape


def _recorded_kinds() -> set[str]:
    """Every event kind a string literal in the library records (read from its source)."""
    kinds: set[str] = set()
    for path in (ROOT / "agentscope_systemd").rglob("*.py"):
        if "_cli" in path.parts:
            continue  # the library only, as before its subpackages
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            # The kind's position in each recorder's arguments.
            where = {"event": 1, "record_event": 2, "_insert_event": 4}.get(name)
            args = node.args
            # A name there is a parameter passed on: its callers' literals count.
            if where is not None and len(args) > where and isinstance(args[where], ast.Constant):
                kinds.add(args[where].value)
            if name == "mark_running":
                kinds.update(k.arg for k in node.keywords if k.arg)
            for kw in node.keywords:
                if kw.arg == "event" and isinstance(kw.value, ast.Constant) and kw.value.value:
                    kinds.add(kw.value.value)
            sql = args[0] if args else None
            if isinstance(sql, ast.Constant) and str(sql.value).startswith("INSERT INTO events"):
                row = args[1]
                if isinstance(row, ast.Tuple) and isinstance(row.elts[3], ast.Constant):
                    kinds.add(row.elts[3].value)
    return kinds


def test_every_event_kind_has_a_schema_and_every_schema_a_kind() -> None:
    from typing import get_args

    from agentscope_systemd._events import Event

    monitor_kinds = {cls.kind for cls in get_args(Event)}
    recorded = _recorded_kinds()
    assert {"launched", "exited", "lost", "found", "adopted", "stopped"} <= recorded
    assert {"oom_kill", "guard_kill", "pressure", "exited"} <= monitor_kinds
    files = {p.stem for p in (SCHEMAS / "events").glob("*.json")}
    assert monitor_kinds | recorded == files


def json_lines(*args: str) -> list[Any]:
    result = run("--manager", "user", "--json", *args)
    assert result.code == 0, result
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_outputs_of_the_library_s_data_validate(
    real: FakeSystemd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = [validate(json_of("run", "a", "--", "sleep", "30"))]
    listed = json_of("ls")
    assert [a["name"] for a in listed] == ["a"]
    seen += [validate(a) for a in listed]
    seen.append(validate(json_of("report", "--top", "3")))
    seen.append(validate(json_of("kill", "a", "--signal", "CONT")))
    seen.append(validate(json_of("top")))
    seen.append(validate(json_of("stop", "a", "--timeout", "1")))
    events = json_lines("events")
    assert [e["kind"] for e in events] == ["launched", "signalled", "stopped"]
    seen += [validate(e) for e in events]
    seen.append(validate(json_of("gc")))
    seen.append(validate(json_of("--version")))
    failed = run("--manager", "user", "--json", "stop", "nosuch")
    assert failed.code == 3
    seen.append(validate(json.loads(failed.stderr)))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    seen.append(validate(json_of("install", "--user", "--dry-run")))
    assert set(seen) >= {
        "agentscope.launched/1",
        "agentscope.agent/1",
        "agentscope.report/1",
        "agentscope.top/1",
        "agentscope.event/1",
        "agentscope.error/1",
        "agentscope.install/1",
    }


def test_doctor_validates_also_when_systemd_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/nonexistent")
    result = run("--manager", "user", "--json", "doctor")
    assert result.code in (1, 4), result
    data = json.loads(result.stdout)
    validate(data)
    assert data["checks"][0]["name"] == "systemd"


def test_the_outputs_the_cli_builds_itself_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    # freeze/thaw/attach/logs/send print what they were asked: a stand-in fleet will do.
    from tests.test_cli import FakeFleet, _agent

    class TmuxFleet(FakeFleet):
        def attach_command(self, name: str, *, read_only: bool = False) -> list[str]:
            return ["tmux", "-S", "/run/user/1000/agentscope/tmux-default", "attach", "-t", name]

        def logs(self, name: str, lines: int = 100) -> list[str]:
            return ["$ make test", "ok"][-lines:]

        def send(self, name: str, text: str, *, enter: bool = False) -> None:
            pass

    fake = TmuxFleet()
    fake.agent_list = [_agent("a", terminal="tmux")]  # logs: its window, not a log file
    monkeypatch.setattr(_fleet, "open_fleet", lambda opts: fake)
    for args in (
        ["freeze", "a"],
        ["thaw", "a"],
        ["attach", "a"],
        ["logs", "a", "-n", "2"],
        ["send", "a", "make test", "--enter"],
        ["stop", "--all"],
    ):
        validate(json_of(*args))


def test_health_validates_in_every_state() -> None:
    from agentscope_systemd._cli._http import FaceState, health

    state = FaceState("default", "user", 1.0, "0")
    validate(health(state, now=0.0)[1])  # starting
    state.sampled([{"name": "a", "state": "running", "memory_current": 1}], {}, "ok", now=1.0)
    state.event({"kind": "oom_kill", "ts": 1.0, "agent": "a", "unit": "u.scope", "pid": 3})
    validate(health(state, now=2.0)[1])  # ok
    validate(health(state, now=100.0)[1])  # stale
    state.failed("cannot read memory.events", now=101.0)
    validate(health(state, now=102.0)[1])  # error


# -- one event shape: monitor --json and events --json ---------------------------------


def _monitor_events(unit: str, report: Any) -> list[Any]:
    from agentscope_systemd._guard._guardpolicy import GuardKill
    from agentscope_systemd._kernel._cgroup import LimitHolder
    from agentscope_systemd._monitor._attribution import PressureEvent, PressureSample

    slice_ = "app-agentscope-agents.slice"
    return [
        OomKill(10.5, "a", unit, 7, "node", 4096, "kmsg"),
        OomKill(11.0, None, None, None, None, None, "cgroup"),
        Throttled(12.0, unit, 3, (7, 8), slice_, "systemctl set-property ..."),
        Pressure(13.0, report, PressureEvent(12.0, 13.0, PressureSample(30.0, 0.5, 12.5), 3)),
        LimitFound(14.0, slice_, LimitHolder(Path("/sys/fs/cgroup") / slice_, 1 << 30, None)),
        GuardKill(
            15.0,
            "a",
            unit,
            7,
            "node",
            "node build.js",
            1 << 30,
            0,
            "memory",
            4.5,
            0.0,
            12.0,
            30.0,
            0.04,
            True,
        ),
    ]


async def test_a_monitor_event_and_its_record_are_one_shape(tmp_path: Path) -> None:
    bus = FakeSystemd(tmp_path / "cgroup")
    async with AsyncFleet(
        "t",
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _bus=bus,
    ) as fleet:
        report = await fleet.report(top=1)
        for event in _monitor_events("agentscope-t-a-abcdef.scope", report):
            live = json.loads(json.dumps(_contract.monitor_event_dict("t", event)))
            assert validate(live) == "agentscope.event/1"
            await fleet._monitors.record_event(event)
            (record,) = await fleet.events(kind=event.kind, last=1)
            recorded = json.loads(json.dumps(record.to_dict()))
            assert validate(recorded) == "agentscope.event/1"
            assert recorded["id"] is not None
            assert live["id"] is None
            if event.kind == "pressure":  # the report stays in the live copy only
                assert "report" in live["detail"]
                del live["detail"]["report"]
            assert {**live, "id": recorded["id"]} == recorded
        # exited: the monitor's AgentExited and the fleet's own record of an exit.
        exited = _contract.monitor_event_dict("t", AgentExited(16.0, "a", "u.scope", 7, -9))
        validate(exited)
        assert exited["kind"] == "exited"
        assert set(exited["detail"]) == {"unit", "pid", "status"}


# -- scopes a harness starts itself (docs/json.md) ------------------------------------


def test_a_scope_started_with_the_documented_naming_is_listed_reported_and_stopped(
    real: FakeSystemd,
) -> None:
    from agentscope_systemd._names import describe, parse_description, scope_unit_name

    proc = subprocess.Popen(["sleep", "30"])
    # What `systemd-run --scope --unit agentscope-default-reviewer-0a1b2c.scope
    # --description "agentscope agent reviewer of fleet default"` makes.
    unit, description = (
        "agentscope-default-reviewer-0a1b2c.scope",
        ("agentscope agent reviewer of fleet default"),
    )
    assert parse_description(description) == ("default", "reviewer")
    assert (describe("default", "reviewer"), scope_unit_name("default", "reviewer", "0a1b2c")) == (
        description,
        unit,
    )
    real._add_unit(unit, description, [proc.pid])
    # systemd-run's own Description (its command line): not a scope of the fleet.
    other = subprocess.Popen(["sleep", "30"])
    real._add_unit("agentscope-default-other-0d0e0f.scope", "/usr/bin/sleep 30", [other.pid])
    try:
        (agent,) = json_of("ls")
        assert (agent["name"], agent["unit"], agent["pid"]) == ("reviewer", unit, proc.pid)
        assert agent["state"] == "running"
        report = json_of("report", "--top", "0")
        assert [(a["agent"], a["unit"]) for a in report["agents"]] == [("reviewer", unit)]
        (found,) = json_lines("events", "--kind", "found")
        assert (found["agent"], found["detail"]["unit"]) == ("reviewer", unit)
        validate(found)
        assert json_of("stop", "reviewer", "--timeout", "1")["stopped"] == ["reviewer"]
        assert proc.wait(10) is not None
        assert json_of("ls") == []
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()
