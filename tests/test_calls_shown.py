"""Tool calls in what the fleet shows (#26): ``agents()``/``ls``, ``report``, their JSON."""

from __future__ import annotations

from pathlib import Path

from agentscope_systemd._kernel._cgroup import MemoryEvents
from agentscope_systemd._monitor._report import CallMemory, read_calls
from tests.fakefs import make_cgroup
from tests.fakesystemd import FakeSystemd, end_children
from tests.test_contract import validate
from tests.test_fleet import make_fleet, stop_everything


def test_a_scopes_running_calls_are_read_with_their_own_figures(tmp_path: Path) -> None:
    scope = make_cgroup(tmp_path, "s.slice/agentscope-f-a-1.scope", current=9 << 20, procs=[])
    make_cgroup(scope, "agent", current=1 << 20, procs=[10])
    make_cgroup(
        scope,
        "call-make-2",
        current=8 << 20,
        peak=12 << 20,
        events=MemoryEvents(0, 0, 0, 1, 1, None),
    )
    # A call that made sub-cgroups of its own: their processes are the call's.
    make_cgroup(scope, "call-make-2/cc", procs=[11, 12])
    make_cgroup(scope, "call-make-2/ld", procs=[13])
    make_cgroup(scope, "claude-code-bash", procs=[])
    assert read_calls(scope) == (CallMemory("call-make-2", 8 << 20, 12 << 20, 3, 1),)
    assert read_calls(tmp_path / "gone") == ()


async def test_agents_and_their_report_show_their_running_calls(tmp_path: Path) -> None:
    bus = FakeSystemd(tmp_path / "cgroup")
    async with make_fleet(tmp_path, bus) as fleet:
        agent = await fleet.launch("a", ["sleep", "30"])
        scope = bus.units[agent.unit].cgroup
        (listed,) = await fleet.agents()
        assert listed.calls == 0
        make_cgroup(scope, "call-test-1", current=4 << 20, procs=[])
        make_cgroup(scope, "call-lint-1", current=1 << 20, procs=[])
        (listed,) = await fleet.agents()
        assert listed.calls == 2
        validate({"schema": "agentscope.agent/1", **listed.to_dict()})
        report = await fleet.report(top=0)
        (memory,) = report.agents
        assert [c.call for c in memory.calls] == ["call-lint-1", "call-test-1"]
        assert memory.calls[1].memory_current == 4 << 20
        validate({"schema": "agentscope.report/1", **report.to_dict()})
        await stop_everything(bus)
    end_children()
