"""Launches made by ``agentscope exec`` that the registry has not taken in yet.

The exec fast path cannot afford to import :mod:`sqlite3` (about 80 ms under
TCG, half of what it may spend), so it records its launch as one small file
in ``spool/`` next to the registry, before its scope starts. The registry
takes these files in at its next transaction (``Registry._take_spool``).

An entry is first written under the agent's name, ``FLEET+NAME``, with
``O_EXCL``: two execs of one name cannot both pass. An entry whose process
has ended is renamed to its unit's name to free the agent's name, and waits
there for the registry like the others.

Only :mod:`os` (and the light :mod:`._scopeprops`) is used here: the exec
fast path imports this module.
"""

from __future__ import annotations

import os
import stat  # os imports it already: free on the exec fast path

from .. import _names, _numbers
from .._errors import InvalidName
from .._kernel._statline import split_stat
from .._managers._scopeprops import DEFAULT_REAP_AFTER, parse_reap_after
from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from collections.abc import Mapping, Sequence

__all__ = [
    "DRAFT_MAX_AGE",
    "MAX_PENDING",
    "OWN_DIR_NAME",
    "Entry",
    "check_dir",
    "claim",
    "pending",
    "read",
    "read_held",
    "spool_dir",
    "start_time",
    "state_dir",
]

# Beyond this many entries exec takes the slow path once, which empties the
# spool: a harness that only ever execs still keeps it small.
MAX_PENDING = 64

_MAGIC = "agentscope-spool-2"  # 2: reap_after before argv
_MAGIC_1 = "agentscope-spool-1"
OWN_DIR_NAME = "agentscope"
_ELOOP = 40  # errno.ELOOP on Linux (errno is one import too many on this path)


def state_dir(manager: str, env: Mapping[str, str] = os.environ) -> str:
    """Where a manager's registry lives (see ``default_registry_path``).

    Raises:
        ValueError: ``manager`` is neither ``"system"`` nor ``"user"``.
    """
    if manager == "system":
        return f"/var/lib/{OWN_DIR_NAME}"
    if manager != "user":
        raise ValueError(f"manager must be 'system' or 'user', not {manager!r}")
    state_home = env.get("XDG_STATE_HOME", "")
    if not (state_home and os.path.isabs(state_home)):  # the XDG spec ignores a relative one
        import pwd

        home = env.get("HOME")
        if not home:
            try:
                home = pwd.getpwuid(os.getuid()).pw_dir
            except KeyError:
                from .._errors import AgentscopeError

                raise AgentscopeError(
                    f"uid {os.getuid()} has no passwd entry and HOME is unset, so the "
                    "user registry has no place: set HOME or XDG_STATE_HOME"
                ) from None
        state_home = f"{home}/.local/state"
    return f"{state_home}/{OWN_DIR_NAME}"


#: The kernel's PID_MAX_LIMIT (4M on 64-bit): no pid is above it.
_PID_MAX = 4 * 1024 * 1024
#: An entry is a few hundred bytes; argv is bounded by ARG_MAX (2 MiB by default).
_MAX_ENTRY = 4 << 20
_HEX = frozenset("0123456789abcdef")


def check_dir(spool: str) -> str | None:
    """Why the spool directory ``spool`` cannot be trusted; None when it can or is absent.

    Entries are believed (they become registry rows and name processes),
    so the directory must be this user's own: a real directory, not a
    link, owned by the effective uid, writable by no one else. With
    ``registry=`` in a shared directory (``/tmp/r.db``), ``spool/`` is where
    any user could have made it first (#31).
    """
    try:
        st = os.lstat(spool)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory (a link or another file)"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def spool_dir(registry: str | os.PathLike[str]) -> str:
    """The spool of the registry file ``registry``."""
    return os.path.join(os.path.dirname(os.fspath(registry)), "spool")


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (when it started, in clock ticks); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:  # ENOENT or ESRCH: it ended
        return None
    return int(split_stat(data)[2][19])  # field 22


