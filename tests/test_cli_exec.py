"""``agentscope exec`` as a harness's argv prefix: its exit codes and its fallback.

exec's own failures are 125 (agentscope failed), 126 (the command cannot
run) and 127 (not found), like coreutils' ``env``; any other status is the
command's. Where no scope can be made, ``--fallback run`` (or
``AGENTSCOPE_EXEC_FALLBACK=run``) runs the command unconfined, as itself.

The real command line runs in a subprocess with a bus address that cannot
work (no manager: as on a host without systemd); a manager that refuses the
scope is the fake fleet of tests/test_cli.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import agentscope_systemd
from tests.test_cli import FakeFleet, fleet, run  # noqa: F401 (fleet: the fixture)

ROOT = Path(__file__).resolve().parent.parent


def agentscope_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command line, on a host where no systemd manager can be reached."""
    base = {k: v for k, v in os.environ.items() if k != "AGENTSCOPE_EXEC_FALLBACK"}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from agentscope_systemd._cli.main import main; main()",
            "--user",
            *args,
        ],
        env={
            **base,
            "DBUS_SESSION_BUS_ADDRESS": "garbage",
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
            "XDG_STATE_HOME": str(tmp_path / "state"),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


# -- no manager: 125, or the command unconfined ------------------------------------------


def test_no_manager_is_125_and_the_command_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = agentscope_cli(tmp_path, "--json", "exec", "me", "--", "touch", str(marker))
    assert done.returncode == 125, done.stderr
    assert json.loads(done.stderr)["kind"] == "systemd_unavailable"
    assert not marker.exists()


def test_a_bus_that_is_not_there_is_exit_4_and_the_registry_still_serves(tmp_path: Path) -> None:
    # A well-formed address whose socket is not there (the manager down), not
    # a malformed one: the connect itself fails. Moved from the VM suite
    # (integration/tests/test_cli.py): no manager is reached, so nothing in
    # it is the kernel's or systemd's, and each CLI start there costs seconds
    # under TCG (issue #29, CI's time).
    marker = tmp_path / "ran"
    gone = {"DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/bus"}
    done = agentscope_cli(tmp_path, "--json", "ls", env=gone)
    assert (done.returncode, json.loads(done.stderr)["kind"]) == (4, "systemd_unavailable")
    assert "/nonexistent/bus" in done.stderr
    done = agentscope_cli(tmp_path, "--json", "exec", "me", "--", "touch", str(marker), env=gone)
    assert (done.returncode, json.loads(done.stderr)["kind"]) == (125, "systemd_unavailable")
    assert not marker.exists()
    for how, env in (
        (["--fallback", "run"], gone),
        ([], {**gone, "AGENTSCOPE_EXEC_FALLBACK": "run"}),
    ):
        done = agentscope_cli(
            tmp_path, "exec", "me", *how, "--", "sh", "-c", "cat /proc/self/cgroup; exit 3", env=env
        )
        assert done.returncode == 3, done.stderr
        assert "unconfined" in done.stderr
        assert "/nonexistent/bus" in done.stderr
        assert "-me-" not in done.stdout  # in no agent's scope
    # What needs the registry alone still works: events, gc.
    for args in (["events", "--since", "-1h"], ["gc", "--retention", "1h30min"]):
        done = agentscope_cli(tmp_path, "--json", *args, env=gone)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("how", "env"),
    [
        (["--fallback", "run"], {}),
        (["--fallback=run"], {}),
        ([], {"AGENTSCOPE_EXEC_FALLBACK": "run"}),
        (["--fallback", "run"], {"AGENTSCOPE_EXEC_FALLBACK": "fail"}),  # the option wins
    ],
)
def test_fallback_run_runs_the_command_as_itself(
    tmp_path: Path, how: list[str], env: dict[str, str]
) -> None:
    base = {k: v for k, v in os.environ.items() if k != "AGENTSCOPE_EXEC_FALLBACK"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from agentscope_systemd._cli.main import main; main()",
            "--user",
            "exec",
            "me",
            *how,
            "--",
            "sh",
            "-c",
            'echo "$$"; exit 7',
        ],
        env={
            **base,
            "DBUS_SESSION_BUS_ADDRESS": "garbage",
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
            "XDG_STATE_HOME": str(tmp_path / "state"),
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err  # the command's own status
    assert out.strip() == str(proc.pid)  # exec'd in place: the same process
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "no scope for agent 'me'" in lines[0]
    assert "unconfined" in lines[0]
    assert "cannot reach" in lines[0]  # why: the manager's error


def test_fallback_run_keeps_the_commands_signal(tmp_path: Path) -> None:
    done = agentscope_cli(
        tmp_path, "exec", "me", "--fallback", "run", "--", "sh", "-c", "kill -TERM $$"
    )
    assert done.returncode == -signal.SIGTERM, done.stderr


def test_fallback_fail_is_the_default(tmp_path: Path) -> None:
    for env in ({}, {"AGENTSCOPE_EXEC_FALLBACK": "fail"}, {"AGENTSCOPE_EXEC_FALLBACK": ""}):
        done = agentscope_cli(tmp_path, "exec", "me", "--", "true", env=env)
        assert done.returncode == 125, (env, done.stderr)
        assert done.stderr.startswith("agentscope: error: cannot reach"), done.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--fallback", "always"], {}, "--fallback takes run or fail, not 'always'"),
        (["--fallback"], {}, "--fallback takes run or fail, not '--'"),
        ([], {"AGENTSCOPE_EXEC_FALLBACK": "yes"}, "AGENTSCOPE_EXEC_FALLBACK='yes' is not"),
    ],
)
def test_a_bad_fallback_is_refused_with_125(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    marker = tmp_path / "ran"
    done = agentscope_cli(
        tmp_path, "--json", "exec", "me", *args, "--", "touch", str(marker), env=env
    )
    assert done.returncode == 125, done.stderr
    error = json.loads(done.stderr)
    assert message in error["error"]
    assert error["kind"] == "bad_input"
    assert not marker.exists()


def test_the_fallback_does_not_cover_bad_input(tmp_path: Path) -> None:
    done = agentscope_cli(
        tmp_path, "exec", "me", "--fallback", "run", "--memory-max", "junk", "--", "true"
    )
    assert done.returncode == 125
    assert "--memory-max = 'junk' is not a number this field takes" in done.stderr
    done = agentscope_cli(tmp_path, "exec", "-bad-name", "--fallback", "run", "--", "true")
    assert done.returncode == 125


# -- 126 and 127: the command -------------------------------------------------------------


def test_a_command_not_found_is_127_before_any_scope(tmp_path: Path) -> None:
    done = agentscope_cli(tmp_path, "--json", "exec", "me", "--", "no-such-command-agentscope")
    assert done.returncode == 127, done.stderr
    error = json.loads(done.stderr)
    assert error["kind"] == "command_not_found"
    assert "not found on PATH" in error["error"]
    done = agentscope_cli(tmp_path, "exec", "me", "--", str(tmp_path / "nothing"))
    assert done.returncode == 127
    assert "no such file" in done.stderr


def test_a_command_that_cannot_run_is_126(tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable
    done = agentscope_cli(tmp_path, "--json", "exec", "me", "--", str(script))
    assert (done.returncode, json.loads(done.stderr)["kind"]) == (126, "cannot_run")
    done = agentscope_cli(tmp_path, "exec", "me", "--", str(tmp_path))  # a directory
    assert done.returncode == 126
    # Executable, but no format the kernel runs: the exec itself fails.
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\x01\x02 not a program\n")
    junk.chmod(0o755)
    done = agentscope_cli(tmp_path, "exec", "me", "--fallback", "run", "--", str(junk))
    assert done.returncode == 126, done.stderr
    assert f"cannot exec '{junk}'" in done.stderr


def test_the_commands_own_127_and_126_pass_through(tmp_path: Path) -> None:
    # Told apart from exec's only by the message: a harness that must know
    # checks stderr's last line (or --json's error line).
    done = agentscope_cli(tmp_path, "exec", "me", "--fallback", "run", "--", "sh", "-c", "exit 127")
    assert done.returncode == 127
    assert "agentscope: error" not in done.stderr


# -- 125: agentscope failed -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["exec"],
        ["exec", "me"],
        ["exec", "me", "--bogus", "--", "true"],
        ["exec", "me", "--tasks-max", "many", "--", "true"],
        ["exec", "me", "--io-weight", "0", "--", "true"],
        ["--manager", "bogus", "exec", "me", "--", "true"],  # typer reads the globals
        ["--system", "exec", "me", "--", "true"],  # with --user: two managers
    ],
)
def test_bad_usage_is_125(tmp_path: Path, args: list[str]) -> None:
    marker = tmp_path / "ran"
    command = [a if a != "true" else f"touch {marker}" for a in args]
    done = agentscope_cli(tmp_path, *" ".join(command).split())
    assert done.returncode == 125, done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()


