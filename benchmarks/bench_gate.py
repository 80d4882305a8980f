"""The launch gate: the compiled program against the Python one in ``preexec_fn``.

Runs on the host (no systemd needed: the gate's own cost, without a scope):
``python benchmarks/bench_gate.py`` from a checkout where ``make gate`` built
the program. Each round spawns ``true`` at the gate, releases it and waits,
alternating the two gates so that both see the same load; it prints the
median milliseconds of each and their ratio, and the same for a spawn with
256 MiB more heap in this process (a preexec_fn fork copies the page
tables of the whole manager; the program's vfork does not).
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


if __name__ == "__main__":
    main()
