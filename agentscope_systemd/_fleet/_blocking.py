"""The blocking facade: the asyncio core driven from a private loop thread.

Each method is one call into :class:`AsyncFleet` through
``run_coroutine_threadsafe``, so plain scripts and many threads at once use
the same core (the anyio BlockingPortal pattern).
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from .. import _names, _numbers
from .._errors import AgentscopeError
from .._managers._bus import SystemdBus
from .._managers._scopeprops import DEFAULT_REAP_AFTER
from .._registry._registry import EventRecord
from ._fleet import Agent, AsyncFleet, Capabilities, probe

if TYPE_CHECKING:  # types only: a fleet opened to list its agents runs no monitor nor call
    from .._calls._callrun import Call
    from .._events import Event as MonitorEvent
    from .._guard._guardpolicy import GuardConfig
    from .._monitor._monitor import Monitor
    from .._monitor._report import MemoryReport

__all__ = ["BlockingAgent", "BlockingCall", "BlockingMonitor", "Fleet", "probe_sync"]

T = TypeVar("T")
Stdio = int | IO[Any] | None


class _LoopThread:
    """An event loop running in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="agentscope-loop", daemon=True
        )
        self._thread.start()
        self._lock = threading.Lock()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it.

        Raises:
            AgentscopeError: the fleet was closed (its loop is gone), or this
                is the loop's own thread (the call would wait for itself).
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise AgentscopeError("a blocking Fleet method was called from its own loop thread")
        with self._lock:  # not closed between this look and the submission
            if self.loop.is_closed():
                coro.close()
                raise AgentscopeError(f"fleet {self.name!r} is closed; open a new Fleet")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        with self._lock:
            self.loop.close()


class BlockingCall:
    """A tool call as the blocking :class:`Fleet` hands it out (:meth:`Fleet.call`)."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self.agent = call.agent
        self.name = call.name
        self.cgroup = call.cgroup
        self.pid = call.pid
        self.popen = call.popen

    def __repr__(self) -> str:
        return f"<BlockingCall {self.name} of {self.agent} pid={self.pid}>"

    def wait(self, timeout: float | None = None) -> int:
        """The command's exit status once it has ended (``-N``: ended by signal N)."""
        return self.popen.wait(timeout)


