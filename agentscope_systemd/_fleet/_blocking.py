"""The blocking facade: the asyncio core driven from a private loop thread.

Each method is one call into :class:`AsyncFleet` through
``run_coroutine_threadsafe``, so plain scripts and many threads at once use
the same core (the anyio BlockingPortal pattern).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    TypeVar,
    overload,
)

from .. import _names, _numbers
from .._errors import AgentscopeError
from .._live import Live
from .._managers._bus import SystemdBus
from ._fleet import Agent, AsyncFleet, Capabilities, probe

if TYPE_CHECKING:  # types only: a fleet opened to list its agents runs no monitor nor call
    from .._calls._callrun import Call
    from .._events import Event as MonitorEvent
    from .._monitor._monitor import Monitor
    from .._monitor._report import MemoryReport

__all__ = ["BlockingAgent", "BlockingCall", "BlockingMonitor", "Fleet", "probe_sync"]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
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
        self.start_time = agent.start_time
        popen = agent.popen
        self.stdin = popen.stdin if popen is not None else None
        self.stdout = popen.stdout if popen is not None else None
        self.stderr = popen.stderr if popen is not None else None

    def __repr__(self) -> str:
        return f"<BlockingAgent {self.name} pid={self.pid} unit={self.unit}>"

    # The agent's figures, read live from the core's Agent (the loop updates them).
    cgroup: Live[str | None] = Live("_agent", "Agent")
    state: Live[str] = Live("_agent", "Agent")
    started: Live[float] = Live("_agent", "Agent")
    memory_current: Live[int | None] = Live("_agent", "Agent")
    memory_peak: Live[int | None] = Live("_agent", "Agent")
    oom_kills: Live[int] = Live("_agent", "Agent")
    leftovers: Live[int] = Live("_agent", "Agent")
    calls: Live[int] = Live("_agent", "Agent")
    reap_after: Live[float | None] = Live("_agent", "Agent")
    property_issues: Live[list[dict[str, Any]]] = Live("_agent", "Agent")
    returncode: Live[int | None] = Live("_agent", "Agent")

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

    failures: Live[int] = Live("_monitor", "Monitor")
    consecutive_failures: Live[int] = Live("_monitor", "Monitor")

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


@overload
def _blocking(
    method: Callable[Concatenate[AsyncFleet, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Fleet, P], R]: ...
@overload
def _blocking(
    method: Callable[Concatenate[AsyncFleet, P], Coroutine[Any, Any, R]],
    wrap: Callable[[_LoopThread, R], T],
) -> Callable[Concatenate[Fleet, P], T]: ...
def _blocking(
    method: Callable[Concatenate[AsyncFleet, P], Coroutine[Any, Any, R]],
    wrap: Callable[[_LoopThread, R], Any] | None = None,
) -> Callable[Concatenate[Fleet, P], Any]:
    """The blocking :class:`Fleet` method that runs ``method`` of the core.

    One rule for every operation of the facade: the same arguments go to
    the core's method on the loop thread, and ``wrap`` turns what it
    returns into what the facade hands out (a :class:`BlockingAgent` for an
    :class:`Agent`). ``help()`` shows the core's parameters and docstring,
    with the facade's return type.
    """

    @functools.wraps(method)
    def run(self: Fleet, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        result = self._portal.call(method(self._fleet, *args, **kwargs))
        return result if wrap is None else wrap(self._portal, result)

    run.__module__, run.__qualname__ = __name__, f"Fleet.{method.__name__}"
    core = inspect.signature(method)
    if wrap is None:
        returns = core.return_annotation
    else:  # a class, or a function that makes one
        returns = wrap.__name__ if isinstance(wrap, type) else wrap.__annotations__["return"]
    run.__signature__ = core.replace(return_annotation=returns)  # type: ignore[attr-defined]
    run.__doc__ = (
        f"Blocking :meth:`AsyncFleet.{method.__name__}`, run on the fleet's loop thread.\n\n"
        + inspect.cleandoc(method.__doc__ or "")
    )
    return run


def _blocking_call(portal: _LoopThread, call: Call) -> BlockingCall:
    return BlockingCall(call)


def _blocking_agents(portal: _LoopThread, agents: list[Agent]) -> list[BlockingAgent]:
    return [BlockingAgent(portal, a) for a in agents]


def _on_loop(
    method: Callable[Concatenate[AsyncFleet, P], T],
) -> Callable[Concatenate[AsyncFleet, P], Coroutine[Any, Any, T]]:
    """``method`` as a coroutine, to run on the loop thread (it needs the running loop)."""

    @functools.wraps(method)
    async def run(fleet: AsyncFleet, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(fleet, *args, **kwargs)

    return run


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
                    _streams=False,  # the facade reads the plain pipes
                )
            )
        except BaseException:
            self._portal.stop()
            raise
        self.name = self._fleet.name
        self.manager = self._fleet.manager
        self.slice = self._fleet.slice

    # The core's properties, read through (no trip to the loop).
    systemd_version: Live[str] = Live("_fleet", "AsyncFleet")
    bus_address: Live[str] = Live("_fleet", "AsyncFleet")
    mode: Live[str] = Live("_fleet", "AsyncFleet")
    mode_reason: Live[str] = Live("_fleet", "AsyncFleet")

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

    # Each operation is the core's method run on the loop thread: its
    # signature, types and docstring are the core's (see _blocking below).
    slice_cgroup = _blocking(AsyncFleet.slice_cgroup)
    launch = _blocking(AsyncFleet.launch, BlockingAgent)
    call = _blocking(AsyncFleet.call, _blocking_call)
    adopt = _blocking(AsyncFleet.adopt, BlockingAgent)
    stop = _blocking(AsyncFleet.stop)
    kill = _blocking(AsyncFleet.kill)
    freeze = _blocking(AsyncFleet.freeze)
    thaw = _blocking(AsyncFleet.thaw)
    agents = _blocking(AsyncFleet.agents, _blocking_agents)
    events = _blocking(AsyncFleet.events)
    gc = _blocking(AsyncFleet.gc)
    clear_slice_limits = _blocking(AsyncFleet.clear_slice_limits)
    report = _blocking(AsyncFleet.report)
    # The monitor is made on the loop thread: it needs the running loop.
    monitor = _blocking(_on_loop(AsyncFleet.monitor), BlockingMonitor)
    slice_limits = _blocking(AsyncFleet.slice_limits)
    logs = _blocking(AsyncFleet.logs)
    send = _blocking(AsyncFleet.send)
    attach_command = _blocking(AsyncFleet.attach_command)
    attach = _blocking(AsyncFleet.attach)

    def unit_agent(self, unit: str) -> str | None:
        """See :meth:`AsyncFleet.unit_agent` (thread-safe: no trip to the loop)."""
        return self._fleet.unit_agent(unit)


async def _anext(it: AsyncIterator[T]) -> T:
    return await it.__anext__()


async def _within(timeout: float | None, coro: Coroutine[Any, Any, T]) -> T:
    async with asyncio.timeout(timeout):
        return await coro


async def _make(name: str, manager: str, **kwargs: Any) -> AsyncFleet:
    fleet = AsyncFleet(name, manager, **kwargs)
    await fleet.open()
    return fleet


def probe_sync(manager: str = "auto", *, slice: str = _names.DEFAULT_SLICE) -> Capabilities:
    """Blocking :func:`probe`."""
    return asyncio.run(probe(manager, slice=slice))
