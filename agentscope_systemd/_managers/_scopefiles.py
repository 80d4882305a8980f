"""A fleet's scope files read straight from cgroupfs and /proc (no D-Bus).

Run in worker threads: each reads many small files. Scopes and processes
that vanish mid-read give no verdict (None, or left out), never an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._calls._calls import CALL_PREFIX
from .._kernel._cgroup import parse_memory_events, read_subtree_procs
from .._kernel._proc import read_stat
from .._registry._registry import LiveScope

__all__ = [
    "Figures",
    "cgroup_present",
    "raise_own_oom_score_adj",
    "read_figures",
    "read_scopes",
    "read_text",
    "write_oom_score_adj",
]

log = logging.getLogger("agentscope")


def cgroup_present(slice_dir: Path, units: Iterable[str]) -> set[str]:
    """The units among ``units`` whose scope's cgroup directory exists in ``slice_dir``.

    A scope that systemd did not list can still be there: a listing taken a
    moment before an exec's scope started, while the registry took that
    exec's launch in (it judges a scope by this same directory). Such a row
    is not gone, and is not closed: the next listing sees its scope.
    """
    return {u for u in units if os.path.isdir(slice_dir / u)}


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_scopes(slice_dir: Path, live: Mapping[str, tuple[str, str]]) -> dict[str, LiveScope]:
    """The processes of each live scope, from cgroup.procs and /proc (no D-Bus)."""
    out: dict[str, LiveScope] = {}
    for unit, (_name, active) in live.items():
        try:
            raw = read_subtree_procs(slice_dir / unit)  # a delegated scope's are in its leaves
        except OSError:
            raw = None
        procs = None if raw is None else raw.decode()
        if procs is None:
            # Unreadable (gone this instant, or not where we looked): no
            # verdict on its row rather than a wrong "headless".
            continue
        pids = tuple(int(p) for p in procs.split())
        starts = {}
        for pid in pids:
            st = read_stat(pid)
            if st is not None:
                starts[pid] = st.start_time
        out[unit] = LiveScope(unit, pids, starts, active)
    return out


def read_figures(slice_dir: Path, units: Sequence[str]) -> dict[str, Figures]:
    """Memory figures, OOM kills and the freezer state of each scope, from its files.

    A scope that vanished mid-read gives Nones: that is normal, not an error.
    """
    out = {}
    for unit in units:
        d = slice_dir / unit
        current = read_text(d / "memory.current")
        peak = read_text(d / "memory.peak")  # kernel 5.19+
        events = read_text(d / "memory.events")
        kills = parse_memory_events(events.encode()).oom_kill if events else None
        out[unit] = Figures(
            int(current) if current else None,
            int(peak) if peak else None,
            kills,
            "frozen 1" in (read_text(d / "cgroup.events") or ""),
            count_calls(d),
        )
    return out


def count_calls(scope_dir: Path) -> int:
    """How many tool calls (``call-*`` cgroups, docs/calls.md) the scope holds now."""
    try:
        with os.scandir(scope_dir) as it:
            return sum(1 for e in it if e.name.startswith(CALL_PREFIX) and e.is_dir())
    except OSError:
        return 0


@dataclass(frozen=True)
class Figures:
    memory_current: int | None
    memory_peak: int | None
    oom_kills: int | None
    frozen: bool
    calls: int = 0


def write_oom_score_adj(pid: int, value: int) -> bool:
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(value))
    except OSError as exc:
        log.debug("cannot set oom_score_adj of %d to %d: %s", pid, value, exc)
        return False
    return True


def raise_own_oom_score_adj(value: int) -> None:
    current = read_text(Path("/proc/self/oom_score_adj"))
    if current is not None and int(current) >= value:
        return  # never lower it
    write_oom_score_adj(os.getpid(), value)
