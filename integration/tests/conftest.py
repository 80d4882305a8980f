"""Fixtures for the in-VM suite: which manager and systemd this run is for.

The host runner (integration/vm.py) sets AGENTSCOPE_TEST_MANAGER,
AGENTSCOPE_TEST_SYSTEMD and AGENTSCOPE_TEST_DISTRO; the suite runs as root for
the system manager and as the lingering test user for the user manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import BusType
from dbus_fast.aio import MessageBus

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from roothelper import as_root

import agentscope_systemd
from agentscope_systemd import AsyncFleet
from agentscope_systemd._kernel._proc import read_stat

MANAGER = os.environ.get("AGENTSCOPE_TEST_MANAGER", "system")
SYSTEMD = int(os.environ.get("AGENTSCOPE_TEST_SYSTEMD", "0"))
DISTRO = os.environ.get("AGENTSCOPE_TEST_DISTRO", "unknown")
EVERYWHERE = os.environ.get("AGENTSCOPE_TEST_EVERYWHERE") == "1"

# The heavy tests: those whose subject is the library's own logic (under load,
# over HTTP, in its blocking facade, in its process mode, in its CLI), the
# guard against a kernel, or a host profile, not a difference between
# systemd versions or managers. Each runs in one to six of the matrix's
# eight suites, placed so that every VM (a distro's system suite, then its
# user suite) carries about the same (CI's time, issue #29: CI's run of
# 2026-12-03 timed out at 90 minutes with every VM at 2,300-3,400 s; the
# figures are a slow day's per placement). Where a group runs twice it runs
# under both managers, on different distros:
# - under memory pressure, against a kernel: the guard's tests (45-170 s)
#   on 6.1 under both managers and on sid's kernel (trixie's 6.12 and sid's
#   have the guard in the host profiles and the shared-host tests too,
#   trixie's also in the containers); the throttle test once on each distro;
# - the library at scale: the 100-agent tests (150-300 s) in one suite, the
#   launch races (160 s) in another;
# - the calls' churn (40-89 s), the CLI's flows (55-137 s), the facade, the
#   HTTP face, the docs' examples, the demo, the limits and tmux's CLI and
#   adoption: twice each;
# - the monitor's install (85-117 s): once on each distro, each manager on
#   two, since the units it writes are read by every systemd version;
# - the kernel's own global OOM kill (15-48 s; on sd247 17-182 s, with
#   kcompactd and khugepaged soft-locked for 22-35 s, 2026-12-04): its
#   subject is the kernel's choice by oom_score_adj, so each kernel under
#   both managers: bookworm's 6.1 (which sd247 boots too), trixie's, sid's;
# - the host profiles and the shared-host tests need systemd-oomd (trixie
#   and sid have it): each profile under each manager once; the oomd call
#   test under the user manager, the desktop's case (130-290 s);
# - Podman and node are in trixie's image only (integration/images.py): the
#   runaway in a container without the guard under both managers, with the
#   guard each way once (the pod's read-only cgroupfs as root, the delegated
#   one rootless), the CLI inside a container as root, the pod manifest
#   under `podman kube play` rootless.
# The chaos test is not among them: #18 asks for it on every distro under
# both managers. `vm.py --everywhere` (make integration EVERYWHERE=1) runs
# all of them in every suite.
HEAVY_SUITES: dict[str, frozenset[tuple[str, str]]] = {
    "scale": frozenset({("bookworm", "user")}),
    "scale-launch": frozenset({("sd247", "system")}),
    "calls-churn": frozenset({("sd247", "system"), ("bookworm", "user")}),
    "cli-flow": frozenset({("sd247", "system"), ("sid", "user")}),
    "tmux-cli": frozenset({("bookworm", "user"), ("sid", "system")}),
    "demo": frozenset({("sd247", "user"), ("bookworm", "system")}),
    "docs": frozenset({("sd247", "system"), ("bookworm", "user")}),
    "facade": frozenset({("sid", "user"), ("sd247", "system")}),
    "limits": frozenset({("sd247", "user"), ("bookworm", "system")}),
    "monitor-http": frozenset({("sid", "system"), ("bookworm", "user")}),
    "tmux-adopt": frozenset({("sid", "system"), ("sd247", "user")}),
    "global-oom": frozenset(
        {(d, m) for d in ("bookworm", "trixie", "sid") for m in ("system", "user")}
    ),
    "install": frozenset(
        {("sd247", "system"), ("bookworm", "user"), ("trixie", "user"), ("sid", "system")}
    ),
    "guard": frozenset({("sd247", "user"), ("bookworm", "system"), ("sid", "system")}),
    # The guard's restraint under a scope's own MemoryHigh: the kernel's PSI is
    # its subject, so one suite on each distro (sd247 and bookworm share 6.1).
    "throttle": frozenset(
        {("sd247", "user"), ("bookworm", "system"), ("trixie", "user"), ("sid", "system")}
    ),
    "profile-ubuntu": frozenset({("trixie", "system"), ("sid", "user")}),
    "profile-fedora": frozenset({("trixie", "user"), ("sid", "system")}),
    "shared-host": frozenset({("trixie", "system"), ("sid", "user")}),
    "oomd-calls": frozenset({("sid", "user")}),
    "containers": frozenset({("trixie", "system"), ("trixie", "user")}),
    "containers-process": frozenset({("trixie", "system")}),
    "containers-cgroup": frozenset({("trixie", "user")}),
    "containers-cli": frozenset({("trixie", "system")}),
    "containers-pod": frozenset({("trixie", "user")}),
    "node": frozenset({("trixie", "user")}),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "heavy(group): runs only in the suites HEAVY_SUITES names for its group"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests that ended before a guest kernel panic, in a boot that finishes
    # the suite (integration/vm.py): one id a line.
    if done_file := os.environ.get("AGENTSCOPE_TEST_DESELECT"):
        done = set(Path(done_file).read_text().splitlines())
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
        items[:] = [i for i in items if i.nodeid not in done]
    if EVERYWHERE:
        return
    for item in items:
        marker = item.get_closest_marker("heavy")
        if marker is None:
            continue
        (group,) = marker.args
        suites = HEAVY_SUITES[group]  # a KeyError here is a typo in a test's marker
        if (DISTRO, MANAGER) not in suites:
            where = ", ".join(f"{d} {m}" for d, m in sorted(suites))
            item.add_marker(pytest.mark.skip(reason=f"heavy ({group}): runs on {where}"))


# A runaway as agents' tool calls are: it grows by 4 MiB every 0.25 s.
GROW = "import time\nl = []\nwhile True:\n    l.append(b'x' * (4 << 20))\n    time.sleep(0.25)"


def meminfo_kib() -> dict[str, int]:
    """/proc/meminfo's figures, in KiB."""
    return {
        k: int(v.split()[0])
        for k, _, v in (x.partition(":") for x in Path("/proc/meminfo").read_text().splitlines())
    }


