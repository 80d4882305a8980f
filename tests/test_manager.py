"""The manager seam (_managers/_manager.py): the fleet over a manager that is not systemd.

:class:`MemoryManager` is a second, minimal implementation of
:class:`ScopeManager`: its scopes are sets of real processes kept in a dict,
with no bus and no cgroup tree. A fleet over it launches, lists and stops
agents with its registry as over systemd: what the containers issue's
process mode (#27) will build on, and the proof that the fleet asks its
manager through the interface only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentscope_systemd import AgentExists, AgentNotFound
from agentscope_systemd._errors import BusError
from agentscope_systemd._fleet._fleet import AsyncFleet
from agentscope_systemd._managers._manager import ListedScope, ScopeManager, ScopeRequest
from agentscope_systemd._names import describe, parse_description
from agentscope_systemd._registry._registry import Registry
from tests.fakesystemd import end_children

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _reap_agents() -> Iterator[None]:
    yield
    end_children()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class MemoryScope:
    unit: str
    description: str
    pids: list[int]
    frozen: bool = False


@dataclass
class MemoryManager:
    """A ScopeManager whose scopes live in a dict: processes, no cgroups, no bus."""

    fleet: str
    slice: str
    root: Path
    manager: Any = "user"
    mode: str = "memory"
    scopes: dict[str, MemoryScope] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)
    connected: bool = False

    @property
    def cgroup_root(self) -> Path:
        return self.root

    @property
    def version(self) -> str:
        return "memory 1"

    @property
    def address(self) -> str:
        return "memory:"

    async def connect(self) -> None:
        self.connected = True

    def close(self) -> None:
        self.connected = False

    async def slice_cgroup(self) -> Path:
        return self.expected_slice_cgroup()

    def expected_slice_cgroup(self) -> Path:
        return self.root / self.slice

    def _scope(self, member: str, unit: str) -> MemoryScope:
        self.asked.append((member, unit))
        scope = self.scopes.get(unit)
        if scope is None:
            raise BusError(member, "org.freedesktop.systemd1.NoSuchUnit", f"no unit {unit}")
        return scope

    async def start_scope(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        unit = scope.unit
        self.asked.append(("start", unit))
        if unit in self.scopes:
            raise BusError("start", "org.freedesktop.systemd1.UnitExists", f"{unit} exists")
        described = scope.description or describe(self.fleet, scope.name)
        self.scopes[unit] = MemoryScope(unit, described, [*scope.pids])
        return []

    async def stop_unit(self, unit: str, timeout: float) -> str:
        try:
            scope = self._scope("stop", unit)
        except BusError:
            return "done"
        await self.kill_unit(unit, signal.SIGTERM)
        for _ in range(int(timeout * 100)):
            if not any(_running(p) for p in scope.pids):
                break
            await asyncio.sleep(0.01)
        else:
            await self.kill_unit(unit, signal.SIGKILL)
        del self.scopes[unit]
        return "done"

    async def kill_unit(self, unit: str, sig: int) -> None:
        for pid in self._scope("kill", unit).pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    async def freeze_unit(self, unit: str) -> None:
        self._scope("freeze", unit).frozen = True

    async def thaw_unit(self, unit: str) -> None:
        self._scope("thaw", unit).frozen = False

    async def attach(self, unit: str, pids: Sequence[int], subcgroup: str = "") -> None:
        self._scope("attach", unit).pids.extend(pids)

    async def list_scopes(self, agent: str | None = None) -> list[ListedScope]:
        self.asked.append(("list", agent or ""))
        prefix = f"agentscope-{self.fleet}-{agent + '-' if agent else ''}"
        for unit in [u for u, s in self.scopes.items() if not any(map(_running, s.pids))]:
            del self.scopes[unit]  # a scope ends with its last process, as under systemd
        return [
            ListedScope(s.unit, parse_description(s.description), "active")
            for s in self.scopes.values()
            if s.unit.startswith(prefix)
        ]

    async def slice_limits(self) -> dict[str, int | None]:
        return {"MemoryHigh": None, "MemoryMax": None, "MemorySwapMax": None}

    async def clear_slice_limits(self) -> dict[str, int]:
        return {}

    def unit_of_cgroup(self, cgroup: str) -> str | None:
        return None

    async def main_pid(self, unit: str) -> int | None:
        return None

    def status_command(self, unit: str) -> str:
        return f"the memory manager's scopes ({unit})"


def _is_manager(m: ScopeManager) -> ScopeManager:
    return m  # `mypy --strict tests/test_manager.py` checks that MemoryManager is one


@pytest.fixture
def manager(tmp_path: Path) -> MemoryManager:
    return MemoryManager("t", "app-agentscope-agents.slice", tmp_path / "cgroup")


def make_fleet(tmp_path: Path, manager: MemoryManager) -> AsyncFleet:
    return AsyncFleet(
        "t",
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _manager=_is_manager(manager),
    )


async def test_a_fleet_over_another_manager_launches_lists_and_stops(
    tmp_path: Path, manager: MemoryManager
) -> None:
    async with make_fleet(tmp_path, manager) as fleet:
        assert manager.connected
        assert (fleet.manager, fleet.systemd_version, fleet.bus_address) == (
            "user",
            "memory 1",
            "memory:",
        )
        agent = await fleet.launch("a", ["sleep", "30"])
        assert manager.scopes[agent.unit].pids == [agent.pid]
        assert _running(agent.pid)
        listed = await fleet.agents()
        assert [(a.name, a.unit, a.state) for a in listed] == [("a", agent.unit, "running")]
        with pytest.raises(AgentExists):
            await fleet.launch("a", ["sleep", "30"])
        await fleet.freeze("a")
        assert manager.scopes[agent.unit].frozen
        await fleet.thaw("a")
        await fleet.stop("a", timeout=5)
        assert ("stop", agent.unit) in manager.asked
        assert agent.unit not in manager.scopes
        assert not _running(agent.pid)
        assert await fleet.agents() == []
        [gone] = await fleet.agents(all=True)
        assert (gone.name, gone.state, gone.returncode) == ("a", "exited", -signal.SIGTERM)
        with pytest.raises(AgentNotFound):
            await fleet.stop("a")
    assert not manager.connected
    with Registry(tmp_path / "registry.db") as reg:
        kinds = [e.kind for e in reg.events("t", agent="a")]
    assert kinds[0] == "launched"
    assert {"frozen", "thawed"} <= set(kinds)
    assert kinds[-1] == "stopped"


async def test_a_reopened_fleet_finds_its_agents_in_the_managers_listing(
    tmp_path: Path, manager: MemoryManager
) -> None:
    async with make_fleet(tmp_path, manager) as first:
        keep = await first.launch("keep", ["sleep", "30"])
        gone = await first.launch("gone", ["sleep", "30"])
    await manager.kill_unit(gone.unit, signal.SIGKILL)
    assert gone.popen is not None
    gone.popen.wait()
    async with make_fleet(tmp_path, manager) as second:
        # Its reconciliation asked the manager's listing, not systemd.
        assert ("list", "") in manager.asked
        assert [(a.name, a.pid) for a in await second.agents()] == [("keep", keep.pid)]
        states = {a.name: a.state for a in await second.agents(all=True)}
        assert states == {"keep": "running", "gone": "lost"}


def test_the_fleet_reaches_systemd_only_through_its_manager() -> None:
    # Only the constructor of AsyncFleet names systemd's implementation; the
    # fleet's parts hold the interface (a new mode is a new ScopeManager, not a
    # branch through the fleet).
    parts = [
        *sorted((ROOT / "agentscope_systemd" / "_fleet").glob("_fleet*.py")),
        ROOT / "agentscope_systemd/_fleet/_reaper.py",
    ]
    for path in parts:
        text = path.read_text()
        names = {"dbus_fast", "self._bus"}
        if path.name != "_fleet.py":
            names |= {"SystemdBus", "SystemdManager"}
        assert [n for n in names if n in text] == [], path.name
