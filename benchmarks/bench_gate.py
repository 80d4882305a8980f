"""The launch gate: the compiled program against the Python one in ``preexec_fn``.

On the host (no systemd needed: the gate's own cost, without a scope):
``python benchmarks/bench_gate.py`` from a checkout where ``make gate`` built
the program. Each round spawns ``true`` at the gate, releases it and waits,
alternating the two gates so that both see the same load; it prints the
median milliseconds of each and their ratio, and the same for a spawn with
256 MiB more heap in this process (a preexec_fn fork copies the page
tables of the whole manager; the program's vfork does not).

In a VM of the test bed (``make bench BENCH=bench_gate.py``), where systemd
runs, it also times whole launches, ``launch(["true"])`` + ``wait()`` on one
open fleet, alternating the two gates in the same run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentscope_systemd._fleet import _spawn

N = int(os.environ.get("BENCH_N", "200"))


async def _one() -> float:
    t0 = time.perf_counter()
    child = await _spawn.spawn_gated(
        ["true"],
        cwd=None,
        env=None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        oom_score_adj=None,
    )
    popen = await child.release()
    await asyncio.to_thread(popen.wait)
    return (time.perf_counter() - t0) * 1000


async def _round(program: Path, rounds: int) -> tuple[float, float]:
    missing = program.with_name("no-gate-here")
    times: dict[Path, list[float]] = {program: [], missing: []}
    for _ in range(rounds):
        for which in (program, missing):
            _spawn._PROGRAM = which
            times[which].append(await _one())
    return statistics.median(times[program]), statistics.median(times[missing])


async def _launches(program: Path, rounds: int) -> tuple[float, float]:
    import uuid

    import agentscope_systemd

    missing = program.with_name("no-gate-here")
    times: dict[Path, list[float]] = {program: [], missing: []}
    async with agentscope_systemd.AsyncFleet(f"benchgate{uuid.uuid4().hex[:6]}") as fleet:
        for i in range(rounds):
            for which in (program, missing):
                _spawn._PROGRAM = which
                t0 = time.perf_counter()
                agent = await fleet.launch(f"g{i}-{which.name}", ["true"])
                await agent.wait()
                times[which].append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[program]), statistics.median(times[missing])


def _systemd() -> bool:
    return os.path.isdir("/run/systemd/system")


def main() -> None:
    program = _spawn._PROGRAM
    if _spawn.gate_program() is None:
        sys.exit(f"bench_gate: no program at {program}: run make gate first")
    print(f"bench_gate: {N} rounds, spawn + release + wait of true, both gates alternating")
    asyncio.run(_round(program, 10))  # warm up
    for label, ballast in (("this process as it is", 0), ("with 256 MiB more heap", 256)):
        heap = bytearray(ballast << 20)
        for i in range(0, len(heap), 4096):
            heap[i] = 1  # touched: the pages are this process's, as a busy manager's are
        compiled, python = asyncio.run(_round(program, N))
        print(
            f"  {label}: program {compiled:.2f} ms, preexec_fn {python:.2f} ms, "
            f"ratio {python / compiled:.2f}x"
        )
        del heap
    if _systemd():
        rounds = min(N, 50)
        compiled, python = asyncio.run(_launches(program, rounds))
        print(
            f"  launch + wait of true, {rounds} each: program {compiled:.1f} ms, "
            f"preexec_fn {python:.1f} ms, ratio {python / compiled:.2f}x"
        )


if __name__ == "__main__":
    main()
