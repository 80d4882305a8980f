"""The fleet's tmux glue: its tmux server in a scope, panes as agents, windows.

:class:`TmuxGlue` is a part of :class:`._fleet.AsyncFleet` (a mixin): the
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
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from . import _numbers, _tmux
from ._errors import BusError, TmuxError
from ._registry import AgentRecord
from ._spawn import spawn_gated
from ._tmux import TmuxServer, Window

if TYPE_CHECKING:
    from ._fleet_registry import FleetRegistry, Roster
    from ._manager import ScopeManager
    from ._reaper import Reaper

__all__ = ["TmuxChild", "TmuxGlue"]

log = logging.getLogger("agentscope")
T = TypeVar("T")
P = ParamSpec("P")
DEVNULL = subprocess.DEVNULL


class TmuxGlue:
    """The tmux half of AsyncFleet; what it uses of the fleet is declared here."""

    if TYPE_CHECKING:
        _roster: Roster
        _store: FleetRegistry
        _reaper: Reaper
        name: str
        agent_oom_score_adj: int
        manager_oom_score_adj: int | None
        _manager: ScopeManager
        _tmux: TmuxServer
        _tmux_lock: asyncio.Lock

        async def _resolve(self, name: str) -> str: ...
        def _check_open(self) -> None: ...

    async def _load_terminals(self) -> None:
        """Which open agents run in tmux windows, from their launch events (after a restart)."""
        assert self._store.registry is not None
        if not await asyncio.to_thread(self._tmux.dir.exists):
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
        tmux = self._tmux
        await asyncio.to_thread(tmux.prepare)
        async with self._tmux_lock:
            if await asyncio.to_thread(tmux.alive):
                return tmux
            unit = _tmux.tmux_unit(self.name)
            try:
                await self._start_tmux_server(tmux, unit)
            except BusError as exc:
                if exc.dbus_name != "org.freedesktop.systemd1.UnitExists":
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
                await self._manager.start_scope(unit, "tmux", [child.pid], None, description)
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

    async def _open_pane(
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

    async def _close_windowless(self, recs: Sequence[AgentRecord]) -> dict[str, AgentRecord]:
        """tmux agents whose window vanished: killed, and closed as exited."""
        windows = await asyncio.to_thread(self._tmux.windows)
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
        self._check_open()
        unit = await self._resolve(name)
        assert self._store.registry is not None
        rec = await self._store.call(self._store.registry.by_unit, unit)
        known = self._roster.agents.get(name)
        pid = rec.pid if rec is not None else known.pid if known is not None else -1
        window = await asyncio.to_thread(self._tmux.window_of, pid)
        if window is None:
            raise _tmux.not_a_tmux_agent(self.name, name)
        return window

    async def logs(self, name: str, lines: int = 100) -> list[str]:
        """The last ``lines`` lines of a tmux agent's window (its history included).

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        lines = _numbers.whole("lines", lines, low=0, high=10_000_000)
        window = await self._window(name)
        return await asyncio.to_thread(self._tmux.capture, window.id, lines)

    async def send(self, name: str, text: str, *, enter: bool = False) -> None:
        """Type ``text`` into a tmux agent's window, then Enter if ``enter``.

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        window = await self._window(name)
        await asyncio.to_thread(self._tmux.send, window.id, text, enter)

    async def attach_command(self, name: str, *, read_only: bool = False) -> list[str]:
        """The command line that attaches a terminal to a tmux agent's window.

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        window = await self._window(name)
        return await asyncio.to_thread(self._tmux.attach_argv, window.id, read_only)

    async def attach(self, name: str, *, read_only: bool = False) -> int:
        """Attach this process's terminal to a tmux agent's window until it detaches.

        Returns the tmux client's exit status (non-zero without a terminal).

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        argv = await self.attach_command(name, read_only=read_only)
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
