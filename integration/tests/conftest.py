"""Fixtures for the in-VM suite: which manager and systemd this run is for.

The host runner (integration/vm.py) sets AGENTSCOPE_TEST_MANAGER,
AGENTSCOPE_TEST_SYSTEMD and AGENTSCOPE_TEST_DISTRO; the suite runs as root for
the system manager and as the lingering test user for the user manager.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
from dbus_fast import BusType
from dbus_fast.aio import MessageBus

MANAGER = os.environ.get("AGENTSCOPE_TEST_MANAGER", "system")
SYSTEMD = int(os.environ.get("AGENTSCOPE_TEST_SYSTEMD", "0"))
DISTRO = os.environ.get("AGENTSCOPE_TEST_DISTRO", "unknown")


@pytest.fixture
def manager() -> str:
    return MANAGER


@pytest.fixture
def systemd_version() -> int:
    return SYSTEMD


@pytest.fixture
async def raw_bus() -> AsyncIterator[MessageBus]:
    """A plain dbus-fast connection to the manager under test."""
    bus_type = BusType.SYSTEM if MANAGER == "system" else BusType.SESSION
    bus = await MessageBus(bus_type=bus_type).connect()
    try:
        yield bus
    finally:
        bus.disconnect()


def systemctl(*args: str) -> str:
    """Run systemctl against the manager under test; return stdout."""
    cmd = ["systemctl", *(["--user"] if MANAGER == "user" else []), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A cheap process to put into scopes; killed afterwards."""
    proc = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
