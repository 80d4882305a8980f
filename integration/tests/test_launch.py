"""The core against real systemd: scopes, the fork race, OOM survival, control."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import MANAGER, SYSTEMD, own_children, own_fleet, systemctl

import agentscope_systemd
from agentscope_systemd import AsyncFleet, Fleet
from agentscope_systemd._managers._manager import ScopeRequest

SLICE = agentscope_systemd.DEFAULT_SLICE
OOMPOLICY_ON_SCOPES = SYSTEMD >= 252  # Debian's 252 carries the backport
CGROUP = Path("/sys/fs/cgroup")


def show(unit: str, *props: str) -> dict[str, str]:
    out = systemctl("show", *(f"-p{p}" for p in props), unit)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def slice_units() -> set[str]:
    out = subprocess.run(
        [
            "systemctl",
            *(["--user"] if MANAGER == "user" else []),
            "list-units",
            "--plain",
            "--no-legend",
            "--all",
            "agentscope-*.scope",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text().strip().split("::", 1)[1]


def scope_part(cgroup: str) -> str:
    """``cgroup`` without the ``/agent`` leaf a delegated scope holds its agent in (#26)."""
    return cgroup.removesuffix("/agent")


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


async def wait_until(cond, timeout: float = 30.0, step: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(step)
    return bool(cond())


async def test_agent_in_own_scope_with_policies(
    fleet: AsyncFleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "agentscope")
    agent = await fleet.launch("builder-1", ["sleep", "300"], stdout=subprocess.DEVNULL)
    assert agent.unit.startswith(f"agentscope-{fleet.name}-builder-1-")
    assert scope_part(cgroup_of(agent.pid)).endswith(f"/{SLICE}/{agent.unit}"), cgroup_of(agent.pid)
    assert agent.cgroup == cgroup_of(agent.pid)
    props = show(agent.unit, "Slice", "CollectMode", "OOMPolicy", "Description", "MemoryMax")
    assert props["Slice"] == SLICE
    assert props["CollectMode"] == "inactive-or-failed"
    assert props["Description"] == f"agentscope agent builder-1 of fleet {fleet.name}"
    assert props["MemoryMax"] == "infinity"
    if OOMPOLICY_ON_SCOPES:
        assert props["OOMPolicy"] == "continue"
        assert "refuses OOMPolicy" not in caplog.text
    else:
        assert "refuses OOMPolicy" in caplog.text
        assert "DefaultOOMPolicy=continue" in caplog.text
    assert oom_score_adj(agent.pid) == 800
    assert oom_score_adj(os.getpid()) >= 200
    assert Path(f"/proc/{agent.pid}/exe").resolve().name == "sleep"


def test_launches_pass_the_compiled_gate() -> None:
    # The wheel the guests install carries the launch gate as a static program
    # (integration/vm.py builds it on the host): it runs on this guest's libc,
    # every launch of this suite went through it, and doctor says so.
    from agentscope_systemd._fleet._spawn import gate_program

    program = gate_program()
    assert program is not None
    # Run bare, it refuses its arguments (exit 126): it loaded and ran here.
    assert subprocess.run([program], check=False, timeout=30).returncode == 126
    doctor = subprocess.run(
        ["agentscope", "doctor", "--json"], capture_output=True, text=True, timeout=120
    )
    (check,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "launch_gate"]
    assert check["status"] == "pass", check
    assert program in check["detail"], check


@pytest.mark.heavy("scale-launch")
async def test_fork_race_50_launches(fleet: AsyncFleet) -> None:
    script = "(cat /proc/self/cgroup); cat /proc/self/cgroup"
    for i in range(50):
        agent = await fleet.launch(f"fork-{i}", ["sh", "-c", script], stdout=subprocess.PIPE)
        assert agent.stdout is not None
        lines = (await agent.stdout.read()).decode().split()
        assert await agent.wait() == 0
        assert len(lines) == 2, lines
        for line in lines:
            assert scope_part(line).endswith(f"/{agent.unit}"), (i, lines)


async def test_stale_slice_limits_are_cleared(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agentscope")
    systemctl("set-property", "--runtime", SLICE, "MemoryHigh=100M", "MemoryMax=200M")
    assert show(SLICE, "MemoryHigh")["MemoryHigh"] == str(100 * 2**20)
    async with AsyncFleet(f"t{uuid.uuid4().hex[:8]}") as fleet:
        agent = await fleet.launch("a", ["sleep", "60"])
        try:
            props = show(SLICE, "MemoryHigh", "MemoryMax")
            assert props == {"MemoryHigh": "infinity", "MemoryMax": "infinity"}
            assert "cleared stale limits" in caplog.text
            assert await fleet.slice_limits() == dict.fromkeys(
                ("MemoryHigh", "MemoryMax", "MemorySwapMax")
            )
        finally:
            await fleet.stop(agent.name)


async def test_oom_with_cap_kills_only_the_allocator(fleet: AsyncFleet, tmp_path: Path) -> None:
    log = tmp_path / "out"
    alloc = "python3 -c 'b = b\"x\" * (200 * 2**20)'; echo rc=$?; exec sleep 300"
    sibling = await fleet.launch("sibling", ["sleep", "300"])
    with log.open("wb") as out:
        agent = await fleet.launch("capped", ["sh", "-c", alloc], stdout=out, memory_max=64 * 2**20)
    assert show(agent.unit, "MemoryMax")["MemoryMax"] == str(64 * 2**20)
    assert await wait_until(lambda: "rc=" in log.read_text(), 90), "allocator never finished"
    assert "rc=137" in log.read_text()  # SIGKILLed by the kernel
    assert sibling.alive()
    # 252+ because of OOMPolicy=continue; 247 because its scopes ignore OOM
    # kills altogether (measured: no OOMPolicy handling for scopes before 253).
    assert agent.alive(), "the shell should survive its child's OOM kill"
    assert show(agent.unit, "ActiveState")["ActiveState"] == "active"
    events = (CGROUP / cgroup_of(agent.pid).lstrip("/") / "memory.events").read_text()
    assert "oom_kill 1" in events
    listed = {a.name: a for a in await fleet.agents()}
    assert listed["capped"].oom_kills == 1
    assert listed["sibling"].oom_kills == 0
    # systemd 259 added an OOMKills property; before, the cgroup file is the only record.
    oom_kills = show(agent.unit, "OOMKills").get("OOMKills")
    if SYSTEMD >= 259:
        assert oom_kills == "1"
    else:
        assert not oom_kills


@pytest.mark.heavy("global-oom")
@pytest.mark.usefixtures("kernel_fast_oom")  # the kernel's own kill, not minutes of reclaim
async def test_global_oom_kills_only_the_runaway() -> None:
    # squeezed: the next test starts once memory is back and the bus answers.
    async with own_fleet("t", squeezed=True) as fleet:
        siblings = [await fleet.launch(f"sib-{i}", ["sleep", "600"]) for i in range(5)]
        runaway = await fleet.launch(
            "runaway",
            ["python3", "-c", "l = []\nwhile True: l.append(b'x' * 2**24)"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        status = await asyncio.wait_for(runaway.wait(), 240)
        assert status == -signal.SIGKILL
        assert all(s.alive() for s in siblings)
        # This test process is the manager: it is alive to make this assertion.
        assert oom_score_adj(os.getpid()) >= 200


async def test_stop_kill_freeze_thaw_wait(fleet: AsyncFleet) -> None:
    stubborn = await fleet.launch(
        "stubborn",
        ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None
    assert await stubborn.stdout.readline() == b"ready\n"  # the trap is in place
    t0 = time.monotonic()
    await fleet.stop("stubborn", timeout=2)
    assert time.monotonic() - t0 < 20
    assert not stubborn.alive()
    assert await stubborn.wait() == -signal.SIGKILL
    assert stubborn.unit not in slice_units() or show(stubborn.unit, "ActiveState")[
        "ActiveState"
    ] in ("inactive", "failed")

    victim = await fleet.launch("victim", ["sleep", "300"])
    await fleet.kill("victim", signal.SIGUSR1)
    assert await victim.wait() == -signal.SIGUSR1

    frozen = await fleet.launch("frozen", ["sleep", "300"])
    events = CGROUP / cgroup_of(frozen.pid).lstrip("/") / "cgroup.events"
    await fleet.freeze("frozen")
    assert "frozen 1" in events.read_text()
    await fleet.thaw("frozen")
    assert "frozen 0" in events.read_text()

    ok = await fleet.launch("exit3", ["sh", "-c", "exit 3"])
    assert await ok.wait() == 3


async def test_pipes(fleet: AsyncFleet) -> None:
    agent = await fleet.launch("cat", ["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert agent.stdin is not None
    assert agent.stdout is not None
    agent.stdin.write(b"hello agent\n")
    await agent.stdin.drain()
    agent.stdin.close()
    assert await agent.stdout.read() == b"hello agent\n"
    assert await agent.wait() == 0


async def test_adopt_moves_process_and_children(fleet: AsyncFleet) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], stdout=subprocess.DEVNULL)
    try:
        await wait_until(
            lambda: (
                len(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()) == 2
            ),
            10,
        )
        children = [
            int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        ]
        agent = await fleet.adopt(proc.pid, "external-1")
        for pid in [proc.pid, *children]:
            assert cgroup_of(pid).endswith(f"/{agent.unit}")
            assert oom_score_adj(pid) == 800
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"name": "bad name", "argv": ["true"]}, agentscope_systemd.InvalidName, "contains ' '"),
        ({"name": "-x", "argv": ["true"]}, agentscope_systemd.InvalidName, "starts with '-'"),
        (
            {"name": "ok", "argv": ["no-such-binary-xyz"]},
            agentscope_systemd.LaunchError,
            "not found",
        ),
        (
            {"name": "ok", "argv": ["/proc/self/status"]},
            agentscope_systemd.LaunchError,
            "not executable",
        ),
        (
            {"name": "ok", "argv": ["./no-such-file"]},
            agentscope_systemd.LaunchError,
            "no such file",
        ),
        (
            {"name": "ok", "argv": ["true"], "cwd": "/nonexistent"},
            agentscope_systemd.LaunchError,
            "not a directory",
        ),
        (
            {"name": "ok", "argv": ["true"], "env": {"A": 1}},
            agentscope_systemd.LaunchError,
            "str to str",
        ),
        ({"name": "ok", "argv": "true"}, agentscope_systemd.LaunchError, "non-empty list"),
        (
            {"name": "ok", "argv": ["true"], "memory_max": -1},
            agentscope_systemd.InvalidConfig,
            "MemoryMax",
        ),
    ],
)
async def test_bad_input_leaves_nothing(
    fleet: AsyncFleet, kwargs: dict[str, object], error: type[Exception], text: str
) -> None:
    before = slice_units()
    children_before = own_children()
    with pytest.raises(error, match=text):
        await fleet.launch(**kwargs)  # type: ignore[arg-type]
    assert slice_units() == before
    assert own_children() <= children_before


async def test_exec_failure_in_scope_leaves_nothing(fleet: AsyncFleet, tmp_path: Path) -> None:
    # Executable but not a program: the exec itself fails, inside the new scope.
    fake = tmp_path / "fake-binary"
    fake.write_bytes(b"\x00\x01not an ELF")
    fake.chmod(0o755)
    before = slice_units()
    with pytest.raises(agentscope_systemd.LaunchError, match="Exec format error"):
        await fleet.launch("fake", [str(fake)])
    assert await wait_until(lambda: slice_units() == before, 10)


async def test_refused_and_unknown(fleet: AsyncFleet) -> None:
    await fleet.launch("dup", ["sleep", "60"])
    with pytest.raises(agentscope_systemd.AgentExists, match="already running"):
        await fleet.launch("dup", ["sleep", "60"])
    for op in (fleet.stop, fleet.kill, fleet.freeze, fleet.thaw):
        with pytest.raises(agentscope_systemd.AgentNotFound, match="no agent 'ghost'"):
            await op("ghost")


async def test_refused_dbus_call_keeps_systemd_error(fleet: AsyncFleet) -> None:
    with pytest.raises(agentscope_systemd.InvalidName, match="slice"):
        AsyncFleet(fleet.name, slice="not a slice.slice")
    before = slice_units()
    # PID 1 is refused before systemd is asked (#31): nothing is created.
    with pytest.raises(agentscope_systemd.InvalidConfig, match="PID 1"):
        await fleet.adopt(1, "pid1")
    # systemd refuses a scope with no process: its error name and message are
    # kept through the fleet's manager (agentscope_systemd/_managers/_manager.py).
    with pytest.raises(agentscope_systemd.BusError) as info:
        await fleet._manager.start_scope(
            ScopeRequest(f"agentscope-{fleet.name}-empty-000000.scope", "x", [])
        )
    assert info.value.dbus_name.startswith("org.freedesktop"), info.value.dbus_name
    assert info.value.message
    assert "StartTransientUnit" in str(info.value)
    assert slice_units() == before


async def test_systemd_unreachable_says_where() -> None:
    env = {
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/bus",
        "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus",
        "XDG_RUNTIME_DIR": "/nonexistent",
    }
    with pytest.raises(agentscope_systemd.SystemdUnavailable, match="/nonexistent/bus"):
        async with AsyncFleet("t", env=env):
            pass


@pytest.mark.skipif(MANAGER != "user", reason="the private-socket fallback is the user manager's")
async def test_user_manager_through_its_private_socket_alone(tmp_path: Path) -> None:
    # No user bus: no $DBUS_SESSION_BUS_ADDRESS and a runtime directory with
    # only the manager's private socket in it (a short path: sun_path is small).
    runtime = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    try:
        (runtime / "systemd").mkdir()
        (runtime / "systemd" / "private").symlink_to(f"/run/user/{os.getuid()}/systemd/private")
        env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
        env["XDG_RUNTIME_DIR"] = str(runtime)
        fleet = AsyncFleet(f"p{uuid.uuid4().hex[:6]}", env=env, registry=tmp_path / "registry.db")
        await fleet.open()
        try:
            async with asyncio.timeout(120):
                agent = await fleet.launch(
                    "direct", ["sh", "-c", "(cat /proc/self/cgroup)"], stdout=subprocess.PIPE
                )
                assert agent.stdout is not None
                line = (await agent.stdout.read()).decode().strip()
                assert await agent.wait() == 0
            assert scope_part(line).endswith(f"/{agent.unit}"), line
            assert fleet.bus_address.endswith("/systemd/private"), fleet.bus_address
        finally:
            await fleet.aclose()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.heavy("scale-launch")
async def test_100_concurrent_launches(fleet: AsyncFleet) -> None:
    agents = await asyncio.gather(*(fleet.launch(f"c{i}", ["sleep", "120"]) for i in range(100)))
    units = {a.unit for a in agents}
    assert len(units) == 100
    for a in agents:
        assert scope_part(cgroup_of(a.pid)).endswith(f"/{a.unit}")
    assert len(await fleet.agents()) == 100


async def test_probe_reports_this_systemd() -> None:
    caps = await agentscope_systemd.probe()
    assert caps.manager == MANAGER
    assert caps.systemd_version.startswith(str(SYSTEMD))
    assert caps.cgroup_v2
    assert caps.memory_controller
    assert caps.scope_oom_policy == OOMPOLICY_ON_SCOPES
    assert caps.pidfds == (SYSTEMD >= 255)


@pytest.mark.heavy("facade")
def test_blocking_fleet_from_script_and_threads(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import agentscope_systemd, subprocess\n"
        "with agentscope_systemd.Fleet('script') as f:\n"
        "    a = f.launch('one', ['sh', '-c', 'echo hi'], stdout=subprocess.PIPE)\n"
        "    print(a.stdout.read().decode().strip(), a.wait())\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hi 0"

    errors: list[BaseException] = []
    with Fleet(f"t{uuid.uuid4().hex[:8]}") as fleet:

        def work(n: int) -> None:
            try:
                for i in range(3):
                    agent = fleet.launch(f"th{n}-{i}", ["sleep", "60"])
                    assert scope_part(cgroup_of(agent.pid)).endswith(f"/{agent.unit}")
                    fleet.stop(agent.name, timeout=5)
                    assert agent.wait(10) == -signal.SIGTERM
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
