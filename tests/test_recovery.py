"""OOM kills recovered after no monitor ran (_monitor/_recovery.py and its hooks), and
victims named from the journal's kernel messages."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agentscope_systemd import BusError
from agentscope_systemd._events import OomKill
from agentscope_systemd._fleet._fleet import AsyncFleet
from agentscope_systemd._kernel._cgroup import MemoryEvents
from agentscope_systemd._kernel._journal import (
    JournalRead,
    KernelLine,
    journal_access,
    parse_journal_entry,
)
from agentscope_systemd._monitor import _logwatch
from agentscope_systemd._monitor._attribution import SeenProcess, parse_oom_kill_line
from agentscope_systemd._monitor._killcount import JOURNAL_GRACE, KillCounter
from agentscope_systemd._monitor._monitor import Monitor
from agentscope_systemd._monitor._recovery import (
    Baseline,
    KernelKill,
    Readings,
    RecoveryPlan,
    RowMark,
    Watermark,
    kernel_kills,
    merge_marks,
    plan_recovery,
    unit_of_memcg,
)
from agentscope_systemd._monitor._sampling import _Sample, _ScopeSample
from agentscope_systemd._registry._registry import EventRecord, Registry
from tests import fakefs
from tests.fakesystemd import FakeSystemd, end_children

SLICE = (
    "/user.slice/user-1000.slice/user@1000.service/app.slice/app-agentscope.slice"
    "/app-agentscope-agents.slice"
)
BOOT = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
OLD_BOOT = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
A = "agentscope-ci-a-1a2b3c.scope"
B = "agentscope-ci-b-4d5e6f.scope"
OTHER = "agentscope-web-x-777777.scope"


def summary(unit: str, pid: int, comm: str = "python3") -> str:
    memcg = f"{SLICE}/{unit}"
    return (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={memcg},task_memcg={memcg},task={comm},pid={pid},uid=1000"
    )


def killed(pid: int, comm: str = "python3") -> str:
    return (
        f"Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:300000kB, "
        "anon-rss:262144kB, file-rss:1024kB, shmem-rss:0kB, UID:1000 pgtables:600kB "
        "oom_score_adj:800"
    )


def lines(*texts: str, boot: str | None = None) -> list[KernelLine]:
    return [KernelLine(t, boot, str(i)) for i, t in enumerate(texts, 1)]


def kill(unit: str, pid: int, boot: str | None = None) -> KernelKill:
    (k,) = kernel_kills(lines(summary(unit, pid), killed(pid), boot=boot))
    return k


def read(
    slice_kills: int,
    scopes: dict[str, int],
    *,
    boot: str = BOOT,
    inode: int | None = 42,
    log: tuple[KernelKill, ...] = (),
    source: str | None = "journal",
    position: str | None = "s=1",
) -> Readings:
    return Readings(
        boot,
        SLICE,
        inode,
        slice_kills,
        scopes,
        log,
        "journal" if source == "journal" else ("kmsg" if source == "kmsg" else None),
        position,
    )


class FakeRegistry:
    """What the registry stores for recovery: rows' counters, recorded pids, one watermark."""

    def __init__(self, rows: dict[str, str]) -> None:
        self.rows = {unit: RowMark(name, 0) for unit, name in rows.items()}
        self.recorded: dict[str, set[int]] = {}
        self.mark: str | None = None
        self.events: list[dict[str, object]] = []

    def recover(self, readings: Readings) -> RecoveryPlan:
        stored = None if self.mark is None else Watermark.from_json(self.mark)
        recorded = {u: frozenset(p) for u, p in self.recorded.items()}
        plan = plan_recovery(readings, stored, self.rows, recorded, fleet_prefix="agentscope-ci-")
        for unit, n in plan.seen.items():
            self.rows[unit] = replace(self.rows[unit], seen=max(self.rows[unit].seen, n))
        for k in plan.kills:
            if k.unit is not None and k.pid is not None:
                self.recorded.setdefault(k.unit, set()).add(k.pid)
            self.events.append({"agent": k.agent, "pid": k.pid, "source": k.source})
        self.mark = plan.watermark.to_json()
        return plan


