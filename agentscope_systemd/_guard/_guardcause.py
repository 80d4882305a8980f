"""Whose shortage is it: the guard kills in the agents slice only when the slice caused it.

The guard's triggers read the whole host, but it may only kill agents'
processes. A hog in another user's session, or a cgroup throttled under
its own ``MemoryHigh``, must never cost an agent its tool call (issue #25:
a hog outside the slice got a whole fleet killed). So before a kill the
guard compares the slice with the cgroups outside it, at the level where
they part: every sibling of the slice and of each of its ancestors (for
``/user.slice/user-1000.slice/user@1000.service/app.slice/X.slice``:
``/system.slice``, ``/user.slice/user-1001.slice``, the session scopes,
``app.slice``'s other apps, ...). Each is one subtree, wholly outside.

The rule (:meth:`CauseTracker.blame`), in order:

1. A pressure trigger (``psi``, ``thrash``): the slice's own PSI ``full``
   avg10 must be at least half the host's. Host ``full`` is the time when
   every non-idle task waits for memory; a cgroup reclaiming under its own
   limit while the agents idle holds the host's high and the slice's low.
2. Growth: over the last :data:`RECENT_WINDOW` seconds, the charge
   (``memory.current`` + ``memory.swap.current``) of the slice and of each
   outside cgroup grew by some amount. When any grew by
   :data:`GROWTH_MIN_SHARE` of MemTotal or more, the slice is the cause only
   if it grew the most; when none did, the same over the last
   :data:`CAUSE_WINDOW` seconds. Who grows *now* made the shortage: agents
   that took their memory at start-up seconds before a hog elsewhere
   filled the host are not its cause (on a slow host the 10 s window alone
   held the agents' 117 MiB start beside the hog's 306 MiB, and once more
   than the hog's, whose parent's charge shrank as its siblings' page
   cache was reclaimed).
3. Otherwise (nothing grew, or no history yet): the slice is the cause only
   if it is larger than every outside cgroup.

When the slice is not the cause the guard kills nothing and names the
cgroup outside that is (the fastest-growing, the largest, or the most
stalled), descending into its largest child a few levels for a useful name.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .._kernel._cgroup import (
    _GONE_OR_NOT_DIR,
    _GONE_OR_UNSUPPORTED,
    _read_kernel_file,
    parse_pressure,
    read_charge,
)

__all__ = ["Blame", "CauseTracker", "outside_cgroups"]

#: Growth is compared over this many seconds when nothing grew in the recent window.
CAUSE_WINDOW = 10.0
#: Growth is compared over this many seconds first.
RECENT_WINDOW = 3.0
#: The charges are sampled at most this often (and at every decision).
SAMPLE_EVERY = 1.0
#: At most this many cgroups outside the slice are read per sample.
MAX_OUTSIDE = 256
#: Growth under this share of MemTotal (in the whole window) is no growth.
GROWTH_MIN_SHARE = 0.01
#: The slice's PSI full must be this share of the host's for a pressure trigger.
SLICE_STALL_SHARE = 0.5
#: How many levels the culprit's name descends into its largest child.
NAME_DEPTH = 3

Reason = Literal["growth", "size", "pressure", "unknown"]


@dataclass(frozen=True, slots=True)
class Blame:
    """Whether the agents slice caused the shortage, and the largest cause outside it.

    ``fleet`` True: the slice is the cause (or it cannot be told:
    ``reason`` ``"unknown"``). ``culprit`` is the outside cgroup that
    decided (a path under the cgroup root, None when there is none),
    with its charge and growth (bytes) and its PSI full avg10.
    """

    fleet: bool
    reason: Reason
    slice_bytes: int
    slice_growth: int
    culprit: str | None
    culprit_bytes: int
    culprit_growth: int
    culprit_full_avg10: float | None = None
    #: The seconds the growths are over.
    window: float = 0.0


def outside_cgroups(cgroup_root: Path, slice_path: Path) -> list[str] | None:
    """The cgroups beside the slice and beside each of its ancestors (absolute paths).

    None when ``slice_path`` is not under ``cgroup_root``. At most
    :data:`MAX_OUTSIDE`; a level that vanished or cannot be listed is skipped.
    """
    try:
        rel = Path(slice_path).relative_to(cgroup_root)
    except ValueError:
        return None
    found: list[str] = []
    here = os.fspath(cgroup_root)
    for part in rel.parts:
        try:
            with os.scandir(here) as it:
                for e in it:
                    if e.name != part and e.is_dir(follow_symlinks=False):
                        found.append(e.path)
                        if len(found) >= MAX_OUTSIDE:
                            return found
        except OSError as exc:
            if exc.errno not in _GONE_OR_NOT_DIR and exc.errno != errno.EACCES:
                raise
        here = here + "/" + part
    return found


def _full_avg10(path: str) -> float | None:
    try:
        data = _read_kernel_file(path + "/memory.pressure", _GONE_OR_UNSUPPORTED)
        if data is None:
            return None
        full = parse_pressure(data).full
    except (OSError, ValueError):
        return None
    return None if full is None else full.avg10


class CauseTracker:
    """The charges of the slice and of the cgroups outside it over the last seconds.

    :meth:`sample` (cheap to call at every reading: it reads at most every
    :data:`SAMPLE_EVERY` s) keeps the history; :meth:`blame` decides.
    """

    def __init__(self, cgroup_root: Path, slice_path: Path, *, names: Path | None = None) -> None:
        self.root = Path(cgroup_root)
        # Culprits are named relative to this (the hierarchy's root, when
        # ``cgroup_root`` is a limited cgroup within it).
        self.names = os.fspath(names if names is not None else cgroup_root)
        self.slice = os.fspath(slice_path)
        self.slice_path = Path(slice_path)
        self._history: deque[tuple[float, dict[str, int]]] = deque()
        self._last = float("-inf")

    def _snapshot(self) -> dict[str, int] | None:
        outside = outside_cgroups(self.root, self.slice_path)
        if outside is None:
            return None
        charges = {}
        for path in [self.slice, *outside]:
            charge = read_charge(path)
            if charge is not None:
                charges[path] = charge
        return charges

    def sample(self, now: float, *, force: bool = False) -> None:
        """Read the charges, unless read less than :data:`SAMPLE_EVERY` s ago."""
        if not force and now - self._last < SAMPLE_EVERY:
            return
        self._last = now
        snap = self._snapshot()
        if snap is None:
            return
        self._history.append((now, snap))
        # Keep one sample at least CAUSE_WINDOW old (the base), none older.
        while len(self._history) > 2 and self._history[1][0] <= now - CAUSE_WINDOW:
            self._history.popleft()

    def blame(self, now: float, mem_total: int, pressure: tuple[float, float] | None) -> Blame:
        """Is the slice the cause? ``pressure``: (host full avg10, threshold) for PSI triggers."""
        self.sample(now, force=True)
        if not self._history or self.slice not in self._history[-1][1]:
            return Blame(True, "unknown", 0, 0, None, 0, 0)
        base_ts, base = self._history[0]
        _, snap = self._history[-1]
        slice_bytes = snap[self.slice]
        outside = {p: c for p, c in snap.items() if p != self.slice}
        has_base = len(self._history) > 1 and now - base_ts > 0
        # The newest sample at least RECENT_WINDOW old (else the oldest).
        recent = self._history[0]
        for sample in list(self._history)[:-1]:
            if sample[0] > now - RECENT_WINDOW:
                break
            recent = sample

        def growth(path: str, since: dict[str, int] = base) -> int:
            return snap[path] - since.get(path, 0) if has_base else 0

        slice_growth = growth(self.slice)
        if pressure is not None:
            host_full, _ = pressure
            mine = _full_avg10(self.slice)
            if mine is not None and mine < SLICE_STALL_SHARE * host_full:
                stalls = {p: _full_avg10(p) or 0.0 for p in outside}
                top = max(stalls, key=lambda p: stalls[p], default=None)
                if top is not None:
                    name = self._name(top, by_pressure=True)
                    return Blame(
                        False,
                        "pressure",
                        slice_bytes,
                        slice_growth,
                        self._rel(name),
                        read_charge(name) or 0,
                        growth(top),
                        _full_avg10(name),
                        window=now - base_ts,
                    )
        if not outside:
            return Blame(True, "size", slice_bytes, slice_growth, None, 0, 0)

        def against(
            path: str, fleet: bool, reason: Reason, grown: int, its: int, since_ts: float
        ) -> Blame:
            # The outside cgroup at ``path`` named the culprit, its charge read
            # now (else as sampled); ``fleet``: the slice is the cause after all.
            name = self._name(path)
            charge = read_charge(name) or outside[path]
            return Blame(
                fleet,
                reason,
                slice_bytes,
                grown,
                self._rel(name),
                charge,
                its,
                window=now - since_ts,
            )

        # The recent window, then the whole one (once, when they are the same).
        windows = [recent] if recent[0] == base_ts else [recent, (base_ts, base)]
        for since_ts, since in windows if has_base else ():
            grown = growth(self.slice, since)
            grown_out = {p: growth(p, since) for p in outside}
            grower = max(grown_out, key=grown_out.__getitem__)
            if max(grown, grown_out[grower]) >= GROWTH_MIN_SHARE * mem_total:
                mine = grown >= grown_out[grower]
                return against(grower, mine, "growth", grown, grown_out[grower], since_ts)
        largest = max(outside, key=lambda p: outside[p])
        mine = slice_bytes >= outside[largest]
        return against(largest, mine, "size", slice_growth, growth(largest), base_ts)

    def _rel(self, path: str) -> str:
        root = self.names
        return path[len(root) :] or "/" if path.startswith(root) else path

    def _name(self, path: str, *, by_pressure: bool = False) -> str:
        """Descend into the largest (or most stalled) child, :data:`NAME_DEPTH` levels."""
        for _ in range(NAME_DEPTH):
            try:
                with os.scandir(path) as it:
                    children = [e.path for e in it if e.is_dir(follow_symlinks=False)][:64]
            except OSError:
                break
            if not children:
                break
            if by_pressure:
                scored = {c: _full_avg10(c) for c in children}
            else:
                scored = {c: read_charge(c) for c in children}
            known = {c: float(v) for c, v in scored.items() if v is not None}
            if not known:
                break
            path = max(known, key=lambda c: known[c])
        return path
