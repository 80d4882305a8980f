"""An agent's lifecycle on the real manager: leftovers reaped, resource controls in force.

Lean: a few seconds each (short graces, cheap processes: sh and sleep).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from conftest import MANAGER

from agentscope_systemd import AsyncFleet
from agentscope_systemd._fleet import _tmux
from agentscope_systemd._kernel._cgroup import read_subtree_procs

CLI = shutil.which("agentscope") or "agentscope"
# Its main process (sh) ends at once; the sleep it started stays in its scope.
LEAVES_SLEEP = ["sh", "-c", "sleep 600 >/dev/null 2>&1 &"]
# Agents' output never reaches the test's own pipes (FIELD-NOTES: a reader waits for them).
QUIET = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


async def _until(cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and await cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout} s")


def _procs(scope: Path) -> list[str]:
    """The comms of the processes in a scope's cgroup and below it ([] once it is gone)."""
    procs = read_subtree_procs(scope)  # a delegated scope's are in its leaves (#26)
    if procs is None:
        return []
    pids = procs.decode().split()
    comms = []
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            comms.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return comms


async def test_leftovers_are_reaped_after_the_grace_with_one_event(fleet: AsyncFleet) -> None:
    agent = await fleet.launch("mcp", LEAVES_SLEEP, reap_after=2, **QUIET)
    scope = await fleet.slice_cgroup() / agent.unit
    assert await agent.wait() == 0
    (listed,) = [a for a in await fleet.agents() if a.name == "mcp"]
    # Ended, its scope still holding the sleep: never a clean "exited".
    assert (listed.state, listed.leftovers) == ("lingering", 1)
    assert _procs(scope) == ["sleep"]
    started = time.monotonic()

    async def emptied() -> bool:
        return not scope.exists()

    await _until(emptied)
    assert time.monotonic() - started > 1.0  # not before its grace
    (reaped,) = await fleet.events(kind="reaped", agent="mcp")
    assert [p["comm"] for p in reaped.detail["processes"]] == ["sleep"]
    assert reaped.detail["processes"][0]["rss"] > 0
    (row,) = [a for a in await fleet.agents(all=True) if a.name == "mcp"]
    assert (row.state, row.returncode) == ("exited", 0)


async def test_keep_keeps_the_leftovers(fleet: AsyncFleet) -> None:
    agent = await fleet.launch("kept", LEAVES_SLEEP, reap_after="keep", **QUIET)
    scope = await fleet.slice_cgroup() / agent.unit
    await agent.wait()
    await asyncio.sleep(3)
    (listed,) = [a for a in await fleet.agents() if a.name == "kept"]
    assert (listed.state, listed.leftovers, listed.reap_after) == ("lingering", 1, None)
    assert _procs(scope) == ["sleep"]
    assert await fleet.events(kind="reaped") == []
    await fleet.stop("kept", timeout=5)
    assert not scope.exists()


