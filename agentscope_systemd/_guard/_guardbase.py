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
from pathlib import Path

from .._kernel._cgroup import CGROUP_ROOT
from .._kernel._proc import PROC_ROOT
from ._guard import Protected
from ._guardpolicy import GuardConfig, GuardHeld, GuardKill, HostReading, Trigger


class GuardBase:
    """The options and the owner's face shared by :class:`Guard` and :class:`GuardChild`."""

    def __init__(
        self,
        config: GuardConfig,
        slice_path: Path,
        *,
        on_kill: Callable[[GuardKill], None],
        unit_agent: Callable[[str], str | None] = lambda unit: None,
        protected: Protected = lambda: ((), ()),
        proc_root: Path = PROC_ROOT,
        cgroup_root: Path = CGROUP_ROOT,
        on_held: Callable[[GuardHeld], None] | None = None,
    ) -> None:
        self.config = config
        self.slice_path = Path(slice_path)
        self.proc_root = Path(proc_root)
        self.cgroup_root = Path(cgroup_root)
        self._on_kill = on_kill
        self._on_held = on_held
        self._unit_agent = unit_agent
        self._protected = protected
        self.last_reading: HostReading | None = None
        self.trigger: Trigger | None = None
        self.kills = 0
        self.notes: list[str] = []

    def _seen(self, reading: HostReading, trigger: Trigger | None) -> None:
        self.last_reading, self.trigger = reading, trigger

    def _killed(self, event: GuardKill) -> None:
        """One of this guard's own kills: counted, then told."""
        self.kills += 1
        self._on_kill(event)
