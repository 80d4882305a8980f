"""tmux agents against real systemd: one scope per pane, the server in its own.

The manager here is a launcher in a unit of its own, so SIGKILLing that unit
kills everything in the manager's cgroup, as a crash of a harness's service
would. Agents are ``sh`` loops in their panes (cheap under TCG) that echo
what is typed into them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from conftest import MANAGER, systemctl

from agentscope_systemd import (
    AgentNotFound,
    AsyncFleet,
    LaunchError,
    TmuxError,
    TmuxUnavailable,
    WindowExists,
)
from agentscope_systemd._fleet import _tmux

CLI = shutil.which("agentscope") or "agentscope"
ECHO = 'echo "hello from $0"; while read -r l; do echo "got $l"; done'
USER = ["--user"] if MANAGER == "user" else []

LAUNCHER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import agentscope_systemd

    ECHO = sys.argv[4]

    async def main(fleet, db, out):
        async with agentscope_systemd.AsyncFleet(fleet, registry=db) as f:
            agents = await asyncio.gather(*(
                f.launch(f"a{i}", ["sh", "-c", ECHO, f"a{i}"], terminal="tmux")
                for i in range(5)))
            info = {a.name: [a.pid, a.unit] for a in agents}
            with open(out + ".tmp", "w") as fh:
                json.dump({"agents": info, "manager": os.getpid()}, fh)
            os.rename(out + ".tmp", out)
            await asyncio.sleep(600)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


def wait_for(cond: Callable[[], object], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return bool(cond())


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1]


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or during, the read
        return False


def socket_of(fleet: str) -> Path:
    return _tmux.socket_dir(_tmux.runtime_dir(MANAGER), fleet) / "socket"


def tmux(fleet: str, *args: str) -> str:
    done = subprocess.run(
        ["tmux", "-S", str(socket_of(fleet)), *args], capture_output=True, text=True, check=False
    )
    return done.stdout


def server_pid(fleet: str) -> int:
    return int(tmux(fleet, "display-message", "-p", "#{pid}").strip() or 0)


def units(pattern: str) -> set[str]:
    out = systemctl("list-units", "--plain", "--no-legend", "--all", pattern)
    return {line.split()[0] for line in out.splitlines() if line.strip()}


async def until(cond: Callable[[], object], timeout: float = 30) -> bool:
    return await asyncio.to_thread(wait_for, cond, timeout)


async def logs_show(fleet: AsyncFleet, name: str, text: str, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in await fleet.logs(name)):
            return True
        await asyncio.sleep(0.2)
    return False


@pytest.fixture
def name() -> str:
    return f"x{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def fleet(name: str, tmp_path: Path) -> AsyncIterator[AsyncFleet]:
    async with AsyncFleet(name, registry=tmp_path / "agentscope.db") as f:
        try:
            yield f
        finally:
            for agent in await f.agents():
                with contextlib.suppress(AgentNotFound):  # ended meanwhile
                    await f.stop(agent.name, timeout=5)
            tmux(name, "kill-server")
            subprocess.run(["systemctl", *USER, "stop", _tmux.tmux_unit(name)], capture_output=True)


@pytest.mark.heavy("tmux-adopt")
async def test_five_tmux_agents_survive_their_manager_and_are_adopted(
    name: str, fleet: AsyncFleet, tmp_path: Path
) -> None:
    out, mgr = tmp_path / "launched.json", f"agentscope-test-{name}.service"
    db = str(tmp_path / "agentscope.db")
    launcher = [sys.executable, "-c", LAUNCHER, name, db, str(out), ECHO]
    err = tmp_path / "launcher.err"
    unit = [f"--unit={mgr}", "--collect", f"--property=StandardError=file:{err}"]
    subprocess.run(["systemd-run", *USER, "--quiet", *unit, *launcher], check=True)
    try:
        assert await until(lambda: out.exists() or "Error" in _text(err), 90), _text(err)
        assert out.exists(), _text(err)
        info = json.loads(out.read_text())
        agents = {n: (pid, unit) for n, (pid, unit) in info["agents"].items()}
        server = server_pid(name)
        manager_cgroup = cgroup_of(info["manager"])
        # Each pane's process is the agent, in its own scope, at 800.
        for pid, unit in agents.values():
            assert cgroup_of(pid).endswith(f"/{unit}")
            assert oom_score_adj(pid) == 800
        # The server: its own scope under the fleet's slice, the manager's oom_score_adj.
        assert cgroup_of(server).endswith(f"/{fleet.slice}/{_tmux.tmux_unit(name)}")
        assert oom_score_adj(server) == oom_score_adj(info["manager"])
        procs = Path(f"/sys/fs/cgroup{manager_cgroup}/cgroup.procs").read_text().split()
        assert {int(p) for p in procs} == {info["manager"]}
        windows = tmux(name, "list-windows", "-t", f"={name}", "-F", "#{window_name}")
        assert sorted(windows.split()) == sorted(agents)

        systemctl("kill", "--signal=SIGKILL", mgr)
        assert await until(lambda: not alive(info["manager"]))
    finally:
        subprocess.run(["systemctl", *USER, "stop", mgr], capture_output=True)
    assert alive(server)
    assert all(alive(pid) for pid, _ in agents.values())

    # A new manager (this test's fleet, opened before the launcher ran) adopts them.
    async with AsyncFleet(name, registry=tmp_path / "agentscope.db") as again:
        listed = {a.name: a for a in await again.agents()}
        assert {n: (a.pid, a.unit) for n, a in listed.items()} == agents
        assert {a.state for a in listed.values()} == {"running"}
        assert {a.terminal for a in listed.values()} == {"tmux"}
        for n in agents:
            assert await logs_show(again, n, f"hello from {n}")
        await again.send("a0", "ping", enter=True)
        assert await logs_show(again, "a0", "got ping")

        # A window closed from inside tmux: its agent is marked exited.
        tmux(name, "kill-window", "-t", f"={name}:=a1")
        assert await until(lambda: not alive(agents["a1"][0]))
        states = {a.name: a.state for a in await again.agents(all=True)}
        assert states["a1"] == "exited"
        with pytest.raises(AgentNotFound):
            await again.logs("a1")

        # A read-only attach on a terminal of its own, then detached by tmux.
        argv = await again.attach_command("a2", read_only=True)
        master, slave = os.openpty()
        client = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={**os.environ, "TERM": "xterm"},
        )
        os.close(slave)
        drain = threading.Thread(target=_drain, args=(master,), daemon=True)
        drain.start()
        try:
            fmt = "#{client_readonly} #{window_name}"
            assert await until(lambda: tmux(name, "list-clients", "-F", fmt).strip() == "1 a2")
            tmux(name, "detach-client", "-s", f"={name}")
            assert await asyncio.to_thread(client.wait, 20) == 0
        finally:
            client.kill()
            os.close(master)

        # A dead server: its agents end with their windows; the next launch restarts it.
        os.kill(server, 9)
        assert await until(lambda: not any(alive(p) for p, _ in agents.values()))
        for _ in range(50):
            states = {a.name: a.state for a in await again.agents(all=True)}
            if set(states.values()) == {"exited"}:
                break
            await asyncio.sleep(0.2)
        assert set(states.values()) == {"exited"}, states
        agent = await again.launch("b", ["sh", "-c", ECHO, "b"], terminal="tmux")
        new_server = server_pid(name)
        assert new_server != server
        assert cgroup_of(new_server).endswith(f"/{_tmux.tmux_unit(name)}")
        assert cgroup_of(agent.pid).endswith(f"/{agent.unit}")
        assert await logs_show(again, "b", "hello from b")


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


async def test_oom_kill_in_one_pane_leaves_the_others(name: str, fleet: AsyncFleet) -> None:
    others = [
        await fleet.launch(f"o{i}", ["sh", "-c", ECHO, f"o{i}"], terminal="tmux") for i in range(2)
    ]
    alloc = "python3 -c 'b = b\"x\" * (200 * 2**20)'; echo rc=$?; " + ECHO
    capped = await fleet.launch(
        "capped", ["sh", "-c", alloc, "capped"], terminal="tmux", memory_max=64 * 2**20
    )
    server = server_pid(name)
    assert await logs_show(fleet, "capped", "rc=137", 90)  # SIGKILLed by the kernel
    assert all(a.alive() for a in others)
    assert alive(server)
    # 252+: OOMPolicy=continue; 247: its scopes ignore OOM kills (see test_launch).
    assert capped.alive()
    listed = {a.name: a for a in await fleet.agents()}
    assert listed["capped"].oom_kills == 1
    assert {listed[a.name].oom_kills for a in others} == {0}
    for a in others:
        await fleet.send(a.name, "still here", enter=True)
        assert await logs_show(fleet, a.name, "got still here")


async def test_bad_input_leaves_no_scope_or_window(
    name: str, fleet: AsyncFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fleet.launch("first", ["sh", "-c", ECHO, "first"], terminal="tmux")
    tmux(name, "new-window", "-d", "-t", f"={name}:", "-n", "taken", "sleep", "600")
    with pytest.raises(WindowExists, match="kill-window"):
        await fleet.launch("taken", ["sleep", "60"], terminal="tmux")
    names = tmux(name, "list-windows", "-t", f"={name}", "-F", "#{window_name}").split()
    assert sorted(names) == ["first", "taken"]
    assert not units(f"agentscope-{name}-taken-*")
    with pytest.raises(LaunchError, match="stdin, stdout and stderr are its pane"):
        await fleet.launch("piped", ["sleep", "60"], terminal="tmux", stdout=subprocess.DEVNULL)
    await fleet.launch("plain", ["sleep", "60"], stdout=subprocess.DEVNULL)
    with pytest.raises(TmuxError, match="has no tmux window"):
        await fleet.logs("plain")

    # The socket directory: not a directory (root), not writable (a user).
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    dirs = [blocked / "tmux"]
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        dirs.append(ro)
    for d in dirs:
        async with AsyncFleet(f"{name}d", registry=tmp_path / "agentscope.db", tmux_dir=d) as f:
            with pytest.raises(TmuxError, match="make it writable"):
                await f.launch("c", ["sleep", "60"], terminal="tmux")
    # tmux not installed (not on the manager's PATH).
    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(tmp_path))
        async with AsyncFleet(f"{name}m", registry=tmp_path / "agentscope.db") as f:
            with pytest.raises(TmuxUnavailable, match="apt install tmux"):
                await f.launch("c", ["/bin/sleep", "60"], terminal="tmux")
    assert not units(f"agentscope-{name}?-*")


@pytest.mark.heavy("tmux-cli")
async def test_cli_run_tmux_and_logs(name: str) -> None:
    # Two CLI runs only: each costs an interpreter start (seconds under TCG).
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, "--json", "--fleet", name, *args],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    async with AsyncFleet(name) as fleet:  # the CLI's registry
        try:
            run = await asyncio.to_thread(cli, "run", "--tmux", "c", "--", "sh", "-c", ECHO, "c")
            assert run.returncode == 0, run.stderr
            assert json.loads(run.stdout)["tmux"] == "c"
            await fleet.send("c", "hi there", enter=True)
            assert await logs_show(fleet, "c", "got hi there")
            shown = await asyncio.to_thread(cli, "logs", "c", "--lines", "5")
            assert shown.returncode == 0, shown.stderr
            lines = json.loads(shown.stdout)["lines"]
            assert lines[0] == "hello from c"
            assert lines[-1] == "got hi there"
        finally:
            for agent in await fleet.agents():
                await fleet.stop(agent.name, timeout=5)
            tmux(name, "kill-server")
            subprocess.run(["systemctl", *USER, "stop", _tmux.tmux_unit(name)], capture_output=True)