async def test_an_execd_agents_leftovers_are_reaped_by_the_next_fleet(
    fleet: AsyncFleet,
) -> None:
    # No fleet watches an exec'd command: the setting travels in the spool
    # entry, and the fleet that lists it next applies it.
    name = f"x{uuid.uuid4().hex[:6]}"
    opts = ["-q", "-p", "AllowedCPUs=0-63", "--", *LEAVES_SLEEP]
    done = subprocess.run(
        [CLI, "--fleet", fleet.name, "exec", name, "--reap-after", "1", *opts],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # Read back after the start job on exec's own D-Bus client too, and said.
    assert "AllowedCPUs=0-63" in done.stderr, done.stderr

    async def reaped() -> bool:
        await fleet.agents()  # sees the ended sh, then its grace runs out
        return bool(await fleet.events(kind="reaped", agent=name))

    await _until(reaped)
    (event,) = await fleet.events(kind="reaped", agent=name)
    assert [p["comm"] for p in event.detail["processes"]] == ["sleep"]
    # The event is recorded as the reap is claimed; the stop job follows it.
    scope = await fleet.slice_cgroup() / event.detail["unit"]

    async def emptied() -> bool:
        return not scope.exists()

    await _until(emptied, 15)


async def test_tasks_max_stops_a_fork_loop_while_a_sibling_lives(fleet: AsyncFleet) -> None:
    sibling = await fleet.launch("sibling", ["sleep", "600"], **QUIET)
    bomb = await fleet.launch(
        "forks",
        ["sh", "-c", "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done; wait"],
        tasks_max=32,
        reap_after="keep",  # its scope stays to be read when the shell gives up
        **QUIET,
    )
    assert bomb.property_issues == []
    scope = await fleet.slice_cgroup() / bomb.unit
    assert (scope / "pids.max").read_text().strip() == "32"

    async def refused() -> bool:
        # Which cgroup's pids.events counts a refused fork depends on the
        # kernel: on 6.1 (sd247, bookworm) the scope's own counter stayed 0
        # while its `agent` leaf (#26: a delegated scope) forked, on 6.12 the
        # scope's counts it. The scope's subtree holds it either way.
        total = 0
        for events_file in [scope / "pids.events", *scope.glob("*/pids.events")]:
            events = events_file.read_text().split()
            total += int(events[events.index("max") + 1])
        return total > 0

    await _until(refused)  # the kernel refused forks past 32
    assert int((scope / "pids.current").read_text()) <= 32
    assert sibling.alive()
    await fleet.stop("forks", timeout=5)
    assert sibling.alive()


async def test_a_property_not_in_force_is_reported(fleet: AsyncFleet) -> None:
    # More CPUs than the VM has: systemd keeps the mask, the kernel cannot
    # give it (or, under a user manager, has no cpuset controller for it).
    agent = await fleet.launch(
        "cpus",
        ["sleep", "600"],
        properties={"AllowedCPUs": "0-63"},
        io_weight=200,
        **QUIET,
    )
    assert (os.cpu_count() or 1) < 64
    issues = {i["property"]: i for i in agent.property_issues}
    assert "AllowedCPUs" in issues, agent.property_issues
    if MANAGER == "user":  # user@.service never delegates io
        assert issues["IOWeight"]["reason"] == "not_enforced"
    (event,) = await fleet.events(kind="properties_not_applied", agent="cpus")
    assert event.detail["issues"] == agent.property_issues


async def test_a_tmux_agents_leftovers_are_reaped(fleet: AsyncFleet) -> None:
    socket = _tmux.socket_dir(_tmux.runtime_dir(MANAGER), fleet.name) / "socket"
    try:
        # A daemon (setsid) that has left the pane's session before its agent
        # ends, as MCP servers do: a job still in it dies of the pane's hangup.
        daemon = ["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 & sleep 1"]
        await fleet.launch("tm", daemon, terminal="tmux", reap_after=1)

        async def reaped() -> bool:
            await fleet.agents()  # its window closed with sh: the sleep lingers, then goes
            return bool(await fleet.events(kind="reaped", agent="tm"))

        try:
            await _until(reaped)
        except AssertionError:
            events = [(e.kind, e.detail) for e in await fleet.events()]
            states = [(a.name, a.state, a.leftovers) for a in await fleet.agents(all=True)]
            sleeps = subprocess.run(["pgrep", "-a", "sleep"], capture_output=True, text=True)
            where = {
                pid: Path(f"/proc/{pid}/cgroup").read_text().strip()
                for pid in (line.split()[0] for line in sleeps.stdout.splitlines())
                if Path(f"/proc/{pid}").exists()
            }
            raise AssertionError(f"events {events}; agents {states}; sleeps {where}") from None
        (event,) = await fleet.events(kind="reaped", agent="tm")
        assert [p["comm"] for p in event.detail["processes"]] == ["sleep"]
        assert await fleet.events(kind="window_closed", agent="tm") == []
    finally:
        subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)
        user = ["--user"] if MANAGER == "user" else []
        subprocess.run(
            ["systemctl", *user, "stop", _tmux.tmux_unit(fleet.name)], capture_output=True
        )