# ---------------------------------------------------------------------------
# The kernel's lines


def test_kernel_kills_pair_the_summary_with_its_killed_line() -> None:
    found = kernel_kills(
        lines(
            "some other kernel message",
            summary(A, 1234),
            "Tasks state (memory values in pages):",
            killed(1234, "my tool (v2)"),
        )
    )
    assert [(k.pid, k.comm, k.memcg, k.rss) for k in found] == [
        (1234, "my tool (v2)", f"{SLICE}/{A}", (262144 + 1024) * 1024)
    ]
    assert unit_of_memcg(found[0].memcg, SLICE) == A


def test_malformed_and_unpaired_lines_are_ignored() -> None:
    found = kernel_kills(
        lines(
            killed(5),  # no summary before it: no cgroup to attribute it to
            "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=relative/x.scope,task=a,pid=6",
            killed(6),
            "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a/../b.scope,task=a,pid=7",
            killed(7),
            "oom-kill:garbage",
            "Memory cgroup out of memory: Killed process x (y)",
            "\x00\xff binary junk",
            summary(A, 8),
            killed(9),  # another pid
        )
    )
    assert found == []
    assert unit_of_memcg(f"{SLICE}/../etc.scope", SLICE) is None
    assert unit_of_memcg(f"{SLICE}/a b.scope", SLICE) is None
    assert unit_of_memcg(f"{SLICE}/x.service", SLICE) is None
    assert unit_of_memcg(f"{SLICE}-other/{A}", SLICE) is None


KERNEL = {"_TRANSPORT": "kernel"}


def test_journal_json_lines_parse_into_kills() -> None:
    cursor = "s=3f2a;i=1b4;b=" + BOOT + ";m=9c0d;t=62a1;x=77e"
    raw = [
        json.dumps(
            {"__CURSOR": cursor, "_BOOT_ID": BOOT, **KERNEL, "MESSAGE": summary(B, 77, "sh")}
        ),
        # MESSAGE as a byte array: journald's form for text that is not UTF-8
        json.dumps(
            {
                "__CURSOR": cursor + "1",
                "_BOOT_ID": BOOT,
                **KERNEL,
                "MESSAGE": list(killed(77, "sh").encode()),
            }
        ),
        # A user's own lines, however kernel-like: not the kernel's (#31).
        json.dumps(
            {"__CURSOR": cursor, "_BOOT_ID": BOOT, "_TRANSPORT": "syslog", "MESSAGE": summary(A, 5)}
        ),
        json.dumps(
            {"__CURSOR": cursor, "_BOOT_ID": BOOT, "_TRANSPORT": "syslog", "MESSAGE": killed(5)}
        ),
        json.dumps({"__CURSOR": cursor, "_BOOT_ID": BOOT, "MESSAGE": summary(A, 6)}),
        json.dumps({"__CURSOR": cursor, "_BOOT_ID": BOOT, "MESSAGE": killed(6)}),
        "not json",
        json.dumps({"__CURSOR": "; rm -rf /", "MESSAGE": killed(1)}),
        json.dumps(["a", "list"]),
        json.dumps({"__CURSOR": cursor, "MESSAGE": 12}),
    ]
    entries = [e for e in (parse_journal_entry(r.encode()) for r in raw) if e is not None]
    # Every journal entry is parsed, its transport kept; only the kernel's make kills.
    assert [e.from_kernel for e in entries] == [True, True, False, False, False, False]
    assert entries[0].boot == BOOT
    assert entries[0].position == cursor
    (k,) = kernel_kills(entries)
    assert (k.pid, k.comm, unit_of_memcg(k.memcg, SLICE), k.boot) == (77, "sh", B, BOOT)


# ---------------------------------------------------------------------------
# The plan


