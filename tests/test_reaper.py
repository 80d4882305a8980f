"""Leftovers (_fleet/_reaper.py): an ended agent's processes linger, then are reaped.

Over the fake systemd (tests/fakesystemd.py) with ``follow_forks``: a
process that an agent forks joins its scope, as the kernel does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_systemd import InvalidConfig
from agentscope_systemd._fleet._fleet import AsyncFleet
from agentscope_systemd._fleet._reaper import decide
from agentscope_systemd._registry._registry import AgentRecord, Registry
from tests.fakesystemd import FakeSystemd, end_children
from tests.test_fleet import make_fleet, stop_everything


def leaves_sleep_at(gate: Path) -> list[str]:
    """An agent whose sh starts a ``sleep`` that stays in its scope, then ends
    once a line comes through the FIFO ``gate`` (:func:`release_when_left`).

    The fake manager finds a forked child while its parent lives: on a
    loaded host its 10 ms tick can miss a 0.2 s window (then the agent ends
    plainly "exited"), and dash execs its last command, so a ``sleep`` in
    the scope may be the main process itself.
    """
    os.mkfifo(gate)
    return ["sh", "-c", 'sleep 600 & read -r _ < "$0"', str(gate)]


async def release_when_left(bus: FakeSystemd, agent: Any, gate: Path) -> None:
    """Let ``agent``'s sh end once its scope holds the leftover ``sleep``."""
    await wait_for(lambda: "sleep" in comms(bus, agent.unit))
    fds: list[int] = []

    def reader_waits() -> bool:  # ENXIO until sh's read has the FIFO open
        with contextlib.suppress(OSError):
            fds.append(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
        return bool(fds)

    await wait_for(reader_waits)
    os.write(fds[0], b"go\n")
    os.close(fds[0])


@pytest.fixture(autouse=True)
def _kill_leftovers() -> Iterator[None]:
    yield
    end_children()


@pytest.fixture
def bus(tmp_path: Path) -> FakeSystemd:
    bus = FakeSystemd(tmp_path / "cgroup")
    bus.follow_forks = True
    return bus


@pytest.fixture
async def fleet(tmp_path: Path, bus: FakeSystemd) -> AsyncIterator[AsyncFleet]:
    async with make_fleet(tmp_path, bus) as f:
        yield f
    await stop_everything(bus)


async def wait_for(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def comms(bus: FakeSystemd, unit: str) -> list[str]:
    out = []
    for pid in bus.scope_pids(unit):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return out


async def test_leftovers_linger_then_are_reaped_with_one_event(
    fleet: AsyncFleet, bus: FakeSystemd, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    agent = await fleet.launch("a", leaves_sleep_at(gate), reap_after=1.0)
    await release_when_left(bus, agent, gate)
    assert await agent.wait() == 0
    await wait_for(lambda: agent.state == "lingering")
    (listed,) = await fleet.agents()
    assert (listed.state, listed.leftovers) == ("lingering", 1)  # not a clean "exited"
    assert listed.to_dict()["reap_after"] == 1.0
    assert agent.unit in bus.units
    await wait_for(lambda: agent.unit not in bus.units)  # the grace is over
    await asyncio.gather(*list(fleet._tasks))
    (gone,) = await fleet.agents(all=True)
    assert (gone.state, gone.returncode) == ("exited", 0)
    reaped = await fleet.events(kind="reaped")
    assert len(reaped) == 1
    (proc,) = reaped[0].detail["processes"]
    assert proc["comm"] == "sleep"
    assert proc["rss"] > 0
    assert [e.kind for e in await fleet.events(agent="a")][-3:] == [
        "lingering",
        "reaped",
        "exited",
    ]


async def test_keep_keeps_the_leftovers(
    fleet: AsyncFleet, bus: FakeSystemd, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    agent = await fleet.launch("k", leaves_sleep_at(gate), reap_after="keep")
    await release_when_left(bus, agent, gate)
    await agent.wait()
    await wait_for(lambda: agent.state == "lingering")
    await asyncio.sleep(1.0)  # time a reaper would have taken: none comes
    (listed,) = await fleet.agents()
    assert (listed.state, listed.leftovers, listed.reap_after) == ("lingering", 1, None)
    assert comms(bus, agent.unit) == ["sleep"]
    assert await fleet.events(kind="reaped") == []


async def test_an_agent_without_leftovers_exits_plainly(fleet: AsyncFleet) -> None:
    agent = await fleet.launch("p", ["true"], reap_after=0)
    assert await agent.wait() == 0
    await asyncio.gather(*list(fleet._tasks))
    assert agent.state == "exited"
    assert await fleet.events(kind="lingering") == []


async def test_the_next_open_reaps_what_a_closed_fleet_left(
    tmp_path: Path, bus: FakeSystemd
) -> None:
    # The setting lives in the registry row: a new manager honours it.
    async with make_fleet(tmp_path, bus) as first:
        agent = await first.launch("o", leaves_sleep_at(tmp_path / "gate"), reap_after=0.5)
        await release_when_left(bus, agent, tmp_path / "gate")
    unit = agent.unit
    await bus.connect()  # the manager runs on when the fleet's connection closes
    await wait_for(lambda: comms(bus, unit) == ["sleep"])
    await asyncio.sleep(0.6)
    # Two managers open at once: one reaps, one event.
    async with make_fleet(tmp_path, bus) as a, make_fleet(tmp_path, bus) as b:
        await wait_for(lambda: unit not in bus.units)
        await asyncio.gather(*list(a._tasks), *list(b._tasks))
        assert len(await a.events(kind="reaped")) == 1
        (row,) = await a.agents(all=True)
        assert row.state == "exited"  # its main process was seen ending: not lost
    await stop_everything(bus)


async def test_a_monitor_tick_reaps_an_adopted_agents_leftovers(
    fleet: AsyncFleet, bus: FakeSystemd, tmp_path: Path
) -> None:
    proc = subprocess.Popen(leaves_sleep_at(tmp_path / "gate"))
    agent = await fleet.adopt(proc.pid, "ad", reap_after=0)
    await release_when_left(bus, agent, tmp_path / "gate")
    monitor = fleet.monitor(
        interval=0.2, cgroup_root=bus.cgroup_root, kmsg=None, psi_triggers=False
    )
    async with monitor:
        proc.wait()  # no pidfd watches an adopted agent: the tick must see it
        await wait_for(lambda: agent.unit not in bus.units)
    await asyncio.gather(*list(fleet._tasks))
    (reaped,) = await fleet.events(kind="reaped")
    assert [p["comm"] for p in reaped.detail["processes"]] == ["sleep"]


def test_reap_after_is_checked_before_anything(tmp_path: Path) -> None:
    async def go() -> None:
        bus = FakeSystemd(tmp_path / "cgroup")
        async with make_fleet(tmp_path, bus) as fleet:
            for bad in (-1, "soon", float("nan"), True, 8 * 86400):
                with pytest.raises(InvalidConfig, match="reap_after"):
                    await fleet.launch("x", ["true"], reap_after=bad)  # type: ignore[arg-type]
        assert not [c for c in bus.calls if c.member == "StartTransientUnit"]
        await stop_everything(bus)

    asyncio.run(go())


def record(**kw: object) -> AgentRecord:
    base: dict[str, object] = {
        "id": 1,
        "fleet": "f",
        "name": "a",
        "unit": "u",
        "pid": 10,
        "start_time": 5,
        "argv": (),
        "cwd": "/",
        "created": 0.0,
        "state": "running",
        "exit_status": None,
        "exited": None,
        "oom_kills": 0,
        "memory_current": None,
        "memory_peak": None,
    }
    base.update(kw)
    return AgentRecord(**base)  # type: ignore[arg-type]


def test_the_rule() -> None:
    rec = record()
    assert decide(rec, main_alive=True, leftovers=3, now=100) == "running"
    assert decide(rec, main_alive=False, leftovers=0, now=100) == "none"
    assert decide(rec, main_alive=False, leftovers=2, now=100) == "linger"
    lingering = record(lingering=95.0, reap_after=10.0)
    assert decide(lingering, main_alive=False, leftovers=2, now=100) == "wait"
    assert decide(lingering, main_alive=False, leftovers=2, now=105) == "reap"
    assert (
        decide(record(lingering=1.0, reap_after=None), main_alive=False, leftovers=1, now=9e9)
        == "keep"
    )
    assert decide(record(state="starting"), main_alive=False, leftovers=1, now=1) == "none"
    assert decide(record(state="exited"), main_alive=False, leftovers=1, now=1) == "none"
    stopping = record(state="stopping", lingering=1.0)  # claimed: its reaper stops it
    assert decide(stopping, main_alive=False, leftovers=1, now=100) == "none"


def test_claim_reap_is_won_once(tmp_path: Path) -> None:
    with Registry(tmp_path / "r.db") as reg:
        reg.record_launch("f", "a", "u", 1, 1, [], "/", "running")
        assert not reg.claim_reap("u", detail={})  # not lingering: nothing to reap
        reg.note_lingering("u", 3, detail={"leftovers": 1})
        again = reg.note_lingering("u", 4, detail={})
        assert again.exit_status == 3  # the first sighting stays
        assert reg.claim_reap("u", detail={"count": 1})
        assert not reg.claim_reap("u", detail={"count": 1})
        kinds = [e.kind for e in reg.events("f")]
        assert kinds == ["lingering", "reaped"]


def test_reap_after_survives_in_the_row(tmp_path: Path) -> None:
    with Registry(tmp_path / "r.db") as reg:
        assert reg.record_launch("f", "a", "ua", 1, 1, [], "/", reap_after=None).reap_after is None
        assert reg.record_launch("f", "b", "ub", 1, 1, [], "/", reap_after=2.5).reap_after == 2.5
        assert reg.record_launch("f", "c", "uc", 1, 1, [], "/").reap_after == 10.0


# -- graces by the monotonic clock (#31 item 2) ------------------------------------------


@pytest.mark.parametrize("jump", [40 * 86400.0, -40 * 86400.0])
async def test_a_wall_clock_jump_neither_hastens_nor_stalls_a_reap(
    fleet: AsyncFleet,
    bus: FakeSystemd,
    monkeypatch: pytest.MonkeyPatch,
    jump: float,
    tmp_path: Path,
) -> None:
    from agentscope_systemd._fleet import _reaper

    grace = 1.5
    agent = await fleet.launch("j", leaves_sleep_at(tmp_path / "gate"), reap_after=grace)
    await release_when_left(bus, agent, tmp_path / "gate")
    await wait_for(lambda: agent.state == "lingering")
    started = time.monotonic()
    monkeypatch.setattr(_reaper, "_now", lambda: time.time() + jump)
    await fleet._reaper.sweep()  # a tick right after the jump: the grace is not over
    assert agent.unit in bus.units
    await wait_for(lambda: agent.unit not in bus.units, timeout=grace + 8)
    assert time.monotonic() - started >= grace - 0.5  # reaped on time, by the monotonic clock


def test_the_rule_takes_the_monotonic_lingering_time() -> None:
    lingering = record(lingering=95.0, reap_after=10.0)
    # The wall clock says 40 days; the monotonic clock says 2 s: wait.
    assert (
        decide(lingering, main_alive=False, leftovers=2, now=95 + 40 * 86400, lingered=2) == "wait"
    )
    assert decide(lingering, main_alive=False, leftovers=2, now=0, lingered=10) == "reap"
