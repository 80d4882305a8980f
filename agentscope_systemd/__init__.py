"""agentscope (the agentscope-systemd distribution): every AI agent in its own systemd scope.

Layers, from daily use down: ``agentscope_systemd`` holds fleets and agents
(an asyncio core, :class:`AsyncFleet`, and a blocking facade over the same
core, :class:`Fleet`); ``agentscope_systemd.lowlevel`` the cgroup and /proc
readers and the bus connection it is built from;
``agentscope_systemd.watchdog`` the harness stability kit (event-loop stall
watchdog, fatal-reason log). Below them, one private subpackage per
layer (docs/architecture.md): ``_kernel``, ``_managers``, ``_registry``,
``_monitor``, ``_guard``, ``_fleet``, ``_calls``, and the ``agentscope``
command in ``_cli``, built on the public side.

Names are imported on first use (PEP 562): ``agentscope exec`` starts with
``import agentscope_systemd._managers._wire`` and must not pay for the whole library.
"""

from ._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from ._errors import AgentExists as AgentExists
    from ._errors import AgentNotFound as AgentNotFound
    from ._errors import AgentscopeError as AgentscopeError
    from ._errors import BusError as BusError
    from ._errors import HostUnderPressure as HostUnderPressure
    from ._errors import InstallError as InstallError
    from ._errors import InvalidConfig as InvalidConfig
    from ._errors import InvalidName as InvalidName
    from ._errors import LaunchError as LaunchError
    from ._errors import ModeUnavailable as ModeUnavailable
    from ._errors import ModeUnsupported as ModeUnsupported
    from ._errors import RegistryCorrupt as RegistryCorrupt
    from ._errors import RegistryError as RegistryError
    from ._errors import SystemdTimeout as SystemdTimeout
    from ._errors import SystemdUnavailable as SystemdUnavailable
    from ._errors import TmuxError as TmuxError
    from ._errors import TmuxUnavailable as TmuxUnavailable
    from ._errors import WindowExists as WindowExists
    from ._events import AgentExited as AgentExited
    from ._events import Escaped as Escaped
    from ._events import LimitFound as LimitFound
    from ._events import OomdKill as OomdKill
    from ._events import OomKill as OomKill
    from ._events import Pressure as Pressure
    from ._events import Throttled as Throttled
    from ._fleet._agent import Agent as Agent
    from ._fleet._blocking import BlockingAgent as BlockingAgent
    from ._fleet._blocking import BlockingMonitor as BlockingMonitor
    from ._fleet._blocking import Fleet as Fleet
    from ._fleet._blocking import probe_sync as probe_sync
    from ._fleet._fleet import DEVNULL as DEVNULL
    from ._fleet._fleet import PIPE as PIPE
    from ._fleet._fleet import AsyncFleet as AsyncFleet
    from ._guard._guardpolicy import GuardConfig as GuardConfig
    from ._guard._guardpolicy import GuardHeld as GuardHeld
    from ._guard._guardpolicy import GuardKill as GuardKill
    from ._managers._systemd import Capabilities as Capabilities
    from ._managers._systemd import probe as probe
    from ._monitor._monitor import Monitor as Monitor
    from ._monitor._report import AgentMemory as AgentMemory
    from ._monitor._report import MemoryReport as MemoryReport
    from ._monitor._report import TopProcess as TopProcess
    from ._monitor._report import build_report as build_report
    from ._names import DEFAULT_SLICE as DEFAULT_SLICE
    from ._registry._registry import EventRecord as EventRecord
    from ._registry._registry import default_registry_path as default_registry_path

del TYPE_CHECKING

__version__ = "0.1.0.dev0"

# Where each public name lives: imported at first use (``__getattr__``).
_LAZY = {
    "BlockingAgent": "._fleet._blocking",
    "BlockingMonitor": "._fleet._blocking",
    "Fleet": "._fleet._blocking",
    "probe_sync": "._fleet._blocking",
    "AgentExists": "._errors",
    "AgentNotFound": "._errors",
    "AgentscopeError": "._errors",
    "BusError": "._errors",
    "HostUnderPressure": "._errors",
    "InvalidConfig": "._errors",
    "InvalidName": "._errors",
    "LaunchError": "._errors",
    "ModeUnavailable": "._errors",
    "ModeUnsupported": "._errors",
    "RegistryCorrupt": "._errors",
    "RegistryError": "._errors",
    "SystemdTimeout": "._errors",
    "SystemdUnavailable": "._errors",
    "DEVNULL": "._fleet._fleet",
    "PIPE": "._fleet._fleet",
    "Agent": "._fleet._agent",
    "AsyncFleet": "._fleet._fleet",
    "Capabilities": "._managers._systemd",
    "probe": "._managers._systemd",
    "GuardConfig": "._guard._guardpolicy",
    "GuardHeld": "._guard._guardpolicy",
    "GuardKill": "._guard._guardpolicy",
    "InstallError": "._errors",
    "AgentExited": "._events",
    "Escaped": "._events",
    "AgentMemory": "._monitor._report",
    "LimitFound": "._events",
    "MemoryReport": "._monitor._report",
    "Monitor": "._monitor._monitor",
    "OomKill": "._events",
    "OomdKill": "._events",
    "Pressure": "._events",
    "Throttled": "._events",
    "TopProcess": "._monitor._report",
    "build_report": "._monitor._report",
    "DEFAULT_SLICE": "._names",
    "EventRecord": "._registry._registry",
    "default_registry_path": "._registry._registry",
    "TmuxError": "._errors",
    "TmuxUnavailable": "._errors",
    "WindowExists": "._errors",
}

# The public names, written once (here, with their modules); the imports
# above are the same names for type checkers (tests/test_api.py checks both).
__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
