"""The command line over a fake fleet: parsing, exit codes, JSON shapes, rendering.

Every command reaches the library through ``agentscope_systemd._cli._fleet.open_fleet``; the
fake below stands in for ``agentscope_systemd.Fleet``, whose signatures it keeps (a test
checks), and the CLI is type-checked against the real one. Set
AGENTSCOPE_UPDATE_SNAPSHOTS=1 to rewrite tests/snapshots/ and docs/cli.md.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import agentscope_systemd
from agentscope_systemd import AgentMemory
from agentscope_systemd._cli import _docs, _doctor, _fleet, _render
from agentscope_systemd._cli._app import COMMANDS, build_command
from agentscope_systemd._cli._errors import BadInput, CannotRun, CommandNotFound, Failed
from agentscope_systemd._cli._exec import launch_controls, parse_exec_args, resolve_command
from agentscope_systemd._cli._notify import Notifier, format_state
from agentscope_systemd._cli._parse import (
    parse_duration,
    parse_env,
    parse_signal,
    parse_since,
    parse_size,
)
from agentscope_systemd._cli.main import hoist_globals, main, split_globals
from agentscope_systemd._managers import _exec as agentscope_exec
from agentscope_systemd._monitor._report import CallMemory

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("AGENTSCOPE_UPDATE_SNAPSHOTS") == "1"
NOW = 1_700_000_000.0
_REAL_OPEN_HISTORY = _fleet.open_history


# -- the fake fleet -------------------------------------------------------------


@dataclass
class FakeRecord:
    data: dict[str, Any]
    id: int = 0
    name: str = ""
    unit: str = ""
    pid: int = 0
    property_issues: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


def _agent(name: str, **over: Any) -> FakeRecord:
    data = {
        "name": name,
        "unit": f"agentscope-default-{name}-3f9a2c.scope",
        "pid": 4242,
        "state": "running",
        "started": NOW - 3725,
        "memory_current": 512 * 2**20,
        "memory_peak": 3 * 2**30,
        "oom_kills": 0,
    } | over
    return FakeRecord(data, name=name, unit=data["unit"], pid=data["pid"])


REPORT = {
    "host": {"mem_total": 16 * 2**30, "mem_available": 9 * 2**30, "swap_total": 0},
    "pressure": {
        "some": {"avg10": 1.5, "avg60": 0.25, "avg300": 0.0, "total": 123},
        "full": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 0},
    },
    "agents": [
        # The library's own records, so the fixture has the shape report --json prints.
        AgentMemory(
            agent="builder-1",
            unit="agentscope-default-builder-1-3f9a2c.scope",
            memory_current=6 * 2**30,
            memory_peak=8 * 2**30,
            anon=6 * 2**30,
            file=0,
            processes=2,
            oom_kills=1,
            high_events=0,
            calls=(CallMemory("call-make-3", 5 * 2**30, 7 * 2**30, 9, 1),),
        ).to_dict(),
        AgentMemory(
            agent="reviewer",
            unit="agentscope-default-reviewer-0a0b0c.scope",
            memory_current=300 * 2**20,
            memory_peak=None,
            anon=300 * 2**20,
            file=0,
            processes=1,
            oom_kills=0,
            high_events=0,
        ).to_dict(),
    ],
    "processes": [
        {"pid": 5001, "comm": "node", "rss": 5 * 2**30, "agent": "builder-1"},
        {"pid": 5002, "comm": "cargo build", "rss": 700 * 2**20, "agent": "builder-1"},
        {"pid": 812, "comm": "Xorg", "rss": 200 * 2**20, "agent": None},
    ],
}

EVENTS = [
    {
        "id": 1,
        "ts": NOW - 60,
        "fleet": "default",
        "agent": "builder-1",
        "kind": "start",
        "detail": {"pid": 4242},
    },
    {
        "id": 2,
        "ts": NOW - 30,
        "fleet": "default",
        "agent": "builder-1",
        "kind": "oom_kill",
        "detail": {"pid": 5001, "comm": "node"},
    },
]


@dataclass
class FakeFleet:
    """Stands in for the blocking Fleet; records calls; raises ``fail`` from every operation."""

    name: str = "default"
    manager: str = "user"
    mode: str = "systemd"
    mode_reason: str = "PID 1 is systemd and its bus answers"
    fail: BaseException | None = None
    agent_list: list[FakeRecord] = field(
        default_factory=lambda: [_agent("builder-1"), _agent("reviewer", state="frozen")]
    )
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    closed: bool = False

    def _op(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    def close(self) -> None:
        self.closed = True

    def launch(self, name: str, argv: list[str], **kw: Any) -> FakeRecord:
        self._op("launch", name, list(argv), kw)
        return _agent(name)

    def adopt(self, pid: int, name: str, *, memory_max: int | None = None, **kw: Any) -> FakeRecord:
        self._op("adopt", pid, name, memory_max, *([kw] if kw else []))
        return _agent(name, pid=pid)

    def stop(self, name: str, timeout: float = 10) -> None:
        self._op("stop", name, timeout)

    def kill(self, name: str, signal: int = 15) -> None:
        self._op("kill", name, int(signal))

    def freeze(self, name: str) -> None:
        self._op("freeze", name)

    def thaw(self, name: str) -> None:
        self._op("thaw", name)

    def agents(self) -> list[FakeRecord]:
        self._op("agents")
        return self.agent_list

    def slice_limits(self) -> dict[str, int | None]:
        return {"MemoryHigh": None, "MemoryMax": None, "MemorySwapMax": None}

    def clear_slice_limits(self) -> dict[str, int]:
        self._op("clear_slice_limits")
        return {}

    def events(
        self,
        *,
        agent: str | None = None,
        since: float | None = None,
        until: float | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[FakeRecord]:
        self._op("events", since, kind, after_id, limit)
        self._op("events-more", agent, until, last)
        out = [
            e
            for e in EVENTS
            if (kind is None or e["kind"] == kind)
            and (after_id is None or e["id"] > after_id)
            and (agent is None or e["agent"] == agent)
            and (since is None or e["ts"] >= since)
            and (until is None or e["ts"] < until)
        ]
        out = out[-last:] if last else out
        out = out[:limit] if limit is not None else out
        return [FakeRecord(e, id=e["id"]) for e in out]

    def gc(self, retention_seconds: float = 7 * 86400) -> int:
        self._op("gc", retention_seconds)
        return 3

    def logs(self, name: str, lines: int = 100) -> list[str]:
        self._op("logs", name, lines)
        return [f"pane line {i}" for i in range(lines)]

    def send(self, name: str, text: str, *, enter: bool = False) -> None:
        self._op("send", name, text, enter)

    def attach_command(self, name: str, *, read_only: bool = False) -> list[str]:
        self._op("attach_command", name, read_only)
        return ["tmux", "attach", "-t", name]

    def report(self, top: int = 10) -> FakeRecord:
        self._op("report", top)
        return FakeRecord({**REPORT, "processes": REPORT["processes"][:top]})

    @contextmanager
    def monitor(
        self,
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: object = False,
        reclaim_escaped: bool = False,
        **options: Any,
    ) -> Iterator[Iterator[FakeRecord]]:
        extra = [guard] if guard is not False else []
        extra += ["reclaim_escaped"] if reclaim_escaped else []
        self._op("monitor", interval, top, *extra)
        yield iter([FakeRecord(e, id=e["id"]) for e in EVENTS])


def test_the_fake_fleet_keeps_the_real_fleets_signatures() -> None:
    # The commands are type-checked against agentscope_systemd.Fleet; this
    # fake must not let them pass with a call the real Fleet would refuse.
    import inspect

    for name, fake in inspect.getmembers(FakeFleet, inspect.isfunction):
        if name.startswith("_"):
            continue
        real = inspect.signature(getattr(agentscope_systemd.Fleet, name)).parameters
        for p in inspect.signature(fake).parameters.values():
            if p.kind is p.VAR_KEYWORD or p.name == "self":
                continue  # the fake takes the rest as the real one does, unchecked
            assert p.name in real, f"Fleet.{name} has no {p.name!r}"
            assert (p.kind, p.default) == (real[p.name].kind, real[p.name].default), (
                f"Fleet.{name}({p.name}): fake {p.kind.name}={p.default!r}, "
                f"real {real[p.name].kind.name}={real[p.name].default!r}"
            )


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> FakeFleet:
    fake = FakeFleet()
    opened: list[_fleet.Options] = []

    def open_fleet(opts: _fleet.Options) -> FakeFleet:
        opened.append(opts)
        fake.name = opts.fleet
        return fake

    monkeypatch.setattr(_fleet, "open_fleet", open_fleet)
    monkeypatch.setattr(_fleet, "open_history", open_fleet)  # events and gc: the registry
    fake.opened = opened  # type: ignore[attr-defined]

    def no_fast_path(*args: object, **kwargs: object) -> str:
        # On a systemd host the fast path would make a real scope: take the fake.
        raise agentscope_exec.SlowPath("test")

    monkeypatch.setattr(agentscope_exec, "adopt_self", no_fast_path)
    return fake


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    runner = CliRunner()
    with runner.isolation(env=env) as (out, err, _mixed):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:  # pragma: no cover - main always exits
            code = -1
        sys.stdout.flush()
        sys.stderr.flush()
        return Result(code, out.getvalue().decode(), err.getvalue().decode())


def run_json(*args: str) -> tuple[Result, Any]:
    result = run("--json", *args)
    return result, json.loads(result.stdout) if result.stdout.strip() else None


def assert_no_traceback(result: Result) -> None:
    assert "Traceback" not in result.stdout + result.stderr
    assert 'File "' not in result.stdout + result.stderr


# -- parsing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("1B", 1),
        ("512K", 512 * 2**10),
        ("512k", 512 * 2**10),
        ("4M", 4 * 2**20),
        ("4G", 4 * 2**30),
        ("2T", 2 * 2**40),
        ("1.5G", 3 * 2**29),
        ("2GiB", 2 * 2**30),
        ("2gb", 2 * 2**30),
        (" 8 MiB ", 8 * 2**20),
        (".5K", 512),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "from 1 byte"),
        ("0G", "from 1 byte"),
        ("-1G", "it must be a size"),
        ("-5", "it must be a size"),
        ("lots", "it must be a size"),
        ("4X", "it must be a size"),
        ("4GG", "it must be a size"),
        ("", "it must be a size"),
        ("1.5", "whole number"),
    ],
)
def test_parse_size_rejects(text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1700000000", 1_700_000_000.0),
        ("1699999999.5", 1_699_999_999.5),
        ("10m", NOW - 600),
        ("2h", NOW - 7200),
        ("1d", NOW - 86400),
        ("30s", NOW - 30),
        ("2023-11-14T22:13:20+00:00", 1_700_000_000.0),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
    ],
)
def test_parse_since(text: str, expected: float) -> None:
    assert parse_since(text, NOW) == expected


def test_parse_since_naive_iso_is_local_time() -> None:
    from datetime import datetime

    assert parse_since("2024-05-01T12:00:00", NOW) == datetime(2024, 5, 1, 12).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # journalctl --since's relative forms, as systemd.time(7) spells them.
        ("-1h", NOW - 3600),
        ("-5m", NOW - 300),
        ("+30min", NOW + 1800),
        ("2h ago", NOW - 7200),
        ("1h30min", NOW - 5400),
        ("-1h 30min", NOW - 5400),
        ("10 minutes", NOW - 600),
        ("now", NOW),
        ("@1700000000", 1_700_000_000.0),
    ],
)
def test_parse_since_takes_systemd_relative_times(text: str, expected: float) -> None:
    assert parse_since(text, NOW) == pytest.approx(expected)


def test_parse_since_days_are_local_midnights() -> None:
    from datetime import datetime

    midnight = datetime.fromtimestamp(NOW).replace(hour=0, minute=0, second=0, microsecond=0)
    assert parse_since("today", NOW) == midnight.timestamp()
    assert parse_since("yesterday", NOW) == midnight.timestamp() - 86400


@pytest.mark.parametrize("text", ["soonish", "10 parsecs", "--5m", "2024-13-40", "-1x", ""])
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(BadInput, match=r"not a time|no unit"):
        parse_since(text, NOW)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", 90),
        ("2s", 2),
        ("500ms", 0.5),
        ("1h30min", 5400),
        ("1h 30min", 5400),
        ("10m", 600),
        ("10min", 600),
        ("2 hours", 7200),
        ("7d", 7 * 86400),
        ("1w", 7 * 86400),
        ("1M", 30.44 * 86400),  # systemd's month: "M", never minutes
        ("1y", 365.25 * 86400),
        ("250us", 250e-6),
    ],
)
def test_parse_duration_takes_systemd_time_spans(text: str, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [("soon", r"no unit|not a time span"), ("1hh", "no unit 'hh'"), ("", "not a time span")],
)
def test_parse_duration_rejects(text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("infinity", None),
        ("Infinity", None),
        ("50%", 8 * 2**30),
        ("100%", 16 * 2**30),
        ("12.5%", 2 * 2**30),
        ("1E", 2**60),
    ],
)
def test_parse_size_takes_systemd_memory_limits(text: str, expected: int | None) -> None:
    # A share of RAM is of the machine's physical memory, whole pages, as systemd's MemoryMax=.
    assert parse_size(text, physical=16 * 2**30) == expected


def test_parse_size_percent_is_of_this_machines_ram() -> None:
    from agentscope_systemd._cli._parse import physical_memory

    page = os.sysconf("SC_PAGE_SIZE")
    half = parse_size("50%")
    assert half is not None
    assert half % page == 0
    assert abs(half - physical_memory() // 2) < page


@pytest.mark.parametrize("text", ["0%", "101%", "50%%", "-5%"])
def test_parse_size_rejects_bad_shares(text: str) -> None:
    with pytest.raises(BadInput):
        parse_size(text, physical=2**30)


def test_bad_sizes_and_times_are_exit_2(fleet: FakeFleet) -> None:
    for args in (
        ("run", "a", "--memory-max", "lots", "--", "true"),
        ("events", "--since", "-1 fortnight"),
        ("gc", "--retention", "1hh"),
    ):
        result = run(*args)
        assert result.code == 2, args
        assert_no_traceback(result)


@pytest.mark.parametrize(
    "text", ["4096", "512K", "512M", "1.5G", "1.5 G", "2GiB", "1TB", "0.5T", "50%", "infinity"]
)
def test_memory_max_and_p_memorymax_take_one_size_grammar(fleet: FakeFleet, text: str) -> None:
    """``--memory-max X`` and ``-p MemoryMax=X`` are the same bytes (issue 28)."""
    from agentscope_systemd._managers import _scopeprops

    size = parse_size(text)
    sent = _scopeprops.build(properties={"MemoryMax": text})["MemoryMax"][1]
    assert sent == (2**64 - 1 if size is None else size)
    for option in (["--memory-max", text], ["-p", f"MemoryMax={text}"]):
        assert run("run", "a", *option, "--", "true").code == 0


@pytest.mark.parametrize("text", ["1.5X", "0", "-1G", "1.5", "150%", "9E", "\u00b2G", "G", ""])
def test_memory_max_and_p_memorymax_refuse_alike(fleet: FakeFleet, text: str) -> None:
    for option in (["--memory-max", text], ["-p", f"MemoryMax={text}"]):
        result = run("run", "a", *option, "--", "true")
        assert result.code == 2, (option, result.stderr)
        assert "MemoryMax" in result.stderr or "--memory-max" in result.stderr
        assert_no_traceback(result)
    assert not [c for c in fleet.calls if c[0] == "launch"]


def test_run_memory_max_infinity_is_no_cap(fleet: FakeFleet, tmp_path: Path) -> None:
    result = run(
        "run", "a", "--memory-max", "infinity", "--log", str(tmp_path / "a.log"), "--", "true"
    )
    assert result.code == 0, result.stderr
    launch = next(c for c in fleet.calls if c[0] == "launch")
    assert launch[3]["memory_max"] is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TERM", signal.SIGTERM),
        ("SIGKILL", signal.SIGKILL),
        ("hup", signal.SIGHUP),
        ("9", signal.SIGKILL),
        ("sigusr1", signal.SIGUSR1),
    ],
)
def test_parse_signal(text: str, expected: signal.Signals) -> None:
    assert parse_signal(text) == expected


@pytest.mark.parametrize("text", ["NOPE", "999", "", "SIG"])
def test_parse_signal_rejects(text: str) -> None:
    with pytest.raises(BadInput, match="no signal"):
        parse_signal(text)


def test_parse_env() -> None:
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("A", "=1"):
        with pytest.raises(BadInput):
            parse_env([bad])


def test_split_globals() -> None:
    opts, command, rest = split_globals(
        ["--manager", "system", "--fleet=ci", "--json", "exec", "a", "--", "ls", "--json"]
    ) or pytest.fail("did not split")
    assert opts == _fleet.Options(manager="system", fleet="ci", json=True, debug=False)
    assert command == "exec"
    assert rest == ["a", "--", "ls", "--json"]
    assert split_globals(["--manager", "bogus", "ls"]) is None
    assert split_globals(["--version"]) is None
    assert split_globals(["--fleet"]) is None


# -- global options -------------------------------------------------------------


def test_global_options_after_the_command_mean_the_same(fleet: FakeFleet) -> None:
    before, after = run_json("ls"), run("ls", "--json", "--fleet", "ci")
    assert after.code == before[0].code == 0
    assert json.loads(after.stdout) == before[1]
    assert fleet.opened[-1].fleet == "ci"  # type: ignore[attr-defined]
    # The agent's own command line is left alone.
    assert hoist_globals(["exec", "a", "--json", "--", "ls", "--json", "--fleet", "x"]) == [
        "--json",
        "exec",
        "a",
        "--",
        "ls",
        "--json",
        "--fleet",
        "x",
    ]
    assert hoist_globals(["--fleet", "f", "ls"]) == ["--fleet", "f", "ls"]


def test_version() -> None:
    result = run("--version")
    assert result.code == 0
    assert result.stdout.strip() == f"agentscope {agentscope_systemd.__version__}"
    result = run("--json", "--version")
    assert json.loads(result.stdout) == {
        "schema": "agentscope.version/1",
        "version": agentscope_systemd.__version__,
    }


def test_global_options_reach_the_factory(fleet: FakeFleet) -> None:
    result = run("--manager", "system", "--fleet", "ci", "ls")
    assert result.code == 0, result.stderr
    assert fleet.opened == [_fleet.Options(manager="system", fleet="ci")]  # type: ignore[attr-defined]
    assert fleet.closed


def test_default_manager_follows_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert _fleet.Options().resolved_manager == "system"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _fleet.Options().resolved_manager == "user"
    assert _fleet.Options(manager="system").resolved_manager == "system"


def test_help_and_no_args() -> None:
    result = run("--help")
    assert result.code == 0
    assert "monitor" in result.stdout
    assert run().code in (0, 2)


# -- exit codes ---------------------------------------------------------------------

ERRORS = [
    (agentscope_systemd.InvalidName("agent", "-x", "starts with '-'"), 2, "invalid_name"),
    (agentscope_systemd.LaunchError("'nope' not found on the agent's PATH"), 2, "launch_error"),
    (agentscope_systemd.InvalidConfig("memory_max", -1, "a size"), 2, "invalid_config"),
    # Conditions of the host, not bad input, though LaunchErrors (#30).
    (agentscope_systemd.HostUnderPressure(3.0, 0.0, 40.0, 0.0), 1, "host_under_pressure"),
    (agentscope_systemd.TmuxUnavailable("tmux is not installed"), 1, "tmux_unavailable"),
    (agentscope_systemd.TmuxError("tmux could not start its server"), 1, "tmux_error"),
    (agentscope_systemd.AgentNotFound("default", "ghost"), 3, "not_found"),
    (
        agentscope_systemd.SystemdUnavailable("user", "unix:path=/run/user/1/bus", "no such file"),
        4,
        "systemd_unavailable",
    ),
    (
        agentscope_systemd.BusError("StopUnit", "org.freedesktop.systemd1.NoSuchUnit", "gone"),
        1,
        "bus_error",
    ),
    (
        agentscope_systemd.AgentExists("default", "a", "agentscope-default-a-000000.scope"),
        1,
        "agent_exists",
    ),
    (agentscope_systemd.AgentscopeError("fleet 'default' is closed"), 1, "error"),
    (PermissionError(13, "Permission denied"), 1, "os_error"),
    (RuntimeError("boom"), 1, "internal"),
]


def _examples(help_text: str) -> list[list[str]]:
    """The example command lines of a ``--help``, as argv (``sudo`` dropped)."""
    import shlex

    _, found, rest = help_text.partition("Examples:\n")
    assert found, "no Examples: section"
    lines = [line.strip() for line in rest.strip("\n").splitlines()]
    lines = lines[: lines.index("") if "" in lines else len(lines)]
    return [shlex.split(line.removeprefix("sudo ")) for line in lines]


def test_the_root_help_has_examples_that_parse() -> None:
    result = run("--help")
    assert result.code == 0, result.stderr
    examples = _examples(result.stdout)
    assert len(examples) >= 3
    for argv in examples:
        split = split_globals(hoist_globals(argv[1:]))
        assert split is not None, argv
        assert split[1] in COMMANDS, argv


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_commands_help_has_examples_that_parse(command: str) -> None:
    """``agentscope COMMAND --help`` shows examples, and each is a command line this
    agentscope takes: its options exist and their values parse (issue 28)."""
    from agentscope_systemd._cli._call import parse_call_args

    result = run(command, "--help")
    assert result.code == 0, result.stderr
    examples = _examples(result.stdout)
    assert examples
    for argv in examples:
        assert argv[0] == "agentscope", argv
        split = split_globals(hoist_globals(argv[1:]))
        assert split is not None, argv
        _opts, name, args = split
        assert name == command, argv
        if command == "exec":
            assert parse_exec_args(args).cmd, argv
        elif command == "call":
            assert parse_call_args(args)[1], argv
        else:  # click parses it all: unknown options and bad values raise
            build_command(command).make_context(command, list(args))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_at_80_columns_cuts_nothing(command: str) -> None:
    """Every option's names and environment variable are whole at 80 columns (issue 28)."""
    result = run(command, "--help", env={"COLUMNS": "80"})
    assert result.code == 0, result.stderr
    assert "\u2026" not in result.stdout
    assert max(map(len, result.stdout.splitlines())) <= 80
    words = {word.strip(",") for word in result.stdout.split()}
    if command in ("exec", "call"):
        return  # their own help, not typer's: test_exec_help and tests/test_calls.py
    for param in build_command(command).params:
        for name in [*param.opts, *param.secondary_opts]:
            if param.param_type_name == "option":
                assert name in words, (command, name)
        if param.envvar:
            assert param.envvar in result.stdout.replace("\n", " ").replace("  ", ""), (
                command,
                param.envvar,
            )


