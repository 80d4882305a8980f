"""Smoke tests: prove the test bed is a real kernel with a real systemd."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import DISTRO, MANAGER, SYSTEMD, systemctl
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

CGROUP = Path("/sys/fs/cgroup")
SD = "org.freedesktop.systemd1"
SD_PATH = "/org/freedesktop/systemd1"
SD_MANAGER = "org.freedesktop.systemd1.Manager"


def _manager_root() -> Path:
    if MANAGER == "system":
        return CGROUP
    uid = os.getuid()
    return CGROUP / f"user.slice/user-{uid}.slice/user@{uid}.service"


async def _call(
    bus: MessageBus, member: str, signature: str = "", body: list[object] | None = None
) -> list[object]:
    reply = await bus.call(
        Message(
            destination=SD,
            path=SD_PATH,
            interface=SD_MANAGER,
            member=member,
            signature=signature,
            body=body or [],
        )
    )
    assert reply is not None
    if reply.message_type == MessageType.ERROR:
        raise AssertionError(f"{member}: {reply.error_name}: {reply.body}")
    return reply.body


def test_smoke_cgroup_v2_with_memory_controller() -> None:
    mounts = Path("/proc/self/mounts").read_text().split("\n")
    assert any(line.split()[1:3] == ["/sys/fs/cgroup", "cgroup2"] for line in mounts if line), (
        "cgroup v2 is not mounted at /sys/fs/cgroup"
    )
    controllers = (_manager_root() / "cgroup.controllers").read_text().split()
    assert "memory" in controllers, f"memory controller not available to the {MANAGER} manager"


def test_smoke_the_bed_runs_debians_kernel_defaults() -> None:
    # Users' hosts have no MGLRU min_ttl_ms and a closed kernel log unless
    # something sets them; a test that needs otherwise sets it and restores it
    # (conftest.kernel_fast_oom). earlyoom is in the image for bench_squeeze.py
    # only, masked so it never acts in a test.
    ttl = Path("/sys/kernel/mm/lru_gen/min_ttl_ms")
    if ttl.exists():
        assert ttl.read_text().strip() == "0"
    assert Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
    state = subprocess.run(
        ["systemctl", "is-enabled", "earlyoom.service"], capture_output=True, text=True
    ).stdout.strip()
    assert state == "masked"


async def test_smoke_manager_version_over_dbus(raw_bus: MessageBus) -> None:
    reply = await raw_bus.call(
        Message(
            destination=SD,
            path=SD_PATH,
            interface="org.freedesktop.DBus.Properties",
            member="Get",
            signature="ss",
            body=[SD_MANAGER, "Version"],
        )
    )
    assert reply is not None
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    version = reply.body[0].value
    print(f"{DISTRO} {MANAGER} manager: systemd {version}")
    assert str(version).split(".")[0].split("~")[0] == str(SYSTEMD), version


async def test_smoke_transient_scope_up_and_down(
    raw_bus: MessageBus, sleeper: subprocess.Popen[bytes]
) -> None:
    unit = f"smoke-{uuid.uuid4().hex[:8]}.scope"
    await _call(raw_bus, "Subscribe")
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_message(msg: Message) -> None:
        if msg.member == "JobRemoved" and msg.body[2] == unit and not done.done():
            done.set_result(msg.body[3])

    raw_bus.add_message_handler(on_message)
    await raw_bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[f"type='signal',sender='{SD}',interface='{SD_MANAGER}',member='JobRemoved'"],
        )
    )
    await _call(
        raw_bus,
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        [
            unit,
            "fail",
            [
                ["PIDs", Variant("au", [sleeper.pid])],
                ["Description", Variant("s", "agentscope smoke test")],
                ["MemoryAccounting", Variant("b", True)],
            ],
            [],
        ],
    )
    assert await asyncio.wait_for(done, 30) == "done"
    cgroup = Path(f"/proc/{sleeper.pid}/cgroup").read_text().strip()
    assert cgroup.endswith(f"/{unit}"), cgroup
    scope_dir = CGROUP / cgroup.split("::", 1)[1].lstrip("/")
    assert (scope_dir / "memory.current").exists(), "no memory accounting in the scope"
    assert "ActiveState=active" in systemctl("show", "-p", "ActiveState", unit)

    await _call(raw_bus, "StopUnit", "ss", [unit, "fail"])
    for _ in range(100):
        if not scope_dir.exists():
            break
        await asyncio.sleep(0.1)
    assert not scope_dir.exists(), "scope cgroup still there after StopUnit"
    assert sleeper.wait(10) == -15, "StopUnit should have sent SIGTERM to the scope's process"
    with pytest.raises(subprocess.CalledProcessError):
        # LoadState=not-found, or the unit is gone: either way not active.
        subprocess.run(
            ["systemctl", *(["--user"] if MANAGER == "user" else []), "is-active", "-q", unit],
            check=True,
        )
