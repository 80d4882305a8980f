"""tmux agents: the pure parts (spec, windows, captured lines, paths) and the shim itself.

Scopes, panes and the server's cgroup are tested in the VMs
(integration/tests/test_tmux.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentscope_systemd import LaunchError, TmuxError, TmuxUnavailable, WindowExists, _names
from agentscope_systemd._fleet import _tmux


def test_spec_is_nul_terminated_fields_in_shim_order() -> None:
    spec = _tmux.spec_bytes(800, "/work", {"A": "1", "B": "x y"}, ["sh", "-c", "echo hi"])
    assert spec.split(b"\0") == [
        b"800",
        b"/work",
        b"2",
        b"A=1",
        b"B=x y",
        b"sh",
        b"-c",
        b"echo hi",
        b"",
    ]


def test_spec_refuses_nul_in_any_field() -> None:
    with pytest.raises(LaunchError, match="NUL"):
        _tmux.spec_bytes(800, "/", {"A": "1\0"}, ["sh"])


@pytest.mark.parametrize(
    ("cmdline", "done"),
    [
        (["bash", "-c", _tmux.SHIM, _tmux.SHIM_TAG, "/f", "/s"], False),
        ([_tmux.ENV_TAG, "-i", "--", "A=1", "sleep", "9"], False),
        (["sleep", "9"], True),
        (["bash", "-c", "a script the agent runs"], True),
        (["/usr/bin/python3", "agent.py"], True),
    ],
)
def test_exec_done_tells_the_shim_and_its_env_from_the_agent(
    cmdline: list[str], done: bool
) -> None:
    assert _tmux.exec_done(cmdline) is done


def test_at_gate_is_only_the_shim() -> None:
    assert _tmux.at_gate(["bash", "-c", _tmux.SHIM, _tmux.SHIM_TAG, "/f", "/s"])
    assert not _tmux.at_gate(["tmux", "-S", "/run/agentscope/tmux-x/socket", "start-server"])
    assert not _tmux.at_gate([])


def test_parse_windows_keeps_tabs_in_names_and_skips_junk() -> None:
    lines = ["@0\tcoder-1\t412", "@3\tname\twith tab\t99", "garbage", "@4\tx\tnot-a-pid", ""]
    assert _tmux.parse_windows(lines) == [
        _tmux.Window("@0", "coder-1", 412),
        _tmux.Window("@3", "name\twith tab", 99),
    ]


def test_last_lines_drops_the_blank_screen_below_the_text() -> None:
    captured = ["one", "", "two", "three", "", "   ", ""]
    assert _tmux.last_lines(captured, 2) == ["two", "three"]
    assert _tmux.last_lines(captured, 10) == ["one", "", "two", "three"]
    assert _tmux.last_lines(captured, 0) == []
    assert _tmux.last_lines(["", ""], 5) == []


def test_paths_are_private_per_fleet_and_manager() -> None:
    assert _tmux.runtime_dir("system") == Path("/run/agentscope")
    env = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert _tmux.runtime_dir("user", env) == Path("/run/user/1000/agentscope")
    assert _tmux.socket_dir(Path("/r"), "fleet.a") == Path("/r/tmux-fleet.a")
    assert _tmux.session_name("fleet.a") == "fleet_a"


def test_the_server_scope_is_never_taken_for_an_agent() -> None:
    assert _tmux.tmux_unit("default") == "agentscope-default-tmux.scope"
    assert _names.parse_description(_tmux.tmux_description("default")) is None


def test_prepare_without_tmux_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    server = _tmux.TmuxServer("default", tmp_path / "tmux-default")
    with pytest.raises(TmuxUnavailable, match="tmux is not installed"):
        server.prepare()
    assert not (tmp_path / "tmux-default").exists()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_prepare_in_a_path_that_cannot_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    server = _tmux.TmuxServer("default", tmp_path / "file" / "tmux-default")
    with pytest.raises(TmuxError, match=r"cannot use .* for the fleet's tmux socket"):
        server.prepare()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_prepare_refuses_a_socket_path_too_long(tmp_path: Path) -> None:
    server = _tmux.TmuxServer("default", tmp_path / ("d" * 120))
    with pytest.raises(TmuxError, match="longer than 107 bytes"):
        server.prepare()


def test_window_exists_says_how_to_close_it() -> None:
    err = WindowExists("default", "coder-1", "@3", Path("/run/agentscope/tmux-default/socket"))
    assert "kill-window -t @3" in str(err)
    assert isinstance(err, LaunchError)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_shim_waits_for_go_then_execs_with_the_spec(tmp_path: Path) -> None:
    # The shim on its own (no tmux, no scope): it must stay put until "go",
    # then exec argv with exactly the spec's environment, cwd and oom_score_adj.
    fifo, spec, out = tmp_path / "go", tmp_path / "spec", tmp_path / "out"
    os.mkfifo(fifo)
    current = int(Path("/proc/self/oom_score_adj").read_text())
    adj = max(current, 500)  # raising is always allowed
    script = 'echo "$FOO|$TERM|$(pwd)|$(cat /proc/self/oom_score_adj)|$HOME" > "$0"'
    spec.write_bytes(
        _tmux.spec_bytes(
            adj,
            str(tmp_path),
            {"FOO": "a b", "PATH": os.defpath},
            [
                "sh",
                "-c",
                script,
                str(out),
            ],
        )
    )
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        env = {"TERM": "tmux-256color", "HOME": "/nowhere", "PATH": os.defpath}
        proc = subprocess.Popen(
            ["bash", "-c", _tmux.SHIM, _tmux.SHIM_TAG, str(fifo), str(spec)], env=env
        )
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.3)
        assert not out.exists()
        os.write(fd, b"go\n")
        assert proc.wait(10) == 0
    finally:
        os.close(fd)
    assert out.read_text() == f"a b|tmux-256color|{tmp_path}|{adj}|\n"


@pytest.mark.parametrize("argv0", ["A=1", "./x=y"])
def test_shim_never_takes_argv_for_variables(tmp_path: Path, argv0: str) -> None:
    # env(1) reads leading NAME=VALUE words as variables: an agent command
    # holding "=" must still be the command, and argv[1] only its argument.
    fifo, spec, out = tmp_path / "go", tmp_path / "spec", tmp_path / "out"
    os.mkfifo(fifo)
    command = tmp_path / argv0
    command.parent.mkdir(parents=True, exist_ok=True)
    command.write_text('#!/bin/sh\necho "ran $1 FOO=${A-unset}" > "$2"\n')
    command.chmod(0o755)
    adj = max(int(Path("/proc/self/oom_score_adj").read_text()), 500)
    env = {"PATH": f"{tmp_path}:{os.defpath}"}
    spec.write_bytes(_tmux.spec_bytes(adj, str(tmp_path), env, [argv0, "touch", str(out)]))
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        proc = subprocess.Popen(
            ["bash", "-c", _tmux.SHIM, _tmux.SHIM_TAG, str(fifo), str(spec)], env=env
        )
        os.write(fd, b"go\n")
        proc.wait(10)
    finally:
        os.close(fd)
    assert out.read_text() == "ran touch FOO=unset\n"
    assert not _tmux.exec_done([*_tmux._SAFE_EXEC, argv0])
