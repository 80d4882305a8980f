"""`fleet.agents()` with 1,000 registry rows and 100 live scopes.

Prints the time per call and how many D-Bus calls one listing makes (it must
not grow with the number of agents). Needs a systemd host (run it in a VM:
`make bench BENCH=bench_agents.py`).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from agentscope_systemd import DEVNULL, AsyncFleet
from agentscope_systemd._managers._bus import SystemdBus


async def main() -> None:
    db = Path(tempfile.mkdtemp()) / "agentscope.db"
    name = f"ba{uuid.uuid4().hex[:6]}"
    async with AsyncFleet(name, registry=db) as fleet:
        registry = fleet._store.registry
        assert registry is not None
        # 900 closed rows: agents of the past, as a busy fleet accumulates.
        for i in range(900):
            unit = f"agentscope-{name}-old{i}-{i:06x}.scope"
            registry.record_launch(name, f"old{i}", unit, 1, 1, ["true"], "/")
            registry.set_state(unit, "exited", exit_status=0)
        agents = await asyncio.gather(
            *(fleet.launch(f"a{i}", ["sleep", "600"], stdout=DEVNULL) for i in range(100))
        )
        calls = 0
        original = SystemdBus.call

        async def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return await original(self, *args, **kwargs)

        SystemdBus.call = counting  # type: ignore[method-assign]
        times = []
        for _ in range(20):
            calls = 0
            t0 = time.perf_counter()
            listed = await fleet.agents(all=True)
            times.append(time.perf_counter() - t0)
        per_call = calls
        SystemdBus.call = original  # type: ignore[method-assign]
        assert len(listed) == 1000, len(listed)
        print(
            f"agents(all=True) over 1000 rows, 100 live scopes ({fleet.manager} manager): "
            f"median {statistics.median(times) * 1000:.1f} ms, {per_call} D-Bus call(s) per listing"
        )
        await asyncio.gather(*(fleet.kill(a.name, 9) for a in agents))


if __name__ == "__main__":
    asyncio.run(main())
