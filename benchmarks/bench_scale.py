"""A fleet at 50, 500 and 2,000 agents, launched with the default fd limit.

One fleet grows to each size in turn (``sleep 3600`` agents, stdio
``DEVNULL``, launched ``--batch`` at a time with ``asyncio.gather``); at each
size it measures what a harness pays for the fleet's size:

``launch``
    wall time per agent of the launches that brought it to this size;
``agents()``
    one ``fleet.agents()`` (median of 3), and its D-Bus calls;
``tick``
    the CPU time of one monitor sample (median of ``--ticks``, after a warm
    one), and the D-Bus calls of a tick;
``report``
    one ``fleet.report()``, wall and CPU;
``re-open``
    opening a second fleet object on the same registry (the reconciliation
    that adopts every agent), and its D-Bus calls.

Then the growth ratios 500/50 and 2000/500 of each figure (the sizes grow
10x and 4x: a ratio below those is growth below linear). The process's
``RLIMIT_NOFILE`` is left as it started (systemd's default soft limit is
1024): the library raises its own soft limit when its agents need it, and
the benchmark prints what it was and what it became. Needs a systemd host;
in the VM: ``integration/vm.py --memory 3G --run "python benchmarks/bench_scale.py"``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from agentscope_systemd import DEVNULL, Agent, AsyncFleet, SystemdTimeout
from agentscope_systemd._managers._bus import SystemdBus

T = TypeVar("T")
_calls = 0
_original_call = SystemdBus.call


async def _counting(self: SystemdBus, *args: Any, **kwargs: Any) -> list[Any]:
    global _calls
    _calls += 1
    return await _original_call(self, *args, **kwargs)


SystemdBus.call = _counting  # type: ignore[method-assign]


async def counted(fn: Callable[[], Awaitable[T]]) -> tuple[T, float, float, int]:
    """Run ``fn()``: its result, wall time, CPU time of this process, D-Bus calls."""
    global _calls
    _calls = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = await fn()
    return result, time.perf_counter() - wall0, time.process_time() - cpu0, _calls


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return -1


def nofile() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return f"{soft}/{hard}"


PROFILE = False


async def _profile_ticks(sample: Callable[[], Awaitable[object]]) -> None:
    """cProfile of three ticks, the worker thread's reads run inline so they are seen."""
    import cProfile
    import pstats

    real = asyncio.to_thread

    async def inline(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    asyncio.to_thread = inline  # type: ignore[assignment]
    profile = cProfile.Profile()
    try:
        profile.enable()
        for _ in range(3):
            await sample()
        profile.disable()
    finally:
        asyncio.to_thread = real
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


async def measure_size(
    fleet: AsyncFleet, db: Path, size: int, launch_s: float, ticks: int
) -> dict[str, float]:
    listings = [await counted(lambda: fleet.agents()) for _ in range(3)]
    listed = listings[-1][0]
    assert len(listed) == size, (len(listed), size)
    row: dict[str, float] = {
        "launch": launch_s,
        "agents": statistics.median(w for _, w, _, _ in listings),
        "agents_calls": listings[-1][3],
    }
    monitor = fleet.monitor(interval=3600.0, kmsg=None)
    async with monitor:
        await monitor._sample()  # warm: every scope seen, its watch set
        samples = [await counted(monitor._sample) for _ in range(ticks)]
        row["tick_cpu"] = statistics.median(c for _, _, c, _ in samples)
        row["tick_calls"] = max(n for *_, n in samples)
        row["tick_scopes"] = len(monitor._counter._scopes)
        if PROFILE:
            await _profile_ticks(monitor._sample)
    report, wall, cpu, calls = await counted(lambda: fleet.report())
    row["report"], row["report_cpu"], row["report_calls"] = wall, cpu, calls
    row["report_agents"] = len(report.agents)

    async def reopen() -> int:
        async with AsyncFleet(fleet.name, fleet.manager, registry=db) as again:
            return len(await again.agents())

    reopened, wall, _cpu, calls = await counted(reopen)
    assert reopened == size, (reopened, size)
    row["reopen"], row["reopen_calls"] = wall, calls - 1  # less the listing that checked it
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="50,500,2000")
    parser.add_argument("--batch", type=int, default=100, help="launches gathered at once")
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of three ticks at each size"
    )
    parser.add_argument("--manager", default="auto")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    sizes = [int(s) for s in args.sizes.split(",")]
    db = Path(tempfile.mkdtemp()) / "agentscope.db"
    name = f"sc{uuid.uuid4().hex[:6]}"
    start_limit = nofile()
    print(
        f"RLIMIT_NOFILE at start (soft/hard): {start_limit}; MemAvailable {mem_available_mib()} MiB"
    )
    rows: dict[int, dict[str, float]] = {}
    names: list[str] = []
    agents: list[Agent] = []
    async with AsyncFleet(name, args.manager, registry=db) as fleet:
        try:
            for size in sizes:
                t0 = time.perf_counter()
                todo = [f"a{i:04d}" for i in range(len(names), size)]
                for at in range(0, len(todo), args.batch):
                    batch = todo[at : at + args.batch]
                    agents += await asyncio.gather(
                        *(
                            fleet.launch(
                                n, ["sleep", "3600"], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL
                            )
                            for n in batch
                        )
                    )
                    names += batch
                launch_s = (time.perf_counter() - t0) / max(1, len(todo))
                rows[size] = await measure_size(fleet, db, size, launch_s, args.ticks)
                r = rows[size]
                print(
                    f"{fleet.manager} {size:5d} agents: launch {launch_s * 1e3:7.1f} ms/agent, "
                    f"agents() {r['agents']:6.2f} s ({r['agents_calls']:.0f} call), "
                    f"tick CPU {r['tick_cpu']:6.3f} s ({r['tick_calls']:.0f} calls, "
                    f"{r['tick_scopes']:.0f} scopes), "
                    f"report {r['report']:6.2f} s ({r['report_cpu']:.2f} s CPU, "
                    f"{r['report_calls']:.0f} calls, {r['report_agents']:.0f} agents), "
                    f"re-open {r['reopen']:6.2f} s ({r['reopen_calls']:.0f} calls); "
                    f"RLIMIT_NOFILE {nofile()}, MemAvailable {mem_available_mib()} MiB",
                    flush=True,
                )
        finally:
            # SIGKILL to each agent's only process, no D-Bus call: its scope
            # ends with it (the next manager's run needs the memory back).
            for agent in agents:
                if agent.popen is not None:
                    agent.popen.kill()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    if not await fleet._manager.list_scopes():
                        break
                except SystemdTimeout:
                    # Tearing down thousands of scopes, the manager answers
                    # late (measured: over 60 s at 2,000): ask again.
                    continue
                await asyncio.sleep(1)
    keys = ("launch", "agents", "tick_cpu", "report", "reopen")
    print(f"\n{fleet.manager} manager, RLIMIT_NOFILE {start_limit} at start ->", nofile())
    print("| agents | " + " | ".join(keys) + " |")
    for size, r in rows.items():
        print(f"| {size} | " + " | ".join(f"{r[k]:.3f} s" for k in keys) + " |")
    for small, big in itertools.pairwise(sizes):
        growth = ", ".join(f"{k} {rows[big][k] / max(rows[small][k], 1e-9):.2f}x" for k in keys)
        print(f"growth {big}/{small} (size {big / small:.0f}x): {growth}")


if __name__ == "__main__":
    asyncio.run(main())
