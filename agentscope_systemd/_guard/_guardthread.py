"""The guard in a thread of the manager (:class:`Guard`), and admission control.

:func:`~agentscope_systemd._guard._guard.run_guard` is the guard's loop;
:class:`Guard` runs it in a daemon thread, and
:class:`~agentscope_systemd._guard._guardproc.GuardChild` in a process of its
own. :func:`admit` holds a launch while a running guard sees the host short.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from .._errors import HostUnderPressure
from ._guard import run_guard
from ._guardbase import GuardBase
from ._guardkill import prepare_process
from ._guardpolicy import HostReading, Trigger

__all__ = ["READY_WAIT", "Guard", "GuardHandle", "admit"]

log = logging.getLogger("agentscope.guard")

#: Guard.start waits at most this long for the guard's first reading (a
#: slow TCG guest takes about a second; a start under a squeeze may take more).
READY_WAIT = 10.0


# ---------------------------------------------------------------------------
# The guard thread


@dataclass(eq=False, repr=False)
class Guard(GuardBase):
    """:func:`run_guard` in a daemon thread of this process (what a Monitor starts).

    :meth:`start` prepares the process (mlock, oom_score_adj, as the config
    asks) and starts the thread; :meth:`stop` ends it. ``last_reading`` and
    ``trigger`` are what the thread saw last (for admission control and
    health checks); ``kills`` counts its kills.
    """

    _: KW_ONLY
    psi_trigger: bool | None = None
    lock_dir: Path | Literal["default"] | None = "default"
    # Set by start(): the thread, the pipe that stops it, "it took a reading".
    _thread: threading.Thread | None = field(default=None, init=False)
    _stop_r: int = field(default=-1, init=False)
    _stop_w: int = field(default=-1, init=False)
    _first: threading.Event = field(default_factory=threading.Event, init=False)

    @property
    def running(self) -> bool:
        """The guard thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Prepare the process and start the guard thread (once).

        Blocking: returns once the guard has taken its first reading (at
        most :data:`READY_WAIT` s), so that what starts next is watched,
        as :class:`GuardChild` waits for its process.
        """
        if self._thread is not None:
            raise RuntimeError("this Guard was started before")
        self.notes = prepare_process(self.config, self.proc_root)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._main, name="agentscope-guard", daemon=True)
        self._thread.start()
        if not self._first.wait(READY_WAIT) and self._thread.is_alive():
            log.warning("the guard took no reading in its first %.0f s", READY_WAIT)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (blocking: up to ``timeout`` s)."""
        if self._thread is None or self._stop_w < 0:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(timeout)
        os.close(self._stop_w)
        self._stop_w = -1
        if not self._thread.is_alive():
            os.close(self._stop_r)
            self._stop_r = -1

    def _main(self) -> None:
        try:
            run_guard(
                self.config,
                self.slice_path,
                stop_fd=self._stop_r,
                on_kill=self._killed,
                unit_agent=self.unit_agent,
                protected=self.protected,
                on_reading=self._seen,
                proc_root=self.proc_root,
                psi_trigger=self.psi_trigger,
                cgroup_root=self.cgroup_root,
                lock_dir=self.lock_dir,
                on_held=self.on_held,
                on_first=self._first.set,
            )
        except Exception:
            # The thread's end would otherwise be silent: say it loudly.
            log.exception("the memory guard stopped on an error; no more guard kills")
            raise
        finally:
            self._first.set()  # start() waits no longer for a thread that ended


# ---------------------------------------------------------------------------
# Admission control


class GuardHandle(Protocol):
    """A running guard as its owner sees it: :class:`Guard`, or a guard process."""

    last_reading: HostReading | None
    trigger: Trigger | None
    kills: int
    notes: list[str]

    @property
    def running(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


async def admit(guards: Iterable[GuardHandle], wait: float, *, poll: float = 0.1) -> None:
    """Return when no running guard in ``guards`` holds the host under pressure.

    Waits up to ``wait`` seconds for the pressure to clear.

    Raises:
        HostUnderPressure: still under pressure after ``wait`` seconds.
    """
    import asyncio  # here: a guard process of its own never needs it

    guards = list(guards)
    start = time.monotonic()
    while True:
        short = [g for g in guards if g.running and g.trigger is not None]
        if not short:
            return
        waited = time.monotonic() - start
        if waited >= wait:
            reading = short[0].last_reading
            assert reading is not None  # a trigger comes with its reading
            raise HostUnderPressure(
                round(reading.mem_available_percent, 2),
                round(reading.swap_free_percent, 2),
                reading.psi_full_avg10,
                round(waited, 2),
            )
        await asyncio.sleep(min(poll, wait - waited))
