"""agentscope (the agentscope-systemd distribution): every AI agent in its own systemd scope.

Layers, from daily use down: ``agentscope_systemd`` holds fleets and agents
(an asyncio core, :class:`AsyncFleet`, and a blocking facade over the same
core, :class:`Fleet`); ``agentscope_systemd.lowlevel`` the cgroup and /proc
readers and the bus connection it is built from;
``agentscope_systemd.watchdog`` the harness stability kit (event-loop stall
watchdog, fatal-reason log). The ``agentscope`` command is the private
``_cli`` subpackage, built on the public side.

Names are imported on first use (PEP 562): ``agentscope exec`` starts with
``import agentscope_systemd._wire`` and must not pay for the whole library.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._agent import Agent as Agent
    from ._blocking import BlockingAgent as BlockingAgent
    from ._blocking import BlockingMonitor as BlockingMonitor
    from ._blocking import Fleet as Fleet
    from ._blocking import probe_sync as probe_sync
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
    from ._fleet import DEVNULL as DEVNULL
    from ._fleet import PIPE as PIPE
    from ._fleet import AsyncFleet as AsyncFleet
    from ._guardpolicy import GuardConfig as GuardConfig
    from ._guardpolicy import GuardHeld as GuardHeld
    from ._guardpolicy import GuardKill as GuardKill
    from ._monitor import Monitor as Monitor
    from ._names import DEFAULT_SLICE as DEFAULT_SLICE
    from ._registry import EventRecord as EventRecord
    from ._registry import default_registry_path as default_registry_path
    from ._report import AgentMemory as AgentMemory
    from ._report import MemoryReport as MemoryReport
    from ._report import TopProcess as TopProcess
    from ._report import build_report as build_report
    from ._systemd import Capabilities as Capabilities
    from ._systemd import probe as probe

del TYPE_CHECKING

__version__ = "0.1.0.dev0"

# Where each public name lives.
_LAZY = {
    "BlockingAgent": "._blocking",
    "BlockingMonitor": "._blocking",
    "Fleet": "._blocking",
    "probe_sync": "._blocking",
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
    "DEVNULL": "._fleet",
    "PIPE": "._fleet",
    "Agent": "._agent",
    "AsyncFleet": "._fleet",
    "Capabilities": "._systemd",
    "probe": "._systemd",
    "GuardConfig": "._guardpolicy",
    "GuardHeld": "._guardpolicy",
    "GuardKill": "._guardpolicy",
    "InstallError": "._errors",
    "AgentExited": "._events",
    "Escaped": "._events",
    "AgentMemory": "._report",
    "LimitFound": "._events",
    "MemoryReport": "._report",
    "Monitor": "._monitor",
    "OomKill": "._events",
    "OomdKill": "._events",
    "Pressure": "._events",
    "Throttled": "._events",
    "TopProcess": "._report",
    "build_report": "._report",
    "DEFAULT_SLICE": "._names",
    "EventRecord": "._registry",
    "default_registry_path": "._registry",
    "TmuxError": "._errors",
    "TmuxUnavailable": "._errors",
    "WindowExists": "._errors",
}

__all__ = [
    "DEFAULT_SLICE",
    "DEVNULL",
    "PIPE",
    "Agent",
    "AgentExists",
    "AgentExited",
    "AgentMemory",
    "AgentNotFound",
    "AgentscopeError",
    "AsyncFleet",
    "BlockingAgent",
    "BlockingMonitor",
    "BusError",
    "Capabilities",
    "Escaped",
    "EventRecord",
    "Fleet",
    "GuardConfig",
    "GuardHeld",
    "GuardKill",
    "HostUnderPressure",
    "InstallError",
    "InvalidConfig",
    "InvalidName",
    "LaunchError",
    "LimitFound",
    "MemoryReport",
    "ModeUnavailable",
    "ModeUnsupported",
    "Monitor",
    "OomKill",
    "OomdKill",
    "Pressure",
    "RegistryCorrupt",
    "RegistryError",
    "SystemdTimeout",
    "SystemdUnavailable",
    "Throttled",
    "TmuxError",
    "TmuxUnavailable",
    "TopProcess",
    "WindowExists",
    "__version__",
    "build_report",
    "default_registry_path",
    "probe",
    "probe_sync",
]


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
