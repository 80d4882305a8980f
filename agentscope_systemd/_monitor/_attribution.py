"""Who was killed, who is throttled, when to warn: the monitor's decisions.

Pure logic over samples taken by ``_cgroup`` and ``_proc`` (only
:func:`detect_throttle` reads files, through those readers), so the async
monitor and the blocking facade share it and tests feed it numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import _numbers
from .._dicts import Record
from .._kernel._cgroup import CGROUP_ROOT, LimitHolder, MemoryEvents, Pressure, find_limit_holders
from .._kernel._proc import PROC_ROOT, MemInfo, read_stat, read_wchan

__all__ = [
    "THROTTLE_WCHANS",
    "KernelOomKill",
    "OomTask",
    "PressureEvent",
    "PressureSample",
    "PressureWindow",
    "SeenProcess",
    "Throttle",
    "counter_delta",
    "detect_throttle",
    "is_throttled",
    "oom_victims",
    "parse_oom_kill_line",
    "parse_oom_task_line",
]


def counter_delta(previous: int | None, current: int) -> int:
    """How much a kernel event counter rose between two samples.

    A counter that went down belongs to a new cgroup of the same name (the
    old one was removed), so all of ``current`` is new. No previous sample
    gives 0: there is nothing to compare against yet.
    """
    if previous is None:
        return 0
    return current - previous if current >= previous else current


# ---------------------------------------------------------------------------
# OOM kills


@dataclass(frozen=True, slots=True)
class SeenProcess(Record):
    """A process as last seen in a scope: enough to name it after it is gone."""

    pid: int
    start_time: int
    comm: str
    rss: int


def oom_victims(
    previous: Mapping[int, SeenProcess],
    current: Mapping[int, int] | Collection[int],
    oom_kill_delta: int,
) -> tuple[SeenProcess, ...]:
    """The likely victims of ``oom_kill_delta`` OOM kills in one scope.

    ``previous`` is the scope's last sample (pid -> what was seen);
    ``current`` its processes now, as pid -> start time (or bare pids, which
    cannot tell a reused pid from the original). The victims are processes
    that have left, largest last-seen RSS first (the OOM killer picks the
    largest), at most ``oom_kill_delta`` of them. The kernel log, when
    readable, is the authority: see :func:`parse_oom_kill_line`.

    >>> prev = {7: SeenProcess(7, 100, "python3", 900), 8: SeenProcess(8, 101, "sh", 10)}
    >>> [v.comm for v in oom_victims(prev, {8: 101}, 1)]
    ['python3']
    """
    if oom_kill_delta <= 0:
        return ()
    if isinstance(current, Mapping):
        starts: Mapping[int, int] = current
        gone = [p for p in previous.values() if starts.get(p.pid) != p.start_time]
    else:
        pids = set(current)
        gone = [p for p in previous.values() if p.pid not in pids]
    gone.sort(key=lambda p: (-p.rss, p.pid))
    return tuple(gone[:oom_kill_delta])


@dataclass(frozen=True, slots=True)
class KernelOomKill:
    """A kill reported by the kernel log.

    ``memcg`` is True when a cgroup's limit was hit, False when the whole host ran out.
    """

    pid: int
    comm: str
    memcg: bool
    #: The victim's RSS when it was killed (anon + file + shmem, bytes), if the line says.
    rss: int | None = None


_KILLED = "Killed process "
_RSS_FIELDS = ("anon-rss:", "file-rss:", "shmem-rss:")


def _line_rss(rest: str) -> int | None:
    """The sum of the ``anon-rss:NkB, file-rss:NkB, shmem-rss:NkB`` fields, in bytes."""
    total, found = 0, False
    for item in rest.split(","):
        key, sep, value = item.strip().partition(":")
        if (
            sep
            and key + ":" in _RSS_FIELDS
            and value.endswith("kB")
            and _numbers.is_digits(value[:-2])
        ):
            total += int(value[:-2]) * 1024
            found = True
    return total if found else None


def parse_oom_kill_line(line: str) -> KernelOomKill | None:
    """Parse an OOM killer's report from the kernel log; None for other lines.

    Reads the lines that mm/oom_kill.c prints as ``"%s: Killed process %d
    (%s) total-vm:..."``, with ``Out of memory`` or ``Memory cgroup out of
    memory`` as the prefix, wherever the line begins (dmesg timestamps,
    journal fields). The comm may hold spaces and parentheses.

    >>> line = "Memory cgroup out of memory: Killed process 1234 (python3) total-vm:1kB"
    >>> parse_oom_kill_line(line)
    KernelOomKill(pid=1234, comm='python3', memcg=True, rss=None)
    """
    prefix, sep, rest = line.partition(_KILLED)
    if not sep or "out of memory" not in prefix.lower():
        return None
    pid_text, sep, rest = rest.partition(" (")
    if not sep or not _numbers.is_digits(pid_text):
        return None
    comm, sep, sizes = rest.rpartition(") total-vm:")
    if not sep:
        # Older or truncated lines: the comm ends at the last ')'.
        comm, sep, sizes = rest.rpartition(")")
        if not sep:
            return None
    return KernelOomKill(
        pid=int(pid_text), comm=comm, memcg="Memory cgroup" in prefix, rss=_line_rss(sizes)
    )


@dataclass(frozen=True, slots=True)
class OomTask:
    """The kernel's ``oom-kill:`` summary line: which task it chose, in which cgroup.

    ``memcg`` is the victim's cgroup (``task_memcg``) as a path below the
    cgroup root, e.g. ``/app.slice/x.scope``; ``comm`` is ``task=`` (cut at
    a comma that the comm itself may hold: the ``Killed process`` line has
    the whole name).
    """

    pid: int
    comm: str
    memcg: str


#: A cgroup path the kernel prints is at most PATH_MAX; longer text is not one.
_MAX_MEMCG = 4096


#: The kernel's TASK_COMM_LEN is 16: a comm is at most 15 bytes (fewer characters).
_MAX_COMM = 15


def parse_oom_task_line(line: str) -> OomTask | None:
    """Parse the kernel's ``oom-kill:constraint=...`` summary line; None for other lines.

    mm/oom_kill.c (dump_oom_summary, Linux 4.19+) prints it right before
    ``Killed process``: ``oom-kill:constraint=CONSTRAINT_MEMCG,...,
    oom_memcg=/a.slice/x.scope,task_memcg=/a.slice/x.scope,task=python3,pid=1234,uid=0``.

    A process names itself (its comm) and a user names the cgroups it may
    create, so neither may rewrite the fields after it: ``pid`` and ``uid``
    are read from the right, ``task=`` is at most 15 characters before
    them, and ``task_memcg`` must lie at or below ``oom_memcg`` (the cgroup
    that hit its limit). A line read two ways that give two cgroups is
    refused (None), never guessed; so is a ``task_memcg`` that is not an
    absolute path without ``..`` (#31).

    >>> parse_oom_task_line("oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a.scope,pid=7")
    OomTask(pid=7, comm='', memcg='/a.scope')
    """
    _, sep, rest = line.partition("oom-kill:")
    if not sep or len(rest) > 4 * _MAX_MEMCG:
        return None
    rest = rest.rstrip()
    head, sep, uid = rest.rpartition(",uid=")
    if sep and _numbers.is_digits(uid):
        rest = head
    head, sep, pid = rest.rpartition(",pid=")
    if not sep or not _numbers.is_digits(pid) or len(pid) > 10:
        return None
    # Every place ",task=" may start the comm (a comm may hold ",task=" too).
    splits = [
        (head[:i], head[i + len(",task=") :])
        for i in _occurrences(head, ",task=")
        if len(head) - i - len(",task=") <= _MAX_COMM
    ] or [(head, "")]
    found: dict[str, str] = {}
    for before, comm in splits:
        for memcg in _task_memcgs(before):
            found.setdefault(memcg, comm)
    if len(found) != 1:
        return None
    ((memcg, comm),) = found.items()
    return OomTask(pid=int(pid), comm=comm, memcg=memcg)


def _occurrences(text: str, needle: str) -> list[int]:
    out: list[int] = []
    i = text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + 1)
    return out


def _task_memcgs(text: str) -> list[str]:
    """The readings of ``...,oom_memcg=P1,task_memcg=P2`` in which P2 lies at or below P1."""
    key = ",task_memcg="
    found: list[str] = []
    starts = _occurrences(text, key)
    for j in starts:
        memcg = text[j + len(key) :]
        if not _valid_memcg(memcg):
            continue
        left = text[:j]
        owners = [left[k + len(",oom_memcg=") :] for k in _occurrences(left, ",oom_memcg=")]
        if owners:
            if any(memcg == o or memcg.startswith(o.rstrip("/") + "/") for o in owners):
                found.append(memcg)
        elif len(starts) == 1:  # a global OOM (or an older kernel): one reading only
            found.append(memcg)
    return found


def _valid_memcg(memcg: str) -> bool:
    return (
        memcg.startswith("/")
        and len(memcg) <= _MAX_MEMCG
        and "\0" not in memcg
        and ".." not in memcg.split("/")
    )


# ---------------------------------------------------------------------------
# Pressure window


@dataclass(frozen=True, slots=True)
class PressureSample(Record):
    """Host memory pressure at one moment.

    ``some_avg10`` is the percentage of the last 10 s in which some task
    stalled on memory; ``available_fraction`` MemAvailable / MemTotal.
    ``at`` is the window's clock reading when it was added.
    """

    some_avg10: float
    available_fraction: float
    at: float = 0.0

    @classmethod
    def from_readings(cls, pressure: Pressure | None, meminfo: MemInfo) -> PressureSample:
        """Build a sample from :func:`host_pressure` and :func:`read_meminfo` (no PSI: 0%)."""
        avg10 = 0.0 if pressure is None else pressure.some.avg10
        return cls(some_avg10=avg10, available_fraction=meminfo.available_fraction)


@dataclass(frozen=True, slots=True)
class PressureEvent(Record):
    """A window of high memory pressure: when it began and ended, and its worst sample."""

    started: float
    ended: float
    worst: PressureSample
    samples: int


class PressureWindow:
    """Turn a stream of pressure samples into at most one event per window.

    A sample is *high* when ``some_avg10 >= some_avg10_threshold`` (percent)
    or ``available_fraction < available_threshold``. The first high sample
    opens a window of ``window`` seconds; the window keeps its worst sample
    (the one furthest past a threshold, relative to that threshold) and is
    reported once it has elapsed, by the :meth:`add` or :meth:`poll` call
    that first sees the clock past its end. So a long squeeze gives one
    event every ``window`` seconds, never one per sample. Not thread-safe:
    one monitor owns it.

    >>> now = [0.0]
    >>> w = PressureWindow(window=30.0, clock=lambda: now[0])
    >>> w.add(PressureSample(some_avg10=25.0, available_fraction=0.5)) is None
    True
    >>> now[0] = 31.0
    >>> w.poll().worst.some_avg10
    25.0
    """

    def __init__(
        self,
        window: float = 30.0,
        *,
        some_avg10_threshold: float = 10.0,
        available_threshold: float = 0.10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, not {window!r}")
        if some_avg10_threshold <= 0 or not 0 < available_threshold < 1:
            raise ValueError(
                "thresholds: some_avg10_threshold must be > 0 (percent) and "
                "available_threshold between 0 and 1 (a fraction of MemTotal)"
            )
        self.window = window
        self.some_avg10_threshold = some_avg10_threshold
        self.available_threshold = available_threshold
        self._clock = clock
        self._started: float | None = None
        self._worst: PressureSample | None = None
        self._count = 0

    def is_high(self, sample: PressureSample) -> bool:
        """True when ``sample`` crosses either threshold."""
        return (
            sample.some_avg10 >= self.some_avg10_threshold
            or sample.available_fraction < self.available_threshold
        )

    def _severity(self, sample: PressureSample) -> float:
        psi = sample.some_avg10 / self.some_avg10_threshold
        avail = self.available_threshold / max(sample.available_fraction, 1e-9)
        return max(psi, avail)

    def add(self, sample: PressureSample) -> PressureEvent | None:
        """Record a sample; returns the event of a window that has just ended, if any."""
        now = self._clock()
        stamped = PressureSample(sample.some_avg10, sample.available_fraction, now)
        event = self.poll(now)
        if not self.is_high(stamped):
            return event
        if self._started is None:
            self._started, self._worst, self._count = now, stamped, 0
        assert self._worst is not None
        self._count += 1
        if self._severity(stamped) > self._severity(self._worst):
            self._worst = stamped
        return event

    def poll(self, now: float | None = None) -> PressureEvent | None:
        """Close the open window if it has elapsed and return its event (else None)."""
        if now is None:
            now = self._clock()
        if self._started is None or now < self._started + self.window:
            return None
        return self.flush(now)

    def flush(self, now: float | None = None) -> PressureEvent | None:
        """Close the open window now, elapsed or not (at shutdown); None if none is open."""
        if self._started is None or self._worst is None:
            return None
        if now is None:
            now = self._clock()
        event = PressureEvent(
            started=self._started, ended=now, worst=self._worst, samples=self._count
        )
        self._started, self._worst, self._count = None, None, 0
        return event


# ---------------------------------------------------------------------------
# Throttling


# Where a task sleeps while it pays for exceeding memory.high (mm/memcontrol.c,
# measured on 6.12: its wchan while throttled reads this name); the "__" spelling
# covers kernels whose out-of-line helper carries that name.
THROTTLE_WCHANS = frozenset({"mem_cgroup_handle_over_high", "__mem_cgroup_handle_over_high"})


def is_throttled(state: str, wchan: str | None) -> bool:
    """True for a task stalled by memory.high: state D, sleeping in the over-high handler."""
    return state == "D" and wchan in THROTTLE_WCHANS


@dataclass(frozen=True, slots=True)
class Throttle(Record):
    """Processes of ``cgroup`` slowed down by a memory.high limit.

    ``high_delta`` is how much the cgroup's ``high`` counter rose, ``pids``
    the processes seen stalled in the over-high handler (may be empty:
    another user's wchan is hidden). ``limit`` is the nearest cgroup with
    memory.high set (its ``unit`` names the unit to fix), or None if none
    was found.
    """

    cgroup: Path
    high_delta: int
    pids: tuple[int, ...]
    limit: LimitHolder | None


def detect_throttle(
    path: Path,
    previous: MemoryEvents | None,
    current: MemoryEvents,
    pids: Iterable[int],
    *,
    cgroup_root: Path = CGROUP_ROOT,
    proc_root: Path = PROC_ROOT,
) -> Throttle | None:
    """Whether the cgroup ``path`` is being throttled by a memory.high limit.

    Two signs, either is enough: its ``high`` counter rose between the two
    ``memory.events`` samples, or one of ``pids`` is in state D in
    ``mem_cgroup_handle_over_high``. The second matters because the kernel
    counts ``high`` on the cgroup that is over its limit and its ancestors,
    not below: when the agents *slice* has MemoryHigh, a stalled agent's
    scope counter stays still. Processes that vanish are skipped.

    Raises:
        OSError: other than processes or cgroups vanishing.
    """
    delta = counter_delta(None if previous is None else previous.high, current.high)
    stalled: list[int] = []
    for pid in pids:
        stat = read_stat(pid, proc_root)
        if stat is None or stat.state != "D":
            continue
        if is_throttled(stat.state, read_wchan(pid, proc_root)):
            stalled.append(pid)
    if delta <= 0 and not stalled:
        return None
    holders = find_limit_holders(cgroup_root, path)
    limit = next((h for h in holders if h.high is not None), None)
    return Throttle(cgroup=path, high_delta=delta, pids=tuple(stalled), limit=limit)
