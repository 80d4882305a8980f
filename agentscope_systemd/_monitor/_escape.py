"""The escape audit: an agent's descendants that live outside its scope.

A process is born in its parent's cgroup, so everything an agent starts is in
its scope unless something moved it out: ``systemd-run --scope`` from inside
the agent (the new scope lands in the manager's default slice), tmux built
with systemd support (each pane in its own ``tmux-spawn-*.scope``), or a
process that wrote its pid into another cgroup's ``cgroup.procs``
(docs/escapes.md). Such a process still
uses the host's memory on the agent's behalf, but no longer counts in its
scope, its cap or its OOM kills.

How they are found. From each scope's own processes, the kernel's parent
links (``/proc/PID/task/TID/children``, one file per thread) lead to their
children; a child that is not in the scope has its ``/proc/PID/cgroup``
read, and one outside the agents slice is an escapee, whose own children
are followed the same way. A child in another scope of the agents slice is
that agent's (a nested ``agentscope exec``), not an escape. Escapees found
before are passed back in (``follow``) and checked again by pid and start
time, so one whose parent died (reparented to init or a subreaper) is still
counted. The cost is one ``children`` read per thread of the slice's
processes and one ``cgroup`` read per child outside its scope: O(processes
in the slice), never a pass over the host, bounded by ``max_processes``.

Everything read is untrusted (a comm and a cgroup path are chosen by the
process): both are cleaned to printable text and cut to
:data:`MAX_COMM`/:data:`MAX_CGROUP` characters; the unit is taken from the
path only if it is a valid unit name. None of them goes into a path, argv or
markup here; the reclaim call passes only pids and the agent's own unit.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import _names, _numbers
from .._calls._calls import AGENT_LEAF
from .._dicts import Record
from .._kernel._cgroup import _GONE_OR_NOT_DIR, CGROUP_ROOT, _read_kernel_file
from .._kernel._proc import PROC_ROOT, read_cgroup, read_stat, read_statm_rss, same_process

__all__ = [
    "MAX_CGROUP",
    "MAX_COMM",
    "MAX_PROCESSES",
    "Attach",
    "EscapeLedger",
    "Escapee",
    "Mover",
    "find_escapes",
    "inside",
    "slice_cgroup_path",
    "unit_of_cgroup",
    "write_procs",
]

#: A comm is at most 15 bytes on Linux (TASK_COMM_LEN less the NUL).
MAX_COMM = 15
#: Cgroup paths are cut to this many characters in events and reports.
MAX_CGROUP = 512
#: Processes one audit visits at most (all agents together): a fork bomb
#: outside its scope must not make a sample unbounded.
MAX_PROCESSES = 20_000
#: The unit types whose names end a cgroup path component.
_UNIT_SUFFIXES = (".scope", ".service", ".slice")


@dataclass(frozen=True, slots=True)
class Escapee(Record):
    """A descendant of an agent's scope that lives in another cgroup.

    ``scope`` is the agent's unit (where it belongs); ``cgroup`` the v2 path
    it lives in now and ``to_unit`` the unit of that cgroup (None when the
    path names none, or not a valid one); ``rss`` bytes, 0 if unreadable.
    ``comm`` and ``cgroup`` are cleaned and cut (:data:`MAX_COMM`,
    :data:`MAX_CGROUP`).
    """

    scope: str
    pid: int
    start_time: int
    ppid: int
    comm: str
    cgroup: str
    to_unit: str | None
    rss: int

    @property
    def key(self) -> tuple[str, int, int]:
        """Who it is, for reporting once: (scope, pid, start time)."""
        return (self.scope, self.pid, self.start_time)


def clean(text: str, limit: int) -> str:
    """``text`` as printable characters only (others become ``?``), cut to ``limit``."""
    cut = text[:limit]
    return "".join(c if c.isprintable() else "?" for c in cut)


def unit_of_cgroup(cgroup: str) -> str | None:
    """The unit a cgroup path ends in (its deepest ``*.scope``/``.service``/``.slice``).

    None when no component is a valid unit name (``[A-Za-z0-9:_.-@\\]``, at
    most 255 characters): a path a process chose must not pass as a unit.
    """
    for part in reversed(cgroup.split("/")):
        if part.endswith(_UNIT_SUFFIXES):
            if _names.is_unit_name(part):
                return part
            return None
    return None


def slice_cgroup_path(slice_path: Path, cgroup_root: Path = CGROUP_ROOT) -> str | None:
    """The slice as ``/proc/PID/cgroup`` names it (``/user.slice/.../x.slice``).

    None when ``slice_path`` is not below ``cgroup_root``.
    """
    if not slice_path.is_relative_to(cgroup_root):
        return None
    return "/" + slice_path.relative_to(cgroup_root).as_posix()


def inside(cgroup: str, base: str) -> bool:
    """Whether the cgroup path ``cgroup`` is ``base`` or below it."""
    return cgroup == base or cgroup.startswith(base + "/")


def read_children(pid: int, proc_root: Path = PROC_ROOT) -> list[int]:
    """The children of every thread of ``pid`` (``/proc/PID/task/*/children``).

    Empty when the process is gone. Needs CONFIG_PROC_CHILDREN (Debian's
    kernels have it); without it, every list is empty.

    Raises:
        OSError: other than the process vanishing.
    """
    task_dir = f"{os.fspath(proc_root)}/{pid}/task"
    try:
        tids = [e for e in os.listdir(task_dir) if _numbers.is_digits(e)]
    except OSError as exc:
        if exc.errno in _GONE_OR_NOT_DIR:
            return []
        raise
    children: list[int] = []
    for tid in tids:
        data = _read_kernel_file(f"{task_dir}/{tid}/children")
        if data:
            # pids only: digits, and never 0 (the idle task, no process to follow)
            children.extend(int(p) for p in data.split() if _numbers.is_digits(p) and p.strip(b"0"))
    return children


def _escapee(
    scope: str,
    pid: int,
    cgroup: str,
    proc_root: Path,
    start_time: int | None = None,
    parent: int | None = None,
) -> Escapee | None:
    """``pid`` as an escapee of ``scope``; None when it is gone, or not who it should be.

    ``start_time``: it must be that process (a followed escapee). ``parent``:
    it must be that process's child now (#31): a pid read from a
    ``children`` file may have ended and been reused by an unrelated
    process (root's included) by the time it is read again.
    """
    if start_time is None:
        stat = read_stat(pid, proc_root)
    else:
        stat = same_process(pid, start_time, proc_root)
    if stat is None or stat.state in ("Z", "X"):
        return None  # gone, not that process, or as good as gone: a zombie holds no memory
    if parent is not None and stat.ppid != parent:
        return None
    cg = clean(cgroup, MAX_CGROUP)
    return Escapee(
        scope=scope,
        pid=pid,
        start_time=stat.start_time,
        ppid=stat.ppid,
        comm=clean(stat.comm, MAX_COMM),
        cgroup=cg,
        to_unit=unit_of_cgroup(cgroup),
        rss=read_statm_rss(pid, proc_root) or 0,
    )


def find_escapes(
    slice_path: Path,
    scopes: Mapping[str, Iterable[int]],
    *,
    follow: Iterable[Escapee] = (),
    cgroup_root: Path = CGROUP_ROOT,
    proc_root: Path = PROC_ROOT,
    max_processes: int = MAX_PROCESSES,
) -> tuple[Escapee, ...]:
    """Every descendant of the scopes' processes that lives outside the agents slice.

    ``scopes`` maps each scope (unit name, directly below ``slice_path``) to
    its own processes (its ``cgroup.procs``); ``follow`` are escapees found
    before, counted again while they live (same pid and start time) outside
    the slice, even with no parent link left. Processes that vanish during
    the walk are left out. Sorted by scope, then pid.

    Raises:
        OSError: other than processes vanishing.
    """
    slice_cg = slice_cgroup_path(slice_path, cgroup_root)
    if slice_cg is None:
        return ()
    found: dict[tuple[str, int], Escapee] = {}
    budget = max_processes
    followed: dict[str, list[Escapee]] = {}
    for old in follow:
        followed.setdefault(old.scope, []).append(old)
    for scope in sorted(scopes.keys() | followed.keys()):
        own = set(scopes.get(scope, ()))
        scope_cg = f"{slice_cg}/{scope}"
        visited = set(own)
        stack = sorted(own)
        for old in followed.get(scope, ()):
            if old.pid in visited:
                continue
            cgroup = read_cgroup(old.pid, proc_root)
            if cgroup is None or inside(cgroup, slice_cg):
                continue  # gone, or back in a scope of the slice
            again = _escapee(scope, old.pid, cgroup, proc_root, old.start_time)
            if again is not None:
                visited.add(old.pid)
                found[(scope, old.pid)] = again
                stack.append(old.pid)
        while stack and budget > 0:
            pid = stack.pop()
            budget -= 1
            for child in read_children(pid, proc_root):
                if child in visited:
                    continue
                visited.add(child)
                cgroup = read_cgroup(child, proc_root)
                if cgroup is None:
                    continue  # gone
                if inside(cgroup, scope_cg):
                    stack.append(child)  # forked in after cgroup.procs was read
                    continue
                if inside(cgroup, slice_cg):
                    continue  # another agent's scope: counted there
                escapee = _escapee(scope, child, cgroup, proc_root, parent=pid)
                if escapee is not None:
                    found[(scope, child)] = escapee
                    stack.append(child)
    return tuple(found[k] for k in sorted(found))


# ---------------------------------------------------------------------------
# The monitor's side: reporting once, moving back


#: Moves pids into a unit's cgroup: the fleet passes systemd's
#: ``AttachProcessesToUnit(unit, "", pids)``; raises AgentscopeError on refusal.
Attach = Callable[[str, Sequence[int]], Awaitable[object]]


class EscapeLedger:
    """The escapees reported so far, so each is reported once (loop thread only).

    Keyed by (scope, pid, start time). An escapee no longer found (it
    exited, or is back in its scope) is forgotten, so the ledger holds only
    what the last audit found; one that escapes again is reported again.
    """

    def __init__(self) -> None:
        self._reported: dict[tuple[str, int, int], Escapee] = {}

    @property
    def current(self) -> tuple[Escapee, ...]:
        """The escapees of the last audit: the next audit's ``follow``."""
        return tuple(self._reported.values())

    def update(self, found: Iterable[Escapee]) -> list[Escapee]:
        """Take an audit's result; return the escapees not reported before."""
        now = {e.key: e for e in found}
        new = [e for key, e in now.items() if key not in self._reported]
        self._reported = now
        return new


#: systemd's answer to AttachProcessesToUnit on a unit without Delegate=yes
#: (every agent scope): measured on 257, the check exists since 238.
_NOT_DELEGATED = "non-delegated"


def write_procs(slice_path: Path, scope: str, pid: int) -> None:
    """Move ``pid`` into ``slice_path/scope`` by writing ``cgroup.procs`` (the kernel's way).

    ``scope`` must be a scope unit's name (a directory of the slice, never
    reached through a symlink). The kernel lets the writer move a process
    when it may write the destination's and the common ancestor's
    ``cgroup.procs`` (Documentation/admin-guide/cgroup-v2.rst, "Delegation
    Containment"): root, or the user manager's own user within its subtree.

    Raises:
        ValueError: ``scope`` is not a scope unit's name.
        OSError: the write was refused (EACCES, ESRCH: the process is gone).
    """
    if not scope.endswith(".scope") or not _names.is_unit_name(scope):
        raise ValueError(f"{scope!r} is not a scope unit's name")
    slice_fd = os.open(slice_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        scope_fd = os.open(
            scope, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=slice_fd
        )
        try:
            # A delegated scope holds its processes in its agent leaf (_calls.py):
            # its own cgroup.procs refuses them (cgroup v2's no-internal-processes rule).
            target = "cgroup.procs"
            try:
                os.stat(AGENT_LEAF, dir_fd=scope_fd, follow_symlinks=False)
                target = f"{AGENT_LEAF}/cgroup.procs"
            except FileNotFoundError:
                pass
            fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=scope_fd)
            try:
                os.write(fd, f"{pid}\n".encode())
            finally:
                os.close(fd)
        finally:
            os.close(scope_fd)
    finally:
        os.close(slice_fd)


#: Parent links followed from an escapee to its agent's scope, at most.
_MAX_CHAIN = 256


def _still_escapee(e: Escapee, scope_cg: str, proc_root: Path) -> str | None:
    """Why ``e`` may not be moved into ``scope_cg`` now; None when it may.

    It must be the process found (pid and start time), and a descendant of
    the scope: one of its ancestors lives in the scope now.
    """
    stat = same_process(e.pid, e.start_time, proc_root)
    if stat is None:
        return "the process exited (its pid is not the escapee's any more)"
    ppid = stat.ppid
    for _ in range(_MAX_CHAIN):
        if ppid <= 1:
            break
        cgroup = read_cgroup(ppid, proc_root)
        if cgroup is not None and inside(cgroup, scope_cg):
            return None
        parent = read_stat(ppid, proc_root)
        if parent is None:
            break
        ppid = parent.ppid
    return f"no longer a descendant of {e.scope} (its parent chain leads elsewhere): left alone"


@dataclass(frozen=True)
class Mover:
    """How processes are moved into the scopes of an agents slice, and checked after.

    The one rule for the escape audit's :meth:`reclaim` and a fleet's adopt
    (:meth:`move_into`). First ``attach`` (systemd's
    ``AttachProcessesToUnit``), one call per scope. systemd refuses it for a
    unit without ``Delegate=yes``, which every agent scope is ("Process
    migration not available on non-delegated units"): then each pid is
    written into the scope's ``cgroup.procs`` (``write``,
    :func:`write_procs`). Whether a process is back is read from its
    ``/proc/PID/cgroup`` afterwards, never assumed from a reply.
    """

    attach: Attach
    slice_path: Path
    cgroup_root: Path = CGROUP_ROOT
    proc_root: Path = PROC_ROOT
    write: Callable[[Path, str, int], None] = write_procs

    async def reclaim(self, escapees: Sequence[Escapee]) -> dict[int, str | None]:
        """Move ``escapees`` back into their scopes; per pid, None if it worked, else why not.

        Each escapee's identity is checked again at the moment it is moved
        (#31): the same process (pid and start time) and still a descendant
        of its agent (its parent chain leads into the agent's scope); else it
        is left where it is, with the reason. A reused pid is never written
        into an agent's ``cgroup.procs``.
        """
        slice_cg = slice_cgroup_path(self.slice_path, self.cgroup_root)
        known = {e.pid: e for e in escapees}

        def verify(scope: str, pid: int) -> str | None:
            e = known.get(pid)
            if e is None or slice_cg is None:
                return "not an escapee found by the audit"
            return _still_escapee(e, f"{slice_cg}/{scope}", self.proc_root)

        return await self._move([(e.scope, e.pid) for e in escapees], verify)

    async def move_into(self, scope: str, pids: Sequence[int]) -> dict[int, str | None]:
        """Move ``pids`` into ``scope`` of the slice; per pid, None if it worked, else why not."""
        return await self._move([(scope, pid) for pid in pids])

    async def _move(
        self,
        moves: Sequence[tuple[str, int]],
        verify: Callable[[str, int], str | None] | None = None,
    ) -> dict[int, str | None]:
        import asyncio

        from .._errors import AgentscopeError, BusError

        slice_cg = slice_cgroup_path(self.slice_path, self.cgroup_root)
        unverified: dict[int, str] = {}
        if verify is not None:  # checked before systemd is asked, and again before each write
            checked = await asyncio.to_thread(lambda: [(s, p, verify(s, p)) for s, p in moves])
            unverified = {p: why for _s, p, why in checked if why is not None}
            moves = [(s, p) for s, p, why in checked if why is None]
        by_scope: dict[str, list[int]] = {}
        for scope, pid in moves:
            by_scope.setdefault(scope, []).append(pid)
        refused: dict[str, str] = {}
        direct: set[str] = set()
        for scope, pids in by_scope.items():
            if await asyncio.to_thread(os.path.isdir, self.slice_path / scope / AGENT_LEAF):
                direct.add(scope)  # systemd would write the scope's own cgroup.procs: refused
                continue
            try:
                await self.attach(scope, pids)
            except BusError as exc:
                if _NOT_DELEGATED in exc.message:
                    direct.add(scope)
                else:
                    refused[scope] = clean(str(exc), MAX_CGROUP)
            except AgentscopeError as exc:
                refused[scope] = clean(str(exc), MAX_CGROUP)

        def move_and_check() -> dict[int, str | None]:
            result: dict[int, str | None] = {}
            for scope, pid in moves:
                error = refused.get(scope)
                if scope in direct:
                    why = verify(scope, pid) if verify is not None else None
                    if why is not None:
                        result[pid] = why
                        continue
                    try:
                        self.write(self.slice_path, scope, pid)
                    except (OSError, ValueError) as exc:
                        error = clean(f"cannot write {scope}/cgroup.procs: {exc}", MAX_CGROUP)
                cgroup = read_cgroup(pid, self.proc_root)
                if (
                    slice_cg is not None
                    and cgroup is not None
                    and inside(cgroup, f"{slice_cg}/{scope}")
                ):
                    result[pid] = None
                elif error is not None:
                    result[pid] = error
                elif cgroup is None:
                    result[pid] = "the process exited"
                else:
                    result[pid] = f"the move was accepted, but it is in {clean(cgroup, 200)}"
            return result

        return {**unverified, **await asyncio.to_thread(move_and_check)}
