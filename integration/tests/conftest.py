"""Fixtures for the in-VM suite: which manager and systemd this run is for.

The host runner (integration/vm.py) sets AGENTSCOPE_TEST_MANAGER,
AGENTSCOPE_TEST_SYSTEMD and AGENTSCOPE_TEST_DISTRO; the suite runs as root for
the system manager and as the lingering test user for the user manager.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dbus_fast import BusType
from dbus_fast.aio import MessageBus

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from roothelper import as_root

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


_LRU_GEN = Path("/sys/kernel/mm/lru_gen")


@pytest.fixture
def kernel_fast_oom() -> Iterator[None]:
    """MGLRU's thrashing protection (min_ttl_ms) for one test, then Debian's values back.

    For a test of the kernel's own global OOM kill: with Debian's defaults
    the kernel reclaims page cache for minutes before it kills (measured on
    trixie's 6.12 under TCG: 16 MiB steps ~140 s, 59-275 s in issue #20's
    squeeze); with min_ttl_ms kswapd OOM-kills once the working set of the
    last N ms cannot stay resident (9 s). 5000 ms because a TCG guest starved
    of host CPU ages its pages in slow motion. Users' hosts lack it unless
    they opt in (``agentscope install --mglru-protection``), so only the
    test that needs it sets it.
    """
    if not (_LRU_GEN / "min_ttl_ms").exists():
        pytest.skip("this kernel has no MGLRU min_ttl_ms")
    enabled = (_LRU_GEN / "enabled").read_text().strip()
    ttl = (_LRU_GEN / "min_ttl_ms").read_text().strip()
    as_root("lru_gen", "y", "5000")
    try:
        yield
    finally:
        as_root("lru_gen", enabled, ttl)
