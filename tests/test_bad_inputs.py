"""The bad-input matrix (#31 item 8): every refusal clean, and nothing made before it.

Three tables. The command line: every command's size, count, duration,
name and path options and the environment variables a harness sets, run in
this process with HOME, XDG_STATE_HOME, XDG_RUNTIME_DIR and both bus
addresses pointed into a temporary directory (so nothing reaches this
host's managers or registry), and ``--user`` always; each case must exit
with its code, say why in a line that names what was wrong, show no
traceback, and neither reach for the bus or the registry nor leave a file.
The Python API over the fake bus: each bad argument raises its own
``AgentscopeError`` and no scope is asked for, no row or event written.
Hostile /proc and cgroup trees (tests/fakefs.py): control characters,
non-UTF-8, huge files, FIFOs and vanished processes give a clean value or
None, in bounded time, and nothing is acted on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_systemd._cli import _fleet
from tests.test_cli import Result, run

#: Values no size, count or duration field takes, whatever its range.
NOT_NUMBERS = ["²", "٣", "1_000", "nan", "inf", "-inf", "1e309", "0x10", "", " ", "1 2"]
#: Sizes out of every range.
BAD_SIZES = [*NOT_NUMBERS, "-1", "0", "18446744073709551615", "9E", "101%", "1.5.5G", "1Q"]
BAD_COUNTS = [*NOT_NUMBERS, "-1", "10^25", "99999999999999999999999", "1.5"]
BAD_WEIGHTS = [*NOT_NUMBERS, "0", "10001", "-5", "1.5"]
BAD_SPANS = ["²", "nan", "inf", "1e309", "10^25", "", "5 parsecs", "99999999999999y", "1s\x00"]
#: Below every span option's range (events --since reads "-1s" as a second ago).
NEGATIVE_SPANS = ["-1", "-1s"]
BAD_NAMES = ["", "../x", "a/b", "a b", "a\nb", "\x1b[31mred", "é", "x" * 300, "-rf", "."]
BAD_PROPERTIES = [
    "TasksMax=²",
    "MemoryMax=²",
    "MemoryMax=-1",
    "MemoryMax=18446744073709551615",
    "MemorySwapMax=nan",
    "AllowedCPUs=²",
    "AllowedCPUs=0-99999",
    "AllowedCPUs=3-1",
    "CPUQuota=²%",
    "CPUQuota=0%",
    "CPUQuota=100001%",
    "CPUQuota=1.234%",
    "CPUWeight=0",
    "IOWeight=10001",
    "ExecStart=/bin/sh",
    "MemoryMax",
    "=1",
    "Delegate=yes",
]


def _cases() -> Iterator[Any]:
    agent = ["run", "a"]
    cmd = ["--", "true"]
    for size in BAD_SIZES:
        yield pytest.param(
            [*agent, "--memory-max", size, *cmd], 2, "memory", id=f"run-mem-{size!r}"
        )
        yield pytest.param(
            ["exec", "a", "--memory-max", size, *cmd], 125, "memory", id=f"exec-mem-{size!r}"
        )
        yield pytest.param(["demo", "--memory-max", size], 2, "memory", id=f"demo-mem-{size!r}")
    for count in BAD_COUNTS:
        yield pytest.param(
            [*agent, "--tasks-max", count, *cmd], 2, "tasks", id=f"run-tasks-{count!r}"
        )
        yield pytest.param(
            ["exec", "a", "--tasks-max", count, *cmd], 125, "tasks", id=f"exec-tasks-{count!r}"
        )
        yield pytest.param(["events", "--limit", count], 2, "limit", id=f"limit-{count!r}")
        yield pytest.param(["report", "--top", count], 2, "top", id=f"report-top-{count!r}")
        yield pytest.param(["monitor", "--top", count], 2, "top", id=f"monitor-top-{count!r}")
        yield pytest.param(["logs", "a", "--lines", count], 2, "lines", id=f"logs-n-{count!r}")
        yield pytest.param(["demo", "--agents", count], 2, "agents", id=f"demo-agents-{count!r}")
    for weight in BAD_WEIGHTS:
        for option in ("--cpu-weight", "--io-weight"):
            what = option.removeprefix("--").replace("-", ".?")
            yield pytest.param(
                [*agent, option, weight, *cmd], 2, what, id=f"run{option}-{weight!r}"
            )
            yield pytest.param(
                ["exec", "a", option, weight, *cmd], 125, what, id=f"exec{option}-{weight!r}"
            )
    for prop in BAD_PROPERTIES:
        what = re.escape(prop.partition("=")[0] or "NAME=VALUE")
        yield pytest.param([*agent, "-p", prop, *cmd], 2, what, id=f"run-p-{prop!r}")
        yield pytest.param(["exec", "a", "-p", prop, *cmd], 125, what, id=f"exec-p-{prop!r}")
    for span in BAD_SPANS:
        yield pytest.param([*agent, "--reap-after", span, *cmd], 2, "reap", id=f"run-reap-{span!r}")
        yield pytest.param(
            ["exec", "a", "--reap-after", span, *cmd], 125, "reap", id=f"exec-reap-{span!r}"
        )
        yield pytest.param(["stop", "a", "--timeout", span], 2, "timeout", id=f"stop-t-{span!r}")
        yield pytest.param(["top", "--interval", span], 2, "interval", id=f"top-i-{span!r}")
        yield pytest.param(["monitor", "--interval", span], 2, "interval", id=f"monitor-i-{span!r}")
        yield pytest.param(["gc", "--retention", span], 2, "retention|span|time", id=f"gc-{span!r}")
        yield pytest.param(["events", "--since", span], 2, "since|time", id=f"since-{span!r}")
        yield pytest.param(["demo", "--timeout", span], 2, "timeout", id=f"demo-t-{span!r}")
        for option in ("--guard-mem-available", "--guard-swap-free", "--guard-psi-seconds"):
            yield pytest.param(
                ["monitor", "--guard", option, span], 2, "guard", id=f"monitor{option}-{span!r}"
            )
    for span in NEGATIVE_SPANS:
        yield pytest.param([*agent, "--reap-after", span, *cmd], 2, "reap", id=f"run-reap-{span}")
        yield pytest.param(["stop", "a", "--timeout", span], 2, "timeout", id=f"stop-t-{span}")
        yield pytest.param(["top", "--interval", span], 2, "interval", id=f"top-i-{span}")
        yield pytest.param(["gc", "--retention", span], 2, "retention|span", id=f"gc-{span}")
    for listen in ("127.0.0.1:²", "127.0.0.1:65536", "127.0.0.1:-1", "nohost", ":", "[::1", ""):
        yield pytest.param(["monitor", "--listen", listen], 2, "listen", id=f"listen-{listen!r}")
    yield pytest.param(["monitor", "--listen", "0.0.0.0:9"], 2, "listen", id="listen-any-refused")
    for name in BAD_NAMES:
        yield pytest.param(["run", name, *cmd], 2, "name", id=f"run-name-{name[:12]!r}")
        yield pytest.param(["exec", name, *cmd], 125, "name", id=f"exec-name-{name[:12]!r}")
        for command in ("stop", "kill", "freeze", "thaw", "logs", "attach"):
            yield pytest.param([command, name], 2, "name", id=f"{command}-name-{name[:12]!r}")
        yield pytest.param(["--fleet", name, "ls"], 2, "fleet", id=f"fleet-{name[:12]!r}")
        yield pytest.param(["--fleet", name, "events"], 2, "fleet", id=f"fleet-ev-{name[:12]!r}")
        yield pytest.param(
            ["events", "--agent", name], 2, "agent|name", id=f"ev-agent-{name[:9]!r}"
        )
    for sig in ("0", "65", "-1", "²", "SIGFOO", "", "9.5"):
        yield pytest.param(["kill", "a", "--signal", sig], 2, "signal", id=f"kill-s-{sig!r}")
    for command, code in (("run", 2), ("exec", 125)):
        yield pytest.param(
            [command, "a", "--", ""],
            2 if command == "run" else 127,
            "command|empty|not found",
            id=f"{command}-cmd-empty",
        )
        yield pytest.param(
            [command, "a", "--", "/nonexistent/x"],
            2 if command == "run" else 127,
            "not found|no such|nonexistent",
            id=f"{command}-cmd-missing",
        )
        yield pytest.param(
            [command, "a", "--", "/etc"],
            2 if command == "run" else 126,
            "/etc",
            id=f"{command}-dir",
        )
        yield pytest.param([command, "a"], code, "command|CMD", id=f"{command}-no-command")
    for cwd in ("/nonexistent", "/etc/passwd", "rel\x00ative"):
        yield pytest.param(["run", "a", "--cwd", cwd, *cmd], 2, "cwd|directory", id=f"cwd-{cwd!r}")
    for env in ("NOEQUALS", "=v", "A\x00=b"):
        yield pytest.param(["run", "a", "--env", env, *cmd], 2, "env", id=f"env-{env!r}")
    for log in ("/etc", "/dev/null", "{tmp}/fifo"):
        yield pytest.param(["run", "a", "--log", log, *cmd], 2, "--log", id=f"log-{log}")
    for manager in ("bogus", "", "System"):
        yield pytest.param(["--manager", manager, "ls"], 2, "manager", id=f"manager-{manager!r}")
    yield pytest.param(["stop"], 2, "name the agent to stop", id="stop-neither")
    yield pytest.param(["stop", "a", "--all"], 2, "not both", id="stop-both")


#: The environment of every case: nothing of this host's managers or state.
def _isolated(tmp_path: Path) -> dict[str, str | None]:
    nowhere = f"unix:path={tmp_path}/no-bus"
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "DBUS_SESSION_BUS_ADDRESS": nowhere,
        "DBUS_SYSTEM_BUS_ADDRESS": nowhere,
        "AGENTSCOPE_EXEC_FALLBACK": None,
    }


def _files(top: Path) -> list[Path]:
    return sorted(top.rglob("*"))


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What a case reached for: the bus (a fleet), the registry (a history), an exec."""
    seen: list[str] = []

    def no_fleet(opts: Any) -> Any:
        seen.append("bus")
        raise AssertionError("reached for the bus before refusing")

    def no_history(opts: Any) -> Any:
        seen.append("registry")
        raise AssertionError("opened the registry before refusing")

    def no_exec(path: str, argv: list[str]) -> None:
        seen.append(f"exec {path}")
        raise AssertionError("exec'd the command of a refused case")

    monkeypatch.setattr(_fleet, "open_fleet", no_fleet)
    monkeypatch.setattr(_fleet, "open_history", no_history)
    monkeypatch.setattr(os, "execv", no_exec)
    return seen


