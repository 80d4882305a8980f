"""CPU cost of one Monitor sample against a naive scan, and report build time.

Needs a systemd host with cgroup v2 (run it in a VM): it launches a fleet of
``--agents`` agents (default 50), each ``sh`` with 9 ``sleep`` children (10
processes per agent, 500 in all), then measures

``monitor``
    one :class:`Monitor` sample (slice, scopes, ``statm`` of the scopes'
    processes, watch upkeep), repeated ``--ticks`` times;
``naive``
    ``psutil.process_iter`` over every process on the host, reading each
    ``/proc/PID/cgroup`` and the RSS of those in the agents slice: what a
    monitor without cgroup accounting would do per tick;
``report``
    one :meth:`Monitor.report` (host-wide /proc pass, smaps for the top 10);
``kills``
    OOM-kill-to-event latency over ``--kills`` kills (default 10): one agent
    capped at 64 MiB whose shell restarts a growing allocator each time the
    kernel kills it, while a thread polls the scope's ``memory.events``
    every 2 ms and notes when ``oom_kill`` rises; the latency of a kill is
    the time the monitor's :class:`OomKill` reached the caller less that.

CPU is whole-process time (``time.process_time``), so it includes the
worker thread the monitor reads in. It prints per-tick CPU of both, their
ratio, and the report's wall and CPU time; then stops the agents.

Run: ``python3 benchmarks/bench_monitor.py [--agents 50] [--ticks 200] [--manager auto]``

A harness may instead pass its own ``launch(name, argv) -> awaitable`` to
:func:`run` (the scopes must land in ``slice_path``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from agentscope_systemd import DEVNULL, AsyncFleet, OomKill
from agentscope_systemd._kernel._cgroup import (
    CGROUP_ROOT,
    cgroup_path_for_unit,
    user_manager_cgroup,
)
from agentscope_systemd._monitor._monitor import Monitor

FLEET = "bench"
TEN_PROCESSES = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9; do sleep 600 & done; wait"]
# Grows 16 MiB every 50 ms until the 64 MiB cap kills it; the shell restarts it.
GROW = "import time\nl = []\nwhile True:\n    l.append(b'x' * (16 << 20))\n    time.sleep(0.05)"
RUNAWAY = ["sh", "-c", f'while :; do python3 -c "{GROW}"; done']


def unit_agent(unit: str) -> str | None:
    """``agentscope-bench-NAME-1a2b3c.scope`` -> NAME."""
    prefix = f"agentscope-{FLEET}-"
    if not unit.startswith(prefix) or not unit.endswith(".scope"):
        return None
    return unit[len(prefix) : -len("-000000.scope")]


def naive_tick(slice_name: str) -> int:
    """The baseline: every process on the host, its cgroup, and the RSS of the agents'."""
    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{proc.pid}/cgroup", "rb") as f:
                cgroup = f.read()
            if slice_name.encode() in cgroup:
                total += proc.memory_info().rss
        except (psutil.Error, FileNotFoundError, ProcessLookupError):
            continue
    return total


async def measure(slice_path: Path, ticks: int) -> dict[str, Any]:
    monitor = Monitor(slice_path=slice_path, unit_agent=unit_agent, interval=3600.0, kmsg=None)
    async with monitor:
        await monitor._sample()  # warm: pids seen, watches set
        cpu = []
        for _ in range(ticks):
            start = time.process_time()
            await monitor._sample()
            cpu.append(time.process_time() - start)
        agents = len(monitor._counter._scopes)
        processes = sum(len(s.seen) for s in monitor._counter._scopes.values())
        wall0, cpu0 = time.perf_counter(), time.process_time()
        report = await monitor.report()
        report_wall, report_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    naive = []
    for _ in range(ticks):
        start = time.process_time()
        naive_tick(slice_path.name)
        naive.append(time.process_time() - start)
    return {
        "agents": agents,
        "processes": processes,
        "host_processes": len(psutil.pids()),
        "monitor_tick_cpu": statistics.median(cpu),
        "monitor_tick_cpu_mean": statistics.mean(cpu),
        "naive_tick_cpu": statistics.median(naive),
        "naive_tick_cpu_mean": statistics.mean(naive),
        "report_wall": report_wall,
        "report_cpu": report_cpu,
        "report_agents": len(report.agents),
    }


