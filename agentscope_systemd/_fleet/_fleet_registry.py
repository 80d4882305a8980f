"""The fleet's registry adapter and its roster of agents: two parts the fleet holds.

:class:`Roster` is what the fleet knows of its agents in memory: its
:class:`._agent.Agent` objects by name, the agent of each unit it has
seen, the units of other fleets that match its name, and which of its
agents run in tmux windows. :class:`FleetRegistry` is the fleet's one way
to its :class:`._registry.Registry`: every call runs in a worker thread
(:meth:`FleetRegistry.call`), events are recorded with the fleet's name,
and a row whose scope is gone is closed as ``exited`` (seen here) or
``lost``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar

from .._errors import AgentscopeError, InvalidTransition, RegistryError
from .._registry import _claim
from .._registry._registry import AgentRecord, Registry
from ._agent import Agent

if TYPE_CHECKING:
    from subprocess import Popen

    from .._managers._manager import ScopeManager

__all__ = ["FleetCore", "FleetPart", "FleetRegistry", "Roster"]

T = TypeVar("T")
P = ParamSpec("P")


class FleetCore(NamedTuple):
    """What every part of a fleet holds: made once by the fleet, handed to each part.

    A part unpacks it as :class:`FleetPart` does.
    """

    name: str
    manager: ScopeManager
    store: FleetRegistry
    roster: Roster
    #: The fleet's background tasks: it waits for them as it stops an agent or closes.
    tasks: set[asyncio.Task[Any]]


@dataclass(eq=False, repr=False)
class FleetPart:
    """A part of a fleet: its :class:`FleetCore`, then the other parts it calls.

    Each part (``Listing``, ``Launcher``, ``Terminals``, ...) is a dataclass
    over this one, ``@dataclass(eq=False, repr=False)`` (one object per
    fleet, compared by identity), whose fields are the parts and options it
    is made with, in the order the fleet passes them: ``Listing(core,
    reconciler, reaper, terminals, monitors)``. The core is unpacked here,
    once for all of them, into ``name`` (the fleet's), ``_manager``,
    ``_store``, ``_roster`` and ``_tasks``.
    """

    core: InitVar[FleetCore]

    def __post_init__(self, core: FleetCore) -> None:
        self.name, self._manager, self._store, self._roster, self._tasks = core


@dataclass
class Roster:
    """The fleet's agents in memory (on the event loop; read from any thread).

    It makes the fleet's :class:`._agent.Agent` objects, each with the
    fleet's ``on_exit`` callback (the fleet records the exits it sees).
    """

    fleet: str
    on_exit: Callable[[Agent, int | None], None] | None = None

    #: Agent objects by name: launched, adopted, or found at open.
    agents: dict[str, Agent] = field(default_factory=dict)
    #: The agent name of each of this fleet's units seen so far.
    unit_names: dict[str, str] = field(default_factory=dict)
    #: Units whose name starts like ours but that belong to another fleet.
    foreign: set[str] = field(default_factory=set)
    #: The terminal ("tmux") of each unit that runs in one.
    terminals: dict[str, str] = field(default_factory=dict)

    def new(
        self, name: str, unit: str, pid: int, popen: Popen[bytes] | None, start_time: int | None
    ) -> Agent:
        """A new agent of this fleet (launched or adopted here); not known until :meth:`add`."""
        return Agent(self.fleet, name, unit, pid, popen, self.on_exit, start_time)

    def from_record(self, rec: AgentRecord) -> Agent:
        """The agent of a registry row (found at open or in a listing)."""
        return Agent._from_record(rec, self.terminals.get(rec.unit), self.on_exit)

    def add(self, agent: Agent) -> None:
        """Know ``agent`` by its name and its unit."""
        self.agents[agent.name] = agent
        self.unit_names[agent.unit] = agent.name


class FleetRegistry:
    """The fleet's registry: opened with the fleet, every call off the event loop."""

    def __init__(self, fleet: str, path: Path, roster: Roster) -> None:
        self.fleet = fleet
        self.path = path
        self.roster = roster
        #: The open registry; None before open and after close.
        self.registry: Registry | None = None

    async def open(self) -> None:
        self.registry = await asyncio.to_thread(Registry, self.path)

    async def close(self) -> None:
        if self.registry is not None:
            await asyncio.to_thread(self.registry.close)
            self.registry = None

    @property
    def open_registry(self) -> Registry:
        """The registry, which must be open (the fleet checks that first)."""
        if self.registry is None:
            raise AgentscopeError(f"fleet {self.fleet!r} is not open")
        return self.registry

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one registry call off the event loop."""
        assert self.registry is not None, "fleet not open"
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def event(self, agent: str | None, kind: str, **detail: Any) -> None:
        """Record an event of this fleet (of ``agent``, or fleet-wide)."""
        await self.call(self.open_registry.record_event, self.fleet, agent, kind, detail)

    def mark_running(self, unit: str, **event: dict[str, Any]) -> None:
        """Row to running, and the event that says why: one transaction (worker thread)."""
        ((kind, detail),) = event.items()
        self.open_registry.set_state(unit, "running", event=kind, detail={"unit": unit, **detail})

    async def gc(self, retention_seconds: float) -> int:
        """See :meth:`._fleet.AsyncFleet.gc`."""
        return await self.call(self.open_registry.gc, retention_seconds, fleet=self.fleet)

    def unit_agent(self, unit: str) -> str | None:
        """See :meth:`._fleet.AsyncFleet.unit_agent` (thread-safe)."""
        known = self.roster.unit_names.get(unit)
        if known is not None:
            return known
        if unit in self.roster.foreign or not unit.startswith(f"agentscope-{self.fleet}-"):
            return None
        # The unit name cannot say (fleet a-b's agent c and fleet a's agent
        # b-c share it): the registry's row, or the scope's Description in a
        # listing (Reconciler.live), says whose agent it is.
        registry = self.registry
        if registry is None:
            return None
        try:
            rec = registry.by_unit(unit)
        except RegistryError:
            return None
        if rec is None:
            return None  # not recorded (yet): no claim
        if rec.fleet != self.fleet:
            self.roster.foreign.add(unit)
            return None
        self.roster.unit_names[unit] = rec.name
        return rec.name

    def mark_exited(self, unit: str, pid: int, status: int | None) -> AgentRecord:
        """The one exit transition (worker thread): the row to exited with ``status``.

        Its ``exited`` event is recorded with it, in the same transaction, by
        whichever of the exit watcher, a listing and the reaper moves the row
        first: one event however many see the exit.

        Raises:
            InvalidTransition: the row was closed otherwise (failed, lost).
        """
        return self.open_registry.set_state(
            unit,
            "exited",
            exit_status=status,
            event="exited",
            detail={"unit": unit, "pid": pid, "status": status},
            only_on_change=True,
        )

    async def close_gone(self, rec: AgentRecord) -> AgentRecord:
        """Close the row of an agent whose scope is gone: exited if seen, else lost."""
        return await self.call(self.close_row, rec)

    def close_row(self, rec: AgentRecord) -> AgentRecord:
        """:meth:`close_gone` in a worker thread, and the fleet's close of a stale
        holder of a name (``_claim.Close``); every move records its event once."""
        registry = self.open_registry
        try:
            if rec.unit in self.roster.terminals:  # it ended in (or with) its tmux window
                return self.mark_exited(rec.unit, rec.pid, None)
            agent = self.roster.agents.get(rec.name)
            if agent is not None and agent.unit == rec.unit and agent.popen is not None:
                status = agent.popen.poll()
                if status is not None:
                    agent.state = "exited"
                    return self.mark_exited(rec.unit, rec.pid, status)
            if rec.lingering is not None:  # its main process was seen ending: its status is known
                return self.mark_exited(rec.unit, rec.pid, rec.exit_status)
            return _claim.close_lost(registry, rec)
        except InvalidTransition:  # closed meanwhile, otherwise: that close stands
            return registry.by_unit(rec.unit) or rec
