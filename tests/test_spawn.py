"""The launch gate, on the host: a child that waits before its exec.

Every test runs through both gates: the compiled program (native/gate.c,
what a wheel built with a C compiler has) and the Python one in
``preexec_fn`` (an install without it). What the agent gets must not
depend on which: the same argv, environment, descriptors and errors as a
plain ``subprocess.Popen``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentscope_systemd._fleet import _spawn as spawn_mod
from agentscope_systemd._fleet._spawn import spawn_gated
from native import build_gate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def gate_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled gate, built from this checkout's source (make gate builds the same)."""
    out = tmp_path_factory.mktemp("gate") / "agentscope-gate"
    if build_gate.build(out, "auto") is None:
        pytest.skip("no C compiler here to build the launch gate with")
    return out


@pytest.fixture(params=["program", "python"])
def gate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    if request.param == "program":
        program = request.getfixturevalue("gate_program")
        monkeypatch.setattr(spawn_mod, "_PROGRAM", program)
    else:
        monkeypatch.setattr(spawn_mod, "_PROGRAM", tmp_path / "no-gate-here")
    return str(request.param)


async def _launch(argv: list[str], **over: object) -> spawn_mod.GatedChild:
    kwargs: dict[str, object] = dict(
        cwd=None,
        env=None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        oom_score_adj=None,
    )
    return await spawn_gated(argv, **(kwargs | over))  # type: ignore[arg-type]


def _exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


async def test_gated_child_carries_its_exec_name_before_the_exec(gate: str) -> None:
    # A monitor may sample the new scope while the child still waits here:
    # it must not see the manager's name (python) or the gate's for it.
    child = await _launch(["/bin/sleep", "5"])
    try:
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "sleep"
        assert Path(_exe(child.pid)).name != "sleep"  # not exec'd yet
    finally:
        await child.abort()
    assert not Path(f"/proc/{child.pid}").exists()  # aborted and reaped


async def test_with_the_program_the_fork_runs_no_python(gate_program: Path, gate: str) -> None:
    # What waits at the gate is the compiled program, not a forked copy of
    # this (threaded) Python process.
    child = await _launch(["/bin/sleep", "5"])
    try:
        waiting = _exe(child.pid)
    finally:
        await child.abort()
    if gate == "program":
        assert waiting == str(gate_program)
    else:
        assert waiting == os.readlink("/proc/self/exe")


async def test_the_agent_gets_exactly_its_environment(gate: str, tmp_path: Path) -> None:
    # Names a shell would drop or add (not identifiers; PWD, SHLVL) pass as given.
    env = {"PATH": os.environ["PATH"], "a-b.c": "1", "X": "two words", "EMPTY": ""}
    out = tmp_path / "env"
    with out.open("wb") as f:
        child = await _launch(["env", "-0"], env=env, stdout=f, cwd=str(tmp_path))
        popen = await child.release()
        assert await asyncio.to_thread(popen.wait) == 0
    got = dict(e.split("=", 1) for e in out.read_text().split("\0") if e)
    assert got == env


