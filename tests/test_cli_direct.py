"""``ls``, ``events``, ``stop`` and ``kill`` without typer print and fail as through typer.

agentscope_systemd/_cli/_direct.py reads the plain command lines of these commands itself
(issue 28: typer's start-up is most of what a harness's poll costs). Each
case here runs twice through ``main``: as it runs (the direct path where it
applies) and with the direct path refused, so that typer reads the line.
Outputs and exit codes must be the same, errors included: a bad fleet name,
option or value (exit 2), no manager (exit 4), Ctrl-C (exit 130).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentscope_systemd
from agentscope_systemd._cli import _direct, _fleet
from agentscope_systemd._cli._options import Options
from tests.test_cli import _REAL_OPEN_HISTORY, NOW, FakeFleet, Result, fleet, run  # noqa: F401


@pytest.fixture
def fake(fleet: FakeFleet) -> FakeFleet:  # noqa: F811 (the fixture imported above)
    """test_cli's fake fleet, in place of the library's."""
    return fleet


# Each: the command line, and whether the direct path answers it (else typer).
LS_CASES = [
    (("ls",), True),
    (("--json", "ls"), True),
    (("ls", "--json"), True),
    (("--fleet", "other", "ls"), True),
    (("--fleet=other", "--user", "ls"), True),
    (("--fleet", "Bad Name!", "ls"), False),
    (("--json", "--fleet", "../x", "ls"), False),
    (("--manager", "auto", "ls"), False),  # exec takes auto; typer's --manager does not
    (("--json", "--manager=auto", "events"), False),
    (("--manager", "user", "--json", "ls"), True),
    (("--user", "--system", "ls"), False),
    (("ls", "extra"), False),
    (("ls", "--bogus"), False),
    (("--json", "ls", "--bogus"), False),
    (("ls", "-h"), False),
    (("ls", "--help"), False),
]

EVENTS_CASES = [
    (("events",), True),
    (("--json", "events"), True),
    (("events", "--json", "--kind", "oom_kill"), True),
    (("--json", "events", "--limit", "1"), True),
    (("--json", "events", "--limit=1"), True),
    (("--json", "events", "--limit", "0"), True),
    (("--json", "events", "--agent", "builder-1"), True),
    (("--json", "events", "--agent=reviewer", "--kind=start"), True),
    (("--json", "events", "--since", "-1h"), True),
    (("--json", "events", "--since", "10m", "--until", "1m"), True),
    (("events", "--since", "today"), True),
    (("--json", "events", "--since", "not a time"), True),  # the body refuses it: exit 2
    (("events", "--until", "soon-ish"), True),
    (("--json", "events", "--limit", "-1"), False),
    (("--json", "events", "--limit", "x"), False),
    (("events", "--limit", "1000000001"), False),
    (("--json", "events", "--agent", "../etc"), False),
    (("events", "--agent", ""), False),
    (("events", "--since"), False),
    (("--json", "events", "--limit"), False),
    (("events", "--limit", "1", "--limit", "2"), False),
    (("events", "--follow=yes"), False),
    (("events", "--bogus"), False),
    (("events", "extra"), False),
    (("events", "-h"), False),
]

STOP_CASES = [
    (("stop", "builder-1"), True),
    (("--json", "stop", "builder-1"), True),
    (("stop", "builder-1", "--timeout", "3"), True),
    (("stop", "--timeout=0.5", "builder-1", "--json"), True),
    (("--fleet", "other", "stop", "--all"), True),
    (("--json", "stop", "--all", "--timeout", "0"), True),
    (("stop",), True),  # neither NAME nor --all: the body refuses it, exit 2
    (("--json", "stop", "builder-1", "--all"), True),  # both: refused alike
    (("stop", "../etc"), False),
    (("stop", "builder-1", "reviewer"), False),
    (("stop", "--timeout", "-1", "builder-1"), False),
    (("stop", "--timeout", "nan", "builder-1"), False),
    (("stop", "--timeout", "5min", "builder-1"), True),  # a systemd time span
    (("stop", "--timeout", "5 parsecs", "builder-1"), False),
    (("stop", "builder-1", "--timeout"), False),
    (("stop", "builder-1", "--timeout", "1", "--timeout", "2"), False),
    (("stop", "--all=yes"), False),
    (("stop", "builder-1", "--bogus"), False),
    (("stop", "--", "builder-1"), False),
    (("stop", "-"), False),
    (("stop", "-h"), False),
    (("--manager", "auto", "stop", "builder-1"), False),
]

KILL_CASES = [
    (("kill", "builder-1"), True),
    (("--json", "kill", "builder-1", "--signal", "KILL"), True),
    (("kill", "-s", "9", "builder-1"), True),
    (("kill", "builder-1", "--signal=SIGUSR1", "--json"), True),
    (("kill", "builder-1", "-s", "NOSUCH"), True),  # the body refuses it: exit 2
    (("kill", "builder-1", "-s", "0"), True),
    (("kill",), False),  # typer says NAME is missing
    (("kill", "../etc"), False),
    (("kill", "builder-1", "reviewer"), False),
    (("kill", "builder-1", "-s"), False),
    (("kill", "builder-1", "-s9"), False),
    (("kill", "builder-1", "-s", "9", "--signal", "15"), False),
    (("kill", "builder-1", "--all"), False),
    (("kill", "--help"), False),
]


def _both(*args: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Result, Result]:
    """``args`` run as they run, then with the direct path refused (typer reads them)."""
    direct = run(*args)
    with monkeypatch.context() as m:
        m.setattr(_direct, "direct_args", lambda *a: None)
        typer_side = run(*args)
    return direct, typer_side


def _taken(*args: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether ``main`` answers ``args`` on the direct path (else typer)."""
    taken: list[str] = []
    real = _direct.run_direct

    def spy(opts: Options, command: str, values: dict[str, object]) -> int:
        taken.append(command)
        return real(opts, command, values)

    with monkeypatch.context() as m:
        m.setattr(_direct, "run_direct", spy)
        run(*args)
    return bool(taken)


