"""The process manager mode: a fleet's scopes as process trees, for a read-only cgroupfs.

Where no systemd runs and the cgroupfs cannot be written (the Docker and
Kubernetes default, issue #27), an agent's "scope" is its main process
and every descendant of it, tracked by pid and start time (a reused pid is
never taken for a member) and signalled through a pidfd where the kernel
offers one. :class:`ProcessManager` implements :class:`._manager.ScopeManager`
for that mode.

The fleet reads its scopes' files itself (:mod:`._scopefiles`,
:mod:`._reaper`, :mod:`._claim`: ``cgroup.procs`` under the slice
directory). So that those readers work unchanged, this mode keeps a
*mirror* of that layout in a directory of its own (under the fleet's
runtime directory, never in the cgroupfs): one directory per running
scope, whose ``cgroup.procs`` lists its processes as last seen, and whose
``members`` file their start times (a descendant reparented away from its
dead parent stays a member once seen). The mirror is refreshed by every
listing (:meth:`ProcessManager.list_scopes`), which every reconciliation
does first; a scope with no live member left is removed from it. Who is
a member is one rule (:mod:`._proctrees`), which the guard applies itself
at each choice: a tool call spawned since the last listing is a member.

What this mode cannot do is refused with :class:`ModeUnsupported`, which
names the mode and what would enable it: per-agent resource controls
(``memory_max``, ``tasks_max``: they need a cgroup of the agent's own), the
freezer, and tool-call cgroups. The guard still protects the container: it
reads the limits over this process's own cgroup, which its agents share
(:mod:`._guardlimit`; in a container that is the container's), and kills
the runaway process before the limit is reached (docs/guard.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from .. import _names
from .._errors import BusError, LaunchError, ModeUnsupported
from .._kernel._cgroup import CGROUP_ROOT
from .._kernel._proc import PROC_ROOT, read_stat, same_process
from .._kernel._proctrees import (
    MEMBERS,
    SCOPE_META,
    children_of,
    read_members,
    read_meta,
    tree_members,
)
from ._manager import Controls, ListedScope, LocalManager, ScopeRequest, stop_escalating

# A scope that runs already is refused with systemd's name for it
# (UNIT_EXISTS): the fleet acts on it alike.
from ._wire import UNIT_EXISTS

__all__ = [
    "ProcessManager",
    "mirror_root",
    "read_meta",
    "refuse_calls",
    "refuse_controls",
    "write_atomic",
]

log = logging.getLogger("agentscope")

MODE = "process"
_ENABLE = "run with a writable, delegated cgroup v2 (--manager cgroup) or on systemd"


def mirror_root(runtime: Path) -> Path:
    """Where the process mode keeps its mirror of scopes, under the fleet's runtime directory."""
    return runtime / "process-scopes"


