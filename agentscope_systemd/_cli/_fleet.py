"""The fleet the command line talks to: options, its history, one factory.

Every command reaches the library through :func:`open_fleet` (looked up on
this module at call time), so tests replace it with a fake fleet. The
commands are typed against the real ``agentscope_systemd.Fleet`` (imported
for the type checker only), so mypy checks each use against the library.
Kept free of typer and rich: the ``exec`` fast path uses it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, Unpack

from ._options import Options

if TYPE_CHECKING:
    from agentscope_systemd import Fleet
    from agentscope_systemd._registry._records import EventFilter, EventRecord
    from agentscope_systemd._registry._registry import Registry

__all__ = [
    "HistoryLike",
    "Options",
    "default_log_path",
    "log_location",
    "open_fleet",
    "open_history",
]


class HistoryLike(Protocol):
    """A fleet's recorded history: what ``events`` and ``gc`` use, no bus needed.

    A :class:`Fleet` is one; so is the registry file read alone (:func:`open_history`).
    """

    def events(self, **filters: Unpack[EventFilter]) -> Sequence[EventRecord]: ...

    def gc(self, retention_seconds: float = ...) -> int: ...

    def close(self) -> None: ...


def agent_dicts(fleet: Fleet, agents: Sequence[Any]) -> list[dict[str, Any]]:
    """Agents as ``ls --json`` and ``GET /v1/agents`` give them: each with the mode running it."""
    return [{**a.to_dict(), "mode": fleet.mode} for a in agents]


def open_fleet(opts: Options) -> Fleet:
    """Connect to the fleet the options name.

    Raises:
        InvalidName: a bad fleet name.
        SystemdUnavailable: no manager reachable.
    """
    from agentscope_systemd import Fleet

    return Fleet(opts.fleet, opts.manager)


class _History:
    """One fleet's rows of the registry file, read without systemd.

    ``events`` and ``gc`` need the registry only: they work on a host (or in
    a container, or over SSH without a session bus) where the manager is out
    of reach. Rows a fleet would close as lost when it next opens are still
    open here, and their ``lost`` events not yet written.
    """

    def __init__(self, registry: Registry, fleet: str) -> None:
        self._registry = registry
        self._fleet = fleet

    def events(self, **filters: Unpack[EventFilter]) -> list[EventRecord]:
        return self._registry.events(self._fleet, **filters)

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
