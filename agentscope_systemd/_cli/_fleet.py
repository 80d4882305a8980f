"""The fleet the command line talks to: options, the library surface it uses, one factory.

Every command reaches the library through :func:`open_fleet` (looked up on
this module at call time), so tests replace it with a fake fleet.
:class:`FleetLike` spells out the part of ``agentscope_systemd.Fleet`` the CLI relies
on. Kept free of typer and rich: the ``exec`` fast path uses it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any, Literal, Protocol, cast

from ._options import Options

__all__ = [
    "AgentLike",
    "FleetLike",
    "GuardedStream",
    "HistoryLike",
    "Options",
    "Record",
    "default_log_path",
    "log_location",
    "open_fleet",
    "open_history",
]


class Record(Protocol):
    """Anything the library hands out as plain data (events, reports)."""

    def to_dict(self) -> dict[str, Any]: ...


class GuardedStream(Iterator[Record], Protocol):
    """What ``fleet.monitor()`` gives: its events, whether its guard runs, and a
    close that ends the events after those it already has."""

    @property
    def guard_running(self) -> bool: ...

    def close(self) -> None: ...


class EventLike(Record, Protocol):
    id: int


class AgentLike(Record, Protocol):
    """An item of ``fleet.agents()``; ``to_dict()`` carries state, memory and the rest."""

    name: str
    unit: str
    pid: int

    @property
    def property_issues(self) -> list[dict[str, Any]]: ...


class HistoryLike(Protocol):
    """A fleet's recorded history: what ``events`` and ``gc`` use, no bus needed."""

    def events(
        self,
        *,
        agent: str | None = ...,
        since: float | None = ...,
        until: float | None = ...,
        kind: str | None = ...,
        after_id: int | None = ...,
        limit: int | None = ...,
        last: int | None = ...,
    ) -> Sequence[EventLike]: ...

    def gc(self, retention_seconds: float = ...) -> int: ...

    def close(self) -> None: ...


class FleetLike(HistoryLike, Protocol):
    """What the CLI uses of the blocking ``agentscope_systemd.Fleet``: its history, and the rest."""

    name: str
    manager: str
    mode: str
    mode_reason: str

    def launch(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        stdin: int | IO[Any] | None = ...,
        stdout: int | IO[Any] | None = ...,
        stderr: int | IO[Any] | None = ...,
        memory_max: int | None = ...,
        terminal: str | None = ...,
        tasks_max: int | None = ...,
        cpu_weight: int | None = ...,
        io_weight: int | None = ...,
        properties: Mapping[str, str | int] | None = ...,
        reap_after: float | str = ...,
        call_shell: bool = ...,
    ) -> AgentLike: ...

    def adopt(
        self,
        pid: int,
        name: str,
        *,
        memory_max: int | None = ...,
        tasks_max: int | None = ...,
        cpu_weight: int | None = ...,
        io_weight: int | None = ...,
        properties: Mapping[str, str | int] | None = ...,
        reap_after: float | str = ...,
    ) -> AgentLike: ...

    def stop(self, name: str, timeout: float = ...) -> None: ...

    def kill(self, name: str, signal: int = ...) -> None: ...

    def freeze(self, name: str) -> None: ...

    def thaw(self, name: str) -> None: ...

    def agents(self) -> Sequence[AgentLike]: ...

    def clear_slice_limits(self) -> dict[str, int]: ...

    def slice_limits(self) -> dict[str, int | None]: ...

    def logs(self, name: str, lines: int = ...) -> list[str]: ...

    def send(self, name: str, text: str, *, enter: bool = ...) -> None: ...

    def attach_command(self, name: str, *, read_only: bool = ...) -> list[str]: ...

    def report(self, top: int = ...) -> Record: ...

    def monitor(
        self,
        interval: float = ...,
        top: int = ...,
        *,
        guard: Any = ...,
        reclaim_escaped: bool = ...,
    ) -> AbstractContextManager[GuardedStream]: ...


def agent_dicts(fleet: FleetLike, agents: Sequence[Any]) -> list[dict[str, Any]]:
    """Agents as ``ls --json`` and ``GET /v1/agents`` give them: each with the mode running it."""
    return [{**a.to_dict(), "mode": fleet.mode} for a in agents]


def open_fleet(opts: Options) -> FleetLike:
    """Connect to the fleet the options name.

    Raises:
        InvalidName: a bad fleet name.
        SystemdUnavailable: no manager reachable.
    """
    from agentscope_systemd import Fleet

    return cast(FleetLike, Fleet(opts.fleet, opts.manager))


class _History:
    """One fleet's rows of the registry file, read without systemd.

    ``events`` and ``gc`` need the registry only: they work on a host (or in
    a container, or over SSH without a session bus) where the manager is out
    of reach. Rows a fleet would close as lost when it next opens are still
    open here, and their ``lost`` events not yet written.
    """

    def __init__(self, registry: Any, fleet: str) -> None:
        self._registry = registry
        self._fleet = fleet

    def events(self, **filters: Any) -> Sequence[EventLike]:
        return cast(Sequence[EventLike], self._registry.events(self._fleet, **filters))

    def gc(self, retention_seconds: float = 7 * 86400) -> int:
        return int(self._registry.gc(retention_seconds, fleet=self._fleet))

    def close(self) -> None:
        self._registry.close()


def open_history(opts: Options) -> HistoryLike:
    """The recorded history of the fleet the options name, from its registry file.

    Raises:
        RegistryError: the file cannot be opened (RegistryCorrupt: damaged).
    """
    # The registry's own modules, not agentscope_systemd.lowlevel's re-exports: lowlevel
    # imports the bus (dbus-fast, asyncio), which a registry read never needs.
    from agentscope_systemd._names import resolve_manager
    from agentscope_systemd._registry._registry import Registry, default_registry_path

    manager: Literal["system", "user"] = (
        "system" if resolve_manager(opts.manager) == "system" else "user"
    )
    return _History(Registry(default_registry_path(manager)), opts.fleet)


def default_log_path(opts: Options, name: str, env: Mapping[str, str] = os.environ) -> Path:
    """Where ``run`` sends an agent's output unless told otherwise.

    ``/var/log/agentscope/<fleet>/<name>.log`` for the system manager,
    ``$XDG_STATE_HOME/agentscope/logs/<fleet>/<name>.log`` (``~/.local/state``
    without it) for a user manager.
    """
    base, parts = log_location(opts, name, env)
    return base.joinpath(*parts)


def log_location(
    opts: Options, name: str, env: Mapping[str, str] = os.environ
) -> tuple[Path, tuple[str, ...]]:
    """:func:`default_log_path` as a trusted base and the parts agentscope creates below it."""
    if opts.resolved_manager == "system":
        return Path("/var/log"), ("agentscope", opts.fleet, f"{name}.log")
    from agentscope_systemd._registry import _spool

    return Path(_spool.state_dir("user", env)), ("logs", opts.fleet, f"{name}.log")
