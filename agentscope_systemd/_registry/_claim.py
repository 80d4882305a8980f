"""The one name claim: which open row holds an agent's name, and taking the name.

Every launch path claims an agent's name here: a library launch, a tmux
launch and an adopt (:mod:`._fleet`), a scope found at open
(:mod:`._fleet_reconcile`), and the registry's take-in of an ``agentscope
exec`` (:mod:`._spool_intake`). The registry's partial unique index makes the
claim atomic across processes. An open row holds its name unless it is
stale (:func:`._reconcile_plan.stale`: its scope is gone and no launcher is
at work on it); a stale holder is closed first, and the name claimed after
all.

"Its scope is gone" is one test for every path: no cgroup directory of its
unit in the agents slice. systemd 247 creates an exec's scope's cgroup (and
the registry takes the launch in as running) before it lists or loads the
unit, so asking systemd whether the unit is active took a running exec for
gone, and launched a second agent of its name.

exec's fast path cannot afford SQLite: its claim in the spool (:mod:`._spool`)
only keeps two execs of one name apart, and looks at the same cgroup
directories; the registry's claim here decides when the entry is taken in.
The functions block (SQLite, /proc, cgroupfs): the async core runs them in a
worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import AgentExists, InvalidTransition
from .._fleet._reconcile_plan import stale
from ._records import AgentRecord

if TYPE_CHECKING:  # _registry imports _spool_intake, which claims names here
    from ._registry import Registry

__all__ = ["Close", "claim", "close_lost", "holder", "scope_present"]

Close = Callable[[AgentRecord], object]
"""Closes a stale row: :func:`close_lost`, or the fleet's own (``exited`` when it saw the exit)."""


def scope_present(slice_dir: str | os.PathLike[str], unit: str) -> bool:
    """Whether ``unit``'s scope is there: its cgroup directory in the agents slice."""
    return os.path.isdir(os.path.join(slice_dir, unit))


def close_lost(reg: Registry, rec: AgentRecord) -> AgentRecord:
    """Close ``rec`` as ``lost`` with its ``lost`` event, once of several closers.

    One transaction, the event only if this call moved the row: several
    processes closing one row (spool take-ins at once) record one ``lost``.
    A row another writer closed otherwise meanwhile keeps that close (it
    knew better: an exit status); the row is returned as stored.
    """
    try:
        return reg.set_state(
            rec.unit,
            "lost",
            event="lost",
            detail={"unit": rec.unit, "pid": rec.pid},
            only_on_change=True,
        )
    except InvalidTransition:
        return reg.by_unit(rec.unit) or rec


def holder(
    reg: Registry,
    fleet: str,
    name: str,
    slice_dir: str | os.PathLike[str],
    close: Close,
) -> AgentRecord | None:
    """The open row that holds ``name`` in ``fleet``, or None: the name is free.

    A stale holder is closed on the way (with ``close``) and the name is free.
    """
    rec = reg.get(fleet, name)
    if rec is None or rec.closed:
        return None
    if not stale(rec, scope_present(slice_dir, rec.unit)):
        return rec
    close(rec)
    return None


def claim(
    reg: Registry,
    record: Callable[[], AgentRecord],
    *,
    slice_dir: str | os.PathLike[str],
    close: Close,
) -> AgentRecord:
    """Claim a launch's name: ``record()`` its row, a stale holder closed first.

    ``record`` is :meth:`Registry.record_launch` of ``reg`` with the
    launch's fields bound (``functools.partial``): the claim is the same
    whatever the launch records. A stale row holding the name is closed
    with ``close`` and the launch recorded after all; any other holder
    keeps the name.

    Raises:
        AgentExists: a live agent of that name holds it, or one being launched.
        RegistryError: the unit is already recorded.
    """
    try:
        return record()
    except AgentExists as exc:
        held = reg.by_unit(exc.unit)
        if held is None or not stale(held, scope_present(slice_dir, held.unit)):
            raise  # two agents of one name (or one being launched): the holder keeps it
        close(held)
    return record()