class Entry:
    """One launch of ``agentscope exec``, as the registry will record it."""

    __slots__ = (
        "argv",
        "created",
        "cwd",
        "fleet",
        "name",
        "pid",
        "reap_after",
        "slice_dir",
        "start_time",
        "unit",
    )

    def __init__(
        self,
        fleet: str,
        name: str,
        unit: str,
        pid: int,
        start_time: int,
        created: float,
        slice_dir: str,
        cwd: str,
        argv: Sequence[str],
        reap_after: float | None = DEFAULT_REAP_AFTER,
    ) -> None:
        self.fleet, self.name, self.unit = fleet, name, unit
        self.pid, self.start_time, self.created = pid, start_time, created
        self.slice_dir, self.cwd, self.argv = slice_dir, cwd, list(argv)
        #: seconds its leftovers may outlive it (None: kept); see _reaper
        self.reap_after = reap_after

    def encode(self) -> bytes:
        # NUL-separated: no field can hold a NUL (names, paths and argv are C strings).
        fields = [_MAGIC, self.fleet, self.name, self.unit, str(self.pid), str(self.start_time)]
        # Fixed-point, to the microsecond: read back by parse_reap_after, whose
        # time spans have no exponent (repr(1e-05) is "1e-05").
        keep = "keep" if self.reap_after is None else f"{float(self.reap_after):.6f}"
        fields += [repr(self.created), self.slice_dir, self.cwd, keep, *self.argv]
        return b"\0".join(os.fsencode(f) for f in fields)

    @classmethod
    def decode(cls, data: bytes) -> Entry | None:
        """The entry, or None for a file that is not one (a torn or foreign write)."""
        fields = [os.fsdecode(f) for f in data.split(b"\0")]
        if len(fields) < 9 or fields[0] not in (_MAGIC, _MAGIC_1):
            return None
        reap_after: float | None = DEFAULT_REAP_AFTER  # version 1 had none
        argv = fields[9:]
        try:
            # The one number grammar: ASCII digits, bounded, finite (#31).
            pid = _numbers.whole("pid", fields[4], low=1, high=_PID_MAX)
            start = _numbers.whole("start_time", fields[5], low=0, high=2**63 - 1)
            created = _numbers.real("created", fields[6], low=0, high=1e11)
            if fields[0] == _MAGIC:
                if not argv:
                    return None
                keep, argv = argv[0], argv[1:]
                reap_after = parse_reap_after(keep)
        except ValueError:  # InvalidConfig is one
            return None
        fleet, name, unit, slice_dir, cwd = fields[1], fields[2], fields[3], fields[7], fields[8]
        entry = cls(fleet, name, unit, pid, start, created, slice_dir, cwd, argv, reap_after)
        return entry if entry._valid() else None

    def _valid(self) -> bool:
        """Whether each field is what an exec writes (checked before belief)."""
        fleet, name, unit = self.fleet, self.name, self.unit
        try:
            _names.validate_name("fleet", fleet)
            _names.validate_name("agent", name)
        except InvalidName:
            return False
        prefix, suffix = f"agentscope-{fleet}-{name}-", ".scope"
        token = unit[len(prefix) : -len(suffix)]
        if not (unit.startswith(prefix) and unit.endswith(suffix) and len(token) == 6):
            return False
        if not set(token) <= _HEX:
            return False
        if not os.path.isabs(self.slice_dir) or ".." in self.slice_dir.split("/"):
            return False
        if self.cwd and not os.path.isabs(self.cwd):
            return False
        return bool(self.argv) and self.pid > 0 and self.start_time >= 0 and self.created >= 0

    def file_names(self) -> tuple[str, str]:
        """The names this entry may have in the spool: its agent's, or its unit's once freed."""
        return f"{self.fleet}+{self.name}", self.unit

    def alive(self) -> bool:
        """Whether the launching process still runs (the same one: its start time matches)."""
        return start_time(self.pid) == self.start_time

    def state(self) -> str:
        """``running`` (its scope exists), ``starting`` (not yet), or ``lost`` (ended)."""
        if os.path.isdir(os.path.join(self.slice_dir, self.unit)):
            return "running"
        return "starting" if self.alive() else "lost"