@pytest.mark.parametrize(("exc", "code", "kind"), ERRORS)
@pytest.mark.parametrize("command", [["stop", "a"], ["kill", "a"], ["freeze", "a"], ["ls"]])
def test_exit_codes(
    fleet: FakeFleet, exc: BaseException, code: int, kind: str, command: list[str]
) -> None:
    fleet.fail = exc
    result = run(*command)
    assert result.code == code
    assert result.stdout == ""
    assert result.stderr.startswith("agentscope: error: ")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert_no_traceback(result)
    result = run("--json", *command)
    assert result.code == code
    assert result.stdout == ""
    assert json.loads(result.stderr) == {
        "schema": "agentscope.error/1",
        "error": json.loads(result.stderr)["error"],
        "kind": kind,
    }


def test_debug_shows_traceback(fleet: FakeFleet) -> None:
    fleet.fail = agentscope_systemd.AgentNotFound("default", "ghost")
    result = run("--debug", "stop", "ghost")
    assert result.code == 3
    assert "Traceback" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["nosuchcommand"],
        ["stop", "a", "--bogus"],
        ["--manager", "bogus", "ls"],
        ["kill"],
        ["report", "--top", "many"],
        ["stop"],
        ["stop", "a", "--all"],
        ["kill", "a", "--signal", "NOPE"],
        ["events", "--since", "the day before"],
        ["gc", "--retention", "forever"],
        ["--user", "--system", "ls"],
        ["ls", "--manager", "user", "--system"],
        ["run", "a", "--memory-max", "0", "--", "true"],
        ["run", "a", "--memory-max", "-1G", "--", "true"],
        ["run", "a", "--memory-max", "lots", "--", "true"],
        ["run", "a", "--env", "NOEQUALS", "--", "true"],
    ],
)
def test_usage_errors_exit_2(fleet: FakeFleet, args: list[str]) -> None:
    result = run(*args)
    assert result.code == 2, result
    assert_no_traceback(result)
    result = run("--json", *args)
    assert result.code == 2, result
    assert result.stdout == ""
    error = json.loads(result.stderr)
    assert error["kind"] in ("usage", "bad_input")
    assert error["error"]
    assert not [c for c in fleet.calls if c[0] in ("launch", "adopt", "stop", "kill")]


