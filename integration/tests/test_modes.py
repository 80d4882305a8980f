"""Manager modes without systemd's scopes (issue #27), against a real kernel.

- cgroup mode: a harness in a ``systemd-run --scope -p Delegate=yes`` scope
  (the shape of a container with writable cgroups, or of a service with
  ``Delegate=yes``) opens a fleet with ``manager="cgroup"``: the harness
  moves into a leaf, every agent gets a cgroup of its own under the
  harness's own, with ``memory.oom.group`` 0 and a default ``memory.max``
  under the scope's limit; a capped agent's OOM stays in its cgroup and its
  siblings and the harness live.
- process mode forced on a systemd host: agents are process trees; a stop
  ends the whole tree; what needs a cgroup is refused naming the mode.

The harness is this suite's Python, so it shares the suite's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import MANAGER

LIMIT = 400 << 20

CGROUP_HARNESS = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from agentscope_systemd import DEVNULL, AsyncFleet

    HEARTBEAT = 'while :; do date +%s.%N >> "$1"; sleep 0.2; done'
    GROW = "l = []\\nwhile True: l.append(b'x' * (4 << 20))"

    def own():
        return open("/proc/self/cgroup").read().strip().partition("::")[2]

    async def main(work):
        out = {"before": own()}
        async with AsyncFleet("modes", "cgroup") as fleet:
            out["mode"], out["reason"] = fleet.mode, fleet.mode_reason
            out["after"] = own()
            sibs = [
                await fleet.launch(f"sib-{i}", ["sh", "-c", HEARTBEAT, "sh", f"{work}/beat-{i}"],
                                   stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
                for i in range(2)
            ]
            capped = await fleet.launch("capped", [sys.executable, "-c", GROW],
                                        memory_max=64 << 20,
                                        stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            slice_dir = await fleet.slice_cgroup()
            out["slice"] = str(slice_dir)
            out["cgroups"] = {}
            for a in [*sibs, capped]:
                d = slice_dir / a.unit
                out["cgroups"][a.name] = {
                    "proc": open(f"/proc/{a.pid}/cgroup").read().strip().partition("::")[2],
                    "memory.max": (d / "memory.max").read_text().strip(),
                    "oom.group": (d / "memory.oom.group").read_text().strip(),
                    "oom_score_adj": open(f"/proc/{a.pid}/oom_score_adj").read().strip(),
                }
            status = await capped.wait()
            out["capped_status"] = status
            out["capped_events"] = (slice_dir / capped.unit / "memory.events").read_text()
            await asyncio.sleep(1.0)
            out["siblings_alive"] = [s.alive() for s in sibs]
            listed = {a.name: a.state for a in await fleet.agents(all=True)}
            out["listed"] = listed
            out["events"] = [(e.agent, e.kind) for e in await fleet.events()]
            for s in sibs:
                await fleet.stop(s.name, timeout=5)
            out["after_stop"] = {a.name: a.state for a in await fleet.agents(all=True)}
            out["left"] = sorted(d.name for d in slice_dir.iterdir() if d.is_dir())
        json.dump(out, open(f"{work}/result.json", "w"))

    asyncio.run(main(sys.argv[1]))
    """
)


