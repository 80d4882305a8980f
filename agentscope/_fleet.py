"""The asyncio core: a fleet of agents, each in its own transient scope.

Launch, in order: validate everything (names, binary, cwd, env) before any
scope exists; clear stale limits on the agents slice (once); fork a child
that waits at a gate (``_spawn``); ``StartTransientUnit`` with the child's
PID (or a PIDFD on systemd 255+) and wait for the start job; then let the
child set oom_score_adj and exec. Any failure on the way aborts the child
before it execs, so nothing runs outside its scope and nothing is left over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal as _signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ParamSpec, TypeVar

import psutil

from . import _names, _scope, _tmux
from ._bus import INFINITY, SystemdBus
from ._cgroup import (
    CGROUP_ROOT,
    cgroup_v2_mounted,
    memory_controller_enabled,
    parse_memory_events,
)
from ._errors import (
    AgentExists,
    AgentNotFound,
    AgentscopeError,
    BusError,
    InvalidConfig,
    LaunchError,
    RegistryError,
)
from ._guard import admit
from ._guardpolicy import GuardConfig
from ._monitor import AgentExited, MemoryReport, Monitor, OomKill, build_report
from ._monitor import Event as MonitorEvent
from ._monitor import Pressure as MonitorPressure
from ._proc import exec_comm, read_cgroup, read_stat
from ._registry import (
    AgentRecord,
    EventRecord,
    InvalidTransition,
    LiveScope,
    Registry,
    default_registry_path,
    reconcile,
)
from ._spawn import GatedChild, spawn_gated
from ._tmux import TmuxError

__all__ = ["Agent", "AsyncFleet", "Capabilities", "probe"]

log = logging.getLogger("agentscope")
T = TypeVar("T")
P = ParamSpec("P")

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
_SLICE_IFACE = "org.freedesktop.systemd1.Slice"
_UNIT_IFACE = "org.freedesktop.systemd1.Unit"
_SCOPE_IFACE = "org.freedesktop.systemd1.Scope"
_LIMITS = ("MemoryHigh", "MemoryMax", "MemorySwapMax")
# systemd < 253 (and vanilla 252.0-252.4) refuse OOMPolicy on a scope with one of these.
# KillUnit on a scope that stopped meanwhile: unloaded, or loaded with no process left.
_STOPPED_MEANWHILE = (
    "org.freedesktop.systemd1.NoSuchUnit",
    "org.freedesktop.systemd1.NoSuchProcess",
)
Stdio = int | IO[Any] | None


@dataclass(frozen=True)
class Capabilities:
    """What the systemd manager in reach can do (see :func:`probe`)."""

    manager: str
    systemd_version: str
    bus_address: str
    cgroup_v2: bool
    memory_controller: bool
    scope_oom_policy: bool
    pidfds: bool
    slice: str
    slice_limits: dict[str, int | None]

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Agent:
    """One launched (or adopted) agent: a process tree in its own scope.

    ``stdin``/``stdout``/``stderr`` are asyncio streams when the launch asked
    for ``PIPE``, else None.
    """

    def __init__(
        self,
        fleet: AsyncFleet,
        name: str,
        unit: str,
        pid: int,
        popen: subprocess.Popen[bytes] | None,
    ) -> None:
        self.fleet = fleet
        self.name = name
        self.unit = unit
        self.pid = pid
        self.popen = popen
        self.started = time.time()
        #: starting, running, frozen, stopping, exited, failed or lost
        self.state = "running"
        self.memory_current: int | None = None
        self.memory_peak: int | None = None
        self.oom_kills = 0
        self.argv: list[str] = []
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self.returncode: int | None = None
        #: "tmux" when the agent runs in a window of the fleet's tmux session
        self.terminal: str | None = None
        self._exited: asyncio.Future[int | None] | None = None

    def __repr__(self) -> str:
        return f"<Agent {self.name} {self.state} pid={self.pid} unit={self.unit}>"

    @classmethod
    def _from_record(cls, fleet: AsyncFleet, rec: AgentRecord) -> Agent:
        agent = cls(fleet, rec.name, rec.unit, rec.pid, None)
        agent.started = rec.created
        agent.state = rec.state
        agent.returncode = rec.exit_status
        agent.oom_kills = rec.oom_kills
        agent.memory_current = rec.memory_current
        agent.memory_peak = rec.memory_peak
        agent.argv = list(rec.argv)
        agent.terminal = fleet._terminals.get(rec.unit)
        return agent

    def to_dict(self) -> dict[str, Any]:
        """The agent as JSON-ready data (what ``agentscope ls --json`` prints)."""
        return {
            "name": self.name,
            "fleet": self.fleet.name,
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
        }

    @property
    def cgroup(self) -> str | None:
        """The agent's cgroup path (``/.../unit.scope``), None once it exited."""
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
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            fut.set_result(self._reap())
            return fut

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if not fut.done():
                status = self._reap()
                fut.set_result(status)
                # A pane's process is the tmux server's child: no status, but the exit is seen.
                if self.popen is not None or self.terminal is not None:
                    self.fleet._note_exit(self, status)

        loop.add_reader(pidfd, on_exit)
        return fut

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
        """Whether the agent's main process still runs (and is not a zombie)."""
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            return bool(psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _check_argv(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
    if isinstance(argv, str | bytes) or not argv:
        raise LaunchError(f"argv must be a non-empty list of strings, not {argv!r}")
    if not all(isinstance(a, str) for a in argv):
        raise LaunchError(f"argv must hold only strings: {list(argv)!r}")
    if env is not None:
        if not isinstance(env, Mapping):
            raise LaunchError(f"env must be a mapping of str to str, not {type(env).__name__}")
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise LaunchError(f"env must map str to str; these entries do not: {bad!r}")
    if cwd is not None and not os.path.isdir(cwd):
        raise LaunchError(f"cwd {cwd!r} is not a directory")
    if cwd is not None and not os.access(cwd, os.X_OK):
        raise LaunchError(f"cwd {cwd!r} is not accessible")
    # Resolved on the agent's own PATH, before any scope exists.
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    prog = argv[0]
    if os.sep in prog:
        full = prog if os.path.isabs(prog) or cwd is None else os.path.join(cwd, prog)
        if not os.path.isfile(full):
            raise LaunchError(f"{prog!r}: no such file")
        if not os.access(full, os.X_OK):
            raise LaunchError(f"{prog!r} is not executable (chmod +x it)")
        return full
    found = shutil.which(prog, path=path)
    if found is None:
        raise LaunchError(f"{prog!r} not found on the agent's PATH ({path})")
    return found


class AsyncFleet:
    """A fleet of agents on one systemd manager; the asyncio core.

    Use it as ``async with AsyncFleet("default") as fleet``. Agents outlive
    the fleet object and the process that holds it: closing the fleet closes
    the D-Bus connection and nothing else. ``tmux_dir`` is where the fleet's
    tmux server keeps its socket (default: ``tmux-<fleet>`` under
    ``/run/agentscope`` or ``$XDG_RUNTIME_DIR/agentscope``; docs/tmux.md).
    ``admission_wait`` is how long :meth:`launch` and :meth:`adopt` wait
    for a pressure that this fleet's guard sees to clear before they raise
    :class:`HostUnderPressure` (docs/guard.md; default: no wait).

    Raises:
        InvalidName: a bad fleet name.
        SystemdUnavailable: (on enter) no manager reachable.
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
        admission_wait: float = 0.0,
    ) -> None:
        if policy not in ("adopt", "stop"):
            raise AgentscopeError(f"policy must be 'adopt' or 'stop', not {policy!r}")
        if not 0 <= admission_wait <= 86400:
            raise InvalidConfig("admission_wait", admission_wait, "from 0 to 86400 (seconds)")
        self.admission_wait = admission_wait
        self.name = _names.validate_name("fleet", name)
        self.slice = _names.validate_slice(slice)
        self._bus = SystemdBus(manager, env=env)
        self.manager = self._bus.manager
        self.agent_oom_score_adj = agent_oom_score_adj
        self.manager_oom_score_adj = manager_oom_score_adj
        self._agents: dict[str, Agent] = {}
        self._slice_checked = False
        self._slice_lock = asyncio.Lock()
        self._oom_policy: bool | None = None  # None: not tried yet
        self._closed = False
        self.policy = policy
        self.registry_path = Path(
            registry if registry is not None else default_registry_path(self.manager)
        )
        self._registry: Registry | None = None
        self._slice_cgroup: Path | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unit_names: dict[str, str] = {}
        # Each launch in flight holds a thread inside Popen until its exec; a
        # few at a time keep the GIL (and the event loop) free for the rest.
        self._spawn_slots = asyncio.Semaphore(max(4, 2 * (os.cpu_count() or 1)))
        self._monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()
        # tmux agents: their units, and the fleet's server on its private socket.
        self._terminals: dict[str, str] = {}
        self._tmux = _tmux.TmuxServer(
            self.name,
            Path(tmux_dir)
            if tmux_dir is not None
            else _tmux.socket_dir(_tmux.runtime_dir(self.manager, env), self.name),
        )
        self._tmux_lock = asyncio.Lock()

    async def __aenter__(self) -> AsyncFleet:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Connect, open the registry and take over this fleet's running agents.

        Scopes of this fleet whose registry row matches (unit, pid and the
        pid's start time) are adopted, or stopped with ``policy="stop"``;
        scopes the registry does not know are recorded (or stopped) the same
        way; rows whose scope is gone are closed as lost.

        Raises:
            SystemdUnavailable, RegistryError.
        """
        await self._bus.connect()
        try:
            if self.manager_oom_score_adj is not None:
                _raise_own_oom_score_adj(self.manager_oom_score_adj)
            self._registry = await asyncio.to_thread(Registry, self.registry_path)
            await self._load_terminals()
            await self._reconcile()
        except BaseException:
            await self.aclose()  # a fleet that failed to open holds nothing open
            raise

    async def aclose(self) -> None:
        """Close the connection and the registry. Agents keep running."""
        self._closed = True
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        self._bus.close()
        if self._registry is not None:
            await asyncio.to_thread(self._registry.close)
            self._registry = None

    # -- registry -----------------------------------------------------------

    async def _db(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one registry call off the event loop."""
        assert self._registry is not None, "fleet not open"
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _event(self, agent: str | None, kind: str, **detail: Any) -> None:
        assert self._registry is not None
        await self._db(self._registry.record_event, self.name, agent, kind, detail)

    def _mark_running(self, unit: str, **event: dict[str, Any]) -> None:
        """Row to running, and the event that says why: one transaction."""
        assert self._registry is not None
        ((kind, detail),) = event.items()
        self._registry.set_state(unit, "running", event=kind, detail={"unit": unit, **detail})

    def _note_exit(self, agent: Agent, status: int | None) -> None:
        """A launched child was reaped: record it (from the pidfd callback)."""
        task = asyncio.get_running_loop().create_task(self._record_exit(agent, status))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record_exit(self, agent: Agent, status: int | None) -> None:
        for mon in list(self._monitors):
            mon.note_exit(
                agent.unit, agent.pid, status, exec_comm(agent.argv[0]) if agent.argv else None
            )
        if self._registry is None:
            return
        agent.state = "exited"
        registry = self._registry

        detail = {"unit": agent.unit, "pid": agent.pid, "status": status}
        try:
            await self._db(
                registry.set_state,
                agent.unit,
                "exited",
                exit_status=status,
                event="exited",
                detail=detail,
            )
        except InvalidTransition:
            pass  # already closed by a listing that saw the scope go first
        except RegistryError as exc:
            log.warning("could not record the exit of %s: %s", agent.name, exc)

    async def slice_cgroup(self) -> Path:
        """The agents slice's cgroup directory, as systemd reports it."""
        if self._slice_cgroup is None:
            path = await self._bus.unit_path(self.slice)
            cg = await self._bus.get_property(path, _SLICE_IFACE, "ControlGroup")
            if not cg:  # not realized yet: where systemd will put it
                # Not cached: the real path is known once the slice is realized.
                return self._expected_slice_cgroup()
            else:
                self._slice_cgroup = CGROUP_ROOT / str(cg).lstrip("/")
        return self._slice_cgroup

    def _expected_slice_cgroup(self) -> Path:
        """Where the manager puts the agents slice: dashes in its name are the hierarchy."""
        return Path(_scope.slice_cgroup(self.manager, self.slice))

    async def _live(self) -> dict[str, tuple[str, str]]:
        """This fleet's scopes systemd runs: {unit: (agent name, active state)}; one call."""
        live: dict[str, tuple[str, str]] = {}
        for unit, desc, _load, active, *_ in await self._list_units():
            parsed = _names.parse_description(desc)
            if parsed is not None and parsed[0] == self.name:
                live[str(unit)] = (parsed[1], str(active))
        return live

    async def _reconcile(self) -> None:
        assert self._registry is not None
        # Rows before units: a row is written before its scope starts, so every
        # row read here whose scope runs is in the listing taken after it (the
        # other order closed launches that finished in between as lost).
        rows = await self._db(self._registry.agents, self.name)
        live = await self._live()
        slice_dir = await self.slice_cgroup()
        # A launch in flight (here or in another process) may show its scope
        # before the child is in it (the start job is still running): leave
        # such rows to their launcher.
        rows = [r for r in rows if not _in_flight(r)]
        # A tmux agent whose scope is gone ended in its window: exited, not lost.
        for rec in [r for r in rows if r.unit in self._terminals and r.unit not in live]:
            await self._close_gone(rec)
        rows = [r for r in rows if r.unit not in self._terminals or r.unit in live]
        scopes = await asyncio.to_thread(_read_scopes, slice_dir, live)
        # Rows of live scopes that could not be read are left as they are.
        rows = [r for r in rows if r.unit not in live or r.unit in scopes]
        plan = reconcile(rows, scopes)
        closed = await self._db(self._registry.apply_closures, plan)
        for rec in closed:
            log.info("agent %s (%s) is gone: closed as %s", rec.name, rec.unit, rec.state)
        for rec in plan.adopt:
            self._agents[rec.name] = Agent._from_record(self, rec)
            self._unit_names[rec.unit] = rec.name
        found: list[tuple[str, LiveScope]] = []
        for scope in plan.unknown:
            name = live[scope.unit][0]
            found.append((name, scope))
            log.warning("found agent %s (%s) that the registry did not know", name, scope.unit)
            await self._event(name, "found", unit=scope.unit, pids=list(scope.pids))
        if self.policy == "stop":
            units = [r.unit for r in plan.adopt] + [s.unit for _, s in found]
            units += [r.unit for r in plan.headless]
            await asyncio.gather(*(self._stop_unit(u, 10) for u in units))
            for rec in plan.adopt:
                await self._db(self._registry.set_state, rec.unit, "exited")
                await self._event(rec.name, "stopped", unit=rec.unit, reason="policy stop")
            self._agents.clear()
            return
        for name, scope in found:
            if not scope.pids:
                continue
            pid = min(scope.pids)
            try:
                rec = await self._db(
                    self._registry.record_launch,
                    self.name,
                    name,
                    scope.unit,
                    pid,
                    scope.start_times.get(pid, 0),
                    [],
                    "",
                    "running",
                )
            except (AgentExists, RegistryError) as exc:
                # Its row was closed meanwhile, or the name is taken by another
                # row: report it, and let the fleet open all the same.
                log.warning("cannot record found agent %s (%s): %s", name, scope.unit, exc)
                continue
            self._agents[name] = Agent._from_record(self, rec)

    # -- tmux -----------------------------------------------------------------

    async def _load_terminals(self) -> None:
        """Which open agents run in tmux windows, from their launch events (after a restart)."""
        assert self._registry is not None
        if not await asyncio.to_thread(self._tmux.dir.exists):
            return  # this fleet never had a tmux agent since boot
        rows = await self._db(self._registry.agents, self.name)
        if not rows:
            return
        units = {r.unit for r in rows}
        since = min(r.created for r in rows) - 1
        events = await self._db(self._registry.events, self.name, kind="launched", since=since)
        for ev in events:
            unit, terminal = ev.detail.get("unit"), ev.detail.get("terminal")
            if unit in units and isinstance(terminal, str):
                self._terminals[str(unit)] = terminal

    async def _tmux_server(self) -> _tmux.TmuxServer:
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
                await self._stop_unit(unit, 10)
                await self._start_tmux_server(tmux, unit)
        return tmux

    async def _start_tmux_server(self, tmux: _tmux.TmuxServer, unit: str) -> None:
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
                await self._start_scope(unit, "tmux", [child.pid], None, description)
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
        await self._event(None, "tmux_started", unit=unit, socket=str(tmux.socket))

    async def _open_pane(
        self,
        unit: str,
        name: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
    ) -> _TmuxChild:
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
        return _TmuxChild(pane)

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
            log.info("the tmux window of %s (%s) closed: stopping it", rec.name, rec.unit)
            with contextlib.suppress(BusError):
                await self._kill_unit(rec.unit, _signal.SIGKILL)
            await self._event(rec.name, "window_closed", unit=rec.unit, pid=rec.pid)
            closed[rec.unit] = await self._close_gone(rec)
        return closed

    async def _window(self, name: str) -> _tmux.Window:
        """The tmux window of a running agent (its pane's process is the agent's)."""
        self._check_open()
        unit = await self._resolve(name)
        assert self._registry is not None
        rec = await self._db(self._registry.by_unit, unit)
        known = self._agents.get(name)
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

    # -- monitor --------------------------------------------------------------

    def unit_agent(self, unit: str) -> str | None:
        """The name of this fleet's agent in ``unit``, None if it is not one (thread-safe)."""
        known = self._unit_names.get(unit)
        if known is not None:
            return known
        prefix = f"agentscope-{self.name}-"
        if unit.startswith(prefix) and unit.endswith(".scope") and len(unit) > len(prefix) + 13:
            return unit[len(prefix) : -len("-xxxxxx.scope")] or None
        return None

    def monitor(
        self,
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: bool | GuardConfig = False,
        **options: Any,
    ) -> Monitor:
        """A memory monitor for this fleet: ``async with fleet.monitor() as m: async for e in m``.

        Events (OOM kills, throttling, pressure, exits, limits found, guard
        kills) are also recorded in the registry. ``guard`` (True or a
        :class:`GuardConfig`) runs the memory guard with the monitor
        (docs/guard.md); it never kills this process or the fleet's tmux
        server, and while it sees the host short, :meth:`launch` and
        :meth:`adopt` wait ``admission_wait`` seconds, then raise
        :class:`HostUnderPressure`. ``options`` go to :class:`Monitor`.
        """
        self._check_open()
        # The slice may not exist yet (no agent so far): watch where it will be.
        slice_path = self._slice_cgroup or self._expected_slice_cgroup()
        theirs = options.pop("on_event", None)
        if guard is not False:
            options.setdefault("guard_protect", self._guard_protected)

        def on_event(event: MonitorEvent) -> None:
            self._on_monitor_event(event)
            if theirs is not None:
                theirs(event)

        mon = Monitor(
            slice_path=slice_path,
            unit_agent=self.unit_agent,
            interval=interval,
            top=top,
            manager=self.manager,
            on_event=on_event,
            guard=guard,
            **options,
        )
        self._monitors.add(mon)
        return mon

    def _guard_protected(self) -> tuple[frozenset[int], frozenset[str]]:
        """What a guard must never kill: this process and the fleet's tmux server (any thread)."""
        pids = {os.getpid()}
        tmux_pid = self._tmux.known_pid
        if tmux_pid is not None:
            pids.add(tmux_pid)
        return frozenset(pids), frozenset({_tmux.tmux_unit(self.name)})

    async def _admit(self) -> None:
        """Admission control: wait for (or refuse on) pressure this fleet's guards see."""
        guards = [m.guard for m in list(self._monitors) if m.guard is not None]
        if guards:
            await admit(guards, self.admission_wait)

    async def report(self, top: int = 10) -> MemoryReport:
        """A memory report now: host, PSI, every agent, the top processes with their agent."""
        self._check_open()
        return await build_report(await self.slice_cgroup(), self.unit_agent, top=top)

    def _on_monitor_event(self, event: MonitorEvent) -> None:
        task = asyncio.get_running_loop().create_task(self._record_monitor_event(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record_monitor_event(self, event: MonitorEvent) -> None:
        if self._registry is None:
            return
        data = event.to_dict()
        agent = data.pop("agent", None)
        agent = agent if isinstance(agent, str) else None
        try:
            if isinstance(event, OomKill) and event.unit and agent is not None:
                with contextlib.suppress(RegistryError):
                    await self._db(self._registry.add_oom_kills, event.unit, 1)
            if not isinstance(event, AgentExited):  # exits are recorded by the fleet
                if isinstance(event, MonitorPressure):
                    data.pop("report", None)  # a whole report per event would bloat the file
                await self._event(agent, data.pop("kind"), **data)
        except RegistryError as exc:
            log.warning("could not record %s: %s", event.kind, exc)

    async def events(
        self,
        *,
        agent: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
    ) -> list[EventRecord]:
        """The fleet's recorded events, oldest first (``after_id`` for following)."""
        self._check_open()
        assert self._registry is not None
        return await self._db(
            self._registry.events,
            self.name,
            agent=agent,
            since=since,
            kind=kind,
            after_id=after_id,
            limit=limit,
        )

    async def gc(self, retention_seconds: float = 7 * 86400) -> int:
        """Prune exited agents older than the retention, and their events."""
        self._check_open()
        assert self._registry is not None
        return await self._db(self._registry.gc, retention_seconds)

    @property
    def systemd_version(self) -> str:
        """The manager's systemd version string, as it reports it ("" before open)."""
        return self._bus.version

    @property
    def bus_address(self) -> str:
        """The D-Bus address the fleet reached its manager at ("" before open)."""
        return self._bus.address

    def _check_open(self) -> None:
        if self._closed:
            raise AgentscopeError(f"fleet {self.name!r} is closed; open a new one")
        if self._registry is None:
            raise AgentscopeError(
                f"fleet {self.name!r} is not open: use 'async with AsyncFleet(...)' or open()"
            )

    # -- launch ---------------------------------------------------------

    async def launch(
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
        _streams: bool = True,
    ) -> Agent:
        """Start ``argv`` as agent ``name`` in a new scope; return once it exec'd.

        ``stdin``/``stdout``/``stderr`` take what ``subprocess`` takes (None,
        ``DEVNULL``, ``PIPE``, a file or an fd). ``memory_max`` (bytes) caps
        this agent's scope only (with no swap); the slice itself never gets a
        limit. ``terminal="tmux"`` runs the agent in a window named ``name``
        of the fleet's tmux session (see :meth:`attach`, :meth:`logs`,
        :meth:`send`); its stdio is the pane, so the stdio arguments must
        stay None.

        Raises:
            InvalidName, LaunchError, AgentExists, BusError, SystemdUnavailable,
            HostUnderPressure (the guard sees the host short: nothing was started),
            TmuxError (tmux missing, its directory not writable, the window
            name taken: nothing was started).
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        cwd_s = os.fspath(cwd) if cwd is not None else None
        _check_argv(argv, env, cwd_s)
        _check_memory_max(memory_max)
        if terminal not in (None, "tmux"):
            raise LaunchError(f"terminal must be None or 'tmux', not {terminal!r}")
        if terminal is not None and (stdin, stdout, stderr) != (None, None, None):
            raise LaunchError(
                "a tmux agent's stdin, stdout and stderr are its pane: leave them None "
                "(read its output with logs(), type into it with send())"
            )
        await self._admit()
        if terminal is not None:
            # Before the pane: a running tmux agent's window would otherwise
            # make it fail as WindowExists instead of AgentExists.
            await self._refuse_running(name)
        else:
            # The registry's open row is checked when the launch is recorded
            # (_record_launch): no trip to the registry before the fork.
            self._refuse_known(name)
        await self._clear_slice_limits()
        # Registry writes of this fleet still in flight (an exit just seen)
        # would otherwise run during the fork and the gate, where they and the
        # fork slow each other down (the GIL, and copy-on-write faults on every
        # page they touch while the child shares them): let them finish first.
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        unit = _names.scope_unit_name(self.name, name)
        async with self._spawn_slots:
            popen, pid = await self._spawn_in_scope(
                unit, name, argv, cwd_s, env, stdin, stdout, stderr, memory_max, terminal
            )
        agent = Agent(self, name, unit, pid, popen)
        agent.argv = list(argv)
        agent.terminal = terminal
        self._unit_names[unit] = name
        launched: dict[str, Any] = {"pid": agent.pid, "argv": list(argv)}
        if terminal is not None:
            self._terminals[unit] = terminal
            launched["terminal"] = terminal
        try:
            await self._db(self._mark_running, unit, launched=launched)
        finally:
            # Watched only now: an exit recorded before the row says running
            # (a command that ends at once) made the move to running fail as
            # InvalidTransition. Nothing can reap the child meanwhile (it is
            # not in _agents yet), so the pidfd still finds it, a zombie at worst.
            self._agents[name] = agent
            agent._watch_exit()
        if _streams and popen is not None:  # the blocking facade reads the plain pipes instead
            await agent._attach_streams()
        log.debug("launched %s as %s (pid %d)", name, unit, agent.pid)
        return agent

    async def _spawn_in_scope(
        self,
        unit: str,
        name: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: Stdio,
        stdout: Stdio,
        stderr: Stdio,
        memory_max: int | None,
        terminal: str | None = None,
    ) -> tuple[subprocess.Popen[bytes] | None, int]:
        """Fork the gated child (or open its tmux pane), record it, make its scope, let it exec.

        Returns the Popen (None for a tmux pane, the tmux server's child) and the PID.
        """
        # This launch's own reference: cleanup must work even if the fleet is
        # closed meanwhile (a gather of launches cancelled at shutdown).
        registry = self._registry
        assert registry is not None
        child: GatedChild | _TmuxChild
        try:
            if terminal is not None:
                child = await self._open_pane(unit, name, argv, cwd, env)
            else:
                child = await spawn_gated(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    oom_score_adj=self.agent_oom_score_adj,
                )
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
        recorded = False
        try:
            await self._record_launch(registry, name, unit, child.pid, argv, cwd)
            recorded = True
            await self._start_scope(unit, name, [child.pid], memory_max)
        except BaseException:
            await child.abort()
            if recorded:
                try:
                    await asyncio.to_thread(registry.delete, unit)
                except RegistryError as exc:  # closed meanwhile: reconciliation closes the row
                    log.debug("could not forget %s: %s", unit, exc)
            raise
        try:
            popen = await child.release()
        except (OSError, LaunchError) as exc:
            # The exec failed inside the scope: the scope ends with its only process.
            await self._db(registry.set_state, unit, "failed")
            await self._event(name, "failed", unit=unit, error=str(exc))
            raise LaunchError(f"cannot exec {argv[0]!r}: {exc}") from exc
        return popen, child.pid

    async def _record_launch(
        self,
        registry: Registry,
        name: str,
        unit: str,
        pid: int,
        argv: Sequence[str],
        cwd: str | None,
    ) -> None:
        """Record the launch (state starting) before its scope exists.

        The registry's partial unique index allows one open row per name, so
        another launch of the same name, in this process or another, fails
        here with nothing started. An open row whose scope is gone (its
        launcher died unseen) is closed, and the launch recorded after all.
        """
        stat = read_stat(pid)
        record = functools.partial(
            registry.record_launch,
            self.name,
            name,
            unit,
            pid,
            stat.start_time if stat else 0,
            list(argv),
            cwd or os.getcwd(),
        )
        try:
            await self._db(record)
        except AgentExists:
            rec = await self._db(registry.get, self.name, name)
            # A starting row whose child lives is another launcher at work.
            if rec is None or rec.closed or _in_flight(rec) or await self._unit_active(rec.unit):
                raise
            await self._close_gone(rec)
            await self._db(record)

    def _refuse_known(self, name: str) -> None:
        known = self._agents.get(name)
        if known is not None and known.alive() and known.state != "exited":
            raise AgentExists(self.name, name, known.unit)

    async def _refuse_running(self, name: str) -> None:
        # The registry is the fleet's memory across processes: its open row
        # names the running agent, so no listing of systemd's units is needed
        # (ListUnitsByPatterns costs systemd O(units) per launch).
        self._refuse_known(name)
        assert self._registry is not None
        rec = await self._db(self._registry.get, self.name, name)
        if rec is not None and not rec.closed:
            # A starting row whose child lives is another launcher at work.
            if _in_flight(rec) or await self._unit_active(rec.unit):
                raise AgentExists(self.name, name, rec.unit)
            await self._close_gone(rec)  # its scope is gone: close the row first

    async def _unit_active(self, unit: str) -> bool:
        try:
            (path,) = await self._bus.call("GetUnit", "s", [unit])
        except BusError as exc:
            if exc.dbus_name == "org.freedesktop.systemd1.NoSuchUnit":
                return False
            raise
        state = await self._bus.get_property(str(path), _UNIT_IFACE, "ActiveState")
        return state in ("active", "activating", "deactivating", "reloading")

    async def _list_units(self, agent: str | None = None) -> list[list[Any]]:
        (units,) = await self._bus.call(
            "ListUnitsByPatterns",
            "asas",
            [
                ["active", "activating", "deactivating", "reloading"],
                [_names.scope_pattern(self.name, agent)],
            ],
        )
        return list(units)

    async def _start_scope(
        self,
        unit: str,
        name: str,
        pids: list[int],
        memory_max: int | None,
        description: str | None = None,
    ) -> None:
        props = _scope.scope_properties(self.name, name, self.slice, memory_max, description)
        fds: list[int] = []
        await self._bus.connect()  # the version decides PIDs or PIDFDs
        try:
            if self._bus.version_major >= 255:
                # A pidfd names the process itself, not a number that may be reused.
                fds = [os.pidfd_open(p) for p in pids]
                props["PIDFDs"] = ("ah", list(range(len(fds))))
            else:
                props["PIDs"] = ("au", pids)
            await self._start_transient(unit, props, fds)
        finally:
            for fd in fds:
                os.close(fd)

    async def _start_transient(
        self, unit: str, props: dict[str, tuple[str, Any]], fds: list[int]
    ) -> None:
        if self._oom_policy is not False:
            try:
                await self._run_start(unit, {**props, "OOMPolicy": ("s", "continue")}, fds)
                self._oom_policy = True
                return
            except BusError as exc:
                if not _scope.refuses_oom_policy(exc.dbus_name, exc.message):
                    raise
                self._oom_policy = False
                log.warning(_scope.OOMPOLICY_WARNING, self._bus.version)
        await self._run_start(unit, props, fds)

    async def _run_start(
        self, unit: str, props: dict[str, tuple[str, Any]], fds: list[int]
    ) -> None:
        result = await self._bus.run_job(
            unit,
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            [unit, "fail", SystemdBus.props(props), []],
            unix_fds=fds,
            timeout=60,
        )
        if result != "done":
            raise LaunchError(_scope.job_failed_message(unit, result, self.manager))

    async def _clear_slice_limits(self) -> None:
        if self._slice_checked:
            return
        async with self._slice_lock:
            if not self._slice_checked:
                await self.clear_slice_limits()
                self._slice_checked = True

    async def clear_slice_limits(self) -> dict[str, int]:
        """Clear any MemoryHigh/MemoryMax/MemorySwapMax on the agents slice, until reboot.

        A MemoryHigh there throttles every agent at once. Every launch does
        this once per fleet; returns what was cleared (empty: nothing was set).
        """
        limits = await self.slice_limits()
        stale = {k: v for k, v in limits.items() if v is not None}
        if stale:
            await self._bus.call(
                "SetUnitProperties",
                "sba(sv)",
                [self.slice, True, SystemdBus.props({k: ("t", INFINITY) for k in stale})],
            )
            log.warning(
                "cleared stale limits on %s until reboot: %s (a MemoryHigh there "
                "throttles every agent at once; find where they were set with "
                "systemctl %scat %s)",
                self.slice,
                ", ".join(f"{k}={v}" for k, v in stale.items()),
                "--user " if self.manager == "user" else "",
                self.slice,
            )
            if self._registry is not None:
                await self._event(None, "limits_cleared", slice=self.slice, limits=stale)
        return stale

    async def slice_limits(self) -> dict[str, int | None]:
        """The agents slice's MemoryHigh/MemoryMax/MemorySwapMax; None means infinity."""
        return await _slice_limits(self._bus, self.slice)

    # -- adopt ------------------------------------------------------------

    async def adopt(self, pid: int, name: str, *, memory_max: int | None = None) -> Agent:
        """Move a running process and all its descendants into a new agent scope.

        ``memory_max`` (bytes) caps the new scope, as for :meth:`launch`.

        Raises:
            InvalidName, AgentExists, LaunchError (no such process), BusError,
            HostUnderPressure (as for :meth:`launch`).
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        try:
            root = psutil.Process(pid)
            pids = [pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.NoSuchProcess as exc:
            raise LaunchError(f"no process with pid {pid} to adopt") from exc
        await self._admit()
        await self._refuse_running(name)
        await self._clear_slice_limits()
        unit = _names.scope_unit_name(self.name, name)
        assert self._registry is not None
        stat = read_stat(pid)
        try:  # another user's process: its argv and cwd may be hidden from us
            argv, cwd = root.cmdline(), root.cwd()
        except psutil.Error:
            argv, cwd = [], ""
        await self._db(
            self._registry.record_launch,
            self.name,
            name,
            unit,
            pid,
            stat.start_time if stat else 0,
            argv,
            cwd,
        )
        try:
            await self._start_scope(unit, name, pids, _check_memory_max(memory_max))
        except BaseException:
            await self._db(self._registry.delete, unit)
            raise
        await self._db(self._mark_running, unit, adopted={"pid": pid, "pids": pids})
        # Children forked while the scope was being made: move them too.
        try:
            late = [c.pid for c in root.children(recursive=True) if c.pid not in pids]
        except psutil.NoSuchProcess:
            late = []
        if late:
            await self._bus.call("AttachProcessesToUnit", "ssau", [unit, "", late])
        for p in [*pids, *late]:
            _write_oom_score_adj(p, self.agent_oom_score_adj)
        agent = Agent(self, name, unit, pid, None)
        self._agents[name] = agent
        self._unit_names[unit] = name
        return agent

    # -- control ----------------------------------------------------------

    async def _resolve(self, name: str) -> str:
        """The unit of a running agent of this fleet, known here or in systemd."""
        _names.validate_name("agent", name)
        agent = self._agents.get(name)
        if agent is not None and agent.state not in _CLOSED and agent.alive():
            return agent.unit
        for unit, desc, *_ in await self._list_units(name):
            if _names.parse_description(desc) == (self.name, name):
                return str(unit)
        raise AgentNotFound(self.name, name)

    async def stop(self, name: str, timeout: float = 10) -> None:
        """Stop an agent: SIGTERM to all its processes, SIGKILL after ``timeout``.

        Returns once the scope's stop job is done.

        Raises:
            AgentNotFound, BusError, SystemdUnavailable.
        """
        self._check_open()
        unit = await self._resolve(name)
        await self._stop_unit(unit, timeout)
        agent = self._agents.get(name)
        if agent is not None and (agent.popen is not None or agent.terminal is not None):
            await agent.wait()  # its exit watcher records the exit
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if agent is None or agent.popen is None:
            assert self._registry is not None
            rec = await self._db(self._registry.by_unit, unit)
            if rec is not None and not rec.closed:
                await self._db(self._registry.set_state, unit, "exited")
        await self._event(name, "stopped", unit=unit)

    async def _stop_unit(self, unit: str, timeout: float) -> None:
        try:
            await self._bus.run_job(unit, "StopUnit", "ss", [unit, "replace"], timeout=timeout)
        except TimeoutError:
            log.info("%s did not stop within %ss: sending SIGKILL", unit, timeout)
            fut = self._bus.expect_job(unit)
            try:
                try:
                    await self._kill_unit(unit, _signal.SIGKILL)
                except BusError as exc:
                    if exc.dbus_name in _STOPPED_MEANWHILE:
                        return  # the stop job finished between the timeout and the kill
                    raise
                # The stop job ends once the processes are gone; it may also have
                # ended just before the future was registered, so look too.
                for _ in range(30):
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await asyncio.shield(fut)
                    if fut.done() or not await self._unit_active(unit):
                        return
                raise AgentscopeError(
                    f"{unit} did not stop within {timeout + 30:.0f}s, even after SIGKILL; "
                    f"see systemctl {'--user ' if self.manager == 'user' else ''}status {unit}"
                )
            finally:
                self._bus.forget_job(unit)
        except BusError as exc:
            if exc.dbus_name != "org.freedesktop.systemd1.NoSuchUnit":
                raise

    async def _kill_unit(self, unit: str, sig: int) -> None:
        await self._bus.call("KillUnit", "ssi", [unit, "all", int(sig)])

    async def kill(self, name: str, signal: int = _signal.SIGTERM) -> None:
        """Send ``signal`` to every process of the agent's scope.

        Raises:
            AgentNotFound, BusError, SystemdUnavailable.
        """
        self._check_open()
        unit = await self._resolve(name)
        await self._kill_unit(unit, signal)
        await self._event(name, "signalled", unit=unit, signal=int(signal))

    async def freeze(self, name: str) -> None:
        """Freeze every process of the agent (cgroup freezer; systemd 246+)."""
        self._check_open()
        unit = await self._resolve(name)
        await self._bus.call("FreezeUnit", "s", [unit])
        await self._event(name, "frozen", unit=unit)

    async def thaw(self, name: str) -> None:
        """Thaw a frozen agent."""
        self._check_open()
        unit = await self._resolve(name)
        await self._bus.call("ThawUnit", "s", [unit])
        await self._event(name, "thawed", unit=unit)

    async def agents(self, *, all: bool = False) -> list[Agent]:
        """The fleet's agents, in launch order: running ones, or ``all`` with exited ones.

        Reads the registry and the cgroup files and reconciles states with
        systemd in one ListUnitsByPatterns call, whatever the number of
        agents; it never waits on an agent. Agents launched by other
        processes are included (without a Popen).
        """
        self._check_open()
        assert self._registry is not None
        live = await self._live()
        for agent in list(self._agents.values()):
            if agent.popen is not None and agent.state != "exited" and not agent.alive():
                await self._record_exit(agent, agent.popen.returncode)
        rows = await self._db(self._registry.agents, self.name, include_closed=all)
        windowed = [
            r
            for r in rows
            if r.unit in self._terminals and r.unit in live and r.state not in _CLOSED
        ]
        if windowed:
            closed = await self._close_windowless(windowed)
            rows = [closed.get(r.unit, r) for r in rows]
        slice_dir = await self.slice_cgroup()
        out: list[Agent] = []
        for rec in rows:
            if not rec.closed and rec.unit not in live:
                if _in_flight(rec):
                    continue
                rec = await self._close_gone(rec)
            known = self._agents.get(rec.name)
            if known is not None and known.unit == rec.unit:
                agent = known
                agent.state = rec.state
            else:
                agent = Agent._from_record(self, rec)
            if not rec.closed:
                agent.state = "stopping" if live[rec.unit][1] == "deactivating" else rec.state
            out.append(agent)
        figures = await asyncio.to_thread(
            _read_figures, slice_dir, [a.unit for a in out if a.state not in _CLOSED]
        )
        for agent in out:
            fig = figures.get(agent.unit)
            if fig is None:
                continue
            if fig.memory_current is not None:
                agent.memory_current, agent.memory_peak = fig.memory_current, fig.memory_peak
            if fig.oom_kills is not None:
                agent.oom_kills = max(agent.oom_kills, fig.oom_kills)
            if fig.frozen and agent.state == "running":
                agent.state = "frozen"
        return out

    async def _close_gone(self, rec: AgentRecord) -> AgentRecord:
        """Close the row of an agent whose scope is gone: exited if seen, else lost."""
        assert self._registry is not None
        if rec.unit in self._terminals:  # it ended in (or with) its tmux window
            try:
                closed = await self._db(self._registry.set_state, rec.unit, "exited")
            except InvalidTransition:
                return await self._db(self._registry.by_unit, rec.unit) or rec
            await self._event(rec.name, "exited", unit=rec.unit, pid=rec.pid, status=None)
            return closed
        agent = self._agents.get(rec.name)
        if agent is not None and agent.unit == rec.unit and agent.popen is not None:
            status = agent.popen.poll()
            if status is not None:
                agent.state = "exited"
                try:
                    return await self._db(
                        self._registry.set_state, rec.unit, "exited", exit_status=status
                    )
                except InvalidTransition:
                    return await self._db(self._registry.by_unit, rec.unit) or rec
        try:
            closed = await self._db(self._registry.set_state, rec.unit, "lost")
        except InvalidTransition:
            return await self._db(self._registry.by_unit, rec.unit) or rec
        await self._event(rec.name, "lost", unit=rec.unit, pid=rec.pid)
        return closed


async def _slice_limits(bus: SystemdBus, slice: str) -> dict[str, int | None]:
    path = await bus.unit_path(slice)
    props = await bus.get_all(path, _SLICE_IFACE)
    return {k: (None if props.get(k, INFINITY) == INFINITY else props[k]) for k in _LIMITS}


_CLOSED = ("exited", "failed", "lost")


def _check_memory_max(memory_max: object) -> int | None:
    if memory_max is not None and (
        not isinstance(memory_max, int) or isinstance(memory_max, bool) or memory_max <= 0
    ):
        raise LaunchError(f"memory_max must be a positive number of bytes, not {memory_max!r}")
    return memory_max


_LAUNCH_GRACE = 120.0  # seconds a "starting" row may take before it is judged


def _in_flight(rec: AgentRecord) -> bool:
    """A young ``starting`` row whose child lives: its launcher is still at work."""
    if rec.state != "starting" or time.time() - rec.created > _LAUNCH_GRACE:
        return False
    stat = read_stat(rec.pid)
    return stat is not None and stat.start_time == rec.start_time


def _read_scopes(slice_dir: Path, live: Mapping[str, tuple[str, str]]) -> dict[str, LiveScope]:
    """The processes of each live scope, from cgroup.procs and /proc (no D-Bus)."""
    out: dict[str, LiveScope] = {}
    for unit, (_name, active) in live.items():
        procs = _read_text(slice_dir / unit / "cgroup.procs")
        if procs is None:
            # Unreadable (gone this instant, or not where we looked): no
            # verdict on its row rather than a wrong "headless".
            continue
        pids = tuple(int(p) for p in procs.split())
        starts = {}
        for pid in pids:
            st = read_stat(pid)
            if st is not None:
                starts[pid] = st.start_time
        out[unit] = LiveScope(unit, pids, starts, active)
    return out


def _read_figures(slice_dir: Path, units: Sequence[str]) -> dict[str, _Figures]:
    """Memory figures, OOM kills and the freezer state of each scope, from its files.

    A scope that vanished mid-read gives Nones: that is normal, not an error.
    """
    out = {}
    for unit in units:
        d = slice_dir / unit
        current = _read_text(d / "memory.current")
        peak = _read_text(d / "memory.peak")  # kernel 5.19+
        events = _read_text(d / "memory.events")
        kills = parse_memory_events(events.encode()).oom_kill if events else None
        out[unit] = _Figures(
            int(current) if current else None,
            int(peak) if peak else None,
            kills,
            "frozen 1" in (_read_text(d / "cgroup.events") or ""),
        )
    return out


class _TmuxChild:
    """A tmux pane whose shim waits at its gate, with the interface of a GatedChild."""

    def __init__(self, pane: _tmux.PaneLaunch) -> None:
        self.pane = pane
        self.pid = pane.pid

    async def release(self) -> None:
        await asyncio.to_thread(self.pane.go)

    async def abort(self) -> None:
        await asyncio.to_thread(self.pane.abort)


@dataclass(frozen=True)
class _Figures:
    memory_current: int | None
    memory_peak: int | None
    oom_kills: int | None
    frozen: bool


def _write_oom_score_adj(pid: int, value: int) -> bool:
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(value))
    except OSError as exc:
        log.debug("cannot set oom_score_adj of %d to %d: %s", pid, value, exc)
        return False
    return True


def _raise_own_oom_score_adj(value: int) -> None:
    current = _read_text(Path("/proc/self/oom_score_adj"))
    if current is not None and int(current) >= value:
        return  # never lower it
    _write_oom_score_adj(os.getpid(), value)


async def probe(manager: str = "auto", *, slice: str = _names.DEFAULT_SLICE) -> Capabilities:
    """What the systemd manager in reach can do.

    Connects, asks for the version, looks at the cgroup tree, and checks
    whether scopes accept OOMPolicy (their D-Bus interface lists it) and
    PIDFDs (systemd 255+). Creates nothing.

    Raises:
        SystemdUnavailable: no manager reachable.
    """
    bus = SystemdBus(manager)
    try:
        await bus.connect()
        root = Path(_scope.manager_cgroup(bus.manager))
        init_path = await bus.unit_path("init.scope")
        xml = await bus.call(
            "Introspect", path=init_path, interface="org.freedesktop.DBus.Introspectable"
        )
        scope_section = str(xml[0]).split(f'<interface name="{_SCOPE_IFACE}">', 1)[-1]
        scope_section = scope_section.split("</interface>", 1)[0]
        limits = await _slice_limits(bus, slice)
        return Capabilities(
            manager=bus.manager,
            systemd_version=bus.version,
            bus_address=bus.address,
            cgroup_v2=cgroup_v2_mounted(),
            memory_controller=memory_controller_enabled(root),
            scope_oom_policy='name="OOMPolicy"' in scope_section,
            pidfds=bus.version_major >= 255,
            slice=slice,
            slice_limits=limits,
        )
    finally:
        bus.close()
