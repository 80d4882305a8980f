"""Where the host's memory really is: swap devices, zram, and the refault counters.

``/proc/meminfo`` counts a zram swap device as swap, but zram stores what it
is given in RAM: a page swapped out to it frees a page and costs its
compressed size (Documentation/admin-guide/blockdev/zram.rst, ``mm_stat``).
With pages that do not compress, MemAvailable reaches nothing while
SwapFree stays high (docs/guard.md, "What it watches"). The readers
here give the guard what it needs to count zram as the RAM it is, and the
counters that show thrashing while MemAvailable still looks fine:

- :func:`parse_swaps` (``/proc/swaps``, proc(5): sizes in KiB);
- :func:`parse_mm_stat` (``/sys/block/zramN/mm_stat``: ``orig_data_size``,
  ``compr_data_size``, ``mem_used_total``, ``mem_limit`` in bytes);
- :func:`parse_vmstat_refaults` (``/proc/vmstat``: ``workingset_refault_anon``,
  ``workingset_refault_file`` (Linux 5.9+; ``workingset_refault`` before)
  and ``pswpin``, in pages), and ``pswpout`` beside them;
- :class:`MemSources` keeps those files open and reads them at each poll.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._cgroup import _GONE_OR_UNSUPPORTED

__all__ = [
    "MemSources",
    "SwapDevice",
    "ZramMargin",
    "ZramStat",
    "ZramUse",
    "parse_mm_stat",
    "parse_swaps",
    "parse_vmstat_refaults",
]

SYS_ROOT = Path("/sys")
#: At most this many swap devices are looked at (the kernel's MAX_SWAPFILES is 32).
MAX_SWAPS = 32
_ZRAM = "/dev/zram"


@dataclass(frozen=True, slots=True)
class SwapDevice:
    """One line of ``/proc/swaps``: sizes in bytes."""

    name: str
    kind: str
    size: int
    used: int

    @property
    def zram(self) -> bool:
        """A zram device: swap that lives in RAM."""
        return self.name.startswith(_ZRAM) and self.name[len(_ZRAM) :].isdigit()


def parse_swaps(data: bytes) -> list[SwapDevice]:
    """Parse ``/proc/swaps`` (a header line, then name, type, size, used, priority).

    Lines of another shape are skipped; at most :data:`MAX_SWAPS` devices.

    >>> parse_swaps(b"Filename Type Size Used Priority\\n/dev/zram0 partition 1024 512 100\\n")
    [SwapDevice(name='/dev/zram0', kind='partition', size=1048576, used=524288)]
    """
    found = []
    for line in data.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4 or not parts[2].isdigit() or not parts[3].isdigit():
            continue
        # A name with spaces is printed with "\040": it stays one field.
        name = parts[0].decode("utf-8", "replace")
        kind = parts[1].decode("ascii", "replace")
        found.append(SwapDevice(name, kind, int(parts[2]) << 10, int(parts[3]) << 10))
        if len(found) >= MAX_SWAPS:
            break
    return found


@dataclass(frozen=True, slots=True)
class ZramStat:
    """The first fields of a zram device's ``mm_stat`` (bytes).

    ``orig_data_size`` is what it holds, ``mem_used_total`` the RAM that
    costs (compressed data and allocator overhead), ``mem_limit`` 0 for none.
    """

    orig_data_size: int
    compr_data_size: int
    mem_used_total: int
    mem_limit: int


def parse_mm_stat(data: bytes) -> ZramStat:
    """Parse ``/sys/block/zramN/mm_stat``.

    Raises:
        ValueError: fewer than four numbers.
    """
    parts = data.split()
    if len(parts) < 4:
        raise ValueError(f"mm_stat: expected at least 4 fields, got {data[:80]!r}")
    orig, compr, used, limit = (int(p) for p in parts[:4])
    return ZramStat(orig, compr, used, limit)


def _counter(data: bytes, key: bytes) -> int | None:
    """The value of ``key`` in ``data`` (``/proc/vmstat`` with a leading newline)."""
    at = data.find(b"\n" + key + b" ")
    if at < 0:
        return None
    start = at + len(key) + 2
    end = data.find(b"\n", start)
    value = data[start : end if end >= 0 else len(data)].strip()
    return int(value) if value.isdigit() else None


def parse_vmstat_refaults(data: bytes) -> int | None:
    """Pages read back in since boot: refaults (anon + file) and swap-ins.

    A refault is an evicted page faulted in again while it would still have
    been in the working set (mm/workingset.c explains the "refault
    distance"); ``pswpin`` counts pages read from swap, zram included. Before
    Linux 5.9 one ``workingset_refault`` counter stands for both kinds. None
    when the file has none of them.

    >>> parse_vmstat_refaults(b"pswpin 5\\nworkingset_refault_anon 7\\n")
    12
    """
    data = b"\n" + data
    values = [_counter(data, k) for k in (b"workingset_refault_anon", b"workingset_refault_file")]
    if values == [None, None]:
        values = [_counter(data, b"workingset_refault")]
    values.append(_counter(data, b"pswpin"))
    found = [v for v in values if v is not None]
    return sum(found) if found else None


@dataclass(frozen=True, slots=True)
class ZramUse:
    """The zram swap devices together: swap space (bytes) and what storing costs.

    ``swap_total``/``swap_free``: their share of SwapTotal/SwapFree;
    ``stored`` (``orig_data_size``) and ``ram_used`` (``mem_used_total``):
    what they hold and the RAM it takes; ``ram_room`` the RAM they may still
    take under their ``mem_limit`` (None: no limit).
    """

    swap_total: int = 0
    swap_free: int = 0
    stored: int = 0
    ram_used: int = 0
    ram_room: int | None = None


#: Until zram holds this much, its compression ratio is not known: count
#: storing as costing the full page (no RAM credit), the cautious guess.
MIN_STORED_FOR_RATIO = 16 << 20


def zram_credit(use: ZramUse, marginal_cost: float | None) -> int:
    """The RAM (bytes) zram can still give back: its free space at what storing costs now.

    Storing ``x`` bytes in zram frees ``x`` and costs ``x * cost`` of RAM, so
    its free space is worth ``free * (1 - cost)``, and nothing once pages do
    not compress (``cost`` >= 1). ``cost`` is the dearer of zram's average
    (``mem_used_total / orig_data_size``) and ``marginal_cost``, what the
    pages it stored lately cost (:class:`ZramMargin`); with no such pages
    (None) there is no evidence of what the next ones will cost, and no
    credit: the cautious guess, as before zram holds
    :data:`MIN_STORED_FOR_RATIO`. Bounded by ``mem_limit`` where one is set.
    """
    if marginal_cost is None or use.swap_free <= 0 or use.stored < MIN_STORED_FOR_RATIO:
        return 0
    cost = max(use.ram_used / use.stored, marginal_cost)
    if cost >= 1.0:
        return 0
    storable = use.swap_free
    if use.ram_room is not None:
        storable = min(storable, int(use.ram_room / cost) if cost > 0 else storable)
    return int(storable * (1.0 - cost))


class ZramMargin:
    """What the pages zram stored lately cost: RAM used per byte stored, over a window.

    zram's average ratio mixes what it stored long ago (idle pages that
    compress 3:1 or better) with what it stores now, and says nothing of
    the pages it will be given next. In the squeeze of issue #25 (trixie,
    Fedora's profile, a runaway whose pages do not compress) zram held
    20 MiB at 0.64 when MemAvailable reached 10 %: the average's credit (35 %
    of RAM) held the guard back until MemAvailable was 0.4 % and the host
    had stalled for seconds (the guard killed 22 s after the crossing, where
    earlyoom's rule never holds). So zram earns credit only for pages it is
    being given: a cost is known once ``MIN_GROWTH`` bytes were stored over
    ``MIN_SPAN`` seconds or more, and stays known ``KEEP`` seconds; a window
    that stored less says nothing new.
    """

    MIN_SPAN = 1.0
    MIN_GROWTH = 8 << 20
    KEEP = 10.0

    def __init__(self) -> None:
        self._base: tuple[float, int, int] | None = None
        self._cost: float | None = None
        self._at = 0.0

    def update(self, now: float, use: ZramUse) -> float | None:
        """Note a reading of ``use`` at ``now``; the marginal cost (None: not known)."""
        if self._base is None or use.stored < self._base[1]:
            # First reading, or zram gave pages back (swap-in, a reset): start over.
            self._base = (now, use.stored, use.ram_used)
        else:
            since, stored, used = self._base
            if now - since >= self.MIN_SPAN:
                grown = use.stored - stored
                if grown >= self.MIN_GROWTH:
                    self._cost = max(use.ram_used - used, 0) / grown
                    self._at = now
                self._base = (now, use.stored, use.ram_used)
        if self._cost is not None and now - self._at > self.KEEP:
            self._cost = None
        return self._cost


class MemSources:
    """``/proc/swaps``, the zram devices' ``mm_stat`` and ``/proc/vmstat``, kept open.

    :meth:`zram` and :meth:`paging` read them again at each call
    (``pread`` at offset 0, as :class:`~agentscope_systemd._guard._guardpolicy.HostReader`
    does); a file the kernel does not have gives the empty answer. Close
    with :meth:`close`.
    """

    def __init__(self, proc_root: Path, sys_root: Path = SYS_ROOT) -> None:
        self._sys = os.fspath(sys_root)
        self._swaps_path = os.fspath(proc_root) + "/swaps"
        self._swaps = _open(self._swaps_path)
        self._vmstat = _open(os.fspath(proc_root) + "/vmstat")
        self._mm: dict[str, int | None] = {}  # device name -> its mm_stat fd

    def zram(self) -> ZramUse:
        """What the zram swap devices hold now (all zeros without any)."""
        if self._swaps is None:
            # Asked only while there is swap: then the kernel has this file.
            self._swaps = _open(self._swaps_path)
        if self._swaps is None:
            return ZramUse()
        devices = [d for d in parse_swaps(_pread(self._swaps, 8192) or b"") if d.zram]
        if not devices:
            return ZramUse()
        total = free = stored = used = 0
        room: int | None = None
        for dev in devices:
            total += dev.size
            free += max(dev.size - dev.used, 0)
            name = dev.name[len("/dev/") :]
            if name not in self._mm:
                self._mm[name] = _open(f"{self._sys}/block/{name}/mm_stat")
            fd = self._mm[name]
            data = None if fd is None else _pread(fd, 4096)
            if not data:
                continue
            try:
                stat = parse_mm_stat(data)
            except ValueError:
                continue
            stored += stat.orig_data_size
            used += stat.mem_used_total
            if stat.mem_limit:
                room = (room or 0) + max(stat.mem_limit - stat.mem_used_total, 0)
        return ZramUse(total, free, stored, used, room)

    def paging(self) -> tuple[int | None, int | None]:
        """(pages refaulted or swapped in, pages swapped out) since boot; None: no counter."""
        if self._vmstat is None:
            return None, None
        data = _pread(self._vmstat, 16384)
        if not data:
            return None, None
        return parse_vmstat_refaults(data), _counter(b"\n" + data, b"pswpout")

    def close(self) -> None:
        """Close the files."""
        for fd in (self._swaps, self._vmstat, *self._mm.values()):
            if fd is not None:
                os.close(fd)
        self._swaps = self._vmstat = None
        self._mm.clear()


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _GONE_OR_UNSUPPORTED or isinstance(exc, PermissionError):
            return None
        raise


def _pread(fd: int, size: int) -> bytes | None:
    try:
        data = os.pread(fd, size, 0)
    except OSError as exc:
        if exc.errno in _GONE_OR_UNSUPPORTED:
            return None
        raise
    if len(data) == size:  # a larger file (vmstat grows with the kernel): read it whole
        chunks = [data]
        while chunk := os.pread(fd, size, size * len(chunks)):
            chunks.append(chunk)
        data = b"".join(chunks)
    return data
