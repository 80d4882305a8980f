"""Overhead of LoopWatchdog on a busy event loop.

Runs a chain of 100k small callbacks (each schedules the next, so the loop
turns 100k times) in three set-ups, as interleaved rounds: one run of each
set-up back to back, the order rotating from round to round (A B C, B C A,
C A B, ...) so drift in machine load and any slot effect hit all alike.

``bare``
    no watchdog and no other thread: a fresh loop with nothing pending.
``executor``
    no watchdog, but one idle worker thread, as any harness has once it has
    called ``asyncio.to_thread``, ``run_in_executor`` or resolved a host
    name (asyncio's default executor keeps its worker). A second live
    thread, even one blocked for good, makes the loop's ``epoll_wait``
    calls dearer (measured here: 2-3 % of this chain; the cost goes away
    when the thread exits), a price of threads, not of the watchdog.
``watchdog``
    ``bare`` inside ``async with LoopWatchdog()`` (default settings; the
    watchdog is up and its first heartbeat has run before timing starts).

All three spend the same 0.1 s on the loop before timing. Each run is timed
by wall clock (``perf_counter``) and by whole-process CPU time
(``process_time``, which includes the watchdog's thread: its cost is
counted, not hidden on the other core).

Printed: per set-up the median and interquartile range (IQR) of wall and
CPU times; then, for ``watchdog`` against each baseline, the ratio of the
medians and the per-round ratio: its median, IQR, and a distribution-free
95 % confidence interval of that median (order statistics of the binomial
distribution, no normality assumed). ``watchdog / executor`` is the
watchdog's own cost; ``watchdog / bare`` adds the price of a second thread.

Run (pinning to one core and lowering priority make it steadier on a shared
machine, and pinning makes the watchdog's thread compete with the loop for
the same core, the worst case)::

    taskset -c 0 nice -n 5 .venv/bin/python benchmarks/bench_watchdog.py
    .venv/bin/python benchmarks/bench_watchdog.py --callbacks 100000 --rounds 60
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import NamedTuple

from agentscope_systemd.watchdog import LoopWatchdog

SETTLE = 0.1  # seconds on the loop before timing, in every set-up


class Timing(NamedTuple):
    """Wall and whole-process CPU seconds of one run."""

    wall: float
    cpu: float


async def callback_chain(n: int) -> Timing:
    """Run ``n`` chained callbacks on the running loop and time them."""
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
    await asyncio.sleep(SETTLE)
    return await callback_chain(n)


async def executor(n: int) -> Timing:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, int)  # leaves the default executor's worker idle
    await asyncio.sleep(SETTLE)
    return await callback_chain(n)


async def watchdog(n: int) -> Timing:
    async with LoopWatchdog() as wd:
        await asyncio.sleep(SETTLE)
        timing = await callback_chain(n)
    if wd.last_lag is None:
        raise RuntimeError("the watchdog's heartbeat never ran: nothing was measured")
    return timing


SETUPS: dict[str, Callable[[int], Coroutine[None, None, Timing]]] = {
    "bare": bare,
    "executor": executor,
    "watchdog": watchdog,
}


def run_once(name: str, n: int) -> Timing:
    gc.collect()  # start each run with the same heap, not the last run's garbage
    return asyncio.run(SETUPS[name](n))


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Return the first quartile, median and third quartile of ``values``."""
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of ``values``.

    The k-th smallest and k-th largest values bound the median with
    probability ``1 - 2 * P(Binomial(n, 1/2) < k)``; ``k`` is the largest
    for which that is at least ``confidence``.
    """
    ordered = sorted(values)
    n = len(ordered)
    k, tail = 0, 0.0
    while True:
        next_tail = tail + math.comb(n, k) / 2**n
        if 1 - 2 * next_tail < confidence:
            break
        tail, k = next_tail, k + 1
    if k == 0:
        return ordered[0], ordered[-1]  # too few values for this confidence
    return ordered[k - 1], ordered[n - k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callbacks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--only",
        choices=list(SETUPS),
        help="run one set-up once, untimed (for counting instructions under callgrind)",
    )
    args = parser.parse_args()
    if args.only:
        run_once(args.only, args.callbacks)
        return

    for name in SETUPS:  # warm up imports, caches and the thread machinery
        run_once(name, args.callbacks // 10)
    runs: dict[str, list[Timing]] = {name: [] for name in SETUPS}
    names = list(SETUPS)
    for i in range(args.rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(run_once(name, args.callbacks))

    print(f"{args.callbacks} chained callbacks, {args.rounds} rounds of interleaved runs")
    medians: dict[str, Timing] = {}
    for name, timings in runs.items():
        wq = quartiles([t.wall for t in timings])
        cq = quartiles([t.cpu for t in timings])
        medians[name] = Timing(wq[1], cq[1])
        print(
            f"{name:<9} wall median {wq[1] * 1e3:7.2f} ms (IQR {wq[0] * 1e3:.2f}-{wq[2] * 1e3:.2f})"
            f" | cpu median {cq[1] * 1e3:7.2f} ms (IQR {cq[0] * 1e3:.2f}-{cq[2] * 1e3:.2f})"
        )
    for base in ("executor", "bare"):
        rounds = list(zip(runs["watchdog"], runs[base], strict=True))
        for field in Timing._fields:
            of_medians = getattr(medians["watchdog"], field) / getattr(medians[base], field)
            ratios = [getattr(w, field) / getattr(b, field) for w, b in rounds]
            q1, q2, q3 = quartiles(ratios)
            low, high = median_ci(ratios)
            print(
                f"watchdog/{base:<8} {field:<4} ratio of medians {of_medians:.4f} | per round: "
                f"median {q2:.4f} IQR {q1:.4f}-{q3:.4f} 95% CI of median {low:.4f}-{high:.4f}"
            )


if __name__ == "__main__":
    main()
