"""The raw layer under agentscope: cgroup and /proc readers, bus access, naming.

For harnesses that need the pieces: every reader takes its root as a
parameter and returns frozen dataclasses; a process or cgroup that vanished
mid-read gives None, never an error.
"""

from ._guard._guard import kill_process as kill_process
from ._guard._guard import run_guard as run_guard
from ._guard._guardclock import PressureClock as PressureClock
from ._guard._guardpolicy import HostReading as HostReading
from ._guard._guardpolicy import SliceProcess as SliceProcess
from ._guard._guardpolicy import Victim as Victim
from ._guard._guardpolicy import choose_victim as choose_victim
from ._guard._guardpolicy import next_interval as next_interval
from ._guard._guardpolicy import read_host as read_host
from ._guard._guardpolicy import scan_slice_processes as scan_slice_processes
from ._guard._guardpolicy import under_pressure as under_pressure
from ._kernel._cgroup import CgroupCeiling as CgroupCeiling
from ._kernel._cgroup import CgroupMemory as CgroupMemory
from ._kernel._cgroup import LimitHolder as LimitHolder
from ._kernel._cgroup import MemoryEvents as MemoryEvents
from ._kernel._cgroup import MemoryStat as MemoryStat
from ._kernel._cgroup import Pressure as Pressure
from ._kernel._cgroup import PressureLine as PressureLine
from ._kernel._cgroup import cgroup_chain as cgroup_chain
from ._kernel._cgroup import cgroup_path_for_unit as cgroup_path_for_unit
from ._kernel._cgroup import cgroup_v2_mounted as cgroup_v2_mounted
from ._kernel._cgroup import find_limit_holders as find_limit_holders
from ._kernel._cgroup import memory_controller_enabled as memory_controller_enabled
from ._kernel._cgroup import parse_limit as parse_limit
from ._kernel._cgroup import parse_memory_events as parse_memory_events
from ._kernel._cgroup import parse_memory_stat as parse_memory_stat
from ._kernel._cgroup import parse_pressure as parse_pressure
from ._kernel._cgroup import parse_procs as parse_procs
from ._kernel._cgroup import read_ceiling as read_ceiling
from ._kernel._cgroup import read_cgroup_memory as read_cgroup_memory
from ._kernel._cgroup import scan_slice as scan_slice
from ._kernel._cgroup import user_manager_cgroup as user_manager_cgroup
from ._kernel._container import ContainerView as ContainerView
from ._kernel._container import inspect_container as inspect_container
from ._kernel._container import not_systemd_note as not_systemd_note
from ._kernel._container import pid1_comm as pid1_comm
from ._kernel._journal import JournalAccess as JournalAccess
from ._kernel._journal import journal_access as journal_access
from ._kernel._journal import kmsg_readable as kmsg_readable
from ._kernel._proc import MemInfo as MemInfo
from ._kernel._proc import ProcessInfo as ProcessInfo
from ._kernel._proc import ProcStat as ProcStat
from ._kernel._proc import SmapsRollup as SmapsRollup
from ._kernel._proc import host_pressure as host_pressure
from ._kernel._proc import iter_pids as iter_pids
from ._kernel._proc import parse_meminfo as parse_meminfo
from ._kernel._proc import parse_stat as parse_stat
from ._kernel._proc import read_cgroup as read_cgroup
from ._kernel._proc import read_cmdline as read_cmdline
from ._kernel._proc import read_meminfo as read_meminfo
from ._kernel._proc import read_oom_score_adj as read_oom_score_adj
from ._kernel._proc import read_smaps_rollup as read_smaps_rollup
from ._kernel._proc import read_stat as read_stat
from ._kernel._proc import read_statm_rss as read_statm_rss
from ._kernel._proc import read_vm_sizes as read_vm_sizes
from ._kernel._proc import read_wchan as read_wchan
from ._kernel._proc import top_processes as top_processes
from ._managers._bus import INFINITY as INFINITY
from ._managers._bus import BusAddress as BusAddress
from ._managers._bus import Manager as Manager
from ._managers._bus import SystemdBus as SystemdBus
from ._managers._bus import bus_addresses as bus_addresses
from ._managers._bus import resolve_manager as resolve_manager
from ._managers._modes import ModeChoice as ModeChoice
from ._managers._modes import choose_mode as choose_mode
from ._monitor._attribution import THROTTLE_WCHANS as THROTTLE_WCHANS
from ._monitor._attribution import KernelOomKill as KernelOomKill
from ._monitor._attribution import PressureEvent as PressureEvent
from ._monitor._attribution import PressureSample as PressureSample
from ._monitor._attribution import PressureWindow as PressureWindow
from ._monitor._attribution import SeenProcess as SeenProcess
from ._monitor._attribution import Throttle as Throttle
from ._monitor._attribution import counter_delta as counter_delta
from ._monitor._attribution import detect_throttle as detect_throttle
from ._monitor._attribution import is_throttled as is_throttled
from ._monitor._attribution import oom_victims as oom_victims
from ._monitor._attribution import parse_oom_kill_line as parse_oom_kill_line
from ._monitor._escape import Escapee as Escapee
from ._monitor._escape import find_escapes as find_escapes
from ._monitor._escape import read_children as read_children
from ._monitor._oomd import OOMD_SOCKET as OOMD_SOCKET
from ._monitor._oomd import OomdConfig as OomdConfig
from ._monitor._oomd import OomdLine as OomdLine
from ._monitor._oomd import OomdRule as OomdRule
from ._monitor._oomd import OomdView as OomdView
from ._monitor._oomd import UnitRules as UnitRules
from ._monitor._oomd import agents_ancestors as agents_ancestors
from ._monitor._oomd import assess_oomd as assess_oomd
from ._monitor._oomd import oomd_state as oomd_state
from ._monitor._oomd import parse_oomd_line as parse_oomd_line
from ._monitor._oomd import read_oomd_chain as read_oomd_chain
from ._monitor._oomd import read_oomd_config as read_oomd_config
from ._names import DEFAULT_SLICE as DEFAULT_SLICE
from ._names import describe as describe
from ._names import parse_description as parse_description
from ._names import scope_pattern as scope_pattern
from ._names import scope_unit_name as scope_unit_name
from ._names import validate_name as validate_name
from ._names import validate_slice as validate_slice
from ._registry._records import EventFilter as EventFilter
from ._registry._registry import Registry as Registry