def _run_scoped(
    tmp_path: Path, tag: str, script: str, *props: str
) -> subprocess.CompletedProcess[str]:
    user = ["--user"] if MANAGER == "user" else []
    path = tmp_path / "harness.py"
    path.write_text(script)
    return subprocess.run(
        [
            *("systemd-run", *user, "--scope", "--quiet", f"--unit={tag}.scope"),
            *(f"--property={p}" for p in props),
            *(sys.executable, str(path), str(tmp_path)),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cgroup_mode_in_a_delegated_scope_gives_each_agent_its_own_capped_cgroup(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o777)
    tag = "modes" + uuid.uuid4().hex[:6]
    harness = _run_scoped(
        tmp_path, tag, CGROUP_HARNESS, "Delegate=yes", f"MemoryMax={LIMIT}", "MemorySwapMax=0"
    )
    print(harness.stderr[-3000:])
    assert harness.returncode == 0, f"the harness died: {harness.returncode}"
    out = json.loads((tmp_path / "result.json").read_text())
    print(json.dumps(out, indent=1)[:4000])
    assert out["mode"] == "cgroup"
    base = out["before"]
    assert base.endswith(f"/{tag}.scope")
    # The harness moved into a leaf of its own scope; the agents are beside it.
    assert out["after"] == f"{base}/agentscope-manager"
    assert out["slice"].endswith(f"{base}/app-agentscope-agents.slice")
    default = LIMIT - max(LIMIT // 10, 64 << 20)
    for name, cg in out["cgroups"].items():
        assert cg["proc"].startswith(f"{base}/app-agentscope-agents.slice/agentscope-modes-{name}-")
        assert cg["proc"].endswith("/agent"), cg  # the agent leaf, beside its tool calls' (#26)
        assert cg["oom.group"] == "0"
        assert cg["oom_score_adj"] == "800"
        assert cg["memory.max"] == str(64 << 20 if name == "capped" else default)
    # The capped agent's OOM stayed in its cgroup: it died, its siblings did not.
    assert out["capped_status"] == -9
    events = dict(line.split() for line in out["capped_events"].splitlines())
    assert int(events["oom_kill"]) >= 1
    assert all(out["siblings_alive"])
    assert out["listed"]["capped"] in ("exited", "failed")
    assert out["after_stop"] == {"sib-0": "exited", "sib-1": "exited", "capped": "exited"}
    assert out["left"] == [], out["left"]  # stopped agents' cgroups are removed
    # The scope ended with the harness: nothing of the fleet was left running in it.
    user = ["--user"] if MANAGER == "user" else []
    alive = subprocess.run(["systemctl", *user, "is-active", f"{tag}.scope"], check=False)
    assert alive.returncode != 0


PROCESS_HARNESS = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from agentscope_systemd import DEVNULL, AsyncFleet, ModeUnsupported

    async def main(work):
        out = {}
        async with AsyncFleet("pmodes", "process") as fleet:
            out["mode"] = fleet.mode
            tree = await fleet.launch(
                "tree", ["sh", "-c", f"sleep 300 & echo $! > {work}/child; wait"],
                stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            lone = await fleet.launch("lone", ["sleep", "300"],
                                      stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            for _ in range(100):
                if os.path.exists(f"{work}/child") and open(f"{work}/child").read().strip():
                    break
                await asyncio.sleep(0.05)
            child = int(open(f"{work}/child").read())
            out["listed"] = {a.name: a.state for a in await fleet.agents()}
            try:
                await fleet.launch("capped", ["sleep", "1"], memory_max=64 << 20)
            except ModeUnsupported as exc:
                out["refused"] = str(exc)
            await fleet.stop("tree", timeout=5)
            out["child_alive"] = os.path.exists(f"/proc/{child}")
            out["lone_alive"] = lone.alive()
            await fleet.stop("lone", timeout=5)
            out["after"] = {a.name: a.state for a in await fleet.agents(all=True)}
        json.dump(out, open(f"{work}/result.json", "w"))

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.heavy("limits")
def test_process_mode_forced_on_a_systemd_host_runs_and_stops_process_trees(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o777)
    tag = "pmodes" + uuid.uuid4().hex[:6]
    harness = _run_scoped(tmp_path, tag, PROCESS_HARNESS)
    print(harness.stderr[-3000:])
    assert harness.returncode == 0, f"the harness died: {harness.returncode}"
    out = json.loads((tmp_path / "result.json").read_text())
    assert out["mode"] == "process"
    assert out["listed"] == {"tree": "running", "lone": "running"}
    assert "process manager mode" in out["refused"]
    assert not out["child_alive"], "the stop ended the whole tree"
    assert out["lone_alive"]
    assert out["after"] == {"tree": "exited", "lone": "exited"}
