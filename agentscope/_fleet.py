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
import logging
import os
import signal as _signal
import subprocess
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, ParamSpec, TypeVar

from . import _claim, _fdlimit, _names, _numbers, _scope, _scopeprops, _tmux
from ._agent import Agent
from ._bus import SystemdBus
from ._callrun import Call, start_call
from ._errors import (
    AgentExists,
    AgentNotFound,
    AgentscopeError,
    LaunchError,
    RegistryError,
)
from ._fleet_adopt import AdoptGlue
from ._fleet_monitor import MonitorGlue
from ._fleet_reconcile import ReconcileGlue
from ._fleet_recovery import RecoveryGlue
from ._fleet_registry import RegistryGlue
from ._fleet_tmux import TmuxChild, TmuxGlue
from ._launchargs import check_argv, check_memory_max
from ._monitor import Monitor
from ._proc import exec_comm, read_stat
from ._reaper import DEFAULT_REAP_AFTER, ReapGlue
from ._registry import (
    InvalidTransition,
    Registry,
    default_registry_path,
    in_flight,
)
from ._scopefiles import (
    cgroup_present,
    raise_own_oom_score_adj,
    read_figures,
)
from ._spawn import GatedChild, spawn_gated
from ._systemd import SLICE_IFACE, Capabilities, Scopes, probe

__all__ = ["Agent", "AsyncFleet", "Capabilities", "probe"]

log = logging.getLogger("agentscope")
T = TypeVar("T")
P = ParamSpec("P")

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
Stdio = int | IO[Any] | None


