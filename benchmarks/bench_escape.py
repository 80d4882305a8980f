"""CPU cost of the escape audit, against the sample it rides on.

Needs a systemd host with cgroup v2 (run it in a VM): it launches
``--agents`` agents (default 50), each ``sh`` with 9 ``sleep`` children (10
processes per agent), one of which per agent runs ``systemd-run --scope``
(``--user`` under the user manager) so the audit has escapees to find and
follow, then measures, alternating, ``--ticks`` times each:

``sample``
    one monitor tick (``Monitor._sample``) between audits;
``sample+audit``
    one tick that also runs the escape audit (every ``ESCAPE_AUDIT_EVERY``
    seconds in a running monitor), following the escapees found.

CPU is ``time.process_time``. It prints the median of both and their ratio,
and the audit's own share per agent; then stops the agents.

Run: ``python3 benchmarks/bench_escape.py [--agents 50] [--ticks 100] [--manager auto]``
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from agentscope_systemd import DEVNULL, AsyncFleet
from agentscope_systemd._monitor._monitor import Monitor

FLEET = "benchesc"


def agent_argv(manager: str, unit: str) -> list[str]:
    user = "--user " if manager == "user" else ""
    escape = f"systemd-run {user}--scope --quiet --unit={unit} sleep 600 &"
    return ["sh", "-c", f"{escape} for i in 1 2 3 4 5 6 7 8; do sleep 600 & done; wait"]


async def measure(slice_path: Path, ticks: int) -> dict[str, Any]:
    monitor = Monitor(slice_path=slice_path, unit_agent=lambda u: u, interval=3600.0, kmsg=None)
    async with monitor:  # the baseline sample audits: escapees found, pids seen
        escapees = len(monitor._escapes.current)
        plain, audited = [], []
        for _ in range(ticks):
            monitor._next_audit = math.inf  # a tick between audits
            start = time.process_time()
            await monitor._sample()
            plain.append(time.process_time() - start)
            monitor._next_audit = 0.0  # a tick that audits
            start = time.process_time()
            await monitor._sample()
            audited.append(time.process_time() - start)
    return {
        "escapees": escapees,
        "sample_cpu": statistics.median(plain),
        "sample_audit_cpu": statistics.median(audited),
        "ratio": statistics.median(audited) / statistics.median(plain),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--manager", default="auto")
    args = parser.parse_args()
    units = [f"benchesc-{uuid.uuid4().hex[:8]}" for _ in range(args.agents)]
    async with AsyncFleet(FLEET, args.manager) as fleet:
        try:
            for i, unit in enumerate(units):
                await fleet.launch(
                    f"a{i:03d}",
                    agent_argv(fleet.manager, unit),
                    stdout=DEVNULL,
                    stderr=DEVNULL,
                )
            await asyncio.sleep(3.0)  # every sh has forked, every systemd-run has moved
            slice_path = await fleet.slice_cgroup()
            result = await measure(slice_path, args.ticks)
        finally:
            for agent in await fleet.agents():
                await fleet.stop(agent.name, timeout=5)
            systemctl = ["systemctl", *(["--user"] if fleet.manager == "user" else [])]
            subprocess.run(
                [*systemctl, "stop", *(f"{u}.scope" for u in units)],
                check=False,
                capture_output=True,
            )
    per_agent = (result["sample_audit_cpu"] - result["sample_cpu"]) / args.agents
    print(
        f"{args.agents} agents ({args.agents * 10} processes, {result['escapees']} escaped), "
        f"manager {fleet.manager}, pid {os.getpid()}:\n"
        f"  sample        {result['sample_cpu'] * 1000:8.2f} ms CPU (median of {args.ticks})\n"
        f"  sample+audit  {result['sample_audit_cpu'] * 1000:8.2f} ms CPU\n"
        f"  ratio         {result['ratio']:8.2f}x  (the audit: {per_agent * 1e6:.0f} us per agent)"
    )


if __name__ == "__main__":
    asyncio.run(main())
