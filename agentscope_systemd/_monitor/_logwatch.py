"""The logs a monitor follows: the kernel's, which names victims, and systemd-oomd's.

:class:`LogWatch` is a part :class:`._monitor.Monitor` holds. It reads
``/dev/kmsg`` on the event loop, or, where that is closed to this user
(``dmesg_restrict=1``), the journal's kernel lines through a follower
process; its kernel lines go to the monitor's
:class:`~agentscope_systemd._monitor._killcount.KillCounter`, and a kill
among them wakes a sample. systemd-oomd tells its kills only in its own
journal lines (:mod:`._oomd`): each becomes an :class:`OomdKill` when it
names an agent's scope.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Literal

from .._events import Event
from .._kernel._journal import (
    MAX_LINE,
    kmsg_record,
    parse_journal_entry,
    start_follower,
    stop_follower,
)
from ._attribution import parse_oom_kill_line
from ._escape import slice_cgroup_path
from ._killcount import JOURNAL_GRACE, KillCounter
from ._oomd import OOMD_SOCKET, OOMD_UNIT, OomdRepeats, oomd_kill_event, parse_oomd_line
from ._sampling import _open_kmsg, _parse_oom_task_line

__all__ = ["LogWatch"]

log = logging.getLogger("agentscope.monitor")


@dataclass(eq=False, repr=False)
class LogWatch:
    """The monitor's part that follows the kernel's log and systemd-oomd's lines.

    ``kmsg`` None skips the kernel log; ``journal`` is whether the journal
    may be followed (for the kernel's lines where ``/dev/kmsg`` is closed,
    and for oomd's). ``emit`` takes an oomd kill; ``wake`` asks the monitor
    for a sample soon.
    """

    counter: KillCounter
    _: KW_ONLY
    kmsg: Path | None
    journal: bool
    slice_path: Path
    cgroup_root: Path
    unit_agent: Callable[[str], str | None]
    emit: Callable[[Event], None]
    wake: Callable[[], None]
    # What it holds while it reads (set by start, cleared by close).
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _kmsg_fd: int | None = field(default=None, init=False)
    _kmsg_rest: bytes = field(default=b"", init=False)
    _follower: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _journal_rest: bytes = field(default=b"", init=False)
    _oomd_repeats: OomdRepeats = field(default_factory=OomdRepeats, init=False)

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the kernel's log, or start the journal's follower; tell the counter which."""
        self._loop = loop
        if self.kmsg is not None:
            self._kmsg_fd = await asyncio.to_thread(_open_kmsg, self.kmsg)
            if self._kmsg_fd is not None:
                try:
                    loop.add_reader(self._kmsg_fd, self._on_kmsg)
                except (OSError, ValueError) as exc:  # e.g. a regular file: epoll refuses it
                    log.debug("cannot poll the kernel log %s: %s", self.kmsg, exc)
                    os.close(self._kmsg_fd)
                    self._kmsg_fd = None
        self.counter.kernel_log = self._kmsg_fd is not None
        kernel_journal = self._kmsg_fd is None and self.journal
        # systemd-oomd's kills are told in its own journal lines only (_oomd.py).
        oomd = self.journal and await asyncio.to_thread(OOMD_SOCKET.exists)
        if kernel_journal or oomd:
            if oomd:
                self._follower = await asyncio.to_thread(
                    start_follower, kernel=kernel_journal, oomd=True
                )
            else:
                self._follower = await asyncio.to_thread(start_follower)
            if self._follower is not None:
                assert self._follower.stdout is not None
                loop.add_reader(self._follower.stdout.fileno(), self._on_journal)
            if self._follower is not None and kernel_journal:
                self.counter.victim_grace = JOURNAL_GRACE
                self.counter.await_kernel = self.counter.kernel_log = True

    async def close(self) -> None:
        """Stop reading: the kernel log's fd closed, the follower stopped."""
        loop = self._loop
        if self._kmsg_fd is not None:
            if loop is not None:
                loop.remove_reader(self._kmsg_fd)
            os.close(self._kmsg_fd)
            self._kmsg_fd = None
        if self._follower is not None:
            if loop is not None and self._follower.stdout is not None:
                loop.remove_reader(self._follower.stdout.fileno())
            await asyncio.to_thread(stop_follower, self._follower)
            self._follower = None

    def _on_kmsg(self) -> None:
        fd = self._kmsg_fd
        assert fd is not None
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten before we read them
            except OSError as exc:
                log.debug("kernel log read failed, no longer reading it: %s", exc)
                chunk = b""
            if not chunk:  # EOF (a pipe in tests) or error: stop watching
                assert self._loop is not None
                self._loop.remove_reader(fd)
                os.close(fd)
                self._kmsg_fd = None
                self.counter.kernel_log = False
                return
            self._kmsg_lines(chunk)

    def _kmsg_lines(self, chunk: bytes) -> None:
        # /dev/kmsg gives one record per read: "prio,seq,usec,flags;message\n"
        # followed by " KEY=value" continuation lines.
        data = self._kmsg_rest + chunk
        lines = data.split(b"\n")
        self._kmsg_rest = lines.pop()
        found = False
        if len(self._kmsg_rest) > MAX_LINE:
            self._kmsg_rest = b""  # not a record: /dev/kmsg ends each one with a newline
        for raw in lines:
            if raw.startswith(b" "):
                continue  # a " KEY=value" continuation line
            record = kmsg_record(raw)
            if record is not None:  # the kernel's own (facility 0) only
                found = self._kernel_line(record[1], "kmsg") or found
        if found:
            self.wake()

    def _kernel_line(self, text: str, via: Literal["kmsg", "journal"]) -> bool:
        """Note a kernel log line; True for a kill (worth a sample now)."""
        task = _parse_oom_task_line(text)
        if task is not None:
            self.counter.note_kernel_task(*task)
            return False
        kill = parse_oom_kill_line(text)
        if kill is None:
            return False
        self.counter.note_kernel_kill(kill, time.time(), via)
        return True

    def oomd_line(self, text: str) -> bool:
        """systemd-oomd's line about a kill: an :class:`OomdKill` when it names an agent's
        scope. True for any such line (it is no kernel line)."""
        line = parse_oomd_line(text)
        if line is None:
            return False
        if not self._oomd_repeats.first(line.cgroup, time.monotonic()):
            return True  # the same kill, named again while its processes free their memory
        slice_cgroup = slice_cgroup_path(self.slice_path, self.cgroup_root)
        if slice_cgroup is not None:
            event = oomd_kill_event(line, slice_cgroup, self.unit_agent, time.time())
            if event is not None:
                self.emit(event)
        return True

    def _on_journal(self) -> None:
        proc = self._follower
        assert proc is not None
        assert proc.stdout is not None
        found = False
        while True:
            try:
                chunk = os.read(proc.stdout.fileno(), 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:  # the follower ended: victims unnamed from here on
                assert self._loop is not None
                self._loop.remove_reader(proc.stdout.fileno())
                log.debug("the journal follower ended (status %s)", proc.poll())
                if self._kmsg_fd is None:
                    self.counter.kernel_log = self.counter.await_kernel = False
                break
            *lines, self._journal_rest = (self._journal_rest + chunk).split(b"\n")
            if len(self._journal_rest) > MAX_LINE:
                self._journal_rest = b""
            for raw in lines:
                entry = parse_journal_entry(raw)
                if entry is None:
                    continue
                # Each by journald's own fields, never by its text (#31): oomd's
                # lines from oomd's unit, the kernel's from the kernel.
                if entry.unit == OOMD_UNIT:
                    self.oomd_line(entry.text)
                elif entry.from_kernel:
                    found = self._kernel_line(entry.text, "journal") or found
        if found:
            self.wake()
