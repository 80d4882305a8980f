"""What a guard's owner holds of it, the same for a thread and a process.

:class:`GuardBase` keeps the options both kinds of guard take (what to
guard, whom to tell, what never to kill, where the kernel's files are) and
the face their owner reads (:class:`._guardthread.GuardHandle`): the last
reading, the trigger, the kills. :class:`._guardthread.Guard` runs the
loop in a thread of this process; :class:`._guardproc.GuardChild` runs it in
a child and relays its lines. A base shared by two implementations of one
face, as httpx's ``BaseClient`` is for ``Client`` and ``AsyncClient``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from .._kernel._cgroup import CGROUP_ROOT
from .._kernel._proc import PROC_ROOT
from ._guard import Protected
from ._guardpolicy import GuardConfig, GuardHeld, GuardKill, HostReading, Trigger


@dataclass(eq=False, repr=False)
class GuardBase:
    """The options and the owner's face shared by :class:`Guard` and :class:`GuardChild`.

    A dataclass (one object per guard, compared by identity): its fields
    are the options both kinds take, ``config`` and ``slice_path`` first,
    the rest by keyword; a kind with options of its own (:class:`Guard`)
    is a dataclass over this one that adds them.
    """

    config: GuardConfig
    slice_path: Path
    _: KW_ONLY
    on_kill: Callable[[GuardKill], None]
    unit_agent: Callable[[str], str | None] = lambda unit: None
    protected: Protected = lambda: ((), ())
    proc_root: Path = PROC_ROOT
    cgroup_root: Path = CGROUP_ROOT
    on_held: Callable[[GuardHeld], None] | None = None
    # The owner's face (GuardHandle): what the guard saw last, and its kills.
    last_reading: HostReading | None = field(default=None, init=False)
    trigger: Trigger | None = field(default=None, init=False)
    kills: int = field(default=0, init=False)
    notes: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        # A caller may pass the paths as text.
        self.slice_path = Path(self.slice_path)
        self.proc_root = Path(self.proc_root)
        self.cgroup_root = Path(self.cgroup_root)

    def _seen(self, reading: HostReading, trigger: Trigger | None) -> None:
        self.last_reading, self.trigger = reading, trigger

    def _killed(self, event: GuardKill) -> None:
        """One of this guard's own kills: counted, then told."""
        self.kills += 1
        self.on_kill(event)
