"""Hostile local users against a real bus and a real monitor (#16).

A forged ``JobRemoved`` sent by another local user on the system bus, and a
flood of idle connections to the monitor's HTTP face while an agent is
OOM-killed. Lean: a few seconds each.
"""

from __future__ import annotations

import asyncio
import resource
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest
from conftest import GROW, MANAGER

from agentscope import AsyncFleet
from agentscope._bus import SD_MANAGER, SD_PATH, SystemdBus

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
