"""The Agent object: one launched (or adopted) agent, its streams and its exit.

The fleet's roster (:class:`._fleet_registry.Roster`) makes them; an agent
tells its fleet when its launched child exits through the ``on_exit``
callback it was made with, and holds nothing else of the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
import time
from typing import TYPE_CHECKING, Any

from .._kernel import _fdlimit
from .._kernel._proc import read_cgroup, same_process
from .._managers._scopeprops import DEFAULT_REAP_AFTER
from .._registry._registry import AgentRecord

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Agent"]

log = logging.getLogger("agentscope")


class Agent:
    """One launched (or adopted) agent: a process tree in its own scope.

    ``stdin``/``stdout``/``stderr`` are asyncio streams when the launch asked
    for ``PIPE``, else None.
    """

    def __init__(
        self,
        fleet: str,
        name: str,
        unit: str,
        pid: int,
        popen: subprocess.Popen[bytes] | None,
        on_exit: Callable[[Agent, int | None], None] | None = None,
        start_time: int | None = None,
    ) -> None:
        #: the name of its fleet
        self.fleet = fleet
        self._on_exit = on_exit
        self.name = name
        self.unit = unit
        self.pid = pid
        #: its main process's start time (field 22 of /proc/PID/stat), which
        #: with ``pid`` identifies it; None when not known
        self.start_time = start_time
        self.popen = popen
        self.started = time.time()
        #: starting, running, frozen, stopping, lingering (its main process
        #: ended, its scope still holds ``leftovers`` processes), exited,
        #: failed or lost
        self.state = "running"
        #: processes left in its scope while it lingers (see _reaper)
        self.leftovers = 0
        #: seconds its leftovers may run on after its main process; None: kept
        self.reap_after: float | None = DEFAULT_REAP_AFTER
        #: what systemd dropped or changed, or the kernel does not enforce, of
        #: the resource controls it was launched with (one dict per property)
        self.property_issues: list[dict[str, Any]] = []
        self.memory_current: int | None = None
        self.memory_peak: int | None = None
        self.oom_kills = 0
        #: its tool calls running now (``call-*`` cgroups of its scope, docs/calls.md)
        self.calls = 0
        self.argv: list[str] = []
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self.returncode: int | None = None
        #: "tmux" when the agent runs in a window of the fleet's tmux session
        self.terminal: str | None = None
        self._exited: asyncio.Future[int | None] | None = None
        self._pidfd: int | None = None
        self._poller: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<Agent {self.name} {self.state} pid={self.pid} unit={self.unit}>"

    @classmethod
    def _from_record(
        cls,
        rec: AgentRecord,
        terminal: str | None = None,
        on_exit: Callable[[Agent, int | None], None] | None = None,
    ) -> Agent:
        agent = cls(rec.fleet, rec.name, rec.unit, rec.pid, None, on_exit, rec.start_time)
        agent.started = rec.created
        agent.state = rec.state
        agent.returncode = rec.exit_status
        agent.oom_kills = rec.oom_kills
        agent.memory_current = rec.memory_current
        agent.memory_peak = rec.memory_peak
        agent.argv = list(rec.argv)
        agent.terminal = terminal
        agent.reap_after = rec.reap_after
        if rec.lingering is not None and not rec.closed and rec.state != "stopping":
            agent.state = "lingering"
        return agent

    def to_dict(self) -> dict[str, Any]:
        """The agent as JSON-ready data (what ``agentscope ls --json`` prints)."""
        return {
            "name": self.name,
            "fleet": self.fleet,
            "unit": self.unit,
            "pid": self.pid,
            "state": self.state,
            "started": self.started,
            "memory_current": self.memory_current,
            "memory_peak": self.memory_peak,
            "oom_kills": self.oom_kills,
            "exit_status": self.returncode,
            "argv": self.argv,
            "terminal": self.terminal,
            "leftovers": self.leftovers,
            "calls": self.calls,
            "reap_after": "keep" if self.reap_after is None else self.reap_after,
        }

    @property
    def cgroup(self) -> str | None:
        """The agent's cgroup path, None once it exited.

        ``/.../unit.scope``, or its ``agent`` leaf (``/.../unit.scope/agent``)
        where the scope is delegated for calls (docs/calls.md).
        """
        return read_cgroup(self.pid)

    async def _attach_streams(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.popen is not None
        if self.popen.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(
                lambda: asyncio.streams.FlowControlMixin(loop=loop), self.popen.stdin
            )
            self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        for attr in ("stdout", "stderr"):
            pipe = getattr(self.popen, attr)
            if pipe is not None:
                reader = asyncio.StreamReader(loop=loop)
                await loop.connect_read_pipe(
                    functools.partial(asyncio.StreamReaderProtocol, reader, loop=loop), pipe
                )
                setattr(self, attr, reader)

    def _watch_exit(self) -> asyncio.Future[int | None]:
        if self._exited is not None:
            return self._exited
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        self._exited = fut
        _fdlimit.make_room(1)  # an adopted fleet's agents each get one here too
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            fut.set_result(self._reap())
            return fut
        except OSError as exc:
            # Out of file descriptors (EMFILE, ENFILE): the agent runs all the
            # same, so its launch succeeded; its exit is polled instead.
            log.warning("cannot watch the exit of %s with a pidfd (%s): polling it", self.name, exc)
            self._poller = loop.create_task(self._poll_exit())
            return fut
        self._pidfd = pidfd
        _fdlimit.hold()

        def on_exit() -> None:
            self._unwatch()
            self._seen_exit()

        loop.add_reader(pidfd, on_exit)
        return fut

    def _seen_exit(self) -> None:
        fut = self._exited
        if fut is not None and not fut.done():
            status = self._reap()
            fut.set_result(status)
            # A pane's process is the tmux server's child: no status, but the exit is seen.
            if self._on_exit is not None and (self.popen is not None or self.terminal is not None):
                self._on_exit(self, status)

    async def _poll_exit(self) -> None:
        # No event to wait on without a pidfd: a poll is the fallback.
        while self.alive():  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        self._seen_exit()

    def _unwatch(self) -> None:
        """Stop watching the exit and close the pidfd (the fleet closes: agents run on)."""
        if self._pidfd is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
            _fdlimit.release()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def _reap(self) -> int | None:
        if self.popen is not None:
            # pidfd readable means exited: this wait does not block.
            self.returncode = self.popen.wait()
        return self.returncode

    async def wait(self) -> int | None:
        """Wait for the agent's main process to exit.

        Returns its exit status like ``Popen.returncode`` (negative: killed by
        that signal) when this fleet launched it, None for an adopted process.
        """
        return await asyncio.shield(self._watch_exit())

    def alive(self) -> bool:
        """Whether the agent's main process still runs (and is not a zombie).

        Launched here: its ``Popen`` says (an unreaped child's pid is never
        reused). Otherwise the same process: pid and start time
        (:func:`._proc.same_process`); False when the start time is not known.
        """
        if self.popen is not None:
            return self.popen.poll() is None
        if self.start_time is None:
            return False
        return same_process(self.pid, self.start_time) is not None
