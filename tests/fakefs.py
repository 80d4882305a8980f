"""Fake cgroupfs and /proc trees for the reader tests.

The files are written in the kernel's own formats (Linux 6.12), so the
readers under test cannot tell them from the real thing.

Atomicity. A real kernel file is generated whole when it is read, so a
reader never sees one half-written, and a cgroup or /proc directory appears
with all its files. A plain file write is a truncate and then a write, and a
reader in another thread can land in between (an empty ``memory.events``,
an empty ``cgroup.procs``). So every change made here holds :data:`KERNEL`,
and a test whose code under test reads the tree from worker threads wraps
those reads with :func:`holding_kernel`: a read then sees a change either not
at all or complete. ``with KERNEL:`` around several changes makes them one
step, as the kernel makes them between two samples. Files are rewritten in
place (same inode), so inotify watches see ``IN_MODIFY`` as on cgroupfs.
"""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from agentscope_systemd._kernel._cgroup import MemoryEvents

PAGE = 4096

PressureFigures = tuple[float, float, float, int]

#: The fake kernel's lock: held by every change made here and by the reads
#: wrapped with :func:`holding_kernel` (reentrant, so changes can nest).
KERNEL = threading.RLock()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def holding_kernel(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run holding :data:`KERNEL`, as one step.

    For a reader: it sees each change before or after, never during. For a
    maker: its files appear together (a cgroup is created with its files).
    """

    @functools.wraps(fn)
    def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with KERNEL:
            return fn(*args, **kwargs)

    return locked


def write(path: Path, data: str | bytes) -> None:
    """Set a fake kernel file's content in one step, in place (the inode stays)."""
    raw = data.encode() if isinstance(data, str) else data
    with KERNEL:
        path.write_bytes(raw)


def remove(path: Path) -> None:
    """Remove a file or a whole directory tree in one step (a cgroup rmdir, a reaped pid)."""
    with KERNEL:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def format_memory_events(events: MemoryEvents) -> bytes:
    """``memory.events`` as the kernel prints it (no oom_group_kill before 5.17)."""
    lines = [
        f"low {events.low}",
        f"high {events.high}",
        f"max {events.max}",
        f"oom {events.oom}",
        f"oom_kill {events.oom_kill}",
    ]
    if events.oom_group_kill is not None:
        lines.append(f"oom_group_kill {events.oom_group_kill}")
    return ("\n".join(lines) + "\n").encode()


def format_pressure(some: PressureFigures, full: PressureFigures | None = None) -> bytes:
    """A PSI file; ``full`` None leaves the ``full`` line out."""
    out = []
    for kind, figures in (("some", some), ("full", full)):
        if figures is not None:
            a10, a60, a300, total = figures
            out.append(f"{kind} avg10={a10:.2f} avg60={a60:.2f} avg300={a300:.2f} total={total}\n")
    return "".join(out).encode()


@holding_kernel
def make_cgroup(
    root: Path,
    relpath: str,
    *,
    current: int = 0,
    events: MemoryEvents | None = None,
    own_events: MemoryEvents | None = None,
    stat: Mapping[str, int] | None = None,
    procs: Iterable[int] = (),
    pressure: bytes | None = None,
    peak: int | None = None,
    high: int | None = None,
    max: int | None = None,
    controllers: str = "cpu memory pids",
    memory_files: bool = True,
) -> Path:
    """Create a cgroup directory with its memory files; returns its path.

    ``events`` is ``memory.events`` (hierarchical), ``own_events``
    ``memory.events.local`` (its own limits' only; zeros unless given).
    ``peak=None`` leaves out ``memory.peak`` (kernels before 5.19);
    ``pressure=None`` writes an idle PSI file; ``high``/``max`` None write
    ``max``. ``memory_files=False`` makes a cgroup without the memory
    controller (only ``cgroup.*`` files and ``memory.pressure``).
    """
    path = root / relpath.strip("/")
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in procs))
    (path / "memory.pressure").write_bytes(
        pressure if pressure is not None else format_pressure((0, 0, 0, 0), (0, 0, 0, 0))
    )
    if not memory_files:
        return path
    if events is None:
        events = MemoryEvents(0, 0, 0, 0, 0, 0)
    if stat is None:
        stat = {"anon": current // 2, "file": current - current // 2, "kernel": 0}
    (path / "memory.current").write_text(f"{current}\n")
    (path / "memory.events").write_bytes(format_memory_events(events))
    (path / "memory.events.local").write_bytes(
        format_memory_events(own_events or MemoryEvents(0, 0, 0, 0, 0, 0))
    )
    (path / "memory.stat").write_text("".join(f"{k} {v}\n" for k, v in stat.items()))
    (path / "memory.high").write_text("max\n" if high is None else f"{high}\n")
    (path / "memory.max").write_text("max\n" if max is None else f"{max}\n")
    if peak is not None:
        (path / "memory.peak").write_text(f"{peak}\n")
    return path


@holding_kernel
def make_cgroup_root(root: Path) -> Path:
    """The root of a v2 hierarchy: controllers, but no memory.current/events."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.procs").write_text("1\n")
    (root / "memory.stat").write_text("anon 1\nfile 1\n")
    return root


def stat_line(
    pid: int,
    comm: str,
    state: str = "S",
    ppid: int = 1,
    start_time: int = 1000,
    flags: int = 4194560,
    signals: int = 0,
) -> bytes:
    """A ``/proc/PID/stat`` line with all 52 fields (6.12)."""
    # Fields 3.. as the kernel prints them; field 22 (index 19 here) is starttime.
    rest = [state, str(ppid), str(pid), str(pid), "0", "-1", str(flags)]
    rest += ["100", "0", "0", "0", "3", "1", "0", "0", "20", "0", "1", "0"]
    rest += [str(start_time)]
    rest += ["10000000", "250", "18446744073709551615"] + ["0"] * 27
    rest[28] = str(signals)  # field 31
    assert len(rest) == 50
    return f"{pid} ({comm}) {' '.join(rest)}\n".encode()


@holding_kernel
def make_proc(
    root: Path,
    pid: int,
    *,
    comm: str = "sleep",
    cmdline: Sequence[str] = ("sleep", "infinity"),
    rss_pages: int = 100,
    state: str = "S",
    wchan: str = "0",
    cgroup: str | None = "/user.slice/user-1000.slice/session-1.scope",
    start_time: int = 1000,
    ppid: int = 1,
    oom_score_adj: int = 0,
    smaps_kb: Mapping[str, int] | None = None,
    flags: int = 4194560,
    signals: int = 0,
    swap_kb: int = 0,
) -> Path:
    """Create ``/proc/PID`` with stat, statm, status, cmdline, wchan, cgroup, oom_score_adj.

    ``cgroup=None`` writes a hybrid-host file without a ``0::`` line;
    ``smaps_kb`` (field -> kB) adds smaps_rollup; ``status`` shows VmRSS
    (``rss_pages``) and VmSwap (``swap_kb``).
    """
    path = root / str(pid)
    path.mkdir(parents=True, exist_ok=True)
    (path / "stat").write_bytes(stat_line(pid, comm, state, ppid, start_time, flags, signals))
    (path / "statm").write_text(f"{rss_pages * 3} {rss_pages} 10 5 0 {rss_pages} 0\n")
    (path / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))
    (path / "comm").write_text(comm + "\n")
    (path / "status").write_text(
        f"Name:\t{comm}\nState:\t{state} (sleeping)\nPid:\t{pid}\nPPid:\t{ppid}\n"
        f"VmPeak:\t{rss_pages * 12:8d} kB\nVmRSS:\t{rss_pages * PAGE // 1024:8d} kB\n"
        f"VmSwap:\t{swap_kb:8d} kB\nThreads:\t1\n"
    )
    (path / "wchan").write_text(wchan)  # the kernel prints no newline here
    (path / "cgroup").write_text(
        "12:memory:/user.slice\n1:name=systemd:/user.slice\n"
        if cgroup is None
        else f"0::{cgroup}\n"
    )
    (path / "oom_score_adj").write_text(f"{oom_score_adj}\n")
    if smaps_kb is not None:
        body = "".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in smaps_kb.items())
        (path / "smaps_rollup").write_text(
            "55d0c0a00000-7ffc8a1ff000 ---p 00000000 00:00 0                          [rollup]\n"
            + body
        )
    return path


@holding_kernel
def make_meminfo(
    root: Path,
    *,
    total_kb: int = 8_000_000,
    available_kb: int = 6_000_000,
    swap_total_kb: int = 1_000_000,
    swap_free_kb: int = 900_000,
) -> None:
    """Write ``/proc/meminfo`` (an excerpt in the kernel's layout)."""
    rows = [
        ("MemTotal", total_kb),
        ("MemFree", available_kb // 2),
        ("MemAvailable", available_kb),
        ("Buffers", 1000),
        ("Cached", 200000),
        ("SwapCached", 0),
        ("SwapTotal", swap_total_kb),
        ("SwapFree", swap_free_kb),
        ("HugePages_Total", 0),
    ]
    lines = []
    for key, value in rows:
        unit = "" if key.startswith("HugePages") else " kB"
        lines.append(f"{key + ':':<16}{value:>8}{unit}\n")
    root.mkdir(parents=True, exist_ok=True)
    (root / "meminfo").write_text("".join(lines))


@holding_kernel
def make_host_pressure(root: Path, data: bytes) -> None:
    """Write ``/proc/pressure/memory``."""
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    (root / "pressure" / "memory").write_bytes(data)


@holding_kernel
def set_children(root: Path, pid: int, children: Iterable[int], tid: int | None = None) -> None:
    """Write ``/proc/PID/task/TID/children`` (``tid`` defaults to the main thread).

    The kernel's format: each child's pid followed by a space, no newline.
    """
    task = root / str(pid) / "task" / str(pid if tid is None else tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "children").write_text("".join(f"{c} " for c in children))
