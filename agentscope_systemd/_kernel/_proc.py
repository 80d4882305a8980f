"""Readers for /proc: per-process sizes, names and cgroups, and host memory.

Every reader takes ``proc_root`` so tests point it at a fake tree. A reader
about one process returns None when the process is gone (or, for the
detail-only files ``wchan`` and ``smaps_rollup``, when it belongs to another
user); the scans skip such processes. Formats: proc(5) and
Documentation/filesystems/proc.rst (Linux 6.12).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .. import _numbers
from .._dicts import Record
from ._cgroup import _GONE_OR_DENIED, _GONE_OR_UNSUPPORTED, Pressure, _read_kernel_file
from ._cgroup import parse_pressure as _parse_pressure
from ._statline import split_stat

__all__ = [
    "MemInfo",
    "ProcStat",
    "ProcessInfo",
    "SmapsRollup",
    "exec_comm",
    "host_pressure",
    "iter_pids",
    "parse_meminfo",
    "parse_stat",
    "read_cgroup",
    "read_cmdline",
    "read_meminfo",
    "read_oom_score_adj",
    "read_smaps_rollup",
    "read_stat",
    "read_statm_rss",
    "read_vm_sizes",
    "read_wchan",
    "same_process",
    "top_processes",
]

PROC_ROOT = Path("/proc")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class ProcStat(Record):
    """The fields of ``/proc/PID/stat`` that agentscope uses.

    ``(pid, start_time)`` identifies a process across pid reuse; ``start_time``
    is in clock ticks since boot (field 22). ``state`` is one letter
    (``R``, ``S``, ``D``, ``Z``, ...).
    """

    pid: int
    comm: str
    state: str
    ppid: int
    start_time: int
    flags: int = 0  # field 9, the kernel's PF_* flags
    signals: int = 0  # field 31, the thread's pending signals

    @property
    def dying(self) -> bool:
        """Killed or exiting: a zombie, ``PF_EXITING`` set, or SIGKILL pending.

        An OOM victim can stay listed in its cgroup with most of its RSS for
        a while under load; this is how it is told from the living then (a
        fatal signal is queued on every thread, so the main thread's field
        31 shows it).
        """
        return (
            self.state in ("Z", "X", "x")
            or bool(self.flags & _PF_EXITING)
            or bool(self.signals & _SIGKILL_BIT)
        )


_PF_EXITING = 0x4
_SIGKILL_BIT = 1 << 8  # signal 9 is bit 8 of the pending set


def parse_stat(data: bytes) -> ProcStat:
    """Parse ``/proc/PID/stat``, split by :func:`._statline.split_stat`.

    Raises:
        ValueError: the data is not a stat line.
    """
    pid_field, comm, fields = split_stat(data)
    return ProcStat(
        pid=int(pid_field),
        comm=comm.decode("utf-8", "replace"),
        state=fields[0].decode("ascii", "replace"),
        ppid=int(fields[1]),
        start_time=int(fields[19]),
        flags=int(fields[6]),
        signals=int(fields[28]) if len(fields) > 28 else 0,
    )


def exec_comm(argv0: str) -> str:
    """The comm the kernel gives a process that exec'd ``argv0``.

    The basename of the file exec'd (a script's own name, not its
    interpreter's), cut to 15 bytes (``TASK_COMM_LEN`` less the NUL).
    """
    return os.path.basename(argv0).encode()[:15].decode("utf-8", "ignore")


def _pid_file(proc_root: Path, pid: int, name: str) -> str:
    # A str, not a Path: the monitor reads statm of every agent process, and
    # two Path joins cost more than the read itself.
    return f"{os.fspath(proc_root)}/{pid}/{name}"


def read_stat(pid: int, proc_root: Path = PROC_ROOT) -> ProcStat | None:
    """Read ``/proc/PID/stat``; None when the process is gone.

    Raises:
        OSError: other than the process vanishing.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "stat"))
    return None if data is None else parse_stat(data)


def same_process(
    pid: int, start_time: int, proc_root: Path = PROC_ROOT, *, zombie: bool = False
) -> ProcStat | None:
    """``pid``'s stat if it is still the process that started at ``start_time``.

    The one identity check of a process: ``(pid, start time)``, so that a
    pid reused by another process is never taken for it. None when it is
    gone, another process holds the pid, or (unless ``zombie``) it is a
    zombie, which runs nothing and holds no memory.
    """
    st = read_stat(pid, proc_root)
    if st is None or st.start_time != start_time:
        return None
    if not zombie and st.state in ("Z", "X"):
        return None
    return st


