"""Readers and parsers for cgroup v2 memory files.

Everything here reads cgroupfs synchronously and returns frozen dataclasses;
the async monitor calls these functions from a worker thread. Every reader
takes the cgroup (or the hierarchy root) as a parameter so tests point it at
a fake tree under ``tmp_path``.

File formats are those of Documentation/admin-guide/cgroup-v2.rst and
Documentation/accounting/psi.rst (Linux 6.12).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from .._dicts import Record
from .._managers import _scope

_log = logging.getLogger("agentscope")

__all__ = [
    "PSI_TRIGGERS",
    "CgroupCeiling",
    "CgroupMemory",
    "LimitHolder",
    "MemoryEvents",
    "MemoryStat",
    "Pressure",
    "PressureLine",
    "ScopeCounters",
    "arm_psi_trigger",
    "cgroup_chain",
    "cgroup_path_for_unit",
    "cgroup_v2_mounted",
    "find_limit_holders",
    "memory_controller_enabled",
    "parse_limit",
    "parse_memory_events",
    "parse_memory_stat",
    "parse_pressure",
    "parse_procs",
    "read_ceiling",
    "read_cgroup_memory",
    "read_charge",
    "read_scope_counters",
    "read_subtree_procs",
    "scan_slice",
    "scan_slice_counters",
    "user_manager_cgroup",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")

# PSI triggers (Documentation/accounting/psi.rst): 150 ms of "some" stall in a
# 1 s window, else 300 ms in 2 s (an unprivileged writer's window must be a
# multiple of 2 s on kernels from 6.5).
PSI_TRIGGERS = (b"some 150000 1000000\0", b"some 300000 2000000\0")


def arm_psi_trigger(path: Path) -> int | None:
    """A PSI trigger fd on ``path`` (ready with EPOLLPRI), None when not permitted.

    The first of :data:`PSI_TRIGGERS` the kernel accepts is armed; the fd
    stays open for as long as the trigger should.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        _log.debug("no PSI trigger on %s: %s", path, exc)
        return None
    for trigger in PSI_TRIGGERS:
        try:
            os.write(fd, trigger)
        except OSError as exc:
            _log.debug("PSI trigger %r refused on %s: %s", trigger, path, exc)
            continue
        return fd
    os.close(fd)
    return None


# The one place where OSErrors from cgroupfs and /proc are translated.
#
# ENOENT: the process or cgroup directory is gone (or the kernel lacks the
# file, e.g. memory.peak before 5.19). ESRCH: a task exited while its /proc
# file was being read. ENODEV: reading a file of a cgroup that was removed
# after open (kernfs "deactivated" nodes). These are all "it vanished".
_GONE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENODEV})
# Another user's /proc/PID/smaps_rollup (and, with hidepid, more) is EACCES or
# EPERM: for the readers that only add detail, "cannot see" equals "unknown".
_GONE_OR_DENIED = _GONE | {errno.EACCES, errno.EPERM}
# PSI files read EOPNOTSUPP when pressure accounting is off for that cgroup
# (cgroup.pressure = 0, Linux 6.5+) and are absent with psi=0 on the command line.
_GONE_OR_UNSUPPORTED = _GONE | {errno.EOPNOTSUPP}
# Listing a directory (os.scandir, os.listdir) fails with ENOTDIR where the
# path does not lead to a directory: as for one that vanished, nothing to list.
_GONE_OR_NOT_DIR = _GONE | {errno.ENOTDIR}


# The two system calls behind every read, as module names so tests can make
# them fail with the errnos a real kernel gives (ESRCH, ENODEV, EACCES).
_os_open = os.open
_os_read = os.read

#: More than any kernel file these readers take holds (cgroup.procs of 4M
#: pids is 32 MiB): a tree that is not the kernel's (a test's, a bind
#: mount, a symlink to /dev/zero) cannot make a read grow without bound.
MAX_KERNEL_FILE = 64 << 20


