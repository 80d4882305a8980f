"""A call's ``call_started`` and ``call_exited`` events, recorded without the registry (#26).

``agentscope call`` may not import SQLite (it must start as fast as
``exec``), so a call's events are small files in ``calls/`` beside the
registry, written by whoever watches the call: the remover that
``agentscope call`` forks (:func:`._calls.fork_remover`) or ``Fleet.call``'s
thread. The registry takes them in at its next transaction
(:func:`take_all`), with the time each was written, under the agent whose
scope the call was in.

``call_started`` is written once the command has exec'd in its call;
``call_exited`` once the call's cgroup is empty (the command and whatever it
left running ended), with its peak memory (``memory.peak``, Linux 5.19+;
None before), its OOM kills (``memory.events`` ``oom_kill``) and the exit
status when the writer knows it: ``Fleet.call`` is the command's parent and
does; ``agentscope call``'s command is the caller's shell's child, and only
that shell learns its status (None).

The writer side uses only :mod:`os` (and :mod:`json` in the watcher, after
the exec); the directory is trusted as the exec spool is (:func:`._spool.check_dir`).
"""

from __future__ import annotations

import contextlib
import os

from .._errors import AgentscopeError
from .._registry import _spool
from .._typecheck import TYPE_CHECKING
from ._calls import CALL_PREFIX

if TYPE_CHECKING:  # annotations only
    from collections.abc import Mapping, Sequence

    from .._registry._registry import Registry

__all__ = [
    "ARGV_MAX",
    "CALLS_DIR_NAME",
    "CallWatch",
    "argv_summary",
    "calls_dir",
    "calls_dir_of_scope",
    "read_outcome",
    "take_all",
]

CALLS_DIR_NAME = "calls"
ARGV_MAX = 256
"""At most this many characters of a call's command line in its events."""
_ARG_MAX = 64  # characters of one argument
_MAX_FILE = 8192
_KINDS = ("call_started", "call_exited")
WAITING_MAX = 10_000
"""At most this many call events wait in ``calls/`` (about 4.5 MiB): with no
fleet opened and no monitor running nothing takes them in, and a host that
makes calls for ever must not fill its disk with them (measured: 470 bytes a
call, docs/calls.md). Past it a call's events are not written; the call runs."""


def calls_dir(registry: str | os.PathLike[str]) -> str:
    """Where the call events of the registry file ``registry`` wait."""
    return os.path.join(os.path.dirname(os.fspath(registry)), CALLS_DIR_NAME)


def calls_dir_of_scope(scope: str, env: Mapping[str, str] = os.environ) -> str | None:
    """The calls directory of the default registry of the manager that runs ``scope``.

    ``scope`` is the scope's cgroup path: below a ``user@UID.service`` it is
    a user manager's (the registry under ``$XDG_STATE_HOME``), else the
    system manager's. None when that registry's directory does not exist
    (no fleet ever opened there: nobody would read the events).
    """
    user = any(p.startswith("user@") and p.endswith(".service") for p in scope.split("/"))
    try:
        state = _spool.state_dir("user" if user else "system", env)
    except (AgentscopeError, ValueError):  # no passwd entry and no HOME: no events
        return None
    return os.path.join(state, CALLS_DIR_NAME) if os.path.isdir(state) else None


def argv_summary(argv: Sequence[str]) -> str:
    """``argv`` as one bounded line: each word cut at 64 characters, all at :data:`ARGV_MAX`."""
    words = []
    for arg in argv:
        clean = "".join(c if c.isprintable() else "?" for c in arg[: _ARG_MAX + 1])
        words.append(clean if len(clean) <= _ARG_MAX else clean[: _ARG_MAX - 3] + "...")
    line = " ".join(words)
    return line if len(line) <= ARGV_MAX else line[: ARGV_MAX - 3] + "..."


def _read_key(path: str, key: str) -> int | None:
    try:
        with open(path, "rb") as f:
            data = f.read(4096).decode(errors="replace")
    except OSError:
        return None
    for line in data.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def read_outcome(call_dir: str) -> tuple[int | None, int | None]:
    """(peak memory bytes, OOM kills) of the call's cgroup; None where it cannot be read.

    ``memory.peak`` exists from Linux 5.19; ``memory.events`` counts the
    call's sub-cgroups too.
    """
    try:
        with open(call_dir + "/memory.peak", "rb") as f:
            text = f.read(64).split()
        peak = int(text[0]) if text and text[0].isdigit() else None
    except OSError:
        peak = None
    return peak, _read_key(call_dir + "/memory.events", "oom_kill")


