"""The guard on hosts as users have them (issue #25), over fake trees with real victims.

zram and swap, thrashing with memory to spare, shortages that are not the
fleet's (a hog elsewhere, another user's self-throttled cgroup), several
guards over one slice, processes whose memory hides (a main thread that
exited), a cgroup that cannot be listed, a victim that left the slice.
"""

# The fixtures (tree, sleeper, kernel) are test_guard's, imported by name.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentscope_systemd import AsyncFleet, GuardConfig, GuardKill, RegistryError
from agentscope_systemd._guard._guard import _kill, run_guard
from agentscope_systemd._guard._guardcause import CauseTracker, outside_cgroups
from agentscope_systemd._guard._guardclock import PressureClock
from agentscope_systemd._guard._guardlock import SliceLock, lock_name
from agentscope_systemd._guard._guardpolicy import (
    GuardHeld,
    HostReader,
    HostReading,
    under_pressure,
)
from agentscope_systemd._guard._guardproc import PENDING_MAX, GuardChild, _Out
from agentscope_systemd._guard._guardscan import (
    choose_victim,
    measure,
    scan_candidates,
    scan_slice_processes,
)
from agentscope_systemd._kernel._memsources import parse_swaps, parse_vmstat_refaults
from agentscope_systemd._monitor._monitor import Monitor
from tests.fakefs import (
    KERNEL,
    PAGE,
    format_pressure,
    make_cgroup,
    make_host_pressure,
    make_proc,
    write,
)
from tests.test_guard import (  # noqa: F401 (fixtures)
    FAST,
    MIB_PAGES,
    SLICE,
    WAIT,
    Tree,
    fleet,
    kernel,
    reading,
    sleeper,
    start_guard,
    tree,
    unit_agent,
    wait_until,
)

GIB_KB = 1 << 20


def zram(tree: Tree, *, size_kb: int, used_kb: int, orig: int, mem_used: int) -> None:
    """A zram swap device in /proc/swaps, and its mm_stat beside the fake /proc."""
    write(
        tree.proc / "swaps",
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        f"/dev/zram0                              partition\t{size_kb}\t\t{used_kb}\t\t100\n",
    )
    block = tree.proc.parent / "sys" / "block" / "zram0"
    block.mkdir(parents=True, exist_ok=True)
    write(block / "mm_stat", f"{orig} {mem_used // 2} {mem_used} 0 {mem_used} 0 0 0 0\n")


def zram_host(tree: Tree, available_pct: float, zram_free_pct: float, ratio: float) -> None:
    """An 8 GB host whose only swap is an 8 GB zram device, storing at ``ratio`` (cost/byte)."""
    total = 8 * GIB_KB
    used = int(total * (100 - zram_free_pct) / 100)
    from tests.fakefs import make_meminfo

    make_meminfo(
        tree.proc,
        total_kb=total,
        available_kb=int(total * available_pct / 100),
        swap_total_kb=total,
        swap_free_kb=total - used,
    )
    zram(tree, size_kb=total, used_kb=used, orig=used << 10, mem_used=int((used << 10) * ratio))


# -- zram counted as RAM ----------------------------------------------------


def test_the_zram_wedge_is_a_shortage_though_swap_looks_free(tree: Tree) -> None:
    # Pages that do not compress: MemAvailable 2 %, zram 60 % free. earlyoom's
    # rule (both low) never fires here; zram is RAM, so the guard's does.
    zram_host(tree, 2, 60, ratio=1.02)
    reader = HostReader(tree.proc)
    try:
        host = reader.read(0.0)
    finally:
        reader.close()
    assert host.swap_free_percent == pytest.approx(60, abs=0.1)
    assert host.zram_credit == 0
    assert under_pressure(host, GuardConfig()) == "memory"


def test_zram_that_still_compresses_counts_as_the_ram_it_would_save(tree: Tree) -> None:
    # 3:1: each free GiB of zram still saves 2/3 GiB; 2 % + 40 % x 2/3 ~ 28.7 %,
    # once zram is seen being given pages at that ratio (61 -> 60 % used).
    reader = HostReader(tree.proc)
    try:
        zram_host(tree, 2, 41, ratio=1 / 3)
        first = reader.read(0.0)
        # No pages given to zram seen yet: no credit, the cautious guess.
        assert first.zram_credit == 0
        assert under_pressure(first, GuardConfig()) == "memory"
        zram_host(tree, 2, 40, ratio=1 / 3)
        host = reader.read(1.0)
        assert host.available_percent == pytest.approx(2 + 40 * 2 / 3, abs=0.2)
        assert under_pressure(host, GuardConfig()) is None
        # Nearly full, it saves little: the guard acts.
        zram_host(tree, 2, 5, ratio=1 / 3)
        assert under_pressure(reader.read(2.0), GuardConfig()) == "memory"
    finally:
        reader.close()


