"""What a tool call costs: ``agentscope call -- true`` against ``sh -c true`` and ``exec``.

Run inside a VM of the test bed (``make bench BENCH=bench_call.py``) or on
any systemd host, as root (system manager) or as a user with a user
manager. It starts itself as an agent (``agentscope exec``) and, from inside
that agent, as an agent's tool would:

- ``--rounds`` interleaved rounds (the order rotating) of ``sh -c true``,
  ``agentscope call -- true`` and ``agentscope exec NAME -q -- true`` (each
  exec a new agent); medians, and the call's and exec's cost over the bare
  shell. The target (#26): a call's overhead no more than 1.5x exec's.
- ``--calls`` calls in a row: wall time, the ``call-*`` cgroups left in the
  agent's scope (0 expected), and the files of the registry's directory
  that changed: a call's two events wait in ``calls/`` until a registry
  transaction takes them in (at most ``WAITING_MAX`` of them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _scope_dir() -> Path:
    here = next(
        line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line[:3] == "0::"
    )
    return Path("/sys/fs/cgroup" + here).parent  # the agent leaf's parent: the scope


def _registry_files() -> dict[str, int]:
    """The sizes of the files in the registry's directory (the registry, its WAL, the spool)."""
    from agentscope_systemd import _names
    from agentscope_systemd._registry import _spool

    state = Path(_spool.state_dir(_names.resolve_manager("auto")))
    return {str(p.relative_to(state)): p.stat().st_size for p in state.rglob("*") if p.is_file()}


def inside(cli: str, fleet: str, rounds: int, calls: int) -> None:
    scope = _scope_dir()
    if not (scope / "agent").is_dir():
        print(f"not in a delegated scope ({scope}): calls are not isolated here", flush=True)
    kinds = {
        "sh -c true": lambda i: ["sh", "-c", "true"],
        "agentscope call -- true": lambda i: [cli, "call", "--", "true"],
        "agentscope exec -- true": lambda i: [
            cli,
            "--fleet",
            fleet,
            "exec",
            f"b{i}",
            "-q",
            "--",
            "true",
        ],
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    for i in range(rounds):
        for k in names[i % 3 :] + names[: i % 3]:
            times[k].append(_timed(kinds[k](i)))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["sh -c true"]
    print(f"median of {rounds} interleaved rounds (uid {os.getuid()})")
    for k, v in med.items():
        print(f"  {k:<26} {v * 1e3:8.1f} ms")
    call, execd = med["agentscope call -- true"] - base, med["agentscope exec -- true"] - base
    print(
        f"  call overhead {call * 1e3:.1f} ms, exec overhead {execd * 1e3:.1f} ms: "
        f"{call / execd:.2f}x (target <= 1.5x)"
    )
    before = _registry_files()
    t0 = time.perf_counter()
    for _ in range(calls):
        subprocess.run([cli, "call", "--name", "row", "--", "true"], check=True)
    took = time.perf_counter() - t0
    time.sleep(2)  # the last removers
    left = sorted(p.name for p in scope.iterdir() if p.is_dir() and p.name.startswith("call-"))
    after = _registry_files()
    print(
        f"{calls} calls in a row: {took:.1f}s ({took / calls * 1e3:.1f} ms each); "
        f"call cgroups left: {len(left)} {left[:5]}; registry directory "
        f"{sum(before.values())} -> {sum(after.values())} bytes"
    )
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            print(f"  {name}: {before.get(name, '-')} -> {after.get(name, '-')} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--inside", metavar="FLEET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cli = shutil.which("agentscope") or "agentscope"
    if args.inside:
        inside(cli, args.inside, args.rounds, args.calls)
        return
    fleet = f"bc{uuid.uuid4().hex[:6]}"
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--inside",
        fleet,
        "--rounds",
        str(args.rounds),
        "--calls",
        str(args.calls),
    ]
    subprocess.run(
        [cli, "--fleet", fleet, "exec", "caller", "-q", "--reap-after", "0", "--", *cmd], check=True
    )


if __name__ == "__main__":
    main()
