"""The asyncio core: a fleet of agents, each in its own transient scope.

:class:`AsyncFleet` holds its parts, each an object that owns its state:
the manager of its scopes (:mod:`._manager`, systemd's in :mod:`._systemd`),
its registry adapter and roster (:mod:`._fleet_registry`), its listing and
the exits it sees (:mod:`._fleet_listing`), the control of an agent by name
(:mod:`._fleet_control`), the reaper
(:mod:`._reaper`), the OOM recovery (:mod:`._fleet_recovery`), the terminals
(:mod:`._fleet_tmux`), the monitors (:mod:`._fleet_monitor`), the
reconciler (:mod:`._fleet_reconcile`), the launcher (:mod:`._fleet_launch`)
and the adopter (:mod:`._fleet_adopt`). Each public method checks its
arguments here, before anything exists, and delegates to one part.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _names, _numbers
from .._calls import _calls, _callshell
from .._errors import (
    AgentscopeError,
    InvalidConfig,
    LaunchError,
)
from .._managers import _scopeprops
from .._managers._bus import SystemdBus
from .._managers._manager import ScopeManager
from .._managers._modes import ModeChoice, check_forced, choose_mode, parse_manager
from .._managers._scopefiles import raise_own_oom_score_adj
from .._managers._systemd import Capabilities, SystemdManager, probe
from .._registry._registry import EventRecord, default_registry_path
from . import _tmux
from ._agent import Agent
from ._fleet_adopt import Adopter
from ._fleet_control import Control
from ._fleet_launch import LaunchArgs, Launcher, Stdio
from ._fleet_listing import Listing
from ._fleet_monitor import Monitors
from ._fleet_reconcile import Reconciler
from ._fleet_recovery import OomRecovery
from ._fleet_registry import FleetCore, FleetRegistry, Roster
from ._fleet_tmux import Terminals
from ._launchargs import check_argv
from ._reaper import DEFAULT_REAP_AFTER, Reaper

# A tool call's, the monitor's and the report's modules are imported where they
# are used: opening a fleet to list it (``agentscope ls``) needs none of them.
if TYPE_CHECKING:
    from .._calls._callrun import Call
    from .._guard._guardpolicy import GuardConfig
    from .._monitor._monitor import Monitor
    from .._monitor._report import MemoryReport

__all__ = ["Agent", "AsyncFleet", "Capabilities", "probe"]

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


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
        InvalidConfig: a number out of its range (``agent_oom_score_adj`` and
            ``manager_oom_score_adj`` -1000..1000, ``admission_wait``
            0..86400 s) or a ``policy`` not ``adopt`` nor ``stop``, before
            anything is created.
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
        _manager: ScopeManager | None = None,
        _streams: bool = True,
    ) -> None:
        if policy not in ("adopt", "stop"):
            raise InvalidConfig("policy", policy, "'adopt' or 'stop'", problem="is not allowed")
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
        # Everything asked of systemd goes through this one object (_manager.py).
        # The tests' seams: _bus, a SystemdBus that answers for the manager
        # over a cgroup tree at its cgroup_root (tests/fakesystemd.py), or
        # _manager, another implementation of the interface.
        # The mode (#27, _modes.py): systemd, a delegated cgroup, or process
        # trees; chosen here without side effects, refused at open if forced
        # where it cannot work.
        if _manager is not None or _bus is not None:
            mode, flavour = parse_manager(manager)
            mode = "systemd" if mode == "auto" else mode
            self._mode = ModeChoice(mode, flavour, "the manager given")
        else:
            self._mode = choose_mode(manager, env=env)
        if _manager is None:
            _manager = self._make_manager(_bus, env, tmux_dir)
        self._manager: ScopeManager = _manager
        self.manager = _manager.manager
        self.agent_oom_score_adj = agent_oom_score_adj
        self.manager_oom_score_adj = manager_oom_score_adj
        self._closed = False
        # Whether a launched agent's pipes become asyncio streams; the
        # blocking facade reads the plain pipes instead.
        self._streams = _streams
        self.policy = policy
        self.registry_path = Path(
            registry if registry is not None else default_registry_path(self.manager)
        )
        # The parts the fleet holds: its agents in memory, its registry.
        self._roster = Roster(self.name, self._note_exit)
        self._store = FleetRegistry(self.name, self.registry_path, self._roster)
        self._tasks: set[asyncio.Task[Any]] = set()
        core = FleetCore(self.name, self._manager, self._store, self._roster, self._tasks)
        self._recovery = OomRecovery(core)
        self._reaper = Reaper(core)
        self._control = Control(core)
        # tmux agents: the fleet's server on its private socket.
        tmux = _tmux.TmuxServer(
            self.name,
            Path(tmux_dir)
            if tmux_dir is not None
            else _tmux.socket_dir(_tmux.runtime_dir(self.manager, env), self.name),
        )
        self._terminals = Terminals(
            core,
            tmux,
            self._reaper,
            self._control.resolve,
            agent_oom_score_adj=agent_oom_score_adj,
            manager_oom_score_adj=manager_oom_score_adj,
        )
        self._reconciler = Reconciler(core, self._reaper)
        self._monitors = Monitors(core, self._recovery, self._reaper, self._terminals)
        self._launcher = Launcher(
            core, self._monitors, self._terminals, agent_oom_score_adj=agent_oom_score_adj
        )
        self._adopter = Adopter(
            core,
            self._monitors,
            self._launcher,
            agent_oom_score_adj=agent_oom_score_adj,
        )
        self._listing = Listing(
            core, self._reconciler, self._reaper, self._terminals, self._monitors
        )

    def _make_manager(
        self,
        bus: SystemdBus | None,
        env: Mapping[str, str] | None,
        tmux_dir: str | os.PathLike[str] | None,
    ) -> ScopeManager:
        """The manager of the chosen mode (systemd's, or the process trees')."""
        flavour = self._mode.flavour
        if self._mode.mode == "systemd":
            return SystemdManager(
                bus if bus is not None else SystemdBus(flavour, env=env), self.name, self.slice
            )
        # The other modes' managers are imported for their mode only: a fleet
        # on systemd (every ``agentscope ls`` there) never loads them.
        if self._mode.mode == "cgroup":
            from .._managers._cgroupmode import CgroupManager

            return CgroupManager(flavour, self.name, self.slice, _tmux.runtime_dir(flavour, env))
        from .._managers._procscopes import ProcessManager

        return ProcessManager(flavour, self.name, self.slice, _tmux.runtime_dir(flavour, env))

    @property
    def mode(self) -> str:
        """The manager mode the fleet runs in: ``systemd``, ``cgroup`` or ``process``."""
        return self._mode.mode

    @property
    def mode_reason(self) -> str:
        """Why that mode: asked for, or what ``auto`` found here."""
        return self._mode.reason

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
        check_forced(self._mode)
        await self._manager.connect()
        try:
            if self.manager_oom_score_adj is not None:
                raise_own_oom_score_adj(self.manager_oom_score_adj)
            await self._store.open()
            await self._terminals.load()
            await self._reconciler.reconcile(self.policy)
            await self._recovery.recover()  # kills while no monitor ran, recorded once
        except BaseException:
            await self.aclose()  # a fleet that failed to open holds nothing open
            raise

    async def aclose(self) -> None:
        """Close the connection and the registry. Agents keep running."""
        self._closed = True
        self._reaper.close()  # due ones are done by the next open or monitor
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        for agent in self._roster.agents.values():
            agent._unwatch()  # its pidfd: one per agent for the life of the process otherwise
        self._manager.close()
        await self._store.close()

    def _note_exit(self, agent: Agent, status: int | None) -> None:
        """A launched child was reaped: the roster's callback (see :class:`Listing`)."""
        self._listing.note_exit(agent, status)

    async def events(
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
        """The fleet's recorded events, oldest first (``after_id`` for following,
        ``last`` for the newest few); see :meth:`Registry.events`."""
        self._check_open()
        return await self._store.call(
            self._store.open_registry.events,
            self.name,
            agent=agent,
            since=since,
            until=until,
            kind=kind,
            after_id=after_id,
            limit=limit,
            last=last,
        )

    async def gc(self, retention_seconds: float = 7 * 86400) -> int:
        """Prune this fleet's exited agents older than the retention, and their events."""
        retention_seconds = _numbers.real(
            "retention_seconds", retention_seconds, low=0, high=100 * 365.25 * 86400
        )
        self._check_open()
        return await self._store.gc(retention_seconds)

    async def slice_cgroup(self) -> Path:
        """The agents slice's cgroup directory, as systemd reports it.

        Before the slice's first scope, where systemd will put it.
        """
        return await self._manager.slice_cgroup()

    @property
    def systemd_version(self) -> str:
        """The manager's systemd version string, as it reports it ("" before open)."""
        return self._manager.version

    @property
    def bus_address(self) -> str:
        """The D-Bus address the fleet reached its manager at ("" before open)."""
        return self._manager.address

    def _check_open(self) -> None:
        if self._closed:
            raise AgentscopeError(f"fleet {self.name!r} is closed; open a new one")
        if self._store.registry is None:
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
        call_memory_max: int | str | None = None,
        call_tasks_max: int | str | None = None,
        call_shell: bool = False,
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
        stay None. ``call_memory_max`` and ``call_tasks_max`` are the caps of
        its tool calls that name none (``agentscope call`` inside it; they
        reach it as ``AGENTSCOPE_CALL_MEMORY_MAX``/``_TASKS_MAX`` in its
        environment, docs/calls.md). ``call_shell=True`` gives it a ``SHELL``
        (``agentscope-shell``) whose every ``-c`` is a tool call, its own
        shell kept in ``AGENTSCOPE_REAL_SHELL``: for agents that run their
        tools through ``$SHELL -c``.

        Raises:
            InvalidConfig: a resource control (``memory_max`` and
                ``tasks_max`` alike) or ``reap_after`` out of range, a property
                not on the list, a ``terminal`` not None nor ``"tmux"``
                (nothing was started).
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
        env = _calls.call_env(env, call_memory_max, call_tasks_max)
        if call_shell is not False:
            if call_shell is not True:
                raise InvalidConfig(
                    "call_shell", call_shell, "True or False", problem="is not allowed"
                )
            env = _callshell.call_shell_env(env)
        controls, grace = _scopeprops.scope_settings(
            memory_max, tasks_max, cpu_weight, io_weight, properties, reap_after
        )
        if terminal not in (None, "tmux"):
            raise InvalidConfig("terminal", terminal, "None or 'tmux'", problem="is not allowed")
        if terminal is not None and (stdin, stdout, stderr) != (None, None, None):
            raise LaunchError(
                "a tmux agent's stdin, stdout and stderr are its pane: leave them None "
                "(read its output with logs(), type into it with send())"
            )
        args = LaunchArgs(
            name, argv, cwd_s, env, (stdin, stdout, stderr), controls, terminal, grace
        )
        return await self._launcher.launch(
            args,
            admission_wait=self.admission_wait,
            streams=self._streams,
        )

    async def adopt(
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
    ) -> Agent:
        """Move a running process and all its descendants into a new agent scope.

        ``memory_max`` (bytes), the other resource controls and
        ``reap_after`` are as for :meth:`launch`; ``pid`` is the main process.

        Some processes are never adopted, since their whole tree would move
        into the agent's scope (its cap, its stop, its reaper): PID 1, a
        kernel thread, an ancestor of this process (the manager would move
        with it), and the main process of a systemd service. This process
        itself may be adopted: it then becomes the agent, as ``agentscope
        exec`` does before it execs its command.

        Raises:
            InvalidName, InvalidConfig (also: a process that is never
            adopted, before anything is created), AgentExists, LaunchError
            (no such process), BusError, HostUnderPressure (as for
            :meth:`launch`).
        """
        self._check_open()
        name = _names.validate_name("agent", name)
        pid = await self._adopter.adoptable(pid)
        controls, grace = _scopeprops.scope_settings(
            memory_max, tasks_max, cpu_weight, io_weight, properties, reap_after
        )
        return await self._adopter.adopt(
            pid, name, controls, grace, admission_wait=self.admission_wait
        )

    async def clear_slice_limits(self) -> dict[str, int]:
        """Clear any MemoryHigh/MemoryMax/MemorySwapMax on the agents slice, until reboot.

        A MemoryHigh there throttles every agent at once. Every launch does
        this once per fleet; returns what was cleared (empty: nothing was set).
        """
        return await self._launcher.clear_slice_limits()

    async def slice_limits(self) -> dict[str, int | None]:
        """The agents slice's MemoryHigh/MemoryMax/MemorySwapMax; None means infinity."""
        return await self._manager.slice_limits()

    # -- control ----------------------------------------------------------

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
        unit = await self._control.resolve(agent)
        if self._manager.mode == "process":
            from .._managers._procscopes import refuse_calls

            refuse_calls()  # no cgroup to make a call's in (#27)

        async def attach(sub: str, pids: Sequence[int]) -> None:
            await self._manager.attach(unit, pids, sub)

        from .._calls._callevents import calls_dir
        from .._calls._callrun import start_call

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
            events_dir=calls_dir(self._store.path),
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
        await self._control.stop(name, timeout)

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
        await self._control.kill(name, signal)

    async def freeze(self, name: str) -> None:
        """Freeze every process of the agent (cgroup freezer; systemd 246+)."""
        self._check_open()
        await self._control.freeze(name)

    async def thaw(self, name: str) -> None:
        """Thaw a frozen agent."""
        self._check_open()
        await self._control.thaw(name)

    def unit_agent(self, unit: str) -> str | None:
        """The name of this fleet's agent in ``unit``, None if it is not one (thread-safe)."""
        return self._store.unit_agent(unit)

    def monitor(
        self,
        /,  # mypy passes **options through the facade's ParamSpec only so
        interval: float = 2.0,
        top: int = 10,
        *,
        guard: bool | GuardConfig = False,
        reclaim_escaped: bool = False,
        **options: Any,
    ) -> Monitor:
        """A memory monitor for this fleet: ``async with fleet.monitor() as m: async for e in m``.

        Events (OOM kills, throttling, pressure, exits, limits found, guard
        kills) are also recorded in the registry. ``guard`` (True or a
        :class:`GuardConfig`) runs the memory guard with the monitor
        (docs/guard.md); it never kills this process or the fleet's tmux
        server, and while it sees the host short, :meth:`launch` and
        :meth:`adopt` wait ``admission_wait`` seconds, then raise
        :class:`HostUnderPressure`. An agent's descendant that lives outside
        its scope is reported once as an ``escaped`` event; with
        ``reclaim_escaped`` the monitor first moves it back into the agent's
        scope (``AttachProcessesToUnit``) and the event says whether that
        worked (docs/escapes.md). ``options`` go to :class:`Monitor`.
        """
        self._check_open()
        return self._monitors.monitor(interval, top, guard, reclaim_escaped, options)

    async def report(self, top: int = 10) -> MemoryReport:
        """A memory report now: host, PSI, every agent, the top processes with their agent."""
        top = _numbers.whole("top", top, low=0, high=10_000)
        self._check_open()
        return await self._monitors.report(top)

    async def logs(self, name: str, lines: int = 100) -> list[str]:
        """The last ``lines`` lines of a tmux agent's window (its history included).

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        lines = _numbers.whole("lines", lines, low=0, high=10_000_000)
        self._check_open()
        return await self._terminals.logs(name, lines)

    async def send(self, name: str, text: str, *, enter: bool = False) -> None:
        """Type ``text`` into a tmux agent's window, then Enter if ``enter``.

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        self._check_open()
        await self._terminals.send(name, text, enter)

    async def attach_command(self, name: str, *, read_only: bool = False) -> list[str]:
        """The command line that attaches a terminal to a tmux agent's window.

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        self._check_open()
        return await self._terminals.attach_command(name, read_only)

    async def attach(self, name: str, *, read_only: bool = False) -> int:
        """Attach this process's terminal to a tmux agent's window until it detaches.

        Returns the tmux client's exit status (non-zero without a terminal).

        Raises:
            AgentNotFound, TmuxError (not a tmux agent, or tmux failed).
        """
        self._check_open()
        return await self._terminals.attach(name, read_only)

    async def agents(self, *, all: bool = False) -> list[Agent]:
        """The fleet's agents, in launch order: running ones, or ``all`` with exited ones.

        Reads the registry and the cgroup files and reconciles states with
        systemd in one ListUnitsByPatterns call, whatever the number of
        agents; it never waits on an agent. Agents launched by other
        processes are included (without a Popen).
        """
        self._check_open()
        return await self._listing.agents(all)
