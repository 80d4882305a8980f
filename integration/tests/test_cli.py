"""The agentscope command against real systemd: exit codes, JSON, exec, run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import GROW, MANAGER, SYSTEMD, cli_monitor, systemctl, validate

import agentscope_systemd

CLI = shutil.which("agentscope") or "agentscope"
SLICE = "app-agentscope-agents.slice"
# What the exec fast path must not import: it would not meet systemd-run's time.
HEAVY = {"asyncio", "dbus_fast", "sqlite3", "typer", "rich", "click", "psutil"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def ok_json(*args: str) -> object:
    done = cli("--json", *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def fleet() -> str:
    return f"c{uuid.uuid4().hex[:6]}"


@pytest.mark.heavy("cli-flow")
def test_run_ls_stop_and_the_agent_outlives_the_cli(fleet: str, tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    out = ok_json(
        "--fleet",
        fleet,
        "run",
        "a",
        "--log",
        str(log),
        # No "--": what follows the command is the agent's, --json included (#28).
        "sh",
        "-c",
        'echo started "$0"; exec sleep 300',
        "--json",
    )
    assert isinstance(out, dict)
    assert validate(out) == "agentscope.launched/1"
    pid = out["pid"]
    assert Path(f"/proc/{pid}").exists(), "the agent must outlive the CLI that ran it"
    for _ in range(50):
        if "started" in log.read_text():
            break
        time.sleep(0.1)
    # The agent's output reached the file run named. `logs` reading it back
    # is a file read, the same on any host: tests/test_cli.py's
    # test_logs_reads_the_log_file_run_writes.
    assert log.read_text() == "started --json\n"
    # Piped, the table is at full width: the unit name on one line with its row.
    table = cli("--fleet", fleet, "ls")
    assert any(line.startswith("a ") and out["unit"] in line for line in table.stdout.splitlines())
    listed = ok_json("--fleet", fleet, "ls")
    assert isinstance(listed, list)
    (row,) = listed
    assert validate(row) == "agentscope.agent/1"
    assert {k: row[k] for k in ("name", "unit", "pid", "state")} == {
        "name": "a",
        "unit": out["unit"],
        "pid": pid,
        "state": "running",
    }
    assert {"memory_current", "oom_kills", "started"} <= set(row)
    # freeze, thaw and kill are the library's calls (test_launch.py's
    # test_stop_kill_freeze_thaw_wait drives them through this systemd) behind
    # the CLI's own code (tests/test_cli.py's test_stop_kill_freeze_thaw): a
    # CLI start each here costs seconds under TCG (issue #29, CI's time).
    report = ok_json("--fleet", fleet, "report", "--top", "5")
    assert isinstance(report, dict)
    assert validate(report) == "agentscope.report/1"
    assert [a["agent"] for a in report["agents"]] == ["a"]
    validate(ok_json("--fleet", fleet, "stop", "a", "--timeout", "5s"))  # a systemd time span
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    events = cli("--json", "--fleet", fleet, "events")
    recorded = [json.loads(line) for line in events.stdout.splitlines()]
    assert {validate(e) for e in recorded} == {"agentscope.event/1"}
    kinds = [e["kind"] for e in recorded]
    assert kinds[0] == "launched"
    assert "stopped" in kinds
    assert ok_json("--fleet", fleet, "ls") == []


def test_exec_keeps_the_pid(fleet: str) -> None:
    wrapped = subprocess.Popen(
        [CLI, "--fleet", fleet, "exec", "me", "--", "sh", "-c", "echo $$; cat /proc/self/cgroup"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = wrapped.communicate(timeout=120)
    assert wrapped.returncode == 0, err
    pid_line, cgroup = out.split()[:2]
    # The wrapped command runs as the very process the caller started.
    assert int(pid_line) == wrapped.pid
    assert f"agentscope-{fleet}-me-" in cgroup
    proc = subprocess.Popen([CLI, "--fleet", fleet, "exec", "me2", "--", "sleep", "30"])
    try:
        for _ in range(100):
            try:
                comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
            except (FileNotFoundError, ProcessLookupError):
                comm = ""
            if comm == "sleep":
                break
            time.sleep(0.1)
        assert comm == "sleep", "exec must replace the CLI process itself"
        assert f"agentscope-{fleet}-me2-" in Path(f"/proc/{proc.pid}/cgroup").read_text()
    finally:
        proc.kill()
        proc.wait()


def _wait_comm(pid: int, comm: str) -> None:
    seen = ""
    for _ in range(200):
        try:
            seen = Path(f"/proc/{pid}/comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            seen = ""
        if seen == comm:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} is {seen!r}, not {comm!r}")


def _imported(stderr: str) -> set[str]:
    """The modules a PYTHONPROFILEIMPORTTIME=1 run imported."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.heavy("cli-flow")