class AsyncFleet(
    AdoptGlue, MonitorGlue, ReconcileGlue, RecoveryGlue, RegistryGlue, TmuxGlue, ReapGlue
):
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
        InvalidConfig: a number out of its range (``agent_oom_score_adj`` and
            ``manager_oom_score_adj`` -1000..1000, ``admission_wait``
            0..86400 s), before anything is created.
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
        _bus: SystemdBus | None = None,
        admission_wait: float = 0.0,
    ) -> None:
        if policy not in ("adopt", "stop"):
            raise AgentscopeError(f"policy must be 'adopt' or 'stop', not {policy!r}")
        # Every number checked here, before any bus or registry exists: a bad
        # oom_score_adj used to fail only in the launch gate, after the scope.
        self.admission_wait = _numbers.real(
            "admission_wait", admission_wait, low=0, high=86400, allowed="from 0 to 86400 (seconds)"
        )
        adj = "an oom_score_adj from -1000 to 1000 (proc(5))"
        agent_oom_score_adj = _numbers.whole(
            "agent_oom_score_adj", agent_oom_score_adj, low=-1000, high=1000, allowed=adj
        )
        if manager_oom_score_adj is not None:
            manager_oom_score_adj = _numbers.whole(
                "manager_oom_score_adj",
                manager_oom_score_adj,
                low=-1000,
                high=1000,
                allowed=f"{adj}, or None",
            )
        self.name = _names.validate_name("fleet", name)
        self.slice = _names.validate_slice(slice)
        # _bus is the tests' seam (tests/fakesystemd.py): a SystemdBus that
        # answers for the manager, over a cgroup tree at its cgroup_root.
        self._bus = _bus if _bus is not None else SystemdBus(manager, env=env)
        self.manager = self._bus.manager
        self._scopes = Scopes(self._bus, self.name, self.slice)
        self.agent_oom_score_adj = agent_oom_score_adj
        self.manager_oom_score_adj = manager_oom_score_adj
        self._agents: dict[str, Agent] = {}
        self._slice_checked = False
        self._slice_lock = asyncio.Lock()
        self._closed = False
        self.policy = policy
        self.registry_path = Path(
            registry if registry is not None else default_registry_path(self.manager)
        )
        self._registry: Registry | None = None
        self._slice_cgroup: Path | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unit_names: dict[str, str] = {}
        # Units whose name starts like ours but that belong to another fleet.
        self._foreign: set[str] = set()
        # Each launch in flight holds a thread inside Popen until its exec; a
        # few at a time keep the GIL (and the event loop) free for the rest.
        self._spawn_slots = asyncio.Semaphore(max(4, 2 * (os.cpu_count() or 1)))
        self._monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()
        self._init_recovery()
        # tmux agents: their units, and the fleet's server on its private socket.
        self._terminals: dict[str, str] = {}
        self._tmux = _tmux.TmuxServer(
            self.name,
            Path(tmux_dir)
            if tmux_dir is not None
            else _tmux.socket_dir(_tmux.runtime_dir(self.manager, env), self.name),
        )
        self._tmux_lock = asyncio.Lock()
        # Lingering agents' reaps due while this fleet is open (_reaper.py).
        self._reap_timers: dict[str, asyncio.TimerHandle] = {}
        # unit -> time.monotonic() when this fleet first saw it lingering (_reaper).
        self._linger_seen: dict[str, float] = {}
        self._last_sweep = 0.0

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
                raise_own_oom_score_adj(self.manager_oom_score_adj)
            self._registry = await asyncio.to_thread(Registry, self.registry_path)
            await self._load_terminals()
            await self._reconcile()
            await self._recover_oom()  # kills while no monitor ran, recorded once
        except BaseException:
            await self.aclose()  # a fleet that failed to open holds nothing open
            raise

    async def aclose(self) -> None:
        """Close the connection and the registry. Agents keep running."""
        self._closed = True
        self._cancel_reaps()  # due ones are done by the next open or monitor
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        for agent in self._agents.values():
            agent._unwatch()  # its pidfd: one per agent for the life of the process otherwise
        self._bus.close()
        if self._registry is not None:
            await asyncio.to_thread(self._registry.close)
            self._registry = None

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
        registry = self._registry
        try:
            if await self._main_exited(agent.unit, agent.pid, status):
                agent.state = "lingering"  # its scope holds processes: see _reaper
                return
        except (RegistryError, OSError) as exc:
            log.warning("could not look for leftovers of %s: %s", agent.name, exc)
        agent.state = "exited"

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
            cg = await self._bus.get_property(path, SLICE_IFACE, "ControlGroup")
            if not cg:  # not realized yet: where systemd will put it
                # Not cached: the real path is known once the slice is realized.
                return self._expected_slice_cgroup()
            else:
                self._slice_cgroup = self._bus.cgroup_root / str(cg).lstrip("/")
        return self._slice_cgroup

    def _expected_slice_cgroup(self) -> Path:
        """Where the manager puts the agents slice: dashes in its name are the hierarchy."""
        root = str(self._bus.cgroup_root)
        return Path(_scope.slice_cgroup(self.manager, self.slice, root=root))

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
        tasks_max: int | None = None,
        cpu_weight: int | None = None,
        io_weight: int | None = None,
        properties: Mapping[str, str | int] | None = None,
        reap_after: float | str = DEFAULT_REAP_AFTER,
        _streams: bool = True,
    ) -> Agent:
        """Start ``argv`` as agent ``name`` in a new scope; return once it exec'd.

        ``stdin``/``stdout``/``stderr`` take what ``subprocess`` takes (None,
        ``DEVNULL``, ``PIPE``, a file or an fd). ``memory_max`` (bytes) caps
        this agent's scope only (with no swap); the slice itself never gets a
        limit. ``tasks_max`` (TasksMax: processes and threads), ``cpu_weight``
        and ``io_weight`` (CPUWeight, IOWeight: 1-10000, systemd's default
        100) and ``properties`` (more systemd properties by name, from the
        vetted list ``_scopeprops.PROPERTIES``: ``{"CPUQuota": "200%"}``)
        control its scope too; what systemd dropped or changed, or the
        kernel does not enforce, is logged, recorded (a
        ``properties_not_applied`` event) and left in
        :attr:`Agent.property_issues`. ``reap_after`` is how many seconds
        the processes it leaves in its scope when its main process ends
        may run on before they are stopped (``"keep"``: never; docs/python-api.md).
        ``terminal="tmux"`` runs the agent in a window named ``name``
        of the fleet's tmux session (see :meth:`attach`, :meth:`logs`,
        :meth:`send`); its stdio is the pane, so the stdio arguments must
        stay None.

        Raises:
            InvalidConfig: a resource control or ``reap_after`` out of range,
                or a property not on the list (nothing was started).
            InvalidName, LaunchError, AgentExists, BusError, SystemdUnavailable,
            HostUnderPressure (the guard sees the host short: nothing was started),
            TmuxError (tmux missing, its directory not writable, the window
            name taken: nothing was started).
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        cwd_s = os.fspath(cwd) if cwd is not None else None
        # PATH lookups and stat()s: off the loop.
        await asyncio.to_thread(check_argv, argv, env, cwd_s)
        check_memory_max(memory_max)
        controls = _scopeprops.build(
            memory_max=memory_max,
            tasks_max=tasks_max,
            cpu_weight=cpu_weight,
            io_weight=io_weight,
            properties=properties,
        )
        grace = _scopeprops.parse_reap_after(reap_after)
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
            popen, pid, issues = await self._spawn_in_scope(
                unit, name, argv, cwd_s, env, stdin, stdout, stderr, controls, terminal, grace
            )
        agent = Agent(self, name, unit, pid, popen)
        agent.argv = list(argv)
        agent.terminal = terminal
        agent.reap_after = grace
        agent.property_issues = issues
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
        if issues:
            await self._event(name, "properties_not_applied", unit=unit, issues=issues)
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
        controls: dict[str, tuple[str, Any]],
        terminal: str | None = None,
        reap_after: float | None = DEFAULT_REAP_AFTER,
    ) -> tuple[subprocess.Popen[bytes] | None, int, list[dict[str, Any]]]:
        """Fork the gated child (or open its tmux pane), record it, make its scope, let it exec.

        Returns the Popen (None for a tmux pane, the tmux server's child),
        the PID and what systemd did not take of ``controls``.
        """
        # This launch's own reference: cleanup must work even if the fleet is
        # closed meanwhile (a gather of launches cancelled at shutdown).
        registry = self._registry
        assert registry is not None
        child: GatedChild | TmuxChild
        # Each agent keeps a pidfd here: past the soft fd limit, raise it (_fdlimit).
        _fdlimit.make_room()
        for attempt in range(2):
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
                        into_leaf=True,  # delegated: into the scope's agent leaf (#26)
                    )
                break
            except OSError as exc:
                if not _fdlimit.out_of_descriptors(exc):
                    raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
                # Descriptors nobody counted fill the table: raise the limit and
                # try once more (nothing was started), else say what to do.
                if attempt or not _fdlimit.make_room(force=True):
                    raise _fdlimit.no_room(argv[0], exc) from exc
        recorded = False
        try:
            await self._record_launch(registry, name, unit, child.pid, argv, cwd, reap_after)
            recorded = True
            issues = await self._scopes.start_scope(unit, name, [child.pid], controls)
        except BaseException as exc:
            await child.abort()
            if recorded:
                try:
                    await asyncio.to_thread(registry.delete, unit)
                except RegistryError as err:  # closed meanwhile: reconciliation closes the row
                    log.debug("could not forget %s: %s", unit, err)
            if _fdlimit.out_of_descriptors(exc):  # the pidfd systemd was to get
                raise _fdlimit.no_room(argv[0], exc) from exc
            raise
        try:
            popen = await child.release()
        except (OSError, LaunchError) as exc:
            # The exec failed inside the scope: the scope ends with its only process.
            await self._db(registry.set_state, unit, "failed")
            await self._event(name, "failed", unit=unit, error=str(exc))
            raise LaunchError(f"cannot exec {argv[0]!r}: {exc}") from exc
        return popen, child.pid, issues

    async def _record_launch(
        self,
        registry: Registry,
        name: str,
        unit: str,
        pid: int,
        argv: Sequence[str],
        cwd: str | None,
        reap_after: float | None,
    ) -> None:
        """Record the launch (state starting) before its scope exists.

        The name is claimed by the one rule of every launch path
        (:func:`._claim.claim`): another launch of the same name, in this
        process or another, fails here with nothing started; a stale row of
        the name (its scope gone, its launcher not at work) is closed, and the
        launch recorded after all.
        """
        stat = await asyncio.to_thread(read_stat, pid)
        await self._db(
            _claim.claim,
            registry,
            self.name,
            name,
            unit,
            pid,
            stat.start_time if stat else 0,
            list(argv),
            cwd or os.getcwd(),
            slice_dir=await self.slice_cgroup(),
            close=self._close_row,
            reap_after=reap_after,
        )

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
        slice_dir = await self.slice_cgroup()
        held = await self._db(
            _claim.holder, self._registry, self.name, name, slice_dir, self._close_row
        )
        if held is not None:
            raise AgentExists(self.name, name, held.unit)

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
            await self._scopes.clear_limits(stale)
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
        return await self._scopes.slice_limits()

    # -- control ----------------------------------------------------------

    async def _resolve(self, name: str) -> str:
        """The unit of a running agent of this fleet, known here or in systemd."""
        _names.validate_name("agent", name)
        agent = self._agents.get(name)
        if agent is not None and agent.state not in _CLOSED and agent.alive():
            return agent.unit
        for unit, desc, *_ in await self._scopes.list_units(name):
            if _names.parse_description(desc) == (self.name, name):
                return str(unit)
        raise AgentNotFound(self.name, name)

    async def call(
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
    ) -> Call:
        """Run ``argv`` as a tool call inside ``agent``: a cgroup of its own in its scope.

        The call gets ``memory_max`` (bytes or a size such as ``"2G"``, no
        swap), ``tasks_max`` and ``memory.oom.group`` 1: past its cap it is
        killed as a whole, never the agent. Returns a :class:`Call` (``pid``,
        ``wait()``) once the command has exec'd inside it (docs/calls.md).

        Raises:
            AgentNotFound; InvalidConfig, InvalidName (nothing made);
            LaunchError: calls are not isolated in that agent (and why), or
                the command could not start.
        """
        self._check_open()
        unit = await self._resolve(agent)

        async def attach(sub: str, pids: Sequence[int]) -> None:
            await self._bus.call("AttachProcessesToUnit", "ssau", [unit, sub, list(pids)])

        return await start_call(
            agent,
            unit,
            await self.slice_cgroup(),
            argv,
            attach,
            memory_max=memory_max,
            tasks_max=tasks_max,
            name=name,
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            oom_score_adj=self.agent_oom_score_adj,
        )

    async def stop(self, name: str, timeout: float = 10) -> None:
        """Stop an agent: SIGTERM to all its processes, SIGKILL after ``timeout``.

        Returns once the scope's stop job is done.

        Raises:
            AgentNotFound, BusError, SystemdUnavailable, AgentscopeError (the
            stop job failed or was cancelled: the agent may still run).
        """
        timeout = _numbers.real("timeout", timeout, low=0, high=86400)
        self._check_open()
        unit = await self._resolve(name)
        result = await self._scopes.stop_unit(unit, timeout)
        if result != "done":
            # Not stopped: its row stays as it is, and says what was tried.
            await self._event(name, "stop_failed", unit=unit, result=result)
            user = "--user " if self.manager == "user" else ""
            raise AgentscopeError(
                f"the stop job of {unit} ended {result!r}: agent {name!r} may still run; "
                f"see systemctl {user}status {unit}, then stop it again"
            )
        agent = self._agents.get(name)
        if agent is not None and (agent.popen is not None or agent.terminal is not None):
            await agent.wait()  # its exit watcher records the exit
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        assert self._registry is not None
        rec = await self._db(self._registry.by_unit, unit)
        if rec is not None and not rec.closed:  # not seen exiting here, or lingering
            await self._db(self._registry.set_state, unit, "exited", exit_status=rec.exit_status)
        await self._event(name, "stopped", unit=unit)

    async def kill(self, name: str, signal: int = _signal.SIGTERM) -> None:
        """Send ``signal`` to every process of the agent's scope.

        Raises:
            InvalidConfig (not a signal number, 1-64), AgentNotFound, BusError,
            SystemdUnavailable.
        """
        signal = _numbers.whole(
            "signal", int(signal) if isinstance(signal, _signal.Signals) else signal, low=1, high=64
        )
        self._check_open()
        unit = await self._resolve(name)
        await self._scopes.kill_unit(unit, signal)
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
            ended = agent.state in ("exited", "lingering")
            if agent.popen is not None and not ended and not agent.alive():
                await self._record_exit(agent, agent.popen.returncode)
        rows = await self._db(self._registry.agents, self.name, include_closed=all)
        # Main processes that ended unseen (exec'd, adopted, another
        # manager's): their leftovers linger, or are reaped when due.
        swept = await self._sweep([r for r in rows if r.unit in live])
        rows = [swept[r.unit][0] if r.unit in swept else r for r in rows]
        # A lingering tmux agent's window is gone with its main process:
        # its leftovers are the reaper's (reap_after), not killed here.
        windowed = [
            r
            for r in rows
            if r.unit in self._terminals
            and r.unit in live
            and r.state not in _CLOSED
            and r.lingering is None
        ]
        if windowed:
            closed = await self._close_windowless(windowed)
            rows = [closed.get(r.unit, r) for r in rows]
        slice_dir = await self.slice_cgroup()
        unseen = [r for r in rows if not r.closed and r.unit not in live]
        # Not listed, yet not gone: a launch in flight, or a scope the listing
        # missed (its cgroup is there): left to the next listing.
        flying = await asyncio.to_thread(
            lambda: (
                {r.unit for r in unseen if in_flight(r)}
                | cgroup_present(slice_dir, (r.unit for r in unseen))
            )
        )
        out: list[Agent] = []
        for rec in rows:
            if not rec.closed and rec.unit not in live:
                if rec.unit in flying:
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
                if rec.lingering is not None and agent.state == "running":
                    agent.state = "lingering"
                    agent.leftovers = swept[rec.unit][1] if rec.unit in swept else 0
            out.append(agent)
        figures = await asyncio.to_thread(
            read_figures, slice_dir, [a.unit for a in out if a.state not in _CLOSED]
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


_CLOSED = ("exited", "failed", "lost")
