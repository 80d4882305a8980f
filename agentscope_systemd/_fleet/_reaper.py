"""Leftovers: the processes an agent's scope holds after its main process ended.

A scope lives as long as any process in it, so MCP servers, ``cmd &`` jobs
and daemons that called ``setsid`` keep an ended agent's scope and memory.
The rule, one place for every path (launched, adopted, exec'd, tmux):

- while the main process runs, nothing is done;
- when it is seen gone and the scope still holds processes, the row
  *lingers*: it stays open with the time it was seen (``lingering``) and a
  ``lingering`` event, and ``agents()`` shows the state ``lingering`` with
  the number of ``leftovers``;
- ``reap_after`` seconds later (per launch, default 10; ``"keep"``: never)
  the leftovers are stopped with the scope's stop job (SIGTERM, SIGKILL
  after 5 s) and one ``reaped`` event names them (pid, comm, RSS); the row
  then closes as ``exited`` with the main process's status.

:func:`decide` is the rule (no I/O); :class:`Reaper` (a part
:class:`._fleet.AsyncFleet` holds) applies it wherever an exit can be seen: the
fleet's own exit watch (its pidfd), reconciliation at open, ``agents()``
and a monitor's tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._errors import AgentscopeError, InvalidTransition, RegistryError
from .._kernel._cgroup import read_subtree_procs
from .._kernel._proc import PROC_ROOT, read_stat, read_statm_rss, same_process
from .._managers._scopeprops import DEFAULT_REAP_AFTER, parse_reap_after
from .._registry._registry import AgentRecord
from ._fleet_registry import FleetPart

if TYPE_CHECKING:
    from ._fleet_registry import FleetCore

__all__ = [
    "DEFAULT_REAP_AFTER",
    "MAX_NAMED",
    "Decision",
    "Leftover",
    "Reaper",
    "decide",
    "main_alive",
    "parse_reap_after",
    "read_leftovers",
]

log = logging.getLogger("agentscope")

MAX_NAMED = 64
"""Leftovers named in one event at most (the count covers them all)."""
STOP_TIMEOUT = 5.0  # seconds from SIGTERM to SIGKILL when reaping

Decision = Literal["none", "running", "linger", "wait", "keep", "reap"]


@dataclass(frozen=True, slots=True)
class Leftover:
    """A process left in an agent's scope: ``rss`` in bytes (None: unreadable)."""

    pid: int
    comm: str
    rss: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "comm": self.comm, "rss": self.rss}


def decide(
    rec: AgentRecord,
    *,
    main_alive: bool,
    leftovers: int,
    now: float,
    lingered: float | None = None,
) -> Decision:
    """What to do about an open row's scope, from what was read of it; no I/O.

    ``main_alive``: its main process (pid and start time) still runs;
    ``leftovers``: the other processes its scope holds. ``none``: nothing
    to do here (closed, or the scope is empty and ends by itself);
    ``running``: the agent runs; ``linger``: record that it lingers;
    ``wait``: it lingers, not yet due; ``keep``: it lingers and is kept;
    ``reap``: stop its leftovers now. ``lingered``: the seconds it has
    lingered by a monotonic clock; without it, ``now - rec.lingering``.
    """
    if rec.closed or rec.state in ("starting", "stopping"):
        return "none"  # a launch in flight is its launcher's; a stop (or reap) is under way
    if main_alive:
        return "running"
    if leftovers == 0:
        return "none"
    if rec.lingering is None:
        return "linger"
    if rec.reap_after is None:
        return "keep"
    elapsed = now - rec.lingering if lingered is None else lingered
    return "reap" if elapsed >= rec.reap_after else "wait"


def main_alive(rec: AgentRecord, proc_root: Path = PROC_ROOT) -> bool:
    """Whether the row's main process runs: same pid and start time, not a zombie."""
    return same_process(rec.pid, rec.start_time, proc_root) is not None