def claim(spool: str, entry: Entry) -> str | None:
    """Write ``entry`` under its agent's name; its path, or None if the name is held.

    A held name whose process has ended is freed first (its entry renamed
    to its unit's name, for the registry to take in). None means a live
    process holds the name: the caller takes the slow path, which knows more.
    """
    os.makedirs(spool, mode=0o700, exist_ok=True)
    why = check_dir(spool)
    if why is not None:  # the exec takes the slow path, which says so
        raise PermissionError(f"the spool {spool} {why}")
    # Written whole first, then linked under the name: a reader never sees
    # half an entry, and link() fails if the name is taken.
    draft = os.path.join(spool, f".{entry.unit}")
    data = entry.encode()
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            while data:  # a short write (a nearly full disk) goes on; ENOSPC raises
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
    except BaseException:
        os.unlink(draft)  # a full disk leaves no draft behind (#31)
        raise
    path = os.path.join(spool, f"{entry.fleet}+{entry.name}")
    try:
        for _ in range(3):
            try:
                os.link(draft, path)
                return path
            except FileExistsError:
                try:
                    holder = read(path)
                except OSError:
                    return None  # unreadable now (EMFILE, EACCES): the slow path decides
                if holder is not None and holder.alive():
                    return None
                freed = holder.unit if holder is not None else f"{entry.fleet}+{entry.name}.bad"
                try:  # noqa: SIM105 (contextlib is one import too many on this path)
                    os.rename(path, os.path.join(spool, freed))
                except FileNotFoundError:
                    pass  # another exec freed it first
        return None
    finally:
        os.unlink(draft)


def read(path: str) -> Entry | None:
    """The entry at ``path``; None when it is gone or not an entry.

    Raises:
        OSError: it exists but cannot be read now (EMFILE, EACCES, EIO...):
            not a reason to take it for corrupt and delete it.
    """
    held = read_held(path)
    return None if held is None else held[0]


def _open_entry(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_held(path: str) -> tuple[Entry | None, int] | None:
    """The entry at ``path`` (None: not an entry) and the inode it was read from.

    The inode tells a taker later whether the name still holds this entry (an
    exec may have claimed the name meanwhile). None when the file is gone.

    Raises:
        OSError: as :func:`read`.
    """
    try:
        # O_NONBLOCK and O_NOFOLLOW: a FIFO or a link in the spool is no entry
        # and must not hang the reader; an entry is a regular file.
        fd = _open_entry(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == _ELOOP:
            return None, os.lstat(path).st_ino
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_ENTRY:
            return None, st.st_ino
        chunks: list[bytes] = []
        size = 0
        while size <= _MAX_ENTRY:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > _MAX_ENTRY:
            return None, st.st_ino
        return Entry.decode(b"".join(chunks)), st.st_ino
    finally:
        os.close(fd)


# A claim holds its draft for microseconds; one this old was left by an exec
# killed (SIGKILL, power loss) between writing it and unlinking it.
DRAFT_MAX_AGE = 300.0


def pending(spool: str, now: float | None = None) -> list[str]:
    """The paths of the entries waiting in ``spool``, oldest name first.

    Drafts that a killed exec left behind are removed on the way.
    """
    if check_dir(spool) is not None:
        return []  # not this user's own: nothing in it is believed (Registry warns)
    try:
        names = os.listdir(spool)
    except OSError:  # no spool yet: nothing was ever exec'd
        return []
    drafts = [n for n in names if n.startswith(".")]
    if drafts:
        import time

        cutoff = (time.time() if now is None else now) - DRAFT_MAX_AGE
        for name in drafts:
            draft = os.path.join(spool, name)
            try:
                if os.lstat(draft).st_mtime < cutoff:
                    os.unlink(draft)
            except OSError:
                pass  # gone meanwhile, or not ours to remove
    return [os.path.join(spool, n) for n in sorted(names) if not n.startswith(".")]
