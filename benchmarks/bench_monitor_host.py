"""CPU cost of one Monitor tick against a naive /proc scan, on a fake tree (no VM needed).

Builds, with the ``tests/fakefs.py`` helpers, a fake cgroupfs and /proc in a
temporary directory: ``--agents`` scopes (default 50) of ``--procs``
processes each (default 10), plus ``--others`` processes that belong to no
agent (default 91: 591 processes in all, as in the VM run of
``bench_monitor.py``). Then it measures

``monitor``
    one :meth:`Monitor._sample` (what one ``interval`` tick does), repeated
    ``--ticks`` times after a warm-up sample;
``naive``
    every pid in the fake /proc: its ``cgroup`` and ``statm`` read and
    parsed, what a monitor without cgroup accounting does per tick.

``--churn F`` changes ``memory.current`` of a fraction F of the scopes by
5% before each tick (agents that allocate), so the per-process pass those
scopes trigger is counted too. CPU is whole-process time
(``time.process_time``), so it includes the worker thread the monitor reads
in. ``--profile`` prints the top of a cProfile of the monitor's ticks.

Run: ``python3 benchmarks/bench_monitor_host.py [--ticks 200] [--churn 0.1] [--profile]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentscope_systemd._monitor import _monitor
from agentscope_systemd._monitor._monitor import Monitor
from tests.fakefs import (
    PAGE,
    format_pressure,
    make_cgroup,
    make_cgroup_root,
    make_host_pressure,
    make_meminfo,
    make_proc,
    write,
)

SLICE = "app.slice/app-agentscope.slice/app-agentscope-agents.slice"
PREFIX = "agentscope-bench-"


def unit_agent(unit: str) -> str | None:
    """``agentscope-bench-NAME-1a2b3c.scope`` -> NAME."""
    if not unit.startswith(PREFIX) or not unit.endswith(".scope"):
        return None
    return unit[len(PREFIX) : -len("-000000.scope")]


def build_tree(root: Path, agents: int, procs: int, others: int) -> tuple[Path, Path, list[Path]]:
    """The fake hierarchy: (cgroup root, proc root, scope paths)."""
    cg = make_cgroup_root(root / "cg")
    make_cgroup(cg, "app.slice")
    make_cgroup(cg, "app.slice/app-agentscope.slice")
    make_cgroup(cg, SLICE)
    proc = root / "proc"
    make_meminfo(proc)
    make_host_pressure(proc, format_pressure((0, 0, 0, 0), (0, 0, 0, 0)))
    scopes = []
    pid = 1000
    for a in range(agents):
        unit = f"{PREFIX}agent{a}-{a:06x}.scope"
        pids = []
        for _ in range(procs):
            make_proc(proc, pid, comm="sleep", rss_pages=200, cgroup=f"/{SLICE}/{unit}")
            pids.append(pid)
            pid += 1
        scopes.append(
            make_cgroup(cg, f"{SLICE}/{unit}", current=procs * 200 * PAGE, procs=pids, peak=1 << 24)
        )
    for i in range(others):
        make_proc(proc, 10 + i, comm="systemd" if i == 0 else f"daemon{i}", rss_pages=1000)
    return cg, proc, scopes


def naive_tick(proc_root: Path, slice_name: bytes) -> int:
    """The baseline: every pid in /proc, its cgroup, and its statm."""
    total = 0
    with os.scandir(proc_root) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"{entry.path}/cgroup", "rb") as f:
                    cgroup = f.read()
                with open(f"{entry.path}/statm", "rb") as f:
                    rss = int(f.read().split()[1]) * PAGE
            except (FileNotFoundError, ProcessLookupError):
                continue
            if slice_name in cgroup:
                total += rss
    return total


def churn(scopes: list[Path], fraction: float, rng: random.Random) -> None:
    """Grow a fraction of the scopes' memory.current by 5% (agents allocating)."""
    for scope in rng.sample(scopes, round(len(scopes) * fraction)):
        current = int((scope / "memory.current").read_bytes())
        write(scope / "memory.current", f"{current * 105 // 100}\n")


async def measure_monitor(
    cg: Path, proc: Path, scopes: list[Path], ticks: int, fraction: float, profile: bool
) -> list[float]:
    monitor = Monitor(
        slice_path=cg / SLICE,
        unit_agent=unit_agent,
        interval=3600.0,
        cgroup_root=cg,
        proc_root=proc,
        kmsg=None,
    )
    rng = random.Random(1)
    cpu = []
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        # The reads run in a worker thread, which the loop's profiler does not see.
        collect = _monitor._collect

        def profiled(*args: Any) -> Any:
            return profiler.runcall(collect, *args)

        _monitor._collect = profiled  # type: ignore[assignment]
    async with monitor:
        await monitor._sample()  # warm: pids seen, watches set
        for _ in range(ticks):
            if fraction:
                churn(scopes, fraction, rng)
            start = time.process_time()
            await monitor._sample()
            cpu.append(time.process_time() - start)
        assert monitor.failures == 0
        assert len(monitor._counter._scopes) == len(scopes)
    if profiler is not None:
        _monitor._collect = collect  # type: ignore[assignment]
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return cpu


def measure_naive(proc: Path, ticks: int) -> list[float]:
    cpu = []
    naive_tick(proc, b"app-agentscope-agents.slice")
    for _ in range(ticks):
        start = time.process_time()
        naive_tick(proc, b"app-agentscope-agents.slice")
        cpu.append(time.process_time() - start)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--procs", type=int, default=10)
    parser.add_argument("--others", type=int, default=91)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--churn", type=float, default=0.0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        cg, proc, scopes = build_tree(Path(tmp), args.agents, args.procs, args.others)
        naive = measure_naive(proc, args.ticks)
        mon = asyncio.run(measure_monitor(cg, proc, scopes, args.ticks, args.churn, args.profile))
    n_mon, n_naive = statistics.mean(mon), statistics.mean(naive)
    processes = args.agents * args.procs + args.others
    print(f"tree: {args.agents} scopes x {args.procs} processes, {processes} processes in all")
    print(f"ticks: {args.ticks}, churn: {args.churn:.0%} of scopes grow per tick")
    print(f"monitor CPU per tick: {n_mon * 1e3:.2f} ms (median {statistics.median(mon) * 1e3:.2f})")
    print(
        f"naive   CPU per tick: {n_naive * 1e3:.2f} ms "
        f"(median {statistics.median(naive) * 1e3:.2f})"
    )
    print(f"ratio monitor/naive: {n_mon / n_naive:.2f}x")


if __name__ == "__main__":
    main()
