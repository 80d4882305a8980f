"""Measure the registry under concurrent writers, and its open cost.

Usage::

    python benchmarks/bench_registry.py [--workers 4] [--writes 250] [--timeout 5]

Each worker is a separate process opening its own Registry; they start
writing together (mix: record_launch, record_event + set_state). Prints
throughput, per-write latency percentiles, busy retries and errors seen,
then how long opening a registry of realistic size takes (quick_check
included).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentscope_systemd._registry import _registry, _registry_file, _registry_schema
from agentscope_systemd._registry._registry import Registry


def worker(path: str, w: int, writes: int, timeout: float, go: str, out: str) -> None:
    retries = 0
    real = _registry._retry_busy

    def counting(op, deadline, **kw):  # type: ignore[no-untyped-def]
        def counted():  # type: ignore[no-untyped-def]
            nonlocal retries
            try:
                return op()
            except sqlite3.OperationalError as exc:
                retries += _registry_file._is_busy(exc)
                raise

        return real(counted, deadline, **kw)

    # Every caller of the retry: the transactions and the schema set-up.
    _registry._retry_busy = _registry_schema._retry_busy = counting  # type: ignore[assignment]
    lat: list[float] = []
    errors: list[str] = []
    while not os.path.exists(go):
        time.sleep(0.0005)
    t0 = time.perf_counter()
    with Registry(path, timeout=timeout) as reg:
        for i in range(writes):
            s = time.perf_counter()
            try:
                if i % 2 == 0:
                    reg.record_launch("b", f"w{w}-{i}", f"u-{w}-{i}", i, i, ["x"], "/")
                else:
                    reg.record_event("b", f"w{w}-{i - 1}", "tick", {"i": i})
                    reg.set_state(f"u-{w}-{i - 1}", "running")
            except Exception as exc:
                errors.append(repr(exc))
            lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    Path(out).write_text(
        json.dumps({"lat": lat, "errors": errors, "retries": retries, "wall": wall})
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--writes", type=int, default=250)
    ap.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "agentscope", "agentscope.db")
        go = os.path.join(tmp, "go")
        ctx = mp.get_context("spawn")
        outs = [os.path.join(tmp, f"out{w}.json") for w in range(args.workers)]
        procs = [
            ctx.Process(target=worker, args=(db, w, args.writes, args.timeout, go, outs[w]))
            for w in range(args.workers)
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)
        t0 = time.perf_counter()
        Path(go).touch()
        for p in procs:
            p.join()
        wall = time.perf_counter() - t0
        res = [json.loads(Path(o).read_text()) for o in outs if os.path.exists(o)]
        if len(res) < len(outs):
            print(f"{len(outs) - len(res)} of {len(outs)} workers died (see their tracebacks)")
        lat = sorted(x for r in res for x in r["lat"]) or [0.0, 0.0]
        errors = [e for r in res for e in r["errors"]]
        with Registry(db) as reg:
            n_agents = len(reg.agents("b"))
            n_events = len(reg.events("b"))
        calls = len(lat)
        q = statistics.quantiles(lat, n=100)
        print(f"{args.workers} workers x {args.writes} calls, busy timeout {args.timeout:g} s")
        print(f"  wall {wall:.2f} s, {calls / wall:.0f} calls/s ({calls} calls)")
        print(
            f"  latency p50 {q[49] * 1e3:.2f} ms, p99 {q[98] * 1e3:.2f} ms, "
            f"max {lat[-1] * 1e3:.1f} ms"
        )
        print(f"  busy retries {sum(r['retries'] for r in res)}, errors {len(errors)}")
        for e in sorted(set(errors))[:3]:
            print(f"    {e}")
        expected = args.workers * args.writes // 2
        print(f"  rows: agents {n_agents}/{expected}, events {n_events}/{expected}")

        big = os.path.join(tmp, "big.db")
        with Registry(big) as reg:
            for i in range(2000):
                reg.record_launch("b", f"a{i}", f"u{i}", i, i, ["claude", "-p", "x" * 100], "/")
            for i in range(20000):
                reg.record_event("b", f"a{i % 2000}", "tick", {"i": i, "pad": "y" * 80})
        size = os.path.getsize(big)
        t = time.perf_counter()
        for _ in range(10):
            Registry(big).close()
        print(
            f"open (quick_check) of a {size / 1e6:.1f} MB registry "
            f"(2000 agents, 20000 events): {(time.perf_counter() - t) / 10 * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
