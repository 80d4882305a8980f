"""The manager seam: everything a fleet asks of whoever runs its scopes.

The fleet (:mod:`._fleet` and the parts it holds) never speaks to systemd
itself: it holds one :class:`ScopeManager` and calls only what is declared
here. Three implementations, one per mode (:mod:`._modes` picks one):

- systemd (:class:`._systemd.SystemdManager`, over :class:`._bus.SystemdBus`);
- the *cgroup* mode (:class:`._cgroupmode.CgroupManager`), for a writable
  delegated cgroup v2 subtree: a scope is a child cgroup of the fleet's
  slice directory that the manager makes, writes the resource controls on
  and moves the gated child into (``cgroup.procs``); stop and kill are
  signals and ``cgroup.kill``, freeze is ``cgroup.freeze``, the listing a
  scan of the slice directory;
- the *process* mode (:class:`._procscopes.ProcessManager`), for a
  read-only cgroupfs: a scope is a process tree tracked by pid and start
  time, with no cgroup of its own; what it cannot do (a per-agent cap, a
  freeze, a tool call's cgroup) it refuses with :class:`ModeUnsupported`.

Words used here: a *unit* is the name a scope is known by
(``agentscope-FLEET-AGENT-xxxxxx.scope``: :func:`._names.scope_unit_name`
makes it, whatever the mode); the *slice* is the one directory every scope
of the fleet lives under (:meth:`slice_cgroup`). The fleet reads its
scopes' files there itself (``cgroup.procs``, ``memory.events``, through
:mod:`._scopefiles` and :mod:`._reaper`): the cgroup mode keeps that tree
as systemd does; the process mode keeps a mirror of it outside the
cgroupfs, one directory per scope with the ``cgroup.procs`` of its tree as
last listed, so those readers work unchanged (memory files are absent:
no figures).

Every method may raise :class:`SystemdUnavailable` (the manager cannot be
reached) and :class:`BusError` (it refused a request; ``dbus_name`` says
why, ``org.freedesktop.systemd1.NoSuchUnit`` for a unit it does not know),
whatever the mode: the fleet and the CLI act on those two only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import AgentscopeError, BusError
from ._wire import NO_SUCH_UNIT

if TYPE_CHECKING:
    from ._bus import Manager

__all__ = [
    "Controls",
    "ListedScope",
    "LocalManager",
    "ScopeManager",
    "ScopeRequest",
    "stop_escalating",
]

#: Resource controls by property name: ``{name: (D-Bus signature, value)}``,
#: as :func:`._scopeprops.build` makes them.
Controls = dict[str, tuple[str, Any]]


@dataclass(frozen=True, slots=True)
class ListedScope:
    """One scope of the fleet's pattern that its manager runs now.

    ``owner`` is (fleet, agent) as the scope itself says (systemd: its
    Description), None when it does not say: unit names alone are
    ambiguous (fleet ``a-b`` agent ``c``, fleet ``a`` agent ``b-c``).
    ``active`` is its state: active, activating, deactivating or reloading.
    """

    unit: str
    owner: tuple[str, str] | None
    active: str


@dataclass(frozen=True, slots=True)
class ScopeRequest:
    """A scope to start: ``unit`` for agent ``name``, holding ``pids``.

    What every manager's :meth:`ScopeManager.start_scope` takes, so the
    request is written once for the three modes. ``controls`` are its
    resource controls (:func:`._scopeprops.build`; None: none);
    ``description`` replaces the one that names the fleet and the agent
    (the tmux server's scope).
    """

    unit: str
    name: str
    pids: Sequence[int]
    controls: Controls | None = None
    description: str | None = None


class ScopeManager(Protocol):
    """What a fleet asks of the manager of its scopes (see the module's docstring).

    One object per fleet, made for its name and slice; the fleet calls
    :meth:`connect` when it opens and :meth:`close` when it closes.
    """

    #: ``system`` or ``user``: whose state and runtime directories the fleet
    #: uses (registry, tmux sockets) and how a user is told to look.
    manager: Manager
    #: The mode (_modes.py): ``systemd``, ``cgroup`` or ``process``. Only the
    #: process mode gives scopes no cgroup (no leaf for tool calls).
    mode: str
    #: The fleet's name and its slice, as it was made for.
    fleet: str
    slice: str

    @property
    def cgroup_root(self) -> Path:
        """Where the cgroup paths the manager reports are mounted (``/sys/fs/cgroup``)."""
        ...

    @property
    def version(self) -> str:
        """The manager's version string ("" before :meth:`connect`, or none to tell)."""
        ...

    @property
    def address(self) -> str:
        """Where the manager was reached ("" before :meth:`connect`)."""
        ...

    async def connect(self) -> None:
        """Reach the manager (again, after a lost connection).

        Raises:
            SystemdUnavailable: it cannot be reached; nothing was created.
        """
        ...

    def close(self) -> None:
        """Let go of the connection; scopes run on, and a later call connects again."""
        ...

    async def slice_cgroup(self) -> Path:
        """The slice's cgroup directory (where it will be, before its first scope)."""
        ...

    def expected_slice_cgroup(self) -> Path:
        """The slice's directory as far as known without asking (no I/O)."""
        ...

    async def start_scope(self, scope: ScopeRequest) -> list[dict[str, Any]]:
        """Start ``scope.unit`` holding ``scope.pids``; return once they are in it.

        Returned is what of ``scope.controls`` the scope does not hold or the
        kernel does not enforce (one dict per property:
        :func:`._scopeprops.compare`).

        Raises:
            LaunchError: the scope did not start (nothing is left of it).
            BusError: refused (``...UnitExists``: a unit of that name runs).
        """
        ...

    async def stop_unit(self, unit: str, timeout: float) -> str:
        """Stop ``unit``: SIGTERM to its processes, SIGKILL after ``timeout`` seconds.

        Returns the stop's result: ``done`` (also when it was gone already),
        else a word saying how it ended (``failed``, ``canceled``...).

        Raises:
            AgentscopeError: it did not stop even after SIGKILL.
        """
        ...

    async def kill_unit(self, unit: str, sig: int) -> None:
        """Send ``sig`` to every process of ``unit``."""
        ...

    async def freeze_unit(self, unit: str) -> None:
        """Freeze every process of ``unit`` (the cgroup freezer)."""
        ...

    async def thaw_unit(self, unit: str) -> None:
        """Thaw a frozen ``unit``."""
        ...

    async def attach(self, unit: str, pids: Sequence[int], subcgroup: str = "") -> None:
        """Move ``pids`` into the running ``unit``, or into ``subcgroup`` of its
        delegated cgroup (a tool call's, docs/calls.md); BusError when refused."""
        ...

    async def list_scopes(self, agent: str | None = None) -> list[ListedScope]:
        """The running scopes named for this fleet (or its agent ``agent``), in one request.

        May include another fleet's scopes whose names match the same
        pattern: :attr:`ListedScope.owner` says whose each one is.
        """
        ...

    async def slice_limits(self) -> dict[str, int | None]:
        """The slice's MemoryHigh, MemoryMax and MemorySwapMax; None is no limit."""
        ...

    async def clear_slice_limits(self) -> dict[str, int]:
        """Lift every limit :meth:`slice_limits` finds set, until reboot; return those (logged)."""
        ...

    def unit_of_cgroup(self, cgroup: str) -> str | None:
        """The unit a cgroup path (as ``/proc/PID/cgroup`` gives it) belongs to, or None."""
        ...

    async def main_pid(self, unit: str) -> int | None:
        """The main process of ``unit`` when it is a service the manager runs, else None."""
        ...

    def status_command(self, unit: str) -> str:
        """The command a user runs to see what became of ``unit`` (for messages)."""
        ...


#: How long a stop waits for processes to go after SIGKILL before it gives up.
KILL_WAIT = 5.0


async def stop_escalating(
    what: str,
    terminate: Callable[[], bool],
    kill: Callable[[], object],
    alive: Callable[[], bool],
    timeout: float,
) -> str:
    """A stop as systemd does it, for the modes that do it themselves (cgroup, process).

    ``terminate`` sends SIGTERM (False: nothing was there), ``kill`` SIGKILL
    after ``timeout`` seconds, ``alive`` says whether anything is left; each
    runs in a worker thread (they read /proc or cgroupfs). Returns ``done``.

    Raises:
        AgentscopeError: something of ``what`` was left :data:`KILL_WAIT` s after SIGKILL.
    """
    if not await asyncio.to_thread(terminate):
        return "done"
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        await asyncio.sleep(0.05)
        if not await asyncio.to_thread(alive):
            return "done"
        if not killed and time.monotonic() >= deadline:
            await asyncio.to_thread(kill)
            killed, deadline = True, time.monotonic() + KILL_WAIT
        elif killed and time.monotonic() >= deadline:
            raise AgentscopeError(f"{what} still has processes {KILL_WAIT:.0f} s after SIGKILL")


@dataclass(eq=False, repr=False)
class LocalManager:
    """What the managers that run scopes themselves (cgroup, process) share.

    No service manager stands behind them: there is no version to report,
    no connection to let go of and no service whose main process to name.
    A scope they do not run is refused with systemd's own error
    (:meth:`no_such_unit`), so the fleet acts on it as on systemd's (see the
    module's docstring).

    A dataclass (one object per fleet, compared by identity) of what both
    are made with: which systemd manager the fleet names, the fleet, its
    slice and its runtime directory (where each keeps its own record of its
    scopes). Each is a dataclass over this one that adds its own options,
    and names its ``mode`` as a class attribute.
    """

    manager: Manager
    fleet: str
    slice: str
    runtime: Path

    @property
    def version(self) -> str:
        return ""

    def close(self) -> None:
        pass

    async def main_pid(self, unit: str) -> int | None:
        return None

    @staticmethod
    def no_such_unit(method: str, unit: str) -> BusError:
        """The error for ``method`` on a ``unit`` not run here, as systemd words it."""
        return BusError(method, NO_SUCH_UNIT, f"unit {unit} not loaded")