def test_a_kill_while_no_monitor_ran_is_recovered_once_over_restarts() -> None:
    reg = FakeRegistry({A: "a", B: "b"})
    first = reg.recover(read(0, {A: 0, B: 0}))
    assert first.kills == ()
    # No monitor runs; a's tool call is killed: its scope's counter and the slice's rise.
    log = (kill(A, 4242),)
    second = reg.recover(read(1, {A: 1, B: 0}, log=log, position="s=2"))
    assert [(k.agent, k.unit, k.pid, k.comm, k.source) for k in second.kills] == [
        ("a", A, 4242, "python3", "journal")
    ]
    assert reg.rows[A].seen == 1
    # Any number of opens later, with the same log still there: nothing again.
    for _ in range(5):
        assert reg.recover(read(1, {A: 1, B: 0}, log=log, position="s=2")).kills == ()
    assert len(reg.events) == 1


def test_without_a_readable_log_the_kill_is_counted_but_not_named() -> None:
    reg = FakeRegistry({A: "a"})
    reg.recover(read(0, {A: 0}, source=None, position=None))
    plan = reg.recover(read(2, {A: 2}, source=None, position=None))
    assert [(k.agent, k.pid, k.source) for k in plan.kills] == [("a", None, "cgroup")] * 2
    assert reg.recover(read(2, {A: 2}, source=None, position=None)).kills == ()


def test_first_open_counts_live_scopes_from_their_rows_not_the_slice() -> None:
    # A row migrated from schema 2 carries its recorded kills as its seen counter.
    reg = FakeRegistry({A: "a"})
    reg.rows[A] = RowMark("a", 1)
    plan = reg.recover(read(9, {A: 3}, log=(kill(A, 10),)))
    # Two kills above what was recorded; the slice's 9 are history (no watermark yet),
    # the log from before the first position is not read.
    assert [(k.agent, k.pid) for k in plan.kills] == [("a", None), ("a", None)]


def test_a_kill_in_a_scope_now_gone_comes_from_the_slice() -> None:
    reg = FakeRegistry({A: "a", B: "b"})
    reg.recover(read(0, {A: 0, B: 0}))
    # b's only process was killed: its scope went with it. Only the slice kept count.
    plan = reg.recover(read(1, {A: 0}, position="s=3"))
    assert [(k.agent, k.unit, k.source) for k in plan.kills] == [(None, None, "cgroup")]
    assert reg.recover(read(1, {A: 0})).kills == ()


def test_the_log_names_a_gone_scopes_kill_and_skips_another_fleets() -> None:
    reg = FakeRegistry({A: "a", B: "b"})
    reg.recover(read(0, {A: 0, B: 0}))
    log = (kill(OTHER, 5), kill(B, 6))
    plan = reg.recover(read(2, {A: 0}, log=log, position="s=4"))
    # Fleet web's kill is web's to record; b's is named by its line.
    assert [(k.agent, k.unit, k.pid) for k in plan.kills] == [("b", B, 6)]
    assert reg.recover(read(2, {A: 0}, log=log, position="s=4")).kills == ()


def test_live_and_gone_kills_together_are_each_counted_once() -> None:
    reg = FakeRegistry({A: "a", B: "b"})
    assert len(reg.recover(read(3, {A: 2, B: 1})).kills) == 3  # above the rows' counters
    plan = reg.recover(read(6, {A: 4}))  # a: 2 more; b gone after 1 more
    assert sorted((k.agent or "-") for k in plan.kills) == ["-", "a", "a"]


