"""Overhead of LoopWatchdog on a busy event loop.

Runs a chain of 100k small callbacks (each schedules the next, so the loop
turns 100k times) in three set-ups, rotating their order over several
repetitions so drift on a shared machine hits all alike:

``bare``
    no watchdog, and nothing else: no pending timer, no other thread.
``harness``
    no watchdog, but what any real harness already has: one pending timer
    (a sleep or a timeout somewhere) and one idle thread (an executor, a
    logging or D-Bus thread). asyncio peeks at its timer heap on every turn
    once any timer is pending, and a second thread in the process costs the
    loop thread a little too; those costs are not the watchdog's.
``watchdog``
    a default :class:`LoopWatchdog` (one heartbeat timer, one watcher thread).

It prints the times and the median over repetitions of the per-repetition
ratios ``watchdog / harness`` and ``watchdog / bare``.

Run: ``.venv/bin/python benchmarks/bench_watchdog.py [--callbacks N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from typing import NamedTuple

from agentscope.watchdog import LoopWatchdog


class Timing(NamedTuple):
    """Wall and whole-process CPU seconds of one run."""

    wall: float
    cpu: float


async def callback_chain(n: int) -> Timing:
    """Run ``n`` chained callbacks on the running loop and time them.

    CPU time is the whole process's, so it includes the watchdog's thread;
    it is also steadier than wall time on a machine shared with VMs.
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    count = 0
    checksum = 0

    def step() -> None:
        nonlocal count, checksum
        count += 1
        checksum = (checksum * 31 + count) & 0xFFFF  # a little real work per callback
        if count < n:
            loop.call_soon(step)
        else:
            done.set_result(None)

    wall, cpu = time.perf_counter(), time.process_time()
    loop.call_soon(step)
    await done
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


async def bare(n: int) -> Timing:
    return await callback_chain(n)


async def harness(n: int) -> Timing:
    loop = asyncio.get_running_loop()
    timer = loop.call_later(3600, lambda: None)
    idle = threading.Event()
    thread = threading.Thread(target=idle.wait, name="idle")
    thread.start()
    try:
        return await callback_chain(n)
    finally:
        idle.set()
        thread.join()
        timer.cancel()


async def watchdog(n: int) -> Timing:
    async with LoopWatchdog():
        # Let the first heartbeat run so the watchdog is fully up when timing.
        await asyncio.sleep(0.06)
        return await callback_chain(n)


SETUPS: dict[str, Callable[[int], Coroutine[None, None, Timing]]] = {
    "bare": bare,
    "harness": harness,
    "watchdog": watchdog,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callbacks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    asyncio.run(bare(10_000))  # warm up imports and caches
    runs: dict[str, list[Timing]] = {name: [] for name in SETUPS}
    names = list(SETUPS)
    for i in range(args.repeat):
        # Rotate the order so no set-up always runs in the same slot.
        for name in names[i % 3 :] + names[: i % 3]:
            runs[name].append(asyncio.run(SETUPS[name](args.callbacks)))

    print(f"{args.callbacks} chained callbacks, {args.repeat} repetitions each")
    for name, timings in runs.items():
        walls = [t.wall for t in timings]
        cpus = [t.cpu for t in timings]
        print(
            f"{name:<9} wall median {statistics.median(walls) * 1e3:7.2f} ms "
            f"min {min(walls) * 1e3:7.2f} ms | cpu median {statistics.median(cpus) * 1e3:7.2f} ms "
            f"min {min(cpus) * 1e3:7.2f} ms"
        )
    for base in ("harness", "bare"):
        # Ratios within each repetition, then their median: robust to drift
        # in machine load over the run.
        pairs = list(zip(runs["watchdog"], runs[base], strict=True))
        wall = statistics.median(w.wall / b.wall for w, b in pairs)
        cpu = statistics.median(w.cpu / b.cpu for w, b in pairs)
        print(f"ratio watchdog/{base:<8} wall {wall:.4f}  cpu {cpu:.4f}")


if __name__ == "__main__":
    main()