def read_statm_rss(
    pid: int, proc_root: Path = PROC_ROOT, *, page_size: int = PAGE_SIZE
) -> int | None:
    """The resident set size of ``pid`` in bytes (``statm`` field 2 x page size).

    The cheap way to size every process on the host (microseconds each).
    0 for kernel threads and zombies; None when the process is gone.

    Raises:
        OSError: other than the process vanishing.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "statm"))
    if data is None:
        return None
    fields = data.split()
    if len(fields) < 2:
        # A task exiting between open and read can give an empty file.
        return None
    return int(fields[1]) * page_size


def read_vm_sizes(pid: int, proc_root: Path = PROC_ROOT) -> tuple[int, int] | None:
    """``(VmRSS, VmSwap)`` of ``pid`` in bytes, from ``/proc/PID/status``.

    What the guard sizes a process by: resident plus swapped-out pages, as
    cheap as ``statm`` and without ``smaps_rollup``'s page walk. (0, 0) for
    kernel threads and zombies (no Vm lines); None when the process is gone.

    Raises:
        OSError: other than the process vanishing.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "status"))
    if data is None:
        return None
    values = _kb_fields(data)
    return values.get("VmRSS", 0), values.get("VmSwap", 0)


@dataclass(frozen=True, slots=True)
class SmapsRollup(Record):
    """``/proc/PID/smaps_rollup`` in bytes: the accurate (and 10x dearer) sizes.

    ``pss`` shares pages out between the processes mapping them; ``fields``
    holds every size line (``Pss_Anon``, ``Swap``, ...), in bytes.
    """

    rss: int
    pss: int
    anonymous: int
    swap: int
    fields: Mapping[str, int] = field(default_factory=dict, compare=False, hash=False)


def _kb_fields(data: bytes) -> dict[str, int]:
    """Parse ``Key:   123 kB`` lines into bytes; lines of other shapes are skipped."""
    values: dict[str, int] = {}
    for line in data.splitlines():
        key, sep, rest = line.partition(b":")
        key = key.strip()
        # smaps_rollup opens with an address-range line ("5600-7ffc ---p 00000000 00:00 0").
        if not sep or not key or b" " in key:
            continue
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        scale = 1024 if parts[1:2] == [b"kB"] else 1
        values[key.decode("ascii", "replace")] = int(parts[0]) * scale
    return values


def read_smaps_rollup(pid: int, proc_root: Path = PROC_ROOT) -> SmapsRollup | None:
    """Read ``/proc/PID/smaps_rollup``; read it only for a few candidates.

    None when the process is gone, belongs to another user (EACCES), or has
    no memory map (kernel threads, zombies).

    Raises:
        OSError: other than the above.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "smaps_rollup"), _GONE_OR_DENIED)
    if data is None:
        return None
    values = _kb_fields(data)
    if "Rss" not in values:
        return None
    return SmapsRollup(
        rss=values["Rss"],
        pss=values.get("Pss", 0),
        anonymous=values.get("Anonymous", 0),
        swap=values.get("Swap", 0),
        fields=MappingProxyType(values),
    )


def read_cmdline(pid: int, proc_root: Path = PROC_ROOT, max_len: int = 120) -> str | None:
    """The command line of ``pid`` as one line, cut to ``max_len`` characters.

    Arguments are joined by spaces; a cut line ends in ``...``. "" for kernel
    threads and zombies; None when the process is gone.

    Raises:
        OSError: other than the process vanishing.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "cmdline"))
    if data is None:
        return None
    args = data.rstrip(b"\0").split(b"\0")
    text = " ".join(a.decode("utf-8", "replace") for a in args)
    if len(text) > max_len:
        text = text[: max(max_len - 3, 0)] + "..."
    return text


def read_wchan(pid: int, proc_root: Path = PROC_ROOT) -> str | None:
    """The kernel function ``pid`` sleeps in (``/proc/PID/wchan``).

    None when unknown: the process is gone, runs, or belongs to another user
    (the kernel then shows ``0``, or refuses the read).

    Raises:
        OSError: other than the above.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "wchan"), _GONE_OR_DENIED)
    if data is None:
        return None
    name = data.strip().decode("ascii", "replace")
    return None if name in ("", "0") else name


def read_cgroup(pid: int, proc_root: Path = PROC_ROOT) -> str | None:
    """The cgroup v2 path of ``pid`` (the ``0::/...`` line of ``/proc/PID/cgroup``).

    None when the process is gone or has no v2 line. A ``(deleted)`` suffix
    (the cgroup was removed while a zombie still points at it) is dropped.

    Raises:
        OSError: other than the process vanishing.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "cgroup"))
    if data is None:
        return None
    for line in data.splitlines():
        if line.startswith(b"0::"):
            path = line[3:].removesuffix(b" (deleted)")
            return os.fsdecode(path)
    return None


def read_oom_score_adj(pid: int, proc_root: Path = PROC_ROOT) -> int | None:
    """``/proc/PID/oom_score_adj`` (-1000 .. 1000); None when the process is gone.

    Raises:
        OSError: other than the process vanishing.
    """
    data = _read_kernel_file(_pid_file(proc_root, pid, "oom_score_adj"))
    return None if data is None or not data.strip() else int(data)


@dataclass(frozen=True, slots=True)
class MemInfo(Record):
    """Host memory from ``/proc/meminfo``, in bytes."""

    mem_total: int
    mem_available: int
    swap_total: int
    swap_free: int

    @property
    def available_fraction(self) -> float:
        """MemAvailable / MemTotal (0.0 .. 1.0)."""
        return self.mem_available / self.mem_total if self.mem_total else 0.0