def read_leftovers(
    scope_dir: Path, main_pid: int, proc_root: Path = PROC_ROOT
) -> tuple[Leftover, ...] | None:
    """The processes of a scope other than ``main_pid``; None when the scope is gone.

    Processes that end mid-read are left out; zombies too (they hold no
    memory and leave with their parent).
    """
    try:
        data = read_subtree_procs(scope_dir)  # a delegated scope's are in its leaves
    except OSError:
        return None
    if data is None:
        return None
    out: list[Leftover] = []
    for pid in map(int, data.split()):
        if pid == main_pid:
            continue
        st = read_stat(pid, proc_root)
        if st is None or st.state in ("Z", "X"):
            continue
        out.append(Leftover(pid, st.comm, read_statm_rss(pid, proc_root)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Seen:
    rec: AgentRecord
    alive: bool
    leftovers: tuple[Leftover, ...] | None


def _look(slice_dir: Path, rows: Sequence[AgentRecord]) -> list[_Seen]:
    """Each row's main process and leftovers (a worker thread: many small files).

    A scope that holds its main process alone (most of them) costs one read.
    """
    out = []
    for r in rows:
        if r.closed or r.state == "starting":
            continue
        try:
            raw = read_subtree_procs(slice_dir / r.unit)
            if raw is None:
                raise FileNotFoundError(r.unit)
            procs = raw.split()
        except OSError:
            out.append(_Seen(r, False, None))  # gone: the listing closes its row
            continue
        if not procs or procs == [str(r.pid).encode()]:
            out.append(_Seen(r, True, ()))  # nothing left over, whatever its main does
            continue
        out.append(_Seen(r, main_alive(r), read_leftovers(slice_dir / r.unit, r.pid)))
    return out


class Reaper(FleetPart):
    """The part of AsyncFleet that applies the rule; it owns the reaps due while it is open.

    :meth:`sweep` judges rows (the fleet's open ones by default),
    :meth:`main_exited` an exit the fleet saw, :meth:`tick` is a monitor's
    (at most once a second), :meth:`close` cancels the reaps still due.
    """

    def __init__(self, core: FleetCore) -> None:
        super().__init__(core)
        self._closed = False
        # Lingering agents' reaps due while the fleet is open.
        self._reap_timers: dict[str, asyncio.TimerHandle] = {}
        # unit -> time.monotonic() when this fleet first saw it lingering.
        self._linger_seen: dict[str, float] = {}
        self._last_sweep = 0.0

    async def tick(self) -> None:
        """A monitor's tick: leftovers of agents that ended unseen (at most once a second)."""
        loop = asyncio.get_running_loop()
        if self._closed or self._store.registry is None or loop.time() - self._last_sweep < 1.0:
            return
        self._last_sweep = loop.time()
        try:
            await self.sweep()
        except (AgentscopeError, OSError) as exc:
            log.warning("could not look for leftovers: %s", exc)

    async def sweep(
        self, rows: Iterable[AgentRecord] | None = None
    ) -> dict[str, tuple[AgentRecord, int]]:
        """Apply the rule to ``rows`` (default: the fleet's open rows).

        Returns each lingering (or reaped) row as it is now, with the number
        of leftovers seen, by unit.
        """
        if self._store.registry is None:
            return {}
        if rows is None:
            rows = await self._store.call(self._store.registry.agents, self.name)
        todo = [r for r in rows if not r.closed and r.state != "starting"]
        if not todo:
            return {}
        slice_dir = await self._manager.slice_cgroup()
        seen = await asyncio.to_thread(_look, slice_dir, todo)
        counts: dict[str, tuple[AgentRecord, int]] = {}
        for s in seen:
            if s.leftovers is None:
                continue  # its scope is gone: the listing closes its row
            rec, n = s.rec, len(s.leftovers)
            decision = decide(
                rec, main_alive=s.alive, leftovers=n, now=_now(), lingered=self._lingered(rec)
            )
            if decision == "linger":
                # Launched here, its status is known even if its exit watch has not run yet.
                known = self._roster.agents.get(rec.name)
                popen = known.popen if known is not None and known.unit == rec.unit else None
                status = popen.poll() if popen is not None else None
                rec = await self._linger(rec, status, s.leftovers)
                decision = decide(
                    rec, main_alive=False, leftovers=n, now=_now(), lingered=self._lingered(rec)
                )
            if decision == "wait":
                self._schedule_reap(rec)
            elif decision == "reap":
                await self._reap(rec, s.leftovers)
                now_rec = await self._store.call(self._store.registry.by_unit, rec.unit)
                rec = now_rec if now_rec is not None else rec
            if decision in ("wait", "keep", "reap"):
                counts[rec.unit] = (rec, n)
        return counts

    async def main_exited(self, unit: str, pid: int, status: int | None) -> bool:
        """The fleet saw ``pid``, the main process of ``unit``, end: lingers it?

        True when the scope still holds processes (the row stays open,
        lingering); False when the scope is empty or gone (the caller
        records a plain exit).
        """
        slice_dir = await self._manager.slice_cgroup()
        left = await asyncio.to_thread(read_leftovers, slice_dir / unit, pid)
        if not left:
            return False
        assert self._store.registry is not None
        rec = await self._store.call(self._store.registry.by_unit, unit)
        if rec is None or rec.closed:
            return False
        rec = await self._linger(rec, status, left)
        lingered = self._lingered(rec)
        if (
            decide(rec, main_alive=False, leftovers=len(left), now=_now(), lingered=lingered)
            == "reap"
        ):
            await self._reap(rec, left)
        else:
            self._schedule_reap(rec)
        return True

    async def _linger(
        self, rec: AgentRecord, status: int | None, left: Sequence[Leftover]
    ) -> AgentRecord:
        assert self._store.registry is not None
        detail = {
            "unit": rec.unit,
            "pid": rec.pid,
            "status": status,
            "leftovers": len(left),
            "reap_after": "keep" if rec.reap_after is None else rec.reap_after,
        }
        rec = await self._store.call(
            self._store.registry.note_lingering, rec.unit, status, detail=detail
        )
        log.info(
            "agent %s (%s) ended and left %d process(es) in its scope: %s",
            rec.name,
            rec.unit,
            len(left),
            "kept" if rec.reap_after is None else f"stopped after {rec.reap_after:g} s",
        )
        return rec

    def _lingered(self, rec: AgentRecord) -> float | None:
        """Seconds ``rec`` has lingered by the monotonic clock, as this fleet saw it (#31).

        Counted from when this fleet first saw it lingering, never from the
        wall clock: a clock set forward must not reap early, nor one set
        back keep leftovers on. A grace another process began starts again
        in full here: never shorter than asked. None: not lingering.
        """
        if rec.lingering is None or rec.closed:
            self._linger_seen.pop(rec.unit, None)
            return None
        if len(self._linger_seen) > _MAX_SEEN and rec.unit not in self._linger_seen:
            self._linger_seen.pop(next(iter(self._linger_seen)))
        return _mono() - self._linger_seen.setdefault(rec.unit, _mono())

    def _schedule_reap(self, rec: AgentRecord) -> None:
        """Look again when ``rec``'s grace is over (while this fleet stays open)."""
        if rec.reap_after is None or rec.lingering is None or self._closed:
            return
        if rec.unit in self._reap_timers:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, rec.reap_after - (self._lingered(rec) or 0.0))

        def due() -> None:
            self._reap_timers.pop(rec.unit, None)
            if self._closed:
                return
            task = loop.create_task(self._reap_due(rec.unit))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._reap_timers[rec.unit] = loop.call_later(delay + 0.05, due)

    async def _reap_due(self, unit: str) -> None:
        if self._store.registry is None:
            return
        try:
            rec = await self._store.call(self._store.registry.by_unit, unit)
            if rec is not None and not rec.closed:
                await self.sweep([rec])
        except (AgentscopeError, OSError) as exc:
            log.warning("could not reap the leftovers of %s: %s", unit, exc)

    async def _reap(self, rec: AgentRecord, left: Sequence[Leftover]) -> None:
        """Stop the scope of a lingering row and report what it held, once."""
        assert self._store.registry is not None
        rss = [p.rss for p in left if p.rss is not None]
        detail = {
            "unit": rec.unit,
            "pid": rec.pid,
            "status": rec.exit_status,
            "after": rec.reap_after,
            "count": len(left),
            "rss": sum(rss),
            "processes": [p.to_dict() for p in left[:MAX_NAMED]],
        }
        if not await self._store.call(self._store.registry.claim_reap, rec.unit, detail=detail):
            return  # another process (or task) reaps it
        names = ", ".join(f"{p.comm} ({p.pid})" for p in left[:8])
        log.warning(
            "reaping %d process(es) agent %s left in %s: %s", len(left), rec.name, rec.unit, names
        )
        result = await self._manager.stop_unit(rec.unit, STOP_TIMEOUT)
        if result != "done":
            log.warning("the stop job of %s ended %r: its leftovers may run on", rec.unit, result)
            return
        try:
            await self._store.call(self._store.mark_exited, rec.unit, rec.pid, rec.exit_status)
        except InvalidTransition:
            pass  # closed meanwhile by a listing that saw the scope go
        except RegistryError as exc:
            log.warning("could not record the end of %s: %s", rec.unit, exc)
        agent = self._roster.agents.get(rec.name)
        if agent is not None and agent.unit == rec.unit:
            agent.state = "exited"

    def close(self) -> None:
        """The fleet closes: no more reaps from here (the next open or monitor does them)."""
        self._closed = True
        for handle in self._reap_timers.values():
            handle.cancel()
        self._reap_timers.clear()


def _now() -> float:
    return time.time()


def _mono() -> float:
    return time.monotonic()


#: Lingering units whose first sight a fleet remembers (the oldest is forgotten).
_MAX_SEEN = 4096