@pytest.mark.parametrize(("args", "direct"), LS_CASES + EVENTS_CASES + STOP_CASES + KILL_CASES)
def test_the_direct_path_prints_what_typer_prints(
    fake: FakeFleet, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], direct: bool
) -> None:
    monkeypatch.setattr("time.time", lambda: NOW)
    assert _taken(*args, monkeypatch=monkeypatch) is direct
    opened: list[Options] = fake.opened  # type: ignore[attr-defined]
    opened.clear()
    ours = run(*args)
    ours_opened = list(opened)
    opened.clear()
    with monkeypatch.context() as m:
        m.setattr(_direct, "direct_args", lambda *a: None)
        typers = run(*args)
    assert ours == typers
    assert ours_opened == opened  # the same manager and fleet, opened as often
    assert "Traceback" not in ours.stdout + ours.stderr


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (agentscope_systemd.SystemdUnavailable("user", "unix:path=/x", "no bus here"), 4),
        (agentscope_systemd.AgentscopeError("the registry is damaged"), 1),
        (KeyboardInterrupt(), 130),
    ],
)
@pytest.mark.parametrize(
    "args",
    [
        ("ls",),
        ("--json", "ls"),
        ("events",),
        ("--json", "events"),
        ("stop", "builder-1"),
        ("--json", "stop", "--all"),
        ("kill", "builder-1", "-s", "KILL"),
    ],
)
def test_failures_are_reported_alike(
    fake: FakeFleet,
    monkeypatch: pytest.MonkeyPatch,
    failure: BaseException,
    code: int,
    args: tuple[str, ...],
) -> None:
    fake.fail = failure
    ours, typers = _both(*args, monkeypatch=monkeypatch)
    assert ours == typers
    assert ours.code == code, ours
    assert "Traceback" not in ours.stderr


def test_an_empty_fleet_is_said_alike(fake: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.agent_list = []
    for args in (("ls",), ("--json", "ls")):
        ours, typers = _both(*args, monkeypatch=monkeypatch)
        assert ours == typers
        assert ours.code == 0
    assert run("ls").stdout == "no agents in fleet 'default'\n"
    assert json.loads(run("--json", "ls").stdout) == []


def test_following_ends_alike_on_ctrl_c(fake: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    def sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    for args in (("--json", "events", "-f"), ("events", "--follow", "--kind", "start")):
        assert _taken(*args, monkeypatch=monkeypatch)
        ours, typers = _both(*args, monkeypatch=monkeypatch)
        assert ours == typers
        assert ours.code == 130


def test_real_registry_and_no_manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's own readers: no registry yet, a registry with events, no bus (exit 4)."""
    from agentscope_systemd.lowlevel import Registry

    monkeypatch.setattr(_fleet, "open_history", _REAL_OPEN_HISTORY)
    env = {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cases = [("--user", "--json", "events"), ("--user", "events", "--limit", "1")]
    for args in cases:  # no registry file yet
        ours, typers = _both(*args, monkeypatch=monkeypatch)
        assert (ours, ours.code) == (typers, 0)
    with Registry(agentscope_systemd.default_registry_path("user")) as reg:
        reg.record_event("default", "builder-1", "oom_kill", {"pid": 5001, "comm": "node"})
        reg.record_event("default", "reviewer", "start", {"pid": 7})
        reg.record_event("other", "b", "oom_kill", {"pid": 1})
    for args in [*cases, ("--user", "--json", "events", "--kind", "oom_kill")]:
        ours, typers = _both(*args, monkeypatch=monkeypatch)
        assert (ours, ours.code) == (typers, 0)
        assert ours.stdout
    for args in (("--user", "ls"), ("--user", "--json", "ls")):  # the real Fleet: no bus
        ours, typers = _both(*args, monkeypatch=monkeypatch)
        assert ours == typers
        assert ours.code == 4, ours
        assert "Traceback" not in ours.stderr


def test_direct_args_give_the_bodies_typers_values() -> None:
    opts = Options(fleet="default")
    assert _direct.direct_args(opts, "ls", []) == {}
    assert _direct.direct_args(opts, "events", ["-f", "--limit=7", "--agent", "a1"]) == {
        "follow": True,
        "since": None,
        "until": None,
        "kind": None,
        "agent": "a1",
        "limit": 7,
    }
    assert _direct.direct_args(opts, "stop", ["--timeout=2.5", "a1"]) == {
        "name": "a1",
        "all_": False,
        "timeout": 2.5,
    }
    assert _direct.direct_args(opts, "stop", ["--all"]) == {
        "name": None,
        "all_": True,
        "timeout": 10.0,
    }
    assert _direct.direct_args(opts, "kill", ["a1", "-s", "9"]) == {"name": "a1", "signal_": "9"}
    assert _direct.direct_args(opts, "kill", ["-s", "9"]) is None
    assert _direct.direct_args(opts, "run", ["a1", "--", "true"]) is None
    assert _direct.direct_args(Options(fleet="x/y"), "ls", []) is None
