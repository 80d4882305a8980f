"""``call_shell=True``: an agent's SHELL whose every ``-c`` is a tool call (#26 item 4).

Over the fake cgroup tree of tests/test_calls.py (its ``kernel`` fixture),
the launch over the fake bus, and the installed ``agentscope-shell`` command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentscope_systemd._calls import _calls, _callshell
from agentscope_systemd._cli._errors import exec_status
from agentscope_systemd._cli._shell import run_shell
from agentscope_systemd._errors import InvalidConfig, LaunchError
from tests.fakesystemd import FakeSystemd, end_children
from tests.test_calls import SLICE, UNIT, FakeKernel, cgroup_of, kernel, settled
from tests.test_fleet import make_fleet, stop_everything

__all__ = ["kernel"]  # the fixture, shared with tests/test_calls.py

BASH = shutil.which("bash") or "/bin/sh"


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        (["-c", "make"], True),
        (["-lc", "make"], True),  # bash -lc, as harnesses spawn their tools
        (["-e", "-c", "make"], True),
        (["-o", "pipefail", "-c", "make"], True),
        (["+o", "vi", "-ec", "make"], True),
        (["--login", "-c", "make"], True),
        ([], False),  # an interactive shell
        (["-i"], False),
        (["--login"], False),
        (["script.sh", "-c"], False),  # a script's own arguments
        (["--", "-c"], False),
        (["-o"], False),
    ],
)
def test_a_shell_runs_a_command_string_only_with_c(args: list[str], runs: bool) -> None:
    assert _callshell.runs_command(args) is runs


@pytest.mark.parametrize(
    "value",
    [None, "", "bash", "/nonexistent/sh", "/usr/bin/agentscope-shell", "/bin/s\0h", "/tmp"],
)
def test_an_unusable_real_shell_is_bin_sh(value: str | None) -> None:
    assert _callshell.real_shell(value) == "/bin/sh"


def test_a_real_shell_that_cannot_run_is_bin_sh(tmp_path: Path) -> None:
    text = tmp_path / "notes"
    text.write_text("not a shell\n")
    text.chmod(0o644)
    assert _callshell.real_shell(str(text)) == "/bin/sh"


def test_the_real_shell_is_kept_when_usable() -> None:
    assert _callshell.real_shell(BASH) == BASH


def test_dash_c_runs_the_real_shell_as_a_call_named_shell(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = settled(kernel)
    monkeypatch.setattr(_calls, "fork_remover", lambda path, watch: None)
    monkeypatch.setenv(_callshell.REAL_SHELL_ENV, BASH)
    monkeypatch.setenv("AGENTSCOPE_CALL_MEMORY_MAX", str(256 << 20))
    ran: list[tuple[str, list[str]]] = []
    run_shell(
        ["-lc", "make -j8"],
        execv=lambda path, argv: ran.append((path, argv)),
        cgroup_root=str(kernel.root),
        proc_root=str(kernel.proc),
    )
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}/call-shell-1"
    assert (scope / "call-shell-1" / "memory.max").read_text().strip() == str(256 << 20)
    assert ran == [(BASH, [BASH, "-lc", "make -j8"])]


def test_an_interactive_shell_is_the_real_shell_and_no_call(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = settled(kernel)
    monkeypatch.setenv(_callshell.REAL_SHELL_ENV, BASH)
    before = sorted(p.name for p in scope.iterdir())
    ran: list[tuple[str, list[str]]] = []
    run_shell(
        ["-i"],
        execv=lambda path, argv: ran.append((path, argv)),
        cgroup_root=str(kernel.root),
        proc_root=str(kernel.proc),
    )
    assert ran == [(BASH, [BASH, "-i"])]
    assert sorted(p.name for p in scope.iterdir()) == before
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}/agent"


def test_a_shell_inside_a_call_stays_in_that_call(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make running $SHELL -c per recipe line: a new call would leave the
    # first call's caps.
    scope = settled(kernel)
    monkeypatch.setattr(_calls, "fork_remover", lambda path, watch: None)
    run = {"cgroup_root": str(kernel.root), "proc_root": str(kernel.proc)}
    ran: list[tuple[str, list[str]]] = []
    run_shell(["-c", "make"], execv=lambda path, argv: ran.append((path, argv)), **run)  # type: ignore[arg-type]
    run_shell(["-c", "cc x.c"], execv=lambda path, argv: ran.append((path, argv)), **run)  # type: ignore[arg-type]
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}/call-shell-1"
    assert not (scope / "call-shell-2").exists()
    assert [argv for _, argv in ran] == [["/bin/sh", "-c", "make"], ["/bin/sh", "-c", "cc x.c"]]


def test_dash_c_outside_any_agent_is_refused_with_125(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    ran: list[object] = []
    with pytest.raises(_calls.NotInAgent) as info:
        run_shell(["-c", "true"], execv=lambda p, a: ran.append(a), proc_root=str(proc))
    assert exec_status(info.value) == 125
    assert ran == []


def test_the_installed_command_runs_scripts_and_refuses_calls_outside_an_agent(
    tmp_path: Path,
) -> None:
    command = Path(sys.executable).parent / _callshell.SHELL_COMMAND
    if not command.exists():
        pytest.skip(f"{command} is not installed (make venv installs it)")
    if "agentscope-" in (_calls.own_cgroup() or ""):
        pytest.skip("this test runs inside an agent")
    script = tmp_path / "s.sh"
    script.write_text('echo "ran $0"\n')
    env = {**os.environ, _callshell.REAL_SHELL_ENV: "/bin/sh"}
    plain = subprocess.run([command, str(script)], capture_output=True, text=True, env=env)
    assert (plain.returncode, plain.stdout) == (0, f"ran {script}\n")
    called = subprocess.run([command, "-c", "echo ran"], capture_output=True, text=True, env=env)
    assert called.returncode == 125
    assert called.stdout == ""
    assert "no agent's scope" in called.stderr
    assert "Traceback" not in called.stderr


async def test_launch_with_call_shell_gives_the_agent_its_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = Path(sys.executable).parent / _callshell.SHELL_COMMAND
    if not command.exists():
        pytest.skip(f"{command} is not installed (make venv installs it)")
    monkeypatch.setenv("SHELL", BASH)
    bus = FakeSystemd(tmp_path / "cgroup")
    out = tmp_path / "env"
    async with make_fleet(tmp_path, bus) as fleet:
        with pytest.raises(InvalidConfig):
            await fleet.launch("bad", ["true"], call_shell="yes")  # type: ignore[arg-type]
        agent = await fleet.launch(
            "a",
            ["sh", "-c", f'echo "$SHELL $AGENTSCOPE_REAL_SHELL" > {out}'],
            call_shell=True,
        )
        assert await agent.wait() == 0
        # An agent launched from a call-shell agent keeps the real shell, not ours.
        monkeypatch.setenv("SHELL", str(command))
        monkeypatch.setenv(_callshell.REAL_SHELL_ENV, BASH)
        again = await fleet.launch(
            "b", ["sh", "-c", f'echo "$SHELL $AGENTSCOPE_REAL_SHELL" >> {out}'], call_shell=True
        )
        assert await again.wait() == 0
        await stop_everything(bus)
    end_children()
    assert out.read_text().splitlines() == [f"{command} {BASH}"] * 2


async def test_launch_with_call_shell_and_no_command_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_callshell, "SHELL_COMMAND", "agentscope-shell-not-installed")
    bus = FakeSystemd(tmp_path / "cgroup")
    async with make_fleet(tmp_path, bus) as fleet:
        with pytest.raises(LaunchError, match="agentscope-shell-not-installed"):
            await fleet.launch("a", ["true"], call_shell=True)
        assert await fleet.agents() == []
        await stop_everything(bus)
    end_children()
