"""The fleet's tmux glue: its tmux server in a scope, panes as agents, windows.

:class:`Terminals` is a part :class:`._fleet.AsyncFleet` holds: the
tmux server started gated in its own scope, an agent's pane opened gated
(:class:`TmuxChild`), windows that closed, and ``logs``/``send``/``attach``.
:mod:`._tmux` has the tmux commands themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as _signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from .._errors import BusError, TmuxError
from .._managers import _wire
from .._managers._manager import ScopeRequest
from .._registry._registry import AgentRecord
from . import _tmux
from ._fleet_registry import FleetPart
from ._spawn import spawn_gated
from ._tmux import TmuxServer, Window

if TYPE_CHECKING:
    from ._reaper import Reaper

__all__ = ["Terminals", "TmuxChild"]

log = logging.getLogger("agentscope")
DEVNULL = subprocess.DEVNULL


@dataclass(eq=False, repr=False)
class Terminals(FleetPart):
    """The fleet's tmux part: its server in its own scope, panes as agents, their windows.

    Held by the fleet: :meth:`load` at open, :meth:`open_pane` in a tmux
    launch, :meth:`close_windowless` in a listing, and the window operations
    behind :meth:`.AsyncFleet.logs`, ``send`` and ``attach``. ``resolve``
    is the fleet's :meth:`._fleet_control.Control.resolve`: the unit of a running
    agent by name.
    """

    #: The fleet's tmux server, on its private socket.
    server: TmuxServer
    _reaper: Reaper
    _resolve: Callable[[str], Awaitable[str]]
    _: KW_ONLY
    agent_oom_score_adj: int
    manager_oom_score_adj: int | None
    _lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    async def load(self) -> None:
        """Which open agents run in tmux windows, from their launch events (after a restart)."""
        assert self._store.registry is not None
        if not await asyncio.to_thread(self.server.dir.exists):
            return  # this fleet never had a tmux agent since boot
        rows = await self._store.call(self._store.registry.agents, self.name)
        if not rows:
            return
        units = {r.unit for r in rows}
        since = min(r.created for r in rows) - 1
        events = await self._store.call(
            self._store.registry.events, self.name, kind="launched", since=since
        )
        for ev in events:
            unit, terminal = ev.detail.get("unit"), ev.detail.get("terminal")
            if unit in units and isinstance(terminal, str):
                self._roster.terminals[str(unit)] = terminal

    async def _tmux_server(self) -> TmuxServer:
        """The fleet's tmux server; started in its own scope when it does not run.

        Raises:
            TmuxUnavailable, TmuxError (before anything started), BusError.
        """
        tmux = self.server
        await asyncio.to_thread(tmux.prepare)
        async with self._lock:
            if await asyncio.to_thread(tmux.alive):
                return tmux
            unit = _tmux.tmux_unit(self.name)
            try:
                await self._start_tmux_server(tmux, unit)
            except BusError as exc:
                if exc.dbus_name != _wire.UNIT_EXISTS:
                    raise
                # Another launcher started it meanwhile, or the scope of a
                # server that died is not collected yet.
                if await asyncio.to_thread(tmux.alive):
                    return tmux
                await self._manager.stop_unit(unit, 10)
                await self._start_tmux_server(tmux, unit)
        return tmux

    async def _start_tmux_server(self, tmux: TmuxServer, unit: str) -> None:
        # Gated like an agent: the tmux client is in the server's scope before
        # it execs, so the server it forks is never in the manager's cgroup.
        argv = await asyncio.to_thread(tmux.start_argv)
        env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
        import tempfile  # here, not at the top: a fleet opened to list never starts tmux

        err = await asyncio.to_thread(tempfile.TemporaryFile)
        try:
            child = await spawn_gated(
                argv,
                cwd="/",
                env=env,
                stdin=DEVNULL,
                stdout=DEVNULL,
                stderr=err,
                oom_score_adj=self.manager_oom_score_adj,
            )
            try:
                description = _tmux.tmux_description(self.name)
                await self._manager.start_scope(
                    ScopeRequest(unit, "tmux", [child.pid], None, description)
                )
            except BaseException:
                await child.abort()
                raise
            popen = await child.release()
            status = await asyncio.to_thread(popen.wait)
            if status != 0:
                await asyncio.to_thread(err.seek, 0)
                message = (await asyncio.to_thread(err.read)).decode(errors="replace").strip()
                raise TmuxError(
                    f"tmux could not start its server on {tmux.socket}: "
                    f"{message or f'exit status {status}'}"
                )
        finally:
            await asyncio.to_thread(err.close)
        log.info("started the tmux server of fleet %s in %s (%s)", self.name, unit, tmux.socket)
        await self._store.event(None, "tmux_started", unit=unit, socket=str(tmux.socket))

    async def open_pane(
        self,
        unit: str,
        name: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> TmuxChild:
        tmux = await self._tmux_server()
        pane = await asyncio.to_thread(
            tmux.open_pane,
            name,
            argv,
            cwd or os.getcwd(),
            dict(os.environ if env is None else env),
            self.agent_oom_score_adj,
            unit.removesuffix(".scope"),
        )
        return TmuxChild(pane)

    async def close_windowless(self, recs: Sequence[AgentRecord]) -> dict[str, AgentRecord]:
        """tmux agents whose window vanished: killed, and closed as exited."""
        windows = await asyncio.to_thread(self.server.windows)
        if windows is None:  # the server does not answer: no verdict
            return {}
        panes = {w.pane_pid for w in windows}
        closed = {}
        for rec in recs:
            if rec.pid in panes:
                continue
            # Its main process ended with its window: what it left in its scope
            # is the reaper's (reap_after, _reaper.py), not killed here.
            swept = await self._reaper.sweep([rec])
            if rec.unit in swept:
                closed[rec.unit] = swept[rec.unit][0]
                continue
            log.info("the tmux window of %s (%s) closed: stopping it", rec.name, rec.unit)
            with contextlib.suppress(BusError):
                await self._manager.kill_unit(rec.unit, _signal.SIGKILL)
            await self._store.event(rec.name, "window_closed", unit=rec.unit, pid=rec.pid)
            closed[rec.unit] = await self._store.close_gone(rec)
        return closed

    async def _window(self, name: str) -> Window:
        """The tmux window of a running agent (its pane's process is the agent's)."""
        unit = await self._resolve(name)
        assert self._store.registry is not None
        rec = await self._store.call(self._store.registry.by_unit, unit)
        known = self._roster.agents.get(name)
        pid = rec.pid if rec is not None else known.pid if known is not None else -1
        window = await asyncio.to_thread(self.server.window_of, pid)
        if window is None:
            raise _tmux.not_a_tmux_agent(self.name, name)
        return window

    async def logs(self, name: str, lines: int) -> list[str]:
        """See :meth:`.AsyncFleet.logs` (``lines`` checked)."""
        window = await self._window(name)
        return await asyncio.to_thread(self.server.capture, window.id, lines)

    async def send(self, name: str, text: str, enter: bool) -> None:
        """See :meth:`.AsyncFleet.send`."""
        window = await self._window(name)
        await asyncio.to_thread(self.server.send, window.id, text, enter)

    async def attach_command(self, name: str, read_only: bool) -> list[str]:
        """See :meth:`.AsyncFleet.attach_command`."""
        window = await self._window(name)
        return await asyncio.to_thread(self.server.attach_argv, window.id, read_only)

    async def attach(self, name: str, read_only: bool) -> int:
        """See :meth:`.AsyncFleet.attach`."""
        argv = await self.attach_command(name, read_only)
        proc = await asyncio.create_subprocess_exec(*argv)
        return await proc.wait()


class TmuxChild:
    """A tmux pane whose shim waits at its gate, with the interface of a GatedChild."""

    def __init__(self, pane: _tmux.PaneLaunch) -> None:
        self.pane = pane
        self.pid = pane.pid

    async def release(self) -> None:
        await asyncio.to_thread(self.pane.go)

    async def abort(self) -> None:
        await asyncio.to_thread(self.pane.abort)
