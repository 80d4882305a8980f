"""The launch gate, on the host: a forked child that waits before its exec."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentscope_systemd._fleet._spawn import spawn_gated


async def test_gated_child_carries_its_exec_name_before_the_exec() -> None:
    # A monitor may sample the new scope while the child still waits here:
    # it must not see the manager's name (python) for it.
    child = await spawn_gated(
        ["/bin/sleep", "5"],
        cwd=None,
        env=None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        oom_score_adj=None,
    )
    try:
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "sleep"
        assert Path(f"/proc/{child.pid}/exe").resolve().name != "sleep"  # not exec'd yet
    finally:
        await child.abort()
    assert not Path(f"/proc/{child.pid}").exists()  # aborted and reaped