def test_exec_fast_path_records_the_agent(fleet: str, tmp_path: Path) -> None:
    # A first agent makes the slice and the registry exist: the ordinary case.
    ok_json("--fleet", fleet, "run", "first", "--", "sleep", "300")
    err = tmp_path / "exec.err"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [CLI, "--fleet", fleet, "exec", "me", "--", "sleep", "300"],
            stderr=stderr,
            env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        )
    try:
        _wait_comm(proc.pid, "sleep")
        text = err.read_text()
        heavy = {m for m in _imported(text) if m.split(".")[0] in HEAVY}
        assert not heavy, f"exec took the slow path: {sorted(heavy)}\n{text[-2000:]}"
        listed = ok_json("--fleet", fleet, "ls")
        assert isinstance(listed, list)
        rows = {row["name"]: row for row in listed}
        # OOMPolicy=continue, or the warning of a systemd that refuses it
        # (247; Debian's 252 has the backport).
        policy = systemctl("show", rows["me"]["unit"], "-p", "OOMPolicy").strip()
        assert ("refuses OOMPolicy" in text) == (policy != "OOMPolicy=continue"), (policy, text)
        assert rows["me"]["pid"] == proc.pid
        assert rows["me"]["state"] == "running"
        assert rows["me"]["unit"] in Path(f"/proc/{proc.pid}/cgroup").read_text()
        done = cli("--json", "--fleet", fleet, "events", "--kind", "adopted")
        (event,) = [json.loads(line) for line in done.stdout.splitlines()]
        assert (event["agent"], event["detail"]["via"]) == ("me", "exec")
        # While it runs, its name is taken, through the fast path or not.
        again = cli("--json", "--fleet", fleet, "exec", "me", "--", "true")
        assert again.returncode == 125, again.stderr  # exec's own failure
        assert json.loads(again.stderr)["kind"] == "agent_exists"
        ok_json("--fleet", fleet, "stop", "me", "--timeout", "5")
        assert proc.wait(30) is not None
    finally:
        proc.kill()
        proc.wait()
        cli("--fleet", fleet, "stop", "first")


