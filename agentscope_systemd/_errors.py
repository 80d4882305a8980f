"""The errors agentscope raises: every public one is defined here.

Every error is an :class:`AgentscopeError`. Subclasses exist only where a
caller can act differently on them (tests/test_api.py checks this drawing
against the classes)::

    AgentscopeError
    ├── InvalidName              a fleet or agent name that systemd or we refuse
    ├── InvalidConfig            an argument or setting out of its range (names it and the range)
    ├── LaunchError              the agent could not be started (argv, binary, cwd, env, exec)
    │   ├── HostUnderPressure    not now: the guard holds the host short of memory
    │   └── TmuxError            a tmux agent could not be started or reached
    │       ├── TmuxUnavailable  tmux, libtmux or bash is not installed
    │       └── WindowExists     a window of that name is open in the fleet's session
    ├── AgentNotFound            no running agent of that name in this fleet
    ├── AgentExists              an agent of that name is already running
    ├── SystemdUnavailable       no systemd manager reachable on the bus we tried
    │   ├── SystemdTimeout       one was reached but did not answer in time
    │   └── ModeUnavailable      a manager mode asked for cannot work here (#27)
    ├── ModeUnsupported          the fleet's manager mode cannot do that (a cap, a freeze)
    ├── BusError                 systemd refused a D-Bus call (keeps its error name)
    ├── RegistryError            the registry file cannot be used (names the file)
    │   ├── RegistryCorrupt      not a database, or a damaged one: move it aside
    │   ├── UnitNotFound         no row of the registry has that unit
    │   └── InvalidTransition    a state change the agents' lifecycle does not allow
    └── InstallError             install or uninstall cannot go ahead; nothing changed
        └── UntrustedExecutable  root would run a file another user could change

Nothing else is raised on purpose but the standard ``OSError`` of a file a
caller named. The command line turns each into an exit code in one place
(``agentscope_systemd/_cli/_errors.py``): a ``HostUnderPressure`` or a ``TmuxError`` is a
condition of the host, not bad input, so it exits 1 where the other
``LaunchError``s exit 2.
"""

from __future__ import annotations

import os

from ._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

__all__ = [
    "AgentExists",
    "AgentNotFound",
    "AgentscopeError",
    "BusError",
    "HostUnderPressure",
    "InstallError",
    "InvalidConfig",
    "InvalidName",
    "InvalidTransition",
    "LaunchError",
    "ModeUnavailable",
    "ModeUnsupported",
    "RegistryCorrupt",
    "RegistryError",
    "SystemdTimeout",
    "SystemdUnavailable",
    "TmuxError",
    "TmuxUnavailable",
    "UnitNotFound",
    "UntrustedExecutable",
    "WindowExists",
]


class AgentscopeError(Exception):
    """Base class of every error agentscope raises."""


class InvalidName(AgentscopeError, ValueError):
    """A fleet or agent name is not acceptable.

    Names are 1-64 characters of ``[A-Za-z0-9._-]`` and do not start with
    ``.`` or ``-``.
    """

    def __init__(
        self,
        kind: str,
        name: object,
        reason: str,
        hint: str = "use 1-64 characters of [A-Za-z0-9._-], not starting with '.' or '-'",
    ) -> None:
        self.kind = kind
        self.name = name
        self.reason = reason
        super().__init__(f"invalid {kind} name {name!r}: {reason}; {hint}")


class InvalidConfig(AgentscopeError, ValueError):
    """A setting is out of its range; ``field``, ``value`` and ``allowed`` say which and why."""

    def __init__(
        self, field: str, value: object, allowed: str, *, problem: str = "is out of range"
    ) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field} = {value!r} {problem}: it must be {allowed}")


class LaunchError(AgentscopeError):
    """The agent could not be started; nothing was left behind."""


class HostUnderPressure(LaunchError):
    """A launch was refused: the fleet's guard sees the host short of memory.

    ``mem_available_percent`` and ``swap_free_percent`` are of MemTotal and
    SwapTotal, ``psi_full_avg10`` the host's PSI memory ``full`` avg10 (None
    without PSI), ``waited`` the seconds the launch waited for it to clear.
    """

    def __init__(
        self,
        mem_available_percent: float,
        swap_free_percent: float,
        psi_full_avg10: float | None,
        waited: float,
    ) -> None:
        self.mem_available_percent = mem_available_percent
        self.swap_free_percent = swap_free_percent
        self.psi_full_avg10 = psi_full_avg10
        self.waited = waited
        psi = "no PSI" if psi_full_avg10 is None else f"PSI full avg10 {psi_full_avg10:.1f}%"
        super().__init__(
            f"the host is under memory pressure (MemAvailable {mem_available_percent:.1f}%, "
            f"SwapFree {swap_free_percent:.1f}%, {psi}; waited {waited:.1f} s): no agent "
            "was started; retry later, stop an agent, or pass a longer admission_wait"
        )


