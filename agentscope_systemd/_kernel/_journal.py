"""The kernel's log, read back: /dev/kmsg's ring buffer and the journal's kernel messages.

The kernel names an OOM kill's victim and its cgroup in two lines
(``oom-kill:...,task_memcg=/...,task=...,pid=...`` and ``Killed process
PID (comm) ...``: :mod:`._attribution` parses them). Two places hold them:

- ``/dev/kmsg``, the ring buffer since boot: root only on Debian
  (``kernel.dmesg_restrict=1``); :func:`read_kmsg` reads its records after
  a sequence number.
- the system journal, whose kernel messages (``_TRANSPORT=kernel``) survive
  reboots: readable by root and by members of the group the journal files
  grant (Debian: ``systemd-journal``, and ``adm`` through an ACL);
  :func:`read_journal` runs ``journalctl`` with a fixed argv after a
  validated cursor, bounded in entries, bytes and time (journald offers no
  D-Bus call that reads entries). :func:`journal_access` says who may read
  it, for ``agentscope doctor``; :func:`follow_argv` is the argv of the
  live follower the monitor runs where /dev/kmsg is closed.

Everything here blocks: callers run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import re
import select
import shutil
import stat
import struct
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .._dicts import json_object
from ._proc import PROC_ROOT

__all__ = [
    "JOURNAL_DIRS",
    "JournalAccess",
    "JournalRead",
    "KernelLine",
    "KmsgRead",
    "follow_argv",
    "journal_access",
    "journalctl_path",
    "kmsg_readable",
    "kmsg_record",
    "parse_acl_read_groups",
    "parse_journal_entry",
    "read_boot_id",
    "read_journal",
    "read_journal_boot",
    "read_kmsg",
    "start_follower",
    "stop_follower",
    "valid_cursor",
]

#: Where journald keeps the system journal: persistent, then volatile.
JOURNAL_DIRS: Final = (Path("/var/log/journal"), Path("/run/log/journal"))
#: journalctl is looked up here only (never on the caller's PATH).
_SAFE_PATH: Final = "/usr/bin:/bin:/usr/sbin:/sbin"
#: Bounds of one read: entries, bytes of one entry, seconds.
MAX_ENTRIES: Final = 20_000
MAX_LINE: Final = 65_536
TIMEOUT: Final = 20.0
# A journal cursor: "s=<hex>;i=<hex>;b=<hex>;m=<hex>;t=<hex>;x=<hex>" (sd_journal_get_cursor).
_CURSOR = re.compile(r"[a-z]=[0-9a-f]{1,64}(?:;[a-z]=[0-9a-f]{1,64}){0,15}")
_BOOT_ID = re.compile(r"[0-9a-f]{32}")
_FIELDS: Final = "MESSAGE,_BOOT_ID,_TRANSPORT,_SYSTEMD_UNIT"


@dataclass(frozen=True, slots=True)
class KernelLine:
    """One kernel message: its text, the boot it came from (None: this one), its position.

    ``position`` is the journal cursor, or the /dev/kmsg sequence number as text.
    ``transport`` and ``unit`` are the journal entry's ``_TRANSPORT`` and
    ``_SYSTEMD_UNIT``, which journald sets itself (a sender cannot: fields
    that begin with ``_`` are journald's): a /dev/kmsg record the kernel
    wrote is ``"kernel"``. The monitor's follower also reads systemd-oomd's
    entries, so whoever takes a line as the kernel's checks
    :attr:`from_kernel` (#31).
    """

    text: str
    boot: str | None
    position: str
    transport: str | None = "kernel"
    unit: str | None = None

    @property
    def from_kernel(self) -> bool:
        """Whether the kernel itself wrote this line (``_TRANSPORT=kernel``)."""
        return self.transport == "kernel"


def valid_cursor(cursor: str) -> bool:
    """Whether ``cursor`` looks like a journal cursor (it goes into journalctl's argv)."""
    return len(cursor) <= 1024 and _CURSOR.fullmatch(cursor) is not None


def read_boot_id(proc_root: Path = PROC_ROOT) -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), 32 hex digits.

    Raises:
        OSError: the file cannot be read.
        ValueError: it does not hold a boot id.
    """
    raw = (proc_root / "sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    if _BOOT_ID.fullmatch(raw) is None:
        raise ValueError(f"boot_id: {raw[:64]!r} is not a boot id")
    return raw


# ---------------------------------------------------------------------------
# /dev/kmsg


@dataclass(frozen=True, slots=True)
class KmsgRead:
    """Records read from /dev/kmsg: those after the sequence asked for, and the last one's."""

    lines: tuple[KernelLine, ...]
    last_seq: int | None


def kmsg_record(record: bytes) -> tuple[int, str] | None:
    """``(seq, message)`` of a /dev/kmsg record the kernel wrote; None for any other.

    A record is ``prio,seq,usec,flags;message`` (Documentation/ABI/testing/
    dev-kmsg), ``prio`` being ``facility << 3 | level``. Any user who may
    write /dev/kmsg can add a record, but the kernel gives it facility 1
    (``user``) at least, whatever ``<N>`` prefix it wrote (devkmsg_write):
    only facility 0 is the kernel's own, so only those records are read
    (#31: an injected ``Killed process`` line made recovery raise).
    """
    head, sep, message = record.partition(b";")
    parts = head.split(b",")
    if not sep or len(parts) < 4 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    if len(parts[0]) > 10 or len(parts[1]) > 20 or int(parts[0]) >> 3 != 0:
        return None
    text = message.split(b"\n", 1)[0].decode("utf-8", "replace")
    return int(parts[1]), text


def read_kmsg(
    after: int | None, path: Path = Path("/dev/kmsg"), *, max_records: int = 200_000
) -> KmsgRead | None:
    """The ring buffer's records with a sequence number above ``after``; None if unreadable.

    ``after`` None reads none (only the last sequence number, the position
    to start from next time). A record is ``prio,seq,usec,flags;message``
    (Documentation/ABI/testing/dev-kmsg); records overwritten while reading
    (EPIPE) are skipped.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # EPERM with kernel.dmesg_restrict=1 for non-root
    lines: list[KernelLine] = []
    last: int | None = None
    try:
        for _ in range(max_records):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # a record longer than the buffer
                    continue
                break
            if not record:
                break
            head, _sep, _message = record.partition(b";")
            seq_text = head.split(b",")[1:2]
            if seq_text and seq_text[0].isdigit() and len(seq_text[0]) <= 20:
                last = int(seq_text[0])  # every record moves the position on
            got = kmsg_record(record)
            if got is not None and after is not None and got[0] > after:
                lines.append(KernelLine(got[1], None, str(got[0])))
    finally:
        os.close(fd)
    return KmsgRead(tuple(lines), last)


# ---------------------------------------------------------------------------
# The journal


def journalctl_path() -> str | None:
    """journalctl's absolute path, from the system's directories only; None without one."""
    return shutil.which("journalctl", path=_SAFE_PATH)


def _argv(journalctl: str, after: str | None, boot: str | None = None) -> list[str]:
    argv = [journalctl, "--no-pager", "--quiet", "-o", "json", f"--output-fields={_FIELDS}"]
    if boot is not None:
        if _BOOT_ID.fullmatch(boot) is None:
            raise ValueError(f"not a boot id: {boot[:80]!r}")
        argv.append(f"--boot={boot}")
    elif after is None:
        argv += ["-n", "1"]  # only the newest entry: where to start next time
    else:
        if not valid_cursor(after):
            raise ValueError(f"not a journal cursor: {after[:80]!r}")
        argv.append(f"--after-cursor={after}")
    return [*argv, "_TRANSPORT=kernel"]


#: systemd-oomd's own messages: _SYSTEMD_UNIT is journald's (from the sender's
#: cgroup), which no other process can claim.
OOMD_MATCH: Final = "_SYSTEMD_UNIT=systemd-oomd.service"


def follow_argv(journalctl: str, *, kernel: bool = True, oomd: bool = False) -> list[str]:
    """The argv of a follower of new kernel messages (one JSON entry a line).

    ``oomd`` adds systemd-oomd's messages (its lines about kills, _oomd.py);
    ``kernel`` False leaves the kernel's out (read from /dev/kmsg instead).
    """
    matches = (["_TRANSPORT=kernel"] if kernel else []) + ([OOMD_MATCH] if oomd else [])
    if not matches:
        raise ValueError("a follower of nothing: kernel or oomd must be True")
    # journalctl ORs the groups "+" separates.
    joined = [m for match in matches for m in ("+", match)][1:]
    return [
        journalctl,
        "--no-pager",
        "--quiet",
        "--follow",
        "-n",
        "0",
        "-o",
        "json",
        f"--output-fields={_FIELDS}",
        *joined,
    ]


def _env() -> dict[str, str]:
    # Nothing of the caller's environment: no pager, no colours, plain bytes.
    return {"PATH": _SAFE_PATH, "LC_ALL": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}


def parse_journal_entry(raw: bytes) -> KernelLine | None:
    """One line of ``journalctl -o json``; None for anything that is not a journal entry.

    MESSAGE may be an array of bytes (not UTF-8); the cursor and boot id are
    validated, the whole line bounded by :data:`MAX_LINE`. The entry's
    ``_TRANSPORT`` and ``_SYSTEMD_UNIT`` are kept, not judged: a reader of
    the kernel's lines takes only those :attr:`KernelLine.from_kernel`, the
    monitor's reader of systemd-oomd's only those of its unit.
    """
    if len(raw) > MAX_LINE:
        return None
    entry = json_object(raw)
    if entry is None:
        return None
    cursor, boot, message = entry.get("__CURSOR"), entry.get("_BOOT_ID"), entry.get("MESSAGE")
    if not isinstance(cursor, str) or not valid_cursor(cursor):
        return None
    if not isinstance(boot, str) or _BOOT_ID.fullmatch(boot) is None:
        boot = None
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        message = bytes(message).decode("utf-8", "replace")
    if not isinstance(message, str):
        return None
    transport, unit = entry.get("_TRANSPORT"), entry.get("_SYSTEMD_UNIT")
    return KernelLine(
        message,
        boot,
        cursor,
        transport if isinstance(transport, str) else None,
        unit if isinstance(unit, str) else None,
    )


@dataclass(frozen=True, slots=True)
class JournalRead:
    """Kernel messages read from the journal, and the cursor to read after next time.

    ``complete`` is False when a bound (entries, time) cut the read short:
    the next read goes on from ``cursor``.
    """

    lines: tuple[KernelLine, ...]
    cursor: str | None
    complete: bool


def read_journal(
    after: str | None,
    *,
    journalctl: str | None = None,
    timeout: float = TIMEOUT,
    max_entries: int = MAX_ENTRIES,
) -> JournalRead | None:
    """The journal's kernel messages after the cursor ``after``; None without journalctl.

    ``after`` None reads only the newest entry's cursor (the start for next
    time), no lines. A caller that may not read the system journal gets no
    kernel entries (journalctl shows it only its own): check
    :func:`journal_access` first. The read stops after ``max_entries`` or
    ``timeout`` seconds (``complete`` False).
    """
    path = journalctl or journalctl_path()
    if path is None:
        return None
    return _read(
        _argv(path, after), after, keep=after is not None, timeout=timeout, limit=max_entries
    )


def read_journal_boot(
    boot: str,
    *,
    journalctl: str | None = None,
    timeout: float = TIMEOUT,
    max_entries: int = MAX_ENTRIES,
) -> JournalRead | None:
    """The journal's kernel messages of the boot ``boot`` (32 hex digits); None without
    journalctl.

    Where /dev/kmsg is the source, the kills of the boot before are in the
    journal only, when it is persistent (Debian's systemd package makes
    /var/log/journal, so it is). Bounded like :func:`read_journal`; a
    journal without that boot gives no lines.
    """
    path = journalctl or journalctl_path()
    if path is None:
        return None
    argv = _argv(path, None, boot)
    return _read(argv, None, keep=True, timeout=timeout, limit=max_entries)


def _spawn(argv: list[str]) -> subprocess.Popen[bytes] | None:
    """journalctl with ``argv`` (fixed, validated), its stdout a pipe; None if it cannot start."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(),
            close_fds=True,
        )
    except OSError:
        return None
    return proc


