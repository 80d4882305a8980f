"""The fleet's part of recovering OOM kills missed while no monitor ran.

:class:`OomRecovery` is a part :class:`._fleet.AsyncFleet` holds.
At ``open()``, and when a monitor takes its baseline, it reads the
counters and the kernel log (in a worker thread), and lets the registry
plan (:func:`._recovery.plan_recovery`) and store the recovered kills in
one transaction. A live kill the monitor reports is stored with what it
accounts for (:meth:`_record_live_kill`), so the next recovery does not
count it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .. import _numbers
from .._errors import RegistryError
from .._kernel._cgroup import _read_kernel_file, parse_memory_events
from .._kernel._journal import (
    JOURNAL_DIRS,
    KernelLine,
    journal_access,
    read_boot_id,
    read_journal,
    read_journal_boot,
    read_kmsg,
    valid_cursor,
)
from .._monitor._recovery import (
    Baseline,
    LogSource,
    Readings,
    RecoveredKill,
    RowMark,
    Watermark,
    covers,
    kernel_kills,
    merge_marks,
    plan_recovery,
    unit_of_memcg,
)
from .._registry._registry import OomRecording, Registry
from ._fleet_registry import FleetPart

# A kill's event (the monitor's events module) is made only for a kill found:
# an open with nothing to recover (every ``agentscope ls``) never imports it.
if TYPE_CHECKING:
    from .._events import OomKill
    from .._monitor._monitor import Monitor
    from ._fleet_registry import FleetCore

__all__ = ["KillMark", "OomRecovery", "read_baseline"]

log = logging.getLogger("agentscope")
KMSG: Final = Path("/dev/kmsg")


def read_baseline(slice_dir: Path) -> Baseline:
    """Read the counters; again while the slice's moved during the scan (a kill meanwhile)."""
    for _ in range(3):
        first = _slice_counter(slice_dir)
        scopes = _scope_counters(slice_dir)
        again = _slice_counter(slice_dir)
        if first == again:
            break
    inode, count = again
    return Baseline(inode, count, scopes)


def _scope_counters(slice_dir: Path) -> dict[str, int]:
    """Each scope's ``oom_kill``: one file a scope (scopes that vanish are left out)."""
    try:
        with os.scandir(slice_dir) as it:
            names = [e.name for e in it if e.name.endswith(".scope")]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    counters: dict[str, int] = {}
    for name in names:
        raw = _read_kernel_file(f"{slice_dir}/{name}/memory.events")
        if raw is not None:
            counters[name] = parse_memory_events(raw).oom_kill
    return counters


def _slice_counter(slice_dir: Path) -> tuple[int | None, int]:
    try:
        inode = os.stat(slice_dir).st_ino
    except FileNotFoundError:
        return None, 0
    raw = _read_kernel_file(slice_dir / "memory.events")
    return (None, 0) if raw is None else (inode, parse_memory_events(raw).oom_kill)


def _recovered_event(kill: RecoveredKill, now: float) -> OomKill:
    """A recovered kill as the monitor's event (its module imported for a kill found only)."""
    from .._events import OomKill

    return OomKill(
        now, kill.agent, kill.unit, kill.pid, kill.comm, kill.rss, kill.source, recovered=True
    )


@dataclass(frozen=True, slots=True)
class KillMark:
    """What one live kill accounts for: the monitor's counters once it is recorded."""

    boot: str
    slice_cgroup: str
    baseline: Baseline


def _read_log(
    stored: Watermark | None, boot: str, kmsg: Path | None, journal: bool
) -> tuple[LogSource | None, list[KernelLine], str | None]:
    """The kernel log after the stored position: (source, lines, position read up to)."""
    if kmsg is not None:
        after: int | None = None
        if stored is not None and stored.log_source == "kmsg":
            pos = stored.log_position or ""
            # Another boot's sequence numbers mean nothing here: all of this boot is new.
            after = (
                int(pos)
                if stored.boot == boot and _numbers.is_digits(pos) and len(pos) <= 20
                else -1
            )
        got = read_kmsg(after, kmsg)
        if got is not None:
            lines = list(got.lines)
            if stored is not None and stored.boot != boot and journal:
                # The kmsg holds this boot only: the boot before's kills are
                # in the journal (read once: the watermark moves to this boot;
                # kills recorded then are known by their pids).
                lines = [*_boot_before(stored.boot), *lines]
            return "kmsg", lines, None if got.last_seq is None else str(got.last_seq)
    if journal and journal_access(JOURNAL_DIRS).readable:
        cursor = None
        if stored is not None and stored.log_source == "journal":
            where = stored.log_position
            cursor = where if where is not None and valid_cursor(where) else None
        read = read_journal(cursor)
        if read is not None:
            return "journal", list(read.lines), read.cursor
    return None, [], None