def test_a_new_boot_resets_the_counters_and_the_journal_tells_the_boot_before() -> None:
    reg = FakeRegistry({A: "a", B: "b"})
    reg.recover(read(0, {A: 0, B: 0}, boot=OLD_BOOT))
    # Before the reboot (no monitor): b was killed. After it, a new agent c was killed once.
    reg.rows["agentscope-ci-c-888888.scope"] = RowMark("c", 0)
    log = (kill(B, 31, boot=OLD_BOOT), kill("agentscope-ci-c-888888.scope", 32, boot=BOOT))
    plan = reg.recover(
        read(1, {"agentscope-ci-c-888888.scope": 1}, boot=BOOT, inode=7, log=log, position="s=9")
    )
    assert sorted((k.agent, k.pid) for k in plan.kills) == [("b", 31), ("c", 32)]
    again = read(1, {"agentscope-ci-c-888888.scope": 1}, boot=BOOT, inode=7, log=log)
    assert reg.recover(again).kills == ()


def test_a_new_boot_with_the_kmsg_counts_its_slice_from_zero() -> None:
    reg = FakeRegistry({A: "a"})
    reg.recover(read(5, {A: 5}, boot=OLD_BOOT, source="kmsg", position="100"))
    plan = reg.recover(read(2, {}, boot=BOOT, inode=9, source="kmsg", position="3"))
    assert [(k.agent, k.source) for k in plan.kills] == [(None, "cgroup")] * 2


def test_a_slice_cgroup_made_again_counts_from_zero() -> None:
    reg = FakeRegistry({A: "a"})
    reg.recover(read(4, {A: 4}))
    # Same boot, the slice removed (no agents) and made again: a new inode, counters at 0.
    assert len(reg.recover(read(1, {}, inode=43)).kills) == 1


def test_an_older_reading_neither_records_nor_lowers_the_watermark() -> None:
    reg = FakeRegistry({A: "a"})
    reg.recover(read(0, {A: 0}))
    reg.recover(read(3, {A: 1}))  # 1 live + 2 gone
    stale = reg.recover(read(2, {A: 1}))  # read by another process before the last one
    assert stale.kills == ()
    stored = Watermark.from_json(reg.mark or "")
    assert stored is not None
    assert stored.slice_oom_kill == 3
    assert reg.recover(read(3, {A: 1})).kills == ()


def test_watermark_round_trip_and_malformed_forms() -> None:
    mark = Watermark(BOOT, SLICE, 42, 3, {A: 2}, "journal", "s=1;i=2")
    assert Watermark.from_json(mark.to_json()) == mark
    for bad in ("", "[]", "{}", json.dumps({**json.loads(mark.to_json()), "inode": "x"})):
        assert Watermark.from_json(bad) is None
    junk = json.loads(mark.to_json())
    junk["scopes"] = {"../x": 3, A: -1, B: 2}
    cleaned = Watermark.from_json(json.dumps(junk))
    assert cleaned is not None
    assert cleaned.scopes == {B: 2}


def test_merge_never_goes_back_within_a_boot() -> None:
    old = Watermark(BOOT, SLICE, 42, 5, {A: 3}, None, None)
    new = Watermark(BOOT, SLICE, 42, 4, {A: 2, B: 1}, None, None)
    merged = merge_marks(old, new)
    assert (merged.slice_oom_kill, dict(merged.scopes)) == (5, {A: 3, B: 1})
    reboot = replace(new, boot=OLD_BOOT)
    assert merge_marks(old, reboot) == reboot


# ---------------------------------------------------------------------------
# Through a real fleet and registry file, over a fake systemd and cgroup tree


def _fleet(tmp_path: Path, bus: FakeSystemd) -> AsyncFleet:
    f = AsyncFleet(
        "ci",
        registry=tmp_path / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp_path / "tmux",
        _bus=bus,
    )
    # This host's kernel log is not the tree's.
    f._recovery.kmsg_path, f._recovery.read_journal = None, False
    return f


def _kills(bus: FakeSystemd, unit: str | None, slice_total: int, scope_total: int = 0) -> None:
    with fakefs.KERNEL:
        if unit is not None:
            fakefs.write(
                bus.units[unit].cgroup / "memory.events",
                fakefs.format_memory_events(MemoryEvents(0, 0, 0, 1, scope_total)),
            )
        fakefs.write(
            bus.slice_dir / "memory.events",
            fakefs.format_memory_events(MemoryEvents(0, 0, 0, 1, slice_total)),
        )


