"""The errors agentscope raises.

Every error is an :class:`AgentscopeError`. Subclasses exist only where a
caller can act differently on them::

    AgentscopeError
    ├── InvalidName          a fleet or agent name that systemd or we refuse
    ├── InvalidConfig        a setting out of its range (names the field and the range)
    ├── LaunchError          the agent could not be started (binary, cwd, env, exec)
    │   └── HostUnderPressure  refused: the guard holds the host short of memory
    ├── AgentNotFound        no running agent of that name in this fleet
    ├── AgentExists          an agent of that name is already running
    ├── SystemdUnavailable   no systemd manager reachable on the bus we tried
    ├── BusError             systemd refused a D-Bus call (keeps its error name)
    └── RegistryError        the registry file cannot be used (names the file)
        └── RegistryCorrupt  not a database, or a damaged one: move it aside
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

__all__ = [
    "AgentExists",
    "AgentNotFound",
    "AgentscopeError",
    "BusError",
    "HostUnderPressure",
    "InvalidConfig",
    "InvalidName",
    "LaunchError",
    "RegistryCorrupt",
    "RegistryError",
    "SystemdUnavailable",
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
            from ._container import not_systemd_note  # PID 1 not systemd: say that, not a bus

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