def _check(result: Result, code: int, what: str, seen: list[str]) -> None:
    said = result.stderr
    assert seen == [], f"{seen}: {said}"
    assert result.code == code, said
    assert "Traceback" not in said + result.stdout
    assert 'File "' not in said
    assert "a bug in agentscope" not in said
    assert re.search(what, said, re.IGNORECASE), said
    assert len(said) < 2000, said  # one clear message, not a dump
    # What a user sees is text: no control character from the input comes back raw.
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]", said), said


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "code", "what"), list(_cases()))
def test_the_command_line_refuses_before_anything_is_made(
    tmp_path: Path, reached: list[str], argv: list[str], code: int, what: str
) -> None:
    os.mkfifo(tmp_path / "fifo")  # for a --log: opening it for writing would hang
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = _files(tmp_path)
    result = run("--user", *argv, env=_isolated(tmp_path))
    _check(result, code, what, reached)
    assert _files(tmp_path) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["bogus", "", "RUN", "run\n", "²"])
def test_a_bad_exec_fallback_variable_is_refused(
    tmp_path: Path, reached: list[str], value: str
) -> None:
    env = _isolated(tmp_path) | {"AGENTSCOPE_EXEC_FALLBACK": value}
    if value == "":
        pytest.skip("an empty variable is unset, as a shell's VAR= is read")
    result = run("--user", "exec", "a", "--", "true", env=env)
    _check(result, 125, "AGENTSCOPE_EXEC_FALLBACK", reached)
    assert _files(tmp_path) == []