async def test_the_agent_holds_only_its_stdio_and_its_limits(
    gate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    soft, hard = 1000, os.sysconf("SC_OPEN_MAX")
    monkeypatch.setattr(spawn_mod, "child_limit", lambda: (soft, hard))
    child = await _launch(["sleep", "5"], oom_score_adj=777)
    popen = await child.release()
    try:
        assert Path(_exe(popen.pid)).name == "sleep"
        assert sorted(os.listdir(f"/proc/{popen.pid}/fd")) == ["0", "1", "2"]
        assert Path(f"/proc/{popen.pid}/oom_score_adj").read_text().strip() == "777"
        limits = Path(f"/proc/{popen.pid}/limits").read_text()
        (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
        assert line.split()[3:5] == [str(soft), str(hard)]
    finally:
        popen.kill()
        await asyncio.to_thread(popen.wait)


def _popen_error(argv: list[str], env: dict[str, str] | None = None) -> OSError:
    try:
        subprocess.Popen(argv, env=env)
    except OSError as exc:
        return exc
    raise AssertionError(f"Popen ran {argv}")


@pytest.mark.parametrize("what", ["missing", "not executable", "no #! line", "a directory"])
async def test_exec_errors_are_popens(gate: str, what: str, tmp_path: Path) -> None:
    path = tmp_path / "prog"
    if what == "not executable":
        path.write_text("#!/bin/sh\n")
    elif what == "no #! line":
        path.write_text("echo a script without an interpreter line\n")
        path.chmod(0o755)  # execve refuses it (ENOEXEC); sh would have run it
    elif what == "a directory":
        path.mkdir()
    expected = _popen_error([str(path)])
    child = await _launch([str(path)])
    with pytest.raises(type(expected)) as caught:
        await child.release()
    assert type(caught.value) is type(expected)
    assert caught.value.errno == expected.errno
    assert caught.value.filename == str(path)
    assert not Path(f"/proc/{child.pid}").exists()  # reaped


async def test_path_search_is_popens(gate: str, tmp_path: Path) -> None:
    # A name without a slash: the env's PATH, in order; a file found but not
    # executable is passed over for a later one, as Popen does.
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "tool").write_text("#!/bin/sh\nexit 3\n")  # not executable
    (second / "tool").write_text("#!/bin/sh\nexit 4\n")
    (second / "tool").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'nowhere'}:{first}:{second}"}
    child = await _launch(["tool"], env=env)
    popen = await child.release()
    assert await asyncio.to_thread(popen.wait) == 4
    # Only the one that is not executable: its EACCES, not the last ENOENT.
    env = {"PATH": f"{first}:{tmp_path / 'nowhere'}"}
    expected = _popen_error(["tool"], env)
    assert expected.errno == errno.EACCES
    child = await _launch(["tool"], env=env)
    with pytest.raises(PermissionError):
        await child.release()


async def test_a_bad_cwd_is_refused_before_the_gate(gate: str, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await _launch(["true"], cwd=str(tmp_path / "gone"))


async def test_a_cancelled_spawn_leaves_no_child(gate: str) -> None:
    before = set(os.listdir("/proc"))
    task = asyncio.ensure_future(_launch(["sleep", "30"]))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not [
        p for p in set(os.listdir("/proc")) - before if p.isdigit() and _is_own_child(int(p))
    ]


def _is_own_child(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and int(fields[1]) == os.getpid()


_ORPHAN = """
import asyncio, os, subprocess, sys
sys.path.insert(0, {root!r})
from agentscope_systemd._fleet import _spawn
_spawn._PROGRAM = type(_spawn._PROGRAM)({program!r})
async def main():
    child = await _spawn.spawn_gated(["sleep", "60"], cwd=None, env=None,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        oom_score_adj=None)
    print(child.pid, flush=True)
    os._exit(0)  # the launcher dies with its child still at the gate
asyncio.run(main())
"""


async def test_a_child_at_the_gate_exits_when_its_launcher_dies(gate: str) -> None:
    code = _ORPHAN.format(root=str(ROOT), program=str(spawn_mod._PROGRAM))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    pid = int(done.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":
            break  # exited; whoever adopted it has not reaped it yet
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"pid {pid} still waits at the gate of a dead launcher")


def test_the_program_refuses_arguments_it_was_not_built_for(gate_program: Path) -> None:
    for argv in (
        [],
        ["x", "1", "2", "-", "-", "-", "comm", "1", "/bin/true", "--", "true"],  # fd < 3
        ["5", "6", "7", "5000", "-", "-", "comm", "1", "/bin/true", "--", "true"],  # oom
        ["5", "6", "7", "-", "-", "-", "comm", "2", "/bin/true", "--", "true"],  # count
        ["5", "6", "7", "-", "-", "-", "comm", "1", "/bin/true", "true"],  # no --
    ):
        done = subprocess.run([str(gate_program), *argv], check=False, timeout=10)
        assert done.returncode == 126, argv


def test_gate_program_is_none_without_the_program(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(spawn_mod, "_PROGRAM", tmp_path / "agentscope-gate")
    assert spawn_mod.gate_program() is None
    (tmp_path / "agentscope-gate").write_text("")  # there, but not executable
    assert spawn_mod.gate_program() is None