def test_zram_earns_credit_only_for_the_pages_it_is_given(
    tree: Tree,
) -> None:
    # zram holds 1 GiB of long-stored pages at 3:1, so its average says each
    # free byte still saves 2/3 of one; then 400 MiB of a runaway's pages
    # that do not compress arrive in 1.5 s. The next pages are the
    # runaway's: the guard counts what they cost, not the average.
    total = 8 * GIB_KB
    from tests.fakefs import make_meminfo

    def host(available_pct: float, orig: int, mem_used: int) -> None:
        used_kb = orig >> 10
        make_meminfo(
            tree.proc,
            total_kb=total,
            available_kb=int(total * available_pct / 100),
            swap_total_kb=total,
            swap_free_kb=total - used_kb,
        )
        zram(tree, size_kb=total, used_kb=used_kb, orig=orig, mem_used=mem_used)

    boot = 1 << 30
    host(8, boot, boot // 3)
    reader = HostReader(tree.proc)
    try:
        before = reader.read(0.0)
        # zram given nothing yet: its average (which alone would have said
        # 8 % + 61 % = 69 % available) earns no credit.
        assert before.zram_marginal_cost is None
        assert before.available_percent == pytest.approx(8, abs=0.1)
        assert under_pressure(before, GuardConfig()) == "memory"
        grown = 400 << 20
        host(8, boot + grown, boot // 3 + grown)
        after = reader.read(1.5)
        assert after.zram_marginal_cost == pytest.approx(1.0)
        assert after.zram_credit == 0
        assert under_pressure(after, GuardConfig()) == "memory"
        # Pages that compress again 3:1 earn their credit back.
        host(8, boot + grown + (400 << 20), boot // 3 + grown + (400 << 20) // 3)
        again = reader.read(3.0)
        assert again.zram_marginal_cost == pytest.approx(1 / 3)
        assert again.available_percent > 10
    finally:
        reader.close()


def test_zram_margin_needs_growth_and_time_and_forgets() -> None:
    from agentscope_systemd._kernel._memsources import ZramMargin, ZramUse

    mib = 1 << 20
    margin = ZramMargin()
    assert margin.update(0.0, ZramUse(stored=100 * mib, ram_used=30 * mib)) is None
    # Too soon: no reading yet, whatever grew.
    assert margin.update(0.5, ZramUse(stored=200 * mib, ram_used=130 * mib)) is None
    # A second after the window's start: 100 MiB more, at full cost.
    assert margin.update(1.0, ZramUse(stored=200 * mib, ram_used=130 * mib)) == pytest.approx(1.0)
    assert margin.update(2.0, ZramUse(stored=300 * mib, ram_used=230 * mib)) == pytest.approx(1.0)
    # A window that stored little keeps the last cost until it is KEEP old.
    assert margin.update(3.5, ZramUse(stored=301 * mib, ram_used=231 * mib)) == pytest.approx(1.0)
    assert (
        margin.update(2.0 + ZramMargin.KEEP + 1, ZramUse(stored=302 * mib, ram_used=232 * mib))
        is None
    )
    # zram gave pages back: the window starts over, nothing is said from it.
    assert margin.update(20.0, ZramUse(stored=50 * mib, ram_used=20 * mib)) is None
    assert margin.update(21.5, ZramUse(stored=90 * mib, ram_used=30 * mib)) == pytest.approx(0.25)


def test_never_later_than_earlyoom_even_with_zram_credit() -> None:
    # earlyoom's own rule (MemAvailable <= 10 % and SwapFree <= 10 %) holds,
    # whatever zram's credit says.
    host = replace(reading(8, 9), zram_swap_total=1 << 30, zram_swap_free=int(0.09 * (1 << 30)))
    host = replace(host, zram_credit=host.mem_total // 5)
    assert host.available_percent > 10
    assert under_pressure(host, GuardConfig()) == "memory"


def test_swap_on_disk_beside_zram_must_be_low_too() -> None:
    total = 1 << 30
    host = replace(
        reading(3, 50, swap_total=2 * total),
        zram_swap_total=total,
        zram_swap_free=total // 2,  # disk swap: 512 MiB of 1 GiB free
    )
    assert host.disk_swap_free_percent == pytest.approx(50)
    assert under_pressure(host, GuardConfig()) is None
    assert under_pressure(replace(host, swap_free=total // 2 + total // 20), GuardConfig())


def test_swaps_and_vmstat_parse_as_the_kernel_prints_them() -> None:
    swaps = parse_swaps(
        b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        b"/swapfile                               file\t\t1048572\t\t0\t\t-2\n"
        b"/dev/zram0                              partition\t733180\t\t1024\t\t100\n"
    )
    assert [(s.name, s.zram, s.size, s.used) for s in swaps] == [
        ("/swapfile", False, 1048572 << 10, 0),
        ("/dev/zram0", True, 733180 << 10, 1 << 20),
    ]
    assert parse_vmstat_refaults(b"nr_free_pages 1\nworkingset_refault 40\npswpin 2\n") == 42
    assert parse_vmstat_refaults(b"workingset_refault_anon 1\nworkingset_refault_file 2\n") == 3
    assert parse_vmstat_refaults(b"nr_free_pages 1\n") is None


def test_the_guard_ends_the_zram_wedge(tree: Tree, sleeper: subprocess.Popen[bytes]) -> None:
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("python3", 900, 200)})
    got, stop = start_guard(tree, FAST)
    try:
        zram_host(tree, 2, 60, ratio=1.05)
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        wait_until(lambda: len(got) == 1)
    finally:
        stop()
    assert (got[0].pid, got[0].trigger, got[0].agent) == (sleeper.pid, "memory", "a")


# -- thrashing where MemAvailable looks fine ---------------------------------


def counters(ts: float, full_s: float, refault_pages: int, avail: float = 50) -> HostReading:
    return replace(
        reading(avail, 50, psi_full=0.0, ts=ts),
        psi_full_total=int(full_s * 1e6),
        refaults=refault_pages,
    )


def test_thrashing_triggers_on_stall_and_refaults_over_the_window() -> None:
    config = GuardConfig(thrash_seconds=5)
    per_s = int(0.02 * (8 << 30) / PAGE)  # 2 % of MemTotal a second
    clock = PressureClock(config)
    assert clock.update(counters(0, 0, 0)) is None
    assert clock.update(counters(3, 2.0, 3 * per_s)) is None  # not 5 s of it yet
    assert clock.update(counters(5, 3.0, 5 * per_s)) == "thrash"  # 60 % stalled, 2 %/s
    assert clock.crossed_at == 5
    # Stalled but nothing read back in (a CPU-bound reclaim, compaction): no.
    quiet = PressureClock(config)
    quiet.update(counters(0, 0, 0))
    assert quiet.update(counters(5, 4.0, 10)) is None
    # Reading back in at full speed but rarely stalled (a file scan): no.
    busy = PressureClock(config)
    busy.update(counters(0, 0, 0))
    assert busy.update(counters(5, 0.5, 50 * per_s)) is None
    # After a kill the window starts again: one squeeze, one kill.
    clock.restart(5.1)
    assert clock.update(counters(6, 3.6, 6 * per_s)) is None
    off = PressureClock(GuardConfig(thrash_full_percent=None))
    off.update(counters(0, 0, 0))
    assert off.update(counters(5, 5.0, 50 * per_s)) is None


def test_memory_gone_and_the_host_stalling_is_a_shortage_before_swap_fills() -> None:
    # Ubuntu's profile: a swap file, 50 % of it free. earlyoom's rule waits
    # for swap to fill; with MemAvailable at 8 % and PSI full 60 % of the
    # last second, the host is stalling now: the guard acts.
    config = GuardConfig()

    def host(ts: float, full_s: float, avail: float = 8) -> HostReading:
        return counters(ts, full_s, 0, avail=avail)

    clock = PressureClock(config)
    assert clock.update(host(0.0, 0.0)) is None  # no second of history yet
    assert clock.update(host(0.5, 0.3)) is None
    assert clock.update(host(1.0, 0.6)) == "memory"  # 60 % of the last second
    assert clock.crossed_at == 1.0
    # Stalling less than the thrash threshold: swap is doing its job.
    calm = PressureClock(config)
    calm.update(host(0.0, 0.0))
    assert calm.update(host(1.0, 0.3)) is None
    # Stalling with memory to spare is not this rule's (the thrash rule
    # wants refaults over its 5 s window).
    spare = PressureClock(config)
    spare.update(host(0.0, 0.0, avail=25))
    assert spare.update(host(1.0, 0.9, avail=25)) is None
    # After a kill the second starts again: one squeeze, one kill.
    clock.restart(1.05)
    assert clock.update(host(1.5, 0.9)) is None
    off = PressureClock(replace(config, thrash_full_percent=None))
    off.update(host(0.0, 0.0))
    assert off.update(host(1.0, 0.9)) is None


def test_memory_gone_and_swapping_out_with_stalls_is_a_shortage() -> None:
    # Ubuntu's profile as measured: MemAvailable gone, pages going out to the
    # swap file at 2 % of MemTotal a second, PSI full 15 % of the last
    # second: the guard acts, though swap is 80 % free.
    config = GuardConfig()
    per_s = int(0.02 * (8 << 30) / PAGE)

    def host(ts: float, full_s: float, out: int, avail: float = 8) -> HostReading:
        return replace(counters(ts, full_s, 0, avail=avail), swap_outs=out)

    clock = PressureClock(config)
    assert clock.update(host(0.0, 0.0, 0)) is None
    assert clock.update(host(1.0, 0.15, per_s)) == "memory"
    # Swapping out with hardly a stall: swap keeps up, it does its job.
    easy = PressureClock(config)
    easy.update(host(0.0, 0.0, 0))
    assert easy.update(host(1.0, 0.05, per_s)) is None
    # The same stall with nothing going out to swap (reclaim of page cache,
    # programs' code included): swap that takes nothing is no room, so the
    # rule for swap left unused holds (the next test).
    cache = PressureClock(config)
    cache.update(host(0.0, 0.0, 0))
    assert cache.update(host(1.0, 0.15, 0)) == "memory"
    # With memory to spare it is not this rule's.
    spare = PressureClock(config)
    spare.update(host(0.0, 0.0, 0, avail=30))
    assert spare.update(host(1.0, 0.15, per_s, avail=30)) is None


def test_memory_gone_with_swap_unused_is_a_shortage() -> None:
    # Ubuntu's profile as measured: MemAvailable falling through 10 % to 3 %,
    # the swap file empty and nothing going out to it, PSI at zero, every
    # sibling silent. Free swap the kernel does not use is no room: the guard
    # acts once MemAvailable has been at its threshold for a second.
    config = GuardConfig()
    per_s = int(0.02 * (8 << 30) / PAGE)  # 2 % of MemTotal a second

    def host(ts: float, avail: float, out: int = 0, swap: float = 97) -> HostReading:
        return replace(reading(avail, swap, psi_full=0.0, ts=ts), psi_full_total=0, swap_outs=out)

    clock = PressureClock(config)
    assert clock.update(host(0.0, 9.5)) is None  # no second of it yet
    assert clock.update(host(0.5, 8.0)) is None
    assert clock.update(host(1.0, 6.0)) == "memory"
    assert clock.crossed_at == 1.0
    # Above the threshold: nothing, however long.
    near = PressureClock(config)
    near.update(host(0.0, 10.5))
    assert near.update(host(1.0, 10.5)) is None
    # At the threshold only now, not a second ago: not yet.
    falling = PressureClock(config)
    falling.update(host(0.0, 12.0))
    assert falling.update(host(1.0, 9.0)) is None
    # Swap taking pages at 2 % of MemTotal a second: it does its job (the
    # stall rule decides whether the host pays for it).
    swapping = PressureClock(config)
    swapping.update(host(0.0, 9.0, out=0))
    assert swapping.update(host(1.0, 7.0, out=per_s)) is None
    # No swap at all: earlyoom's rule already held at 10 %.
    swapless = replace(host(0.0, 9.0), swap_total=0, swap_free=0)
    assert PressureClock(config).update(swapless) == "memory"
    # A kernel without the swap-out count: this rule cannot tell, so it waits.
    blind = PressureClock(config)
    blind.update(replace(host(0.0, 3.0), swap_outs=None))
    assert blind.update(replace(host(1.0, 3.0), swap_outs=None)) is None


def test_the_host_reader_counts_swap_outs_beside_refaults(tree: Tree) -> None:
    from tests.fakefs import make_meminfo

    make_meminfo(tree.proc, total_kb=8 * GIB_KB, available_kb=GIB_KB)
    write(tree.proc / "vmstat", "pswpin 3\npswpout 70\nworkingset_refault_anon 4\n")
    write(
        tree.proc / "pressure" / "memory",
        format_pressure((0, 0, 0, 10), (0, 0, 0, 5)),
    )
    reader = HostReader(tree.proc)
    try:
        got = reader.read(0.0)
    finally:
        reader.close()
    assert (got.refaults, got.swap_outs) == (7, 70)


# -- whose shortage ----------------------------------------------------------


def outside(tree: Tree, rel: str, mib: int, *, full: float = 0.0) -> Path:
    psi = format_pressure((full, full, 0, 0), (full, full, 0, 0))
    return make_cgroup(tree.cg, rel, current=mib << 20, pressure=psi)


def set_current(path: Path, mib: int) -> None:
    write(path / "memory.current", f"{mib << 20}\n")


def test_the_cgroups_outside_are_the_siblings_along_the_path(tree: Tree) -> None:
    outside(tree, "user.slice/user-1001.slice/session-3.scope", 100)
    outside(tree, "app.slice/app-firefox.scope", 100)
    outside(tree, "app.slice/app-agentscope.slice/agentscope-monitor.scope", 50)
    found = outside_cgroups(tree.cg, tree.slice)
    assert found is not None
    rel = sorted(os.path.relpath(p, tree.cg) for p in found)
    assert rel == [
        "app.slice/app-agentscope.slice/agentscope-monitor.scope",
        "app.slice/app-firefox.scope",
        "user.slice",
    ]
    assert outside_cgroups(tree.cg, Path("/elsewhere")) is None


def test_the_fastest_grower_outside_holds_the_kill(tree: Tree) -> None:
    tree.scope("a", {10: ("claude", 100, 100), 11: ("node", 900, 200)})
    set_current(tree.slice, 1000)
    hog = outside(tree, "user.slice/user-1001.slice/session-3.scope", 500)
    outside(tree, "user.slice/user-1001.slice/other.scope", 10)
    set_current(tree.cg / "user.slice", 510)
    set_current(tree.cg / "user.slice/user-1001.slice", 510)
    cause = CauseTracker(tree.cg, tree.slice)
    cause.sample(0.0)
    for cg in (hog, tree.cg / "user.slice", tree.cg / "user.slice/user-1001.slice"):
        set_current(cg, 3000 if cg == hog else 3010)
    blame = cause.blame(2.0, 8 << 30, None)
    assert not blame.fleet
    assert blame.reason == "growth"
    assert blame.culprit == "/user.slice/user-1001.slice/session-3.scope"
    assert blame.culprit_growth == 2500 << 20
    # The same hog standing still while the slice grows: the slice's doing.
    cause = CauseTracker(tree.cg, tree.slice)
    cause.sample(0.0)
    set_current(tree.slice, 2000)
    blame = cause.blame(2.0, 8 << 30, None)
    assert (blame.fleet, blame.reason, blame.slice_growth) == (True, "growth", 1000 << 20)


def test_with_no_growth_the_larger_decides(tree: Tree) -> None:
    set_current(tree.slice, 1000)
    outside(tree, "system.slice", 400)
    cause = CauseTracker(tree.cg, tree.slice)
    assert cause.blame(0.0, 8 << 30, None).fleet
    outside(tree, "system.slice", 4000)
    cause = CauseTracker(tree.cg, tree.slice)
    blame = cause.blame(0.0, 8 << 30, None)
    assert (blame.fleet, blame.reason, blame.culprit) == (False, "size", "/system.slice")


def test_a_hog_outside_the_slice_kills_no_agent_and_is_named_once(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("python3", 900, 200)})
    set_current(tree.slice, 910)
    outside(tree, "user.slice/user-1001.slice/session-3.scope", 6000)
    set_current(tree.cg / "user.slice", 6000)
    set_current(tree.cg / "user.slice/user-1001.slice", 6000)
    held: list[GuardHeld] = []
    got, stop = start_guard(tree, FAST, on_held=held.append)
    try:
        tree.host(5, 1)
        time.sleep(0.5)
    finally:
        stop()
    assert got == []
    assert sleeper.poll() is None
    (said,) = held  # once per squeeze, not at every reading
    assert said.culprit == "/user.slice/user-1001.slice/session-3.scope"
    assert said.culprit_bytes == 6000 << 20
    assert said.trigger == "memory"
    assert said.to_dict()["kind"] == "guard_held"


def test_another_users_self_throttled_cgroup_kills_no_agent(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # Host PSI full 66 % with 64 % available: a cgroup outside under its own
    # MemoryHigh. The agents idle (their PSI 0); the largest is a big tool call.
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("python3", 900, 200)})
    set_current(tree.slice, 910)
    outside(tree, "user.slice/user-1001.slice/build.scope", 48, full=70)
    outside(tree, "user.slice", 48, full=70)
    outside(tree, "user.slice/user-1001.slice", 48, full=70)
    held: list[GuardHeld] = []
    got, stop = start_guard(tree, replace(FAST, psi_full_seconds=0.05), on_held=held.append)
    try:
        tree.host(64, 50, psi_full=66)
        wait_until(lambda: len(held) == 1)
        time.sleep(0.2)
    finally:
        stop()
    assert got == []
    assert sleeper.poll() is None
    assert (held[0].reason, held[0].culprit) == (
        "pressure",
        "/user.slice/user-1001.slice/build.scope",
    )


# -- one guard per slice -----------------------------------------------------


def test_two_guards_on_one_squeeze_kill_one_process_and_a_standby_takes_over(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    first = sleeper.pid
    tree.scope("a", {1: ("claude", 10, 100), first: ("node", 900, 200)})
    kills: list[GuardKill] = []
    got_a, stop_a = start_guard(tree, FAST, on_kill=kills.append)
    time.sleep(0.2)  # a holds the lock
    got_b, stop_b = start_guard(tree, FAST, on_kill=kills.append)
    try:
        tree.host(5, 1)
        wait_until(lambda: len(kills) >= 1)
        time.sleep(0.5)  # both see the host short all along; the victim not reaped yet
        tree.host(40, 40)
        assert [k.pid for k in kills] == [first]
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        write(tree.slice / kills[0].unit / "cgroup.procs", "1\n")  # reaped: gone
        stop_a()
        # b takes over within a second of a's end.
        second = sleeper.start_another()  # type: ignore[attr-defined]
        tree.scope("b", {2: ("claude", 10, 100), second.pid: ("node", 900, 200)}, token="d4e5f6")
        started = time.monotonic()
        tree.host(5, 1)
        assert second.wait(WAIT) == -signal.SIGKILL
        assert time.monotonic() - started < 2.5  # retried every 1 s, plus a loaded host
    finally:
        stop_b()
    assert [k.pid for k in kills] == [first, second.pid]
    assert (len(got_a), len(got_b)) == (0, 0)  # (the kills went to kills)


def test_the_lock_is_per_slice_and_never_waits(tmp_path: Path) -> None:
    a = SliceLock(Path("/sys/fs/cgroup/x.slice"), tmp_path)
    b = SliceLock(Path("/sys/fs/cgroup/x.slice"), tmp_path)
    other = SliceLock(Path("/sys/fs/cgroup/y.slice"), tmp_path)
    assert a.try_acquire(0.0)
    assert not b.try_acquire(0.0)
    assert other.try_acquire(0.0)
    a.release()
    assert not b.try_acquire(0.5)  # retried at most once a second
    assert b.try_acquire(1.0)
    assert lock_name(Path("/a/x.slice")) != lock_name(Path("/b/x.slice"))
    alone = SliceLock(Path("/x"), None)
    assert alone.held
    assert alone.note is not None


# -- hidden memory, blind spots ----------------------------------------------


def test_a_process_whose_main_thread_exited_is_sized_by_its_threads(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # 11's main thread exited (zombie leader, no VmRSS), thread 12 holds 300 MiB;
    # 13 is a 128 MiB sibling. 11 is the runaway, not dying.
    tree.scope("a", {10: ("claude", 20, 100), 13: ("node", 128, 300)})
    base = make_proc(tree.proc, 11, comm="python3", start_time=200, state="Z", flags=0x4)
    write(base / "status", "Name:\tpython3\nState:\tZ (zombie)\nThreads:\t2\n")
    task = base / "task" / "12"
    task.mkdir(parents=True)
    write(
        task / "stat",
        (base / "stat").read_bytes().replace(b") Z ", b") R ").replace(b" 4 ", b" 0 "),
    )
    write(task / "status", f"Name:\tpython3\nVmRSS:\t{300 << 10} kB\nVmSwap:\t0 kB\n")
    write(tree.slice / "agentscope-f-a-a1b2c3.scope" / "cgroup.procs", "10\n11\n13\n")
    measured = measure(11, tree.proc)
    assert measured is not None
    assert measured[1] == 300 << 20
    assert not measured[0].dying
    procs = {p.pid: p for p in scan_slice_processes(tree.slice, tree.proc)}
    assert procs[11].size == 300 << 20
    assert procs[11].eligible


def test_one_cgroup_that_cannot_be_listed_costs_that_cgroup_only(tree: Tree) -> None:
    unit = tree.scope("a", {10: ("claude", 20, 100), 11: ("node", 900, 200)})
    threaded = make_cgroup(tree.cg, f"{SLICE}/{unit}/threads")
    (threaded / "cgroup.procs").unlink()
    (threaded / "cgroup.procs").mkdir()  # reading it fails (EISDIR here, EOPNOTSUPP there)
    skipped: list[str] = []
    procs = scan_slice_processes(tree.slice, tree.proc, on_skip=lambda p, e: skipped.append(p))
    assert {p.pid for p in procs} == {10, 11}
    assert skipped == [str(threaded)]


def test_the_kill_rechecks_that_the_victim_is_still_in_its_scope(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    unit = tree.scope("a", {sleeper.pid: ("node", 900, 200)})
    make_proc(tree.proc, sleeper.pid, start_time=200, cgroup="/user.slice/session-1.scope")
    slice_name = tree.slice.name
    assert _kill(sleeper.pid, 200, tree.proc, in_scope=(slice_name, unit)) is None
    assert sleeper.poll() is None
    make_proc(tree.proc, sleeper.pid, start_time=200, cgroup=f"/{SLICE}/{unit}/tools")
    killed = _kill(sleeper.pid, 200, tree.proc, in_scope=(slice_name, unit))
    assert killed is not None
    os.close(killed.pidfd)
    assert sleeper.wait(WAIT) == -signal.SIGKILL


def test_the_near_threshold_scan_reads_only_the_scopes_that_can_hold_the_largest(
    tree: Tree,
) -> None:
    units = [
        tree.scope(
            f"s{i}", {100 + 10 * i + j: ("sh", 5, 100 + j) for j in range(5)}, token=f"{i:06d}"
        )
        for i in range(20)
    ]
    runaway = tree.scope("big", {900: ("claude", 10, 100), 901: ("node", 900, 200)}, token="ffffaa")
    scan = scan_candidates(tree.slice, tree.proc, floor=80 << 20)
    assert scan.scanned == {runaway}
    assert {p.pid for p in scan.processes} == {900, 901}
    assert len(scan.scopes) == len(units) + 1


def test_a_guard_without_a_lock_directory_acts_alone(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("node", 900, 200)})
    got: list[GuardKill] = []
    r, w = os.pipe()
    thread = threading.Thread(
        target=run_guard,
        args=(FAST, tree.slice),
        kwargs={
            "stop_fd": r,
            "on_kill": got.append,
            "proc_root": tree.proc,
            "cgroup_root": tree.cg,
            "lock_dir": None,
        },
        daemon=True,
    )
    thread.start()
    try:
        tree.host(5, 1)
        assert sleeper.wait(WAIT) == -signal.SIGKILL
    finally:
        os.write(w, b"x")
        thread.join(WAIT)
        os.close(r)
        os.close(w)
    assert [k.pid for k in got] == [sleeper.pid]


# -- nothing a squeeze stalls between the decision and the kill -------------


def test_the_guard_process_never_blocks_on_a_parent_that_does_not_read() -> None:
    r, w = os.pipe()
    try:
        out = _Out(w)
        started = time.monotonic()
        for i in range(5000):  # far more than the pipe holds (64 KiB)
            out.write({"kill": {"pid": i, "pad": "x" * 200}})
        assert time.monotonic() - started < 2.5  # a blocking write would never return
        assert len(out.pending) == PENDING_MAX
        assert out.dropped > 0
        # The parent reads again: the queue drains.
        os.set_blocking(r, False)
        with contextlib.suppress(BlockingIOError):
            while os.read(r, 1 << 16):
                pass
        out.flush()
        assert out.pending == []
    finally:
        os.close(r)
        os.close(w)


def test_the_guard_process_imports_nothing_from_the_working_directory(
    tree: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "cwd"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "argparse.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    tree.host(50, 50)
    child = GuardChild(FAST, tree.slice, on_kill=lambda k: None, proc_root=tree.proc)
    child.start()
    try:
        assert child.running
        assert child._ready.wait(WAIT)
    finally:
        child.stop()
    assert not marker.exists()


async def test_a_hog_elsewhere_is_a_guard_held_event_of_the_monitor(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("python3", 900, 200)})
    set_current(tree.slice, 910)
    outside(tree, "system.slice", 6000)
    got: list[object] = []
    mon = Monitor(
        slice_path=tree.slice,
        unit_agent=unit_agent,
        interval=0.05,
        cgroup_root=tree.cg,
        proc_root=tree.proc,
        kmsg=None,
        on_event=got.append,
        guard=FAST,
    )
    async with mon:
        tree.host(5, 1)
        for _ in range(300):
            await asyncio.sleep(0.01)
            if any(isinstance(e, GuardHeld) for e in got):
                break
    held = [e for e in got if isinstance(e, GuardHeld)]
    assert [(h.culprit, h.reason) for h in held] == [("/system.slice", "size")]
    assert not any(isinstance(e, GuardKill) for e in got)
    assert sleeper.poll() is None


def test_memory_in_a_memfd_is_charged_to_the_process_that_holds_it(tree: Tree) -> None:
    # 2 GiB in a memfd nobody maps: charged to the scope (memory.stat shmem),
    # in no process's RSS. Its holder (a 30 MiB tool call) is the runaway,
    # not the 900 MiB process of another agent.
    unit = tree.scope("a", {10: ("claude", 20, 100), 11: ("node", 30, 200)}, hidden=2 << 30)
    write(tree.slice / unit / "memory.stat", f"anon {50 << 20}\nfile 0\nshmem {2 << 30}\n")
    (tree.proc / "11" / "fd").mkdir()
    os.symlink("/memfd:blob (deleted)", tree.proc / "11" / "fd" / "3")
    tree.scope("b", {20: ("claude", 10, 100), 21: ("python3", 900, 200)}, token="d4e5f6")
    scan = scan_candidates(tree.slice, tree.proc, floor=80 << 20)
    victim = choose_victim(scan.processes, 0.25)
    assert victim is not None
    assert (victim.process.pid, victim.process.hidden) == (11, 2 << 30)
    # The same memory in tmpfs files: held by no process, no kill frees it;
    # the largest process goes, and the scan says where the memory is.
    os.unlink(tree.proc / "11" / "fd" / "3")
    scan = scan_candidates(tree.slice, tree.proc, floor=80 << 20)
    victim = choose_victim(scan.processes, 0.25)
    assert victim is not None
    assert victim.process.pid == 21
    assert scan.unheld == (unit, 2 << 30)


# -- the registry out of reach -------------------------------------------------


def test_with_no_registry_the_guard_runs_alone_and_says_kills_are_not_recorded(
    tree: Tree, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    from agentscope_systemd._cli._cmd_monitor import _guard_alone, _Stop
    from agentscope_systemd._cli._notify import Notifier
    from agentscope_systemd._cli._options import Options

    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("node", 900, 200)})
    tree.host(5, 1)
    _guard_alone(
        Options(manager="user", fleet="f"),
        FAST,
        RegistryError("/x/registry.db", "database is locked"),
        0.05,
        Notifier({}),
        _Stop(),
        slice_path=tree.slice,
        proc_root=tree.proc,
        cgroup_root=tree.cg,
        until=lambda: sleeper.poll() is not None,
    )
    out = capsys.readouterr()
    assert "its kills are not being recorded" in out.err
    assert "database is locked" in out.err
    assert "guard_kill" in out.out
    assert f"pid={sleeper.pid}" in out.out
    assert sleeper.returncode == -signal.SIGKILL


def test_monitor_guard_falls_back_to_the_guard_alone_when_the_registry_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentscope_systemd._cli import _cmd_monitor, _fleet
    from agentscope_systemd._cli.main import main

    def broken(opts: object) -> object:
        raise RegistryError("/x/registry.db", "disk full")

    alone: list[str] = []
    monkeypatch.setattr(_fleet, "open_fleet", broken)
    monkeypatch.setattr(_cmd_monitor, "_guard_alone", lambda *a, **k: alone.append(str(a[2])))
    with pytest.raises(SystemExit) as done:
        main(["--manager", "user", "monitor", "--guard"])
    assert done.value.code == 0
    assert alone == ["disk full"]
    # Without the guard the monitor needs its registry: the error stands.
    with pytest.raises(SystemExit) as failed:
        main(["--manager", "user", "monitor"])
    assert failed.value.code != 0


def test_the_guard_ends_thrashing_with_memory_to_spare(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # 40 % available, swap half free: no memory trigger. But for 1.5 s every
    # task stalls 70 % of the time and 3 % of memory a second is read back in.
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("node", 900, 200)})
    per_s = 0.03 * 8_000_000 * 1024 / PAGE  # 3 % of MemTotal a second, in pages
    write(tree.proc / "vmstat", "nr_free_pages 1\nworkingset_refault_anon 0\npswpin 0\n")
    config = replace(FAST, thrash_seconds=1.0, psi_full_percent=None)
    got, stop = start_guard(tree, config)
    try:
        start = time.monotonic()
        while sleeper.poll() is None and time.monotonic() - start < WAIT:
            # The counters follow the wall clock (a loaded host's sleeps run long).
            elapsed = time.monotonic() - start
            stalled, refaulted = int(0.7 * elapsed * 1e6), int(per_s * elapsed)
            with KERNEL:
                tree.host(40, 50)
                make_host_pressure(
                    tree.proc, format_pressure((70, 0, 0, stalled), (70, 0, 0, stalled))
                )
                write(
                    tree.proc / "vmstat",
                    f"nr_free_pages 1\nworkingset_refault_anon {refaulted}\npswpin 0\n",
                )
            time.sleep(0.05)
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        wait_until(lambda: len(got) == 1)
    finally:
        stop()
    assert (got[0].pid, got[0].trigger) == (sleeper.pid, "thrash")


def test_a_kill_by_another_fleets_guard_is_told_by_the_agents_own_fleet(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    # Fleet x's guard acts for the slice; agent a is fleet f's. x kills a's
    # tool call (agent unknown to x); f's guard, standing by, tells it, named.
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("node", 900, 200)})
    by_x: list[GuardKill] = []
    by_f: list[GuardKill] = []

    def restore(kill: GuardKill) -> None:
        by_x.append(kill)
        tree.host(40, 40)

    _, stop_x = start_guard(tree, FAST, on_kill=restore, unit_agent=lambda unit: None)
    time.sleep(0.2)  # x holds the lock
    _, stop_f = start_guard(tree, FAST, on_kill=by_f.append)
    try:
        time.sleep(0.2)  # f stands by, and has looked at the kills so far (none)
        tree.host(5, 1)
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        wait_until(lambda: len(by_f) == 1)
        time.sleep(0.2)
    finally:
        stop_f()
        stop_x()
    assert [(k.pid, k.agent) for k in by_x] == [(sleeper.pid, None)]
    assert [(k.pid, k.agent, k.comm, k.trigger) for k in by_f] == [
        (sleeper.pid, "a", "node", "memory")
    ]


async def test_a_fleet_records_guard_kills_of_its_own_agents_only(fleet: AsyncFleet) -> None:
    def kill(agent: str | None) -> GuardKill:
        return GuardKill(
            ts=time.time(),
            agent=agent,
            unit="agentscope-o-x-000001.scope",
            pid=4242,
            comm="node",
            cmdline="node x",
            rss=900 << 20,
            swap=0,
            trigger="memory",
            mem_available_percent=5.0,
            swap_free_percent=1.0,
            psi_full_avg10=0.0,
            psi_some_avg10=0.0,
            reaction_seconds=0.01,
            released=True,
        )

    # Another fleet's agent, killed by this fleet's guard: that fleet records it.
    await fleet._monitors.record_event(kill(None))
    assert await fleet.events(kind="guard_kill") == []
    await fleet._monitors.record_event(kill("a"))
    assert [e.agent for e in await fleet.events(kind="guard_kill")] == ["a"]


def test_a_guard_process_standing_by_tells_its_fleets_kill_by_another_guard(
    tree: Tree, sleeper: subprocess.Popen[bytes]
) -> None:
    tree.scope("a", {1: ("claude", 10, 100), sleeper.pid: ("node", 900, 200)})
    by_x: list[GuardKill] = []
    by_f: list[GuardKill] = []

    def restore(kill: GuardKill) -> None:
        by_x.append(kill)
        tree.host(40, 40)

    _, stop_x = start_guard(tree, FAST, on_kill=restore, unit_agent=lambda unit: None)
    time.sleep(0.2)  # x holds the lock
    child = GuardChild(
        FAST,
        tree.slice,
        on_kill=by_f.append,
        unit_agent=unit_agent,
        proc_root=tree.proc,
        cgroup_root=tree.cg,
    )
    child.start()
    try:
        time.sleep(0.5)  # the child stands by, and has looked at the kills so far
        tree.host(5, 1)
        assert sleeper.wait(WAIT) == -signal.SIGKILL
        wait_until(lambda: len(by_f) == 1)
    finally:
        child.stop()
        stop_x()
    assert [(k.pid, k.agent) for k in by_x] == [(sleeper.pid, None)]
    assert [(k.pid, k.agent, k.trigger) for k in by_f] == [(sleeper.pid, "a", "memory")]


def test_who_grows_now_decides_not_who_grew_at_start(tree: Tree) -> None:
    # Agents took 144 MiB at start-up; seconds later a hog elsewhere fills the
    # host. Over the 10 s window the slice grew more than the hog's parent
    # (whose page cache was reclaimed as the hog grew); over the last seconds
    # only the hog grew.
    set_current(tree.slice, 100)
    sys_slice = outside(tree, "system.slice", 600)
    cause = CauseTracker(tree.cg, tree.slice)
    cause.sample(0.0)
    set_current(tree.slice, 244)
    cause.sample(2.0)
    set_current(sys_slice, 700)
    cause.sample(4.0)
    set_current(sys_slice, 720)
    blame = cause.blame(8.0, 768 << 20, None)
    assert (blame.fleet, blame.reason, blame.culprit) == (False, "growth", "/system.slice")
    # Over the last 4 s (the newest sample at least RECENT_WINDOW old): the hog's 20 MiB.
    assert (blame.culprit_growth, blame.slice_growth, blame.window) == (20 << 20, 0, 4.0)
    # The same start-up with nothing grown since: the 10 s window still speaks.
    cause = CauseTracker(tree.cg, tree.slice)
    set_current(tree.slice, 100)
    cause.sample(0.0)
    set_current(tree.slice, 244)
    cause.sample(2.0)
    blame = cause.blame(8.0, 768 << 20, None)
    assert (blame.fleet, blame.reason, blame.slice_growth) == (True, "growth", 144 << 20)