def test_size_error_names_the_problem(fleet: FakeFleet) -> None:
    result = run("run", "a", "--memory-max", "0", "--", "true")
    assert "'0' is out of range: it must be a size from 1 byte" in result.stderr
    result = run("run", "a", "--memory-max", "-2G", "--", "true")
    assert "'-2G' is not a number this field takes: it must be a size" in result.stderr


# -- commands and their JSON ----------------------------------------------------------


def test_run(fleet: FakeFleet, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "a.log"
    result, data = run_json(
        "run",
        "a",
        "--cwd",
        str(tmp_path),
        "--env",
        "X=1",
        "--memory-max",
        "1.5G",
        "--log",
        str(log),
        "--",
        "sh",
        "-c",
        "echo hi",
    )
    assert result.code == 0, result.stderr
    assert data == {
        "schema": "agentscope.launched/1",
        "name": "a",
        "unit": "agentscope-default-a-3f9a2c.scope",
        "pid": 4242,
        "log": str(log),
    }
    ((_, name, argv, kw),) = [c for c in fleet.calls if c[0] == "launch"]
    assert (name, argv) == ("a", ["sh", "-c", "echo hi"])
    assert kw["memory_max"] == 3 * 2**29
    assert kw["cwd"] == str(tmp_path)
    assert kw["env"]["X"] == "1"
    assert kw["env"]["PATH"] == os.environ["PATH"]
    assert kw["stdin"] == subprocess.DEVNULL
    assert kw["stdout"] is kw["stderr"]
    assert log.exists()
    human = run("run", "b", "--log", str(log), "--", "true")
    assert human.code == 0
    assert "agentscope-default-b-3f9a2c.scope" in human.stdout
    assert str(log) in human.stdout


def test_run_passes_the_resource_controls_and_the_grace(fleet: FakeFleet, tmp_path: Path) -> None:
    result, _data = run_json(
        "run",
        "a",
        "--log",
        str(tmp_path / "a.log"),
        "--tasks-max",
        "32",
        "--cpu-weight",
        "50",
        "--io-weight",
        "200",
        "-p",
        "CPUQuota=150%",
        "--property",
        "AllowedCPUs=0-1",
        "--reap-after",
        "keep",
        "--",
        "true",
    )
    assert result.code == 0, result.stderr
    ((_, _name, _argv, kw),) = [c for c in fleet.calls if c[0] == "launch"]
    assert (kw["tasks_max"], kw["cpu_weight"], kw["io_weight"]) == (32, 50, 200)
    assert kw["properties"] == {"CPUQuota": "150%", "AllowedCPUs": "0-1"}
    assert kw["reap_after"] == "keep"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks-max", "0"], "TasksMax"),
        (["--tasks-max", "many"], "--tasks-max takes a whole number"),
        (["-p", "MemoryHigh=1G"], "throttles"),
        (["-p", "TasksMax"], "NAME=VALUE"),
        (["-p", "Nice=5"], "one of AllowedCPUs"),
        (["-p", "CPUWeight=5", "-p", "CPUWeight=6"], "given twice"),
        (["--cpu-weight", "5", "-p", "CPUWeight=6"], "given once"),
        (["--reap-after", "-1"], "reap_after"),
    ],
)
def test_run_refuses_bad_controls_before_opening_the_fleet(
    fleet: FakeFleet, args: list[str], message: str
) -> None:
    result = run("run", "a", *args, "--", "true")
    assert result.code == 2, result.stdout
    assert message in result.stderr
    assert fleet.calls == []  # nothing was asked of the fleet, not even opened
    assert "Traceback" not in result.stderr


