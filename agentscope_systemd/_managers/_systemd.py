"""systemd as a fleet's manager: start a scope, stop, kill, freeze, list, probe.

:class:`SystemdManager` is the systemd implementation of
:class:`._manager.ScopeManager` (what one fleet asks of its manager), over a
:class:`._bus.SystemdBus`: a scope started with its properties (and the
OOMPolicy fallback of systemds that refuse it, remembered per fleet), the
stop job with its SIGKILL escalation, KillUnit, FreezeUnit, ThawUnit,
AttachProcessesToUnit, ListUnitsByPatterns, the agents slice's cgroup and
limits. :func:`probe` tells what the manager can do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as _signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _names
from .._errors import AgentscopeError, BusError, LaunchError
from .._kernel._cgroup import cgroup_v2_mounted, memory_controller_enabled
from .._live import Live
from .._monitor._escape import unit_of_cgroup
from . import _scope, _scopeprops, _wire
from ._bus import INFINITY, Manager, SystemdBus
from ._manager import ListedScope, ScopeRequest

__all__ = ["Capabilities", "SystemdManager", "probe", "slice_limits"]

log = logging.getLogger("agentscope")

SLICE_IFACE, _UNIT_IFACE = _wire.SD_SLICE, _wire.SD_UNIT
_SCOPE_IFACE, _SERVICE_IFACE = _wire.SD_SCOPE, _wire.SD_SERVICE
_ACTIVE = ["active", "activating", "deactivating", "reloading"]
_LIMITS = ("MemoryHigh", "MemoryMax", "MemorySwapMax")
# KillUnit on a scope that stopped meanwhile: unloaded, or loaded with no process left.
_STOPPED_MEANWHILE = (_wire.NO_SUCH_UNIT, _wire.NO_SUCH_PROCESS)


@dataclass(frozen=True)
class Capabilities:
    """What the systemd manager in reach can do (see :func:`probe`)."""

    manager: str
    systemd_version: str
    bus_address: str
    cgroup_v2: bool
    memory_controller: bool
    scope_oom_policy: bool
    pidfds: bool
    slice: str
    slice_limits: dict[str, int | None]

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class SystemdManager:
    """A fleet's scopes as systemd runs them: :class:`._manager.ScopeManager` over D-Bus.

    No registry and no state but the OOMPolicy fallback and the slice's
    cgroup once systemd has said where it is.
    """

    def __init__(self, bus: SystemdBus, fleet: str, slice: str) -> None:
        self._bus = bus
        self.fleet = fleet
        self.slice = slice
        self.manager: Manager = bus.manager
        self.mode = "systemd"
        self._oom_policy = _scope.OOMPolicyFallback()
        self._slice_cgroup: Path | None = None

    # The bus's own: it learns them as it connects.
    cgroup_root: Live[Path] = Live("_bus", "SystemdBus")
    version: Live[str] = Live("_bus", "SystemdBus")
    address: Live[str] = Live("_bus", "SystemdBus")

    async def connect(self) -> None:
        await self._bus.connect()

    def close(self) -> None:
        self._bus.close()

    async def slice_cgroup(self) -> Path:
        """The agents slice's cgroup directory, as systemd reports it."""
        if self._slice_cgroup is None:
            path = await self._bus.unit_path(self.slice)
            cg = await self._bus.get_property(path, SLICE_IFACE, "ControlGroup")
            if not cg:  # not realized yet: where systemd will put it
                # Not cached: the real path is known once the slice is realized.
                return self._expected()
            self._slice_cgroup = self._bus.cgroup_root / str(cg).lstrip("/")
        return self._slice_cgroup

    def expected_slice_cgroup(self) -> Path:
        return self._slice_cgroup or self._expected()

    def _expected(self) -> Path:
        """Where the manager puts the agents slice: dashes in its name are the hierarchy."""
        root = str(self._bus.cgroup_root)
        return Path(_scope.slice_cgroup(self.manager, self.slice, root=root))

    def status_command(self, unit: str) -> str:
        return f"systemctl {'--user ' if self.manager == 'user' else ''}status {unit}"

    def unit_of_cgroup(self, cgroup: str) -> str | None:
        return unit_of_cgroup(cgroup)

    async def main_pid(self, unit: str) -> int | None:
        """The MainPID of ``unit`` if it is a service systemd has loaded, else None."""
        if not unit.endswith(".service"):
            return None
        try:
            (path,) = await self._bus.call("GetUnit", "s", [unit])
            main = await self._bus.get_property(path, _SERVICE_IFACE, "MainPID")
        except AgentscopeError:
            return None  # not known to this manager: it cannot be its main process
        return int(main) or None

    async def freeze_unit(self, unit: str) -> None:
        await self._bus.call("FreezeUnit", "s", [unit])

    async def thaw_unit(self, unit: str) -> None:
        await self._bus.call("ThawUnit", "s", [unit])

    async def attach(self, unit: str, pids: Sequence[int], subcgroup: str = "") -> None:
        """AttachProcessesToUnit (systemd 238+; refused for a scope without Delegate=yes)."""
        await self._bus.call("AttachProcessesToUnit", "ssau", [unit, subcgroup, list(pids)])

    async def unit_active(self, unit: str) -> bool:
        try:
            (path,) = await self._bus.call("GetUnit", "s", [unit])
        except BusError as exc:
            if exc.dbus_name == _wire.NO_SUCH_UNIT:
                return False
            raise
        state = await self._bus.get_property(str(path), _UNIT_IFACE, "ActiveState")
        return state in ("active", "activating", "deactivating", "reloading")

    async def list_scopes(self, agent: str | None = None) -> list[ListedScope]:
        """One ListUnitsByPatterns; the owner of each from its Description."""
        (units,) = await self._bus.call(
            "ListUnitsByPatterns",
            "asas",
            [_ACTIVE, [_names.scope_pattern(self.fleet, agent)]],
        )
        return [
            ListedScope(str(unit), _names.parse_description(str(desc)), str(active))
            for unit, desc, _load, active, *_ in units
        ]

    async def start_scope(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        """Start ``scope.unit`` holding its pids; what systemd did not take of its controls.

        The resource controls (:func:`._scopeprops.build`) are read back
        once the start job is done (:meth:`read_back`).
        """
        unit, pids, controls = scope.unit, scope.pids, scope.controls
        props = _scope.scope_properties(
            self.fleet, scope.name, self.slice, controls, scope.description
        )
        fds: list[int] = []
        await self._bus.connect()  # the version decides PIDs or PIDFDs
        try:
            if self._bus.version_major >= 255:
                # A pidfd names the process itself, not a number that may be reused.
                fds = [os.pidfd_open(p) for p in pids]
                props["PIDFDs"] = ("ah", list(range(len(fds))))
            else:
                props["PIDs"] = ("au", list(pids))
            await self.start_transient(unit, props, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return await self.read_back(unit, controls) if controls else []

    async def read_back(
        self, unit: str, controls: dict[str, tuple[str, Any]]
    ) -> list[dict[str, Any]]:
        """Which of ``controls`` the started ``unit`` does not hold or enforce (logged).

        One GetAll of its Scope properties, and its cgroup's files for the
        controllers. A scope gone meanwhile (its command ended) reports nothing.
        """
        try:
            path = await self._bus.unit_path(unit)
            read = await self._bus.get_all(path, _SCOPE_IFACE)
            cgroup = str(read.get("ControlGroup") or "")
        except BusError as exc:
            log.debug("cannot read back the properties of %s: %s", unit, exc)
            return []
        files: dict[str, str | None] = {}
        if cgroup:
            where = self._bus.cgroup_root / cgroup.lstrip("/")
            files = await asyncio.to_thread(_scopeprops.read_cgroup_files, where, controls)
        issues = _scopeprops.compare(controls, read, files)
        for issue in issues:
            log.warning("%s", _scopeprops.describe(unit, issue))
        return issues

    async def start_transient(
        self, unit: str, props: dict[str, tuple[str, Any]], fds: list[int]
    ) -> None:
        sent = self._oom_policy.properties(props)
        try:
            await self.run_start(unit, sent, fds)
        except BusError as exc:
            if not self._oom_policy.refused(sent, exc.dbus_name, exc.message):
                raise
            warning = self._oom_policy.warning(self._bus.version)
            if warning is not None:
                log.warning("%s", warning)
            await self.run_start(unit, self._oom_policy.properties(props), fds)

    async def run_start(self, unit: str, props: dict[str, tuple[str, Any]], fds: list[int]) -> None:
        result = await self._bus.run_job(
            unit,
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            [unit, "fail", SystemdBus.props(props), []],
            unix_fds=fds,
            timeout=60,
        )
        if result != "done":
            raise LaunchError(_scope.job_failed_message(unit, result, self.manager))

    async def stop_unit(self, unit: str, timeout: float) -> str:
        """Stop ``unit``, SIGKILL after ``timeout``; the stop job's result (``done``...).

        ``done`` too when the unit was gone already or went meanwhile.
        """
        try:
            return await self._bus.run_job(
                unit, "StopUnit", "ss", [unit, "replace"], timeout=timeout
            )
        except TimeoutError:
            log.info("%s did not stop within %ss: sending SIGKILL", unit, timeout)
            fut = self._bus.expect_job(unit)
            try:
                try:
                    await self.kill_unit(unit, _signal.SIGKILL)
                except BusError as exc:
                    if exc.dbus_name in _STOPPED_MEANWHILE:
                        return "done"  # the stop job finished between the timeout and the kill
                    raise
                # The stop job ends once the processes are gone; it may also have
                # ended just before the future was registered, so look too.
                for _ in range(30):
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await asyncio.shield(fut)
                    if fut.done():
                        return fut.result()
                    if not await self.unit_active(unit):
                        return "done"
                raise AgentscopeError(
                    f"{unit} did not stop within {timeout + 30:.0f}s, even after SIGKILL; "
                    f"see systemctl {'--user ' if self.manager == 'user' else ''}status {unit}"
                )
            finally:
                self._bus.forget_job(unit)
        except BusError as exc:
            if exc.dbus_name != _wire.NO_SUCH_UNIT:
                raise
            return "done"

    async def kill_unit(self, unit: str, sig: int) -> None:
        await self._bus.call("KillUnit", "ssi", [unit, "all", int(sig)])

    async def slice_limits(self) -> dict[str, int | None]:
        """The agents slice's MemoryHigh/MemoryMax/MemorySwapMax; None means infinity."""
        return await slice_limits(self._bus, self.slice)

    async def clear_slice_limits(self) -> dict[str, int]:
        """Set each limit found on the agents slice to infinity, until reboot (runtime)."""
        limits = await self.slice_limits()
        stale = {k: v for k, v in limits.items() if v is not None}
        if not stale:
            return stale
        await self._bus.call(
            "SetUnitProperties",
            "sba(sv)",
            [self.slice, True, SystemdBus.props({k: ("t", INFINITY) for k in stale})],
        )
        log.warning(
            "cleared stale limits on %s until reboot: %s (a MemoryHigh there "
            "throttles every agent at once; find where they were set with "
            "systemctl %scat %s)",
            self.slice,
            ", ".join(f"{k}={v}" for k, v in stale.items()),
            "--user " if self.manager == "user" else "",
            self.slice,
        )
        return stale


async def slice_limits(bus: SystemdBus, slice: str) -> dict[str, int | None]:
    path = await bus.unit_path(slice)
    props = await bus.get_all(path, SLICE_IFACE)
    return {k: (None if props.get(k, INFINITY) == INFINITY else props[k]) for k in _LIMITS}


async def probe(manager: str = "auto", *, slice: str = _names.DEFAULT_SLICE) -> Capabilities:
    """What the systemd manager in reach can do.

    Connects, asks for the version, looks at the cgroup tree, and checks
    whether scopes accept OOMPolicy (their D-Bus interface lists it) and
    PIDFDs (systemd 255+). Creates nothing.

    Raises:
        SystemdUnavailable: no manager reachable.
    """
    bus = SystemdBus(manager)
    try:
        await bus.connect()
        root = Path(_scope.manager_cgroup(bus.manager))
        init_path = await bus.unit_path("init.scope")
        xml = await bus.call("Introspect", path=init_path, interface=_wire.INTROSPECTABLE)
        scope_section = str(xml[0]).split(f'<interface name="{_SCOPE_IFACE}">', 1)[-1]
        scope_section = scope_section.split("</interface>", 1)[0]
        limits = await slice_limits(bus, slice)
        return Capabilities(
            manager=bus.manager,
            systemd_version=bus.version,
            bus_address=bus.address,
            cgroup_v2=cgroup_v2_mounted(),
            memory_controller=memory_controller_enabled(root),
            scope_oom_policy='name="OOMPolicy"' in scope_section,
            pidfds=bus.version_major >= 255,
            slice=slice,
            slice_limits=limits,
        )
    finally:
        bus.close()