#: The monitor's environment variables (a unit's Environment=), each with values it refuses.
_MONITOR_ENV = {
    "AGENTSCOPE_MONITOR_LISTEN": ["127.0.0.1:²", "127.0.0.1:70000", "nohost", "0.0.0.0:9"],
    "AGENTSCOPE_GUARD": ["maybe", "²"],
    "AGENTSCOPE_GUARD_MEM_AVAILABLE": ["²", "nan", "inf", "101", "-1", "1e309"],
    "AGENTSCOPE_GUARD_SWAP_FREE": ["²", "nan", "101"],
    "AGENTSCOPE_GUARD_PSI_FULL": ["²", "0", "101", "nan", "on"],
    "AGENTSCOPE_GUARD_PSI_SECONDS": ["²", "inf", "-1", "3601"],
    "AGENTSCOPE_GUARD_PROCESS": ["perhaps"],
    "AGENTSCOPE_RECLAIM_ESCAPED": ["perhaps"],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("variable", "value"),
    [(k, v) for k, values in _MONITOR_ENV.items() for v in values],
)
def test_a_bad_monitor_variable_is_refused_before_anything_is_made(
    tmp_path: Path, reached: list[str], variable: str, value: str
) -> None:
    env = _isolated(tmp_path) | {variable: value}
    result = run("--user", "monitor", env=env)
    # typer names the variable's option (--guard-psi-full), our parsers the value.
    option = "--" + variable.removeprefix("AGENTSCOPE_").removeprefix("MONITOR_").lower()
    _check(result, 2, f"{re.escape(option.replace('_', '-'))}|{re.escape(value)}", reached)
    assert _files(tmp_path) == []