def test_exec_takes_the_controls(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = parse_exec_args(
        ["a", "--tasks-max", "8", "-p", "CPUQuota=50%", "--reap-after=3", "--", "sh"]
    )
    assert (parsed.name, parsed.cmd, parsed.tasks_max, parsed.reap_after) == ("a", ["sh"], "8", "3")
    assert parsed.properties == ["CPUQuota=50%"]
    result = run("exec", "a", "--io-weight", "0", "--", "true")
    assert result.code == 125  # exec's own code for bad input
    assert "IOWeight" in result.stderr


def test_run_default_log_path(
    fleet: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = run(
        "--json", "--fleet", "ci", "run", "a", "--", "true", env={"XDG_STATE_HOME": str(tmp_path)}
    )
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["log"] == str(tmp_path / "agentscope/logs/ci/a.log")
    system = _fleet.Options(manager="system", fleet="ci")
    assert _fleet.default_log_path(system, "a") == Path("/var/log/agentscope/ci/a.log")


def test_ls(fleet: FakeFleet) -> None:
    result, data = run_json("ls")
    assert result.code == 0
    assert [a["name"] for a in data] == ["builder-1", "reviewer"]
    for agent in data:
        assert {"name", "unit", "pid", "state", "memory_current", "oom_kills", "started"} <= set(
            agent
        )
    human = run("ls")
    assert "builder-1" in human.stdout
    assert "frozen" in human.stdout


def test_ls_says_what_a_lingering_agent_left(fleet: FakeFleet) -> None:
    fleet.agent_list = [_agent("mcp", state="lingering", leftovers=3, reap_after=10.0)]
    human = run("ls")
    assert human.code == 0
    assert "lingering (3 left)" in human.stdout
    _, data = run_json("ls")
    assert (data[0]["state"], data[0]["leftovers"]) == ("lingering", 3)


def test_ls_empty(fleet: FakeFleet) -> None:
    fleet.agent_list = []
    assert run_json("ls")[1] == []
    assert "no agents" in run("ls").stdout


def test_stop_kill_freeze_thaw(fleet: FakeFleet) -> None:
    assert run_json("stop", "a", "--timeout", "3")[1] == {
        "schema": "agentscope.stop/1",
        "stopped": ["a"],
        "failed": [],
    }
    assert run_json("kill", "a", "--signal", "9")[1] == {
        "schema": "agentscope.kill/1",
        "name": "a",
        "signal": "SIGKILL",
    }
    assert run_json("kill", "a")[1] == {
        "schema": "agentscope.kill/1",
        "name": "a",
        "signal": "SIGTERM",
    }
    assert run_json("freeze", "a")[1] == {
        "schema": "agentscope.state/1",
        "name": "a",
        "frozen": True,
    }
    assert run_json("thaw", "a")[1] == {
        "schema": "agentscope.state/1",
        "name": "a",
        "frozen": False,
    }
    assert [c for c in fleet.calls if c[0] != "agents"] == [
        ("stop", "a", 3.0),
        ("kill", "a", 9),
        ("kill", "a", 15),
        ("freeze", "a"),
        ("thaw", "a"),
    ]


def test_stop_all(fleet: FakeFleet) -> None:
    result, data = run_json("stop", "--all")
    assert result.code == 0
    assert data == {
        "schema": "agentscope.stop/1",
        "stopped": ["builder-1", "reviewer"],
        "failed": [],
    }
    assert result.stderr == ""  # no progress when stderr is no terminal


def test_stop_all_reports_failures(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(name: str, timeout: float = 10) -> None:
        if name == "reviewer":
            raise agentscope_systemd.BusError(
                "StopUnit", "org.freedesktop.DBus.Error.AccessDenied", "no"
            )
        if name == "builder-1":
            raise agentscope_systemd.AgentNotFound(
                "default", name
            )  # ended meanwhile: counts as stopped

    monkeypatch.setattr(fleet, "stop", stop)
    result, data = run_json("stop", "--all")
    assert result.code == 1
    assert data["stopped"] == ["builder-1"]
    assert [f["name"] for f in data["failed"]] == ["reviewer"]
    assert json.loads(result.stderr)["kind"] == "failed"


def test_report(fleet: FakeFleet) -> None:
    result, data = run_json("report", "--top", "2")
    assert result.code == 0
    assert set(data) >= {"host", "pressure", "agents", "processes"}
    assert {"agent", "unit", "memory_current"} <= set(data["agents"][0])
    assert len(data["processes"]) == 2
    assert {"pid", "comm", "rss", "agent"} <= set(data["processes"][0])
    assert ("report", 2) in fleet.calls


def test_events(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: NOW)
    result = run("--json", "events", "--since", "10m", "--kind", "oom_kill")
    assert result.code == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["kind"] for e in lines] == ["oom_kill"]
    for event in lines:
        assert {"ts", "kind", "agent", "detail"} <= set(event)
    assert ("events", NOW - 600, "oom_kill", None, 1000) in fleet.calls  # one page
    human = run("events")
    assert "oom_kill builder-1 pid=5001 comm=node" in human.stdout


def test_events_follow_polls_after_the_last_id(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    result = run("--json", "events", "--follow")
    assert result.code == 130  # Ctrl-C ends a follow as it ends every command
    assert json.loads(result.stderr) == {
        "schema": "agentscope.error/1",
        "error": "interrupted",
        "kind": "interrupted",
    }
    assert len(result.stdout.splitlines()) == 2
    assert ("events", None, None, 2, None) in fleet.calls


def test_events_filters_go_to_the_query(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: NOW)
    argv = ("events", "--agent", "builder-1", "--until", "1m", "--limit", "5")
    assert run("--json", *argv).code == 0
    assert ("events-more", "builder-1", NOW - 60, 5) in fleet.calls


def test_events_follow_with_nothing_yet_starts_after_the_newest(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No match at first: the poll must still not ask for the whole history.
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    assert run("--json", "events", "--follow", "--kind", "nothing-like-it").code == 130
    polls = [c for c in fleet.calls if c[0] == "events" and c[1:] != (None, None, None, None)]
    assert len(polls) >= 2
    assert all(c[3] == max(e["id"] for e in EVENTS) for c in polls[1:])


def test_gc(fleet: FakeFleet) -> None:
    assert run_json("gc")[1] == {
        "schema": "agentscope.gc/1",
        "removed": 3,
        "retention_seconds": 7 * 86400,
    }
    assert run_json("gc", "--retention", "2h")[1]["retention_seconds"] == 7200


@pytest.mark.parametrize(("span", "seconds"), [("90", 90.0), ("1min 30s", 90.0), ("500ms", 0.5)])
def test_every_time_option_takes_systemd_time_spans(
    fleet: FakeFleet, span: str, seconds: float
) -> None:
    """stop --timeout, top/monitor --interval, --guard-psi-seconds, --reap-after: one grammar."""
    assert run_json("stop", "a", "--timeout", span)[0].code == 0
    assert ("stop", "a", seconds) in fleet.calls
    assert run("monitor", "--interval", span).code == 0
    assert ("monitor", seconds, 10) in fleet.calls
    assert run("monitor", "--guard", "--guard-psi-seconds", span).code == 0
    (config,) = [c[3] for c in fleet.calls if c[0] == "monitor" and len(c) > 3]
    assert config.psi_full_seconds == seconds
    assert run("top", "--interval", span).code == 0  # no terminal: one table, no loop
    result = run_json("run", "a", "--reap-after", span, "--", "true")[0]
    assert result.code == 0, result.stderr
    ((*_, kw),) = [c for c in fleet.calls if c[0] == "launch"]
    assert kw["reap_after"] == seconds
    parsed = parse_exec_args(["a", "--reap-after", span, "--", "sh"])
    assert launch_controls(reap_after=parsed.reap_after)["reap_after"] == seconds


def test_top_without_a_terminal(fleet: FakeFleet) -> None:
    result = run("top")
    assert result.code == 0
    assert "builder-1" in result.stdout
    result, data = run_json("top")
    assert set(data) == {"schema", "agents", "pressure", "events"}


def test_top_view_renders() -> None:
    text = _render.render_text(
        _render.top_view(
            [_agent("a").data, _agent("b", memory_current=None).data],
            REPORT["pressure"],
            EVENTS,
            NOW,
        )
    )
    assert "some avg10=1.50" in text
    assert "oom_kill" in text


def test_monitor_prints_events_and_notifies(
    fleet: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fleet.monitor

    @contextmanager
    def slow(
        interval: float = 2.0, top: int = 10, **options: Any
    ) -> Iterator[Iterator[FakeRecord]]:
        def spaced(events: Iterator[FakeRecord]) -> Iterator[FakeRecord]:
            for event in events:
                time.sleep(0.15)  # more than a period: a WATCHDOG=1 falls between
                yield event

        with real(interval, top, **options) as events:
            yield spaced(events)

    monkeypatch.setattr(fleet, "monitor", slow)
    sock_path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(sock_path))
        server.settimeout(2)
        result = run(
            "--json", "monitor", "--interval", "0.1", env={"NOTIFY_SOCKET": str(sock_path)}
        )
        assert result.code == 0, result.stderr
        assert [json.loads(x)["kind"] for x in result.stdout.splitlines()] == ["start", "oom_kill"]
        messages = []
        server.settimeout(0.5)
        try:
            while True:
                messages.append(server.recv(4096).decode())
        except TimeoutError:
            pass
    assert messages[0].splitlines()[0] == "READY=1"
    assert messages[0].splitlines()[1].startswith("STATUS=fleet default: 2 agents (1 frozen, 1 ")
    assert any(m.startswith("WATCHDOG=1\nSTATUS=") for m in messages)
    assert messages[-1] == "STOPPING=1"
    assert ("monitor", 0.1, 10) in fleet.calls


GUARD_KILL = {
    "kind": "guard_kill",
    "ts": NOW - 5,
    "agent": "builder-1",
    "unit": "agentscope-default-builder-1-a1b2c3.scope",
    "pid": 5002,
    "comm": "pytest\x1b[31m",
    "cmdline": "pytest -x",
    "rss": 900 << 20,
    "swap": 100 << 20,
    "trigger": "memory",
    "mem_available_percent": 4.5,
    "swap_free_percent": 0.0,
    "psi_full_avg10": 12.0,
    "psi_some_avg10": 40.0,
    "reaction_seconds": 0.042,
    "released": True,
}


def test_monitor_guard_options_make_its_config(fleet: FakeFleet) -> None:
    from agentscope_systemd import GuardConfig

    result = run(
        "monitor",
        "--guard",
        "--guard-mem-available",
        "5",
        "--guard-swap-free",
        "2.5",
        "--guard-psi-full",
        "off",
        "--guard-psi-seconds",
        "30",
        "--guard-process",
    )
    assert result.code == 0, result.stderr
    (call,) = [c for c in fleet.calls if c[0] == "monitor"]
    config = call[3]
    assert isinstance(config, GuardConfig)
    assert (config.mem_available_percent, config.swap_free_percent) == (5, 2.5)
    assert (config.psi_full_percent, config.psi_full_seconds) == (None, 30)
    assert config.process
    assert config.oom_score_adj == (-1000 if os.geteuid() == 0 else None)
    # Without --guard there is none.
    fleet.calls.clear()
    assert run("monitor").code == 0
    assert ("monitor", 2.0, 10) in fleet.calls


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--guard-mem-available", "150"], "--guard-mem-available = '150' is out of range"),
        (["--guard-psi-full", "0"], "--guard-psi-full '0' is not a percentage above 0"),
        (["--guard-psi-full", "lots"], "--guard-psi-full 'lots' is not a percentage"),
        (["--guard-psi-seconds", "2h"], "--guard-psi-seconds = '2h' is out of range"),
        (["--guard-psi-seconds", "-1"], "--guard-psi-seconds = '-1' is not a time span"),
        (["--guard-psi-seconds", "nan"], "--guard-psi-seconds = 'nan' is not a time span"),
    ],
)
def test_monitor_guard_values_out_of_range_exit_2(
    fleet: FakeFleet, args: list[str], message: str
) -> None:
    result = run("monitor", "--guard", *args)
    assert result.code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(c[0] == "monitor" for c in fleet.calls)  # refused before connecting


def test_monitor_prints_a_guard_kill_as_one_line(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextmanager
    def one_kill(
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: object = False,
        reclaim_escaped: bool = False,
        **options: Any,
    ) -> Iterator[Iterator[FakeRecord]]:
        yield iter([FakeRecord(GUARD_KILL)])

    monkeypatch.setattr(fleet, "monitor", one_kill)
    result = run("monitor", "--guard")
    assert result.code == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert " guard_kill builder-1 pid=5002 comm=pytest?[31m size=1000.0MiB" in line
    assert "trigger=memory mem_available=4.50% swap_free=0.00% psi_full=12.00%" in line
    assert line.endswith(" reaction=42ms")
    as_json = run("--json", "monitor", "--guard")
    # The event shape events --json prints of its record (agentscope.event), not yet recorded.
    assert json.loads(as_json.stdout) == {
        "schema": "agentscope.event/1",
        "id": None,
        "ts": NOW - 5,
        "fleet": "default",
        "agent": "builder-1",
        "kind": "guard_kill",
        "detail": {k: v for k, v in GUARD_KILL.items() if k not in ("kind", "ts", "agent")},
    }


def test_events_show_guard_kill_rows_readably(fleet: FakeFleet) -> None:
    detail = {k: v for k, v in GUARD_KILL.items() if k not in ("kind", "ts", "agent")}
    record = {"id": 3, "ts": NOW, "fleet": "default", "agent": "builder-1"}
    line = _render.event_line({**record, "kind": "guard_kill", "detail": detail})
    assert " guard_kill builder-1 pid=5002 " in line
    assert "size=1000.0MiB trigger=memory mem_available=4.50%" in line
    psi = _render.event_line({**GUARD_KILL, "trigger": "psi", "released": False})
    assert "trigger=psi mem_available=4.50% swap_free=0.00% psi_full=12.00%" in psi
    assert psi.endswith(" reaction=42ms released=no")


class SignalledStream:
    """A monitor's stream as the blocking facade gives it: ``close()`` ends it
    after the events it already has. Its first event comes with ``signum`` sent
    to this process; ``in_flight`` are events still on their way then."""

    def __init__(
        self, signum: int, in_flight: Sequence[FakeRecord] = (), *, guard: bool = True
    ) -> None:
        self.signum, self.in_flight, self.guard = signum, list(in_flight), guard
        self.closed = threading.Event()
        self.started = False

    def guard_running(self) -> bool:
        return self.guard

    def __iter__(self) -> SignalledStream:
        return self

    def first(self) -> FakeRecord:
        """The first event; the signal is sent as it is handed over."""
        os.kill(os.getpid(), self.signum)
        return FakeRecord(EVENTS[0], id=1)

    def __next__(self) -> FakeRecord:
        if not self.started:
            self.started = True
            return self.first()
        self.closed.wait(5)  # nothing more comes until the monitor closes
        if self.in_flight:
            return self.in_flight.pop(0)
        raise StopIteration

    def close(self) -> None:
        self.closed.set()


def test_monitor_stops_on_sigterm(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    @contextmanager
    def endless(
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: object = False,
        reclaim_escaped: bool = False,
        **options: Any,
    ) -> Iterator[SignalledStream]:
        yield SignalledStream(signal.SIGTERM)

    monkeypatch.setattr(fleet, "monitor", endless)
    previous = signal.getsignal(signal.SIGTERM)
    before = {t for t in threading.enumerate() if t.name == "agentscope-monitor"}
    result = run("monitor", "--interval", "0.1")
    assert result.code == 0
    assert signal.getsignal(signal.SIGTERM) is previous
    # The event pump stops with the command: an endless stream must not keep
    # a thread spinning (and filling memory) after it.
    for thread in threading.enumerate():
        if thread.name == "agentscope-monitor" and thread not in before:
            thread.join(5)
            assert not thread.is_alive()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_stopped_monitor_prints_the_guard_kill_still_on_its_way(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    # Seen in CI (bookworm, user manager): the guard killed two tool calls; the
    # harness stopped the monitor as soon as the second had died, and its kill
    # was in the log but never in the --json stream.
    @contextmanager
    def monitor(*args: Any, **kwargs: Any) -> Iterator[SignalledStream]:
        yield SignalledStream(signum, [FakeRecord(GUARD_KILL)])

    monkeypatch.setattr(fleet, "monitor", monitor)
    result = run("--json", "monitor", "--guard")
    assert result.code == code, result.stderr
    kinds = [json.loads(line)["kind"] for line in result.stdout.splitlines()]
    assert kinds == [EVENTS[0]["kind"], "guard_kill"]
    assert "stopped before its last events" not in result.stderr


@dataclass
class PrintSignals(FakeRecord):
    """An event that sends ``signum`` to this process while it is being printed."""

    signum: int = signal.SIGTERM
    sent: bool = False

    def to_dict(self) -> dict[str, Any]:
        if not self.sent:  # once: a second signal cuts a stop short
            self.sent = True
            os.kill(os.getpid(), self.signum)  # the handler runs before this returns
        return super().to_dict()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_while_an_event_is_printed_loses_no_event(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    # CI, sd247, user manager: the guard killed two tool calls, both in the
    # log, and the stop that followed at once lost the second from --json. The
    # signal had come after the event left the monitor's queue and before it
    # was printed; the handler's exception then dropped it.
    kill = PrintSignals(GUARD_KILL, signum=signum)

    class Stream(SignalledStream):
        def first(self) -> FakeRecord:
            return kill

    @contextmanager
    def monitor(*args: Any, **kwargs: Any) -> Iterator[SignalledStream]:
        yield Stream(signum, [FakeRecord(EVENTS[0], id=1)])

    monkeypatch.setattr(fleet, "monitor", monitor)
    result = run("--json", "monitor", "--guard")
    assert result.code == code, result.stderr
    kinds = [json.loads(line)["kind"] for line in result.stdout.splitlines()]
    assert kinds == ["guard_kill", EVENTS[0]["kind"]]


def test_a_second_ctrl_c_cuts_the_monitors_drain_short(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first stop waits up to 10 s for the events still on their way; a
    # user who presses Ctrl-C again does not want to wait for them.
    class Stuck(SignalledStream):
        def __next__(self) -> FakeRecord:
            if not self.started:
                self.started = True
                return self.first()
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            time.sleep(30)  # a stream that never ends, closed or not
            raise StopIteration

    @contextmanager
    def monitor(*args: Any, **kwargs: Any) -> Iterator[SignalledStream]:
        yield Stuck(signal.SIGINT)

    monkeypatch.setattr(fleet, "monitor", monitor)
    t0 = time.monotonic()
    result = run("monitor")
    assert result.code == 130, result.stderr
    assert time.monotonic() - t0 < 5


def _http_get(path: Path, target: str) -> str:
    """``GET target`` over the unix socket ``path``: the reply's body."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(f"GET {target} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    return reply.split(b"\r\n\r\n", 1)[1].decode()


@pytest.mark.parametrize("running", [True, False])
def test_monitor_metrics_say_whether_its_guard_runs(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, running: bool
) -> None:
    # agentscope_guard_running feeds the AgentscopeGuardStopped alert
    # (docs/dashboards.md). The command once passed the facade's method where
    # a boolean was wanted, and the metric said 1 for a guard that had died.
    sock = tmp_path / "monitor.sock"
    scraped: list[str] = []

    class Stream(SignalledStream):
        def first(self) -> FakeRecord:
            scraped.append(_http_get(sock, "/metrics"))  # the face serves by now
            return super().first()

    @contextmanager
    def monitor(*args: Any, **kwargs: Any) -> Iterator[SignalledStream]:
        yield Stream(signal.SIGTERM, guard=running)

    monkeypatch.setattr(fleet, "monitor", monitor)
    result = run("monitor", "--guard", "--listen", f"unix:{sock}")
    assert result.code == 0, result.stderr
    (text,) = scraped
    line = next(x for x in text.splitlines() if x.startswith("agentscope_guard_running{"))
    assert line.endswith(" 1.0" if running else " 0.0"), line


# -- exec -------------------------------------------------------------------------------


def test_exec_adopts_then_execs(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    execs: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append((path, argv)))
    result = run("--fleet", "ci", "exec", "me", "--", "sh", "-c", "true")
    assert result.code == 0, result.stderr
    assert fleet.calls == [("adopt", os.getpid(), "me", None)]
    assert fleet.closed
    assert execs == [
        (
            subprocess.run(
                ["sh", "-c", "command -v sh"], capture_output=True, text=True
            ).stdout.strip(),
            ["sh", "-c", "true"],
        )
    ]
    assert "Running as unit: agentscope-default-me-3f9a2c.scope" in result.stderr


def test_exec_memory_max_caps_the_scope(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "execv", lambda path, argv: None)
    run("--json", "exec", "me", "--memory-max", "1G", "--", "true")
    assert ("adopt", os.getpid(), "me", 2**30) in fleet.calls


def test_exec_error_codes(fleet: FakeFleet) -> None:
    # exec's own failures are 125 (tests/test_cli_exec.py); the kind still says which.
    fleet.fail = agentscope_systemd.AgentExists(
        "default", "me", "agentscope-default-me-000000.scope"
    )
    result = run("--json", "exec", "me", "--", "true")
    assert result.code == 125
    assert json.loads(result.stderr)["kind"] == "agent_exists"


# What `agentscope exec` may import before it execs: every module costs
# milliseconds natively and ~30x that under TCG (bench_cli.py).
EXEC_IMPORTS = {
    "__future__",
    "_socket",
    "_struct",
    "struct",
    "agentscope_systemd",
    "agentscope_systemd._calls",  # a subpackage's __init__: its docstring only
    "agentscope_systemd._calls._calls",  # the scope's agent leaf for its calls (#26): os only
    "agentscope_systemd._errors",
    "agentscope_systemd._kernel",  # a subpackage's __init__: its docstring only
    "agentscope_systemd._kernel._statline",  # the one stat line split: no imports
    "agentscope_systemd._managers",
    "agentscope_systemd._managers._exec",
    "agentscope_systemd._names",
    "agentscope_systemd._numbers",  # the one number grammar: os only, no re
    "agentscope_systemd._managers._scope",
    "agentscope_systemd._managers._scopeprops",
    "agentscope_systemd._registry",
    "agentscope_systemd._registry._spool",
    "agentscope_systemd._managers._wire",
    "agentscope_systemd._typecheck",  # TYPE_CHECKING without typing: no imports
    "agentscope_systemd._cli",
    "agentscope_systemd._cli._errors",
    "agentscope_systemd._cli._exec",
    "agentscope_systemd._cli._options",
    "agentscope_systemd._cli._words",  # how the fast paths read their words: no imports
    "agentscope_systemd._cli.main",
}


def test_exec_fast_path_imports_only_what_it_needs() -> None:
    code = textwrap.dedent(
        """
        import os, sys
        before = set(sys.modules)
        from agentscope_systemd._managers import _exec
        def adopt_self(fleet, name, argv, **options):
            return "agentscope-default-me-000000.scope"

        _exec.adopt_self = adopt_self

        def execv(path, argv):
            new = sorted(set(sys.modules) - before)
            import json
            print(json.dumps({"path": path, "argv": argv, "new": new}))
            os._exit(0)

        os.execv = execv
        from agentscope_systemd._cli.main import main
        main(["--json", "exec", "me", "--", "true", "x"])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    data = json.loads(proc.stdout)
    assert set(data["new"]) <= EXEC_IMPORTS, set(data["new"]) - EXEC_IMPORTS
    assert data["argv"] == ["true", "x"]
    assert os.path.basename(data["path"]) == "true"


def test_exec_takes_the_library_path_when_the_fast_path_cannot(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "execv", lambda path, argv: None)
    result = run("--debug", "exec", "me", "--", "true")
    assert result.code == 0, result.stderr
    assert fleet.calls == [("adopt", os.getpid(), "me", None)]
    assert "exec takes the slow path: test" in result.stderr


@pytest.mark.parametrize(
    ("args", "name", "cmd", "memory_max", "quiet"),
    [
        (["a", "--", "sh", "-c", "x"], "a", ["sh", "-c", "x"], None, False),
        (["a", "sh", "-c", "x"], "a", ["sh", "-c", "x"], None, False),
        (["-q", "a", "--memory-max", "1G", "--", "ls", "-q"], "a", ["ls", "-q"], "1G", True),
        (["a", "--memory-max=2G", "--quiet", "true"], "a", ["true"], "2G", True),
        (["a", "--", "--weird"], "a", ["--weird"], None, False),
    ],
)
def test_exec_arguments(
    args: list[str], name: str, cmd: list[str], memory_max: str | None, quiet: bool
) -> None:
    parsed = parse_exec_args(args)
    assert (parsed.name, parsed.cmd, parsed.memory_max, parsed.quiet) == (
        name,
        cmd,
        memory_max,
        quiet,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the agent NAME is missing"),
        (["--", "true"], "the agent NAME is missing"),
        (["a", "--memory-max"], "--memory-max needs a value"),
        (["a", "-p"], "-p needs a value"),
        (["a", "--bogus", "--", "true"], "unknown option --bogus"),
    ],
)
def test_exec_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        parse_exec_args(args)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_exec_help(flag: str) -> None:
    result = run("exec", flag)
    assert result.code == 0, result.stderr
    assert "Usage: agentscope exec NAME" in result.stdout
    assert "--memory-max SIZE" in result.stdout


def test_exec_help_after_the_command_is_the_commands(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))
    result = run("exec", "me", "ls", "--help")
    assert result.code == 0, result.stderr
    assert execs == [["ls", "--help"]]


def test_options_after_the_agents_command_belong_to_the_agent(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))
    result = run("exec", "b", "true", "--json", "--fleet", "prod")
    assert result.code == 0, result.stderr
    assert execs == [["true", "--json", "--fleet", "prod"]]
    assert fleet.calls == [("adopt", os.getpid(), "b", None)]
    assert "Running as unit:" in result.stderr  # not --json: that was the agent's
    # Global options before the agent's command are still ours.
    execs.clear()
    result = run("exec", "b", "--json", "true", "--fleet", "x")
    assert execs == [["true", "--fleet", "x"]]


@pytest.mark.parametrize(
    "args",
    [
        ["run", "b", "true", "-v", "--json", "--fleet", "prod"],
        ["run", "--log", "{log}", "b", "true", "-v", "--json", "--fleet", "prod"],
        [
            "run",
            "b",
            "--log",
            "{log}",
            "-p",
            "TasksMax=8",
            "true",
            "-v",
            "--json",
            "--fleet",
            "prod",
        ],
        ["run", "b", "--tmux", "--memory-max=1G", "true", "-v", "--json", "--fleet", "prod"],
    ],
)
def test_options_after_runs_command_belong_to_the_agent(
    fleet: FakeFleet, tmp_path: Path, args: list[str]
) -> None:
    """``agentscope run b mytool -v --json``: mytool gets ``-v --json`` (issue 28)."""
    args = [a.replace("{log}", str(tmp_path / "b.log")) for a in args]
    result = run(*args)
    assert result.code == 0, result.stderr
    ((_, name, argv, _kw),) = [c for c in fleet.calls if c[0] == "launch"]
    assert (name, argv) == ("b", ["true", "-v", "--json", "--fleet", "prod"])
    assert fleet.name == "default"  # --fleet prod was the agent's
    assert not result.stdout.lstrip().startswith("{")  # --json too


def test_runs_valued_options_are_the_commands() -> None:
    """main.RUN_VALUED, which finds where run's agent command begins, lists run's options
    that take a value: an option added to run without it would eat the agent's command."""
    from agentscope_systemd._cli._app import build_command
    from agentscope_systemd._cli.main import RUN_VALUED

    command = build_command("run")
    valued = {
        opt
        for param in command.params
        if param.param_type_name == "option" and not param.is_flag
        for opt in param.opts
    }
    assert valued == set(RUN_VALUED)


@pytest.mark.parametrize(
    ("args", "front"),
    [
        (["exec", "b", "mytool", "--json", "--fleet", "prod"], []),
        (["exec", "--json", "b", "mytool", "--json"], ["--json"]),
        (["exec", "--memory-max", "1G", "b", "t", "--debug"], []),
        (["ls", "--json"], ["--json"]),
        (["run", "x", "--fleet", "f", "--", "sh", "--json"], ["--fleet", "f"]),
    ],
)
def test_hoist_globals_stops_at_the_agents_command(args: list[str], front: list[str]) -> None:
    hoisted = hoist_globals(args)
    assert hoisted[: len(front)] == front
    assert sorted(hoisted) == sorted(args)


def test_ctrl_c_exits_130(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "execv", interrupted)
    result = run("exec", "me", "--", "true")
    assert result.code == 130
    assert result.stderr.strip().endswith("agentscope: error: interrupted")
    assert "bug" not in result.stderr


def test_exec_finds_commands_like_the_shell(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "tool").write_text("not executable")
    path = f"{tmp_path / 'other'}:{tmp_path / 'bin'}"
    with pytest.raises(CommandNotFound, match="not found on PATH"):  # none is executable yet
        resolve_command("tool", {"PATH": path})
    tool.chmod(0o755)
    assert resolve_command("tool", {"PATH": path}) == str(tool)
    with pytest.raises(CommandNotFound, match="not found on PATH"):
        resolve_command("no-such-tool", {"PATH": path})
    with pytest.raises(CannotRun, match="not executable"):
        resolve_command(str(tmp_path / "other" / "tool"))
    with pytest.raises(CannotRun, match="not a file"):
        resolve_command(str(tmp_path / "other"))
    with pytest.raises(CommandNotFound, match="no such file"):
        resolve_command(str(tmp_path / "other" / "nothing"))


# -- sd_notify ----------------------------------------------------------------------


def test_format_state() -> None:
    assert format_state(READY=1, STATUS="3 agents\nall well") == "READY=1\nSTATUS=3 agents all well"


def test_notify_path_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        assert Notifier({"NOTIFY_SOCKET": str(path)}).send(WATCHDOG=1, STATUS="ok")
        assert server.recv(4096) == b"WATCHDOG=1\nSTATUS=ok"


def test_notify_abstract_socket() -> None:
    name = f"agentscope-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).send(READY=1)
        assert server.recv(4096) == b"READY=1"


def test_notify_unset_and_unsupported() -> None:
    assert not Notifier({}).send(READY=1)
    with pytest.raises(Failed, match="not a unix socket"):
        Notifier({"NOTIFY_SOCKET": "vsock:2:1234"})


# -- doctor -----------------------------------------------------------------------------

CAPS = {
    "manager": "user",
    "systemd_version": "252.38-1~deb12u1",
    "bus_address": "unix:path=/run/user/1000/bus",
    "cgroup_v2": True,
    "memory_controller": True,
    "scope_oom_policy": True,
    "pidfds": False,
    "slice": "app-agentscope-agents.slice",
    "slice_limits": {"MemoryHigh": 2**30, "MemoryMax": None, "MemorySwapMax": None},
}


def _facts(**over: Any) -> _doctor.Facts:
    base: dict[str, Any] = dict(
        manager="user",
        user="dev",
        capabilities=CAPS,
        default_oom_policy="stop",
        oomd_binary=False,
        linger=False,
        oom_score_adj=200,
    )
    return _doctor.Facts(**(base | over))


def test_doctor_json(monkeypatch: pytest.MonkeyPatch, fleet: FakeFleet) -> None:
    monkeypatch.setattr(_doctor, "gather", lambda opts: _facts())
    result, data = run_json("doctor")
    assert result.code == 1  # the slice limit fails
    assert data["systemd_version"] == "252.38-1~deb12u1"
    assert data["manager"] == "user"
    by_name = {c["name"]: c for c in data["checks"]}
    assert list(by_name) == [
        "systemd",
        "cgroup_v2",
        "memory_controller",
        "scope_oom_policy",
        "slice_limits",
        "default_oom_policy",
        "systemd_oomd",
        "linger",
        "oom_score_adj",
        "oom_victims",
    ]
    for check in data["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"}
        assert check["status"] in ("pass", "warn", "fail")
        if check["status"] != "pass":
            assert check["fix"]
    assert by_name["slice_limits"]["status"] == "fail"
    assert "systemctl --user set-property --runtime" in by_name["slice_limits"]["fix"]
    assert by_name["linger"]["fix"] == "sudo loginctl enable-linger dev"


def test_doctor_says_which_launch_gate_this_install_has() -> None:
    def gate(program: str | None) -> list[dict[str, Any]]:
        return [
            c for c in _doctor.checks(_facts(launch_gate=program)) if c["name"] == "launch_gate"
        ]

    (compiled,) = gate("/venv/lib/agentscope_systemd/_fleet/agentscope-gate")
    assert compiled["status"] == "pass"
    assert compiled["detail"].endswith("/agentscope-gate")
    (python,) = gate("")
    assert python["status"] == "warn"
    assert "preexec_fn" in python["detail"]
    assert "C compiler" in python["fix"]
    assert gate(None) == []  # not looked: no verdict


def test_doctor_says_who_names_oom_victims() -> None:
    def victims(**over: Any) -> dict[str, Any]:
        (check,) = [c for c in _doctor.checks(_facts(**over)) if c["name"] == "oom_victims"]
        return check

    assert victims(kmsg_readable=True)["status"] == "pass"
    journal = victims(journal_readable=True, journal_groups=("systemd-journal", "adm"))
    assert journal["status"] == "pass"
    assert "journal" in journal["detail"]
    # Debian's journal: its files' group and an ACL for adm; either will do.
    closed = victims(journal_groups=("systemd-journal", "adm"))
    assert closed["status"] == "warn"
    assert closed["fix"].startswith("sudo usermod -aG systemd-journal dev")
    assert "systemd-journal, adm" in closed["detail"]
    assert victims(journal_groups=("adm",))["fix"].startswith("sudo usermod -aG adm dev")
    # Already in the group, but this process predates it: only a new login helps.
    member = victims(journal_groups=("adm",), journal_member=True)
    assert member["fix"].startswith("log in again")


def test_doctor_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = _facts(capabilities=None, unreachable="cannot reach the user manager")
    monkeypatch.setattr(_doctor, "gather", lambda opts: facts)
    result, data = run_json("doctor")
    assert result.code == 4
    assert data["checks"][0] == {
        "name": "systemd",
        "status": "fail",
        "detail": "cannot reach the user manager",
        "fix": "sudo loginctl enable-linger dev",
    }
    human = run("doctor")
    assert human.code == 4
    assert "FAIL  systemd" in human.stdout


def test_doctor_fix_clears(monkeypatch: pytest.MonkeyPatch, fleet: FakeFleet) -> None:
    facts = [_facts(), _facts(capabilities=CAPS | {"slice_limits": {"MemoryHigh": None}})]
    monkeypatch.setattr(_doctor, "gather", lambda opts: facts.pop(0))
    cleared: list[bool] = []
    fleet.clear_slice_limits = lambda: cleared.append(True)  # type: ignore[assignment,method-assign,return-value]
    result, data = run_json("doctor", "--fix")
    assert cleared == [True]
    assert {c["name"]: c["status"] for c in data["checks"]}["slice_limits"] == "pass"
    assert result.code == 0


def test_doctor_system_manager_needs_no_linger() -> None:
    checks = {c["name"]: c for c in _doctor.checks(_facts(manager="system", linger=None))}
    assert checks["linger"]["status"] == "pass"
    assert "sudo systemctl set-property" in checks["slice_limits"]["fix"]


# -- rendering snapshots ------------------------------------------------------------------


def _snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    # A missing snapshot is a failure, not a pass that writes it.
    assert path.exists(), f"no snapshot {path}: write it with AGENTSCOPE_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text()


def test_ls_table_snapshot() -> None:
    agents = [
        _agent(
            "builder-1", memory_current=6 * 2**30, memory_peak=8 * 2**30, oom_kills=2, calls=2
        ).data,
        _agent("reviewer", state="frozen", started=NOW - 40, pid=4300).data,
        _agent(
            "old",
            state="exited",
            started=NOW - 3 * 86400,
            memory_current=None,
            memory_peak=None,
            pid=0,
        ).data,
    ]
    _snapshot("ls.txt", _render.render_text(_render.ls_table(agents, now=NOW)))


def test_report_snapshot() -> None:
    _snapshot("report.txt", _render.render_text(_render.report_view(REPORT)))


def test_doctor_snapshot() -> None:
    checks = _doctor.checks(_facts())
    _snapshot("doctor.txt", _render.render_text(_render.doctor_view("252.38", "user", checks)))


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (3 * 2**29, "1.5 GiB"),
        (2**50, "1024.0 TiB"),
    ],
)
def test_format_bytes(n: int | None, text: str) -> None:
    assert _render.format_bytes(n) == text


def test_format_age() -> None:
    assert [_render.format_age(s) for s in (None, 5, 125, 3725, 90000)] == [
        "-",
        "5s",
        "2m",
        "1h02m",
        "1d01h",
    ]


# -- docs -----------------------------------------------------------------------------------


def test_docs_are_generated_from_the_app() -> None:
    path = ROOT / "docs" / "cli.md"
    if UPDATE:
        _docs.write(path)
    assert path.exists(), f"no {path}: write it with AGENTSCOPE_UPDATE_SNAPSHOTS=1"
    assert path.read_text() == _docs.generate()
    for command in (
        "run",
        "exec",
        "ls",
        "stop",
        "kill",
        "freeze",
        "thaw",
        "report",
        "events",
        "top",
        "monitor",
        "doctor",
        "gc",
    ):
        assert f"### `agentscope {command}`" in path.read_text()


def test_install_user_dry_run_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    before = sorted(tmp_path.rglob("*"))
    result, data = run_json("install", "--user", "--dry-run")
    assert result.code == 0
    assert data["scope"] == "user"
    assert data["dry_run"] is True
    assert any("app-agentscope-agents.slice" in line for line in data["done"])
    assert sorted(tmp_path.rglob("*")) == before


def test_install_both_scopes_is_bad_usage() -> None:
    result = run("install", "--user", "--system")
    assert result.code == 2
    assert "Traceback" not in result.stderr


def test_install_mglru_protection_is_for_system_installs_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    result = run("install", "--user", "--mglru-protection", "--dry-run")
    assert result.code == 2
    assert "--mglru-protection is host-wide" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.rglob("*")) == []


def test_uninstall_without_install_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    result = run("uninstall", "--user")
    assert result.code == 1
    assert "nothing to uninstall" in result.stderr


@pytest.mark.parametrize("comm", ["[/]", "[bold red]FAKE", "[link=http://x]y"])
def test_process_names_are_shown_as_text_not_markup(comm: str) -> None:
    report = {
        **REPORT,
        "agents": [{**REPORT["agents"][0], "name": "a", "unit": "[/u]"}],
        "processes": [{**REPORT["processes"][0], "comm": comm, "agent": "[b]x"}],
    }
    text = _render.render_text(_render.report_view(report), width=200)
    assert comm in text
    assert "[/u]" in text
    assert "[b]x" in text
    ls = _render.render_text(_render.ls_table([{"name": comm, "unit": comm}]), width=200)
    assert ls.count(comm) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "../../../../x", "--", "true"],
        ["run", "a" * 300, "--", "true"],
        ["run", "a/b", "--", "true"],
        ["stop", "../x"],
        ["kill", "x y"],
        ["--fleet", "x/../../../p", "run", "a", "--", "true"],
        ["--fleet", "x/../../../p", "ls"],
    ],
)
def test_a_bad_name_is_exit_2_before_any_file_or_connection(
    fleet: FakeFleet, tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = run("--json", *argv, env={"XDG_STATE_HOME": str(tmp_path)})
    assert result.code == 2, result.stderr
    assert json.loads(result.stderr)["kind"] == "invalid_name"
    assert fleet.opened == []  # type: ignore[attr-defined]
    assert list(tmp_path.rglob("*")) == []


def test_run_logs_are_private_and_not_reached_through_a_symlink(
    fleet: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the user manager's log directory
    env = {"XDG_STATE_HOME": str(tmp_path)}
    assert run("--json", "--fleet", "ci", "run", "a", "--", "true", env=env).code == 0
    logs = tmp_path / "agentscope" / "logs"
    assert stat.S_IMODE((logs / "ci").stat().st_mode) == 0o700
    assert stat.S_IMODE((logs / "ci" / "a.log").stat().st_mode) == 0o600
    victim = tmp_path / "victim"
    victim.write_text("")
    (logs / "ci" / "b.log").symlink_to(victim)
    result = run("--json", "--fleet", "ci", "run", "b", "--", "true", env=env)
    assert (result.code, json.loads(result.stderr)["kind"]) == (1, "failed")
    assert "cannot open the agent's log" in result.stderr


# -- errors that used to be internal bugs (#16 item 11) ---------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9007199254740993", 9007199254740993), ("9223372036854775808", 2**63), ("0.5K", 512)],
)
def test_parse_size_is_exact(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["18446744073709551615", "9223372036854775809", "8193P", "9" * 5000, "1" + "0" * 50],
)
def test_parse_size_refuses_more_than_8_eib(text: str) -> None:
    # 2^64 - 1 is systemd's "infinity": as a number it is over the maximum (#31).
    with pytest.raises(BadInput, match="8 EiB"):
        parse_size(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.kKmMgGtTpPiIbB -e+", max_size=30) | st.text(max_size=12))
def test_parse_size_is_a_size_or_bad_input(text: str) -> None:
    try:
        value = parse_size(text)
    except BadInput:
        return
    if text.strip().lower() == "infinity":
        assert value is None
        return
    assert isinstance(value, int)
    assert 1 <= value <= 2**63


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.smhdwSMHDW -:TZ+e", max_size=30) | st.text(max_size=12))
def test_time_parsers_give_a_number_or_bad_input(text: str) -> None:
    for parse in (parse_duration, lambda t: parse_since(t, NOW)):
        try:
            value = parse(text)
        except BadInput:
            continue
        assert math.isfinite(value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12) | st.integers(min_value=-5, max_value=10**30).map(str))
def test_parse_signal_is_a_signal_or_bad_input(text: str) -> None:
    try:
        sig = parse_signal(text)
    except BadInput:
        return
    assert isinstance(sig, signal.Signals)


def test_a_malformed_bus_address_is_exit_4() -> None:
    result = subprocess.run(
        # The systemd mode named: auto takes process mode where PID 1 is not systemd.
        [
            sys.executable,
            "-c",
            "from agentscope_systemd._cli.main import main; main()",
            "--json",
            "--manager",
            "systemd",
            "ls",
        ],
        env={
            **os.environ,
            "DBUS_SYSTEM_BUS_ADDRESS": "garbage",
            "DBUS_SESSION_BUS_ADDRESS": "garbage",
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 4, result.stderr
    assert json.loads(result.stderr)["kind"] == "systemd_unavailable"


def test_install_system_with_linger_is_bad_input() -> None:
    result = run("--json", "install", "--system", "--linger")
    assert (result.code, json.loads(result.stderr)["kind"]) == (2, "bad_input")


@pytest.mark.parametrize("address", ["vsock:2:1234", "/nonexistent/notify"])
def test_a_notify_socket_that_cannot_serve_is_a_one_line_failure(
    fleet: FakeFleet, address: str
) -> None:
    result = run("--json", "monitor", env={"NOTIFY_SOCKET": address})
    assert (result.code, json.loads(result.stderr)["kind"]) == (1, "failed")
    assert "NOTIFY_SOCKET" in json.loads(result.stderr)["error"]


def test_no_passwd_entry_and_no_home_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentscope_systemd import AgentscopeError
    from agentscope_systemd._registry import _spool

    def no_entry(uid: int) -> None:
        raise KeyError(uid)

    monkeypatch.setattr("pwd.getpwuid", no_entry)
    with pytest.raises(AgentscopeError, match="no passwd entry"):
        _spool.state_dir("user", {})


def test_a_burst_of_events_is_not_a_burst_of_samples(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextmanager
    def burst(
        interval: float = 2.0, top: int = 10, **options: Any
    ) -> Iterator[Iterator[FakeRecord]]:
        yield iter([FakeRecord(EVENTS[0], id=i) for i in range(500)])

    monkeypatch.setattr(fleet, "monitor", burst)
    result = run("--json", "monitor", "--interval", "5")
    assert result.code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 500
    samples = [c for c in fleet.calls if c[0] == "agents"]
    assert len(samples) <= 2  # the first one, and at most one more period


def test_a_stale_notify_socket_does_not_hide_why_the_monitor_stopped(
    fleet: FakeFleet, tmp_path: Path
) -> None:
    import agentscope_systemd

    fleet.fail = agentscope_systemd.SystemdUnavailable(
        "user", "unix:path=/x", "the connection was lost"
    )
    result = run("--json", "monitor", env={"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert (result.code, json.loads(result.stderr)["kind"]) == (4, "systemd_unavailable")


def test_events_are_printed_page_by_page(fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentscope_systemd._cli import _direct

    monkeypatch.setattr(_direct, "_EVENTS_PAGE", 1)
    result = run("--json", "events")
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [
        e["id"] for e in EVENTS
    ]
    pages = [c for c in fleet.calls if c[0] == "events"]
    assert [c[3] for c in pages] == [None, *[e["id"] for e in EVENTS]]
    assert all(c[4] == 1 for c in pages)


def test_monitor_reclaim_escaped_is_passed_to_the_monitor(fleet: FakeFleet) -> None:
    assert run("monitor", "--reclaim-escaped").code == 0
    assert ("monitor", 2.0, 10, "reclaim_escaped") in fleet.calls


def test_escaped_event_line_says_where_it_went_and_whether_it_came_back() -> None:
    live = {
        "kind": "escaped",
        "ts": NOW,
        "agent": "builder-1",
        "unit": "agentscope-default-builder-1-3f9a2c.scope",
        "pid": 77,
        "comm": "sleep",
        "cgroup": "/system.slice/run-r1.scope",
        "to_unit": "run-r1.scope",
        "reclaimed": None,
        "reclaim_error": None,
    }
    line = _render.event_line(live)
    assert line.endswith("escaped builder-1 pid=77 comm=sleep to=run-r1.scope")
    refused = {**live, "reclaimed": False, "reclaim_error": "Access denied"}
    assert _render.event_line(refused).endswith("reclaimed=no (Access denied)")
    # As the registry records it: the fields in detail.
    fields = {k: v for k, v in live.items() if k not in ("kind", "ts", "agent")}
    record = {"id": 3, "ts": NOW, "agent": "builder-1", "kind": "escaped"}
    line = _render.event_line({**record, "detail": {**fields, "reclaimed": True}})
    assert line.endswith("to=run-r1.scope reclaimed=yes")


def test_report_marks_escapees_under_their_agent() -> None:
    assert "ESCAPED" not in _render.render_text(_render.report_view(REPORT), width=200)
    first = {**REPORT["agents"][0], "escaped": 2, "escaped_rss": 3 * 2**20}
    report = {
        **REPORT,
        "agents": [first, *REPORT["agents"][1:]],
        "processes": [{**REPORT["processes"][0], "escaped": True}],
    }
    text = _render.render_text(_render.report_view(report), width=200)
    assert "ESCAPED" in text
    assert "2 (3.0 MiB)" in text
    assert "builder-1 (escaped)" in text


# -- Ctrl-C and the manager's spellings, in every command -------------------------

_EVERY_COMMAND = [
    ("ls",),
    ("stop", "a"),
    ("stop", "--all"),
    ("kill", "a"),
    ("freeze", "a"),
    ("thaw", "a"),
    ("attach", "a"),
    ("logs", "a"),
    ("send", "a", "hi"),
    ("report",),
    ("events",),
    ("top",),
    ("monitor",),
    ("gc",),
    ("run", "a", "--", "true"),
]


@pytest.mark.parametrize("args", _EVERY_COMMAND, ids=" ".join)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_exits_130_in_every_command(
    fleet: FakeFleet, tmp_path: Path, args: tuple[str, ...], as_json: bool
) -> None:
    fleet.fail = KeyboardInterrupt()
    env = {"XDG_STATE_HOME": str(tmp_path)}
    result = run("--user", *(("--json",) if as_json else ()), *args, env=env)
    assert result.code == 130, result
    assert "bug" not in result.stderr
    assert_no_traceback(result)
    if as_json:
        assert json.loads(result.stderr) == {
            "schema": "agentscope.error/1",
            "error": "interrupted",
            "kind": "interrupted",
        }
    else:
        assert result.stderr.strip().endswith("agentscope: error: interrupted")


def test_ctrl_c_in_the_monitor_is_130_after_a_clean_stop(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextmanager
    def monitor(*args: Any, **kwargs: Any) -> Iterator[SignalledStream]:
        fleet.calls.append(("monitor",))
        yield SignalledStream(signal.SIGINT)

    monkeypatch.setattr(fleet, "monitor", monitor)
    result = run("monitor")
    assert result.code == 130
    assert "interrupted; the monitor stopped cleanly" in result.stderr
    assert fleet.closed


@pytest.mark.parametrize(
    ("args", "manager"),
    [
        (("--user", "ls"), "user"),
        (("ls", "--user"), "user"),
        (("report", "--system"), "system"),
        (("--manager", "user", "--user", "ls"), "user"),
        (("--manager", "system", "events"), "system"),
        (("ls",), "auto"),
    ],
)
def test_user_and_system_are_accepted_everywhere(
    fleet: FakeFleet, tmp_path: Path, args: tuple[str, ...], manager: str
) -> None:
    result = run(*args, env={"XDG_STATE_HOME": str(tmp_path)})
    assert result.code == 0, result
    assert fleet.opened[-1].manager == manager  # type: ignore[attr-defined]


def test_exec_takes_user_and_system_too() -> None:
    split = split_globals(["--user", "exec", "a", "--", "true"])
    assert split is not None
    assert split[0].manager == "user"
    assert hoist_globals(["exec", "--system", "a", "--", "x", "--user"])[0] == "--system"
    assert split_globals(["--user", "--manager", "system", "exec", "a"]) is None  # typer: exit 2


# -- tables at their full width -----------------------------------------------------

_LONG_UNIT = "agentscope-production-fleet-builder-with-a-long-name-1-3f9a2c7d.scope"


@pytest.mark.parametrize("columns", [None, "80", "40"])
def test_piped_tables_never_fold_a_unit_name(fleet: FakeFleet, columns: str | None) -> None:
    fleet.agent_list = [_agent("builder-1", unit=_LONG_UNIT), _agent("r", unit=_LONG_UNIT[::-1])]
    ls = run("ls", env={"COLUMNS": columns})
    assert ls.code == 0
    for unit in (_LONG_UNIT, _LONG_UNIT[::-1]):
        assert [line for line in ls.stdout.splitlines() if unit in line], ls.stdout
    report = run("report", env={"COLUMNS": columns})
    assert report.code == 0
    for a in REPORT["agents"]:
        assert any(a["unit"] in line for line in report.stdout.splitlines()), report.stdout


def test_a_table_on_an_80_column_terminal_keeps_its_unit_names_whole() -> None:
    import io

    from rich.console import Console

    from agentscope_systemd._cli._context import show

    out = io.StringIO()
    terminal = Console(file=out, width=80, force_terminal=True, color_system=None)
    show(_render.ls_table([_agent("builder-1", unit=_LONG_UNIT).to_dict()], now=NOW), terminal)
    assert any(_LONG_UNIT in line for line in out.getvalue().splitlines()), out.getvalue()
    assert terminal.width == 80  # the console is left as it was


def test_a_table_on_a_dumb_terminal_keeps_its_unit_names_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A serial console (the demo's VM run when make's output is not a
    # terminal) or an editor's shell: rich holds TERM=dumb at 80 columns,
    # COLUMNS or not, and a width set alone did not widen it.
    import io

    from rich.console import Console

    from agentscope_systemd._cli._context import show

    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("COLUMNS", "100")
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, color_system=None)
    assert terminal.is_dumb_terminal
    show(_render.ls_table([_agent("builder-1", unit=_LONG_UNIT).to_dict()], now=NOW), terminal)
    assert any(_LONG_UNIT in line for line in out.getvalue().splitlines()), out.getvalue()
    assert terminal.width == 80


# -- the text monitor names what happened -------------------------------------------


def test_text_monitor_names_an_oom_kill_and_a_throttles_fix(
    fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = "agentscope-default-builder-1-3f9a2c.scope"
    fix = "systemctl --user set-property --runtime user.slice MemoryHigh=infinity"
    live = [
        agentscope_systemd.OomKill(NOW, "builder-1", unit, 5001, "node\x1b[2J", 5 << 30, "kmsg"),
        agentscope_systemd.OomKill(NOW, "reviewer", unit, None, None, None, "cgroup"),
        agentscope_systemd.Throttled(
            NOW, "app-agentscope-agents.slice", 3, (5001, 5002), "user.slice", fix
        ),
        agentscope_systemd.Throttled(NOW, "app-agentscope-agents.slice", 1, (), None, None),
    ]

    @contextmanager
    def monitor(*args: Any, **kwargs: Any) -> Iterator[Iterator[Any]]:
        yield iter(live)

    monkeypatch.setattr(fleet, "monitor", monitor)
    result = run("monitor")
    assert result.code == 0, result
    kill, unknown, throttle, no_holder = result.stdout.splitlines()
    assert kill.endswith(
        f" oom_kill builder-1 pid=5001 comm=node?[2J rss=5.0GiB source=kmsg unit={unit}"
    )
    assert unknown.endswith(" oom_kill reviewer victim=unknown source=cgroup unit=" + unit)
    assert " throttled app-agentscope-agents.slice high_events=3 stalled=5001,5002 " in throttle
    assert throttle.endswith(f" limit_unit=user.slice fix: {fix}")
    assert no_holder.endswith("fix: none found (no MemoryHigh holder)")
    # The same event, recorded in the registry and read back by `events`, reads the same.
    data = live[0].to_dict()
    recorded = {
        "id": 7,
        "ts": NOW,
        "fleet": "default",
        "agent": data.pop("agent"),
        "kind": data.pop("kind"),
    }
    assert _render.event_line({**recorded, "detail": data}) == kill


# -- logs: the file run writes, or a tmux window ---------------------------------------


def _run_log(tmp_path: Path, name: str = "a") -> Path:
    result = run(
        "--user", "--json", "run", name, "--", "true", env={"XDG_STATE_HOME": str(tmp_path)}
    )
    assert result.code == 0, result
    return Path(json.loads(result.stdout)["log"])


def test_logs_reads_the_log_file_run_writes(fleet: FakeFleet, tmp_path: Path) -> None:
    log = _run_log(tmp_path)
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(500)) + b"bad \xff byte\n")
    env = {"XDG_STATE_HOME": str(tmp_path)}
    result = run("--user", "logs", "a", "-n", "3", env=env)
    assert result.code == 0, result
    assert result.stdout == "line 498\nline 499\nbad \ufffd byte\n"
    result = run("--user", "--json", "logs", "a", "-n", "2", env=env)
    assert json.loads(result.stdout) == {
        "schema": "agentscope.logs/1",
        "name": "a",
        "log": str(log),
        "lines": ["line 499", "bad \ufffd byte"],
    }
    assert not [c for c in fleet.calls if c[0] == "logs"]  # no tmux capture for a file agent


def test_logs_needs_no_bus_for_a_log_file(
    fleet: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_log(tmp_path).write_text("only line\n")

    def unreachable(opts: _fleet.Options) -> FakeFleet:
        raise agentscope_systemd.SystemdUnavailable("user", "unix:path=/x", "no bus here")

    monkeypatch.setattr(_fleet, "open_fleet", unreachable)
    result = run("--user", "logs", "a", env={"XDG_STATE_HOME": str(tmp_path)})
    assert (result.code, result.stdout) == (0, "only line\n")


def test_logs_of_an_agent_without_a_log_file_says_where_it_looked(
    fleet: FakeFleet, tmp_path: Path
) -> None:
    result = run("--user", "--json", "logs", "nobody", env={"XDG_STATE_HOME": str(tmp_path)})
    assert result.code == 1
    error = json.loads(result.stderr)
    assert error["kind"] == "no_log"
    assert "nobody.log" in error["error"]
    assert "--log" in error["error"]


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_logs_follow_follows_the_file(
    fleet: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _run_log(tmp_path)
    log.write_text("old\n")
    steps = iter(
        [
            lambda: _append(log, "new 1\nnew 2 is half"),
            lambda: _append(log, " done\n"),
            lambda: log.write_text("after truncation\n"),  # cut short: read from its start
            lambda: None,
        ]
    )

    def sleep(seconds: float) -> None:
        step = next(steps, None)
        if step is None:
            raise KeyboardInterrupt
        step()

    monkeypatch.setattr("time.sleep", sleep)
    result = run("--user", "logs", "a", "-f", "-n", "1", env={"XDG_STATE_HOME": str(tmp_path)})
    assert result.code == 130
    assert result.stdout.splitlines() == ["old", "new 1", "new 2 is half done", "after truncation"]


def test_logs_follow_reopens_a_rotated_file(tmp_path: Path) -> None:
    from agentscope_systemd._cli import _logfile

    log = tmp_path / "a.log"
    log.write_text("one\n")
    seen: list[str] = []
    rotations = iter(range(3))

    def sleep(seconds: float) -> None:
        if next(rotations, None) is None:
            raise KeyboardInterrupt
        if not (tmp_path / "a.log.1").exists():
            log.rename(tmp_path / "a.log.1")
            log.write_text("two\n")

    with pytest.raises(KeyboardInterrupt):
        _logfile.follow(log, 0, seen.append, sleep=sleep)
    assert seen == ["one", "two"]


@pytest.mark.parametrize("size", [0, 1, 100, 70_000, 200_000])
def test_tail_reads_the_last_lines_from_the_end(tmp_path: Path, size: int) -> None:
    from agentscope_systemd._cli import _logfile

    log = tmp_path / "a.log"
    body = [f"{i:06d}" + "x" * (i % 97) for i in range(size)]
    log.write_text("".join(line + "\n" for line in body))
    for n in (0, 1, 10, 5000):
        assert _logfile.tail(log, n) == (body[-n:] if n else [], log.stat().st_size)
    log.write_text("no newline at the end")
    assert _logfile.tail(log, 5)[0] == ["no newline at the end"]


def test_logs_of_a_tmux_agent_is_its_window(fleet: FakeFleet, tmp_path: Path) -> None:
    fleet.agent_list = [_agent("t", terminal="tmux")]
    result = run("--user", "--json", "logs", "t", "-n", "2", env={"XDG_STATE_HOME": str(tmp_path)})
    assert json.loads(result.stdout) == {
        "schema": "agentscope.logs/1",
        "name": "t",
        "lines": ["pane line 0", "pane line 1"],
    }
    follow = run("--user", "logs", "t", "-f", env={"XDG_STATE_HOME": str(tmp_path)})
    assert follow.code == 2
    assert "attach --read-only t" in follow.stderr


# -- the registry's commands need no bus ----------------------------------------------


def test_events_and_gc_work_without_a_bus(
    fleet: FakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_systemd.lowlevel import Registry

    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    path = agentscope_systemd.default_registry_path("user")
    with Registry(path) as reg:
        rec = reg.record_launch(
            "default", "old", "agentscope-default-old-1.scope", 11, 1, ["x"], "/"
        )
        reg.set_state(rec.unit, "running")
        reg.set_state(rec.unit, "exited")
        reg.record_event("default", "builder-1", "oom_kill", {"pid": 5001, "comm": "node"})
        reg.record_event("other", "b", "oom_kill", {"pid": 1})

    def unreachable(opts: _fleet.Options) -> FakeFleet:
        raise agentscope_systemd.SystemdUnavailable("user", "unix:path=/x", "no bus here")

    monkeypatch.setattr(_fleet, "open_fleet", unreachable)
    monkeypatch.setattr(_fleet, "open_history", _REAL_OPEN_HISTORY)
    result = run("--user", "--json", "events", "--kind", "oom_kill")
    assert result.code == 0, result
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["agent"], r["detail"]["comm"]) for r in rows] == [("builder-1", "node")]
    text = run("--user", "events", "--kind", "oom_kill")
    assert " oom_kill builder-1 pid=5001 comm=node" in text.stdout
    gc = run("--user", "--json", "gc", "--retention", "0s")
    assert (gc.code, json.loads(gc.stdout)["removed"]) == (0, 1), gc
    assert run("--user", "ls").code == 4  # what does need the manager still says so


def test_logs_memory_stays_bounded_without_newlines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_systemd._cli import _logfile

    monkeypatch.setattr(_logfile, "_TAIL_BUDGET", 1000)
    monkeypatch.setattr(_logfile, "_MAX_LINE", 100)
    log = tmp_path / "a.log"
    log.write_bytes(b"x" * 200_000 + b"\nlast\n")  # more than one read block
    assert _logfile.tail(log, 3)[0] == ["last"]  # the cut-off giant line is not shown as whole
    seen: list[str] = []

    def sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    log.write_bytes(b"y" * 250)
    with pytest.raises(KeyboardInterrupt):
        _logfile.follow(log, 0, seen.append, sleep=sleep)
    assert seen == ["y" * 100, "y" * 100]


@pytest.mark.parametrize(
    "comm",
    ["a\x9b31mb", "a\x85b", "a\x9db", "a\u2028b", "a\u202eb", "a\x1b[2Jb", "a\x7fb", "a\u2066b"],
)
def test_event_lines_show_c0_c1_and_bidi_controls_as_question_marks(comm: str) -> None:
    # #31: C1 (U+009B is a CSI to many terminals) reached events and monitor.
    from agentscope_systemd._cli._render import event_line

    line = event_line({"kind": "oom_kill", "ts": NOW, "agent": f"x{comm}", "comm": comm, "pid": 1})
    assert not any(0x7F <= ord(c) < 0xA0 or ord(c) < 32 for c in line)
    assert "\u2028" not in line
    assert "\u202e" not in line
    assert "\u2066" not in line
    assert f"comm={comm[0]}?" in line


@pytest.mark.timeout(30)
def test_run_log_that_is_no_regular_file_is_refused_before_the_bus(
    fleet: FakeFleet, tmp_path: Path
) -> None:
    # A FIFO at --log hung the open for ever (no reader), after the fleet
    # had connected; a directory failed only then too (#31).
    os.mkfifo(tmp_path / "fifo")
    for log in (tmp_path / "fifo", tmp_path):
        result = run("run", "a", "--log", str(log), "--", "true")
        assert result.code == 2, result.stderr
        assert f"--log {log} is not a regular file" in result.stderr
        assert fleet.opened == []  # type: ignore[attr-defined]
        assert fleet.calls == []
