"""The guard's scan of the agents slice: every process sized by what is charged for it.

- :func:`scan_slice_processes` lists the processes of every scope under the
  slice (recursively), sized by VmRSS + VmSwap; :func:`scan_candidates` does
  the same for only the scopes that can hold the largest process (a scope
  whose charge is smaller than a process already found cannot), which is
  what the guard runs near its threshold: its cost follows the runaway's
  scope, not the slice's size.
- A process whose main thread has exited (a zombie leader whose other
  threads run) shows no ``VmRSS`` in its ``status`` and is state ``Z``: it
  is sized, and judged alive or dying, by one of its live threads
  (``/proc/PID/task/TID``).
- A cgroup that cannot be listed (a threaded cgroup's ``cgroup.procs``
  fails with EOPNOTSUPP; its processes are listed by its threaded domain)
  costs that cgroup only: the scan goes on and says which it skipped.
- :func:`choose_victim` applies the victim rule of docs/guard.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._fleet._tmux import is_tmux_unit
from .._kernel._cgroup import _GONE_OR_NOT_DIR, _read_kernel_file, parse_procs, read_charge
from .._kernel._proc import PROC_ROOT, ProcStat, parse_stat, read_oom_score_adj

__all__ = [
    "Scan",
    "ScopeCharge",
    "SliceProcess",
    "Victim",
    "choose_victim",
    "pick_victim",
    "scan_candidates",
    "scan_slice_processes",
]

#: A process never chosen: the kernel's own "unkillable" mark.
OOM_SCORE_ADJ_MIN = -1000
#: VmRSS counts file pages charged to other cgroups (shared libraries): a
#: scope may show a process this much larger than the scope's own charge.
SHARED_SLACK = 64 << 20
#: Threads looked at for a process whose main thread exited.
MAX_THREADS_LOOKED = 16
#: Start times remembered between scans (past this, forgotten at once).
KNOWN_KEPT = 65536
#: Open files looked at per process for a memfd.
MAX_FDS_LOOKED = 1024

OnSkip = Callable[[str, OSError], None]


@dataclass(frozen=True, slots=True)
class SliceProcess:
    """One process of an agent scope, as the guard sized it (bytes).

    ``unit`` is the scope directly under the agents slice that holds it (at
    any depth); ``eligible`` False for the processes that are never chosen
    (protected, the guard's own, ``oom_score_adj`` -1000, already dying).
    """

    pid: int
    start_time: int
    comm: str
    unit: str
    rss: int
    swap: int
    eligible: bool = True
    hidden: int = 0

    @property
    def size(self) -> int:
        """RSS + swap (+ ``hidden``: memfds it holds unmapped): what killing it gives back."""
        return self.rss + self.swap + self.hidden


@dataclass(frozen=True, slots=True)
class Victim:
    """The process to kill; ``main`` is its agent's main process (may be the victim itself)."""

    process: SliceProcess
    main: SliceProcess
    runaway: SliceProcess

    @property
    def is_main(self) -> bool:
        """The agent's main process itself is the victim."""
        return self.process.pid == self.main.pid


@dataclass(frozen=True, slots=True)
class ScopeCharge:
    """A scope's charge (``memory.current`` + ``memory.swap.current``, bytes; None: unread)."""

    unit: str
    path: str
    charge: int | None


@dataclass(frozen=True, slots=True)
class Scan:
    """What :func:`scan_candidates` found: the processes of the scopes it read."""

    processes: list[SliceProcess]
    scopes: list[ScopeCharge]
    scanned: frozenset[str] = field(default_factory=frozenset)
    #: Memory charged to a scope and held by none of its processes (tmpfs
    #: files): (unit, bytes), when it outweighs every process; killing frees none.
    unheld: tuple[str, int] | None = None


def scopes_of(slice_path: Path | str) -> list[tuple[str, str]]:
    """(unit, path) of each ``*.scope`` directly under the slice; [] without the slice."""
    try:
        with os.scandir(slice_path) as it:
            return sorted((e.name, e.path) for e in it if e.name.endswith(".scope"))
    except OSError as exc:
        if exc.errno in _GONE_OR_NOT_DIR:
            return []
        raise


def _scope_procs(scope: str, on_skip: OnSkip | None) -> Iterable[int]:
    """Every pid in the cgroup ``scope`` and its sub-cgroups.

    Vanished cgroups are skipped; one that cannot be read is skipped and
    told to ``on_skip`` (a threaded cgroup's ``cgroup.procs``: EOPNOTSUPP).
    """
    stack = [scope]
    while stack:
        path = stack.pop()
        try:
            data = _read_kernel_file(path + "/cgroup.procs")
        except OSError as exc:
            data = None
            if on_skip is not None:
                on_skip(path, exc)
        if data is not None:
            yield from parse_procs(data)
        try:
            with os.scandir(path) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except OSError as exc:
            if exc.errno not in _GONE_OR_NOT_DIR and on_skip is not None:
                on_skip(path, exc)


def _kb_after(data: bytes, key: bytes) -> int | None:
    """The number after ``key`` (``b"\\nVmRSS:"``) in a ``status``, in bytes; None: no line."""
    at = data.find(key)
    if at < 0:
        return None
    end = data.find(b"\n", at + len(key))
    value = data[at + len(key) : end if end >= 0 else len(data)].split()
    return int(value[0]) << 10 if value and value[0].isdigit() else None


def _vm_sizes(data: bytes) -> tuple[int, int] | None:
    """(VmRSS, VmSwap) bytes from a ``status``; None when it has no VmRSS line."""
    rss = _kb_after(data, b"\nVmRSS:")
    return None if rss is None else (rss, _kb_after(data, b"\nVmSwap:") or 0)


def measure(pid: int, proc_root: Path = PROC_ROOT) -> tuple[ProcStat, int, int] | None:
    """A process's stat and (VmRSS, VmSwap), or None when it is gone.

    A main thread that exited (state Z, no VmRSS) while other threads run
    is measured by a live thread: its memory is the group's, and it is not
    dying. A real zombie measures (0, 0).

    Raises:
        OSError: other than the process vanishing.
    """
    base = f"{os.fspath(proc_root)}/{pid}"
    raw = _read_kernel_file(base + "/stat")
    status = _read_kernel_file(base + "/status")
    if raw is None or status is None:
        return None
    stat = parse_stat(raw)
    sizes = _vm_sizes(status)
    if sizes is None or stat.state == "Z":
        live = _live_thread(base, pid)
        if live is not None:
            tstat, tsizes = live
            stat = replace(stat, state=tstat.state, flags=tstat.flags, signals=tstat.signals)
            sizes = tsizes
    rss, swap = sizes if sizes is not None else (0, 0)
    return stat, rss, swap


def _live_thread(base: str, pid: int) -> tuple[ProcStat, tuple[int, int]] | None:
    """A thread of ``pid`` other than its main one that is not a zombie, measured."""
    try:
        tids = [int(n) for n in os.listdir(base + "/task") if n.isdigit() and int(n) != pid]
    except OSError as exc:
        if exc.errno in _GONE_OR_NOT_DIR:
            return None
        raise
    for tid in sorted(tids)[:MAX_THREADS_LOOKED]:
        raw = _read_kernel_file(f"{base}/task/{tid}/stat")
        status = _read_kernel_file(f"{base}/task/{tid}/status")
        if raw is None or status is None:
            continue
        tstat = parse_stat(raw)
        sizes = _vm_sizes(status)
        if tstat.state not in ("Z", "X", "x") and sizes is not None:
            return tstat, sizes
    return None


def _scan_scope(
    unit: str,
    path: str,
    proc_root: Path,
    shielded: bool,
    protected_pids: Collection[int],
    on_skip: OnSkip | None,
) -> list[SliceProcess]:
    own = os.getpid()
    found = []
    for pid in _scope_procs(path, on_skip):
        measured = measure(pid, proc_root)
        if measured is None:
            continue  # exited meanwhile
        stat, rss, swap = measured
        eligible = not (shielded or pid == own or pid in protected_pids or stat.dying)
        found.append(SliceProcess(pid, stat.start_time, stat.comm, unit, rss, swap, eligible))
    return found


def _unkillable(p: SliceProcess, proc_root: Path) -> bool:
    adj = read_oom_score_adj(p.pid, proc_root)
    return adj is None or adj <= OOM_SCORE_ADJ_MIN


def scan_slice_processes(
    slice_path: Path,
    proc_root: Path = PROC_ROOT,
    *,
    protected_pids: Collection[int] = (),
    protected_units: Collection[str] = (),
    on_skip: OnSkip | None = None,
) -> list[SliceProcess]:
    """Every process of every scope under the agents slice, sized, for :func:`choose_victim`.

    Reads each ``*.scope`` directly under ``slice_path`` and its sub-cgroups
    (``cgroup.procs``), then for each pid ``stat``, ``status`` (VmRSS,
    VmSwap) and ``oom_score_adj``. Processes and cgroups that vanish
    meanwhile are left out, and so is a cgroup that cannot be read (told to
    ``on_skip``); a missing slice gives ``[]``. Protected pids, scopes in
    ``protected_units`` and every fleet's tmux server scope, the caller's own
    process, ``oom_score_adj`` -1000 and processes already dying are listed
    with ``eligible=False`` (they still count for which process is an
    agent's main one).

    Raises:
        OSError: other than processes or cgroups vanishing.
    """
    found: list[SliceProcess] = []
    for unit, path in scopes_of(slice_path):
        shielded = unit in protected_units or is_tmux_unit(unit)
        for p in _scan_scope(unit, path, proc_root, shielded, protected_pids, on_skip):
            if p.eligible and _unkillable(p, proc_root):
                p = replace(p, eligible=False)
            found.append(p)
    return found


def _sizes(pid: int, proc_root: Path) -> tuple[int, int, int] | None:
    """(VmRSS, VmSwap, RssShmem) from one read of ``status``; a zombie leader via its threads."""
    status = _read_kernel_file(f"{os.fspath(proc_root)}/{pid}/status")
    if status is None:
        return None
    sizes = _vm_sizes(status)
    if sizes is not None and b"\nState:\tZ" not in status:
        return (*sizes, _kb_after(status, b"\nRssShmem:") or 0)
    measured = measure(pid, proc_root)
    return None if measured is None else (measured[1], measured[2], 0)


def scan_candidates(
    slice_path: Path,
    proc_root: Path = PROC_ROOT,
    *,
    floor: int = 0,
    protected_pids: Collection[int] = (),
    protected_units: Collection[str] = (),
    excluded: Collection[tuple[int, int]] = (),
    on_skip: OnSkip | None = None,
    known: dict[int, tuple[int, str]] | None = None,
    members: Callable[[str], Iterable[int]] | None = None,
) -> Scan:
    """The processes of the scope that holds the largest eligible process.

    First every process is sized from one read of its ``status``, scope by
    scope in the order of their charge (largest first); a scope whose
    charge (plus :data:`SHARED_SLACK`) is below both ``floor`` and the
    largest process found so far is not read, nor any after it. Then only
    the largest one's scope is read whole (``stat``: start times, for its
    main process; whether it is dying): when the largest turns out not
    eligible (dying, a past victim in ``excluded``, ``oom_score_adj``
    -1000), the next largest is taken. Processes smaller than ``floor`` are
    ineligible. :func:`pick_victim` then applies the victim rule to
    :attr:`Scan.processes`, the runaway's scope. ``known`` (pid -> (start
    time, comm)), kept by the caller from one scan to the next, spares the
    ``stat`` of the processes seen before (a pid reused since is caught:
    the runaway's and the victim's ``stat`` are read afresh). ``members``
    gives a scope directory's pids in place of its ``cgroup.procs``: in
    process mode, the agent's process tree now (:mod:`._proctrees`).

    Memory charged to a scope and mapped by none of its processes (its
    ``memory.stat`` ``shmem`` less their ``RssShmem``: memfds, tmpfs
    files) is the scope's: when it outweighs the largest process, the
    scope's processes that hold a memfd open carry it (killing them gives
    it back); when none does (tmpfs files, which no kill frees)
    :attr:`Scan.unheld` says so and the largest process is chosen as ever.

    Raises:
        OSError: other than processes or cgroups vanishing.
    """
    scopes = [
        ScopeCharge(unit, path, read_charge(path))
        for unit, path in scopes_of(slice_path)
        if unit not in protected_units and not is_tmux_unit(unit)
    ]
    order = sorted(scopes, key=lambda s: -(s.charge if s.charge is not None else 1 << 62))
    own = os.getpid()
    sized: dict[str, list[tuple[int, int, int, int]]] = {}  # unit -> (pid, rss, swap, shmem)
    refused: set[int] = set()
    unheld: tuple[str, int] | None = None
    while True:
        best: tuple[int, int, ScopeCharge] | None = None  # (size, pid, scope)
        for scope in order:
            limit = max(best[0] if best else 0, floor)
            if scope.charge is not None and scope.charge + SHARED_SLACK < limit:
                break
            if scope.unit not in sized:
                entries = []
                pids = _scope_procs(scope.path, on_skip) if members is None else members(scope.path)
                for pid in pids:
                    sizes = _sizes(pid, proc_root)
                    if sizes is not None:
                        entries.append((pid, *sizes))
                sized[scope.unit] = entries
            for pid, rss, swap, _ in sized[scope.unit]:
                size = rss + swap
                if size < floor or pid in refused or pid == own or pid in protected_pids:
                    continue
                if best is None or (size, -pid) > (best[0], -best[1]):
                    best = (size, pid, scope)
        hidden = {}
        held = _hidden_holder(order, sized, max(best[0] if best else 0, floor), proc_root)
        if held is not None and held[0] not in refused:
            pid, scope, amount = held
            entry = next(e for e in sized[scope.unit] if e[0] == pid)
            best, hidden = (entry[1] + entry[2] + amount, pid, scope), {pid: amount}
        if best is None:
            return Scan([], scopes, frozenset(sized), _unheld(order, sized, floor))
        _, pid, scope = best
        cache = {} if known is None else known
        fresh = _stat_of(pid, proc_root, cache)  # the runaway: its stat now
        procs = []
        for p, rss, swap, _ in sized[scope.unit]:
            stat = cache.get(p) or _stat_of(p, proc_root, cache)
            if stat is None:
                continue  # exited meanwhile
            start, comm = stat
            extra = hidden.get(p, 0)
            eligible = not (
                p == own
                or p in protected_pids
                or rss + swap + extra < floor
                or (p, start) in excluded
                or (p == pid and (fresh is None or _dying(p, proc_root)))
            )
            procs.append(SliceProcess(p, start, comm, scope.unit, rss, swap, eligible, extra))
        runaway = next((p for p in procs if p.pid == pid), None)
        if runaway is None or not runaway.eligible or _unkillable(runaway, proc_root):
            refused.add(pid)
            continue
        if len(cache) > KNOWN_KEPT:
            cache.clear()
        if not hidden:
            unheld = _unheld(order, sized, runaway.size)
        return Scan(procs, scopes, frozenset(sized), unheld)


def _unmapped_shmem(path: str, sized: list[tuple[int, int, int, int]]) -> int:
    """A scope's ``shmem`` (``memory.stat``, bytes) less what its processes map (RssShmem)."""
    try:
        data = _read_kernel_file(path + "/memory.stat")
    except OSError:
        return 0
    if data is None:
        return 0
    data = b"\n" + data
    at = data.find(b"\nshmem ")
    if at < 0:
        return 0
    end = data.find(b"\n", at + 7)
    value = data[at + 7 : end if end >= 0 else len(data)].strip()
    shmem = int(value) if value.isdigit() else 0
    return max(shmem - sum(entry[3] for entry in sized), 0)


def memfd_holders(pids: Iterable[int], proc_root: Path = PROC_ROOT) -> list[int]:
    """The pids among ``pids`` that hold a memfd open (``/proc/PID/fd/N`` -> ``/memfd:...``)."""
    found = []
    for pid in pids:
        base = f"{os.fspath(proc_root)}/{pid}/fd"
        try:
            names = os.listdir(base)[:MAX_FDS_LOOKED]
        except OSError:
            continue  # gone, or another user's
        for name in names:
            try:
                if os.readlink(f"{base}/{name}").startswith("/memfd:"):
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def _hidden_of(
    order: list[ScopeCharge], sized: dict[str, list[tuple[int, int, int, int]]]
) -> list[tuple[int, ScopeCharge]]:
    """(unmapped shmem, scope) of each scope read, the largest first."""
    found = [(_unmapped_shmem(s.path, sized[s.unit]), s) for s in order if s.unit in sized]
    return sorted((f for f in found if f[0] > 0), key=lambda f: -f[0])


def _hidden_holder(
    order: list[ScopeCharge],
    sized: dict[str, list[tuple[int, int, int, int]]],
    over: int,
    proc_root: Path,
) -> tuple[int, ScopeCharge, int] | None:
    """The memfd holder that carries the largest scope's unmapped shmem, when it outweighs ``over``.

    (pid, scope, the shmem); None when no scope's outweighs ``over`` or no
    process of it holds a memfd.
    """
    for amount, scope in _hidden_of(order, sized):
        if amount <= over:
            return None
        entries = {e[0]: e for e in sized[scope.unit]}
        holders = memfd_holders(entries, proc_root)
        if holders:
            pid = max(holders, key=lambda p: (entries[p][1] + entries[p][2], -p))
            return pid, scope, amount
    return None


def _unheld(
    order: list[ScopeCharge], sized: dict[str, list[tuple[int, int, int, int]]], over: int
) -> tuple[str, int] | None:
    """The scope whose unmapped shmem (held by no process) outweighs ``over``."""
    for amount, scope in _hidden_of(order, sized):
        return (scope.unit, amount) if amount > over else None
    return None


def _stat_of(
    pid: int, proc_root: Path, cache: dict[int, tuple[int, str]]
) -> tuple[int, str] | None:
    """(start time, comm) of ``pid`` read now, into ``cache``; None when gone."""
    raw = _read_kernel_file(f"{os.fspath(proc_root)}/{pid}/stat")
    if raw is None:
        cache.pop(pid, None)
        return None
    stat = parse_stat(raw)
    cache[pid] = (stat.start_time, stat.comm)
    return cache[pid]


def _dying(pid: int, proc_root: Path) -> bool:
    """Killed or exiting (a zombie leader whose threads run is not); True when gone."""
    measured = measure(pid, proc_root)
    return measured is None or measured[0].dying


def pick_victim(
    processes: Sequence[SliceProcess], descendant_share: float, proc_root: Path = PROC_ROOT
) -> Victim | None:
    """:func:`choose_victim`, checking the one chosen: not dying, not at -1000.

    Its ``stat`` (dying: a zombie, exiting, SIGKILL pending) and
    ``oom_score_adj`` are read for the victim only; one that fails is marked
    ineligible and the choice made again.
    """
    procs = list(processes)
    for _ in range(len(procs) + 1):
        victim = choose_victim(procs, descendant_share)
        if victim is None:
            return None
        proc = victim.process
        if not _unkillable(proc, proc_root) and not _dying(proc.pid, proc_root):
            return victim
        procs = [replace(p, eligible=False) if p is proc else p for p in procs]
    return None


def _larger(p: SliceProcess) -> tuple[int, int]:
    """Sort key: the larger size first, then the lower pid."""
    return (-p.size, p.pid)


def choose_victim(processes: Sequence[SliceProcess], descendant_share: float) -> Victim | None:
    """The process the guard kills among ``processes``, or None when none is eligible.

    The runaway is the largest eligible process (ties: the lower pid); its
    agent is its scope, whose main process is the oldest one there
    (earliest start time, then lowest pid). A runaway that is not the main
    process is the victim. A runaway that is the main process yields to
    that agent's largest eligible other process when it holds at least
    ``descendant_share`` of the main's size; else the main process is the
    victim. Never a process of another scope than the runaway's.
    """
    eligible = [p for p in processes if p.eligible and p.size > 0]
    if not eligible:
        return None
    runaway = min(eligible, key=_larger)
    same = [p for p in processes if p.unit == runaway.unit]
    main = min(same, key=lambda p: (p.start_time, p.pid))
    if runaway.pid != main.pid:
        return Victim(runaway, main, runaway)
    others = [p for p in eligible if p.unit == runaway.unit and p.pid != main.pid]
    if others:
        child = min(others, key=_larger)
        if child.size >= descendant_share * main.size:
            return Victim(child, main, runaway)
    return Victim(main, main, runaway)