def _boot_before(boot: str) -> tuple[KernelLine, ...]:
    """The journal's kernel messages of ``boot``, where this process may read them."""
    if not journal_access(JOURNAL_DIRS).readable:
        return ()
    try:
        read = read_journal_boot(boot)
    except ValueError:  # a stored boot id that is not one never reaches the argv
        return ()
    return () if read is None else read.lines


class OomRecovery(FleetPart):
    """The fleet's part that recovers OOM kills and stores the live ones with their counters.

    Held by the fleet: :meth:`recover` at its open, :meth:`on_monitor_start`
    when a monitor takes its baseline, :meth:`note_live_kill` and
    :meth:`store_live_kill` for each kill a monitor reports.
    """

    #: Where the kernel log is read from (None: not at all); the tests' seam.
    kmsg_path: Path | None = KMSG
    read_journal: bool = True

    def __init__(self, core: FleetCore) -> None:
        super().__init__(core)
        # Live kills emitted by a monitor and not stored yet, by unit: what a
        # stored watermark must not claim yet. Stored one at a time, in order.
        self._oom_inflight: dict[str | None, int] = {}
        self._oom_lock = asyncio.Lock()
        self._kill_marks: weakref.WeakKeyDictionary[Monitor, KillMark] = weakref.WeakKeyDictionary()

    async def on_monitor_start(self, mon: Monitor, baseline: Baseline) -> list[OomKill]:
        """A monitor's start: recover against its baseline sample (so nothing falls between)."""
        slice_dir = await self._manager.slice_cgroup()
        try:
            inode = (await asyncio.to_thread(os.stat, slice_dir)).st_ino
        except OSError:
            inode = None
        baseline = replace(baseline, slice_inode=inode)
        kills = await self.recover(baseline)
        mark = await self._kill_mark(baseline)
        if mark is not None:
            self._kill_marks[mon] = mark
        return kills

    def note_live_kill(self, event: OomKill) -> None:
        """A monitor emitted a live kill (on the loop, at once): in flight until stored."""
        self._oom_inflight[event.unit] = self._oom_inflight.get(event.unit, 0) + 1

    async def store_live_kill(
        self,
        mon: Monitor | None,
        event: OomKill,
        agent: str | None,
        detail: Mapping[str, Any],
        ts: float | None = None,
    ) -> None:
        """Store a live kill with the monitor's counters, less the kills still in flight.

        Without a monitor (``mon`` None) the kill alone is recorded."""
        registry = self._store.registry
        async with self._oom_lock:
            left = self._oom_inflight.get(event.unit, 0) - 1
            if left > 0:
                self._oom_inflight[event.unit] = left
            else:
                self._oom_inflight.pop(event.unit, None)
            if registry is None:
                return
            if mon is None:
                await asyncio.to_thread(
                    self._record_live_kill, registry, agent, detail, None, None, ts
                )
                return
            now = mon.accounted()
            others = sum(self._oom_inflight.values())
            scopes = {u: n - self._oom_inflight.get(u, 0) for u, n in now.scopes.items()}
            accounted = Baseline(None, now.slice_oom_kill - others, scopes)
            mark = self._kill_marks.get(mon)
            await asyncio.to_thread(
                self._record_live_kill, registry, agent, detail, mark, accounted, ts
            )

    async def recover(self, baseline: Baseline | None = None) -> list[OomKill]:
        """Record, once, the OOM kills since this fleet last accounted for them.

        Never fails the caller: a registry or kernel file it cannot read is
        logged, and the next open tries again.
        """
        registry = self._store.registry
        if registry is None:
            return []
        slice_dir = await self._manager.slice_cgroup()
        try:
            return await asyncio.to_thread(self._recover_sync, registry, slice_dir, baseline)
        except (OSError, ValueError, RegistryError) as exc:
            log.warning("could not recover the OOM kills of fleet %s: %s", self.name, exc)
            return []

    def _slice_relpath(self, slice_dir: Path) -> str:
        # The process mode's scopes are a mirror outside the cgroup tree
        # (_procscopes.py): no kernel line names it, so no kill is ever matched.
        if not slice_dir.is_relative_to(self._manager.cgroup_root):
            return str(slice_dir)
        return "/" + str(slice_dir.relative_to(self._manager.cgroup_root))

    def _recover_sync(
        self, registry: Registry, slice_dir: Path, baseline: Baseline | None
    ) -> list[OomKill]:
        raw = registry.oom_mark(self.name)
        stored = None if raw is None else Watermark.from_json(raw)
        boot = read_boot_id()
        counters = baseline if baseline is not None else read_baseline(slice_dir)
        slice_rel = self._slice_relpath(slice_dir)
        quiet = (
            stored is not None
            and (stored.boot, stored.slice_cgroup, stored.slice_inode)
            == (boot, slice_rel, counters.slice_inode)
            and counters.slice_oom_kill <= stored.slice_oom_kill
        )
        lines: list[KernelLine]
        if quiet and stored is not None:
            # Every kill raises the slice's counter: none since the watermark, so
            # the kernel's log has nothing to name (and is not read: it costs).
            source, lines, position = stored.log_source, [], stored.log_position
        else:
            source, lines, position = _read_log(stored, boot, self.kmsg_path, self.read_journal)
        found = tuple(kernel_kills(lines))
        readings = Readings(
            boot,
            slice_rel,
            counters.slice_inode,
            counters.slice_oom_kill,
            counters.scopes,
            found,
            source,
            position,
        )
        units = {u for k in found if (u := unit_of_memcg(k.memcg, slice_rel)) is not None}
        kills: list[OomKill] = []
        prefix = f"agentscope-{self.name}-"

        def planner(
            stored_raw: str | None,
            rows: Mapping[str, tuple[str, int]],
            recorded: Mapping[str, frozenset[int]],
        ) -> OomRecording:
            current = None if stored_raw is None else Watermark.from_json(stored_raw)
            marks = {u: RowMark(n, s) for u, (n, s) in rows.items()}
            plan = plan_recovery(readings, current, marks, recorded, fleet_prefix=prefix)
            now = time.time()
            kills.clear()
            events: list[tuple[str | None, dict[str, Any]]] = []
            for k in plan.kills:
                event = _recovered_event(k, now)
                kills.append(event)
                detail = event.to_dict()
                detail.pop("kind")
                detail.pop("agent")
                events.append((k.agent, detail))
            return OomRecording(events, plan.seen, plan.watermark.to_json())

        registry.recover_oom_kills(self.name, units, planner)
        if kills:
            log.warning(
                "fleet %s: %d OOM kill(s) while no monitor ran, recorded now",
                self.name,
                len(kills),
            )
        return kills

    async def _kill_mark(self, baseline: Baseline) -> KillMark | None:
        """What a monitor's live kills are stored with (None: the boot id cannot be read)."""
        slice_dir = await self._manager.slice_cgroup()
        try:
            boot = await asyncio.to_thread(read_boot_id)
            return KillMark(boot, self._slice_relpath(slice_dir), baseline)
        except (OSError, ValueError):  # no boot id; a slice outside the bus's cgroup root
            return None

    def _record_live_kill(
        self,
        registry: Registry,
        agent: str | None,
        detail: Mapping[str, Any],
        mark: KillMark | None,
        accounted: Baseline | None,
        ts: float | None = None,
    ) -> None:
        """Record a kill the monitor saw, with the counters it accounts for (worker thread).

        Dated ``ts``, as the monitor dated it (``events --json`` and
        ``monitor --json`` print one event alike), or now."""
        unit = detail.get("unit")
        seen = None
        if accounted is not None and isinstance(unit, str):
            seen = accounted.scopes.get(unit)

        def reading(stored_raw: str | None) -> tuple[Watermark | None, Watermark]:
            """The stored watermark, and this kill's counters as one."""
            stored = None if stored_raw is None else Watermark.from_json(stored_raw)
            assert mark is not None
            assert accounted is not None
            new = Watermark(
                mark.boot,
                mark.slice_cgroup,
                mark.baseline.slice_inode,
                accounted.slice_oom_kill,
                {u: n for u, n in accounted.scopes.items() if n > 0},
            )
            if stored is not None:  # the log's position is the recovery's to move
                new = replace(new, log_source=stored.log_source, log_position=stored.log_position)
            return stored, new

        def merge(stored_raw: str | None) -> str:
            return merge_marks(*reading(stored_raw)).to_json()

        def covered(stored_raw: str | None) -> bool:
            # Another process's reading of this boot's slice counted this kill.
            return covers(*reading(stored_raw))

        use = mark is not None and accounted is not None
        registry.record_oom_kill(
            self.name,
            agent,
            detail,
            seen=seen,
            merge=merge if use else None,
            covered=covered if use else None,
            ts=ts,
        )