async def _oom_events(tmp_path: Path, bus: FakeSystemd) -> list[EventRecord]:
    async with _fleet(tmp_path, bus) as f:
        return await f.events(kind="oom_kill")


async def _stop(bus: FakeSystemd, unit: str) -> None:
    await bus.connect()
    await bus.call("KillUnit", "ssi", [unit, "all", 9])
    for _ in range(200):
        if unit not in bus.units:
            break
        await asyncio.sleep(0.01)
    bus.close()


async def _next_kill(mon: Monitor) -> OomKill:
    """The monitor's next OomKill event (within 10 s)."""
    async with asyncio.timeout(10):
        async for event in mon:
            if isinstance(event, OomKill):
                return event
    raise AssertionError("the monitor ended without an OomKill")


@pytest.fixture(autouse=True)
def _reap_agents() -> Iterator[None]:
    """Agents outlive a closed fleet by design: kill and reap what a test left."""
    yield
    end_children()


@pytest.fixture
def bus(tmp_path: Path) -> FakeSystemd:
    b = FakeSystemd(tmp_path / "cgroup")
    fakefs.make_cgroup(b.cgroup_root, str(b.slice_dir.relative_to(b.cgroup_root)))
    return b


@pytest.fixture
async def agents(tmp_path: Path, bus: FakeSystemd) -> AsyncIterator[dict[str, str]]:
    """Two agents launched by a fleet that then closed: their units by name."""
    async with _fleet(tmp_path, bus) as f:
        units = {n: (await f.launch(n, ["sleep", "60"])).unit for n in ("a", "b")}
    yield units
    await bus.connect()
    for unit in list(bus.units):
        with contextlib.suppress(BusError):
            await bus.call("KillUnit", "ssi", [unit, "all", 9])
    bus.close()


async def test_fleet_open_records_a_kill_while_no_monitor_ran_once(
    tmp_path: Path, bus: FakeSystemd, agents: dict[str, str]
) -> None:
    _kills(bus, agents["a"], slice_total=1, scope_total=1)
    (event,) = await _oom_events(tmp_path, bus)
    assert event.agent == "a"
    assert event.detail["recovered"] is True
    assert event.detail["unit"] == agents["a"]
    assert (event.detail["pid"], event.detail["source"]) == (None, "cgroup")
    for _ in range(3):
        assert len(await _oom_events(tmp_path, bus)) == 1
    with Registry(tmp_path / "registry.db") as reg:
        row = reg.by_unit(agents["a"])
        assert row is not None
        assert row.oom_kills == 1


async def test_fleet_open_records_a_kill_whose_scope_is_gone_from_the_slice(
    tmp_path: Path, bus: FakeSystemd, agents: dict[str, str]
) -> None:
    assert await _oom_events(tmp_path, bus) == []  # the watermark: nothing yet
    # b's only process was killed and its scope went: only the slice counted it.
    await _stop(bus, agents["b"])
    _kills(bus, None, slice_total=1)
    (event,) = await _oom_events(tmp_path, bus)
    assert (event.agent, event.detail["unit"], event.detail["recovered"]) == (None, None, True)
    assert len(await _oom_events(tmp_path, bus)) == 1


async def test_a_kill_the_monitor_recorded_is_not_recovered_again(
    tmp_path: Path, bus: FakeSystemd, agents: dict[str, str]
) -> None:
    async with _fleet(tmp_path, bus) as f:
        mon = f.monitor(interval=0.05, cgroup_root=bus.cgroup_root, kmsg=None)
        async with mon:
            _kills(bus, agents["a"], slice_total=1, scope_total=1)
            event = await _next_kill(mon)
            assert not event.recovered
            for _ in range(200):
                if await f.events(kind="oom_kill"):
                    break
                await asyncio.sleep(0.01)
    # Its scope gone before the next open, the slice alone holds that kill: not news.
    await _stop(bus, agents["a"])
    for _ in range(2):
        (event_record,) = await _oom_events(tmp_path, bus)
        assert event_record.detail["recovered"] is False