class BlockingAgent:
    """An agent as the blocking :class:`Fleet` hands it out.

    ``stdin``/``stdout``/``stderr`` are the ordinary file objects of the
    underlying ``subprocess.Popen`` when the launch asked for ``PIPE``.
    """

    def __init__(self, portal: _LoopThread, agent: Agent) -> None:
        self._portal = portal
        self._agent = agent
        self.name = agent.name
        self.unit = agent.unit
        self.pid = agent.pid
        popen = agent.popen
        self.stdin = popen.stdin if popen is not None else None
        self.stdout = popen.stdout if popen is not None else None
        self.stderr = popen.stderr if popen is not None else None

    def __repr__(self) -> str:
        return f"<BlockingAgent {self.name} pid={self.pid} unit={self.unit}>"

    @property
    def cgroup(self) -> str | None:
        return self._agent.cgroup

    @property
    def state(self) -> str:
        return self._agent.state

    @property
    def started(self) -> float:
        return self._agent.started

    @property
    def memory_current(self) -> int | None:
        return self._agent.memory_current

    @property
    def memory_peak(self) -> int | None:
        return self._agent.memory_peak

    @property
    def oom_kills(self) -> int:
        return self._agent.oom_kills

    @property
    def leftovers(self) -> int:
        return self._agent.leftovers

    @property
    def calls(self) -> int:
        return self._agent.calls

    @property
    def reap_after(self) -> float | None:
        return self._agent.reap_after

    @property
    def property_issues(self) -> list[dict[str, Any]]:
        return self._agent.property_issues

    @property
    def returncode(self) -> int | None:
        return self._agent.returncode

    def to_dict(self) -> dict[str, Any]:
        return self._agent.to_dict()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the agent's main process; see :meth:`Agent.wait`.

        Raises:
            InvalidConfig: ``timeout`` is not None nor 0 to 10^9 seconds (no NaN).
        """
        if timeout is not None:
            timeout = _numbers.real("timeout", timeout, low=0, high=1e9)
        return self._portal.call(_within(timeout, self._agent.wait()))

    def alive(self) -> bool:
        return self._agent.alive()


class Fleet:
    """The blocking face of :class:`AsyncFleet`: same operations, same arguments.

    Safe to use from a plain script and from many threads at once::

        with Fleet("default") as fleet:
            agent = fleet.launch("builder-1", ["claude", "-p", "..."])
            agent.wait()
    """

    def __init__(
        self,
        name: str = "default",
        manager: str = "auto",
        *,
        slice: str = _names.DEFAULT_SLICE,
        agent_oom_score_adj: int = 800,
        manager_oom_score_adj: int | None = 200,
        registry: str | os.PathLike[str] | None = None,
        policy: str = "adopt",
        env: Mapping[str, str] | None = None,
        tmux_dir: str | os.PathLike[str] | None = None,
        _bus: SystemdBus | None = None,
        admission_wait: float = 0.0,
    ) -> None:
        self._portal = _LoopThread(name)
        try:
            self._fleet = self._portal.call(
                _make(
                    name,
                    manager,
                    slice=slice,
                    agent_oom_score_adj=agent_oom_score_adj,
                    manager_oom_score_adj=manager_oom_score_adj,
                    registry=registry,
                    policy=policy,
                    env=env,
                    tmux_dir=tmux_dir,
                    _bus=_bus,
                    admission_wait=admission_wait,
                )
            )
        except BaseException:
            self._portal.stop()
            raise
        self.name = self._fleet.name
        self.manager = self._fleet.manager
        self.slice = self._fleet.slice

    @property
    def systemd_version(self) -> str:
        """See :attr:`AsyncFleet.systemd_version`."""
        return self._fleet.systemd_version

    @property
    def bus_address(self) -> str:
        """See :attr:`AsyncFleet.bus_address`."""
        return self._fleet.bus_address

    @property
    def mode(self) -> str:
        """See :attr:`AsyncFleet.mode`."""
        return self._fleet.mode

    @property
    def mode_reason(self) -> str:
        """See :attr:`AsyncFleet.mode_reason`."""
        return self._fleet.mode_reason

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and the loop thread. Agents keep running.

        Closing twice is harmless; any other call after it raises
        :class:`AgentscopeError` (the fleet is closed).
        """
        if self._portal.loop.is_running():
            self._portal.call(self._fleet.aclose())
            self._portal.stop()

    def slice_cgroup(self) -> Path:
        """See :meth:`AsyncFleet.slice_cgroup`."""
        return self._portal.call(self._fleet.slice_cgroup())

    def unit_agent(self, unit: str) -> str | None:
        """See :meth:`AsyncFleet.unit_agent` (thread-safe: no trip to the loop)."""
        return self._fleet.unit_agent(unit)

    def launch(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Stdio = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
        memory_max: int | None = None,
        terminal: str | None = None,
        tasks_max: int | None = None,
        cpu_weight: int | None = None,
        io_weight: int | None = None,
        properties: Mapping[str, str | int] | None = None,
        reap_after: float | str = DEFAULT_REAP_AFTER,
        call_memory_max: int | str | None = None,
        call_tasks_max: int | str | None = None,
        call_shell: bool = False,
    ) -> BlockingAgent:
        """See :meth:`AsyncFleet.launch`."""
        agent = self._portal.call(
            self._fleet.launch(
                name,
                argv,
                cwd=cwd,
                env=env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                memory_max=memory_max,
                terminal=terminal,
                tasks_max=tasks_max,
                cpu_weight=cpu_weight,
                io_weight=io_weight,
                properties=properties,
                reap_after=reap_after,
                call_memory_max=call_memory_max,
                call_tasks_max=call_tasks_max,
                call_shell=call_shell,
                _streams=False,
            )
        )
        return BlockingAgent(self._portal, agent)

    def call(
        self,
        agent: str,
        argv: Sequence[str],
        *,
        memory_max: int | str | None = None,
        tasks_max: int | str | None = None,
        name: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Stdio = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
    ) -> BlockingCall:
        """See :meth:`AsyncFleet.call`."""
        return BlockingCall(
            self._portal.call(
                self._fleet.call(
                    agent,
                    argv,
                    memory_max=memory_max,
                    tasks_max=tasks_max,
                    name=name,
                    cwd=cwd,
                    env=env,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                )
            )
        )

    def adopt(
        self,
        pid: int,
        name: str,
        *,
        memory_max: int | None = None,
        tasks_max: int | None = None,
        cpu_weight: int | None = None,
        io_weight: int | None = None,
        properties: Mapping[str, str | int] | None = None,
        reap_after: float | str = DEFAULT_REAP_AFTER,
    ) -> BlockingAgent:
        """See :meth:`AsyncFleet.adopt`."""
        agent = self._portal.call(
            self._fleet.adopt(
                pid,
                name,
                memory_max=memory_max,
                tasks_max=tasks_max,
                cpu_weight=cpu_weight,
                io_weight=io_weight,
                properties=properties,
                reap_after=reap_after,
            )
        )
        return BlockingAgent(self._portal, agent)

    def stop(self, name: str, timeout: float = 10) -> None:
        """See :meth:`AsyncFleet.stop`."""
        self._portal.call(self._fleet.stop(name, timeout))

    def kill(self, name: str, signal: int = _signal.SIGTERM) -> None:
        """See :meth:`AsyncFleet.kill`."""
        self._portal.call(self._fleet.kill(name, signal))

    def freeze(self, name: str) -> None:
        """See :meth:`AsyncFleet.freeze`."""
        self._portal.call(self._fleet.freeze(name))

    def thaw(self, name: str) -> None:
        """See :meth:`AsyncFleet.thaw`."""
        self._portal.call(self._fleet.thaw(name))

    def agents(self, *, all: bool = False) -> list[BlockingAgent]:
        """See :meth:`AsyncFleet.agents`."""
        agents = self._portal.call(self._fleet.agents(all=all))
        return [BlockingAgent(self._portal, a) for a in agents]

    def events(
        self,
        *,
        agent: str | None = None,
        since: float | None = None,
        until: float | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[EventRecord]:
        """See :meth:`AsyncFleet.events`."""
        return self._portal.call(
            self._fleet.events(
                agent=agent,
                since=since,
                until=until,
                kind=kind,
                after_id=after_id,
                limit=limit,
                last=last,
            )
        )

    def gc(self, retention_seconds: float = 7 * 86400) -> int:
        """See :meth:`AsyncFleet.gc`."""
        return self._portal.call(self._fleet.gc(retention_seconds))

    def clear_slice_limits(self) -> dict[str, int]:
        """See :meth:`AsyncFleet.clear_slice_limits`."""
        return self._portal.call(self._fleet.clear_slice_limits())

    def report(self, top: int = 10) -> MemoryReport:
        """See :meth:`AsyncFleet.report`."""
        return self._portal.call(self._fleet.report(top))

    def monitor(
        self,
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: bool | GuardConfig = False,
        reclaim_escaped: bool = False,
        **options: Any,
    ) -> BlockingMonitor:
        """See :meth:`AsyncFleet.monitor`; iterate it (blocking) or pass ``on_event``."""
        mon = self._portal.call(
            _call(
                self._fleet.monitor,
                interval,
                top,
                guard=guard,
                reclaim_escaped=reclaim_escaped,
                **options,
            )
        )
        return BlockingMonitor(self._portal, mon)

    def slice_limits(self) -> dict[str, int | None]:
        """See :meth:`AsyncFleet.slice_limits`."""
        return self._portal.call(self._fleet.slice_limits())

    def logs(self, name: str, lines: int = 100) -> list[str]:
        """See :meth:`AsyncFleet.logs`."""
        return self._portal.call(self._fleet.logs(name, lines))

    def send(self, name: str, text: str, *, enter: bool = False) -> None:
        """See :meth:`AsyncFleet.send`."""
        self._portal.call(self._fleet.send(name, text, enter=enter))

    def attach_command(self, name: str, *, read_only: bool = False) -> list[str]:
        """See :meth:`AsyncFleet.attach_command`."""
        return self._portal.call(self._fleet.attach_command(name, read_only=read_only))

    def attach(self, name: str, *, read_only: bool = False) -> int:
        """See :meth:`AsyncFleet.attach`."""
        return self._portal.call(self._fleet.attach(name, read_only=read_only))


class BlockingMonitor:
    """The monitor on the facade's loop, iterated from any thread::

    with fleet.monitor() as events:
        for event in events:
            print(event.to_dict())
    """

    def __init__(self, portal: _LoopThread, monitor: Monitor) -> None:
        self._portal = portal
        self._monitor = monitor
        self._iter: AsyncIterator[MonitorEvent] | None = None

    @property
    def failures(self) -> int:
        """Samples that failed since the start (see :attr:`Monitor.failures`)."""
        return self._monitor.failures

    @property
    def consecutive_failures(self) -> int:
        """Samples that failed in a row; 0 after a good one."""
        return self._monitor.consecutive_failures

    def guard_running(self) -> bool:
        """The monitor's memory guard runs (False without one, or once it stopped)."""
        guard = self._monitor.guard
        return guard is not None and guard.running

    def __enter__(self) -> BlockingMonitor:
        self._portal.call(self._monitor.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._portal.call(self._monitor.aclose())

    def __iter__(self) -> Iterator[MonitorEvent]:
        return self

    def __next__(self) -> MonitorEvent:
        if self._iter is None:
            self._iter = self._monitor.__aiter__()
        try:
            return self._portal.call(_anext(self._iter))
        except StopAsyncIteration:
            raise StopIteration from None

    def report(self, top: int | None = None) -> MemoryReport:
        return self._portal.call(self._monitor.report(top))


async def _anext(it: AsyncIterator[T]) -> T:
    return await it.__anext__()


async def _within(timeout: float | None, coro: Coroutine[Any, Any, T]) -> T:
    async with asyncio.timeout(timeout):
        return await coro


async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a plain function on the loop thread (it needs the running loop)."""
    return fn(*args, **kwargs)


async def _make(name: str, manager: str, **kwargs: Any) -> AsyncFleet:
    fleet = AsyncFleet(name, manager, **kwargs)
    await fleet.open()
    return fleet


def probe_sync(manager: str = "auto", *, slice: str = _names.DEFAULT_SLICE) -> Capabilities:
    """Blocking :func:`probe`."""
    return asyncio.run(probe(manager, slice=slice))
