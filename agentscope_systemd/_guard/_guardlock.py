"""One guard acts per agents slice: a lock file, taken without ever waiting.

Every fleet's installed monitor runs a guard, and a harness may run another
over the same slice: two guards on one squeeze killed two processes, a
sibling among them (issue #25). So a guard acts only while it holds an
exclusive ``flock`` on a file named after the slice's cgroup, in
``/run/agentscope`` for root and ``$XDG_RUNTIME_DIR/agentscope`` for a
user (tmpfs: no disk write, and gone at reboot). The lock is tried with
``LOCK_NB`` and never waited for: a guard that does not hold it stands by,
reads the host as before (admission control still works), and tries
again about every second, so it takes over within a second of the holder's
end (the kernel drops a flock when its holder's file is closed, also when
the process dies). The kill path never touches the lock.

Guards of the system manager and of a user manager watch different slices,
so each has its own lock.

The guard that acts may kill another fleet's agent (the slice is shared by
every fleet of a manager). So it also appends each kill, one JSON line, to
a file beside the lock (``.kills``, on the same tmpfs), and the guards
standing by read the new lines at each reading: each fleet's guard
reports the kills of its own agents, named, and its fleet records them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .._dicts import json_object

__all__ = ["SliceLock", "default_lock_dir", "lock_name"]

#: A standby guard tries the lock again after this many seconds.
RETRY_EVERY = 1.0
#: The kills file is emptied by its writer past this size.
KILLS_MAX = 1 << 20
#: A line of the kills file longer than this is not one of ours.
KILL_LINE_MAX = 8192


def default_lock_dir() -> Path | None:
    """``/run/agentscope`` for root, ``$XDG_RUNTIME_DIR/agentscope`` for a user; None: none."""
    if os.geteuid() == 0:
        return Path("/run/agentscope")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "agentscope"
    user_run = Path(f"/run/user/{os.geteuid()}")
    return user_run / "agentscope" if user_run.is_dir() else None


def lock_name(slice_path: Path) -> str:
    """The lock file's name for a slice: its last component and a hash of the whole path."""
    path = os.fspath(slice_path).rstrip("/")
    digest = hashlib.sha256(path.encode()).hexdigest()[:16]
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(path).name)[:64]
    return f"guard-{tail}-{digest}.lock"


class SliceLock:
    """The guard lock of one slice; :meth:`try_acquire` never blocks.

    ``lock_dir`` None (no runtime directory) makes every guard act alone,
    as before the lock: :attr:`note` says so.
    """

    def __init__(self, slice_path: Path, lock_dir: Path | None) -> None:
        self.path = None if lock_dir is None else Path(lock_dir) / lock_name(slice_path)
        self._fd: int | None = None
        self._next_try = float("-inf")
        self._kills_at: int | None = None  # how far a standby has read the kills file
        #: Why this guard acts without the lock (None: it uses it).
        self.note: str | None = None
        if self.path is None:
            self.note = "no runtime directory for the guard lock: this guard acts alone"

    @property
    def held(self) -> bool:
        """This guard holds the lock (or there is no lock to hold)."""
        return self._fd is not None or self.note is not None

    def try_acquire(self, now: float) -> bool:
        """Take the lock if free (at most once per :data:`RETRY_EVERY` s); True: held."""
        if self.held:
            return True
        if now < self._next_try:
            return False
        self._next_try = now + RETRY_EVERY
        assert self.path is not None
        try:
            os.makedirs(self.path.parent, mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            self.note = f"cannot open the guard lock {self.path} ({exc}): this guard acts alone"
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as exc:
            os.close(fd)
            self.note = f"cannot lock {self.path} ({exc}): this guard acts alone"
            return True
        self._fd = fd
        return True

    def release(self) -> None:
        """Let the lock go (closing the file drops it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def kills_path(self) -> Path | None:
        """The file of the acting guard's kills, beside the lock."""
        return None if self.path is None else self.path.with_suffix(".kills")

    def note_kill(self, kill: dict[str, Any]) -> None:
        """The acting guard: append ``kill`` for the guards standing by (after the kill)."""
        path = self.kills_path
        if path is None or self._fd is None:
            return
        line = (json.dumps(kill, separators=(",", ":")) + "\n").encode()[:KILL_LINE_MAX]
        try:
            fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
            )
            try:
                if os.fstat(fd).st_size > KILLS_MAX:
                    os.ftruncate(fd, 0)
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError:
            pass  # the standbys then miss it; the kill itself is done and logged

    def new_kills(self) -> list[dict[str, Any]]:
        """A guard standing by: the kills appended since it last looked (none at first)."""
        path = self.kills_path
        if path is None or self.held:
            self._kills_at = None
            return []
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            self._kills_at = self._kills_at or 0
            return []
        try:
            size = os.fstat(fd).st_size
            if self._kills_at is None or size < self._kills_at:
                # The first look (older kills are not ours to tell), or emptied.
                self._kills_at = size if self._kills_at is None else 0
                if self._kills_at == size:
                    return []
            data = os.pread(fd, min(size - self._kills_at, KILLS_MAX), self._kills_at)
        finally:
            os.close(fd)
        complete = data[: data.rfind(b"\n") + 1]
        self._kills_at += len(complete)
        return [item for line in complete.splitlines() if (item := json_object(line)) is not None]
