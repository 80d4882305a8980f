"""Resource controls (agentscope_systemd/_managers/_scopeprops.py): checked, packed, read back."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agentscope_systemd import InvalidConfig
from agentscope_systemd._managers._scopeprops import INFINITY, build, compare, parse_reap_after
from tests.fakesystemd import FakeSystemd
from tests.test_fleet import _reap_agents, make_fleet, stop_everything  # noqa: F401 (autouse)


def test_keywords_and_properties_pack_as_systemd_takes_them() -> None:
    props = build(
        memory_max=1 << 30,
        tasks_max=32,
        cpu_weight=50,
        io_weight=200,
        properties={"CPUQuota": "150%", "AllowedCPUs": "0-2,9"},
    )
    assert props == {
        "MemoryMax": ("t", 1 << 30),
        "MemorySwapMax": ("t", 0),  # a cap without swap, as before
        "TasksMax": ("t", 32),
        "CPUWeight": ("t", 50),
        "IOWeight": ("t", 200),
        "CPUQuotaPerSecUSec": ("t", 1_500_000),
        "AllowedCPUs": ("ay", bytes([0b0000_0111, 0b0000_0010])),
    }
    assert build() == {}
    assert build(properties={"TasksMax": "infinity", "MemorySwapMax": "2G"}) == {
        "TasksMax": ("t", INFINITY),
        "MemorySwapMax": ("t", 2 << 30),
    }
    assert build(properties={"MemoryMax": "512M", "MemorySwapMax": "0"})["MemorySwapMax"] == (
        "t",
        0,
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tasks_max": 0}, "TasksMax"),
        ({"tasks_max": "32"}, "tasks_max"),
        ({"cpu_weight": 10001}, "CPUWeight"),
        ({"io_weight": True}, "io_weight"),
        ({"properties": {"MemoryHigh": "1G"}}, "throttles"),
        ({"properties": {"Delegate": "yes"}}, "Delegate"),
        ({"properties": {"KillMode": "none"}}, "one of AllowedCPUs"),
        ({"properties": {"CPUQuota": "2"}}, "percentage"),
        ({"properties": {"CPUQuota": "0%"}}, "percentage"),
        # docs/cli.md's range and systemd's CPUQuota= grammar: two decimals at most.
        ({"properties": {"CPUQuota": "1.234%"}}, "two decimals at most"),
        ({"properties": {"AllowedCPUs": "3-1"}}, "AllowedCPUs"),
        ({"properties": {"AllowedCPUs": "99999"}}, "from 0 to 8191"),
        ({"properties": {"MemoryMax": "lots"}}, "MemoryMax"),
        ({"tasks_max": 8, "properties": {"TasksMax": "9"}}, "given once"),
        ({"properties": ["TasksMax=5"]}, "a mapping of property names"),
    ],
)
def test_bad_values_are_refused_with_the_property_named(
    kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidConfig, match=match):
        build(**kwargs)  # type: ignore[arg-type]


def test_reap_after() -> None:
    assert parse_reap_after("keep") is None
    assert parse_reap_after(0) == 0.0
    assert parse_reap_after("2.5") == 2.5
    for bad in (None, -1, "x", float("inf"), False):
        with pytest.raises(InvalidConfig):
            parse_reap_after(bad)


def test_compare_names_what_was_dropped_changed_or_not_enforced() -> None:
    sent = build(tasks_max=32, cpu_weight=50, io_weight=200, properties={"AllowedCPUs": "0-7"})
    read = {"TasksMax": 32, "CPUWeight": 100, "AllowedCPUs": [0xFF]}  # IOWeight missing
    files = {
        "pids.max": "32",
        "cpu.weight": "100",
        "cpuset.cpus": "0-7",
        "cpuset.cpus.effective": "0-1",
    }
    issues = {i["property"]: i for i in compare(sent, read, files)}
    assert issues["IOWeight"]["reason"] == "dropped"
    assert issues["CPUWeight"] == {
        "property": "CPUWeight",
        "sent": 50,
        "read": 100,
        "reason": "changed",
    }
    assert issues["AllowedCPUs"]["reason"] == "not_enforced"
    assert "0-1" in issues["AllowedCPUs"]["detail"]
    assert "TasksMax" not in issues
    # The controller not enabled for the scope: systemd keeps it, nothing enforces it.
    (missing,) = compare(build(tasks_max=5), {"TasksMax": 5}, {"pids.max": None})
    assert missing["reason"] == "not_enforced"
    assert "pids controller" in missing["detail"]


async def test_a_launch_sends_the_controls_and_reports_what_was_not_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bus = FakeSystemd(tmp_path / "cgroup")
    bus.held = {"CPUWeight": 100}  # systemd keeps another value
    bus.controllers = ("memory", "pids", "cpu")  # no io: a user manager's delegation
    caplog.set_level(logging.WARNING, "agentscope")
    async with make_fleet(tmp_path, bus) as fleet:
        agent = await fleet.launch("a", ["sleep", "30"], tasks_max=32, cpu_weight=50, io_weight=200)
        (start,) = [c for c in bus.calls if c.member == "StartTransientUnit"]
        sent = {k: v.value for k, v in start.body[2]}
        assert (sent["TasksMax"], sent["CPUWeight"], sent["IOWeight"]) == (32, 50, 200)
        assert "MemoryMax" not in sent
        issues = {i["property"]: i["reason"] for i in agent.property_issues}
        assert issues == {"CPUWeight": "changed", "IOWeight": "not_enforced"}
        (event,) = await fleet.events(kind="properties_not_applied")
        assert event.detail["issues"] == agent.property_issues
        assert sum("CPUWeight=100" in r.getMessage() for r in caplog.records) == 1
        clean = await fleet.launch("b", ["sleep", "30"], tasks_max=8)
        assert clean.property_issues == []
    await stop_everything(bus)


def test_a_bad_control_starts_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        bus = FakeSystemd(tmp_path / "cgroup")
        async with make_fleet(tmp_path, bus) as fleet:
            with pytest.raises(InvalidConfig, match="TasksMax"):
                await fleet.launch("x", ["true"], properties={"TasksMax": "-3"})
            assert await fleet.agents(all=True) == []
        assert not [c for c in bus.calls if c.member == "StartTransientUnit"]
        await stop_everything(bus)

    asyncio.run(go())
