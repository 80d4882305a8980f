"""The escape audit against real systemd: an agent's ``systemd-run --scope``.

One agent runs ``systemd-run --scope sleep 600`` (``--user`` under the user
manager): the ``sleep`` lives in a scope of its own outside the agents
slice. A monitor reports it once, the report counts it under its agent, systemd
refuses ``AttachProcessesToUnit`` for an agent's scope that is not delegated,
and a second monitor with ``reclaim_escaped`` moves it back all the same
(its /proc/PID/cgroup is the agent's scope again, its ``agent`` leaf where
the scope is delegated: #26, docs/calls.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from conftest import MANAGER
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from agentscope_systemd import AsyncFleet, Escaped, Monitor
from agentscope_systemd._monitor._escape import Escapee, Mover, find_escapes
from agentscope_systemd._monitor._monitor import ESCAPE_AUDIT_EVERY

CGROUP = Path("/sys/fs/cgroup")


async def _escapes(monitor: Monitor, timeout: float) -> list[Escaped]:
    """The Escaped events that arrive within ``timeout`` seconds (the others skipped)."""
    found: list[Escaped] = []
    deadline = time.monotonic() + timeout
    it = monitor.__aiter__()
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = await asyncio.wait_for(it.__anext__(), left)
        except TimeoutError:
            break
        if isinstance(event, Escaped):
            found.append(event)
    return found


async def _first_escape(monitor: Monitor, timeout: float) -> Escaped:
    deadline = time.monotonic() + timeout
    it = monitor.__aiter__()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no escaped event within {timeout}s")
        event = await asyncio.wait_for(it.__anext__(), left)
        if isinstance(event, Escaped):
            return event


def _cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"no v2 line in /proc/{pid}/cgroup")


async def test_systemd_run_scope_is_reported_once_and_moved_back(
    fleet: AsyncFleet, raw_bus: MessageBus
) -> None:
    unit = f"esc-{uuid.uuid4().hex[:8]}"
    user = "--user " if MANAGER == "user" else ""
    script = f"systemd-run {user}--scope --quiet --unit={unit} sleep 600 & wait"
    try:
        async with fleet.monitor(interval=0.5) as watch:
            agent = await fleet.launch(
                "esc", ["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            event = await _first_escape(watch, 60)
            assert (event.agent, event.unit, event.comm) == ("esc", agent.unit, "sleep")
            assert event.to_unit == f"{unit}.scope"
            assert event.reclaimed is None
            # It is the sleep systemd-run became: the agent's child, in the new scope.
            stat = Path(f"/proc/{event.pid}/stat").read_bytes()
            assert int(stat.rpartition(b")")[2].split()[1]) == agent.pid
            assert _cgroup(event.pid) == event.cgroup
            assert event.cgroup.endswith(f"/{unit}.scope")
            # Once: the audits that follow find it again and say nothing.
            assert await _escapes(watch, ESCAPE_AUDIT_EVERY + 2) == []
            report = await fleet.report(top=0)
            (mine,) = [a for a in report.agents if a.agent == "esc"]
            assert (mine.escaped, mine.processes) == (1, 1)
        # A delegated scope (#26) holds its agent in its "agent" leaf, where a
        # reclaimed process goes too; its root may hold no process.
        leaf = "/agent" if _cgroup(agent.pid).endswith(f"/{agent.unit}/agent") else ""
        if not leaf:
            # systemd itself will not move it back into a scope that is not delegated.
            reply = await raw_bus.call(
                Message(
                    destination="org.freedesktop.systemd1",
                    path="/org/freedesktop/systemd1",
                    interface="org.freedesktop.systemd1.Manager",
                    member="AttachProcessesToUnit",
                    signature="ssau",
                    body=[agent.unit, "", [event.pid]],
                )
            )
            assert reply is not None
            assert reply.message_type == MessageType.ERROR
            assert "non-delegated" in reply.body[0]
        slice_cg = str(await fleet.slice_cgroup()).removeprefix(str(CGROUP))
        async with fleet.monitor(interval=0.5, reclaim_escaped=True) as reclaimer:
            moved = await _first_escape(reclaimer, 30)
            assert moved.pid == event.pid
            assert moved.reclaimed is True, moved.reclaim_error
            assert _cgroup(event.pid) == f"{slice_cg}/{agent.unit}{leaf}"
    finally:
        subprocess.run(
            ["systemctl", *(["--user"] if MANAGER == "user" else []), "stop", f"{unit}.scope"],
            check=False,
            capture_output=True,
        )


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat.rpartition(b")")[2].split()[1])


async def test_an_escapee_is_moved_only_while_it_is_that_descendant(fleet: AsyncFleet) -> None:
    # #31: the escapee's identity is checked again when it is moved. A
    # descendant found by an audit is moved back; the same pid with another
    # start time (a reused pid) and an escapee whose parent chain no longer
    # leads into the agent's scope (its parent died, it was reparented) are
    # left where they are, with the reason: never written into cgroup.procs.
    units = [f"esc-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    user = "--user " if MANAGER == "user" else ""
    # The middle sh (`; true` keeps it from exec'ing) stays the sleep's parent
    # until it is killed; the sleep then belongs to the subreaper.
    inner = [f"systemd-run {user}--scope --quiet --unit={u} sleep 600; true" for u in units]
    script = " & ".join(f"sh -c '{s}'" for s in inner) + " & wait"
    try:
        agent = await fleet.launch(
            "esc2", ["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        slice_path = await fleet.slice_cgroup()
        found: tuple[Escapee, ...] = ()

        def both_found() -> bool:
            nonlocal found
            # A delegated scope holds its agent in the `agent` leaf (#26).
            scope = slice_path / agent.unit
            leaf = scope / "agent" if (scope / "agent").is_dir() else scope
            procs = (leaf / "cgroup.procs").read_text().split()
            found = find_escapes(slice_path, {agent.unit: [int(p) for p in procs]})
            return len(found) == 2

        assert _wait(both_found, 60), found
        stays, orphan = sorted(found, key=lambda e: e.to_unit or "")
        assert {stays.to_unit, orphan.to_unit} == {f"{u}.scope" for u in units}
        middle = _ppid(orphan.pid)
        os.kill(middle, signal.SIGKILL)
        assert _wait(lambda: _ppid(orphan.pid) != middle, 10)
        reused = dataclasses.replace(stays, start_time=stays.start_time + 1)
        outcome = await Mover(fleet._manager.attach, slice_path).reclaim([reused, orphan])
        assert outcome[stays.pid] is not None
        assert "exited" in outcome[stays.pid]
        assert outcome[orphan.pid] is not None
        assert "no longer a descendant" in outcome[orphan.pid]
        assert _cgroup(stays.pid) == stays.cgroup
        assert _cgroup(orphan.pid) == orphan.cgroup
        # The real one, still the agent's descendant, is moved back.
        outcome = await Mover(fleet._manager.attach, slice_path).reclaim([stays])
        assert outcome == {stays.pid: None}
        assert _cgroup(stays.pid).endswith((f"/{agent.unit}", f"/{agent.unit}/agent"))
    finally:
        for u in units:
            subprocess.run(
                ["systemctl", *(["--user"] if MANAGER == "user" else []), "stop", f"{u}.scope"],
                check=False,
                capture_output=True,
            )