def _read_kernel_file(path: str | Path, tolerate: frozenset[int] = _GONE) -> bytes | None:
    """Read a kernel file whole; None when it fails with one of the ``tolerate`` errnos.

    Every reader in ``_cgroup`` and ``_proc`` goes through here, so the
    question "what counts as vanished" has exactly one answer. ``path`` may
    be a ``str``: the monitor's per-tick readers build paths by string
    formatting, several times cheaper than ``Path`` joins.

    Raises:
        OSError: any other failure (for example EACCES on a file we must read),
            unchanged, so its errno and filename reach the caller.
    """
    try:
        # Raw os.read: no file object. seq_file hands back whole records, but
        # may return less than asked before the end (a record past its
        # buffer), so read until EOF.
        # O_NONBLOCK: no effect on procfs and cgroupfs files, but a FIFO in a
        # tree that is not the kernel's reads as empty instead of hanging.
        fd = _os_open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            data = _os_read(fd, 65536)
            if data:
                chunks, size = [data], len(data)
                while chunk := _os_read(fd, 65536):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_KERNEL_FILE:
                        raise OSError(errno.EFBIG, "larger than any kernel file", path)
                if len(chunks) > 1:
                    data = b"".join(chunks)
        finally:
            os.close(fd)
        return data
    except OSError as exc:
        if exc.errno in tolerate:
            return None
        if exc.filename is None:
            exc.filename = os.fspath(path)  # os.read's errors name no file
        raise


def read_charge(path: str) -> int | None:
    """``memory.current`` + ``memory.swap.current`` of a cgroup (None: unreadable or gone).

    What is charged to the cgroup, in RAM and in swap: the guard's measure of
    a scope and of the cgroups beside the slice.
    """
    try:
        current = _read_kernel_file(path + "/memory.current")
        swap = _read_kernel_file(path + "/memory.swap.current")
    except OSError:
        return None
    if current is None or not current.strip().isdigit():  # bytes: ASCII digits only
        return None
    extra = int(swap) if swap is not None and swap.strip().isdigit() else 0
    return int(current) + extra


# ---------------------------------------------------------------------------
# Pure parsers


