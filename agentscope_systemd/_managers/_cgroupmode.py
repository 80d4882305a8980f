"""The cgroup manager mode: a fleet's scopes as cgroups of a delegated cgroup v2 subtree.

Where no systemd runs but this process's own cgroup v2 can be written (a
container with writable cgroups, Podman's ``--systemd=always``, a harness
service with ``Delegate=yes``; issue #27), the fleet makes the cgroups
systemd would have made, under its own cgroup (the *base*):

    base/
      agentscope-manager/     this process and whatever shared its cgroup
      app-agentscope-agents.slice/   (the slice: memory and pids enabled)
        agentscope-F-A-xxxxxx.scope/  one agent's cgroup (memory.oom.group 0)
          agent/                       its processes, beside its tool calls' (#26)

cgroup v2 lets a cgroup with processes have no children with controllers
(the no-internal-processes rule), so :meth:`CgroupManager.connect` first
moves every process of the base into the ``agentscope-manager`` leaf, then
enables memory and pids below it (each connect does, for a process
started in the base since: ``docker exec``). Launches are race-free as on
systemd: the child waits at the launch gate until it is in its cgroup.

Each agent gets a ``memory.max`` by default (:func:`default_agent_max`):
just under the nearest memory limit over the base, leaving the manager
:data:`HEADROOM` (its share, or 64 MiB, whichever is larger), so that an
agent's OOM stays in its cgroup and never becomes the container's
group kill. A limit leaving less than :data:`MIN_AGENT_MAX` after the
headroom is reported (logged once, and no default cap is set) rather than
used. Who a scope belongs to is kept beside the tree, under the fleet's
runtime directory (a cgroup directory holds no files of one's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from .. import _names
from .._errors import AgentscopeError, BusError, LaunchError, ModeUnavailable
from .._kernel._cgroup import CGROUP_ROOT, cgroup_chain, read_ceiling, read_subtree_procs
from ._manager import Controls, ListedScope, LocalManager, ScopeRequest, stop_escalating
from ._procscopes import read_meta, write_atomic
from ._wire import FAILED, UNIT_EXISTS

__all__ = ["HEADROOM", "MIN_AGENT_MAX", "CgroupManager", "default_agent_max"]

log = logging.getLogger("agentscope")

MODE = "cgroup"
#: The leaf the manager (and whatever shared its cgroup) moves into.
MANAGER_LEAF = "agentscope-manager"
#: What the manager keeps of the nearest limit: this share of it, at least 64 MiB.
HEADROOM = 0.10
HEADROOM_MIN = 64 << 20
#: A default cap below this is no use to an agent: such a limit is reported instead.
MIN_AGENT_MAX = 128 << 20
_ENABLE = (
    "run with a writable, delegated cgroup v2 (docker --security-opt writable-cgroups=true, "
    "podman --systemd=always, or a service with Delegate=yes), or use --manager process"
)


def default_agent_max(limit: int | None) -> tuple[int | None, str | None]:
    """The default per-agent ``memory.max`` under ``limit``, or None and why not.

    ``limit`` less :data:`HEADROOM` of it (at least :data:`HEADROOM_MIN`);
    None without a limit (nothing to stay under), or, with a reason to
    report, when what is left is below :data:`MIN_AGENT_MAX`.
    """
    if limit is None:
        return None, None
    headroom = max(int(limit * HEADROOM), HEADROOM_MIN)
    cap = limit - headroom
    if cap < MIN_AGENT_MAX:
        return None, (
            f"the memory limit over the fleet ({limit >> 20} MiB) leaves no room for agents "
            f"after the manager's headroom ({headroom >> 20} MiB): agents get no default "
            "memory.max; give the container more memory, or pass memory_max"
        )
    return cap, None


@dataclass(eq=False, repr=False)
class CgroupManager(LocalManager):
    """A fleet's scopes as cgroups of its own delegated subtree (see the module's docstring)."""

    mode = MODE
    _: KW_ONLY
    cgroup_root: Path = CGROUP_ROOT
    own_cgroup: str | None = None
    # Set at connect, from the limit over the fleet (default_agent_max).
    default_max: int | None = field(default=None, init=False)
    limit_note: str | None = field(default=None, init=False)
    _base: Path | None = field(default=None, init=False)
    _meta: Path = field(init=False)

    def __post_init__(self) -> None:
        self.cgroup_root = Path(self.cgroup_root)
        self._meta = self.runtime / "cgroup-scopes" / self.slice

    @property
    def address(self) -> str:
        return str(self._base or "")

    async def connect(self) -> None:
        await asyncio.to_thread(self._connect)

    def _connect(self) -> None:
        own = self.own_cgroup if self.own_cgroup is not None else _own_cgroup()
        base = self.cgroup_root / own.strip("/")
        if base.name == MANAGER_LEAF:  # this process was moved there before
            base = base.parent
        try:
            leaf = base / MANAGER_LEAF
            leaf.mkdir(exist_ok=True)
            # Whatever is in the base (this process, its harness) moves to the
            # leaf: a cgroup with processes cannot enable controllers below it.
            for _ in range(8):
                procs = _pids(base / "cgroup.procs")
                if not procs:
                    break
                for pid in procs:
                    _move(leaf, pid)
            _enable(base)
            slice_dir = base / self.slice
            slice_dir.mkdir(exist_ok=True)
            _enable(slice_dir)
            self._meta.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ModeUnavailable(MODE, f"cannot set up {base}: {exc}", _ENABLE) from exc
        self._base = base
        limit = None
        for path in cgroup_chain(self.cgroup_root, base):
            ceiling = read_ceiling(path)
            if ceiling is not None and ceiling.limit is not None:
                limit = ceiling.limit
                break
        self.default_max, note = default_agent_max(limit)
        if note is not None and note != self.limit_note:
            log.warning("%s", note)
        self.limit_note = note

    def _slice(self) -> Path:
        if self._base is None:
            raise AgentscopeError(f"the {MODE} manager of fleet {self.fleet!r} is not connected")
        return self._base / self.slice

    async def slice_cgroup(self) -> Path:
        return self.expected_slice_cgroup()

    def expected_slice_cgroup(self) -> Path:
        if self._base is None:
            own = self.own_cgroup if self.own_cgroup is not None else _own_cgroup()
            base = self.cgroup_root / own.strip("/")
            return (base.parent if base.name == MANAGER_LEAF else base) / self.slice
        return self._slice()

    def status_command(self, unit: str) -> str:
        return f"ls {self._slice() / unit} (cgroup mode)"

    def unit_of_cgroup(self, cgroup: str) -> str | None:
        _, sep, rest = cgroup.partition(f"/{self.slice}/")
        unit = rest.split("/", 1)[0]
        return unit if sep and unit.endswith(".scope") and _names.is_unit_name(unit) else None

    # -- scopes ------------------------------------------------------------

    async def start_scope(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._start, scope)

    def _start(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        unit = scope.unit
        d = self._slice() / unit
        try:
            d.mkdir()
        except FileExistsError:
            raise BusError("StartTransientUnit", UNIT_EXISTS, f"{unit} exists") from None
        except OSError as exc:
            raise LaunchError(f"cannot make the cgroup {d}: {exc}") from exc
        try:
            described = scope.description or _names.describe(self.fleet, scope.name)
            write_atomic(self._meta / unit, json.dumps({"description": described}))
            issues = _apply(d, scope.controls or {}, self.default_max)
            for pid in scope.pids:
                _move(d, pid)
        except OSError as exc:
            _remove_tree(d)
            _unlink(self._meta / unit)
            raise LaunchError(f"cannot set up the cgroup {d}: {exc}") from exc
        return issues

    async def stop_unit(self, unit: str, timeout: float) -> str:
        d = self._slice() / unit
        result = await stop_escalating(
            str(d),
            lambda: _signal_all(d, signal.SIGTERM),
            lambda: _kill_all(d),
            lambda: _populated(d),
            timeout,
        )
        await asyncio.to_thread(self._forget, unit)
        return result

    def _forget(self, unit: str) -> None:
        _remove_tree(self._slice() / unit)
        _unlink(self._meta / unit)

    async def kill_unit(self, unit: str, sig: int) -> None:
        if not await asyncio.to_thread(_signal_all, self._slice() / unit, sig):
            raise self.no_such_unit("KillUnit", unit)

    async def freeze_unit(self, unit: str) -> None:
        await asyncio.to_thread(self._freeze, unit, b"1")

    async def thaw_unit(self, unit: str) -> None:
        await asyncio.to_thread(self._freeze, unit, b"0")

    def _freeze(self, unit: str, value: bytes) -> None:
        try:
            _write(self._slice() / unit / "cgroup.freeze", value)
        except FileNotFoundError:
            raise self.no_such_unit("FreezeUnit", unit) from None

    async def attach(self, unit: str, pids: Sequence[int], subcgroup: str = "") -> None:
        await asyncio.to_thread(self._attach, unit, pids, subcgroup)

    def _attach(self, unit: str, pids: Sequence[int], subcgroup: str) -> None:
        d = self._slice() / unit
        if not d.is_dir():
            raise self.no_such_unit("AttachProcessesToUnit", unit)
        target = d / subcgroup.strip("/") if subcgroup else d
        try:
            for pid in pids:
                _move(target, pid)
        except OSError as exc:
            raise BusError("AttachProcessesToUnit", FAILED, str(exc)) from exc

    async def list_scopes(self, agent: str | None = None) -> list[ListedScope]:
        return await asyncio.to_thread(self._list, agent)

    def _list(self, agent: str | None) -> list[ListedScope]:
        prefix = f"agentscope-{self.fleet}-" + (f"{agent}-" if agent is not None else "")
        try:
            names = sorted(os.listdir(self._slice()))
        except FileNotFoundError:
            return []
        out = []
        for unit in names:
            if not (unit.startswith(prefix) and unit.endswith(".scope")):
                continue
            d = self._slice() / unit
            if not _populated(d):
                self._forget(unit)  # its last process ended: the scope is gone, as systemd's
                continue
            meta = read_meta(self._meta / unit) or {}
            owner = _names.parse_description(str(meta.get("description", "")))
            out.append(ListedScope(unit, owner, "active"))
        return out

    async def slice_limits(self) -> dict[str, int | None]:
        ceiling = await asyncio.to_thread(read_ceiling, str(self._slice()))
        if ceiling is None:
            return {"MemoryHigh": None, "MemoryMax": None, "MemorySwapMax": None}
        return {
            "MemoryHigh": ceiling.high,
            "MemoryMax": ceiling.max,
            "MemorySwapMax": ceiling.swap_max,
        }

    async def clear_slice_limits(self) -> dict[str, int]:
        limits = await self.slice_limits()
        files = {"MemoryHigh": "memory.high", "MemoryMax": "memory.max"}
        cleared = {}
        for name, value in limits.items():
            if value is not None and name in files:
                await asyncio.to_thread(_write, self._slice() / files[name], b"max")
                cleared[name] = value
        return cleared


# -- the cgroup files ---------------------------------------------------------------

#: Resource controls by systemd property name: (file, how the value is written).
_FILES = {
    "MemoryMax": "memory.max",
    "MemoryHigh": "memory.high",
    "MemorySwapMax": "memory.swap.max",
    "TasksMax": "pids.max",
    "CPUWeight": "cpu.weight",
    "IOWeight": "io.weight",
}


def _apply(d: Path, controls: Controls, default_max: int | None) -> list[dict[str, Any]]:
    """Write the agent's controls (and memory.oom.group 0); return what was not applied."""
    # An agent's OOM kills one process, never its siblings (absent before Linux 4.19).
    with contextlib.suppress(FileNotFoundError):
        _write(d / "memory.oom.group", b"0")
    values = {name: value for name, (_sig, value) in controls.items()}
    if "MemoryMax" not in values and default_max is not None:
        values["MemoryMax"] = default_max
        values.setdefault("MemorySwapMax", 0)
    issues = []
    for name, value in values.items():
        file = _FILES.get(name)
        text = "max" if value is None or value >= (1 << 64) - 1 else str(value)
        if file is None:
            issues.append({"property": name, "requested": value, "applied": None})
            continue
        try:
            _write(d / file, text.encode())
        except FileNotFoundError:  # no swap accounting, no cpu controller: not enforced
            issues.append({"property": name, "requested": value, "applied": None})
    return issues