def memory_back() -> bool:
    """Whether the VM has half its memory available again (after a squeeze)."""
    info = meminfo_kib()
    return info["MemAvailable"] > info["MemTotal"] // 2


@contextlib.asynccontextmanager
async def own_fleet(prefix: str, *, squeezed: bool = False) -> AsyncIterator[AsyncFleet]:
    """A fleet of its own; every agent it still has is stopped after.

    ``squeezed``: the test ran the host short of memory, and the next one
    starts from a host that has its memory back (up to 60 s).
    """
    async with AsyncFleet(f"{prefix}{uuid.uuid4().hex[: 8 - len(prefix) + 1]}") as f:
        try:
            yield f
        finally:
            for agent in await f.agents():
                with contextlib.suppress(agentscope_systemd.AgentscopeError):
                    await f.stop(agent.name, timeout=5)
            for _ in range(300 if squeezed else 0):  # 60 s
                if memory_back():
                    break
                await asyncio.sleep(0.2)
            if squeezed:
                await _bus_answers()


async def _bus_answers(timeout: float = 60.0) -> None:
    """Wait until the manager's bus answers again after a squeeze.

    Seen in CI (bookworm, system, after the kernel's global OOM kill): the
    next test's connect to the system bus timed out (10 s) while the bus
    daemon paged its code back in; the test after it connected at once.
    """
    bus = "--user" if MANAGER == "user" else "--system"
    dbus = "org.freedesktop.DBus"
    argv = ["busctl", bus, "call", dbus, "/org/freedesktop/DBus", dbus, "GetId"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            async with asyncio.timeout(10):
                if await proc.wait() == 0:
                    return
        except TimeoutError:
            proc.kill()
            await proc.wait()
        await asyncio.sleep(0.5)


@pytest.fixture
async def fleet() -> AsyncIterator[AsyncFleet]:
    """A fleet of its own per test; every agent it still has is stopped after the test."""
    async with own_fleet("t") as f:
        yield f


@functools.cache
def _schema_registry() -> Any:
    from referencing import Registry, Resource

    from agentscope_systemd._contract import load_schemas, schema_dir

    # The schemas the wheel installed (agentscope_systemd/_schemas), as a harness reads them.
    assert schema_dir().name == "_schemas", schema_dir()
    return Registry().with_resources(
        (sid, Resource.from_contents(s)) for sid, s in load_schemas().items()
    )


def validate(data: Any) -> str:
    """Check one --json output against the schema its ``schema`` field names; return the name."""
    from jsonschema import Draft202012Validator

    name = str(data["schema"])
    shape = name.removeprefix("agentscope.").partition("/")[0]
    registry = _schema_registry()
    schema = registry.contents(f"urn:agentscope:schema:{shape}")
    Draft202012Validator(schema, registry=registry).validate(data)
    return name


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


def own_children() -> set[str]:
    """This process's children, whichever of its threads forked them.

    Read from each process's parent in /proc/PID/stat, which names the
    parent process, not its thread. The threads' ``task/*/children`` lists
    were read before, but the library forks from worker threads, and a
    thread's children move to another thread when it exits: a scan in
    between missed them (CI rehearsal, sd247: an empty set right after a
    launch).
    """
    me = os.getpid()
    found: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        st = read_stat(int(entry.name))  # None: it ended meanwhile
        # Zombies too: a child not reaped is one the test must see.
        if st is not None and st.ppid == me:
            found.add(entry.name)
    return found


CLI = shutil.which("agentscope") or "agentscope"


def _drain(sock: socket.socket) -> None:
    """Read a notify socket until it is closed."""
    with contextlib.suppress(OSError):
        while sock.recv(4096):
            pass


@contextlib.contextmanager
def cli_monitor(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """``agentscope ARGS`` (a monitor), yielded once it told READY=1; killed after if still up.

    Its READY=1 on a NOTIFY_SOCKET of the test's says when it watches, as it
    tells systemd under Type=notify: a fixed sleep for its start under TCG
    was too short under load and too long without (issue #29, CI's time).
    stdout and stderr are pipes for the test to read.
    """
    where = Path(tempfile.mkdtemp(prefix="as-"))  # AF_UNIX: 108 bytes
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(where / "notify"))
    notify.settimeout(1)
    monitor = subprocess.Popen(
        [CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {}), "NOTIFY_SOCKET": str(where / "notify")},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert monitor.poll() is None, f"the monitor ended: {monitor.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "no READY=1 from the monitor in 120 s"
            with contextlib.suppress(TimeoutError):
                if b"READY=1" in notify.recv(4096):
                    break
        # It goes on sending WATCHDOG/STATUS; a socket gone or full would stop it.
        notify.settimeout(None)
        threading.Thread(target=_drain, args=(notify,), daemon=True).start()
        yield monitor
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.communicate()
        notify.close()
        shutil.rmtree(where, ignore_errors=True)


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
