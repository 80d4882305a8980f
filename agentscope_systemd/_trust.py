"""Whether a file root is asked to run can be changed by anyone but root.

``install --system`` writes units that make root run the ``agentscope``
command (the monitor) and a generator under the system's Python. If that
command, its interpreter, or any directory on the way to either belongs to
another user or is writable by one, that user decides what root runs
(``sudo ~alice/venv/bin/agentscope install --system`` would otherwise make a
root service of alice's files: issue #31). :func:`who_could_change` follows
a path as the kernel does, every directory, symlink and the file itself, and
then the file's ``#!`` interpreter; it reads only metadata and the first
line of a regular file, so nothing it is pointed at can make it hang.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

__all__ = ["SERVICE_PATH", "who_could_change"]

#: The PATH systemd gives a system service (systemd.exec(5), "Environment
#: variables in spawned processes"): where ``#!/usr/bin/env NAME`` finds NAME.
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_MAX_LINKS = 40  # the kernel's MAXSYMLINKS (fs/namei.c)
_MAX_INTERPRETERS = 4  # the kernel's BINPRM_MAX_RECURSION (fs/exec.c)
_SHEBANG_MAX = 256  # the kernel's BINPRM_BUF_SIZE
# POSIX ACL extended attribute (include/uapi/linux/posix_acl_xattr.h): a
# 4-byte version, then 8-byte entries (tag u16, perm u16, id u32).
_ACL_XATTR = "system.posix_acl_access"
_ACL_USER, _ACL_GROUP, _ACL_WRITE = 0x02, 0x08, 0x02


def who_could_change(path: str, *, root: Path = Path("/")) -> str | None:
    """Why someone other than root could change what running ``path`` runs; None if no one.

    ``path`` is absolute, as root would see it; ``root`` is where that ``/``
    is (a test's or an image's tree). Every directory from ``/`` down, each
    symlink on the way (absolute targets are followed from ``root``), the
    file, and then the file's ``#!`` interpreter (through ``env``: found on
    systemd's :data:`SERVICE_PATH`) must be owned by root and writable by no
    other user or group, also not through an ACL. A directory writable by
    others that has the sticky bit (``/tmp``) passes: there only an entry's
    owner may rename or remove it (inode(7), "The file type and mode"), and
    its entries are checked for a root owner like any other.
    """
    chain = path
    for _ in range(_MAX_INTERPRETERS + 1):
        why = _walk(path, root)
        if why is not None:
            return f"{chain}: {why}"
        try:
            interpreter = _interpreter(path, root)
        except ValueError as exc:
            return f"{chain}: {exc}"
        if interpreter is None:
            return None
        path = interpreter
        chain = f"{chain} (#! {path})"
    return f"{chain}: more than {_MAX_INTERPRETERS} interpreters in a row"


def _walk(path: str, root: Path) -> str | None:
    """Why ``path`` (under ``root``) is not a root-only regular file, directories included."""
    if not path.startswith("/"):
        return f"{path} is not an absolute path"
    current = PurePosixPath("/")
    why = _unsafe(root, current)
    if why is not None:
        return why
    pending = [p for p in reversed(path.split("/")) if p]
    links = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            current = current.parent
            continue
        here = current / part
        why = _unsafe(root, here)
        if why is not None:
            return why
        st = os.lstat(_real(root, here))
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return f"{path} has more than {_MAX_LINKS} symlinks on its way"
            target = os.readlink(_real(root, here))
            pending.extend(p for p in reversed(target.split("/")) if p)
            if target.startswith("/"):
                current = PurePosixPath("/")
            continue
        if pending and not stat.S_ISDIR(st.st_mode):
            return f"{here} is not a directory"
        if not pending:
            if not stat.S_ISREG(st.st_mode):
                return f"{here} is not a regular file"
            if not st.st_mode & 0o111:
                return f"{here} is not executable"
        current = here
    return None


def _real(root: Path, path: PurePosixPath) -> Path:
    return root / path.relative_to("/")


def _lstat(root: Path, path: PurePosixPath) -> os.stat_result | str:
    try:
        return os.lstat(_real(root, path))
    except OSError as exc:
        return "does not exist" if exc.errno == errno.ENOENT else f"cannot be read ({exc.strerror})"


def _unsafe(root: Path, path: PurePosixPath) -> str | None:
    """Why this file or directory lets a user other than root change it, or None."""
    st = _lstat(root, path)
    if isinstance(st, str):
        return f"{path} {st}"
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if stat.S_ISLNK(st.st_mode):
        return None  # a symlink's own mode is never used; its owner and directory are
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & stat.S_IWOTH and not sticky:
        return f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0 and not sticky:
        return f"{path} is writable by group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):04o})"
    return _acl_writer(root, path)


def _acl_writer(root: Path, path: PurePosixPath) -> str | None:
    """Why an ACL on ``path`` lets a user or group other than root write it, or None.

    Named entries are judged alone, not through the ACL's mask: the mask is
    the group bits of the mode, which a chmod by root could widen later.
    """
    try:
        data = os.getxattr(_real(root, path), _ACL_XATTR, follow_symlinks=False)
    except OSError:
        return None  # no ACL, or a file system without them
    for offset in range(4, len(data) - 7, 8):
        tag = int.from_bytes(data[offset : offset + 2], "little")
        perm = int.from_bytes(data[offset + 2 : offset + 4], "little")
        who = int.from_bytes(data[offset + 4 : offset + 8], "little")
        if tag in (_ACL_USER, _ACL_GROUP) and perm & _ACL_WRITE and who != 0:
            kind = "uid" if tag == _ACL_USER else "group"
            return f"{path} is writable by {kind} {who} through an ACL"
    return None


def _interpreter(path: str, root: Path) -> str | None:
    """The program in ``path``'s ``#!`` line (``env``'s NAME looked up), or None (a binary).

    Raises:
        ValueError: the line cannot be followed (``env`` with options, NAME not found).
    """
    real = _real(root, PurePosixPath(path))
    try:  # a regular file only root can change (walked before): no open can hang
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            head = os.read(fd, _SHEBANG_MAX)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror})") from exc
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "surrogateescape").split()
    if not words:
        raise ValueError("an empty #! line")
    program, args = words[0], words[1:]
    if PurePosixPath(program).name != "env" or not args:
        return program
    # The kernel runs env (checked next time round) with the rest as one
    # argument; env then finds NAME on the service's PATH.
    name = args[0]
    if name.startswith("-") or "/" in name or len(args) > 1:
        raise ValueError(f"'#!{program} {' '.join(args)}': env with options is not followed")
    why = _walk(program, root)
    if why is not None:
        raise ValueError(f"its interpreter {why}")
    for directory in SERVICE_PATH:
        candidate = f"{directory}/{name}"
        if not isinstance(_lstat(root, PurePosixPath(candidate)), str):
            return candidate
    raise ValueError(f"env's {name!r} is on no directory of a service's PATH")
