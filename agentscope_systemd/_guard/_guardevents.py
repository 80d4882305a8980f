"""What the guard tells: a kill (:class:`GuardKill`), a shortage it let be (:class:`GuardHeld`).

Frozen records, JSON-ready with ``to_dict`` (their ``kind`` is the event's
kind in docs/json.md); :mod:`agentscope_systemd._guard._guardpolicy` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from .._dicts import Kinded

__all__ = ["CMDLINE_LEN", "GuardHeld", "GuardKill", "Trigger"]

Trigger = Literal["memory", "psi", "thrash"]

#: A victim's cmdline in a GuardKill is cut to this many characters.
CMDLINE_LEN = 200


@dataclass(frozen=True, slots=True)
class GuardKill(Kinded):
    """The guard killed a process of an agent before the kernel had to.

    ``rss`` and ``swap`` are its sizes (bytes) at the kill; ``trigger`` the
    threshold that held (``"memory"``: MemAvailable and SwapFree, or
    MemAvailable with the host stalling; ``"thrash"``: stalls and refaults
    over a window; ``"psi"``: sustained PSI full) and the figures of the
    reading that decided it;
    ``reaction_seconds`` the time from the threshold crossing to the
    signal; ``released`` whether ``process_mrelease`` reaped its memory at
    once. ``agent`` is None for a scope that is not one of this fleet's.
    ``limit`` is the shortage it acted on: ``"host"``, or the cgroup of a
    memory limit above the agents (a container's, a ``MemoryMax``), with
    ``limit_bytes`` and the share of it still available
    (``limit_available_percent``) and its own PSI ``full`` avg10
    (``limit_psi_full_avg10``: None without a reading) at the kill. ``call`` is the tool call
    (``call-LABEL-N`` of the scope, docs/calls.md) the process was in, killed
    whole with it (``processes`` it held); None for a process of the agent
    itself, killed alone (``processes`` 1).
    """

    kind: ClassVar[str] = "guard_kill"
    ts: float
    agent: str | None
    unit: str
    pid: int
    comm: str
    cmdline: str
    rss: int
    swap: int
    trigger: Trigger
    mem_available_percent: float
    swap_free_percent: float
    psi_full_avg10: float | None
    psi_some_avg10: float | None
    reaction_seconds: float
    released: bool
    limit: str = "host"
    limit_bytes: int | None = None
    limit_available_percent: float | None = None
    call: str | None = None
    processes: int = 1
    limit_psi_full_avg10: float | None = None


@dataclass(frozen=True, slots=True)
class GuardHeld(Kinded):
    """The guard saw the host short but held its hand: the agents slice is not the cause.

    Said once per squeeze. ``culprit`` is the cgroup outside the agents
    slice that is (the fastest-growing, the largest, or the most stalled:
    ``reason`` ``"growth"``, ``"size"``, ``"pressure"``) with its charge
    and growth in bytes (``memory.current`` + ``memory.swap.current``; growth
    over the last 10 s) and its PSI full avg10; the slice's own figures
    beside them. The kernel, earlyoom or systemd-oomd act on it, not the
    guard (docs/guard.md, "Whose shortage"). ``limit`` is the shortage:
    ``"host"``, or the cgroup of a memory limit above the agents.
    """

    kind: ClassVar[str] = "guard_held"
    ts: float
    trigger: Trigger
    reason: str
    culprit: str | None
    culprit_bytes: int
    culprit_growth: int
    culprit_full_avg10: float | None
    slice_bytes: int
    slice_growth: int
    mem_available_percent: float
    swap_free_percent: float
    psi_full_avg10: float | None
    limit: str = "host"

    @property
    def agent(self) -> None:
        """No agent: the cause is outside the fleet."""
        return None
