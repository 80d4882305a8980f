"""The registry's take-in of ``agentscope exec``'s spool (see :mod:`._spool`).

``Registry`` calls :func:`take_entry` for each waiting entry at the start of
its next transaction, in any process. An entry is removed only if its name
still holds the file read (its inode), so an exec that claimed the name
meanwhile keeps its claim; the name is claimed by the rule of every launch
(:mod:`._claim`), and a row closed by several takers records one ``lost``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import TYPE_CHECKING

from .._errors import AgentExists, RegistryError
from . import _claim, _spool

if TYPE_CHECKING:
    from ._registry import Registry

__all__ = ["take_entry"]


def take_entry(reg: Registry, path: str) -> None:
    """Take one spool entry in: a row for its launch, or nothing if it has none to give."""
    # Read from one open file, whose inode says later whether the name
    # still holds this entry (see _unlink_same).
    try:
        taken = _spool.read_held(path)
    except OSError as exc:
        # Unreadable for now (out of fds, a permission): kept for next time.
        logging.getLogger("agentscope").warning("spool entry %s not read: %s", path, exc)
        return
    if taken is None:
        return  # taken in meanwhile by another process
    entry, ino = taken
    if entry is not None and os.path.basename(path) not in entry.file_names():
        entry = None  # an entry under another's name: not what an exec writes
    state = entry.state() if entry is not None else "bad"
    if entry is None or state == "starting":  # "starting": its exec still waits
        if entry is None:
            _unlink_same(path, ino)
        return
    close = functools.partial(_claim.close_lost, reg)
    try:
        record = functools.partial(
            reg.record_launch,
            entry.fleet,
            entry.name,
            entry.unit,
            entry.pid,
            entry.start_time,
            entry.argv,
            entry.cwd,
            "running",
            created=entry.created,
            reap_after=entry.reap_after,
        )
        _claim.claim(reg, record, slice_dir=entry.slice_dir, close=close)
    except (AgentExists, RegistryError) as exc:
        # Recorded already (a reconcile found its scope first), or the name
        # is taken: the entry has nothing more to give.
        logging.getLogger("agentscope").info("spool entry %s not recorded: %s", path, exc)
        _unlink_same(path, ino)
        return
    detail = {"unit": entry.unit, "pid": entry.pid, "pids": [entry.pid], "via": "exec"}
    reg.record_event(entry.fleet, entry.name, "adopted", detail, ts=entry.created)
    if state == "lost":  # it ended before anyone looked: as for any adopted agent
        row = reg.by_unit(entry.unit)
        if row is not None:
            close(row)
    _unlink_same(path, ino)


def _unlink_same(path: str, ino: int) -> None:
    """Remove ``path`` only if it is still the file read (inode ``ino``).

    An exec may have claimed the name meanwhile (the entry read was freed
    to its unit's name and a new one linked): that claim must stay.
    """
    try:
        if os.stat(path).st_ino != ino:
            return
    except FileNotFoundError:
        return
    _unlink(path)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