__all__ = [
    "DEFAULT_SLICE",
    "INFINITY",
    "OOMD_SOCKET",
    "THROTTLE_WCHANS",
    "BusAddress",
    "CgroupCeiling",
    "CgroupMemory",
    "ContainerView",
    "Escapee",
    "EventFilter",
    "HostReading",
    "JournalAccess",
    "KernelOomKill",
    "LimitHolder",
    "Manager",
    "MemInfo",
    "MemoryEvents",
    "MemoryStat",
    "ModeChoice",
    "OomdConfig",
    "OomdLine",
    "OomdRule",
    "OomdView",
    "Pressure",
    "PressureClock",
    "PressureEvent",
    "PressureLine",
    "PressureSample",
    "PressureWindow",
    "ProcStat",
    "ProcessInfo",
    "Registry",
    "SeenProcess",
    "SliceProcess",
    "SmapsRollup",
    "SystemdBus",
    "Throttle",
    "UnitRules",
    "Victim",
    "agents_ancestors",
    "assess_oomd",
    "bus_addresses",
    "cgroup_chain",
    "cgroup_path_for_unit",
    "cgroup_v2_mounted",
    "choose_mode",
    "choose_victim",
    "counter_delta",
    "describe",
    "detect_throttle",
    "find_escapes",
    "find_limit_holders",
    "host_pressure",
    "inspect_container",
    "is_throttled",
    "iter_pids",
    "journal_access",
    "kill_process",
    "kmsg_readable",
    "memory_controller_enabled",
    "next_interval",
    "not_systemd_note",
    "oom_victims",
    "oomd_state",
    "parse_description",
    "parse_limit",
    "parse_meminfo",
    "parse_memory_events",
    "parse_memory_stat",
    "parse_oom_kill_line",
    "parse_oomd_line",
    "parse_pressure",
    "parse_procs",
    "parse_stat",
    "pid1_comm",
    "read_ceiling",
    "read_cgroup",
    "read_cgroup_memory",
    "read_children",
    "read_cmdline",
    "read_host",
    "read_meminfo",
    "read_oom_score_adj",
    "read_oomd_chain",
    "read_oomd_config",
    "read_smaps_rollup",
    "read_stat",
    "read_statm_rss",
    "read_vm_sizes",
    "read_wchan",
    "resolve_manager",
    "run_guard",
    "scan_slice",
    "scan_slice_processes",
    "scope_pattern",
    "scope_unit_name",
    "top_processes",
    "under_pressure",
    "user_manager_cgroup",
    "validate_name",
    "validate_slice",
]
