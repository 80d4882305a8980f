"""Reconciliation, pure: registry rows against the scopes systemd runs.

:func:`reconcile` matches rows to live scopes by unit, pid and start time and
returns a :class:`ReconcilePlan` the caller carries out (the closures with
``Registry.apply_closures``). :func:`in_flight` and :func:`stale` are the one
rule for when an open row may be judged: every launch path (the library,
tmux, ``agentscope exec``'s take-in) asks them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

from .._kernel._proc import same_process
from .._registry._records import AgentRecord

__all__ = [
    "LAUNCH_GRACE",
    "REASON_PID_REUSED",
    "REASON_PROCESS_GONE",
    "REASON_SCOPE_GONE",
    "LiveScope",
    "ReconcilePlan",
    "Revival",
    "in_flight",
    "reconcile",
    "stale",
]

# Reasons attached to closures found by reconcile(); they end up in the detail
# of the "lost" event apply_closures() records.
REASON_SCOPE_GONE: Final = "scope-gone"
REASON_PID_REUSED: Final = "pid-reused"
REASON_PROCESS_GONE: Final = "process-gone"


@dataclass(frozen=True, slots=True)
class LiveScope:
    """A scope systemd runs now, as the caller read it.

    ``pids`` are the processes in its cgroup; ``start_times`` maps each pid
    whose ``/proc/PID/stat`` could be read to its start time (field 22). A
    pid missing from ``start_times`` vanished mid-read and counts as gone.
    ``state`` is systemd's word for the unit (``"active"``,
    ``"deactivating"``...): only an ``active`` scope revives a closed row.
    """

    unit: str
    pids: tuple[int, ...]
    start_times: Mapping[int, int]
    state: str = "active"

    def start_time(self, pid: int) -> int | None:
        """The start time of ``pid`` if it runs in this scope, else None."""
        if pid not in self.pids:
            return None
        return self.start_times.get(pid)


class Revival(NamedTuple):
    """A closed row to reopen: its scope runs ``pid`` (started at ``start_time``)."""

    row: AgentRecord
    pid: int
    start_time: int


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    """What :func:`reconcile` found; the caller carries it out.

    - ``adopt``: open rows whose scope runs their very process (pid and start
      time equal). Manage them again.
    - ``unknown``: live scopes no open row claims. Not ours to close; report
      or stop them.
    - ``close``: open rows whose scope is gone (closed as ``lost``).
    - ``reused``: open rows whose pid runs in the scope with another start
      time, i.e. a new process got the old pid. Never adopted; closed as
      ``lost``.
    - ``headless``: open rows whose scope still runs but without their
      process (it exited, leaving children behind). Not adopted; closed as
      ``lost``; the caller may stop the scope.
    - ``revive``: closed rows whose scope is active and holds processes (the
      row was closed while the scope lived on: a listing that missed it, a
      first process that exited leaving children). Reopened as running with
      the process named, once; the caller passes the closed rows it wants
      judged so.
    """

    adopt: tuple[AgentRecord, ...] = ()
    unknown: tuple[LiveScope, ...] = ()
    close: tuple[AgentRecord, ...] = ()
    reused: tuple[AgentRecord, ...] = ()
    headless: tuple[AgentRecord, ...] = ()
    revive: tuple[Revival, ...] = ()

    @property
    def closures(self) -> tuple[tuple[AgentRecord, str], ...]:
        """Every row to close, with the reason: ``(record, reason)``."""
        return (
            tuple((r, REASON_SCOPE_GONE) for r in self.close)
            + tuple((r, REASON_PID_REUSED) for r in self.reused)
            + tuple((r, REASON_PROCESS_GONE) for r in self.headless)
        )


def reconcile(rows: Iterable[AgentRecord], live: Mapping[str, LiveScope]) -> ReconcilePlan:
    """Match registry rows against the scopes systemd runs; no I/O.

    ``rows`` are registry rows; a closed one is judged only if its scope
    runs (``revive``), so passing only open rows leaves closed ones closed.
    ``live`` maps unit name to scope. Pass the rows and scopes of one fleet,
    or of all fleets: matching is by unit name only. A process is identified
    by (pid, start time) so a reused pid is never adopted.

    Example::

        plan = reconcile(reg.agents("ci"), live_scopes_of("ci"))
        reg.apply_closures(plan)
    """
    adopt: list[AgentRecord] = []
    close: list[AgentRecord] = []
    reused: list[AgentRecord] = []
    headless: list[AgentRecord] = []
    revive: list[Revival] = []
    claimed: set[str] = set()
    for row in rows:
        if row.closed:
            revival = _revival(row, live.get(row.unit))
            if revival is not None:
                revive.append(revival)
                claimed.add(row.unit)
            continue
        scope = live.get(row.unit)
        if scope is None:
            close.append(row)
            continue
        claimed.add(row.unit)
        if row.pid not in scope.pids or row.pid not in scope.start_times:
            headless.append(row)
        elif scope.start_times[row.pid] != row.start_time:
            reused.append(row)
        else:
            adopt.append(row)
    unknown = tuple(live[u] for u in sorted(live) if u not in claimed)
    return ReconcilePlan(
        adopt=tuple(adopt),
        unknown=unknown,
        close=tuple(close),
        reused=tuple(reused),
        headless=tuple(headless),
        revive=tuple(revive),
    )


def _revival(row: AgentRecord, scope: LiveScope | None) -> Revival | None:
    """A closed row's reopening if its scope runs: its own process if still
    there, else the scope's first (as a found scope is recorded)."""
    if scope is None or scope.state != "active":
        return None  # gone, or being stopped: closed stays closed
    if scope.start_time(row.pid) == row.start_time:
        return Revival(row, row.pid, row.start_time)
    known = [p for p in scope.pids if p in scope.start_times]
    if not known:
        return None  # no process could be read: no verdict
    pid = min(known)
    return Revival(row, pid, scope.start_times[pid])


LAUNCH_GRACE: Final = 120.0  # seconds a "starting" row may take before it is judged
_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


def _boot_seconds() -> float:
    """Seconds since boot, as /proc/PID/stat's start times count them (CLOCK_BOOTTIME)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def in_flight(rec: AgentRecord, *, proc_root: str = "/proc") -> bool:
    """Whether a row is a launch its launcher is still at work on.

    A young ``starting`` row whose child still runs (same start time) and
    is still its launcher's child. The gated child of a launcher that died
    exits in its gate, and one that exec'd is reparented to init or the
    manager (a subreaper, ``systemd``): either way no one will move the row
    on, so it is judged as any other. The one rule, for the launches of
    every path (the library, tmux, ``agentscope exec``'s take-in).
    """
    if rec.state != "starting":
        return False
    stat = same_process(rec.pid, rec.start_time, Path(proc_root))
    if stat is None:  # ended, or its pid is another process's now
        return False
    # Young by the boot clock, not the wall clock (#31): a clock set forward
    # must not judge a launch under way, nor one set back keep an old one.
    if _boot_seconds() - rec.start_time / _CLK_TCK > LAUNCH_GRACE:
        return False
    ppid = stat.ppid
    if ppid <= 1:
        return False
    try:
        with open(f"{proc_root}/{ppid}/comm", "rb") as f:
            parent = f.read().strip()
    except OSError:
        return False
    return parent != b"systemd"


def stale(rec: AgentRecord, scope_live: bool) -> bool:
    """Whether an open row may be closed: its scope is gone and no launcher is at work."""
    return not rec.closed and not scope_live and not in_flight(rec)
