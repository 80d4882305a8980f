"""The global options of the command line.

A plain class rather than a dataclass: ``agentscope exec`` reads these
before it execs, and importing :mod:`dataclasses` costs it ~0.15 s under TCG.
"""

from __future__ import annotations

import os

__all__ = ["MANAGERS", "MANAGER_FLAGS", "Options", "choose_manager"]

#: The manager's spellings, taken by every command as global options:
#: ``--manager user`` is ``--user``, ``--manager system`` is ``--system``;
#: ``systemd``, ``cgroup`` and ``process`` force a mode (agentscope_systemd/_managers/_modes.py).
MANAGERS = ("auto", "user", "system", "systemd", "cgroup", "process")
MANAGER_FLAGS = {"--user": "user", "--system": "system"}


def choose_manager(manager: str | None, *flags: str) -> str:
    """The manager the options name: ``auto`` unless one spelling names one.

    ``flags`` are the manager flags given (``--user``, ``--system``). Two
    spellings that agree are fine; two that disagree are a usage error.

    Raises:
        BadInput: an unknown manager, or two different ones.
    """
    from ._errors import BadInput

    named = {MANAGER_FLAGS[f] for f in flags}
    if manager is not None and manager != "auto":
        if manager not in MANAGERS:
            raise BadInput(f"--manager {manager!r} is not one of {', '.join(MANAGERS)}")
        named.add(manager)
    if len(named) > 1:
        raise BadInput("choose one manager: --user (--manager user) or --system (--manager system)")
    return named.pop() if named else "auto"


class Options:
    """The global options: which manager and fleet, and how to print."""

    __slots__ = ("debug", "fleet", "json", "manager")

    def __init__(
        self,
        manager: str = "auto",  # "auto": system when root, else user
        fleet: str = "default",
        json: bool = False,
        debug: bool = False,
    ) -> None:
        self.manager = manager
        self.fleet = fleet
        self.json = json
        self.debug = debug

    @property
    def resolved_manager(self) -> str:
        if self.manager in ("system", "user"):
            return self.manager
        return "system" if os.geteuid() == 0 else "user"  # auto, or a mode (_names.MODES)

    def _fields(self) -> tuple[str, str, bool, bool]:
        return (self.manager, self.fleet, self.json, self.debug)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "Options(manager={!r}, fleet={!r}, json={!r}, debug={!r})".format(*self._fields())
