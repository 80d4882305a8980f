"""A Node harness (clients/node/) drives real agents through the CLI and the monitor's read API.

The harness (node_harness.mjs) launches one agent with ``run`` and one by
prefixing its own spawn with ``execArgv()`` (``agentscope exec``), lists
them and follows their events through the monitor's face on a Unix socket
and through the CLI's ``events --follow``, as docs/node.md shows. Needs
node (Debian's nodejs: in the trixie image only; elsewhere skipped).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import validate

CLI = shutil.which("agentscope") or "agentscope"
NODE = shutil.which("node")
CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
HARNESS = Path(__file__).resolve().parent / "node_harness.mjs"

pytestmark = [
    pytest.mark.heavy("node"),
    pytest.mark.skipif(
        NODE is None or not CLIENT.is_dir(),
        reason="no node in this image (nodejs is in trixie's) or no clients/node in the payload",
    ),
]


def _serve(fleet: str, socket_path: Path) -> subprocess.Popen[str]:
    monitor = subprocess.Popen(
        [CLI, "--fleet", fleet, "monitor", "--interval", "0.5", "--listen", f"unix:{socket_path}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert monitor.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = monitor.stderr.readline()
        assert line, "the monitor ended before serving"
        if line.startswith("serving "):
            assert line.rstrip().endswith(f"unix:{socket_path}")
            return monitor
    monitor.kill()
    pytest.fail("the monitor did not serve in 120 s")


def test_a_node_harness_launches_lists_and_follows_real_agents(tmp_path: Path) -> None:
    fleet = f"n{uuid.uuid4().hex[:6]}"
    socket_path = tmp_path / "monitor.sock"
    monitor = _serve(fleet, socket_path)
    try:
        # The socket is the access control: its owner's alone.
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        t0 = time.monotonic()
        done = subprocess.run(
            [NODE or "node", str(HARNESS), str(CLIENT), fleet, f"unix:{socket_path}"],
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        took = time.monotonic() - t0
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        print(f"node harness: {took:.1f} s")
        # run: launched; exec: the spawned process itself is agent b (same PID).
        assert validate(out["launched"]) == "agentscope.launched/1"
        assert out["faceAgentB"]["pid"] == out["execPid"], out["execStderr"]
        for agents in (out["faceAgents"], out["cliAgents"]):
            assert {a["name"] for a in agents} >= {"a", "b"}
            assert {validate(a) for a in agents} == {"agentscope.agent/1"}
        assert out["stopped"]["stopped"] == ["a"]
        # The same events, in the same order, from the face and from the CLI.
        face = [(e["id"], e["kind"], e["agent"]) for e in out["faceEvents"]]
        assert face == [(e["id"], e["kind"], e["agent"]) for e in out["cliEvents"]]
        kinds = [(kind, agent) for _, kind, agent in face]
        assert kinds[0] == ("launched", "a")
        assert ("adopted", "b") in kinds
        assert kinds[-1] == ("stopped", "a")
        assert {validate(e) for e in out["faceEvents"]} == {"agentscope.event/1"}
        assert validate(out["report"]) == "agentscope.report/1"
    finally:
        subprocess.run(
            [CLI, "--fleet", fleet, "stop", "--all", "--timeout", "2"],
            capture_output=True,
            timeout=120,
            check=False,
        )
        monitor.terminate()
        monitor.wait(30)
        if monitor.stderr is not None:
            monitor.stderr.close()
    assert not socket_path.exists()  # gone with the monitor
