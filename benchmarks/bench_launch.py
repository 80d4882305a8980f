"""Launch latency: agentscope against systemd-run --scope, in one run.

Run inside a VM of the test bed (``make bench BENCH=bench_launch.py``), or on
any systemd host. Both sides start the same command (``true``) and are timed
from the call until the started process has exited: agentscope's
``launch()`` + ``wait()`` on one open connection, against a fresh
``systemd-run --scope [--user] -q true``. Prints medians and their ratio,
then 100 concurrent launches: wall time and the event loop's worst lag,
measured by a 10 ms ticker task.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

import agentscope

N = int(os.environ.get("BENCH_N", "50"))


async def _agentscope(fleet: agentscope.AsyncFleet, n: int) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        agent = await fleet.launch(f"b{i}", ["true"])
        await agent.wait()
        times.append(time.perf_counter() - t0)
    return times


def _systemd_run(manager: str, n: int) -> list[float]:
    cmd = ["systemd-run", *(["--user"] if manager == "user" else []), "--scope", "-q", "true"]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


async def _concurrent(fleet: agentscope.AsyncFleet, n: int) -> tuple[float, float]:
    worst = 0.0
    stop = False

    async def ticker() -> None:
        nonlocal worst
        loop = asyncio.get_running_loop()
        while not stop:
            t = loop.time()
            await asyncio.sleep(0.01)
            worst = max(worst, loop.time() - t - 0.01)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    agents = await asyncio.gather(*(fleet.launch(f"c{i}", ["sleep", "60"]) for i in range(n)))
    wall = time.perf_counter() - t0
    stop = True
    await tick
    await asyncio.gather(*(fleet.kill(a.name, 9) for a in agents))
    return wall, worst


async def main() -> None:
    async with agentscope.AsyncFleet(f"bench{uuid.uuid4().hex[:6]}") as fleet:
        manager = fleet.manager
        await _agentscope(fleet, 3)  # warm up: slice check, first D-Bus round trips
        _systemd_run(manager, 3)
        ours = statistics.median(await _agentscope(fleet, N))
        theirs = statistics.median(_systemd_run(manager, N))
        version = fleet.systemd_version
        print(f"launch latency ({manager} manager, systemd {version}, median of {N}):")
        print(f"  agentscope launch+wait   {ours * 1000:8.1f} ms")
        print(f"  systemd-run --scope true {theirs * 1000:8.1f} ms")
        print(f"  ratio                    {ours / theirs:8.2f}x  (target <= 0.35x)")
    async with agentscope.AsyncFleet(f"bench{uuid.uuid4().hex[:6]}") as fleet:
        await _agentscope(fleet, 1)
        wall, lag = await _concurrent(fleet, 100)
        print(f"100 concurrent launches: {wall:.2f} s wall, worst loop lag {lag * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
