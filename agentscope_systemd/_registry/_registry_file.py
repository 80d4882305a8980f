"""The registry's file: where it lives, its modes, and sqlite3's errors.

:func:`default_registry_path` says where a manager's registry lives;
``_prepare_files`` creates it with modes of our own; ``_map_error`` is the one
place sqlite3 and OS errors become :class:`RegistryError`, and ``_retry_busy``
retries the lock waits sqlite's busy handler does not cover. The retention
of closed rows is read from the environment here.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import sqlite3
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, Literal, TypeVar

from .. import _numbers
from .._errors import RegistryCorrupt, RegistryError
from . import _spool

__all__ = ["DEFAULT_RETENTION", "default_registry_path"]

_T = TypeVar("_T")

_DIR_MODE: Final = 0o700
_FILE_MODE: Final = 0o600
DEFAULT_RETENTION: Final = 30 * 86400.0
"""How long (seconds) the registry keeps closed agents and events by default."""
_RETENTION_ENV: Final = "AGENTSCOPE_RETENTION_DAYS"


def default_registry_path(
    manager: Literal["system", "user"], env: Mapping[str, str] = os.environ
) -> Path:
    """Where the registry of a systemd manager lives.

    ``user``: ``$XDG_STATE_HOME/agentscope/agentscope.db``, by default
    ``~/.local/state/agentscope/agentscope.db`` (a relative
    ``XDG_STATE_HOME`` is ignored, as the XDG spec says). ``system``:
    ``/var/lib/agentscope/agentscope.db``.

    Raises:
        ValueError: ``manager`` is neither ``"system"`` nor ``"user"``.
    """
    return Path(_spool.state_dir(manager, env)) / "agentscope.db"


def _prepare_files(path: Path) -> None:
    """Create the directory (0700) and file (0600); fix their modes if ours.

    The directory is fixed only when agentscope owns it: when we create it,
    or when it is named ``agentscope`` as :func:`default_registry_path`
    makes it. A directory the caller chose (``/tmp``...) keeps its mode.
    """
    _refuse_special_files(path)
    directory = path.parent
    missing: list[Path] = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for d in reversed(missing):
        d.mkdir(mode=_DIR_MODE, exist_ok=True)  # exist_ok: a concurrent opener
    if (missing or directory.name == _spool.OWN_DIR_NAME) and not directory.is_symlink():
        # (A directory the user linked elsewhere is the user's choice: left alone.)
        _fix_mode(directory, _DIR_MODE, os.O_RDONLY | os.O_DIRECTORY)
    # Create the file ourselves so it never exists with umask's mode.
    _fix_mode(path, _FILE_MODE, os.O_RDWR | os.O_CREAT)
    for p in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        _fix_mode(p, _FILE_MODE, os.O_RDONLY)


#: The files sqlite opens beside the database (WAL mode, and a rollback journal).
_SIDE_FILES: Final = ("-wal", "-shm", "-journal")

_KINDS: Final = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def _refuse_special_files(path: Path) -> None:
    """Refuse a registry whose file or side files are not regular files.

    sqlite opens them without O_NONBLOCK: a FIFO another user planted at
    ``<db>-wal`` (``registry=`` in a shared directory) hung the open for
    ever (#31). Checked with lstat before sqlite opens anything; the
    descriptors :func:`_fix_mode` opens check again (O_NONBLOCK, fstat).

    Raises:
        RegistryError: one of them is a FIFO, socket, device, directory or link.
    """
    for name in (str(path), *(f"{path}{side}" for side in _SIDE_FILES)):
        try:
            mode = os.lstat(name).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise RegistryError(
                path, f"cannot check the agentscope registry's file {name}: {exc.strerror}"
            ) from exc
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise RegistryError(
                path,
                f"the agentscope registry's file {name} is {kind}, not a regular file, so "
                "agentscope will not open it (sqlite could hang on it or write through it); "
                f"remove it if it is yours, or choose another registry path",
            )


def _fix_mode(path: Path, mode: int, flags: int) -> None:
    """Open ``path`` without following a symlink and narrow its mode if it is ours.

    Through the descriptor: with ``registry=`` in a shared directory, a link
    another user plants there must not make us chmod its target.
    """
    try:
        # O_NONBLOCK: a FIFO swapped in since the lstat must not hang this open.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP, "it is a symbolic link; agentscope does not follow one"
            ) from exc
        raise
    try:
        st = os.fstat(fd)
        if not flags & os.O_DIRECTORY and not stat.S_ISREG(st.st_mode):
            raise RegistryError(
                path, f"the agentscope registry's file {path} is not a regular file; remove it"
            )
        if stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.geteuid():
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


# ------------------------------------------------------------ sqlite errors

_BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_CORRUPT_CODES: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def _is_busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and _primary_code(exc) in _BUSY_CODES


def _map_error(path: Path, exc: sqlite3.Error | OSError, timeout: float) -> RegistryError:
    """The one place sqlite3 and OS errors become RegistryError."""
    if isinstance(exc, OSError):
        return RegistryError(
            path,
            f"cannot open the agentscope registry {path}: {exc.strerror or exc}; "
            "check that its directory exists and belongs to you",
        )
    code = _primary_code(exc)
    if code in _CORRUPT_CODES:
        return RegistryCorrupt(path, str(exc))
    if code in _BUSY_CODES:
        return RegistryError(
            path,
            f"the agentscope registry {path} stayed locked for {timeout:g} s ({exc}); "
            "another agentscope process holds it: retry, or look for a hung one",
        )
    if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY):
        return RegistryError(
            path,
            f"cannot write the agentscope registry {path} ({exc}); "
            "check that it and its directory belong to you",
        )
    if code == sqlite3.SQLITE_FULL:
        return RegistryError(path, f"the disk holding the agentscope registry {path} is full")
    return RegistryError(path, f"the agentscope registry {path} failed: {exc}")


def _retry_busy(
    op: Callable[[], _T],
    deadline: float,
    *,
    attempts: int = 8,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> _T:
    """Run ``op``, retrying SQLITE_BUSY a bounded number of times until ``deadline``.

    The busy timeout covers most lock waits; some BUSY results skip the busy
    handler and come back at once (SQLITE_BUSY_RECOVERY while another
    connection rebuilds the WAL index, a journal_mode switch racing a
    checkpoint; see sqlite.org/rescode.html#busy and sqlite.org/wal.html).
    Those are retried with jittered backoff.
    """
    delay = 0.005
    for attempt in range(attempts):
        try:
            return op()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or attempt == attempts - 1 or clock() >= deadline:
                raise
        sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 0.2)
    raise AssertionError("unreachable")  # pragma: no cover


def _retention_from_env(env: Mapping[str, str]) -> float:
    """``AGENTSCOPE_RETENTION_DAYS`` in seconds (0: keep everything); a bad
    value falls back to the default rather than break every command."""
    raw = env.get(_RETENTION_ENV, "").strip()
    if not raw:
        return DEFAULT_RETENTION
    try:
        # The one number grammar: ASCII digits, finite (no "nan", no Arabic-Indic digits).
        days = _numbers.real(_RETENTION_ENV, raw, low=0, high=100_000)
    except ValueError:
        days = -1.0
    if not 0 <= days <= 100_000:
        logging.getLogger("agentscope").warning(
            "%s=%r is not a number of days; keeping %g days",
            _RETENTION_ENV,
            raw,
            DEFAULT_RETENTION / 86400,
        )
        return DEFAULT_RETENTION
    return days * 86400