def _own_cgroup() -> str:
    with open("/proc/self/cgroup", "rb") as f:
        for line in f.read().splitlines():
            if line.startswith(b"0::"):
                return os.fsdecode(line[3:])
    raise ModeUnavailable(MODE, "this process is in no cgroup v2", _ENABLE)


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in path.read_bytes().split()]
    except FileNotFoundError:
        return []


def _move(cgroup: Path, pid: int) -> None:
    try:
        _write(cgroup / "cgroup.procs", str(pid).encode())
    except ProcessLookupError:
        pass  # ended meanwhile
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def _enable(cgroup: Path) -> None:
    """Enable memory and pids for the children of ``cgroup`` (those it has)."""
    have = (cgroup / "cgroup.controllers").read_text().split()
    wanted = [c for c in ("memory", "pids") if c in have]
    if wanted:
        _write(cgroup / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted).encode())


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as a shell's `echo 1 > file`
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _subtree_pids(d: Path) -> list[int]:
    """The processes of the cgroup ``d`` and below; none when it cannot be read."""
    try:
        procs = read_subtree_procs(d)
    except OSError:
        return []
    return [int(p) for p in (procs or b"").split()]


def _populated(d: Path) -> bool:
    return bool(_subtree_pids(d))


def _signal_all(d: Path, sig: int) -> bool:
    """Send ``sig`` to every process of the cgroup ``d`` and below; any there?"""
    pids = _subtree_pids(d)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)  # in the cgroup now: the kernel's list is the identity
    return bool(pids)


def _kill_all(d: Path) -> None:
    try:
        _write(d / "cgroup.kill", b"1")  # Linux 5.14+: the whole subtree at once
    except OSError:
        _signal_all(d, signal.SIGKILL)


def _remove_tree(d: Path) -> None:
    """rmdir ``d`` and its sub-cgroups, deepest first (empty cgroups only)."""
    for top, dirs, _files in os.walk(d, topdown=False):
        for sub in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(top, sub))
    with contextlib.suppress(OSError):
        os.rmdir(d)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
