"""A fake systemd manager for host tests of the fleet's own logic.

:class:`FakeSystemd` is a :class:`agentscope_systemd._managers._bus.SystemdBus` whose
``connect`` and ``call`` answer as systemd's manager does for the calls the
core makes, over a fake cgroup tree (:mod:`fakefs`) at ``cgroup_root``.
Everything above ``call`` (job waiting, the JobRemoved handler, property
packing) is the real code: a job's end is delivered as a JobRemoved signal
message to the real handler.

The processes are real (the fleet forks them), so ``/proc`` is the real one;
a scope is a directory of the fake tree whose ``cgroup.procs`` lists them.
Like systemd, a scope ends when its last process exits (a zombie has left
its cgroup): its directory goes and the unit is collected.

What it does not model is the kernel's side of systemd (moving processes,
OOM, PSI): the VM tests are the truth for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import gc
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from dbus_fast import Message, MessageType, Variant

from agentscope_systemd._errors import BusError
from agentscope_systemd._managers._bus import INFINITY, PROPS, SystemdBus
from agentscope_systemd._managers._scope import manager_cgroup, slice_relpath
from tests import fakefs

_ACTIVE = ("active", "activating", "deactivating", "reloading")


@dataclass
class FakeUnit:
    name: str
    props: dict[str, Any]
    cgroup: Path
    active: str = "active"
    stop_job: bool = False
    #: Whether it ever held a process: one that never did gets no "empty"
    #: notification from the kernel, so systemd keeps it active until stopped.
    populated: bool = False


@dataclass
class Call:
    member: str
    body: list[Any]
    fds: list[int] = field(default_factory=list)


def end_children() -> None:
    """Kill and reap every child a test left running.

    Agents outlive a closed fleet by design, so a test's agents (real
    ``sleep`` and ``sh`` children here) are ended after it by whoever made them.
    """
    for obj in gc.get_objects():
        if isinstance(obj, subprocess.Popen) and obj.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                obj.kill()
            obj.wait()


def _pid_of_pidfd(fd: int) -> int:
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise BusError("StartTransientUnit", "org.freedesktop.DBus.Error.InvalidArgs", "not a pidfd")


def _gone(pid: int) -> bool:
    """Whether a process has left its cgroup: exited (a zombie has) or reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat.rpartition(b")")[2].split()[0] in (b"Z", b"X")


_CONTROL_FILES = (
    ("pids", "pids.max"),
    ("cpu", "cpu.weight"),
    ("cpu", "cpu.max"),
    ("io", "io.weight"),
    ("cpuset", "cpuset.cpus"),
    ("cpuset", "cpuset.cpus.effective"),
)


def _signature(value: Any) -> str:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        return "t"
    if isinstance(value, bytes):
        return "ay"
    if isinstance(value, list):
        return "au"
    return "s"


def _children(pids: Sequence[int]) -> list[int]:
    out: list[int] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    return out