def _kb_field(data: bytes, key: bytes) -> int | None:
    """The ``key:`` line of a ``Key:   123 kB`` file in bytes; None when absent.

    Four of these cost a tenth of :func:`_kb_fields` over meminfo's ~55
    lines, and the memory guard reads meminfo up to ten times a second.
    """
    needle = key + b":"
    start = 0
    while (at := data.find(needle, start)) >= 0:
        if at == 0 or data[at - 1] == 0x0A:  # at a line start, not inside a longer key
            end = data.find(b"\n", at)
            parts = data[at + len(needle) : end if end >= 0 else len(data)].split()
            if not parts or not parts[0].isdigit():
                return None
            return int(parts[0]) * (1024 if parts[1:2] == [b"kB"] else 1)
        start = at + 1
    return None


def parse_meminfo(data: bytes) -> MemInfo:
    """Parse ``/proc/meminfo``.

    Raises:
        ValueError: MemTotal or MemAvailable (kernel 3.14+) is missing.
    """
    total = _kb_field(data, b"MemTotal")
    available = _kb_field(data, b"MemAvailable")
    for name, value in (("MemTotal", total), ("MemAvailable", available)):
        if value is None:
            raise ValueError(f"/proc/meminfo: missing {name!r}")
    assert total is not None
    assert available is not None
    return MemInfo(
        mem_total=total,
        mem_available=available,
        swap_total=_kb_field(data, b"SwapTotal") or 0,
        swap_free=_kb_field(data, b"SwapFree") or 0,
    )


def read_meminfo(proc_root: Path = PROC_ROOT) -> MemInfo:
    """Read ``/proc/meminfo``.

    Raises:
        FileNotFoundError: ``proc_root`` is not a mounted procfs.
    """
    # Not a per-process file: it cannot vanish, so any OSError is the caller's.
    return parse_meminfo((proc_root / "meminfo").read_bytes())


def host_pressure(proc_root: Path = PROC_ROOT) -> Pressure | None:
    """Host-wide memory pressure (``/proc/pressure/memory``); None without PSI.

    Raises:
        OSError: other than PSI being absent or disabled.
    """
    data = _read_kernel_file(proc_root / "pressure" / "memory", _GONE_OR_UNSUPPORTED)
    return None if data is None else _parse_pressure(data)


def iter_pids(proc_root: Path = PROC_ROOT) -> Iterator[int]:
    """The pids in ``proc_root`` at the time of listing (processes, not threads)."""
    with os.scandir(proc_root) as entries:
        for entry in entries:
            if _numbers.is_digits(entry.name):
                yield int(entry.name)


@dataclass(frozen=True, slots=True)
class ProcessInfo(Record):
    """One of the host's largest processes, and the agent it belongs to.

    ``rss`` is in bytes; ``cgroup`` the v2 path (None if unknown); ``agent``
    the agent name given by the caller's mapping, None outside the agents.
    """

    pid: int
    start_time: int
    comm: str
    cmdline: str
    rss: int
    cgroup: str | None
    agent: str | None


def top_processes(
    n: int,
    proc_root: Path = PROC_ROOT,
    agent_of: Callable[[str], str | None] | None = None,
    *,
    cmdline_len: int = 120,
    page_size: int = PAGE_SIZE,
) -> list[ProcessInfo]:
    """The ``n`` processes with the largest RSS on the host, largest first.

    One pass reads every ``statm`` (cheap); only for the largest does it read
    stat, cmdline and cgroup. Processes that exit meanwhile are skipped and
    the next largest takes their place. ``agent_of`` maps a cgroup path such
    as ``/app.slice/.../agentscope-f-a-1a2b3c.scope`` to an agent name, or
    None; without it every ``agent`` is None.

    Raises:
        OSError: other than processes vanishing.
    """
    if n <= 0:
        return []
    sizes: list[tuple[int, int]] = []
    for pid in iter_pids(proc_root):
        rss = read_statm_rss(pid, proc_root, page_size=page_size)
        if rss:  # None: gone; 0: kernel thread or zombie
            sizes.append((rss, pid))
    result: list[ProcessInfo] = []
    # Sorting a few thousand pairs is cheaper than any second /proc pass; a
    # heap pops them largest first so we can step past vanished processes.
    heap = [(-rss, pid) for rss, pid in sizes]
    heapq.heapify(heap)
    while heap and len(result) < n:
        neg_rss, pid = heapq.heappop(heap)
        stat = read_stat(pid, proc_root)
        cmdline = read_cmdline(pid, proc_root, cmdline_len)
        cgroup = read_cgroup(pid, proc_root)
        if stat is None or cmdline is None:
            continue
        agent = agent_of(cgroup) if agent_of is not None and cgroup is not None else None
        result.append(
            ProcessInfo(
                pid=pid,
                start_time=stat.start_time,
                comm=stat.comm,
                cmdline=cmdline or f"[{stat.comm}]",
                rss=-neg_rss,
                cgroup=cgroup,
                agent=agent,
            )
        )
    return result