def test_the_table_is_wide() -> None:
    # A guard against a refactoring that empties a generator above.
    assert len(list(_cases())) > 400
    assert len(list(_api_cases())) > 150


# -- the Python API over the fake bus -------------------------------------------------------

#: Numbers no argument of the API takes where an int or a finite float is meant.
_NOT_NUMBERS: list[object] = [True, "²", float("nan"), float("inf"), -float("inf"), 1j, b"5"]
#: ... and not where an int is meant (a text of ASCII digits is one: the number grammar).
_NOT_INTS: list[object] = [*_NOT_NUMBERS, 1.5, 2**64, -1, " 5x"]


def _api_cases() -> Iterator[Any]:
    argv = ["true"]
    for value in _NOT_INTS:
        yield pytest.param("launch", ("a", argv), {"memory_max": value}, id=f"mem-{value!r}")
        yield pytest.param("launch", ("a", argv), {"tasks_max": value}, id=f"tasks-{value!r}")
        yield pytest.param("launch", ("a", argv), {"cpu_weight": value}, id=f"cpu-{value!r}")
        yield pytest.param("launch", ("a", argv), {"io_weight": value}, id=f"io-{value!r}")
        yield pytest.param("adopt", (value, "a"), {}, id=f"adopt-pid-{value!r}")
    yield pytest.param("adopt", (None, "a"), {}, id="adopt-pid-None")
    for value in (0, 10001, 2**63):
        yield pytest.param("launch", ("a", argv), {"cpu_weight": value}, id=f"cpu-range-{value}")
    yield pytest.param("launch", ("a", argv), {"memory_max": 2**63 + 1}, id="mem-over-8EiB")
    yield pytest.param("launch", ("a", argv), {"memory_max": 0}, id="mem-0")
    for value in (-1, float("nan"), float("inf"), "²", "forever", True, 10**9):
        yield pytest.param("launch", ("a", argv), {"reap_after": value}, id=f"reap-{value!r}")
    for prop in BAD_PROPERTIES:
        key, _, value = prop.partition("=")
        props = {key: value}
        yield pytest.param("launch", ("a", argv), {"properties": props}, id=f"p-{prop!r}")
    yield pytest.param("launch", ("a", argv), {"properties": {"TasksMax": 2**64}}, id="p-int")
    yield pytest.param("launch", ("a", argv), {"properties": ["TasksMax=5"]}, id="p-list")
    for name in [*BAD_NAMES, None, 5, b"a"]:
        yield pytest.param("launch", (name, argv), {}, id=f"launch-name-{name!r:.14}")
        yield pytest.param("adopt", (os.getpid(), name), {}, id=f"adopt-name-{name!r:.14}")
        for method in ("stop", "kill", "freeze", "thaw"):
            yield pytest.param(method, (name,), {}, id=f"{method}-name-{name!r:.14}")
    for bad_argv in ([], [""], ["/nonexistent/x"], ["/etc"], "true", [b"true"], ["tr\x00ue"]):
        yield pytest.param("launch", ("a", bad_argv), {}, id=f"argv-{bad_argv!r:.16}")
    for cwd in ("/nonexistent", "/etc/passwd", "a\x00b"):
        yield pytest.param("launch", ("a", argv), {"cwd": cwd}, id=f"cwd-{cwd!r}")
    for env in ({"A": 1}, {1: "a"}, {"A=B": "c"}, {"": "x"}, {"A\x00": "b"}, {"A": "b\x00"}):
        yield pytest.param("launch", ("a", argv), {"env": env}, id=f"env-{env!r}")
    yield pytest.param("launch", ("a", argv), {"terminal": "screen"}, id="terminal-screen")
    for timeout in (-1, float("nan"), float("inf"), "10x", True, 10**6):
        yield pytest.param("stop", ("a",), {"timeout": timeout}, id=f"stop-timeout-{timeout!r}")
    for sig in (0, -1, 65, 99999, "TERM", True, 9.0):
        yield pytest.param("kill", ("a",), {"signal": sig}, id=f"kill-{sig!r}")
    for top in (-1, 10**9, True, "5x", float("nan")):
        yield pytest.param("report", (), {"top": top}, id=f"report-top-{top!r}")
    for limit in (-1, True, "5x", float("nan"), 10**25):
        yield pytest.param("events", (), {"limit": limit}, id=f"events-limit-{limit!r}")
        yield pytest.param("events", (), {"last": limit}, id=f"events-last-{limit!r}")
    for when in (float("nan"), float("inf"), "yesterday", True):
        yield pytest.param("events", (), {"since": when}, id=f"events-since-{when!r}")
    for retention in (-1, float("nan"), float("inf"), "7d", True):
        yield pytest.param("gc", (), {"retention_seconds": retention}, id=f"gc-{retention!r}")


