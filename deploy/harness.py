"""An example harness for deploy/Containerfile: agents under one guarded monitor.

    python3 harness.py NAME=COMMAND [NAME=COMMAND ...]

Each argument is one agent, its command a shell command line. The harness
opens the fleet with the default manager ("auto": the process mode under a
read-only cgroupfs, the cgroup mode where the container's cgroup is
writable; docs/containers.md), launches every agent, runs the monitor with
the guard, prints the mode and every event of the monitor as one JSON line
each, and exits when every agent has ended (an ``ended`` line each, with
its exit status or minus the signal). A runaway tool call is killed
by the guard, named (a ``guard_kill`` line), before the container's memory
limit is reached; its agent and the others live on.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agentscope_systemd import DEVNULL, AsyncFleet, Monitor


def parse(specs: list[str]) -> list[tuple[str, str]]:
    agents = []
    for spec in specs:
        name, sep, command = spec.partition("=")
        if not sep or not name or not command:
            raise SystemExit(f"harness: {spec!r} is not NAME=COMMAND")
        agents.append((name, command))
    if not agents:
        raise SystemExit("harness: no agents; give NAME=COMMAND arguments")
    return agents


def say(what: dict[str, object]) -> None:
    print(json.dumps(what), flush=True)


async def tell(monitor: Monitor) -> None:
    async for event in monitor:
        say(event.to_dict())


async def main(agents: list[tuple[str, str]]) -> None:
    async with AsyncFleet("harness") as fleet:
        say({"kind": "fleet", "mode": fleet.mode, "reason": fleet.mode_reason})
        async with fleet.monitor(interval=1.0, guard=True) as monitor:
            telling = asyncio.create_task(tell(monitor))
            launched = [
                await fleet.launch(name, ["sh", "-c", command], stdin=DEVNULL)
                for name, command in agents
            ]
            for agent in launched:
                say({"kind": "launched", "agent": agent.name, "pid": agent.pid})
            statuses = await asyncio.gather(*(agent.wait() for agent in launched))
            telling.cancel()
    for agent, status in zip(launched, statuses, strict=True):
        # The exit status, or minus the signal that ended the agent.
        say({"kind": "ended", "agent": agent.name, "status": status})


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