def _int(value: bytes, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{what}: {value!r} is not an integer") from None


def _key_values(data: bytes, what: str) -> dict[str, int]:
    """Parse flat-keyed files (``key value`` per line) into a dict."""
    result: dict[str, int] = {}
    for line in data.splitlines():
        key, _, value = line.strip().partition(b" ")
        if not key:
            continue
        result[key.decode("ascii", "replace")] = _int(value.strip(), f"{what} {key!r}")
    return result


@dataclass(frozen=True, slots=True)
class MemoryEvents(Record):
    """The counters of a cgroup's ``memory.events`` (hierarchical).

    ``high`` counts throttling episodes (over memory.high), ``max`` hits of
    memory.max, ``oom`` failed charges, ``oom_kill`` processes killed by the
    OOM killer in this subtree. ``oom_group_kill`` is None on kernels before
    5.17, which do not have it.
    """

    low: int
    high: int
    max: int
    oom: int
    oom_kill: int
    oom_group_kill: int | None = None


def parse_memory_events(data: bytes) -> MemoryEvents:
    """Parse ``memory.events`` (or ``memory.events.local``).

    Keys newer kernels add (``sock_throttled`` in 6.14) are ignored.

    Raises:
        ValueError: a counter is not an integer, or one of low, high, max,
            oom, oom_kill is missing.

    >>> parse_memory_events(b"low 0\\nhigh 3\\nmax 0\\noom 1\\noom_kill 1\\n").oom_kill
    1
    """
    values = _key_values(data, "memory.events")
    try:
        return MemoryEvents(
            low=values["low"],
            high=values["high"],
            max=values["max"],
            oom=values["oom"],
            oom_kill=values["oom_kill"],
            oom_group_kill=values.get("oom_group_kill"),
        )
    except KeyError as exc:
        raise ValueError(f"memory.events: missing counter {exc.args[0]!r}") from None


# Most scopes print the same memory.events (all zeros, or a few counters),
# and it changes rarely: parse each distinct content once. MemoryEvents is
# frozen, so sharing one instance is safe.
_parse_memory_events_cached = functools.lru_cache(maxsize=1024)(parse_memory_events)


@dataclass(frozen=True, slots=True)
class MemoryStat(Record):
    """``memory.stat`` in bytes (and counts, for the event fields).

    ``anon`` and ``file`` are the figures the monitor reports; ``fields``
    holds every key the kernel printed.
    """

    anon: int
    file: int
    fields: Mapping[str, int] = field(default_factory=dict, compare=False, hash=False)


def parse_memory_stat(data: bytes) -> MemoryStat:
    """Parse ``memory.stat``.

    Raises:
        ValueError: a value is not an integer, or ``anon``/``file`` is missing.
    """
    values = _key_values(data, "memory.stat")
    try:
        anon, file = values["anon"], values["file"]
    except KeyError as exc:
        raise ValueError(f"memory.stat: missing {exc.args[0]!r}") from None
    return MemoryStat(anon=anon, file=file, fields=MappingProxyType(values))


@dataclass(frozen=True, slots=True)
class PressureLine(Record):
    """One line of a PSI file: percentages of wall time stalled, and ``total`` in µs."""

    avg10: float
    avg60: float
    avg300: float
    total: int


@dataclass(frozen=True, slots=True)
class Pressure(Record):
    """A PSI file: ``some`` (at least one task stalled) and ``full`` (all stalled).

    ``full`` is None where the file has no ``full`` line.
    """

    some: PressureLine
    full: PressureLine | None


def _parse_pressure_line(rest: bytes) -> PressureLine:
    values: dict[bytes, bytes] = {}
    for item in rest.split():
        key, sep, value = item.partition(b"=")
        if not sep:
            raise ValueError(f"pressure: {item!r} is not key=value")
        values[key] = value
    try:
        return PressureLine(
            avg10=float(values[b"avg10"]),
            avg60=float(values[b"avg60"]),
            avg300=float(values[b"avg300"]),
            total=int(values[b"total"]),
        )
    except KeyError as exc:
        raise ValueError(f"pressure: missing {exc.args[0].decode()!r}") from None


def parse_pressure(data: bytes) -> Pressure:
    """Parse a PSI file (``memory.pressure``, ``/proc/pressure/memory``).

    Raises:
        ValueError: no ``some`` line, or a malformed field.

    >>> parse_pressure(b"some avg10=12.50 avg60=3.00 avg300=0.50 total=991\\n").some.avg10
    12.5
    """
    lines: dict[bytes, PressureLine] = {}
    for line in data.splitlines():
        kind, _, rest = line.strip().partition(b" ")
        if kind in (b"some", b"full"):
            lines[kind] = _parse_pressure_line(rest)
    if b"some" not in lines:
        raise ValueError(f"pressure: no 'some' line in {data[:80]!r}")
    return Pressure(some=lines[b"some"], full=lines.get(b"full"))


def parse_procs(data: bytes) -> tuple[int, ...]:
    """Parse ``cgroup.procs`` (one pid per line)."""
    return tuple(map(int, data.split()))


def parse_limit(data: bytes) -> int | None:
    """Parse ``memory.high`` / ``memory.max``: bytes, or None for ``max`` (no limit)."""
    value = data.strip()
    return None if value == b"max" else _int(value, "memory limit")


# ---------------------------------------------------------------------------
# Readers


@dataclass(frozen=True, slots=True)
class CgroupMemory(Record):
    """A cgroup's memory figures at one moment (bytes).

    ``peak`` is None on kernels before 5.19 (no ``memory.peak``), ``pressure``
    None where PSI is off. ``pids`` are the cgroup's own processes, not its
    descendants'.
    """

    current: int
    peak: int | None
    events: MemoryEvents
    anon: int
    file: int
    pids: tuple[int, ...]
    pressure: Pressure | None


def read_subtree_procs(path: str | Path) -> bytes | None:
    """``cgroup.procs`` of a scope and of every cgroup below it, joined; None: gone.

    A delegated scope holds no process itself: its agent's are in its
    ``agent`` leaf and its calls' in theirs (:mod:`._calls`), so "the
    processes of this agent" are its whole subtree's. A scope with
    processes of its own has no sub-cgroup to walk (cgroup v2's
    no-internal-processes rule, once its controllers are enabled): one read.

    Raises:
        OSError: other than the cgroup vanishing.
    """
    base = os.fspath(path)
    # A Path stays one (the report's readers), a str too (the monitor's per-tick ones).
    own = _read_kernel_file(
        path / "cgroup.procs" if isinstance(path, Path) else base + "/cgroup.procs"
    )
    if own is None or own.strip():
        return own
    parts = [own]
    for top, dirs, _files in os.walk(base):
        for d in dirs:
            # Gone meanwhile, or a threaded cgroup (EOPNOTSUPP): its processes are not listed.
            procs = _read_kernel_file(f"{top}/{d}/cgroup.procs", _GONE_OR_UNSUPPORTED)
            if procs:
                parts.append(procs if procs.endswith(b"\n") else procs + b"\n")
    return b"".join(parts)


def read_cgroup_memory(path: Path) -> CgroupMemory | None:
    """Read the memory figures of the cgroup directory ``path``.

    Returns None when the cgroup is gone (it may vanish at any point of the
    read) or has no memory accounting: the root cgroup and cgroups whose
    parent does not enable the memory controller have no ``memory.current``
    (:func:`memory_controller_enabled` tells these apart).

    Raises:
        OSError: other than the cgroup vanishing (e.g. EACCES).
        ValueError: a file holds something that is not its documented format.
    """
    current = _read_kernel_file(path / "memory.current")
    if current is None:
        return None
    # Read memory.peak before the files every kernel has: if it is missing
    # and they are still there, the kernel predates it (5.19), the cgroup did
    # not just vanish.
    peak = _read_kernel_file(path / "memory.peak")
    events = _read_kernel_file(path / "memory.events")
    stat = _read_kernel_file(path / "memory.stat")
    procs = read_subtree_procs(path)
    if events is None or stat is None or procs is None:
        return None
    pressure = _read_kernel_file(path / "memory.pressure", _GONE_OR_UNSUPPORTED)
    memory_stat = parse_memory_stat(stat)
    return CgroupMemory(
        current=_int(current.strip(), "memory.current"),
        peak=None if peak is None else _int(peak.strip(), "memory.peak"),
        events=parse_memory_events(events),
        anon=memory_stat.anon,
        file=memory_stat.file,
        pids=parse_procs(procs),
        pressure=None if pressure is None else parse_pressure(pressure),
    )


def scan_slice(slice_path: Path) -> dict[str, CgroupMemory]:
    """Read every scope directly under a slice, keyed by unit name.

    One pass over the slice's ``*.scope`` children; scopes that vanish during
    the pass are left out, and a slice that does not exist (no agent running,
    so systemd removed it) gives ``{}``. Read the slice's own figures with
    :func:`read_cgroup_memory`.

    Raises:
        OSError: other than cgroups vanishing.
    """
    try:
        entries = list(os.scandir(slice_path))
    except OSError as exc:
        if exc.errno in _GONE_OR_NOT_DIR:
            return {}
        raise
    result: dict[str, CgroupMemory] = {}
    for entry in sorted(entries, key=lambda e: e.name):
        if not entry.name.endswith(".scope"):
            continue
        memory = read_cgroup_memory(Path(entry.path))
        if memory is not None:
            result[entry.name] = memory
    return result


class ScopeCounters(NamedTuple):
    """The per-tick figures of a cgroup: what the monitor needs at every sample.

    ``current`` is ``memory.current`` (bytes), ``events`` its
    ``memory.events``, ``pids`` its own processes (``cgroup.procs``). The
    report data (``memory.peak``, ``memory.stat``, ``memory.pressure``) is
    left to :func:`read_cgroup_memory`.
    """

    current: int
    events: MemoryEvents
    pids: tuple[int, ...]


def read_scope_counters(path: str | Path) -> ScopeCounters | None:
    """Read ``memory.current``, ``memory.events`` and ``cgroup.procs`` of the cgroup ``path``.

    Three reads where :func:`read_cgroup_memory` makes six. None when the
    cgroup is gone (at any point of the read) or has no memory accounting.

    Raises:
        OSError: other than the cgroup vanishing (e.g. EACCES).
        ValueError: a file holds something that is not its documented format.
    """
    base = os.fspath(path)
    current = _read_kernel_file(base + "/memory.current")
    if current is None:
        return None
    events = _read_kernel_file(base + "/memory.events")
    procs = read_subtree_procs(base)
    if events is None or procs is None:
        return None
    try:
        value = int(current)
    except ValueError:
        raise ValueError(f"memory.current: {current!r} is not an integer") from None
    return ScopeCounters(value, _parse_memory_events_cached(events), parse_procs(procs))


def scan_slice_counters(slice_path: Path) -> dict[str, ScopeCounters]:
    """:func:`read_scope_counters` of every scope directly under a slice, keyed by unit name.

    As :func:`scan_slice` (vanished scopes left out, a missing slice gives
    ``{}``), reading only the per-tick files.

    Raises:
        OSError: other than cgroups vanishing.
    """
    try:
        with os.scandir(slice_path) as it:
            entries = [(e.name, e.path) for e in it if e.name.endswith(".scope")]
    except OSError as exc:
        if exc.errno in _GONE_OR_NOT_DIR:
            return {}
        raise
    entries.sort()
    result: dict[str, ScopeCounters] = {}
    for name, path in entries:
        counters = read_scope_counters(path)
        if counters is not None:
            result[name] = counters
    return result


def cgroup_path_for_unit(manager_root: Path, slice_name: str, unit: str | None = None) -> Path:
    """The cgroup directory of ``unit`` in ``slice_name`` (or of the slice itself).

    ``manager_root`` is the cgroup of the systemd manager whose tree it is:
    ``/sys/fs/cgroup`` for the system manager, ``user_manager_cgroup(uid)``
    for a user manager. The dashes in a slice name are its hierarchy::

        >>> cgroup_path_for_unit(Path("/sys/fs/cgroup"), "app-agentscope-agents.slice")
        PosixPath('/sys/fs/cgroup/app.slice/app-agentscope.slice/app-agentscope-agents.slice')

    Raises:
        ValueError: ``slice_name`` is not a valid slice name, or ``unit`` holds a '/'.
    """
    path = manager_root.joinpath(*_scope.slice_parts(slice_name))
    if unit is None:
        return path
    if not unit or "/" in unit or unit in (".", ".."):
        raise ValueError(f"{unit!r} is not a unit name")
    return path / unit


def user_manager_cgroup(uid: int, cgroup_root: Path = CGROUP_ROOT) -> Path:
    """The cgroup of ``user@UID.service``, root of that user manager's units."""
    return Path(_scope.manager_cgroup("user", uid, str(cgroup_root)))


def _resolve(cgroup_root: Path, path: Path | str) -> Path:
    """Accept a directory under ``cgroup_root`` or a ``/proc/PID/cgroup``-style path."""
    candidate = Path(path)
    if candidate.is_relative_to(cgroup_root):
        return candidate
    return cgroup_root / str(path).lstrip("/")


@dataclass(frozen=True, slots=True)
class LimitHolder:
    """A cgroup that sets ``memory.high`` or ``memory.max`` (bytes; None = no limit)."""

    path: Path
    high: int | None
    max: int | None

    @property
    def unit(self) -> str:
        """The unit owning the cgroup (its directory name), e.g. ``app-agentscope-agents.slice``."""
        return self.path.name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields, for reports."""
        return {"path": str(self.path), "unit": self.unit, "high": self.high, "max": self.max}


def find_limit_holders(cgroup_root: Path, path: Path | str) -> tuple[LimitHolder, ...]:
    """The cgroups from ``path`` up to (not including) the root that set a memory limit.

    Nearest first: the first one with ``high`` set is the unit whose
    MemoryHigh throttles processes in ``path``. ``path`` is a directory under
    ``cgroup_root`` or a cgroup path as in ``/proc/PID/cgroup`` (``/user.slice/...``).
    Cgroups that vanish, or lack the files, are skipped.

    Raises:
        OSError: other than a cgroup vanishing.
    """
    root = cgroup_root
    current = _resolve(root, path)
    holders: list[LimitHolder] = []
    while current != root and current.is_relative_to(root):
        high_data = _read_kernel_file(current / "memory.high")
        max_data = _read_kernel_file(current / "memory.max")
        high = None if high_data is None else parse_limit(high_data)
        limit = None if max_data is None else parse_limit(max_data)
        if high is not None or limit is not None:
            holders.append(LimitHolder(path=current, high=high, max=limit))
        current = current.parent
    return tuple(holders)


#: A cgroup path deeper than this is not followed (the kernel allows any depth).
MAX_CHAIN = 64


def cgroup_chain(cgroup_root: Path, path: Path | str) -> tuple[str, ...]:
    """``path`` and its ancestors up to ``cgroup_root`` itself, nearest first (absolute paths).

    ``path`` is a directory under ``cgroup_root`` or a cgroup path as in
    ``/proc/PID/cgroup``. The root is included: inside a container's cgroup
    namespace it is the container's own cgroup, with its limits (a host's
    real root has none). Paths only: whether they exist is the reader's
    question. A path with ``..`` (a cgroup outside this namespace), or one
    not under the root, gives the root alone; at most :data:`MAX_CHAIN`.
    """
    root = os.fspath(cgroup_root).rstrip("/") or "/"
    text = os.fspath(path)
    rel = text[len(root) :] if text == root or text.startswith(root + "/") else text
    parts = [p for p in rel.split("/") if p]
    if any(p in (".", "..") for p in parts):
        parts = []
    chain = [root + "/" + "/".join(parts[:n]) for n in range(len(parts), 0, -1)]
    return (*chain[: MAX_CHAIN - 1], root)


@dataclass(frozen=True, slots=True)
class CgroupCeiling:
    """A cgroup's memory limits (bytes; None: ``max``, or the file is absent).

    ``high`` throttles, ``max`` is where the kernel's OOM killer acts within
    the cgroup (all of it at once with ``memory.oom.group`` 1, as the kubelet
    sets on every container from Kubernetes 1.28); ``swap_max`` caps its
    swap. ``limit`` is the lower of ``high`` and ``max``.
    """

    path: str
    high: int | None
    max: int | None
    swap_max: int | None

    @property
    def limit(self) -> int | None:
        """The lower of ``memory.high`` and ``memory.max`` (None: neither is set)."""
        values = [v for v in (self.high, self.max) if v is not None]
        return min(values) if values else None

    @property
    def kind(self) -> str:
        """Which file sets :attr:`limit`: ``memory.max`` (also on a tie) or ``memory.high``."""
        if self.high is not None and (self.max is None or self.high < self.max):
            return "memory.high"
        return "memory.max"


def _limit_or_none(data: bytes | None) -> int | None:
    if data is None:
        return None
    try:
        return parse_limit(data)
    except ValueError:
        return None


def read_ceiling(path: str) -> CgroupCeiling | None:
    """``memory.high``, ``memory.max`` and ``memory.swap.max`` of the cgroup ``path``.

    None when the cgroup is gone, cannot be read, or has neither limit file
    (the host's root cgroup, a cgroup without the memory controller). A
    file that is not in its format counts as no limit: a reader of another's
    cgroup is never made to fail by it.
    """
    try:
        high = _read_kernel_file(path + "/memory.high", _GONE_OR_DENIED)
        top = _read_kernel_file(path + "/memory.max", _GONE_OR_DENIED)
        swap = _read_kernel_file(path + "/memory.swap.max", _GONE_OR_DENIED)
    except OSError:
        return None
    if high is None and top is None:
        return None
    return CgroupCeiling(path, _limit_or_none(high), _limit_or_none(top), _limit_or_none(swap))


def cgroup_v2_mounted(cgroup_root: Path = CGROUP_ROOT) -> bool:
    """True when ``cgroup_root`` is a cgroup v2 hierarchy (it has ``cgroup.controllers``).

    On a v1/v2 hybrid host ``/sys/fs/cgroup`` is a tmpfs of v1 hierarchies
    and this is False (the v2 tree is at ``/sys/fs/cgroup/unified``).
    """
    return (cgroup_root / "cgroup.controllers").is_file()


def memory_controller_enabled(path: Path) -> bool:
    """True when the memory controller is available in the cgroup ``path``.

    False also when the cgroup is gone.
    """
    data = _read_kernel_file(path / "cgroup.controllers")
    return data is not None and b"memory" in data.split()