async def run(
    slice_path: Path,
    launch: Callable[[str, Sequence[str]], Awaitable[object]],
    *,
    agents: int = 50,
    ticks: int = 200,
) -> dict[str, Any]:
    """Launch ``agents`` agents through ``launch`` and measure; the caller stops them."""
    for i in range(agents):
        await launch(f"a{i:03d}", TEN_PROCESSES)
    await asyncio.sleep(1.0)  # let every sh fork its sleeps
    return await measure(slice_path, ticks)


class _KillTimes:
    """Polls a scope's memory.events from a thread; notes when each OOM kill is counted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen = 0
        while not self._stop.wait(0.002):
            try:
                text = self.path.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("oom_kill "):
                    count = int(line.split()[1])
                    self.times.extend([time.monotonic()] * (count - seen))
                    seen = max(seen, count)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def kill_latencies(
    fleet: AsyncFleet, slice_path: Path, kills: int
) -> tuple[list[float], list[str | None]]:
    """Seconds from each OOM kill being counted to its OomKill event, and the comms named."""
    received: list[float] = []
    comms: list[str | None] = []
    async with fleet.monitor(interval=2.0) as monitor:
        agent = await fleet.launch(
            "runaway", RUNAWAY, stdout=DEVNULL, stderr=DEVNULL, memory_max=64 << 20
        )
        clock = _KillTimes(slice_path / agent.unit / "memory.events")
        try:
            deadline = time.monotonic() + 60 + 10 * kills
            async for event in monitor:
                if isinstance(event, OomKill) and event.agent == "runaway":
                    received.append(time.monotonic())
                    comms.append(event.comm)
                    if len(received) >= kills:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(received)} of {kills} kills reported in time")
        finally:
            clock.stop()
            await fleet.stop("runaway", timeout=5)
    return [r - k for r, k in zip(received, clock.times, strict=False)], comms


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--manager", default="auto")
    parser.add_argument("--kills", type=int, default=10)
    args = parser.parse_args()
    async with AsyncFleet(FLEET, args.manager) as fleet:
        root = CGROUP_ROOT if fleet.manager == "system" else user_manager_cgroup(os.getuid())
        slice_path = cgroup_path_for_unit(root, fleet.slice)
        names: list[str] = []

        async def launch(name: str, argv: Sequence[str]) -> object:
            names.append(name)
            return await fleet.launch(
                name,
                argv,
                stdin=None,
                stdout=DEVNULL,
                stderr=DEVNULL,
            )

        try:
            result = await run(slice_path, launch, agents=args.agents, ticks=args.ticks)
            # The latency is measured with the 500-process fleet still up, as in production.
            latencies, comms = (
                await kill_latencies(fleet, slice_path, args.kills) if args.kills else ([], [])
            )
        finally:
            for name in names:
                try:
                    await fleet.stop(name, timeout=5)
                except Exception as exc:  # report and go on stopping the rest
                    print(f"could not stop {name}: {exc}")
    ratio = result["naive_tick_cpu"] / max(result["monitor_tick_cpu"], 1e-9)
    print(
        f"agents {result['agents']}, their processes {result['processes']}, "
        f"host processes {result['host_processes']}"
    )
    for side in ("monitor", "naive"):
        print(
            f"{side:<7} tick CPU  {result[f'{side}_tick_cpu'] * 1e3:8.3f} ms median, "
            f"{result[f'{side}_tick_cpu_mean'] * 1e3:8.3f} ms mean (of {args.ticks})"
        )
    mean_ratio = result["monitor_tick_cpu_mean"] / max(result["naive_tick_cpu_mean"], 1e-9)
    print(f"ratio monitor/naive {1 / ratio:6.3f}x median, {mean_ratio:6.3f}x mean (target <= 0.3x)")
    print(
        f"report build      {result['report_wall'] * 1e3:8.1f} ms wall, "
        f"{result['report_cpu'] * 1e3:.1f} ms CPU ({result['report_agents']} agents)"
    )
    if latencies:
        print(
            f"OOM kill to event: median {statistics.median(latencies) * 1e3:.0f} ms, "
            f"max {max(latencies) * 1e3:.0f} ms over {len(latencies)} kills "
            f"({', '.join(f'{x * 1e3:.0f}' for x in latencies)} ms)"
        )
        print(f"victims named: {sum(c is not None for c in comms)} of {len(comms)} ({comms})")


if __name__ == "__main__":
    asyncio.run(main())