def _refusals() -> tuple[type[BaseException], ...]:
    from agentscope_systemd import InvalidConfig, InvalidName, LaunchError

    return (InvalidName, InvalidConfig, LaunchError)


_WRITES = {"StartTransientUnit", "StopUnit", "KillUnit", "SetUnitProperties"}
_WRITES |= {"AttachProcessesToUnit", "FreezeUnit", "ThawUnit"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("method", "args", "kwargs"), list(_api_cases()))
async def test_the_api_refuses_before_anything_is_made(
    tmp_path: Path, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    from agentscope_systemd import AgentscopeError
    from agentscope_systemd._registry._registry import Registry
    from tests.fakesystemd import FakeSystemd
    from tests.test_fleet import make_fleet

    bus = FakeSystemd(tmp_path / "cgroup")
    async with make_fleet(tmp_path, bus) as fleet:
        with pytest.raises(AgentscopeError) as info:
            await getattr(fleet, method)(*args, **kwargs)
        error = info.value
        # Not AgentNotFound: a bad argument is refused before any agent is looked up.
        assert isinstance(error, _refusals()), repr(error)
        message = str(error)
        assert 0 < len(message) < 1000
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]", message), message
        asked = {c.member for c in bus.calls} & _WRITES
        assert asked == set(), asked
        assert await fleet.agents(all=True) == []
    with Registry(tmp_path / "registry.db") as registry:
        assert registry.events("t") == []
    assert not (tmp_path / "tmux").exists()


# -- hostile /proc and cgroup trees -------------------------------------------------------

_HUGE = 80 << 20  # past MAX_KERNEL_FILE: no kernel file a reader here takes is as large