def _read(
    argv: list[str], after: str | None, *, keep: bool, timeout: float, limit: int
) -> JournalRead | None:
    proc = _spawn(argv)
    if proc is None:
        return None
    assert proc.stdout is not None
    lines: list[KernelLine] = []
    cursor = after
    complete = True
    deadline = time.monotonic() + timeout
    try:
        for raw in _bounded_lines(proc.stdout.fileno(), deadline):
            entry = parse_journal_entry(raw)
            if entry is None or not entry.from_kernel:
                continue  # the kernel's lines only, whatever the argv's match did (#31)
            cursor = entry.position
            if keep:
                lines.append(entry)
            if len(lines) >= limit:
                complete = False
                break
        else:
            complete = time.monotonic() < deadline
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.stdout.close()
        proc.wait()
    return JournalRead(tuple(lines), cursor, complete)


def _bounded_lines(fd: int, deadline: float) -> Iterable[bytes]:
    """Lines from a pipe until EOF or the deadline; an over-long line is dropped whole."""
    rest = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            if rest and len(rest) <= MAX_LINE:
                yield rest
            return
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
        if len(rest) > MAX_LINE:
            rest = b""  # garbage, not an entry; what follows its newline is


# ---------------------------------------------------------------------------
# Who may read it


@dataclass(frozen=True, slots=True)
class JournalAccess:
    """Whether this process may read the system journal, and which groups may.

    ``groups`` are the groups the system journal's files grant read access
    (their owning group, and ACL entries): the groups a user must join to
    have OOM victims named from the journal. ``files`` is False when no
    system journal file was found (no journald, or none written yet).
    """

    readable: bool
    groups: tuple[str, ...]
    files: bool


