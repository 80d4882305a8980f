"""The monitor's events: plain frozen records, each with ``kind`` and ``to_dict``.

:class:`OomKill` when an ``oom_kill`` counter moves, :class:`Throttled` when a
MemoryHigh holds agents, :class:`Pressure` once per window of memory
pressure, :class:`AgentExited` and :class:`LimitFound` for context,
:class:`Escaped` for an agent's process outside its scope, and the
guard's :class:`~agentscope_systemd._guard._guardpolicy.GuardKill` (and
:class:`~agentscope_systemd._guard._guardpolicy.GuardHeld` when the shortage is not the
fleet's), and systemd-oomd's kill of an agent, :class:`OomdKill` (its line is
read by :mod:`agentscope_systemd._monitor._oomd`). :data:`Event` is their union: what a
:class:`~agentscope_systemd.Monitor` yields and the fleet records.

Only the records live here, not their makers: opening a fleet (``agentscope
ls``, whose recovery records :class:`OomKill`) imports this module and none of
the monitor's, the guard's or oomd's (issue 28, tests/test_cli_fast.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ._dicts import Kinded
from ._guard._guardevents import GuardHeld, GuardKill

if TYPE_CHECKING:  # fields' types only: a fleet that reads its history runs no monitor
    from ._kernel._cgroup import LimitHolder
    from ._monitor._attribution import PressureEvent
    from ._monitor._report import MemoryReport

__all__ = [
    "AgentExited",
    "Escaped",
    "Event",
    "LimitFound",
    "OomKill",
    "OomdKill",
    "Pressure",
    "Throttled",
]

_Source = Literal["cgroup", "reaped", "kmsg", "journal"]


@dataclass(frozen=True, slots=True)
class OomKill(Kinded):
    """The OOM killer killed a process in the agents slice.

    ``source`` says how the victim is known: ``"kmsg"`` or ``"journal"``
    (the kernel's log named it, read from /dev/kmsg or from the journal's
    kernel messages), ``"reaped"`` (the fleet reaped its launched child with
    SIGKILL) or ``"cgroup"`` (the largest process that left the scope, or
    nothing: ``pid`` and ``comm`` are then None). ``agent`` and ``unit`` are
    None when the kill was only visible in the slice's counter and the scope
    could not be told; ``agent`` alone is None for a scope that is not one
    of this fleet's. ``rss_last_seen`` is the victim's RSS at the last sample
    (for a victim no sample saw, the RSS the kernel's line gave).
    ``recovered`` is True for a kill that happened while no monitor ran,
    found when a fleet opened or a monitor started (docs/oom-detection.md,
    "Kills while no monitor ran").
    """

    kind: ClassVar[str] = "oom_kill"
    ts: float
    agent: str | None
    unit: str | None
    pid: int | None
    comm: str | None
    rss_last_seen: int | None
    source: _Source
    recovered: bool = False


@dataclass(frozen=True, slots=True)
class Throttled(Kinded):
    """A MemoryHigh is throttling agents: their allocations sleep in the kernel.

    ``unit`` is the cgroup whose ``high`` counter rose by
    ``high_events_delta``; ``d_state_pids`` the agents' processes seen
    stalled in ``mem_cgroup_handle_over_high`` (may be empty: another user's
    wchan is hidden); ``limit_unit`` the nearest unit with MemoryHigh set,
    and ``fix`` the command that lifts it until reboot (None when no holder
    was found).
    """

    kind: ClassVar[str] = "throttled"
    ts: float
    unit: str
    high_events_delta: int
    d_state_pids: tuple[int, ...]
    limit_unit: str | None
    fix: str | None


@dataclass(frozen=True, slots=True)
class Pressure(Kinded):
    """Memory pressure crossed a threshold during a window.

    ``report`` was taken when the window opened (the first sample over a
    threshold); ``window`` holds the window's span and its worst sample.
    """

    kind: ClassVar[str] = "pressure"
    ts: float
    report: MemoryReport
    window: PressureEvent | None = None


@dataclass(frozen=True, slots=True)
class AgentExited(Kinded):
    """The fleet reaped an agent's launched child; ``status`` as Popen.returncode (-9: SIGKILL)."""

    kind: ClassVar[str] = "exited"
    ts: float
    agent: str | None
    unit: str
    pid: int
    status: int | None


@dataclass(frozen=True, slots=True)
class LimitFound(Kinded):
    """A MemoryHigh or MemoryMax on the agents slice or an ancestor (reported once per value)."""

    kind: ClassVar[str] = "limit_found"
    ts: float
    unit: str
    limits: LimitHolder

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {
            "kind": self.kind,
            "ts": self.ts,
            "unit": self.unit,
            "limits": {"MemoryHigh": self.limits.high, "MemoryMax": self.limits.max},
            "path": str(self.limits.path),
        }


@dataclass(frozen=True, slots=True)
class Escaped(Kinded):
    """A descendant of an agent lives outside the agents slice (reported once per process).

    ``unit`` is the agent's scope, ``cgroup`` where the process lives now and
    ``to_unit`` that cgroup's unit (None when the path names no valid unit);
    ``comm`` and ``cgroup`` are cleaned and cut (docs/escapes.md).
    ``reclaimed`` is None when the monitor was not asked to move escapees
    back (``reclaim_escaped``), else whether the process is back in its
    scope; ``reclaim_error`` then says why not.
    """

    kind: ClassVar[str] = "escaped"
    ts: float
    agent: str | None
    unit: str
    pid: int
    start_time: int
    comm: str
    cgroup: str
    to_unit: str | None
    rss: int
    reclaimed: bool | None = None
    reclaim_error: str | None = None


@dataclass(frozen=True, slots=True)
class OomdKill(Kinded):
    """systemd-oomd killed an agent's whole scope (every process in it, with SIGKILL).

    ``unit`` is the agent's scope, ``agent`` its agent (None: a scope of the
    slice that is not this fleet's); ``cgroup`` the path oomd named (a
    sub-cgroup of the scope when the scope has them); ``rule`` ``"swap"`` or
    ``"pressure"`` with oomd's figures: ``limit`` %, and for pressure the
    ``monitored`` cgroup, its ``pressure`` % and the ``duration`` as oomd wrote
    it. ``source`` is where the kill was read: ``"journal"`` (oomd's line).
    ``call`` is the agent's tool call oomd killed (its ``call-*`` cgroup, a
    leaf: docs/calls.md) when the cgroup is one, the agent then living on;
    None when oomd took the scope or its agent leaf.
    """

    kind: ClassVar[str] = "oomd_kill"
    ts: float
    agent: str | None
    unit: str
    cgroup: str
    rule: Literal["swap", "pressure"]
    limit: float | None
    monitored: str | None
    pressure: float | None
    duration: str | None
    source: Literal["journal"] = "journal"
    call: str | None = None


Event = (
    OomKill
    | Throttled
    | Pressure
    | AgentExited
    | LimitFound
    | GuardKill
    | GuardHeld
    | Escaped
    | OomdKill
)
