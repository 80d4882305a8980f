"""Hostile local users against a real bus and a real monitor (#16).

A forged ``JobRemoved`` sent by another local user on the system bus, and a
flood of idle connections to the monitor's HTTP face while an agent is
OOM-killed. Lean: a few seconds each.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import GROW, MANAGER

import agentscope_systemd
from agentscope_systemd import AsyncFleet
from agentscope_systemd._managers._bus import SD_MANAGER, SD_PATH, SystemdBus

CLI = shutil.which("agentscope") or "agentscope"
OTHER_USER = "agent"  # integration/images.py: TEST_USER, uid 1000


@pytest.mark.skipif(MANAGER != "system", reason="another local user reaches the system bus only")
async def test_a_job_removed_forged_by_another_user_is_ignored() -> None:
    bus = SystemdBus("system")
    conn = await bus.connect()
    try:
        delivered: list[str] = []
        arrived = asyncio.Event()

        def note(msg: object) -> None:
            if getattr(msg, "member", None) == "JobRemoved":
                delivered.append(str(getattr(msg, "sender", "")))
                arrived.set()

        conn.add_message_handler(note)  # type: ignore[arg-type]
        unit = f"agentscope-forged-{uuid.uuid4().hex[:6]}.scope"
        waiting = bus.expect_job(unit)
        # What any local user may do: a unicast signal straight to our connection.
        forge = [
            "runuser", "-u", OTHER_USER, "--", "busctl", "--system",
            f"--destination={conn.unique_name}", "emit", SD_PATH, SD_MANAGER, "JobRemoved",
            "uoss", "7", f"{SD_PATH}/job/7", unit, "done",
        ]  # fmt: skip
        subprocess.run(forge, check=True, capture_output=True, timeout=30)
        try:
            await asyncio.wait_for(arrived.wait(), 10)
        except TimeoutError:
            pytest.fail("the bus did not deliver the forged signal: the test proves nothing")
        assert delivered[0] != bus._owner  # it came from the other user, not systemd
        await asyncio.sleep(0.2)
        assert not waiting.done()  # neither a launch nor a stop would go on
        bus.forget_job(unit)
    finally:
        bus.close()


def _raise_fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


@pytest.mark.heavy("monitor-http")
async def test_idle_connections_do_not_blind_the_monitor(fleet: AsyncFleet) -> None:
    monitor = subprocess.Popen(
        [CLI, "--fleet", fleet.name, "monitor", "--interval", "1", "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    idle: list[socket.socket] = []
    try:
        assert monitor.stderr is not None
        url = ""
        deadline = time.monotonic() + 60
        while not url and time.monotonic() < deadline:
            line = monitor.stderr.readline()
            assert line, "the monitor ended before serving"
            if line.startswith("serving "):
                url = line.split(" on ", 1)[1].strip()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        _raise_fd_limit(1400)
        for _ in range(1100):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect((host, int(port)))
            except OSError:
                s.close()  # the backlog was full for a moment: the flood goes on
                continue
            idle.append(s)
        assert len(idle) >= 1000
        agent = await fleet.launch(
            "capped",
            ["sh", "-c", f'python3 -c "{GROW}"; exec sleep 300'],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            memory_max=64 << 20,
        )
        kills = []
        deadline = time.monotonic() + 90
        while not kills and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            kills = await fleet.events(kind="oom_kill", agent="capped")
        assert kills, "the monitor recorded no OOM kill"
        assert kills[0].detail.get("unit") in (None, agent.unit)
        t0 = time.monotonic()
        with urllib.request.urlopen(url + "/metrics", timeout=2) as reply:
            body = reply.read().decode()
        took = time.monotonic() - t0
        print(f"scrape with {len(idle)} idle connections: {took:.3f}s")
        assert took < 2.0
        assert "agentscope_agent_oom_kills" in body
        assert monitor.poll() is None
    finally:
        for s in idle:
            s.close()
        monitor.terminate()
        try:
            monitor.wait(30)
        except subprocess.TimeoutExpired:
            monitor.kill()
            monitor.wait()
        if monitor.stderr is not None:
            monitor.stderr.close()


def _main_pid(unit: str, *, user: bool) -> int:
    out = subprocess.run(
        ["systemctl", *(["--user"] if user else []), "show", "-p", "MainPID", "--value", unit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.strip())


async def test_adopt_refuses_what_is_never_an_agent(fleet: AsyncFleet) -> None:
    # #31: PID 1, an ancestor of the manager (it would move into the agent's
    # scope with it), the main process of a service of this manager and of the
    # system's are refused with the reason, before anything is created.
    user = MANAGER == "user"
    service = f"agentscope-svc-{uuid.uuid4().hex[:6]}"
    run = ["systemd-run", *(["--user"] if user else []), "--quiet", f"--unit={service}"]
    subprocess.run(
        [*run, "sleep", "600"],
        check=True,
        capture_output=True,
    )
    try:
        own_main = _main_pid(f"{service}.service", user=user)
        journald = _main_pid("systemd-journald.service", user=False)
        assert own_main > 1
        assert journald > 1
        cases = {
            1: "PID 1",
            os.getppid(): "ancestor of this process",
            own_main: f"main process of {service}.service",
            journald: "systemd-journald.service" if not user else "not your process",
        }
        before = _agent_scopes()
        for pid, why in cases.items():
            with pytest.raises(agentscope_systemd.InvalidConfig, match=why) as info:
                await fleet.adopt(pid, f"never-{pid}")
            assert "Traceback" not in str(info.value)
        assert _agent_scopes() == before
        assert await fleet.agents(all=True) == []
        assert [e for e in await fleet.events() if e.kind == "adopted"] == []
        assert _main_pid(f"{service}.service", user=user) == own_main  # still its service's
    finally:
        subprocess.run(
            ["systemctl", *(["--user"] if user else []), "stop", f"{service}.service"],
            check=False,
            capture_output=True,
        )


def _agent_scopes() -> set[str]:
    out = subprocess.run(
        ["systemctl", *(["--user"] if MANAGER == "user" else []), "list-units", "--plain",
         "--no-legend", "--all", "agentscope-*.scope"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # fmt: skip
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(MANAGER != "system", reason="a system install is root's")
def test_install_system_refuses_to_run_another_users_files() -> None:
    # #31 item 6 on a real system: `sudo ~agent/venv/bin/agentscope install
    # --system` would make root's monitor run a file the user agent can change.
    import pwd

    from agentscope_systemd import install
    from agentscope_systemd._install import plan_install

    home = Path(pwd.getpwnam(OTHER_USER).pw_dir)
    venv = home / f"venv-{uuid.uuid4().hex[:6]}" / "bin"
    subprocess.run(["runuser", "-u", OTHER_USER, "--", "mkdir", "-p", str(venv)], check=True)
    try:
        script = venv / "agentscope"
        subprocess.run(
            [
                "runuser",
                "-u",
                OTHER_USER,
                "--",
                "cp",
                shutil.which("agentscope") or CLI,
                str(script),
            ],
            check=True,
        )
        plan = plan_install(
            "system", systemd_version=None, linger=False, fleets=[], agentscope_exec=str(script)
        )
        with pytest.raises(install.UntrustedExecutable, match=f"{home} is owned by uid") as info:
            install.apply_plan(plan, dry_run=True)
        print(info.value)
        # The same command line from the test image's root-owned venv is fine.
        done = subprocess.run(
            [CLI, "--json", "install", "--system", "--dry-run"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    finally:
        shutil.rmtree(venv.parent, ignore_errors=True)
