"""The command lines of the guard's candidates, read off the guard's path.

Reading ``/proc/PID/cmdline`` reads the process's own memory (its argv
pages, through ``access_remote_vm``): under a squeeze those pages may sit in
swap or zram, and the read waits for them to come back, which needs the
memory the host is short of. Measured in the test bed (sid, zram as large as
memory, ``bench_squeeze.py --profile fedora``): 0.5-2.1 s per read of the
runaway's command line near the threshold, each one a stall of the guard's
loop. So the loop never reads a command line itself: it asks this book,
whose one daemon thread reads each wanted process once (a blocked read lets
go of the GIL, so the loop goes on), and a kill names the command line the
book already has, or the process's ``comm`` (issue #25, item 4: "names known
ahead, kept current off the guard's path").

The loop and the thread share only a deque and a dict, whose single
operations are atomic in CPython: no lock a squeeze could hold.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

from .._kernel._proc import PROC_ROOT, read_cmdline, same_process

__all__ = ["CmdlineBook"]

#: Processes whose command lines are kept (the candidates of a few scans).
KEPT = 64
#: The reader thread's nap when nothing is wanted.
IDLE = 0.05


class CmdlineBook:
    """Command lines by ``(pid, start time)``, read by a thread of their own.

    :meth:`want` asks for one (returns at once); :meth:`get` says what is
    known; :meth:`close` ends the thread. A process that exited or whose pid
    was reused before its read is not recorded.
    """

    def __init__(self, proc_root: Path = PROC_ROOT, max_len: int = 200) -> None:
        self._proc_root = proc_root
        self._max_len = max_len
        self._known: dict[tuple[int, int], str] = {}
        self._wanted: collections.deque[tuple[int, int]] = collections.deque(maxlen=KEPT)
        self._asked: dict[tuple[int, int], None] = {}  # each process is read once
        self._closed = False
        self._thread: threading.Thread | None = None

    def get(self, pid: int, start_time: int) -> str | None:
        """The command line read for this process, or None (not read yet)."""
        return self._known.get((pid, start_time))

    def want(self, pid: int, start_time: int) -> None:
        """Have this process's command line read (once), without waiting for it."""
        key = (pid, start_time)
        if self._closed or key in self._asked:
            return
        self._asked[key] = None
        while len(self._asked) > KEPT:
            del self._asked[next(iter(self._asked))]
        self._wanted.append(key)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="agentscope-guard-names", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """End the reader thread (it may be inside a read: it is not waited for)."""
        self._closed = True

    def _run(self) -> None:
        while not self._closed:
            try:
                pid, start = self._wanted.popleft()
            except IndexError:
                time.sleep(IDLE)
                continue
            try:
                text = read_cmdline(pid, self._proc_root, self._max_len)
                same = same_process(pid, start, self._proc_root, zombie=True)
            except OSError:
                continue
            # The same process still (its pid not reused during the read).
            if text is None or same is None:
                continue
            self._known[pid, start] = text
            while len(self._known) > KEPT:
                del self._known[next(iter(self._known))]