_ACL_XATTR: Final = "system.posix_acl_access"
_ACL_GROUP: Final = 0x08
_ACL_MASK: Final = 0x10
_ACL_READ: Final = 0x04


def _acl_read_groups(path: Path) -> list[int]:
    """Group ids the ACL of ``path`` lets read it."""
    try:
        return parse_acl_read_groups(os.getxattr(path, _ACL_XATTR))
    except OSError:
        return []


def parse_acl_read_groups(raw: bytes) -> list[int]:
    """Group ids a ``system.posix_acl_access`` value lets read (the kernel's format:
    a 4-byte version, then (tag u16, perm u16, id u32) entries; the mask limits groups)."""
    if len(raw) < 4 or (len(raw) - 4) % 8 or len(raw) > 4 + 8 * 1024:
        return []
    mask = _ACL_READ
    gids: list[int] = []
    for offset in range(4, len(raw), 8):
        tag, perm, ident = struct.unpack_from("<HHI", raw, offset)
        if tag == _ACL_MASK:
            mask = perm
        elif tag == _ACL_GROUP and perm & _ACL_READ:
            gids.append(ident)
    return gids if mask & _ACL_READ else []


def _machine_id(path: Path) -> str | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    return raw if _BOOT_ID.fullmatch(raw) else None


