"""A harness of agents in a real container with the kubelet's group OOM (issue #27 item 5).

Podman with crun from Debian's packages (trixie's image only:
integration/images.py), no registry and no network: the container's root
is a directory of mount points (``--rootfs``) with the guest's ``/usr`` and
the installed agentscope (``/opt/agentscope``, guest.sh) bind-mounted
read-only, ``--network none``, a memory limit without swap, and
``memory.oom.group=1`` written on the container's cgroup as the kubelet
does on cgroup v2 since Kubernetes 1.28 (kubernetes#117793), through
Podman's ``--cgroup-conf``. The cgroupfs inside is read-only (Podman's
default, as Docker's and Kubernetes'), so ``manager="auto"`` gives the
process mode; with ``--systemd=always`` it is writable: the cgroup mode.

- Without agentscope's guard, one runaway tool call takes the whole
  container down: the kernel's group kill ends the harness and every
  agent (asserted, so the bed is known to reproduce the problem).
- With the monitor's guard, the container lives and the kill is named:
  in the process mode (the guard under the container's own limit, issue
  #27 item 3) and in the cgroup mode.
- The CLI inside the container: ``--json ls``, ``events``, ``report`` and
  ``doctor``.
- deploy/kubernetes/pod.yaml under ``podman kube play``, with the example
  harness deploy/harness.py: the same outcome is wanted there.

One container start per test; the harness reports as it goes into a
bind-mounted directory, so what it saw before a group kill is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import validate

PODMAN = shutil.which("podman")
pytestmark = [
    pytest.mark.heavy("containers"),
    pytest.mark.skipif(
        PODMAN is None,
        reason="podman is not installed in this image (integration/images.py: trixie's packages)",
    ),
]

#: The container's memory limit, as the issue's measurement: the harness
#: (Python, agentscope, its monitor) and four agents fit in it with room
#: to spare; the runaway does not.
LIMIT = "400m"
AGENTS = 4

# The harness, run by the container's Python (/opt/agentscope's venv) as
# its PID 1. argv: "guard" or "bare". Each step is one JSON line in
# /work/log.jsonl, written at once: a group kill leaves what came before.
HARNESS = textwrap.dedent(
    """
    import asyncio, json, os, subprocess, sys, time
    import agentscope_systemd
    from agentscope_systemd import DEVNULL, AsyncFleet

    HEARTBEAT = 'while :; do date +%s.%N >> "$1"; sleep 0.2; done'
    # An agent's shell that starts the tool call, says how it ended, and lives on.
    TOOL_CALL = 'python3 /work/grow.py; echo "rc=$?" > /work/rc; while :; do sleep 3600; done'

    def note(step, **what):
        with open("/work/log.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "t": time.monotonic(), **what}) + "\\n")

    def cli(*args):
        got = subprocess.run(["agentscope", "--json", "--fleet", "bed", *args],
                             capture_output=True, text=True, timeout=120)
        return {"rc": got.returncode, "out": got.stdout, "err": got.stderr[-2000:]}

    # The monitor's kill events (the guard's or the kernel's), until one came and 3 s more.
    async def kills(mon, timeout):
        got, it = [], mon.__aiter__()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = await asyncio.wait_for(it.__anext__(), left)
            except TimeoutError:
                break
            if isinstance(event, (agentscope_systemd.GuardKill, agentscope_systemd.OomKill)):
                got.append(event.to_dict())
                deadline = min(deadline, time.monotonic() + 3.0)
        return got

    async def main(guard, agents):
        async with AsyncFleet("bed") as fleet:
            note("open", mode=fleet.mode, reason=fleet.mode_reason)
            sibs = [
                await fleet.launch(f"sib-{i}", ["sh", "-c", HEARTBEAT, "sh", f"/work/beat-{i}"],
                                   stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
                for i in range(agents)
            ]
            async with fleet.monitor(interval=1.0, guard=guard) as mon:
                runaway = await fleet.launch(
                    "runaway", ["sh", "-c", TOOL_CALL],
                    stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
                note("launched", agents=[a.name for a in [*sibs, runaway]])
                got = await kills(mon, 120)
            note("kills", kills=got)
            for _ in range(100):
                if os.path.exists("/work/rc"):
                    break
                await asyncio.sleep(0.1)
            # The CLI's ls in the container, each mode (its events, report and
            # doctor: the CLI test's). A CLI start is seconds under TCG (#29).
            note("after", siblings=[s.alive() for s in sibs], runaway=runaway.alive(),
                 ls=cli("ls"))
            await asyncio.gather(*(fleet.stop(a.name, timeout=5) for a in await fleet.agents()))
        note("done")

    asyncio.run(main(sys.argv[1] == "guard", int(sys.argv[2])))
    """
)

# The runaway tool call: 16 MiB every 20 ms, each chunk touched.
GROW = (
    "import time\nchunks = []\nwhile True:\n"
    "    chunks.append(b'x' * (16 << 20))\n    time.sleep(0.02)\n"
)

# The CLI in the container, with no memory pressure: two agents, one of
# which exits at once with a status of its own.
CLI_HARNESS = textwrap.dedent(
    """
    import asyncio, json, subprocess, sys
    from agentscope_systemd import DEVNULL, AsyncFleet

    def cli(*args):
        got = subprocess.run(["agentscope", "--json", "--fleet", "bed", *args],
                             capture_output=True, text=True, timeout=120)
        return {"rc": got.returncode, "out": got.stdout, "err": got.stderr[-2000:]}

    async def main():
        out = {}
        async with AsyncFleet("bed") as fleet:
            out["mode"] = fleet.mode
            await fleet.launch("steady", ["sleep", "300"],
                               stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            quick = await fleet.launch("quick", ["sh", "-c", "exit 3"],
                                       stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            out["quick"] = await quick.wait()
            for name, args in (("ls", ["ls"]), ("events", ["events"]),
                               ("report", ["report"]), ("doctor", ["doctor"])):
                out[name] = cli(*args)
            await fleet.stop("steady", timeout=5)
        json.dump(out, open("/work/result.json", "w"))

    asyncio.run(main())
    """
)


def unreadable(where: str, names: list[str]) -> set[str]:
    """What the test user may not read (/etc/shadow, ...): rootless, it is left out."""
    return {n for n in names if not os.access(os.path.join(where, n), os.R_OK)}


@contextlib.contextmanager
def container_root() -> Iterator[Path]:
    """A container's root: mount points, the merged-/usr links, and a copy of /etc.

    One per container: the fleet's registry and runtime files are written
    there. A context manager, not only the fixture below:
    benchmarks/bench_container.py makes one per round.

    /etc is copied, not bind-mounted: Podman mounts its own hosts,
    hostname and resolv.conf over files there.
    """
    root = Path(tempfile.mkdtemp(prefix="ctr-root-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        for d in ("usr", "opt/agentscope", "proc", "sys", "dev", "run", "tmp", "var/tmp", "root"):
            (root / d).mkdir(parents=True)
        (root / "work").mkdir()
        for link in ("bin", "lib", "lib64", "sbin"):
            (root / link).symlink_to(f"usr/{link}")
        shutil.copytree("/etc", root / "etc", symlinks=True, ignore=unreadable)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def work_dir() -> Iterator[Path]:
    """The directory bind-mounted at /work: the harness's reports, kept past a group kill."""
    path = Path(tempfile.mkdtemp(prefix="ctr-work-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rootfs() -> Iterator[Path]:
    with container_root() as root:
        yield root


@pytest.fixture
def work() -> Iterator[Path]:
    with work_dir() as path:
        yield path


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    return subprocess.run(
        [PODMAN, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_container(
    rootfs: Path, work: Path, name: str, script: str, *argv: str, options: list[str] | None = None
) -> dict[str, Any]:
    """Run ``script`` in a fresh container; return its exit, OOMKilled and the seconds it ran."""
    (work / "harness.py").write_text(script)
    (work / "grow.py").write_text(GROW)
    t0 = time.monotonic()
    ran = podman(
        "run",
        f"--name={name}",
        "--network=none",
        f"--memory={LIMIT}",
        f"--memory-swap={LIMIT}",  # no swap: the limit is the wall
        "--cgroup-conf=memory.oom.group=1",  # the kubelet's, on cgroup v2
        "--volume=/usr:/usr:ro",
        "--volume=/opt/agentscope:/opt/agentscope:ro",
        f"--volume={work}:/work",
        "--env=PATH=/opt/agentscope/bin:/usr/bin",
        *(options or []),
        "--rootfs",
        str(rootfs),
        "python3",
        "/work/harness.py",
        *argv,
    )
    ended = time.monotonic()  # the container's clock too: no time namespace
    state = podman("inspect", name, "--format", "{{json .State}}")
    podman("rm", "--force", name)
    print(f"podman run: exit {ran.returncode} after {ended - t0:.1f}s; {ran.stderr[-3000:]}")
    assert state.returncode == 0, state.stderr
    return {"rc": ran.returncode, "ended": ended, "state": json.loads(state.stdout)}


def steps(work: Path) -> dict[str, dict[str, Any]]:
    log = work / "log.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    got = {s["step"]: s for s in map(json.loads, lines)}
    print(json.dumps(got, indent=1)[:6000])
    return got


def test_without_the_guard_one_runaway_tool_call_kills_the_whole_container(
    rootfs: Path, work: Path
) -> None:
    kills_before = oom_kills()
    ran = run_container(rootfs, work, "bed-bare", HARNESS, "bare", str(AGENTS))
    killed = oom_kills() - kills_before
    got = steps(work)
    assert got["open"]["mode"] == "process", got["open"]
    # The harness was up with every agent and the runaway...
    assert got["launched"]["agents"] == [*(f"sib-{i}" for i in range(AGENTS)), "runaway"]
    # ...and the kernel's group kill ended all of it: harness (PID 1) included.
    assert ran["rc"] == 137, ran
    assert ran["state"]["ExitCode"] == 137, ran["state"]
    # The kernel's count, not Podman's State.OOMKilled: Podman said false for
    # a container the group kill had ended (exit 137, the harness gone
    # mid-step), once in CI under TCG (2026-12-03, trixie, system). One OOM
    # kill is the runaway alone; a group kill is every process of it.
    assert killed > AGENTS, (killed, ran["state"].get("OOMKilled"))
    assert "kills" not in got, got["kills"]
    assert "done" not in got
    # The group kill takes the agent's shell with its tool call. The kernel
    # kills the victim first, then the group's other tasks: once (a
    # rehearsal, trixie, system, TCG) the shell saw its tool call end and
    # wrote its status before its own SIGKILL came. It is the kill's status.
    if (work / "rc").exists():
        assert (work / "rc").read_text().strip() == "rc=137", "the tool call did not die of SIGKILL"
    lived = ran["ended"] - got["launched"]["t"]
    print(f"the container died {lived:.1f}s after the runaway's launch")


def oom_kills() -> int:
    """The kernel's OOM kills since boot (``oom_kill`` in /proc/vmstat), one per process."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


class GroupKilled(AssertionError):
    """The kernel's group kill ended the container: what the guard is there to prevent."""


def alive_or_group_killed(ran: dict[str, Any]) -> None:
    # Podman's OOMKilled is not it: the container's memory.events counts the
    # OOM kills of every cgroup below it, an agent's own in the cgroup mode.
    if ran["rc"] == 137:
        raise GroupKilled(f"the group kill ended the container: {ran}")


@pytest.mark.parametrize(
    ("cgroupfs", "mode"),
    [
        # Each way once a CI run (issue #29, CI's time): the read-only
        # cgroupfs and the process mode as a pod's container has them, as
        # root; the delegated cgroupfs and the cgroup mode rootless.
        pytest.param("read-only", "process", marks=pytest.mark.heavy("containers-process")),
        pytest.param("writable", "cgroup", marks=pytest.mark.heavy("containers-cgroup")),
    ],
)
def test_with_the_guard_only_the_tool_call_dies_and_the_container_lives(
    rootfs: Path, work: Path, cgroupfs: str, mode: str
) -> None:
    # Podman mounts the cgroupfs read-write for --systemd=always (its own
    # cgroup is then delegated to the container), read-only otherwise.
    extra = ["--systemd=always"] if cgroupfs == "writable" else []
    ran = run_container(rootfs, work, f"bed-{mode}", HARNESS, "guard", str(AGENTS), options=extra)
    got = steps(work)
    assert got["open"]["mode"] == mode, got["open"]
    alive_or_group_killed(ran)
    assert ran["rc"] == 0, ran
    assert "done" in got, "the harness ended its fleet and exited on its own"
    after = got["after"]
    assert after["siblings"] == [True] * AGENTS
    listed = {a["name"]: a for a in json.loads(after["ls"]["out"])}
    assert {a["mode"] for a in listed.values()} == {mode}
    assert {f"sib-{i}" for i in range(AGENTS)} <= set(listed), listed
    # The kill is named: the guard's of the tool call, or in the cgroup mode
    # the kernel's inside the runaway agent's own cgroup (its memory.max is
    # under the container's limit). The monitor tells each process it saw die.
    kills = got["kills"]["kills"]
    print(f"{mode} mode: {kills}")
    assert kills, "no kill was told"
    assert {k["agent"] for k in kills} == {"runaway"}, kills
    assert "python3" in {k["comm"] for k in kills}, kills
    if mode == "process":
        # The guard kills the tool call alone: its agent's shell lives on.
        assert [(k["kind"], k["comm"]) for k in kills] == [("guard_kill", "python3")]
        assert (work / "rc").read_text().strip() == "rc=137"
        assert after["runaway"], "the agent's shell lives on after its tool call"
        assert listed["runaway"]["state"] == "running"
    else:
        # Seen both ways: the guard's kill of the tool call first (the shell
        # lives), or the kernel's OOM kill in the agent's cgroup (with the shell).
        print(f"the runaway's shell lived: {after['runaway']}")


@pytest.mark.heavy("containers-cli")
def test_the_cli_lists_reports_and_tells_events_inside_the_container(
    rootfs: Path, work: Path
) -> None:
    ran = run_container(rootfs, work, "bed-cli", CLI_HARNESS)
    assert ran["rc"] == 0, ran
    out = json.loads((work / "result.json").read_text())
    print(json.dumps(out, indent=1)[:6000])
    assert out["mode"] == "process"
    assert out["quick"] == 3
    for name in ("ls", "events", "report"):
        assert out[name]["rc"] == 0, out[name]
    listed = json.loads(out["ls"]["out"])
    for agent in listed:
        validate(agent)
    states = {a["name"]: (a["mode"], a["state"]) for a in listed}
    assert states["steady"] == ("process", "running"), states
    assert states.get("quick", ("process", "exited")) == ("process", "exited"), states
    events = [json.loads(line) for line in out["events"]["out"].splitlines()]
    for event in events:
        validate(event)
    launched = {e["agent"]: e["detail"]["argv"] for e in events if e["kind"] == "launched"}
    assert launched == {"steady": ["sleep", "300"], "quick": ["sh", "-c", "exit 3"]}, events
    validate(json.loads(out["report"]["out"]))
    # The doctor sees the container and says which mode the fleet gets there.
    doctor = json.loads(out["doctor"]["out"])
    validate(doctor)
    assert doctor["mode"] == "process", doctor
    checks = {c["name"]: c for c in doctor["checks"]}
    assert "podman" in checks["container"]["detail"], checks["container"]


# The repository's deploy/, which vm.py puts in the payload.
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
POD = "agentscope-harness"
# What the bed has instead of an image registry and a node: the guest's /usr
# and agentscope, the example harness, and a directory for the runaway.
BED_MOUNTS = """\
      volumeMounts:
        - {name: usr, mountPath: /usr, readOnly: true}
        - {name: venv, mountPath: /opt/agentscope, readOnly: true}
        - {name: harness, mountPath: /opt/harness, readOnly: true}
        - {name: work, mountPath: /work}
"""
BED_VOLUMES = """\
  volumes:
    - {{name: usr, hostPath: {{path: /usr, type: Directory}}}}
    - {{name: venv, hostPath: {{path: /opt/agentscope, type: Directory}}}}
    - {{name: harness, hostPath: {{path: {deploy}, type: Directory}}}}
    - {{name: work, hostPath: {{path: {work}, type: Directory}}}}
"""
# The agents: siblings that end 2 s after the runaway's tool call did, and a
# runaway that starts once the kubelet's memory.oom.group=1 is on the
# container (the bed writes it after the start: Podman's kube play does not)
# and says what it saw there. Each wait is bounded (120 s, 60 s).
BED_ARGS = (
    """\
      args:
"""
    + "".join(
        f'        - "sib-{i}=for i in $(seq 600); do [ -e /work/rc ] && break; sleep 0.2; done;'
        ' sleep 2"\n'
        for i in range(AGENTS - 1)
    )
    + (
        '        - "runaway=for i in $(seq 600); do grep -qx 1 /sys/fs/cgroup/memory.oom.group'
        " && break; sleep 0.1; done; cat /sys/fs/cgroup/memory.oom.group > /work/oom.group;"
        ' python3 /work/grow.py; echo rc=$? > /work/rc"\n'
    )
)


def bed_manifest(work: Path) -> str:
    """deploy/kubernetes/pod.yaml as the bed runs it: its limit, its agents, its mounts."""
    text = (DEPLOY / "kubernetes" / "pod.yaml").read_text()
    start = text.index("      args:\n")
    end = text.index("      resources:\n")
    text = text[:start] + BED_ARGS + text[end:]
    assert text.count("memory: 2Gi") == 2, text
    text = text.replace("memory: 2Gi", f"memory: {LIMIT.upper()}i")
    anchor = "    - name: harness\n"
    text = text.replace(anchor, anchor + BED_MOUNTS)
    # spec's last key must hold a value of its own: the volumes come after it.
    assert not text.rstrip().endswith(":"), text
    return text + BED_VOLUMES.format(deploy=DEPLOY, work=work)


@pytest.mark.heavy("containers-pod")
def test_the_pod_manifest_under_kube_play_keeps_the_pod_through_a_runaway(
    rootfs: Path, work: Path
) -> None:
    # The image deploy/Containerfile would build, without a registry: the
    # bed's root directory, with the Containerfile's entry point (tini aside).
    image = f"localhost/{POD}:latest"
    # Owned by the image's root, as a built image's files are (rootless, the
    # test user's own files would belong to an unprivileged user inside).
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--owner=0", "--group=0", "--numeric-owner", "-cf", "-", "."],
        stdout=subprocess.PIPE,
    )
    imported = subprocess.run(
        [
            PODMAN or "podman",
            "import",
            '--change=ENTRYPOINT ["python3", "/opt/harness/harness.py"]',
            "--change=ENV PATH=/opt/agentscope/bin:/usr/bin",
            "-",
            image,
        ],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert tar.stdout is not None
    tar.stdout.close()  # podman has read it all
    assert tar.wait() == 0
    assert imported.returncode == 0, imported.stderr
    (work / "grow.py").write_text(GROW)
    manifest = work / "pod.yaml"
    manifest.write_text(bed_manifest(work))
    ctr = f"{POD}-harness"
    try:
        played = podman("kube", "play", "--network=none", str(manifest))
        assert played.returncode == 0, played.stderr
        # The kubelet's write, on the cgroup the container's processes are in
        # (crun puts them in a leaf below the one Podman names).
        pid = podman("inspect", ctr, "--format", "{{.State.Pid}}").stdout.strip()
        own = Path(f"/proc/{pid}/cgroup").read_text().strip().partition("::")[2]
        Path(f"/sys/fs/cgroup{own}/memory.oom.group").write_text("1\n")
        waited = podman("wait", ctr, timeout=200)
        state = json.loads(podman("inspect", ctr, "--format", "{{json .State}}").stdout)
        logs = podman("logs", ctr)
    finally:
        podman("kube", "down", str(manifest))
        podman("rmi", "--force", image)
    lines = [json.loads(x) for x in logs.stdout.splitlines() if x.startswith("{")]
    print(json.dumps(lines, indent=1)[:6000], logs.stderr[-3000:])
    ran = {"rc": int(waited.stdout.strip() or -1), "state": state}
    assert (work / "oom.group").read_text().strip() == "1", "the container saw no group OOM"
    (fleet,) = (x for x in lines if x["kind"] == "fleet")
    assert fleet["mode"] == "process", fleet
    assert [x["agent"] for x in lines if x["kind"] == "launched"] == [
        *(f"sib-{i}" for i in range(AGENTS - 1)),
        "runaway",
    ]
    alive_or_group_killed(ran)
    assert ran["rc"] == 0, ran
    kills = [x for x in lines if x["kind"] in ("guard_kill", "oom_kill")]
    assert [(k["kind"], k["agent"], k["comm"]) for k in kills] == [
        ("guard_kill", "runaway", "python3")
    ]
    assert (work / "rc").read_text().strip() == "rc=137"
    ended = {x["agent"]: x["status"] for x in lines if x["kind"] == "ended"}
    assert ended == {**{f"sib-{i}": 0 for i in range(AGENTS - 1)}, "runaway": 0}