class TmuxError(LaunchError):
    """A tmux agent could not be started or reached; the message says why and what to do.

    Raised before anything exists for bad input (a window name taken, the
    socket directory not writable), so no scope or window is left behind.
    """


class TmuxUnavailable(TmuxError):
    """tmux or libtmux is not installed.

    ``apt install tmux``; ``pip install 'agentscope-systemd[tmux]'`` for libtmux.
    """


class WindowExists(TmuxError):
    """A window of that name is already open in the fleet's tmux session."""

    def __init__(self, fleet: str, name: str, window: str, socket: Path) -> None:
        self.fleet = fleet
        self.name = name
        self.window = window
        super().__init__(
            f"a tmux window named {name!r} ({window}) is already open in fleet {fleet!r}'s "
            f"session; close it (tmux -S {socket} kill-window -t {window}) or pick another "
            "agent name"
        )


class AgentNotFound(AgentscopeError, LookupError):
    """No agent of that name is known to this fleet."""

    def __init__(self, fleet: str, name: str) -> None:
        self.fleet = fleet
        self.name = name
        super().__init__(
            f"no agent {name!r} in fleet {fleet!r}; list the fleet's agents to see its names"
        )


class AgentExists(AgentscopeError):
    """An agent of that name is already running in this fleet."""

    def __init__(self, fleet: str, name: str, unit: str) -> None:
        self.fleet = fleet
        self.name = name
        self.unit = unit
        super().__init__(
            f"agent {name!r} is already running in fleet {fleet!r} as {unit}; "
            "stop it first or pick another name"
        )


class SystemdUnavailable(AgentscopeError):
    """No systemd manager could be reached.

    ``bus`` names the bus address tried and ``reason`` says why it failed.
    """

    def __init__(self, manager: str, bus: str, reason: str, *, hint: str | None = None) -> None:
        self.manager = manager
        self.bus = bus
        self.reason = reason
        if hint is None:
            from ._kernel._container import (
                not_systemd_note,  # PID 1 not systemd: say that, not a bus
            )

            note = not_systemd_note()
            if note is not None:
                super().__init__(f"cannot reach the {manager} systemd manager: {note} ({reason})")
                return
        if hint is None:
            hint = (
                "is this a systemd host with the system bus running?"
                if manager == "system"
                else "is a user manager running (loginctl enable-linger, or log in) and "
                "XDG_RUNTIME_DIR set?"
            )
        super().__init__(f"cannot reach the {manager} systemd manager at {bus}: {reason}; {hint}")


class SystemdTimeout(SystemdUnavailable):
    """A systemd manager that was reached did not answer in time.

    It is there but busy (a daemon-reload, thousands of units starting or
    stopping) or hung: retrying later may work. ``waiting`` says what was
    waited for.
    """

    def __init__(self, manager: str, bus: str, waiting: str, seconds: float) -> None:
        self.waiting = waiting
        self.seconds = seconds
        status = "systemctl status" if manager == "system" else "systemctl --user status"
        super().__init__(
            manager,
            bus,
            f"no {waiting} within {seconds:.0f}s",
            hint=f"the manager is busy or hung; retry later, and see `{status}`",
        )


class ModeUnavailable(SystemdUnavailable):
    """A manager mode asked for by name (``--manager cgroup``) cannot work here.

    ``mode`` names it, ``reason`` says why and ``enable`` what would make it
    work. Raised when the fleet opens, before anything is created; a
    :class:`SystemdUnavailable` so that whoever handles "no manager" handles it.
    """

    def __init__(self, mode: str, reason: str, enable: str) -> None:
        self.mode = mode
        self.enable = enable
        AgentscopeError.__init__(
            self, f"the {mode} manager mode cannot work here: {reason}; {enable}"
        )
        self.manager = mode
        self.bus = ""
        self.reason = reason


