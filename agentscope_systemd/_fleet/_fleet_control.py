"""The fleet's acts on a running agent by name: stop, kill, freeze, thaw.

:class:`Control` is a part :class:`._fleet.AsyncFleet` holds. It finds the
unit of a running agent of the fleet (known here, else in the manager's
listing: :meth:`Control.resolve`, also what a tool call and a tmux window
are found by), asks the manager to act on it, and records the act as one
event of the agent. A stop waits for its job: one that did not end
``done`` is recorded as ``stop_failed`` and raised, and the row stays open.
"""

from __future__ import annotations

import asyncio

from .. import _names
from .._errors import AgentNotFound, AgentscopeError
from .._registry._registry import CLOSED_STATES
from ._fleet_registry import FleetPart

__all__ = ["Control"]


class Control(FleetPart):
    """The fleet's part that stops, signals, freezes and thaws its agents by name."""

    async def resolve(self, name: str) -> str:
        """The unit of a running agent of this fleet, known here or in its manager.

        Raises:
            InvalidName, AgentNotFound.
        """
        _names.validate_name("agent", name)
        agent = self._roster.agents.get(name)
        if agent is not None and agent.state not in CLOSED_STATES and agent.alive():
            return agent.unit
        for listed in await self._manager.list_scopes(name):
            if listed.owner == (self.name, name):
                return listed.unit
        raise AgentNotFound(self.name, name)

    async def stop(self, name: str, timeout: float) -> None:
        """See :meth:`._fleet.AsyncFleet.stop`."""
        unit = await self.resolve(name)
        result = await self._manager.stop_unit(unit, timeout)
        if result != "done":
            # Not stopped: its row stays as it is, and says what was tried.
            await self._store.event(name, "stop_failed", unit=unit, result=result)
            raise AgentscopeError(
                f"the stop job of {unit} ended {result!r}: agent {name!r} may still run; "
                f"see {self._manager.status_command(unit)}, then stop it again"
            )
        agent = self._roster.agents.get(name)
        if agent is not None and (agent.popen is not None or agent.terminal is not None):
            await agent.wait()  # its exit watcher records the exit
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        registry = self._store.open_registry
        rec = await self._store.call(registry.by_unit, unit)
        if rec is not None and not rec.closed:  # not seen exiting here, or lingering
            await self._store.call(registry.set_state, unit, "exited", exit_status=rec.exit_status)
        await self._store.event(name, "stopped", unit=unit)

    async def kill(self, name: str, signal: int) -> None:
        """Send ``signal`` to every process of the agent's scope; a ``signalled`` event."""
        unit = await self.resolve(name)
        await self._manager.kill_unit(unit, signal)
        await self._store.event(name, "signalled", unit=unit, signal=int(signal))

    async def freeze(self, name: str) -> None:
        """Freeze every process of the agent; a ``frozen`` event."""
        unit = await self.resolve(name)
        await self._manager.freeze_unit(unit)
        await self._store.event(name, "frozen", unit=unit)

    async def thaw(self, name: str) -> None:
        """Thaw the agent; a ``thawed`` event."""
        unit = await self.resolve(name)
        await self._manager.thaw_unit(unit)
        await self._store.event(name, "thawed", unit=unit)