class FakeSystemd(SystemdBus):
    """A systemd manager answering on the bus, over a fake cgroup tree.

    ``version`` "252" refuses OOMPolicy on scopes as systemd before 253 does;
    "257" takes processes as PIDFDs. ``start_results`` / ``stop_results``
    give the job result of the next start / stop of an agent name (default
    ``done``). ``calls`` records every method called. ``held`` maps a
    resource property to the value systemd keeps whatever is asked (a clamp;
    ``None``: dropped); ``controllers`` are those enabled for scopes, whose
    files (``pids.max``...) a scope's cgroup gets. With ``follow_forks`` a
    process forked by one in a scope joins it, as the kernel does.
    """

    def __init__(
        self,
        cgroup_root: Path,
        *,
        manager: str = "user",
        version: str = "257",
        slice: str = "app-agentscope-agents.slice",
    ) -> None:
        super().__init__(manager)
        self.cgroup_root = cgroup_root
        self._version = version
        self.slice = slice
        self.units: dict[str, FakeUnit] = {}
        self.slice_props: dict[str, Any] = {
            "MemoryHigh": INFINITY,
            "MemoryMax": INFINITY,
            "MemorySwapMax": INFINITY,
        }
        self.start_results: dict[str, str] = {}
        self.stop_results: dict[str, str] = {}
        self.calls: list[Call] = []
        #: A fake /proc whose ``PID/cgroup`` AttachProcessesToUnit rewrites, as
        #: the kernel shows a move (None: moves show in cgroup.procs only).
        self.proc_root: Path | None = None
        #: (D-Bus error name, text) AttachProcessesToUnit answers instead of moving.
        self.attach_refusal: tuple[str, str] | None = None
        self.held: dict[str, Any] = {}
        self.controllers = ("memory", "pids", "cpu")
        # Off by default: finding children costs a walk of /proc per tick.
        self.follow_forks = False
        self.connected = False
        self._job = 0
        self._collector: asyncio.Task[None] | None = None
        fakefs.make_cgroup_root(cgroup_root)
        self.slice_dir = Path(
            f"{manager_cgroup(self.manager, root=str(cgroup_root))}/{slice_relpath(slice)}"
        )

    # -- the SystemdBus surface ----------------------------------------------

    UNIQUE_NAME = ":1.1"

    async def connect(self) -> Any:
        self.connected = True
        self.version = self._version
        self.address = "unix:path=/fake/systemd"
        # The manager's unique name on the bus: the real JobRemoved filter
        # (_wire.from_systemd) believes only signals sent under it.
        self._owner, self._direct = self.UNIQUE_NAME, False
        if self._collector is None or self._collector.done():
            self._collector = asyncio.get_running_loop().create_task(self._collect())
        return self

    def close(self) -> None:
        self.connected = False
        if self._collector is not None:
            self._collector.cancel()
            self._collector = None

    async def call(
        self,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        *,
        path: str = "/org/freedesktop/systemd1",
        interface: str = "org.freedesktop.systemd1.Manager",
        unix_fds: Sequence[int] = (),
    ) -> list[Any]:
        await self.connect()
        self.calls.append(Call(member, list(body), list(unix_fds)))
        await asyncio.sleep(0)  # a round trip: other tasks run meanwhile
        if interface == PROPS:
            return self._properties(member, path, list(body))
        handler = getattr(self, f"_m_{member}", None)
        if handler is None:
            raise BusError(member, "org.freedesktop.DBus.Error.UnknownMethod", member)
        result: list[Any] = handler(member, list(body), list(unix_fds))
        return result

    # -- helpers for tests ---------------------------------------------------

    def scope_pids(self, unit: str) -> list[int]:
        procs = self.units[unit].cgroup / "cgroup.procs"
        return [int(p) for p in procs.read_text().split()]

    def fleet_units(self, fleet: str) -> list[str]:
        return sorted(u for u in self.units if u.startswith(f"agentscope-{fleet}-"))

    def crash_scope(self, unit: str, fleet: str, agent: str, pids: Sequence[int]) -> None:
        """A scope of ``agent`` that a manager started and then died (no row of ours)."""
        self._add_unit(unit, f"agentscope agent {agent} of fleet {fleet}", pids)

    # -- the manager's methods -----------------------------------------------

    def _unit(self, member: str, name: str) -> FakeUnit:
        unit = self.units.get(name)
        if unit is None:
            raise BusError(
                member, "org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded."
            )
        return unit

    def _add_unit(self, name: str, description: str, pids: Sequence[int]) -> FakeUnit:
        cg = fakefs.make_cgroup(self.slice_dir, name, procs=pids)
        unit = FakeUnit(name, {"Description": description}, cg, populated=bool(pids))
        self.units[name] = unit
        return unit

    def _job_removed(self, unit: str, result: str) -> str:
        self._job += 1
        job_id, path = self._job, f"/org/freedesktop/systemd1/job/{self._job}"
        signal_msg = Message(
            message_type=MessageType.SIGNAL,
            sender=self.UNIQUE_NAME,
            path="/org/freedesktop/systemd1",
            interface="org.freedesktop.systemd1.Manager",
            member="JobRemoved",
            signature="uoss",
            body=[job_id, path, unit, result],
        )
        # Sent after the method's reply, as systemd does.
        asyncio.get_running_loop().call_soon(self._on_message, signal_msg)
        return path

    def _m_StartTransientUnit(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        name, _mode, props, _aux = body
        values = {k: v.value if isinstance(v, Variant) else v for k, v in props}
        if name in self.units:
            raise BusError(m, "org.freedesktop.systemd1.UnitExists", f"Unit {name} exists.")
        if "OOMPolicy" in values and int(self._version) < 253:
            raise BusError(
                m,
                "org.freedesktop.DBus.Error.PropertyReadOnly",
                "Cannot set property OOMPolicy, or unknown property.",
            )
        if values.get("Slice") != self.slice:
            raise BusError(m, "org.freedesktop.DBus.Error.InvalidArgs", "wrong slice")
        if "PIDFDs" in values:
            pids = [_pid_of_pidfd(fds[i]) for i in values["PIDFDs"]]
        else:
            pids = list(values.get("PIDs", []))
        agent = str(values["Description"]).split(" ")[2]
        result = self.start_results.pop(agent, "done")
        if result == "done":
            unit = self._add_unit(name, str(values["Description"]), pids)
            unit.props.update(values)
            for key, held in self.held.items():
                if key in unit.props:
                    if held is None:
                        del unit.props[key]
                    else:
                        unit.props[key] = held
            for ctl, file in _CONTROL_FILES:
                if ctl in self.controllers:
                    fakefs.write(unit.cgroup / file, "max\n")
        return [self._job_removed(name, result)]

    def _m_StopUnit(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        unit = self._unit(m, body[0])
        agent = str(unit.props.get("Description", "")).split(" ")[2:3]
        result = self.stop_results.pop(agent[0] if agent else "", "done")
        self._job += 1
        path = f"/org/freedesktop/systemd1/job/{self._job}"
        if result != "done":
            self._job_removed(unit.name, result)
            return [path]
        unit.active = "deactivating"
        unit.stop_job = True
        self._signal_all(unit, signal.SIGTERM)
        return [path]

    def _m_KillUnit(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        unit = self._unit(m, body[0])
        if not self.scope_pids(unit.name):
            raise BusError(m, "org.freedesktop.systemd1.NoSuchProcess", "No process to kill")
        self._signal_all(unit, int(body[2]))
        return []

    def _m_ListUnitsByPatterns(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        states, patterns = body
        out = []
        for unit in self.units.values():
            if unit.active in states and any(fnmatch.fnmatch(unit.name, p) for p in patterns):
                out.append(
                    [
                        unit.name,
                        unit.props.get("Description", ""),
                        "loaded",
                        unit.active,
                        "running",
                        "",
                        f"/unit/{unit.name}",
                        0,
                        "",
                        "/",
                    ]
                )
        return [out]

    def _m_GetUnit(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        return [f"/unit/{self._unit(m, body[0]).name}"]

    def _m_LoadUnit(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        return [f"/unit/{body[0]}"]

    def _m_SetUnitProperties(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        name, _runtime, props = body
        if name != self.slice:
            raise BusError(m, "org.freedesktop.DBus.Error.InvalidArgs", "not the slice")
        for key, value in props:
            self.slice_props[key] = value.value
        return []

    def _m_AttachProcessesToUnit(self, m: str, body: list[Any], fds: list[int]) -> list[Any]:
        unit = self._unit(m, body[0])
        if self.attach_refusal is not None:
            raise BusError(m, *self.attach_refusal)
        procs = unit.cgroup / "cgroup.procs"
        pids = list(dict.fromkeys(self.scope_pids(unit.name) + list(body[2])))
        fakefs.write(procs, "".join(f"{p}\n" for p in pids))
        if self.proc_root is not None:
            cgroup = f"0::/{unit.cgroup.relative_to(self.cgroup_root)}\n"
            for pid in body[2]:
                fakefs.write(self.proc_root / str(pid) / "cgroup", cgroup)
        return []

    def _properties(self, member: str, path: str, body: list[Any]) -> list[Any]:
        name = path.removeprefix("/unit/")
        if name == self.slice:
            rel = self.slice_dir.relative_to(self.cgroup_root)
            props = {**self.slice_props, "ControlGroup": f"/{rel}"}
        elif path == "/org/freedesktop/systemd1":
            props = {"Version": self._version}
        else:
            unit = self._unit(member, name)
            rel = unit.cgroup.relative_to(self.cgroup_root)
            props = {**unit.props, "ActiveState": unit.active, "ControlGroup": f"/{rel}"}
        wrap = {k: Variant(_signature(v), v) for k, v in props.items()}
        if member == "GetAll":
            return [wrap]
        return [wrap[body[1]]]

    # -- the manager's own work ----------------------------------------------

    def _signal_all(self, unit: FakeUnit, sig: int) -> None:
        for pid in self.scope_pids(unit.name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    async def _collect(self) -> None:
        """Processes leave their scope as they exit; an empty scope is collected."""
        while True:
            for unit in list(self.units.values()):
                try:
                    pids = self.scope_pids(unit.name)
                except OSError:  # the test removed the tree
                    continue
                alive = [p for p in pids if not _gone(p)]
                if self.follow_forks:  # a child is born in its parent's cgroup
                    alive += [c for c in _children(alive) if c not in alive and not _gone(c)]
                if alive != pids:
                    fakefs.write(unit.cgroup / "cgroup.procs", "".join(f"{p}\n" for p in alive))
                if not alive and (unit.populated or unit.stop_job):
                    fakefs.remove(unit.cgroup)
                    del self.units[unit.name]
                    if unit.stop_job:
                        self._job_removed(unit.name, "done")
            await asyncio.sleep(0.01)
