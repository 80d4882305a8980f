"""A user's monitor names a fast OOM victim from the journal: run by test_recovery.py.

Run through the root helper (``journal_reader run journal_victim``) as the
test user with the groups of a new login, after the test put the user in
systemd-journal: the suite's own process predates that group. Prints each
OomKill event as a JSON line, until the tool call's (``tail``) is among them.
The kernel may also kill the pipe's writer or the agent's shell, which ends
the scope (seen on sid's kernel under load): those kills are named too, and
the scope's end must not cut short the wait for the journal's line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid

from agentscope_systemd import AgentNotFound, AsyncFleet, OomKill

CAP = 64 << 20
# The tool call is born and killed between two samples: no sample sees it.
TOOL = "head -c 300M /dev/zero | tail; exec sleep 600"


async def main() -> int:
    async with AsyncFleet(f"j{uuid.uuid4().hex[:6]}") as fleet:
        try:
            async with fleet.monitor(interval=2.0) as mon:
                await fleet.launch(
                    "tool",
                    ["sh", "-c", TOOL],
                    memory_max=CAP,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                async with asyncio.timeout(120):
                    async for event in mon:
                        if isinstance(event, OomKill):
                            print(json.dumps(event.to_dict()), flush=True)
                            if event.comm == "tail":
                                return 0
        finally:
            with contextlib.suppress(AgentNotFound):  # the kernel killed its shell too
                await fleet.stop("tool", timeout=5)
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