def journal_access(
    dirs: Iterable[Path] = JOURNAL_DIRS,
    *,
    machine_id: Path = Path("/etc/machine-id"),
) -> JournalAccess:
    """Whether this process may read the system journal's files, and who may."""
    mid = _machine_id(machine_id)
    readable = found = False
    gids: list[int] = []
    for base in dirs:
        if mid is None:
            break
        directory = base / mid
        target = directory / "system.journal"
        try:
            st = os.stat(target)
        except OSError:
            continue
        found = True
        if st.st_mode & stat.S_IRGRP:
            gids.append(st.st_gid)
        gids.extend(_acl_read_groups(target))
        readable = readable or os.access(target, os.R_OK)
    names: list[str] = []
    for gid in dict.fromkeys(gids):
        with contextlib.suppress(KeyError):
            name = grp.getgrgid(gid).gr_name
            if name != "root":
                names.append(name)
    return JournalAccess(readable, tuple(names), found)


def start_follower(*, kernel: bool = True, oomd: bool = False) -> subprocess.Popen[bytes] | None:
    """A ``journalctl --follow`` of new kernel messages (and with ``oomd`` systemd-oomd's),
    its stdout non-blocking; None when this process may not read the system journal
    (or has no journalctl)."""
    path = journalctl_path()
    if path is None or not journal_access().readable:
        return None
    proc = _spawn(follow_argv(path, kernel=kernel, oomd=oomd))
    if proc is None:
        return None
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    return proc


def stop_follower(proc: subprocess.Popen[bytes]) -> None:
    """End a follower and reap it."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if proc.stdout is not None:
        proc.stdout.close()
    proc.wait()


def kmsg_readable(path: Path = Path("/dev/kmsg")) -> bool:
    """Whether this process may read the kernel's ring buffer (``dmesg_restrict`` allows
    only CAP_SYSLOG when set: the open fails, whatever the file's mode says)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError:
        return False
    return True