def _spoil(path: Path, how: str) -> None:
    """Make ``path`` (a file of the fake tree) what a hostile or vanishing process leaves."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "gone":
        pass
    elif how == "dir":
        path.mkdir()
    elif how == "huge":
        with path.open("wb") as f:
            f.truncate(_HUGE)  # sparse: 64 MiB of NULs
    elif how == "zero":
        path.symlink_to("/dev/zero")  # never ends
    elif how == "binary":
        path.write_bytes(b"\xff\xfe\x00\x1b[31m\x85\xc2\x9b(x) R \n" * 3)
    else:
        raise AssertionError(how)


_HOSTILE = ["fifo", "gone", "dir", "huge", "zero", "binary"]
_PID_FILES = ["stat", "statm", "status", "cmdline", "cgroup", "wchan", "oom_score_adj"]


def _pid_readers() -> dict[str, Any]:
    from agentscope_systemd._kernel import _proc

    return {
        "stat": _proc.read_stat,
        "statm": _proc.read_statm_rss,
        "status": _proc.read_vm_sizes,
        "cmdline": _proc.read_cmdline,
        "cgroup": _proc.read_cgroup,
        "wchan": _proc.read_wchan,
        "oom_score_adj": _proc.read_oom_score_adj,
    }


@pytest.mark.timeout(20)
@pytest.mark.parametrize("how", _HOSTILE)
@pytest.mark.parametrize("name", _PID_FILES)
def test_a_hostile_pid_file_gives_none_or_a_value_never_a_hang(
    tmp_path: Path, name: str, how: str
) -> None:
    from agentscope_systemd._kernel import _proc
    from tests import fakefs

    proc = tmp_path / "proc"
    fakefs.make_proc(proc, 4242, comm="victim")
    fakefs.make_proc(proc, 4243, comm="\x1b[2J\x85evil) R 1 (", rss_pages=10**6)
    _spoil(proc / "4242" / name, how)
    value: object = None
    unnamed: OSError | None = None
    try:
        value = _pid_readers()[name](4242, proc)
    except ValueError:
        pass  # the parsers' documented refusal of a file that is not the kernel's
    except OSError as exc:
        # Not "vanished": a reader says what it could not read, named.
        unnamed = exc if exc.filename is None else None
    assert unnamed is None
    assert value is None or not isinstance(value, bytes)
    # A scan goes on past a vanished process, and a hostile comm (all a
    # process controls of these files) comes back as text. What no kernel
    # makes (a FIFO, a directory, 80 MiB) may stop the scan, with an error.
    try:
        top = _proc.top_processes(5, proc)
    except (OSError, ValueError):
        assert how != "gone"
        return
    assert [p.pid for p in top][:1] == [4243]
    assert all(isinstance(p.comm, str) for p in top)


_SCOPE_FILES = ["memory.current", "memory.events", "memory.stat", "memory.pressure", "cgroup.procs"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("how", _HOSTILE)
@pytest.mark.parametrize("name", _SCOPE_FILES)
def test_a_hostile_scope_file_gives_a_value_or_an_error_never_a_hang(
    tmp_path: Path, name: str, how: str
) -> None:
    from agentscope_systemd._kernel import _cgroup
    from tests import fakefs

    slice_path = tmp_path / "app.slice/app-agentscope.slice/app-agentscope-agents.slice"
    good = "agentscope-f-good-000000.scope"
    bad = "agentscope-f-bad-000000.scope"
    fakefs.make_cgroup(slice_path, good, current=1 << 20, procs=[4242])
    fakefs.make_cgroup(slice_path, bad, current=1 << 20, procs=[4243])
    # A directory a user may make in their own manager's subtree: its name is theirs.
    fakefs.make_cgroup(slice_path, "\x1b[2J\x85evil\n.scope", current=1)
    _spoil(slice_path / bad / name, how)
    for scan in (_cgroup.scan_slice, _cgroup.scan_slice_counters):
        try:
            found: dict[str, Any] = scan(slice_path)
        except (OSError, ValueError):
            assert how not in ("gone",), "a vanished file is a vanished cgroup, not an error"
            continue
        assert good in found


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "children",
    [b"4300 \xb2 x -5 99999999999999999999999 4300 ", b"\x00" * 4096, "fifo", "zero", "gone"],
)
def test_the_escape_audit_over_hostile_children_files(tmp_path: Path, children: Any) -> None:
    from agentscope_systemd._monitor import _escape
    from tests import fakefs

    cgroups, proc = tmp_path / "cgroup", tmp_path / "proc"
    slice_path = fakefs.make_cgroup(cgroups, "app.slice/app-agentscope-agents.slice")
    scope = "agentscope-f-a-000000.scope"
    fakefs.make_cgroup(slice_path, scope, procs=[4242])
    fakefs.make_proc(proc, 4242, cgroup=f"/app.slice/app-agentscope-agents.slice/{scope}")
    # The escapee names itself: control characters, a C1 CSI, a newline.
    fakefs.make_proc(proc, 4300, comm="\x1b]0;x\x07\x9bq\n", ppid=4242, cgroup="/x.scope")
    fakefs.set_children(proc, 4242, [4300])
    task = proc / "4242/task/4242/children"
    if isinstance(children, bytes):
        task.write_bytes(children)
    else:
        _spoil(task, children)
    try:
        found = _escape.find_escapes(
            slice_path, {scope: [4242]}, cgroup_root=cgroups, proc_root=proc
        )
    except OSError:
        assert children in ("fifo", "zero")  # no kernel makes these: an error, named
        return
    for e in found:
        assert (e.pid, e.ppid) == (4300, 4242)
        assert not re.search(r"[\x00-\x1f\x7f-\x9f]", e.comm), e.comm
    if isinstance(children, bytes) and b"4300" in children:
        assert len(found) == 1  # the real child, once; nothing made of the rest
    elif children != "zero":
        assert found == ()