def test_a_refused_scope_is_125_and_the_fallback_runs_the_command(
    fleet: FakeFleet,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))
    fleet.fail = agentscope_systemd.BusError(
        "StartTransientUnit", "org.freedesktop.DBus.Error.AccessDenied", "not allowed"
    )
    result = run("--json", "exec", "me", "--", "true")
    assert result.code == 125
    assert json.loads(result.stderr)["kind"] == "bus_error"
    assert execs == []
    result = run("exec", "me", "--fallback", "run", "--", "true")
    assert result.code == 0, result.stderr  # the stand-in exec returned
    assert execs == [["true"]]
    assert "no scope for agent 'me'" in result.stderr
    assert "Running as unit" not in result.stderr


@pytest.mark.parametrize(
    "exc",
    [
        agentscope_systemd.AgentExists("default", "me", "agentscope-default-me-000000.scope"),
        agentscope_systemd.InvalidConfig("MemoryMax", 1, "at least 1 page"),
        agentscope_systemd.HostUnderPressure(3.0, 0.0, 70.0, 5.0),
    ],
    ids=["taken", "invalid", "pressure"],
)
def test_the_fallback_never_hides_a_harness_error(
    fleet: FakeFleet,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    exc: Exception,
) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))
    fleet.fail = exc
    result = run("exec", "me", "--fallback", "run", "--", "true")
    assert result.code == 125, result
    assert execs == []


def test_ctrl_c_before_the_exec_is_still_130(
    fleet: FakeFleet,  # noqa: F811
) -> None:
    fleet.fail = KeyboardInterrupt()
    assert run("exec", "me", "--", "true").code == 130


def test_the_fallbacks_value_is_not_the_agents_name(
    fleet: FakeFleet,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))
    result = run("exec", "--fallback", "run", "b", "true", "--json")
    assert result.code == 0, result.stderr
    assert fleet.calls == [("adopt", os.getpid(), "b", None)]
    assert execs == [["true", "--json"]]  # what follows the command is the command's
    assert "Running as unit:" in result.stderr
