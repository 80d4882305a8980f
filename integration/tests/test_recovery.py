"""OOM kills while no monitor ran, recorded once at the next open; victims named by the journal."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import MANAGER
from roothelper import as_root

from agentscope_systemd import AsyncFleet
from agentscope_systemd._registry._registry import EventRecord

CAP = 64 << 20
# A tool call over its agent's cap at once: tail keeps a "line" of /dev/zero
# (no newline ever comes) in memory, and is the largest process, so the victim.
HOG = "head -c 300M /dev/zero | tail"
NULL = subprocess.DEVNULL


async def _oom_events(name: str) -> list[EventRecord]:
    async with AsyncFleet(name) as fleet:
        return await fleet.events(kind="oom_kill")


async def _until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f}s")
        await asyncio.sleep(0.1)


def _comms(scope: Path) -> list[str]:
    """The names of the processes in ``scope`` and its sub-cgroups (a delegated
    scope keeps its agent in a leaf)."""
    comms = []
    for procs in scope.rglob("cgroup.procs"):
        try:
            pids = procs.read_text().split()
        except FileNotFoundError:
            continue
        for pid in pids:
            try:
                comms.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except (FileNotFoundError, ProcessLookupError):
                continue
    return comms


def _oom_kill(scope: Path) -> int:
    try:
        text = (scope / "memory.events").read_text()
    except FileNotFoundError:
        return 0
    return int(dict(line.split() for line in text.splitlines())["oom_kill"])


async def test_kills_while_no_monitor_ran_are_recorded_once_at_the_next_open() -> None:
    name = f"r{uuid.uuid4().hex[:6]}"
    async with AsyncFleet(name) as fleet:  # its first open: the watermark, nothing to recover
        slice_dir = await fleet.slice_cgroup()
        before = _oom_kill(slice_dir)  # hierarchical: every kill in any scope of the slice
        # The tool call runs at oom_score_adj 1000, the agent's shell at its 800,
        # as a harness would set them: sid's kernel, still over the cap while the
        # victim exits, also killed the shell at its exec (the scope then ended).
        live = await fleet.launch(
            "live",
            ["sh", "-c", f"(echo 1000 > /proc/self/oom_score_adj; {HOG}); exec sleep 600"],
            memory_max=CAP,
            stdout=NULL,
            stderr=NULL,
        )
        gone = await fleet.launch(
            "gone", ["sh", "-c", HOG], memory_max=CAP, stdout=NULL, stderr=NULL
        )
        # No monitor runs: live's tool call is killed and live goes on; gone's is
        # killed and gone ends, its scope (and its counter) with it.
        await asyncio.wait_for(gone.wait(), 120)
        await _until(lambda: _oom_kill(slice_dir / live.unit) >= 1, "kill in the live scope")
        # The counters settle once live's tool call is over (only its `sleep` is
        # left): sid's kernel killed the pipe's writer too, 50 ms after tail (CI).
        await _until(lambda: _comms(slice_dir / live.unit) == ["sleep"], "end of live's tool call")
        await _until(lambda: not (slice_dir / gone.unit).exists(), "end of the gone scope", 20)
        # What the kernel counted. Usually one kill per scope (tail, the largest);
        # on 6.x kernels the pipe's writer (head) is sometimes killed as well.
        in_live = _oom_kill(slice_dir / live.unit)
        in_slice = _oom_kill(slice_dir) - before
        # Other opens of the fleet (this one has no monitor), as later CLI calls are.
        try:
            first = await _oom_events(name)
            again = [await _oom_events(name) for _ in range(2)]
        finally:
            await fleet.stop("live", timeout=5)
    details = [e.detail for e in first]
    # Every kill the kernel counted, once: none lost, none twice.
    assert len(first) == in_slice > in_live >= 1, (in_slice, in_live, details)
    assert all(e.detail["recovered"] is True for e in first)
    assert again == [first, first]  # the same rows, nothing added by later opens
    of_live = [e for e in first if e.detail["unit"] == live.unit]
    rest = [e for e in first if e.detail["unit"] != live.unit]
    assert len(of_live) == in_live, details
    assert all(e.agent == "live" for e in of_live), details
    if MANAGER == "system":
        # Root reads /dev/kmsg: every victim named, the gone scope's kills too.
        assert {(e.agent, e.detail["unit"]) for e in rest} == {("gone", gone.unit)}, details
        assert all(e.detail["source"] == "kmsg" for e in first), details
        assert all(e.detail["comm"] in ("head", "tail") for e in of_live), details
        # gone's shell runs the pipe at the same oom_score_adj as its children:
        # sid's kernel, still over the cap while tail exits, killed it too (CI).
        assert all(e.detail["comm"] in ("head", "tail", "sh") for e in rest), details
        assert all(e.detail["rss_last_seen"] > 0 for e in first), details
    else:
        # Debian's defaults: the user reads neither /dev/kmsg nor the system journal.
        assert all(e.detail["source"] == "cgroup" for e in of_live), details
        # Counted in the slice, their scope gone: no agent to name.
        assert all(e.agent is None and e.detail["unit"] is None for e in rest), details


@pytest.mark.skipif(MANAGER != "user", reason="root's monitor reads /dev/kmsg")
def test_a_users_monitor_names_a_fast_victim_from_the_journal() -> None:
    doctor = subprocess.run(
        ["agentscope", "doctor", "--json"], capture_output=True, text=True, timeout=120
    )
    (check,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "oom_victims"]
    assert check["status"] == "warn", check
    assert "usermod -aG systemd-journal" in check["fix"], check
    # The doctor's fix, for this test only: Debian's defaults keep the user out.
    as_root("journal_reader", "add")
    try:
        out = as_root("journal_reader", "run", "journal_victim", timeout=240)
    finally:
        as_root("journal_reader", "remove")
    kills = [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]
    event = kills[-1]
    assert event["source"] == "journal", event
    assert event["comm"] == "tail", event
    assert isinstance(event["pid"], int), event
    assert event["rss_last_seen"] > 0, event
    assert event["recovered"] is False
    # The kernel may kill the pipe's writer or the agent's shell as well (sid,
    # under load): those kills are named too, by the kernel's line or the reaping.
    for other in kills[:-1]:
        assert other["source"] in ("journal", "reaped"), kills
        assert other["comm"] in ("head", "sh"), kills
        assert isinstance(other["pid"], int), kills