class ModeUnsupported(AgentscopeError):
    """The fleet's manager mode cannot do what was asked (a per-agent cap, a freeze).

    ``mode`` names the mode, ``what`` what was refused and ``enable`` what
    would make it possible. Nothing was changed.
    """

    def __init__(self, mode: str, what: str, enable: str) -> None:
        self.mode = mode
        self.what = what
        self.enable = enable
        super().__init__(f"{what} is not possible in the {mode} manager mode; {enable}")


class BusError(AgentscopeError):
    """systemd refused a D-Bus call.

    ``method`` is the call, ``dbus_name`` systemd's error name (for example
    ``org.freedesktop.systemd1.NoSuchUnit``) and ``message`` its text.
    """

    def __init__(self, method: str, dbus_name: str, message: str) -> None:
        self.method = method
        self.dbus_name = dbus_name
        self.message = message
        super().__init__(f"systemd refused {method}: {message} ({dbus_name})")

    @classmethod
    def from_reply(cls, method: str, error_name: str | None, body: Sequence[object]) -> BusError:
        """The error of a D-Bus error reply: the one mapping, for both bus clients.

        Its text is the reply's first argument when that is a string.
        """
        text = str(body[0]) if body and isinstance(body[0], str) else ""
        return cls(method, error_name or "unknown", text)


class RegistryError(AgentscopeError):
    """The registry file cannot be used; ``path`` names it.

    The message says what went wrong and what to do next.
    """

    def __init__(self, path: os.PathLike[str] | str, message: str) -> None:
        from pathlib import Path  # here: the exec fast path imports this module

        self.path: Path = Path(path)
        self.message = message
        super().__init__(message)


class RegistryCorrupt(RegistryError):
    """The file is not an SQLite database, or a damaged one.

    Nothing in it can be trusted; move it aside and agentscope rebuilds the
    registry from the scopes systemd still runs.
    """

    def __init__(self, path: os.PathLike[str] | str, reason: str) -> None:
        import shlex

        self.reason = reason
        quoted = shlex.quote(str(path))
        super().__init__(
            path,
            f"the agentscope registry {path} is unreadable ({reason}); move it aside: "
            f"mv {quoted} {shlex.quote(str(path) + '.corrupt')}; "
            "agentscope will rebuild it from what systemd still runs",
        )


class UnitNotFound(RegistryError, LookupError):
    """No row of the registry has that unit name."""

    def __init__(self, path: os.PathLike[str] | str, unit: str) -> None:
        self.unit = unit
        super().__init__(
            path, f"no agent with unit {unit!r} in the registry {path}; list agents to see theirs"
        )


class InvalidTransition(RegistryError):
    """A state change the lifecycle does not allow, e.g. reopening a closed row.

    ``current`` is the state stored, ``requested`` the one refused, ``closed``
    whether ``current`` is one a row ends in (``_records.CLOSED_STATES``). The
    row is left as it was; re-read it to see who closed it and why.
    """

    def __init__(
        self,
        path: os.PathLike[str] | str,
        unit: str,
        current: str,
        requested: str,
        *,
        closed: bool = False,
    ) -> None:
        self.unit = unit
        self.current = current
        self.requested = requested
        why = "a closed agent is not reopened so" if closed else "not allowed"
        super().__init__(
            path, f"cannot move {unit} from {current!r} to {requested!r}: {why}; re-read the agent"
        )


class InstallError(AgentscopeError):
    """Install or uninstall cannot go ahead; nothing was changed.

    ``paths`` are the files in the way, ``reason`` why.
    """

    def __init__(self, reason: str, paths: list[str], hint: str) -> None:
        self.reason = reason
        self.paths = paths
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.reason}: {', '.join(self.paths)}; {self.hint}"


class UntrustedExecutable(InstallError):
    """A system install would make root run a file another user could change; nothing was written.

    ``paths`` say which file and why (its owner, a writable directory on its
    way, its ``#!`` interpreter's).
    """

    def __init__(self, paths: list[str]) -> None:
        super().__init__(
            "install --system would make root run a file that a user other than root could change",
            paths,
            "install agentscope where only root can write (as root: python3 -m venv "
            "/opt/agentscope && /opt/agentscope/bin/pip install agentscope-systemd) and "
            "run that one's `agentscope install --system`, or use install --user for your "
            "own manager",
        )