class CallWatch:
    """What one call's watcher writes: its ``call_started`` and ``call_exited`` files."""

    __slots__ = ("argv", "call", "directory", "limits", "outcome", "pid", "started", "unit")

    def __init__(
        self,
        directory: str | None,
        unit: str,
        call: str,
        pid: int,
        argv: str,
        limits: tuple[int | None, int | None],
    ) -> None:
        self.directory = directory
        self.unit = unit
        self.call = call
        self.pid = pid
        self.argv = argv
        self.limits = limits
        self.started = 0.0
        self.outcome: tuple[int | None, int | None] = (None, None)

    def _detail(self) -> dict[str, object]:
        return {
            "unit": self.unit,
            "call": self.call,
            "pid": self.pid,
            "argv": self.argv,
            "memory_max": self.limits[0],
            "tasks_max": self.limits[1],
        }

    def begin(self) -> None:
        """Write ``call_started`` (the command has exec'd in its call)."""
        import time

        self.started = time.time()
        self._write("call_started", self.started, self._detail())

    def measure(self, call_dir: str) -> None:
        """Read the call's peak and OOM kills (called once it is empty, before its removal)."""
        self.outcome = read_outcome(call_dir)

    def end(self, status: int | None) -> None:
        """Write ``call_exited`` with ``status`` (None: not this writer's to know)."""
        import time

        now = time.time()
        peak, ooms = self.outcome
        detail = self._detail()
        detail.update(
            status=status,
            peak=peak,
            oom_kills=ooms,
            seconds=round(max(now - self.started, 0.0), 3),
        )
        self._write("call_exited", now, detail)

    def _write(self, kind: str, ts: float, detail: dict[str, object]) -> None:
        """One file, written whole under a dot name then renamed (the taker skips dot names).

        Best effort: a watcher has nobody to tell (its stdio is /dev/null);
        a directory that cannot be written loses the event, never the call.
        """
        if self.directory is None or _waiting_at_least(self.directory, WAITING_MAX):
            return
        import json

        name = f"{int(ts * 1e9):020d}-{os.getpid()}-{kind}"
        data = json.dumps({"kind": kind, "ts": ts, "detail": detail}).encode()
        draft = os.path.join(self.directory, "." + name)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.directory, 0o700)
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.rename(draft, os.path.join(self.directory, name))
        except OSError:
            try:  # noqa: SIM105 (contextlib: an import the watcher does not need)
                os.unlink(draft)
            except OSError:
                pass


def _parse(data: bytes) -> tuple[str, float, dict[str, object]] | None:
    """(kind, ts, detail) of one file, checked and bounded; None: not a call event."""
    import math

    from .. import _names
    from .._dicts import json_object
    from .._errors import InvalidName

    doc = json_object(data)
    if doc is None:
        return None
    kind, ts, detail = doc.get("kind"), doc.get("ts"), doc.get("detail")
    if kind not in _KINDS or not isinstance(detail, dict):
        return None
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
        return None
    unit, call, argv = detail.get("unit"), detail.get("call"), detail.get("argv")
    if not (isinstance(unit, str) and _is_scope(unit)):
        return None
    if not isinstance(call, str) or not call.startswith(CALL_PREFIX):
        return None
    try:
        _names.validate_name("call", call)
    except InvalidName:
        return None
    if not isinstance(argv, str) or len(argv) > ARGV_MAX:
        return None
    out: dict[str, object] = {"unit": unit, "call": call, "argv": argv}
    ints: tuple[str, ...] = ("pid", "memory_max", "tasks_max")
    if kind == "call_exited":
        ints += ("status", "peak", "oom_kills")
    for key in ints:
        value = detail.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or abs(value) >= 1 << 63
        ):
            return None
        out[key] = value
    if not isinstance(out["pid"], int) or out["pid"] <= 0:
        return None
    if kind == "call_exited":
        seconds = detail.get("seconds")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            return None
        out["seconds"] = float(seconds) if math.isfinite(seconds) else None
    return kind, float(ts), out


def _is_scope(unit: str) -> bool:
    return (
        len(unit) <= 255
        and unit.startswith("agentscope-")
        and unit.endswith(".scope")
        and "/" not in unit
        and unit.isprintable()
    )


def _waiting_at_least(directory: str, count: int) -> bool:
    """Whether ``directory`` holds ``count`` entries or more (counting stops there)."""
    try:
        with os.scandir(directory) as entries:
            for n, _ in enumerate(entries, 1):
                if n >= count:
                    return True
    except OSError:
        pass
    return False


def take_all(reg: Registry, directory: str) -> int:
    """Record the call events waiting in ``directory`` and remove them; how many were recorded.

    An event of a scope the registry has no row for (another registry's
    agent, a forged file) is dropped, as is a file that is no call event.
    """
    recorded = 0
    for path in _spool.pending(directory):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            _unlink(path)
            continue
        try:
            data = os.read(fd, _MAX_FILE + 1)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        event = _parse(data) if len(data) <= _MAX_FILE else None
        row = None if event is None else reg.by_unit(str(event[2]["unit"]))
        if event is not None and row is not None:
            kind, ts, detail = event
            if kind == "call_started":
                reg.record_event(row.fleet, row.name, "call_started", detail, ts=ts)
            else:
                reg.record_event(row.fleet, row.name, "call_exited", detail, ts=ts)
            recorded += 1
        _unlink(path)
    return recorded


def _unlink(path: str) -> None:
    try:  # noqa: SIM105
        os.unlink(path)
    except OSError:
        pass
