"""The registry against real systemd: agents outlive their manager, nothing lingers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import own_children

import agentscope_systemd
from agentscope_systemd import AsyncFleet

LAUNCHER = textwrap.dedent(
    """
    import asyncio, json, subprocess, sys, time
    import agentscope_systemd

    async def main(fleet, db, n, prefix):
        async with agentscope_systemd.AsyncFleet(fleet, registry=db) as f:
            agents = await asyncio.gather(*(
                f.launch(f"{prefix}{i}", ["sleep", "600"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for i in range(n)))
            print(json.dumps({a.name: a.pid for a in agents}), flush=True)
            if sys.argv[5] == "hang":
                await asyncio.sleep(600)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    """
)


def _launcher(fleet: str, db: Path, n: int, prefix: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, fleet, str(db), str(n), prefix, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or during, the read
        return False


async def _stop_all(fleet: AsyncFleet) -> None:
    for agent in await fleet.agents():
        await fleet.stop(agent.name, timeout=5)


async def test_agents_survive_sigkilled_manager_and_are_adopted(tmp_path: Path) -> None:
    name, db = f"r{uuid.uuid4().hex[:6]}", tmp_path / "agentscope.db"
    proc = _launcher(name, db, 10, "a", "hang")
    assert proc.stdout is not None
    pids = json.loads(proc.stdout.readline())
    assert len(pids) == 10
    proc.send_signal(signal.SIGKILL)
    proc.communicate()  # reaps it and closes its pipes
    assert all(_alive(p) for p in pids.values())

    async with AsyncFleet(name, registry=db) as fleet:
        agents = {a.name: a for a in await fleet.agents()}
        assert {n: a.pid for n, a in agents.items()} == pids
        assert {a.state for a in agents.values()} == {"running"}
        assert all(a.memory_current for a in agents.values())
        # Adopted agents are controllable like launched ones.
        await fleet.stop("a0", timeout=5)
        assert not _alive(pids["a0"])
        left = {a.name for a in await fleet.agents()}
        assert left == set(pids) - {"a0"}
        everything = {a.name: a.state for a in await fleet.agents(all=True)}
        assert everything["a0"] == "exited"
        await _stop_all(fleet)


async def test_policy_stop_gives_a_clean_slate(tmp_path: Path) -> None:
    name, db = f"r{uuid.uuid4().hex[:6]}", tmp_path / "agentscope.db"
    proc = _launcher(name, db, 10, "b", "exit")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    pids = json.loads(out)
    assert all(_alive(p) for p in pids.values())  # they outlived their launcher
    async with AsyncFleet(name, registry=db, policy="stop") as fleet:
        assert await fleet.agents() == []
        assert not any(_alive(p) for p in pids.values())
        states = {a.state for a in await fleet.agents(all=True)}
        assert states == {"exited"}


async def test_reused_pid_is_never_adopted(tmp_path: Path) -> None:
    name, db = f"r{uuid.uuid4().hex[:6]}", tmp_path / "agentscope.db"
    proc = _launcher(name, db, 1, "c", "exit")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    pid = json.loads(out)["c0"]
    # Same pid in the same scope, another start time: what a reused pid looks like.
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE agents SET start_time = start_time + 1 WHERE pid = ?", (pid,))
    conn.close()
    async with AsyncFleet(name, registry=db) as fleet:
        everything = {a.name: a for a in await fleet.agents(all=True)}
        assert everything["c0"].state == "lost"
        assert everything["c0"].name not in {a.name for a in await fleet.agents()}
        events = [e.kind for e in await fleet.events(agent="c0")]
        assert "lost" in events
    os.kill(pid, signal.SIGKILL)


@pytest.mark.heavy("scale")
async def test_four_processes_launch_25_each(tmp_path: Path) -> None:
    name, db = f"r{uuid.uuid4().hex[:6]}", tmp_path / "agentscope.db"
    procs = [_launcher(name, db, 25, f"p{k}-", "exit") for k in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert "database is locked" not in err
    pids = {}
    for out, _ in results:
        pids.update(json.loads(out))
    assert len(pids) == 100
    async with AsyncFleet(name, registry=db) as fleet:
        agents = await fleet.agents()
        assert len(agents) == 100
        assert len({a.unit for a in agents}) == 100
        assert {a.name: a.pid for a in agents} == pids
        await asyncio.gather(*(fleet.stop(a.name, timeout=5) for a in agents))


async def test_registry_refuses_a_name_running_elsewhere_and_frees_a_stale_one(
    tmp_path: Path,
) -> None:
    # Two fleet objects share one registry, as two processes would: the second
    # knows the first's agents only from the registry's open rows.
    name, db = f"r{uuid.uuid4().hex[:6]}", tmp_path / "agentscope.db"
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
    async with AsyncFleet(name, registry=db) as one, AsyncFleet(name, registry=db) as two:
        first = await one.launch("dup", ["sleep", "600"], **quiet)
        before = own_children()
        assert str(first.pid) in before
        with pytest.raises(agentscope_systemd.AgentExists, match="already running"):
            await two.launch("dup", ["sleep", "600"], **quiet)
        assert own_children() == before  # the gated child was aborted and reaped
        assert [(a.name, a.unit) for a in await two.agents()] == [("dup", first.unit)]

        # An open row whose scope is gone (its launcher died unseen) is closed
        # as lost, and the launch goes ahead.
        gone = await one.launch("stale", ["true"], **quiet)
        assert await gone.wait() == 0
        await asyncio.gather(*one._tasks)  # the exit is recorded
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE agents SET state = 'running', exit_status = NULL, exited = NULL"
                " WHERE unit = ?",
                (gone.unit,),
            )
        conn.close()
        again = await two.launch("stale", ["sleep", "600"], **quiet)
        states = {a.unit: a.state for a in await two.agents(all=True)}
        assert states[gone.unit] == "lost"
        assert states[again.unit] == "running"

        # A command that exits at once: running is recorded before exited, always.
        for i in range(10):
            agent = await one.launch(f"quick{i}", ["true"], **quiet)
            assert await agent.wait() == 0
        await asyncio.gather(*one._tasks)
        for i in range(10):
            kinds = [e.kind for e in await one.events(agent=f"quick{i}")]
            assert kinds == ["launched", "exited"], (i, kinds)
        await one.stop("dup", timeout=5)
        await two.stop("stale", timeout=5)


async def test_adopt_leaves_a_launch_in_flight_elsewhere_alone(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # Another process is between recording its launch and starting its scope:
    # a starting row, young, whose child lives. adopt() must refuse the name,
    # not close that row as lost under the other launcher's feet.
    name, db = f"r{uuid.uuid4().hex[:6]}", tmp_path / "agentscope.db"
    async with AsyncFleet(name, registry=db) as fleet:
        stat = Path(f"/proc/{sleeper.pid}/stat").read_bytes()
        start = int(stat[stat.rindex(b")") + 2 :].split()[19])
        unit = f"agentscope-{name}-busy-000000.scope"
        await asyncio.to_thread(
            fleet._store.open_registry.record_launch,
            name, "busy", unit, sleeper.pid, start, ["sleep"], "/",
        )  # fmt: skip
        other = subprocess.Popen(["sleep", "600"])
        try:
            with pytest.raises(agentscope_systemd.AgentExists, match="already running"):
                await fleet.adopt(other.pid, "busy")
        finally:
            other.kill()
            other.wait()
        row = await asyncio.to_thread(fleet._store.open_registry.by_unit, unit)
        assert row is not None
        assert row.state == "starting"


async def test_corrupt_registry_names_file_and_fix(tmp_path: Path) -> None:
    db = tmp_path / "agentscope.db"
    db.write_bytes(b"this is not an sqlite database" * 100)
    with pytest.raises(agentscope_systemd.RegistryCorrupt) as info:
        async with AsyncFleet("corrupt", registry=db):
            pass
    assert str(db) in str(info.value)
    assert "mv " in str(info.value)


async def test_default_registry_path_and_modes() -> None:
    path = agentscope_systemd.default_registry_path("system" if os.geteuid() == 0 else "user")
    async with AsyncFleet(f"r{uuid.uuid4().hex[:6]}") as fleet:
        agent = await fleet.launch("x", ["sleep", "30"])
        assert fleet.registry_path == path
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
        kinds = [e.kind for e in await fleet.events()]
        assert kinds == ["launched"]
        await fleet.stop(agent.name)
        kinds = [e.kind for e in await fleet.events()]
        assert kinds[-2:] == ["exited", "stopped"]
        assert await fleet.gc(retention_seconds=0) >= 1  # every fleet shares the file
        assert await fleet.agents(all=True) == []