@pytest.mark.skipif(MANAGER != "user", reason="the private-socket fallback is the user manager's")
def test_exec_through_the_private_socket_alone(fleet: str) -> None:
    # No user bus: exec's own client connects straight to the manager's
    # private socket (sd-bus serving it once stalled clients that sent their
    # first message right after BEGIN: ten in a row must all go through).
    ok_json("--fleet", fleet, "run", "first", "--", "sleep", "300")
    runtime = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    try:
        (runtime / "systemd").mkdir()
        (runtime / "systemd" / "private").symlink_to(f"/run/user/{os.getuid()}/systemd/private")
        env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
        env.update(XDG_RUNTIME_DIR=str(runtime), PYTHONPROFILEIMPORTTIME="1")
        for i in range(10):
            done = subprocess.run(
                [CLI, "--fleet", fleet, "exec", f"p{i}", "--", "cat", "/proc/self/cgroup"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            assert f"/agentscope-{fleet}-p{i}-" in done.stdout
            heavy = {m for m in _imported(done.stderr) if m.split(".")[0] in HEAVY}
            assert not heavy, f"exec took the slow path: {sorted(heavy)}"
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
        cli("--fleet", fleet, "stop", "first")


def test_exec_clears_stale_slice_limits(fleet: str) -> None:
    with agentscope_systemd.Fleet(fleet):  # the registry exists: only the limits stand in the way
        pass
    systemctl("set-property", "--runtime", SLICE, "MemoryHigh=100M")
    done = cli("--fleet", fleet, "exec", "me", "--", "true")
    assert done.returncode == 0, done.stderr
    assert "cleared stale limits" in done.stderr
    assert "MemoryHigh=infinity" in systemctl("show", SLICE, "-p", "MemoryHigh")


# The refusals that reach the real registry and manager. Those made before
# any I/O (a bad name, a bad size: the same code on any host) are the host
# tests' (tests/test_cli.py, tests/test_cli_exec.py, tests/test_bad_inputs.py):
# each CLI start here costs seconds under TCG (issue #29, CI's time).
@pytest.mark.parametrize(
    ("args", "code", "kind"),
    [
        (["stop", "ghost"], 3, "not_found"),
        (["run", "a", "--", "no-such-binary-xyz"], 2, "launch_error"),
        (["exec", "a", "--", "no-such-binary-xyz"], 127, "command_not_found"),
    ],
)
def test_bad_input_exit_codes(fleet: str, args: list[str], code: int, kind: str) -> None:
    done = cli("--json", "--fleet", fleet, *args)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(done.stderr)["kind"] == kind
    # The human form of the same error is the CLI's own formatting, the same
    # on any host: tests/test_cli.py's test_exit_codes and test_cli_exec.py.


def test_doctor_and_gc_json(fleet: str) -> None:
    done = cli("--json", "--fleet", fleet, "doctor")
    assert done.returncode in (0, 1), done.stderr
    data = json.loads(done.stdout)
    assert validate(data) == "agentscope.doctor/1"
    names = {c["name"] for c in data["checks"]}
    assert "slice_limits" in names
    for check in data["checks"]:
        assert check["status"] in ("pass", "warn", "fail")
        if check["status"] == "fail":
            assert check["fix"]
    gc = ok_json("--fleet", fleet, "gc")
    assert validate(gc) == "agentscope.gc/1"


def test_a_systemd_run_scope_named_as_documented_is_an_agent_with_one_event_shape(
    fleet: str, tmp_path: Path
) -> None:
    # docs/json.md: a harness starts its agent with systemd-run, named as
    # agentscope names its scopes; ls, report and the monitor take it as the
    # fleet's. Its OOM kill (its own MemoryMax, a cgroup OOM: seconds, no host
    # squeeze) reads the same from monitor --json and from events --json.
    unit = f"agentscope-{fleet}-harness-{uuid.uuid4().hex[:6]}.scope"
    go = tmp_path / "go"
    scope = subprocess.Popen(
        [
            "systemd-run",
            *(["--user"] if MANAGER == "user" else []),
            "--scope",
            "--quiet",
            "--slice",
            SLICE,
            "--unit",
            unit,
            "--description",
            f"agentscope agent harness of fleet {fleet}",
            *(["-p", "OOMPolicy=continue"] if SYSTEMD >= 253 else []),
            "-p",
            "MemoryMax=48M",
            "-p",
            "MemorySwapMax=0",
            "--",
            "sh",
            "-c",
            f'while [ ! -e {go} ]; do sleep 0.2; done; exec python3 -c "$0"',
            GROW,
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if systemctl("show", unit, "-p", "ActiveState").strip() == "ActiveState=active":
                break
            time.sleep(0.2)
        listed = ok_json("--fleet", fleet, "ls")
        assert isinstance(listed, list)
        assert {validate(a) for a in listed} == {"agentscope.agent/1"}
        assert [(a["name"], a["unit"], a["state"]) for a in listed] == [
            ("harness", unit, "running")
        ]
        report = ok_json("--fleet", fleet, "report", "--top", "0")
        assert isinstance(report, dict)
        validate(report)
        assert [a["agent"] for a in report["agents"]] == ["harness"]
        # The kill must come after the monitor started: one that comes before
        # is recovered at its start, and a gone scope's kill has no agent
        # without the kernel's log (a user on Debian's defaults). Its READY=1
        # says when (conftest.cli_monitor). The kill is awaited on the
        # monitor's own output, not by polling events (a CLI start a poll,
        # seconds each under TCG).
        with cli_monitor("--json", "--fleet", fleet, "monitor", "--interval", "1") as monitor:
            assert monitor.stdout is not None
            assert monitor.stderr is not None
            lines: list[str] = []
            errs: list[str] = []
            seen = threading.Event()

            def read() -> None:
                assert monitor.stdout is not None
                for line in monitor.stdout:
                    lines.append(line)
                    if json.loads(line)["kind"] == "oom_kill":
                        seen.set()

            readers = [
                threading.Thread(target=read, daemon=True),
                threading.Thread(target=lambda: errs.append(monitor.stderr.read()), daemon=True),
            ]
            for reader in readers:
                reader.start()
            go.touch()
            # A 48M cap reached at 16 MiB/s once python3 is up: seconds, but
            # minutes on a starved TCG host (as the events polls allowed).
            assert seen.wait(300), f"no oom_kill from the monitor: {lines}"
            monitor.send_signal(signal.SIGTERM)
            monitor.wait(60)
            for reader in readers:
                reader.join(30)
            monitor.stdout.close()
            monitor.stderr.close()
        err = "".join(errs)
        assert "Traceback" not in err, err[-2000:]
        live = [json.loads(line) for line in lines]
        kills = [e for e in live if e["kind"] == "oom_kill"]
        assert len(kills) == 1, (kills, err[-2000:])
        (kill,) = kills
        assert kill["agent"] == "harness", (kill, err[-2000:])
        assert kill["detail"]["unit"] == unit, kill
        assert kill["id"] is None, kill
        # One event, one shape: the record is the live line with its id. Read
        # now that the monitor is done: a CLI call's open while it ran could
        # record a kill it finds before the monitor brings its detail to that
        # same row. --kind's filter is the CLI's own (tests/test_cli.py).
        done = cli("--json", "--fleet", fleet, "events")
        recorded = [json.loads(line) for line in done.stdout.splitlines()]
        assert {validate(e) for e in live + recorded} == {"agentscope.event/1"}
        oom = [e for e in recorded if e["kind"] == "oom_kill"]
        assert len(oom) == 1, recorded
        assert {**kill, "id": oom[0]["id"]} == oom[0], (kill, oom)
        assert [e["agent"] for e in recorded if e["kind"] == "found"] == ["harness"]
    finally:
        go.touch()
        subprocess.run(
            ["systemctl", *(["--user"] if MANAGER == "user" else []), "stop", unit],
            capture_output=True,
            check=False,
        )
        scope.wait(30)