async def test_after_a_reboot_root_names_the_boot_befores_kills_from_the_journal(
    tmp_path: Path, bus: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root reads /dev/kmsg, which holds this boot only. A tool call of agent a was
    # OOM-killed, then the host rebooted before any fleet opened: the kill is in
    # the (persistent) journal of the boot before, and nowhere else.
    (tmp_path / "kmsg").write_bytes(b"6,100,0,-;a line of this boot\n")  # one record a read
    boot = [BOOT]  # the boot id /proc tells
    monkeypatch.setattr("agentscope_systemd._fleet._fleet_recovery.read_boot_id", lambda: boot[0])
    monkeypatch.setattr(
        "agentscope_systemd._fleet._fleet_recovery.journal_access",
        lambda dirs: replace(journal_access([tmp_path / "none"]), readable=True),
    )
    memcg = "/" + str(bus.slice_dir.relative_to(bus.cgroup_root))
    asked: list[str] = []
    unit = ""

    def journal_of(old: str) -> JournalRead:
        asked.append(old)
        text = summary(unit, 4242, "tail").replace(SLICE, memcg)
        return JournalRead(tuple(lines(text, killed(4242, "tail"), boot=BOOT)), None, True)

    monkeypatch.setattr("agentscope_systemd._fleet._fleet_recovery.read_journal_boot", journal_of)

    def fleet() -> AsyncFleet:
        f = _fleet(tmp_path, bus)
        f._recovery.kmsg_path, f._recovery.read_journal = tmp_path / "kmsg", True
        return f

    async with fleet() as f:  # the watermark, in the boot before
        unit = (await f.launch("a", ["sleep", "60"])).unit
    # The reboot: a new boot id, every scope gone, every counter from 0.
    await _stop(bus, unit)
    _kills(bus, None, slice_total=0)
    boot[0] = OLD_BOOT
    async with fleet() as f:
        (event,) = await f.events(kind="oom_kill")
    assert asked == [BOOT]
    assert event.agent == "a"
    assert (event.detail["unit"], event.detail["pid"], event.detail["comm"]) == (
        unit,
        4242,
        "tail",
    )
    assert (event.detail["source"], event.detail["recovered"]) == ("journal", True)
    assert event.detail["rss_last_seen"] > 0
    async with fleet() as f:  # the watermark is in this boot now: not read again
        assert len(await f.events(kind="oom_kill")) == 1
    assert asked == [BOOT]


@pytest.mark.parametrize("scope_gone", [False, True], ids=["scope-alive", "scope-gone"])
async def test_a_kill_a_cli_call_recovered_first_is_not_recorded_again_by_the_monitor(
    tmp_path: Path, bus: FakeSystemd, agents: dict[str, str], scope_gone: bool
) -> None:
    # A monitor runs; the kernel kills; before the monitor's next sample a CLI
    # call opens the fleet and recovers the kill (unnamed). The monitor's live
    # report of it must not make it two kills: the one row gets the live detail.
    # scope-gone: systemd 247 ends a scope whose only process the kernel killed,
    # so the recovery has the slice's counter alone and names no unit (CI, sd247).
    fleet = _fleet(tmp_path, bus)
    async with fleet as f, f.monitor(interval=2.0, cgroup_root=bus.cgroup_root, kmsg=None) as mon:
        _kills(bus, agents["a"], slice_total=1, scope_total=1)
        if scope_gone:
            await _stop(bus, agents["a"])
        (recovered,) = await _oom_events(tmp_path, bus)
        assert recovered.detail["recovered"] is True
        assert recovered.detail["unit"] == (None if scope_gone else agents["a"])
        event = await _next_kill(mon)
        assert (event.agent, event.recovered) == ("a", False)
        for _ in range(300):
            stored = await f.events(kind="oom_kill")
            if len(stored) > 1 or stored[0].detail["recovered"] is False:
                break
            await asyncio.sleep(0.01)
    (record,) = await _oom_events(tmp_path, bus)
    assert record.id == recovered.id
    assert (record.agent, record.detail["unit"]) == ("a", agents["a"])
    assert record.detail["recovered"] is False
    with Registry(tmp_path / "registry.db") as reg:
        row = reg.by_unit(agents["a"])
        assert row is not None
        assert row.oom_kills == 1


def test_a_kill_two_monitors_saw_is_one_record(tmp_path: Path) -> None:
    unit = "agentscope-ci-a-abc123.scope"
    live = {"unit": unit, "pid": 4242, "comm": "python3", "source": "kmsg", "recovered": False}
    with Registry(tmp_path / "registry.db") as reg:
        first = reg.record_oom_kill("ci", "a", live)
        again = reg.record_oom_kill("ci", "a", live)  # the other monitor's report
        other = reg.record_oom_kill("ci", "a", {**live, "pid": 4243})  # another kill
        assert again.id == first.id
        assert other.id != first.id
        assert len(reg.events(fleet="ci", kind="oom_kill")) == 2


async def test_a_monitor_start_recovers_and_reports_the_kill_in_its_events(
    tmp_path: Path, bus: FakeSystemd, agents: dict[str, str]
) -> None:
    _kills(bus, agents["b"], slice_total=2, scope_total=2)
    async with _fleet(tmp_path, bus) as f:
        # The open recorded both; kill once more, then a monitor starts: one for it.
        _kills(bus, agents["b"], slice_total=3, scope_total=3)
        async with f.monitor(interval=0.05, cgroup_root=bus.cgroup_root, kmsg=None) as mon:
            event = await _next_kill(mon)
        assert (event.agent, event.recovered) == ("b", True)
        assert len(await f.events(kind="oom_kill")) == 3
    assert len(await _oom_events(tmp_path, bus)) == 3


async def test_a_kill_held_for_the_kernels_line_when_its_monitor_closes_is_recovered_once(
    tmp_path: Path, bus: FakeSystemd, agents: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user's monitor follows the journal (here a silent follower), so a kill
    # whose scope ended before its victim was named is held for the kernel's
    # line. The monitor closes while it waits: nothing is told live, and the
    # next open records the kill once, as recovered.
    def silent_follower() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        return proc

    monkeypatch.setattr(_logwatch, "start_follower", silent_follower)
    async with _fleet(tmp_path, bus) as f:
        mon = f.monitor(interval=0.05, cgroup_root=bus.cgroup_root, kmsg=None, journal=True)
        async with mon:
            counter = mon._counter
            assert counter.await_kernel
            counter.victim_grace = 60.0  # the close surely comes first
            _kills(bus, agents["a"], slice_total=1, scope_total=1)
            await _until(lambda: agents["a"] in counter._scopes and counter.pending)
            await _stop(bus, agents["a"])
            await _until(lambda: agents["a"] in counter._held)
            assert mon.accounted().slice_oom_kill == 0
        assert await f.events(kind="oom_kill") == []
    # Left for the open, whose read of the journal names such a kill by its
    # line's task_memcg; this fleet reads no kernel log, so only the slice
    # has the kill: counted, once, with no agent.
    (event,) = await _oom_events(tmp_path, bus)
    assert (event.agent, event.detail["unit"], event.detail["recovered"]) == (None, None, True)
    assert len(await _oom_events(tmp_path, bus)) == 1


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the monitor never got there")


# ---------------------------------------------------------------------------
# The monitor's side: the journal's word awaited, what a live kill accounts for


def _sample(slice_kills: int, unit: str, kills: int, procs: dict[int, SeenProcess]) -> _Sample:
    ev = MemoryEvents(0, 0, 0, kills, kills)
    return _Sample(
        MemoryEvents(0, 0, 0, slice_kills, slice_kills),
        None,
        None,
        {unit: _ScopeSample(1 << 20, ev, procs, True)},
        (),
        (),
        None,
        None,
        None,
    )


def _counter(await_kernel: bool) -> KillCounter:
    counter = KillCounter(slice_path=Path(SLICE), unit_agent=lambda unit: "a")
    counter.await_kernel = await_kernel
    counter.victim_grace = JOURNAL_GRACE if await_kernel else 1.0
    return counter


def test_with_the_journal_a_kill_waits_for_the_kernels_word_not_a_guess() -> None:
    sleeper = {10: SeenProcess(10, 1, "sleep", 4096)}
    # Today's heuristic: the tool call no sample saw is killed while `sleep` exits
    # normally; without the kernel's word, `sleep` passes for the victim.
    guessing = _counter(await_kernel=False)
    guessing.count(_sample(0, A, 0, sleeper), 99.0)
    (wrong,) = guessing.count(_sample(1, A, 1, {}), 100.0)[0]
    assert isinstance(wrong, OomKill)
    assert (wrong.comm, wrong.source) == ("sleep", "cgroup")
    # With the journal: the kill waits, the kernel's lines arrive, the victim is named.
    counter = _counter(await_kernel=True)
    counter.count(_sample(0, A, 0, sleeper), 99.0)
    assert counter.count(_sample(1, A, 1, {}), 100.0)[0] == []
    assert counter.accounted() == Baseline(None, 0, {A: 0})  # the waiting kill not yet told
    line = killed(77, "tail")
    kill = parse_oom_kill_line(line)
    assert kill is not None
    counter.note_kernel_task(77, f"{SLICE}/{A}")
    counter.note_kernel_kill(kill, 100.2, "journal")
    (named,) = counter.count(_sample(1, A, 1, {}), 100.5)[0]
    assert isinstance(named, OomKill)
    assert (named.pid, named.comm, named.source) == (77, "tail", "journal")
    assert named.rss_last_seen == (262144 + 1024) * 1024  # from the kernel's line
    assert counter.accounted() == Baseline(None, 1, {A: 1})


def test_with_the_journal_silent_the_kill_is_told_unnamed_after_the_grace() -> None:
    counter = _counter(await_kernel=True)
    counter.count(_sample(0, A, 0, {}), 99.0)
    assert counter.count(_sample(1, A, 1, {}), 100.0)[0] == []
    assert counter.count(_sample(1, A, 1, {}), 100.0 + JOURNAL_GRACE / 2)[0] == []
    (late,) = counter.count(_sample(1, A, 1, {}), 100.0 + JOURNAL_GRACE)[0]
    assert isinstance(late, OomKill)
    assert (late.agent, late.pid, late.source) == ("a", None, "cgroup")


@pytest.mark.parametrize(
    "text",
    [
        "Out of memory: Killed process \u00b2 (x)",
        "Memory cgroup out of memory: Killed process \u0663\u0663 (x) total-vm:1kB",
        "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a.scope,task=x,pid=\u00b2,uid=0",
        "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a.scope,task=x,pid=7,uid=\u0663",
        "Memory cgroup out of memory: Killed process 7 (x) total-vm:\u00b2kB, anon-rss:\u0663kB",
    ],
)
def test_hostile_kernel_looking_lines_never_make_recovery_raise(text: str) -> None:
    # #31: "Killed process ² (x)" injected into /dev/kmsg made every open raise.
    kernel_kills(lines(summary(A, 7), text, killed(7)))
    kernel_kills(lines(text))


def test_a_user_record_in_the_kmsg_is_not_read_at_open(tmp_path: Path) -> None:
    from agentscope_systemd._kernel._journal import read_kmsg

    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(("12,7,0,-;" + killed(77)).encode() + b"\n")
    got = read_kmsg(0, kmsg)
    assert got is not None
    assert got.lines == ()
