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
import functools
import logging
import os
import shutil
import signal as _signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from . import _names
from ._bus import INFINITY, SystemdBus
from ._cgroup import CGROUP_ROOT, cgroup_v2_mounted, memory_controller_enabled
from ._errors import (
    AgentExists,
    AgentNotFound,
    AgentscopeError,
    BusError,
    LaunchError,
)
from ._proc import read_cgroup
from ._spawn import spawn_gated

__all__ = ["Agent", "AsyncFleet", "Capabilities", "probe"]

log = logging.getLogger("agentscope")

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
_SLICE_IFACE = "org.freedesktop.systemd1.Slice"
_SCOPE_IFACE = "org.freedesktop.systemd1.Scope"
_LIMITS = ("MemoryHigh", "MemoryMax", "MemorySwapMax")
# systemd < 253 (and vanilla 252.0-252.4) refuse OOMPolicy on a scope with one of these.
_NO_OOMPOLICY = (
    "org.freedesktop.DBus.Error.PropertyReadOnly",
    "org.freedesktop.DBus.Error.UnknownProperty",
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
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self.returncode: int | None = None
        self._exited: asyncio.Future[int | None] | None = None

    def __repr__(self) -> str:
        return f"<Agent {self.name} pid={self.pid} unit={self.unit}>"

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
                fut.set_result(self._reap())

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
    the D-Bus connection and nothing else.

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
        env: Mapping[str, str] | None = None,
    ) -> None:
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

    async def __aenter__(self) -> AsyncFleet:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Connect to the manager and raise this process's oom_score_adj."""
        await self._bus.connect()
        if self.manager_oom_score_adj is not None:
            _raise_own_oom_score_adj(self.manager_oom_score_adj)

    async def aclose(self) -> None:
        """Close the connection. Agents keep running."""
        self._closed = True
        self._bus.close()

    @property
    def systemd_version(self) -> str:
        return self._bus.version

    def _check_open(self) -> None:
        if self._closed:
            raise AgentscopeError(f"fleet {self.name!r} is closed; open a new one")

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
        _streams: bool = True,
    ) -> Agent:
        """Start ``argv`` as agent ``name`` in a new scope; return once it exec'd.

        ``stdin``/``stdout``/``stderr`` take what ``subprocess`` takes (None,
        ``DEVNULL``, ``PIPE``, a file or an fd). ``memory_max`` (bytes) caps
        this agent's scope only (with no swap); the slice itself never gets a
        limit.

        Raises:
            InvalidName, LaunchError, AgentExists, BusError, SystemdUnavailable.
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        cwd_s = os.fspath(cwd) if cwd is not None else None
        _check_argv(argv, env, cwd_s)
        if memory_max is not None and (not isinstance(memory_max, int) or memory_max <= 0):
            raise LaunchError(f"memory_max must be a positive number of bytes, not {memory_max!r}")
        await self._refuse_running(name)
        await self._clear_slice_limits()
        unit = _names.scope_unit_name(self.name, name)
        try:
            child = await spawn_gated(
                argv,
                cwd=cwd_s,
                env=env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                oom_score_adj=self.agent_oom_score_adj,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
        try:
            await self._start_scope(unit, name, [child.pid], memory_max)
        except BaseException:
            await child.abort()
            raise
        try:
            popen = await child.release()
        except OSError as exc:
            # The exec failed inside the scope: the scope ends with its only process.
            raise LaunchError(f"cannot exec {argv[0]!r}: {exc}") from exc
        agent = Agent(self, name, unit, popen.pid, popen)
        if _streams:  # the blocking facade reads the plain pipes instead
            await agent._attach_streams()
        self._agents[name] = agent
        log.debug("launched %s as %s (pid %d)", name, unit, agent.pid)
        return agent

    async def _refuse_running(self, name: str) -> None:
        known = self._agents.get(name)
        if known is not None and known.alive():
            raise AgentExists(self.name, name, known.unit)
        for unit, desc, *_ in await self._list_units(name):
            if _names.parse_description(desc) == (self.name, name):
                raise AgentExists(self.name, name, unit)

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
        self, unit: str, name: str, pids: list[int], memory_max: int | None
    ) -> None:
        props: dict[str, tuple[str, Any]] = {
            "Description": ("s", _names.describe(self.name, name)),
            "Slice": ("s", self.slice),
            "CollectMode": ("s", "inactive-or-failed"),
            "MemoryAccounting": ("b", True),
        }
        if memory_max is not None:
            props["MemoryMax"] = ("t", memory_max)
            props["MemorySwapMax"] = ("t", 0)
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
                if exc.dbus_name not in _NO_OOMPOLICY or "OOMPolicy" not in exc.message:
                    raise
                self._oom_policy = False
                log.warning(
                    "systemd %s refuses OOMPolicy on scopes: an OOM kill in an agent will "
                    "stop that agent's whole scope, not just the killed process. Install the "
                    "DefaultOOMPolicy=continue drop-in (agentscope install) or use systemd 253+.",
                    self._bus.version,
                )
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
            raise LaunchError(
                f"systemd could not start scope {unit}: job result {result!r}; "
                f"see journalctl {'--user ' if self.manager == 'user' else ''}-u {unit}"
            )

    async def _clear_slice_limits(self) -> None:
        if self._slice_checked:
            return
        async with self._slice_lock:
            if self._slice_checked:
                return
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
            self._slice_checked = True

    async def slice_limits(self) -> dict[str, int | None]:
        """The agents slice's MemoryHigh/MemoryMax/MemorySwapMax; None means infinity."""
        return await _slice_limits(self._bus, self.slice)

    # -- adopt ------------------------------------------------------------

    async def adopt(self, pid: int, name: str) -> Agent:
        """Move a running process and all its descendants into a new agent scope.

        Raises:
            InvalidName, AgentExists, LaunchError (no such process), BusError.
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        try:
            root = psutil.Process(pid)
            pids = [pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.NoSuchProcess as exc:
            raise LaunchError(f"no process with pid {pid} to adopt") from exc
        await self._refuse_running(name)
        await self._clear_slice_limits()
        unit = _names.scope_unit_name(self.name, name)
        await self._start_scope(unit, name, pids, None)
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
        return agent

    # -- control ----------------------------------------------------------

    async def _resolve(self, name: str) -> str:
        """The unit of a running agent of this fleet, known here or in systemd."""
        _names.validate_name("agent", name)
        agent = self._agents.get(name)
        if agent is not None:
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
        try:
            await self._bus.run_job(unit, "StopUnit", "ss", [unit, "replace"], timeout=timeout)
        except TimeoutError:
            log.info("%s did not stop within %ss: sending SIGKILL", name, timeout)
            fut = self._bus.expect_job(unit)
            try:
                await self._kill_unit(unit, _signal.SIGKILL)
                await asyncio.wait_for(fut, 30)
            finally:
                self._bus.forget_job(unit)
        except BusError as exc:
            if exc.dbus_name != "org.freedesktop.systemd1.NoSuchUnit":
                raise
        agent = self._agents.get(name)
        if agent is not None and agent.popen is not None:
            await agent.wait()

    async def _kill_unit(self, unit: str, sig: int) -> None:
        await self._bus.call("KillUnit", "ssi", [unit, "all", int(sig)])

    async def kill(self, name: str, signal: int = _signal.SIGTERM) -> None:
        """Send ``signal`` to every process of the agent's scope.

        Raises:
            AgentNotFound, BusError, SystemdUnavailable.
        """
        self._check_open()
        await self._kill_unit(await self._resolve(name), signal)

    async def freeze(self, name: str) -> None:
        """Freeze every process of the agent (cgroup freezer; systemd 246+)."""
        self._check_open()
        await self._bus.call("FreezeUnit", "s", [await self._resolve(name)])

    async def thaw(self, name: str) -> None:
        """Thaw a frozen agent."""
        self._check_open()
        await self._bus.call("ThawUnit", "s", [await self._resolve(name)])

    async def agents(self) -> list[Agent]:
        """The fleet's running agents, in launch order.

        One ListUnitsByPatterns call: agents of this fleet started by other
        processes are included (without a Popen), and agents whose scope has
        ended are left out.
        """
        self._check_open()
        live: dict[str, str] = {}
        for unit, desc, *_ in await self._list_units():
            parsed = _names.parse_description(desc)
            if parsed is not None and parsed[0] == self.name:
                live[parsed[1]] = str(unit)
        out = [a for a in self._agents.values() if live.get(a.name) == a.unit]
        for name, unit in live.items():
            if name not in self._agents or self._agents[name].unit != unit:
                pid = await self._main_pid(unit)
                out.append(Agent(self, name, unit, pid, None))
        return out

    async def _main_pid(self, unit: str) -> int:
        # A scope has no MainPID: its oldest (lowest-numbered) process stands in.
        (procs,) = await self._bus.call("GetUnitProcesses", "s", [unit])
        return int(min((p[1] for p in procs), default=0))


async def _slice_limits(bus: SystemdBus, slice: str) -> dict[str, int | None]:
    path = await bus.unit_path(slice)
    props = await bus.get_all(path, _SLICE_IFACE)
    return {k: (None if props.get(k, INFINITY) == INFINITY else props[k]) for k in _LIMITS}


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
        root = CGROUP_ROOT
        if bus.manager == "user":
            uid = os.getuid()
            root = CGROUP_ROOT / f"user.slice/user-{uid}.slice/user@{uid}.service"
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
