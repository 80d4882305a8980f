"""OOM kills that happened while no monitor ran: what to record, once (pure).

A monitor sees kills as they happen. Kills while none runs (the harness was
down, between two CLI calls) leave their trace in three places, and
:func:`plan_recovery` turns those traces and the registry's watermarks into
the kills to record now, marked ``recovered``, and the watermarks to store:

- each live scope's ``memory.events`` ``oom_kill`` counter, against the last
  counter stored on its agent's row (``oom_kill_seen``);
- the agents slice's hierarchical ``oom_kill`` counter, against the one
  stored for the fleet (:class:`Watermark`) with the scopes' counters of
  that moment: what rose in the slice and not in a live scope was in a
  scope that is gone now;
- the kernel's log after the stored position (/dev/kmsg's sequence number
  or the journal's cursor): its ``oom-kill:...,task_memcg=...`` lines name
  the victim and its cgroup, so they name the kills the counters count,
  and, across a reboot (which resets every counter), the journal alone
  tells the kills of the boot before.

The plan is pure: the caller reads (``Readings``) outside, then computes
and stores the plan in one registry transaction, so two openers never
record a kill twice and any number of restarts record it once. A kill whose
``(unit, pid)`` is already recorded is never recorded again from the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .. import _names
from .._kernel._journal import KernelLine
from ._attribution import parse_oom_kill_line, parse_oom_task_line

__all__ = [
    "Baseline",
    "KernelKill",
    "Readings",
    "RecoveredKill",
    "RecoveryPlan",
    "RowMark",
    "Watermark",
    "covers",
    "kernel_kills",
    "merge_marks",
    "plan_recovery",
    "unit_of_memcg",
]

LogSource = Literal["kmsg", "journal"]
#: Kernel-log kills kept from one read; scope counters kept in one watermark.
MAX_KILLS: Final = 10_000
MAX_SCOPES: Final = 8192


@dataclass(frozen=True, slots=True)
class KernelKill:
    """A kill the kernel's log reported: the victim, its cgroup, the boot and log position.

    ``boot`` None is the boot the log was read in (/dev/kmsg holds no other).
    """

    pid: int
    comm: str
    memcg: str
    rss: int | None
    boot: str | None
    position: str


def kernel_kills(lines: Iterable[KernelLine], *, limit: int = MAX_KILLS) -> list[KernelKill]:
    """The kills in kernel log lines, oldest first: each ``oom-kill:`` summary with the
    ``Killed process`` line of the same pid that follows it.

    A ``Killed process`` line without its summary (kernels before 4.19) names no
    cgroup and is left out; so is everything else, malformed lines included,
    and any line the kernel did not write (:attr:`KernelLine.from_kernel`, #31).
    """
    tasks: dict[int, tuple[str, str]] = {}
    found: list[KernelKill] = []
    for line in lines:
        if not line.from_kernel:
            continue
        task = parse_oom_task_line(line.text)
        if task is not None:
            tasks[task.pid] = (task.memcg, task.comm)
            if len(tasks) > 64:  # summaries whose kill line never came
                tasks.pop(next(iter(tasks)))
            continue
        kill = parse_oom_kill_line(line.text)
        if kill is None or kill.pid not in tasks:
            continue
        memcg, _ = tasks.pop(kill.pid)
        found.append(KernelKill(kill.pid, kill.comm, memcg, kill.rss, line.boot, line.position))
        if len(found) >= limit:
            break
    return found


def unit_of_memcg(memcg: str, slice_cgroup: str) -> str | None:
    """The scope unit directly under ``slice_cgroup`` that the cgroup path ``memcg`` is in.

    >>> unit_of_memcg("/a.slice/x-1.scope", "/a.slice")
    'x-1.scope'
    >>> unit_of_memcg("/b.slice/x-1.scope", "/a.slice") is None
    True
    """
    prefix = slice_cgroup.rstrip("/") + "/"
    if not memcg.startswith(prefix):
        return None
    unit = memcg[len(prefix) :].split("/", 1)[0]
    if not unit.endswith(".scope") or not _names.is_unit_name(unit):
        return None
    return unit


@dataclass(frozen=True, slots=True)
class Baseline:
    """The slice's and its scopes' ``oom_kill`` counters, read slice first (as a monitor does).

    ``slice_inode`` None: no slice cgroup (no agent yet), or not known to the reader.
    """

    slice_inode: int | None
    slice_oom_kill: int
    scopes: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Readings:
    """What the caller read just now, outside any transaction.

    ``slice_cgroup`` is the agents slice's path below the cgroup root
    (``/user.slice/.../app-agentscope-agents.slice``), ``slice_inode`` its
    directory's inode (a new cgroup of that name is a new counter; None: no
    slice), ``scopes`` every live scope under it with its ``oom_kill``.
    ``log`` holds the kernel log's kills after the stored position, read
    from ``log_source`` up to ``log_position`` (both None: not readable).
    """

    boot: str
    slice_cgroup: str
    slice_inode: int | None
    slice_oom_kill: int
    scopes: Mapping[str, int]
    log: tuple[KernelKill, ...] = ()
    log_source: LogSource | None = None
    log_position: str | None = None


@dataclass(frozen=True, slots=True)
class Watermark:
    """What a fleet has accounted for: stored in the registry, one per fleet.

    The slice's counter with the live scopes' counters at that moment (the
    nonzero ones), in one boot and one cgroup of the slice, and where the
    kernel log was read up to.
    """

    boot: str
    slice_cgroup: str
    slice_inode: int | None
    slice_oom_kill: int
    scopes: Mapping[str, int] = field(default_factory=dict)
    log_source: LogSource | None = None
    log_position: str | None = None

    @classmethod
    def of(cls, r: Readings, log_source: str | None, log_position: str | None) -> Watermark:
        """The watermark of a reading (nonzero scope counters only)."""
        scopes = {u: n for u, n in r.scopes.items() if n > 0}
        source: LogSource | None = "kmsg" if log_source == "kmsg" else None
        if log_source == "journal":
            source = "journal"
        return cls(
            r.boot, r.slice_cgroup, r.slice_inode, r.slice_oom_kill, scopes, source, log_position
        )

    def to_json(self) -> str:
        """The stored form."""
        return json.dumps(
            {
                "boot": self.boot,
                "slice": self.slice_cgroup,
                "inode": self.slice_inode,
                "oom_kill": self.slice_oom_kill,
                "scopes": dict(self.scopes),
                "log": [self.log_source, self.log_position],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: str) -> Watermark | None:
        """The stored form read back; None for anything malformed (then: no watermark)."""
        try:
            data: Any = json.loads(raw)
            boot, slice_cgroup, inode = data["boot"], data["slice"], data["inode"]
            count, scopes = data["oom_kill"], data["scopes"]
            source, position = data["log"]
        except (ValueError, KeyError, TypeError):
            return None
        if not (isinstance(boot, str) and isinstance(slice_cgroup, str)):
            return None
        if not (inode is None or (isinstance(inode, int) and inode >= 0)):
            return None
        if not isinstance(count, int) or count < 0 or not isinstance(scopes, dict):
            return None
        if source not in (None, "kmsg", "journal") or not isinstance(position, str | None):
            return None
        clean = {
            u: n
            for u, n in list(scopes.items())[:MAX_SCOPES]
            if isinstance(u, str) and _names.is_unit_name(u) and isinstance(n, int) and n > 0
        }
        return cls(boot, slice_cgroup, inode, count, clean, source, position)


def _one_counter(a: Watermark, b: Watermark) -> bool:
    """Whether two watermarks read one slice counter: one boot, one cgroup of the slice."""
    return (a.boot, a.slice_cgroup, a.slice_inode) == (b.boot, b.slice_cgroup, b.slice_inode)


def covers(stored: Watermark | None, new: Watermark) -> bool:
    """Whether ``stored`` already counts the slice's kills up to ``new``'s (another
    process read the counter after them)."""
    return (
        stored is not None
        and _one_counter(stored, new)
        and (stored.slice_oom_kill >= new.slice_oom_kill)
    )


def merge_marks(stored: Watermark | None, new: Watermark) -> Watermark:
    """``new`` without going back: a reading taken before ``stored`` was (another
    process's) cannot lower the slice's or a scope's counter in the same boot and cgroup.
    """
    if stored is None or not _one_counter(stored, new):
        return new
    scopes = dict(stored.scopes) if len(stored.scopes) < MAX_SCOPES else {}
    for unit, n in new.scopes.items():
        scopes[unit] = max(n, scopes.get(unit, 0))
    return Watermark(
        new.boot,
        new.slice_cgroup,
        new.slice_inode,
        max(stored.slice_oom_kill, new.slice_oom_kill),
        scopes,
        new.log_source,
        new.log_position,
    )


@dataclass(frozen=True, slots=True)
class RowMark:
    """An agent row of the fleet, as the plan needs it: its name and last-seen counter."""

    name: str
    seen: int


@dataclass(frozen=True, slots=True)
class RecoveredKill:
    """A kill to record now, as the monitor would have (``OomKill(..., recovered=True)``)."""

    agent: str | None
    unit: str | None
    pid: int | None
    comm: str | None
    rss: int | None
    source: Literal["kmsg", "journal", "cgroup"]


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """The kills to record, the rows' new ``oom_kill_seen``, the fleet's new watermark."""

    kills: tuple[RecoveredKill, ...]
    seen: Mapping[str, int]
    watermark: Watermark


def plan_recovery(
    readings: Readings,
    stored: Watermark | None,
    rows: Mapping[str, RowMark],
    recorded: Mapping[str, frozenset[int]] | None = None,
    *,
    fleet_prefix: str | None = None,
) -> RecoveryPlan:
    """The kills since the fleet last accounted for them, and what to store.

    ``rows`` are the fleet's agent rows by unit (open and closed),
    ``recorded`` the pids of the kills already recorded per unit (a log
    line naming one of them is old news). ``fleet_prefix``
    (``agentscope-FLEET-``) lets a log kill in a scope of this fleet that
    has no row any more be recorded without its agent; kills in other
    fleets' scopes are theirs to record.

    No watermark yet (the first open): live scopes' kills above their
    rows' counters are recorded, the slice and the log start from now.
    """
    recorded = recorded or {}
    source = readings.log_source
    same_boot = stored is not None and stored.boot == readings.boot
    log_usable = (
        source is not None and stored is not None and stored.log_source == source
    ) and stored.log_position is not None
    # The log's kills, by unit, not recorded yet.
    by_unit: dict[str, list[KernelKill]] = {}
    old_boot: list[tuple[str, KernelKill]] = []
    if log_usable:
        for kill in readings.log:
            unit = unit_of_memcg(kill.memcg, readings.slice_cgroup)
            if unit is None or kill.pid in recorded.get(unit, frozenset()):
                continue
            if kill.boot is not None and kill.boot != readings.boot:
                old_boot.append((unit, kill))
            else:
                by_unit.setdefault(unit, []).append(kill)
    kills: list[RecoveredKill] = []
    assert source is not None or not log_usable

    def named(unit: str, count: int) -> list[KernelKill]:
        """Up to ``count`` of the unit's log kills, newest first (older ones are likelier
        recorded by a monitor that read no log)."""
        found = by_unit.get(unit, [])
        take = found[-count:] if count else []
        del found[len(found) - len(take) :]
        return take[::-1]

    def ours(unit: str) -> tuple[bool, str | None]:
        row = rows.get(unit)
        if row is not None:
            return True, row.name
        return fleet_prefix is not None and unit.startswith(fleet_prefix), None

    # 1. Live scopes of this fleet: the counter above the row's.
    seen: dict[str, int] = {}
    for unit, count in sorted(readings.scopes.items()):
        row = rows.get(unit)
        if row is None:
            continue
        delta = count - row.seen
        if delta <= 0:
            continue
        seen[unit] = count
        logged = named(unit, delta)
        for k in logged:
            assert source is not None
            kills.append(RecoveredKill(row.name, unit, k.pid, k.comm, k.rss, source))
        for _ in range(delta - len(logged)):
            kills.append(RecoveredKill(row.name, unit, None, None, None, "cgroup"))
    # 2. Kills in scopes now gone: the slice's rise that no live scope explains.
    gone = 0
    if stored is not None and stored.slice_cgroup == readings.slice_cgroup:
        if readings.slice_inode is None:
            gone = 0
        elif same_boot and stored.slice_inode == readings.slice_inode:
            rise = readings.slice_oom_kill - stored.slice_oom_kill
            live = sum(max(0, n - stored.scopes.get(u, 0)) for u, n in readings.scopes.items())
            gone = max(0, rise - live)
        else:  # a new cgroup (or boot): its counter began at 0 with no scope in it
            gone = max(0, readings.slice_oom_kill - sum(readings.scopes.values()))
    if gone:
        for unit in [u for u in by_unit if u not in readings.scopes]:
            for k in named(unit, gone):
                gone -= 1
                mine, agent = ours(unit)
                if mine:
                    assert source is not None
                    kills.append(RecoveredKill(agent, unit, k.pid, k.comm, k.rss, source))
            if gone <= 0:
                break
        for _ in range(gone):
            kills.append(RecoveredKill(None, None, None, None, None, "cgroup"))
    # 3. The boot before (the journal only, also where this boot's lines come
    # from /dev/kmsg): its counters are gone with it.
    if stored is not None and not same_boot:
        for unit, k in old_boot:
            mine, agent = ours(unit)
            if mine and source is not None:
                kills.append(RecoveredKill(agent, unit, k.pid, k.comm, k.rss, "journal"))
    position = readings.log_position
    if (
        source is not None
        and position is None
        and stored is not None
        and stored.log_source == source
    ):
        position = stored.log_position  # nothing read: stay where we were
    mark = merge_marks(stored, Watermark.of(readings, source, position))
    return RecoveryPlan(tuple(kills), seen, mark)
