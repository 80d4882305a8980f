"""Launch latency: agentscope against systemd-run --scope, in one run.

Run inside a VM of the test bed (``make bench BENCH=bench_launch.py``), or on
any systemd host. Both sides start the same command (``true``) and are timed
from the call until the started process has exited: agentscope's
``launch()`` + ``wait()`` on one open connection, against a fresh
``systemd-run --scope [--user] -q true``. Prints medians and their ratio,
then 100 concurrent launches: wall time and the event loop's worst lag,
measured by a 10 ms ticker task.

It also measures the floor any race-free launch has: the bare
``StartTransientUnit`` call for an already running process until its job's
``JobRemoved`` arrives, on a plain dbus-fast connection with nothing else
(no fork, no registry, no agentscope code), and prints it as a fraction of
systemd-run's time: no launch that waits for the scope's start job can be
faster than that. Then the same start job over the manager's private socket
(no bus daemon in between), which is how systemd-run itself talks to systemd.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

import agentscope_systemd
from agentscope_systemd._managers import _wire

N = int(os.environ.get("BENCH_N", "50"))


async def _agentscope(fleet: agentscope_systemd.AsyncFleet, n: int) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        agent = await fleet.launch(f"b{i}", ["true"])
        await agent.wait()
        times.append(time.perf_counter() - t0)
    return times


def _systemd_run(manager: str, n: int) -> list[float]:
    cmd = ["systemd-run", *(["--user"] if manager == "user" else []), "--scope", "-q", "true"]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


async def _job_floor(manager: str, slice_name: str, n: int) -> list[float]:
    """The scope start job round trip alone, for a process that is already running."""
    bus = await MessageBus(
        bus_type=BusType.SYSTEM if manager == "system" else BusType.SESSION
    ).connect()
    loop = asyncio.get_running_loop()
    results: dict[str, asyncio.Future[str]] = {}

    def on_message(msg: Message) -> bool:
        if msg.message_type == MessageType.SIGNAL and msg.member == "JobRemoved":
            fut = results.get(msg.body[2])
            if fut is not None and not fut.done():
                fut.set_result(msg.body[3])
        return False

    def manager_call(member: str, signature: str = "", body: list[object] | None = None) -> Message:
        return Message(
            destination="org.freedesktop.systemd1",
            path="/org/freedesktop/systemd1",
            interface="org.freedesktop.systemd1.Manager",
            member=member,
            signature=signature,
            body=body or [],
        )

    bus.add_message_handler(on_message)
    await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=["type='signal',interface='org.freedesktop.systemd1.Manager',member='JobRemoved'"],
        )
    )
    await bus.call(manager_call("Subscribe"))
    tag = uuid.uuid4().hex[:6]
    times = []
    try:
        for i in range(n):
            proc = subprocess.Popen(["sleep", "60"])
            unit = f"floor-{tag}-{i}.scope"
            results[unit] = loop.create_future()
            props = [["PIDs", Variant("au", [proc.pid])], ["Slice", Variant("s", slice_name)]]
            t0 = time.perf_counter()
            reply = await bus.call(
                manager_call("StartTransientUnit", "ssa(sv)a(sa(sv))", [unit, "fail", props, []])
            )
            if reply is None or reply.message_type == MessageType.ERROR:
                raise RuntimeError(f"StartTransientUnit failed: {reply and reply.body}")
            result = await asyncio.wait_for(results[unit], 60)
            del results[unit]
            times.append(time.perf_counter() - t0)
            proc.kill()
            proc.wait()
            if result != "done":
                raise RuntimeError(f"{unit}: job result {result}")
    finally:
        bus.disconnect()
    return times


def _direct_floor(manager: str, slice_name: str, n: int) -> list[float]:
    """The same start job over the manager's private socket, as systemd-run talks to it.

    systemd-run (and systemctl) connect straight to ``/run/systemd/private``
    as root and to ``$XDG_RUNTIME_DIR/systemd/private`` for the user manager,
    with no bus daemon in between; agentscope's fleets use the bus.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    path = "/run/systemd/private" if manager == "system" else f"{runtime}/systemd/private"
    conn = _wire.Connection(manager, f"unix:path={path}", direct=True)
    tag = uuid.uuid4().hex[:6]
    times = []
    try:
        for sent, method in conn.greet():
            conn.reply(sent, method)
        for i in range(n):
            proc = subprocess.Popen(["sleep", "60"])
            props = {"PIDs": ("au", [proc.pid]), "Slice": ("s", slice_name)}
            t0 = time.perf_counter()
            (job,) = conn.call(
                "StartTransientUnit",
                "ssa(sv)a(sa(sv))",
                [f"floor-{tag}-d{i}.scope", "fail", list(props.items()), []],
            )
            result = conn.job_result(job)
            times.append(time.perf_counter() - t0)
            proc.kill()
            proc.wait()
            if result != "done":
                raise RuntimeError(f"job {job}: result {result}")
    finally:
        conn.close()
    return times


async def _concurrent(fleet: agentscope_systemd.AsyncFleet, n: int) -> tuple[float, float]:
    worst = 0.0
    stop = False

    async def ticker() -> None:
        nonlocal worst
        loop = asyncio.get_running_loop()
        while not stop:
            t = loop.time()
            await asyncio.sleep(0.01)
            worst = max(worst, loop.time() - t - 0.01)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    agents = await asyncio.gather(*(fleet.launch(f"c{i}", ["sleep", "60"]) for i in range(n)))
    wall = time.perf_counter() - t0
    stop = True
    await tick
    await asyncio.gather(*(fleet.kill(a.name, 9) for a in agents))
    return wall, worst


async def main() -> None:
    async with agentscope_systemd.AsyncFleet(f"bench{uuid.uuid4().hex[:6]}") as fleet:
        manager = fleet.manager
        await _agentscope(fleet, 3)  # warm up: slice check, first D-Bus round trips
        _systemd_run(manager, 3)
        ours = statistics.median(await _agentscope(fleet, N))
        theirs = statistics.median(_systemd_run(manager, N))
        floor = statistics.median(await _job_floor(manager, fleet.slice, N))
        direct = statistics.median(_direct_floor(manager, fleet.slice, N))
        version = fleet.systemd_version
        print(f"launch latency ({manager} manager, systemd {version}, median of {N}):")
        print(f"  agentscope launch+wait   {ours * 1000:8.1f} ms")
        print(f"  systemd-run --scope true {theirs * 1000:8.1f} ms")
        print(f"  ratio                    {ours / theirs:8.2f}x  (target <= 0.35x)")
        print(
            f"  floor: the scope start job alone {floor * 1000:.1f} ms = "
            f"{floor / theirs:.2f}x of systemd-run (no race-free launch over the bus "
            "can be faster)"
        )
        print(
            f"  the same over the private socket {direct * 1000:.1f} ms = "
            f"{direct / theirs:.2f}x (systemd-run's way: no bus daemon)",
            flush=True,
        )
    async with agentscope_systemd.AsyncFleet(f"bench{uuid.uuid4().hex[:6]}") as fleet:
        await _agentscope(fleet, 1)
        wall, lag = await _concurrent(fleet, 100)
        print(f"100 concurrent launches: {wall:.2f} s wall, worst loop lag {lag * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
