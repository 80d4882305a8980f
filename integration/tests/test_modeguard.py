"""The guard in process mode under a container's memory limit (issue #27 item 3), real kernel.

A container with a read-only cgroupfs gives process mode: the agents are
process trees in the container's own cgroup, beside the manager. Its
stand-in here is a transient scope (``systemd-run --scope``) with a
``MemoryMax``, no swap, and ``memory.oom.group`` 1 written on it as the
kubelet writes it on every container: one OOM kill there would kill every
process of the scope, harness and agents at once. The harness opens its
fleet with ``manager="process"`` and runs the guard; a runaway tool call of
one agent grows without a cap beside a sibling that writes a heartbeat.
The guard must kill only the tool call, name its agent, and the scope's
``oom_kill`` count must stay 0.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from conftest import MANAGER
from test_guard import GROW, TOOL_CALL, kernel_oom_kills

import agentscope_systemd

pytestmark = [
    pytest.mark.heavy("limits"),
    pytest.mark.skipif(
        getattr(agentscope_systemd, "GuardKill", None) is None, reason="no guard in this build"
    ),
]

LIMIT = 300 << 20

HARNESS = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from agentscope_systemd import DEVNULL, AsyncFleet, GuardKill

    HEARTBEAT = 'while :; do date +%s.%N >> "$1"; sleep 0.2; done'

    def own():
        return open("/proc/self/cgroup").read().strip().partition("::")[2]

    async def main(fleet_name, work, grow, tool_call):
        out = {"kills": [], "lag_max": 0.0, "cgroup": own()}
        cg = "/sys/fs/cgroup" + out["cgroup"]
        # The kubelet's setting (kubernetes#117793): an OOM kill takes the whole scope.
        try:
            with open(cg + "/memory.oom.group", "w") as f:
                f.write("1")
        except OSError as exc:
            out["oom_group_error"] = str(exc)
        out["oom_group"] = open(cg + "/memory.oom.group").read().strip()
        lag = [0.0]

        async def ticker():
            while True:
                t = time.monotonic()
                await asyncio.sleep(0.05)
                lag[0] = max(lag[0], time.monotonic() - t - 0.05)

        tick = asyncio.get_running_loop().create_task(ticker())
        async with AsyncFleet(fleet_name, "process") as fleet:
            out["mode"] = fleet.mode
            beat = f"{work}/beat"
            sib = await fleet.launch("sib", ["sh", "-c", HEARTBEAT, "sh", beat],
                                     stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            async with fleet.monitor(interval=1.0, guard=True) as monitor:
                start = time.monotonic()
                agent = await fleet.launch(
                    "runaway", ["sh", "-c", tool_call, "sh", grow, f"{work}/rc"],
                    stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
                it = monitor.__aiter__()
                deadline = start + 150
                while time.monotonic() < deadline:
                    try:
                        event = await asyncio.wait_for(it.__anext__(), deadline - time.monotonic())
                    except TimeoutError:
                        break
                    if isinstance(event, GuardKill):
                        out["kills"].append(event.to_dict())
                        out["lifetime"] = time.monotonic() - start
                        deadline = min(deadline, time.monotonic() + 3.0)
            await asyncio.sleep(1.5)
            out["runaway_pid"] = agent.pid
            out["sib_pid"] = sib.pid
            out["runaway_alive"] = agent.alive()
            out["sib_alive"] = sib.alive()
            out["recorded"] = [(e.agent, e.kind) for e in await fleet.events(kind="guard_kill")]
            for a in await fleet.agents():
                await fleet.stop(a.name, timeout=5)
        tick.cancel()
        out["lag_max"] = lag[0]
        out["memory.events"] = open(cg + "/memory.events").read()
        json.dump(out, open(f"{work}/result.json", "w"))

    asyncio.run(main(*sys.argv[1:5]))
    """
)


def longest_gap(beat: Path) -> float:
    stamps = [float(x) for x in beat.read_text().split()]
    return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)


def test_process_mode_under_a_scopes_limit_with_group_oom_the_guard_kills_only_the_runaway(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o777)
    tag = "mg" + uuid.uuid4().hex[:6]
    user = ["--user"] if MANAGER == "user" else []
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    kills_before = kernel_oom_kills()
    started = time.monotonic()
    harness = subprocess.run(
        [
            *("systemd-run", *user, "--scope", "--quiet", f"--unit={tag}.scope"),
            f"--property=MemoryMax={LIMIT}",
            "--property=MemorySwapMax=0",
            *(sys.executable, str(script), tag, str(tmp_path), GROW, TOOL_CALL),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    took = time.monotonic() - started
    print(harness.stderr[-3000:])
    # 137: the scope's group OOM killed the harness with everything else.
    assert harness.returncode == 0, f"the harness died: {harness.returncode}"
    result = json.loads((tmp_path / "result.json").read_text())
    gap = longest_gap(tmp_path / "beat")
    events = result["memory.events"]
    print(
        f"process mode, limit {LIMIT >> 20} MiB, memory.oom.group {result['oom_group']}: "
        f"runaway lived {result.get('lifetime', 0):.1f} s; manager's worst loop lag "
        f"{result['lag_max']:.2f} s; sibling's longest silence {gap:.2f} s; harness run "
        f"{took:.0f} s; kills {result['kills']}; the scope's memory.events: {events.split()}"
    )
    assert result["mode"] == "process"
    assert result["cgroup"].endswith(f"/{tag}.scope")
    if MANAGER == "system":
        assert result["oom_group"] == "1", result.get("oom_group_error")
    kills = result["kills"]
    assert len(kills) == 1, kills
    (kill,) = kills
    assert kill["agent"] == "runaway"
    assert kill["comm"] == "python3"
    assert kill["pid"] not in (result["runaway_pid"], result["sib_pid"])  # the tool call
    assert kill["trigger"] == "memory"
    assert kill["limit"] == result["cgroup"]
    assert kill["limit_bytes"] == LIMIT
    assert kill["rss"] + kill["swap"] > 64 << 20
    assert result["runaway_alive"], "the agent's shell lives on"
    assert result["sib_alive"]
    assert gap > 0.0  # it beat (its silences are the TCG guest's, reported above)
    assert result["recorded"] == [["runaway", "guard_kill"]]
    assert (tmp_path / "rc").read_text().strip() == f"rc={128 + signal.SIGKILL}"
    counters = dict(line.split() for line in events.splitlines())
    assert counters["oom_kill"] == "0", f"the kernel killed inside the limit: {events}"
    assert kernel_oom_kills() == kills_before
