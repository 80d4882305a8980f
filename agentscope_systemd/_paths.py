"""Files agentscope creates under a directory of its own, without leaving it.

Agent logs, the monitor's fatal log and the registry's files live in
directories another local user may be able to reach (a shared ``registry=``
directory, ``/var/log``). A name from the command line (``--fleet
'x/../../p'``) or a symlink planted there must not make agentscope, maybe
running as root, create, open or chmod a file elsewhere. So every component
below the base is checked to be one plain name, and each is opened relative
to its parent's descriptor with ``O_NOFOLLOW``: a symlink anywhere below the
base is refused, not followed.
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["PathEscape", "check_component", "open_under"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathEscape(ValueError):
    """A path component that would leave its directory (``/``, ``..``, NUL, empty)."""


def check_component(name: str) -> str:
    """``name`` if it is one plain path component, else raise :class:`PathEscape`."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise PathEscape(f"{name!r} is not a plain file name")
    return name


def open_under(
    base: str | os.PathLike[str],
    parts: tuple[str, ...],
    *,
    flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    mode: int = 0o600,
    dir_mode: int = 0o700,
) -> int:
    """Open ``base/parts[0]/.../parts[-1]``: a file descriptor the caller closes.

    ``base`` is trusted and created if missing (``dir_mode``); the
    directories in ``parts[:-1]`` are created or narrowed to ``dir_mode``
    when they are ours, a new file gets ``mode`` (both exactly, whatever
    the umask). Nothing below ``base`` is reached through a symlink.

    Raises:
        PathEscape: a part is not a plain name.
        OSError: as ``open(2)``; ``ELOOP`` or ``ENOTDIR`` for a symlink in
            the way.
    """
    for part in parts:
        check_component(part)
    os.makedirs(base, mode=dir_mode, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_mode, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            # Ours (new, or made 0755 by an older agentscope): exactly dir_mode.
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != dir_mode:
                os.fchmod(fd, dir_mode)
        created = flags & os.O_CREAT and not _exists(parts[-1], fd)
        out = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(out).st_mode):
            raise OSError(f"{parts[-1]!r} is not a regular file")
        if created:
            os.fchmod(out, mode)  # exactly, not as the umask left it
    except BaseException:
        os.close(out)
        raise
    return out


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
