"""Process mode's agents as process trees: who is a member now, read from /proc.

In process mode (:mod:`._procscopes`) an agent's "scope" is its recorded
processes (pid and start time, in the mirror's ``members`` file) and every
live descendant of them. This module is that rule, once, for both of its
readers: the process manager, which writes the mirror as it lists its
agents, and the guard, which must know a tool call spawned since the last
listing (its scan walks the trees itself, at each choice; it never waits
on the manager's lock to do so: issue #25 item 4).

Everything here is a plain read of ``/proc`` and of the mirror's small
files; a process that exits mid-read is left out, never an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._dicts import json_object
from .._names import parse_description
from ._proc import PROC_ROOT, iter_pids, read_stat, same_process

__all__ = [
    "MEMBERS",
    "SCOPE_META",
    "ProcessTrees",
    "children_of",
    "is_mirror",
    "mirrored_agent",
    "read_members",
    "read_meta",
    "tree_members",
]

#: The mirror's file of a scope's members, one ``PID START`` per line.
MEMBERS = "members"
#: The mirror's record of whose a scope is (its Description, as systemd's).
SCOPE_META = "scope.json"
#: At most this many members are read from one scope's file.
MAX_MEMBERS = 100_000


def is_mirror(slice_path: Path, cgroup_root: Path) -> bool:
    """The agents "slice" is process mode's mirror, not a cgroup (it is outside the cgroupfs).

    Process mode keeps its mirror under the fleet's runtime directory
    (:func:`._procscopes.mirror_root`), never in the cgroupfs; every other
    mode's slice is a cgroup directory under ``cgroup_root``.
    """
    return not Path(slice_path).is_relative_to(cgroup_root)


def read_members(scope_dir: Path | str) -> dict[int, int]:
    """A mirrored scope's recorded members, pid -> start time ({} when unreadable)."""
    try:
        with open(os.path.join(scope_dir, MEMBERS), "rb") as f:
            data = f.read(MAX_MEMBERS * 24)
    except OSError:
        return {}
    out = {}
    for line in data.splitlines()[:MAX_MEMBERS]:
        pid, _, start = line.partition(b" ")
        if pid.isdigit() and start.isdigit():
            out[int(pid)] = int(start)
    return out


def read_meta(path: Path) -> dict[str, Any] | None:
    """A scope's small JSON record (its owner's description), None when unreadable."""
    try:
        raw = path.read_bytes()[:65536]
    except OSError:
        return None
    return json_object(raw)


def mirrored_agent(scope_dir: Path) -> str | None:
    """The agent a mirrored scope is of, from its Description (None: unreadable, not ours).

    What the guard names a victim by when no sample has named its scope yet:
    one small read of the fleet's own runtime directory, after the kill.
    """
    meta = read_meta(Path(scope_dir) / SCOPE_META)
    owner = None if meta is None else parse_description(str(meta.get("description", "")))
    return None if owner is None else owner[1]


def children_of(proc_root: Path = PROC_ROOT) -> dict[int, list[int]]:
    """Every process's children now (ppid -> pids), from one pass over ``/proc``."""
    out: dict[int, list[int]] = {}
    for pid in iter_pids(proc_root):
        st = read_stat(pid, proc_root)
        if st is not None:
            out.setdefault(st.ppid, []).append(pid)
    return out


def tree_members(
    recorded: dict[int, int], children: dict[int, list[int]], proc_root: Path = PROC_ROOT
) -> dict[int, int]:
    """The live members of a scope: its recorded processes still alive, and their descendants.

    A recorded process counts only while its start time is the recorded one
    (a reused pid is never a member); zombies are left out.
    """
    live: dict[int, int] = {}
    for pid, start in recorded.items():
        if same_process(pid, start, proc_root) is not None:
            live[pid] = start
    todo = list(live)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in live:
                st = read_stat(child, proc_root)
                if st is not None and st.state not in ("Z", "X"):
                    live[child] = st.start_time
                    todo.append(child)
    return live


class ProcessTrees:
    """The guard's view of process mode's agents at one scan: a scope directory -> its pids.

    Made once per scan: ``/proc`` is walked once, when the first scope is
    asked for, and every scope's tree is read from that walk.
    """

    def __init__(self, proc_root: Path = PROC_ROOT) -> None:
        self.proc_root = proc_root
        self._children: dict[int, list[int]] | None = None

    def pids(self, scope_dir: str) -> list[int]:
        """The pids of the scope mirrored at ``scope_dir`` now (its tree, not its last listing)."""
        if self._children is None:
            self._children = children_of(self.proc_root)
        members = tree_members(read_members(scope_dir), self._children, self.proc_root)
        return sorted(members)
