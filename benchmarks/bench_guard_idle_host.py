"""The memory guard's idle cost, natively: one reading, and its thread over a minute.

Issue #20 asks the guard's idle cost at 50 agents to stay under 1% of one
core. Under TCG (bench_squeeze.py's idle measure) CPU costs are 20-30x
native, so that figure bounds the cost from above; this one measures it on
the host. Both sides in one run:

``step``
    one pass of the guard's loop (``_Loop.step``: /proc/meminfo and
    /proc/pressure/memory read and judged, the next interval chosen) on this
    host's real /proc, repeated ``--steps`` times; with the host far from
    its threshold the loop then sleeps ``max_interval`` (1 s), so the
    percentage of a core is the step's cost times the steps per second;
``thread``
    the real :class:`Guard` thread beside a fake agents slice of ``--agents``
    scopes of 10 processes (not scanned while the host is not short:
    that is the point), run ``--seconds`` in interleaved pairs with an idle
    baseline; the process's CPU time (getrusage) with the guard, less the
    baseline's, per second of wall time.

Run: ``python3 benchmarks/bench_guard_idle_host.py [--seconds 20] [--pairs 3]``
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentscope_systemd._guard._guard import _Loop
from agentscope_systemd._guard._guardlock import SliceLock
from agentscope_systemd._guard._guardpolicy import GuardConfig
from agentscope_systemd._guard._guardthread import Guard
from agentscope_systemd._kernel._proc import PROC_ROOT
from tests import fakefs


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _fake_slice(root: Path, agents: int) -> Path:
    slice_dir = root / "app-agentscope-agents.slice"
    for i in range(agents):
        fakefs.make_cgroup(slice_dir, f"agentscope-b-a{i}-{i:06x}.scope", procs=list(range(10)))
    return slice_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args()
    config = GuardConfig(lock_memory=False)
    with tempfile.TemporaryDirectory() as tmp:
        slice_dir = _fake_slice(Path(tmp), args.agents)
        loop = _Loop(
            config,
            slice_dir,
            PROC_ROOT,
            lambda u: None,
            lambda: ((), ()),
            print,
            None,
            cgroup_root=Path(tmp),
            lock=SliceLock(slice_dir, None),
        )
        timeout, _ = loop.step()
        start = time.perf_counter()
        for _ in range(args.steps):
            timeout, killed = loop.step()
            assert killed is None, "the host is short of memory: run this on an idle host"
        step = (time.perf_counter() - start) / args.steps
        print(f"step: {step * 1e6:.1f} us; the idle loop sleeps {timeout:.2f} s between steps")
        print(f"step cost at idle: {100 * step / timeout:.4f}% of one core")

        extra: list[float] = []
        for _ in range(args.pairs):
            c0, t0 = _cpu(), time.monotonic()
            time.sleep(args.seconds)
            base = (_cpu() - c0) / (time.monotonic() - t0)
            guard = Guard(
                config, slice_dir, on_kill=print, psi_trigger=False, cgroup_root=Path(tmp)
            )
            guard.start()
            try:
                c0, t0 = _cpu(), time.monotonic()
                time.sleep(args.seconds)
                with_guard = (_cpu() - c0) / (time.monotonic() - t0)
            finally:
                guard.stop()
            extra.append(100 * (with_guard - base))
            print(f"pair: baseline {100 * base:.4f}%, with the guard {100 * with_guard:.4f}%")
        extra.sort()
        print(
            f"guard thread at idle, {args.agents} agents: {extra[len(extra) // 2]:.4f}% of one core"
            f" (median of {args.pairs}; target < 1%)"
        )


if __name__ == "__main__":
    main()
