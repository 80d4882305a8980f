"""Launch latency of a tmux agent against a plain agent, in one run.

Run inside a VM of the test bed (``make bench BENCH=bench_tmux.py``), or on
any systemd host with tmux. Both sides launch ``sleep 600`` on one open
fleet, timed from the call until ``launch()`` returns (the agent has exec'd
in its scope); each agent is killed untimed before the next. The first tmux
launch, which also starts the fleet's tmux server in its scope, is timed on
its own. Prints medians and their ratio.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
import uuid

import agentscope_systemd

N = int(os.environ.get("BENCH_N", "20"))


async def _launches(
    fleet: agentscope_systemd.AsyncFleet, n: int, tag: str, tmux: bool
) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        if tmux:
            agent = await fleet.launch(f"{tag}{i}", ["sleep", "600"], terminal="tmux")
        else:
            agent = await fleet.launch(
                f"{tag}{i}",
                ["sleep", "600"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        times.append(time.perf_counter() - t0)
        await fleet.kill(agent.name, 9)
        await agent.wait()
    return times


async def main() -> None:
    name = f"bench{uuid.uuid4().hex[:6]}"
    async with agentscope_systemd.AsyncFleet(name) as fleet:
        await _launches(fleet, 3, "w", tmux=False)  # warm up: slice check, D-Bus
        t0 = time.perf_counter()
        first = await fleet.launch("first", ["sleep", "600"], terminal="tmux")
        server_start = time.perf_counter() - t0
        await fleet.kill(first.name, 9)
        await _launches(fleet, 3, "v", tmux=True)
        # Interleaved rounds, so drift in the VM affects both sides alike.
        plain: list[float] = []
        tmux: list[float] = []
        for r in range(N // 5):
            plain += await _launches(fleet, 5, f"p{r}-", tmux=False)
            tmux += await _launches(fleet, 5, f"t{r}-", tmux=True)
        p, t = statistics.median(plain), statistics.median(tmux)
        print(f"launch latency ({fleet.manager} manager, systemd {fleet.systemd_version}, ", end="")
        print(f"median of {len(plain)} each):")
        print(f"  plain agent           {p * 1000:8.1f} ms")
        print(f"  tmux agent            {t * 1000:8.1f} ms")
        print(f"  ratio tmux/plain      {t / p:8.2f}x")
        print(f"  first tmux launch     {server_start * 1000:8.1f} ms (starts the server)")
        tmux_dir = fleet._terminals.server.socket
        subprocess.run(["tmux", "-S", str(tmux_dir), "kill-server"], check=False)


if __name__ == "__main__":
    asyncio.run(main())
