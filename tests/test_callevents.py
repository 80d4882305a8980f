"""A call's ``call_started`` / ``call_exited`` events (#26): written without the registry,
taken in by it under the agent whose scope the call was in."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from agentscope_systemd._calls import _callevents, _calls
from agentscope_systemd._cli._call import call_command
from agentscope_systemd._cli._options import Options
from agentscope_systemd._registry._registry import Registry
from tests.fakesystemd import FakeSystemd, end_children
from tests.test_calls import PID, SLICE, UNIT, FakeKernel, delegated_agent, kernel, settled
from tests.test_fleet import make_fleet, stop_everything

__all__ = ["kernel"]  # the fixture, used by name


def recorded(reg: Registry, kind: str) -> list[dict[str, object]]:
    return [e.detail | {"agent": e.agent} for e in reg.events("t", kind=kind)]


def test_a_calls_events_name_its_agent_and_carry_its_outcome(tmp_path: Path) -> None:
    with Registry(tmp_path / "registry.db") as reg:
        reg.record_launch("t", "coder", UNIT, PID, 1, ["sh"], "/")
        watch = _callevents.CallWatch(
            _callevents.calls_dir(reg.path), UNIT, "call-make-3", 77, "make -j8", (1 << 30, 64)
        )
        watch.begin()
        call = tmp_path / "call-make-3"
        call.mkdir()
        (call / "memory.peak").write_text("123456789\n")
        (call / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n")
        watch.measure(str(call))
        watch.end(-9)
        assert reg.events("t", kind="call_started") != []  # a transaction takes them in
        (started,) = recorded(reg, "call_started")
        (exited,) = recorded(reg, "call_exited")
    assert started == {
        "agent": "coder",
        "unit": UNIT,
        "call": "call-make-3",
        "pid": 77,
        "argv": "make -j8",
        "memory_max": 1 << 30,
        "tasks_max": 64,
    }
    assert exited["agent"] == "coder"
    assert (exited["status"], exited["peak"], exited["oom_kills"]) == (-9, 123456789, 2)
    assert isinstance(exited["seconds"], float)
    assert os.listdir(_callevents.calls_dir(tmp_path / "registry.db")) == []


def test_call_events_nobody_takes_in_stop_at_their_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No fleet opened, no monitor: nothing takes the events in, and a host
    # that makes calls for ever must not fill its disk with them.
    monkeypatch.setattr(_callevents, "WAITING_MAX", 4)
    with Registry(tmp_path / "registry.db") as reg:
        reg.record_launch("t", "coder", UNIT, PID, 1, ["sh"], "/")
        directory = _callevents.calls_dir(reg.path)
        for n in range(3):
            watch = _callevents.CallWatch(
                directory, UNIT, f"call-t-{n}", 70 + n, "true", (None, None)
            )
            watch.begin()
            if n < 2:
                watch.end(0)
        assert len(os.listdir(directory)) == 4  # the third call's events found the cap
        assert len(recorded(reg, "call_exited")) == 2  # a transaction takes them in
        started = [e["call"] for e in recorded(reg, "call_started")]
        assert sorted(started) == ["call-t-0", "call-t-1"]
        assert os.listdir(directory) == []  # room again
        _callevents.CallWatch(directory, UNIT, "call-t-9", 79, "true", (None, None)).begin()
        assert len(os.listdir(directory)) == 1


def test_before_linux_5_19_a_calls_peak_is_none() -> None:
    assert _callevents.read_outcome("/nonexistent") == (None, None)


@pytest.mark.parametrize(
    "doc",
    [
        b"not json",
        b"[]",
        json.dumps({"kind": "launched", "ts": 1.0, "detail": {}}).encode(),
        # another registry's agent, a unit that is no agentscope scope, a bad call name
        json.dumps(
            {"kind": "call_started", "ts": 1.0, "detail": {"unit": "agentscope-x-y-1.scope"}}
        ).encode(),
        json.dumps(
            {
                "kind": "call_started",
                "ts": 1.0,
                "detail": {"unit": "session-2.scope", "call": "call-a-1", "pid": 5, "argv": ""},
            }
        ).encode(),
        json.dumps(
            {
                "kind": "call_started",
                "ts": 1.0,
                "detail": {"unit": UNIT, "call": "call-../../x", "pid": 5, "argv": ""},
            }
        ).encode(),
        json.dumps(
            {
                "kind": "call_started",
                "ts": 1.0,
                "detail": {"unit": UNIT, "call": "call-a-1", "pid": 5, "argv": "x" * 300},
            }
        ).encode(),
        b"x" * 10000,
    ],
)
def test_what_is_no_call_event_of_a_known_agent_is_dropped(tmp_path: Path, doc: bytes) -> None:
    with Registry(tmp_path / "registry.db") as reg:
        reg.record_launch("t", "coder", UNIT, PID, 1, ["sh"], "/")
        calls = Path(_callevents.calls_dir(reg.path))
        calls.mkdir(mode=0o700)
        (calls / "0001-1-call_started").write_bytes(doc)
        (calls / "0002-1-call_started").symlink_to("/etc/passwd")
        assert reg.events("t", kind="call_started") == []
        assert list(calls.iterdir()) == []


def test_argv_summary_is_bounded_and_printable() -> None:
    line = _callevents.argv_summary(["sh", "-c", "x" * 100, "\x1b[31m"] + ["y"] * 200)
    assert len(line) <= _callevents.ARGV_MAX
    assert line.endswith("...")
    assert "\x1b" not in line
    assert line.startswith("sh -c " + "x" * 61 + "... ?[31m y")


def test_a_user_managers_call_writes_beside_the_users_registry(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path), "HOME": "/nonexistent"}
    scope = f"/{SLICE}/{UNIT}"
    assert _callevents.calls_dir_of_scope(scope, env) is None  # no registry there: nobody reads
    (tmp_path / "agentscope").mkdir()
    assert _callevents.calls_dir_of_scope(scope, env) == str(tmp_path / "agentscope" / "calls")
    system = "/app.slice/app-agentscope-agents.slice/" + UNIT
    assert _callevents.calls_dir_of_scope(system, env) in (None, "/var/lib/agentscope/calls")


def test_agentscope_call_hands_its_remover_the_calls_events(
    kernel: FakeKernel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settled(kernel)
    (tmp_path / "state" / "agentscope").mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    watches: list[_callevents.CallWatch] = []
    monkeypatch.setattr(_calls, "fork_remover", lambda path, watch: watches.append(watch))
    call_command(
        Options(),
        ["true", "x"],
        memory_max="1G",
        name="build",
        execv=lambda path, argv: None,
        cgroup_root=str(kernel.root),
        proc_root=str(kernel.proc),
    )
    (watch,) = watches
    assert (watch.directory, watch.unit, watch.call, watch.argv, watch.limits) == (
        str(tmp_path / "state" / "agentscope" / "calls"),
        UNIT,
        "call-build-1",
        "true x",
        (1 << 30, None),
    )
    assert watch.pid == os.getpid()  # the command execs in this process


async def test_fleet_call_records_its_calls_start_and_exit_with_status(
    tmp_path: Path, kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_calls, "_SAID", set())
    bus = FakeSystemd(tmp_path / "cgroup")
    async with make_fleet(tmp_path, bus) as fleet:
        scope = await delegated_agent(fleet, bus, "a")
        call = await fleet.call("a", ["sh", "-c", "exit 3"], memory_max="64M", name="t")
        (scope / "call-t-1" / "memory.peak").write_text(f"{5 << 20}\n")
        assert await call.wait() == 3
        kernel.leave(call.pid)
        for _ in range(100):
            if await fleet.events(kind="call_exited"):
                break
            await asyncio.sleep(0.05)
        (started,) = await fleet.events(kind="call_started")
        (exited,) = await fleet.events(kind="call_exited")
        await stop_everything(bus)
    end_children()
    assert (started.agent, started.detail["call"], started.detail["pid"]) == (
        "a",
        "call-t-1",
        call.pid,
    )
    assert started.detail["argv"] == "sh -c exit 3"
    assert exited.agent == "a"
    assert (exited.detail["status"], exited.detail["peak"]) == (3, 5 << 20)
    assert exited.detail["memory_max"] == 64 << 20