@dataclass(eq=False, repr=False)
class ProcessManager(LocalManager):
    """A fleet's scopes as process trees (see the module's docstring)."""

    mode = MODE
    _: KW_ONLY
    proc_root: Path = PROC_ROOT
    cgroup_root: Path = CGROUP_ROOT
    _dir: Path = field(init=False)  # its mirror of the scopes, under mirror_root
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    def __post_init__(self) -> None:
        self._dir = mirror_root(self.runtime) / self.slice

    @property
    def address(self) -> str:
        return ""

    async def connect(self) -> None:
        await asyncio.to_thread(self._dir.mkdir, mode=0o700, parents=True, exist_ok=True)

    async def slice_cgroup(self) -> Path:
        return self._dir

    def expected_slice_cgroup(self) -> Path:
        return self._dir

    def status_command(self, unit: str) -> str:
        return f"agentscope ls (unit {unit}: process mode, no service manager)"

    def unit_of_cgroup(self, cgroup: str) -> str | None:
        return None  # every process shares the container's cgroup here

    # -- scopes ------------------------------------------------------------

    async def start_scope(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        refuse_controls(scope.controls)
        return await asyncio.to_thread(self._start, scope)

    def _start(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        unit = scope.unit
        d = self._dir / unit
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            if self._members(unit):
                raise BusError(
                    "StartTransientUnit",
                    UNIT_EXISTS,
                    f"unit {unit} already exists",
                ) from None
        except OSError as exc:
            raise LaunchError(f"cannot record the scope {unit} in {self._dir}: {exc}") from exc
        members = {}
        pids = scope.pids
        for pid in pids:
            st = read_stat(pid, self.proc_root)
            if st is None:
                shutil.rmtree(d, ignore_errors=True)
                raise LaunchError(f"process {pid} of {unit} ended before its scope started")
            members[pid] = st.start_time
        meta = {
            "unit": unit,
            "fleet": self.fleet,
            "agent": scope.name,
            "description": scope.description or _names.describe(self.fleet, scope.name),
            "main": pids[0] if pids else 0,
            "started": time.time(),
        }
        write_atomic(d / SCOPE_META, json.dumps(meta))
        self._store(unit, members)
        return []

    def _store(self, unit: str, members: dict[int, int]) -> None:
        d = self._dir / unit
        write_atomic(d / MEMBERS, "".join(f"{p} {s}\n" for p, s in sorted(members.items())))
        write_atomic(d / "cgroup.procs", "".join(f"{p}\n" for p in sorted(members)))

    def _recorded(self, unit: str) -> dict[int, int]:
        return read_members(self._dir / unit)

    def _members(self, unit: str, children: dict[int, list[int]] | None = None) -> dict[int, int]:
        """The scope's live processes now: recorded ones still alive, and their descendants."""
        if children is None:
            children = self._children()
        return tree_members(self._recorded(unit), children, self.proc_root)

    def _children(self) -> dict[int, list[int]]:
        return children_of(self.proc_root)

    def _units(self) -> list[str]:
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        prefix = f"agentscope-{self.fleet}-"
        return sorted(n for n in names if n.startswith(prefix) and n.endswith(".scope"))

    def _refresh(self, unit: str, children: dict[int, list[int]]) -> dict[int, int]:
        """The scope's members now, written to its mirror; the scope removed when none is left."""
        live = self._members(unit, children)
        if live:
            if live != self._recorded(unit):
                self._store(unit, live)
        else:
            shutil.rmtree(self._dir / unit, ignore_errors=True)
        return live

    async def list_scopes(self, agent: str | None = None) -> list[ListedScope]:
        async with self._lock:
            return await asyncio.to_thread(self._list, agent)

    def _list(self, agent: str | None) -> list[ListedScope]:
        units = self._units()
        if agent is not None:
            prefix = f"agentscope-{self.fleet}-{agent}-"
            units = [u for u in units if u.startswith(prefix)]
        if not units:
            return []
        children = self._children()
        out = []
        for unit in units:
            meta = read_meta(self._dir / unit / SCOPE_META)
            if meta is None or not self._refresh(unit, children):
                continue
            owner = _names.parse_description(str(meta.get("description", "")))
            out.append(ListedScope(unit, owner, "active"))
        return out

    async def stop_unit(self, unit: str, timeout: float) -> str:
        return await stop_escalating(
            f"{unit} (process mode)",
            lambda: self._signal(unit, signal.SIGTERM),
            lambda: self._signal(unit, signal.SIGKILL),
            lambda: self._alive(unit),
            timeout,
        )

    def _alive(self, unit: str) -> bool:
        return bool(self._refresh(unit, self._children()))

    def _signal(self, unit: str, sig: int) -> bool:
        """Send ``sig`` to every member of ``unit`` (pid and start time checked); any there?"""
        live = self._refresh(unit, self._children())
        for pid, start in live.items():
            signal_process(pid, start, sig, self.proc_root)
        return bool(live)

    async def kill_unit(self, unit: str, sig: int) -> None:
        if not await asyncio.to_thread(self._signal, unit, sig):
            raise self.no_such_unit("KillUnit", unit)

    async def freeze_unit(self, unit: str) -> None:
        raise ModeUnsupported(MODE, "freezing an agent (the cgroup freezer)", _ENABLE)

    async def thaw_unit(self, unit: str) -> None:
        raise ModeUnsupported(MODE, "thawing an agent (the cgroup freezer)", _ENABLE)

    async def attach(self, unit: str, pids: Sequence[int], subcgroup: str = "") -> None:
        if subcgroup:
            refuse_calls()
        await asyncio.to_thread(self._attach, unit, pids)

    def _attach(self, unit: str, pids: Sequence[int]) -> None:
        members = self._refresh(unit, self._children())
        if not members:
            raise self.no_such_unit("AttachProcessesToUnit", unit)
        for pid in pids:
            st = read_stat(pid, self.proc_root)
            if st is not None:
                members[pid] = st.start_time
        self._store(unit, members)

    async def slice_limits(self) -> dict[str, int | None]:
        return {"MemoryHigh": None, "MemoryMax": None, "MemorySwapMax": None}

    async def clear_slice_limits(self) -> dict[str, int]:
        return {}


def refuse_controls(controls: Controls | None) -> None:
    """ModeUnsupported for any per-agent resource control: none has a cgroup to go on."""
    if controls:
        names = ", ".join(sorted(controls))
        raise ModeUnsupported(MODE, f"a per-agent resource control ({names})", _ENABLE)


def refuse_calls() -> None:
    """ModeUnsupported for a tool call's cgroup (docs/calls.md): process mode has none."""
    raise ModeUnsupported(MODE, "a tool call's own cgroup (fleet.call)", _ENABLE)


def signal_process(pid: int, start: int, sig: int, proc_root: Path = PROC_ROOT) -> bool:
    """Signal ``pid`` if it is still the process that started at ``start``; sent?

    Through a pidfd opened after the check, so that a pid reused after the
    check is never signalled.
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if same_process(pid, start, proc_root, zombie=True) is None:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path``'s content at once (a reader sees the old or the new, never half)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
