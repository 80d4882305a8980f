"""The registry: an SQLite file that remembers every agent agentscope launched.

Agents outlive the manager process that started them; the next manager finds
them again here. Each launch is one row of ``agents`` (fleet, name, unit,
pid and pid start time, argv, cwd, state, exit and memory figures), and
everything worth telling a user later is one row of ``events``.

The file lives at :func:`default_registry_path`. It is opened in WAL mode
with a busy timeout; every write is one short ``BEGIN IMMEDIATE``
transaction, so a harness and several CLI invocations can share it.

Reconciliation against the scopes systemd still runs is a pure function,
:func:`reconcile`, whose :class:`ReconcilePlan` the caller carries out (the
closures with :meth:`Registry.apply_closures`).

Error tree (``RegistryError`` and ``RegistryCorrupt`` live in ``_errors.py``)::

    AgentscopeError
    ├── AgentExists          an open row already holds that (fleet, name)
    └── RegistryError        the registry file cannot be used (names the file)
        ├── RegistryCorrupt  not a database, or a damaged one: move it aside
        ├── UnitNotFound     no row for that unit
        └── InvalidTransition a state change the lifecycle does not allow

Lifecycle of a row (``set_state``)::

    starting  -> running, frozen, stopping, or a closed state
    running   -> frozen, stopping, or a closed state
    frozen    -> running, stopping, or a closed state
    stopping  -> a closed state
    exited, failed, lost (closed) -> nothing: a closed row is never reopened
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast, get_args

from . import _spool
from ._dicts import as_dict
from ._errors import AgentExists, RegistryCorrupt, RegistryError

__all__ = [
    "CLOSED_STATES",
    "DEFAULT_RETENTION",
    "MAX_EVENTS",
    "OPEN_STATES",
    "REASON_PID_REUSED",
    "REASON_PROCESS_GONE",
    "REASON_SCOPE_GONE",
    "SCHEMA_VERSION",
    "AgentRecord",
    "AgentState",
    "EventRecord",
    "InvalidTransition",
    "LiveScope",
    "ReconcilePlan",
    "Registry",
    "RegistryCorrupt",
    "RegistryError",
    "UnitNotFound",
    "default_registry_path",
    "in_flight",
    "reconcile",
    "stale",
]

_T = TypeVar("_T")

AgentState = Literal["starting", "running", "frozen", "stopping", "exited", "failed", "lost"]
"""The state of one launch. ``exited``, ``failed`` and ``lost`` are closed."""

OPEN_STATES: Final[frozenset[str]] = frozenset({"starting", "running", "frozen", "stopping"})
CLOSED_STATES: Final[frozenset[str]] = frozenset({"exited", "failed", "lost"})
_STATES: Final[frozenset[str]] = frozenset(get_args(AgentState))
assert _STATES == OPEN_STATES | CLOSED_STATES

# Allowed moves between distinct states; setting the current state again is a
# no-op and always allowed. Closed states have no way out.
_TRANSITIONS: Final[Mapping[str, frozenset[str]]] = {
    "starting": frozenset({"running", "frozen", "stopping"}) | CLOSED_STATES,
    "running": frozenset({"frozen", "stopping"}) | CLOSED_STATES,
    "frozen": frozenset({"running", "stopping"}) | CLOSED_STATES,
    "stopping": CLOSED_STATES,
    "exited": frozenset(),
    "failed": frozenset(),
    "lost": frozenset(),
}

# Reasons attached to closures found by reconcile(); they end up in the detail
# of the "lost" event apply_closures() records.
REASON_SCOPE_GONE: Final = "scope-gone"
REASON_PID_REUSED: Final = "pid-reused"
REASON_PROCESS_GONE: Final = "process-gone"

_APPLICATION_ID: Final = 0x41675363  # "AgSc", PRAGMA application_id (sqlite.org/fileformat.html)
_DEFAULT_TIMEOUT: Final = 5.0
_DIR_MODE: Final = 0o700
DEFAULT_RETENTION: Final = 30 * 86400.0
"""How long (seconds) the registry keeps closed agents and events by default."""
MAX_EVENTS: Final = 200_000
"""Events the registry keeps at most (the oldest go first), whatever their age."""
_PRUNE_EVERY: Final = 600.0  # seconds between two automatic prunes of one opener
_RETENTION_ENV: Final = "AGENTSCOPE_RETENTION_DAYS"
_FILE_MODE: Final = 0o600

# Forward migrations: step i takes a database from user_version i to i + 1.
# Append new steps; never edit a released one (tests/test_registry.py keeps a
# frozen copy of version 1 and opens it with the current code).
_MIGRATIONS: list[tuple[str, ...]] = [
    (
        f"PRAGMA application_id = {_APPLICATION_ID}",
        """
        CREATE TABLE agents (
            id             INTEGER PRIMARY KEY,
            fleet          TEXT    NOT NULL,
            name           TEXT    NOT NULL,
            unit           TEXT    NOT NULL UNIQUE,
            pid            INTEGER NOT NULL,
            start_time     INTEGER NOT NULL,
            argv           TEXT    NOT NULL,
            cwd            TEXT    NOT NULL,
            created        REAL    NOT NULL,
            state          TEXT    NOT NULL CHECK (state IN (
                               'starting', 'running', 'frozen', 'stopping',
                               'exited', 'failed', 'lost')),
            exit_status    INTEGER,
            exited         REAL,
            oom_kills      INTEGER NOT NULL DEFAULT 0,
            memory_current INTEGER,
            memory_peak    INTEGER
        )
        """,
        # At most one open row per (fleet, name): the name-uniqueness rule.
        """
        CREATE UNIQUE INDEX agents_open_name ON agents (fleet, name)
            WHERE state NOT IN ('exited', 'failed', 'lost')
        """,
        "CREATE INDEX agents_fleet_name_created ON agents (fleet, name, created)",
        # AUTOINCREMENT: ids are never reused after gc, so `events --follow`
        # polling with after_id cannot miss or repeat an event.
        """
        CREATE TABLE events (
            id     INTEGER PRIMARY KEY AUTOINCREMENT,
            ts     REAL NOT NULL,
            fleet  TEXT NOT NULL,
            agent  TEXT,
            kind   TEXT NOT NULL,
            detail TEXT NOT NULL
        )
        """,
        "CREATE INDEX events_fleet_agent_ts ON events (fleet, agent, ts)",
        "CREATE INDEX events_ts ON events (ts)",
    ),
    # `events --follow` and `top` poll with (fleet, id > last): an index that
    # makes each poll cost the new events, not the fleet's whole history.
    ("CREATE INDEX events_fleet_id ON events (fleet, id)",),
]
SCHEMA_VERSION: Final = len(_MIGRATIONS)
"""The schema version (``PRAGMA user_version``) this code writes."""

_AGENT_COLUMNS: Final = (
    "id, fleet, name, unit, pid, start_time, argv, cwd, created, state, "
    "exit_status, exited, oom_kills, memory_current, memory_peak"
)
_EVENT_COLUMNS: Final = "id, ts, fleet, agent, kind, detail"


# --------------------------------------------------------------------- errors


class UnitNotFound(RegistryError, LookupError):
    """No row of the registry has that unit name."""

    def __init__(self, path: os.PathLike[str] | str, unit: str) -> None:
        self.unit = unit
        super().__init__(
            path, f"no agent with unit {unit!r} in the registry {path}; list agents to see theirs"
        )


class InvalidTransition(RegistryError):
    """A state change the lifecycle does not allow, e.g. reopening a closed row.

    ``current`` is the state stored, ``requested`` the one refused. The row is
    left as it was; re-read it to see who closed it and why.
    """

    def __init__(
        self, path: os.PathLike[str] | str, unit: str, current: str, requested: str
    ) -> None:
        self.unit = unit
        self.current = current
        self.requested = requested
        why = "a closed agent is never reopened" if current in CLOSED_STATES else "not allowed"
        super().__init__(
            path, f"cannot move {unit} from {current!r} to {requested!r}: {why}; re-read the agent"
        )


# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One launch as the registry stores it (one row of ``agents``)."""

    id: int
    fleet: str
    name: str
    unit: str
    pid: int
    start_time: int
    """Field 22 of ``/proc/PID/stat``: clock ticks after boot the process started."""
    argv: tuple[str, ...]
    cwd: str
    created: float
    state: AgentState
    exit_status: int | None
    exited: float | None
    oom_kills: int
    memory_current: int | None
    memory_peak: int | None

    @property
    def closed(self) -> bool:
        """Whether the row is closed (exited, failed or lost) and so final."""
        return self.state in CLOSED_STATES

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (``argv`` as a list)."""
        return as_dict(self)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One event (one row of ``events``); ``agent`` is None for fleet-wide events."""

    id: int
    ts: float
    fleet: str
    agent: str | None
    kind: str
    detail: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-ready dict."""
        return as_dict(self)


def _json_or(raw: Any, fallback: Callable[[Any], _T], kind: type) -> Any:
    """``raw`` parsed as JSON of ``kind``, or ``fallback(raw)``: one damaged
    row (another writer, a disk fault) must not make ``ls`` or ``events`` fail."""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return fallback(raw)
    return value if isinstance(value, kind) else fallback(raw)


def _unreadable(raw: Any) -> dict[str, Any]:
    return {"unreadable": str(raw)[:200]}


def _agent_from_row(row: Sequence[Any]) -> AgentRecord:
    argv = _json_or(row[6], lambda raw: ["<unreadable argv>"], list)
    return AgentRecord(
        id=row[0],
        fleet=row[1],
        name=row[2],
        unit=row[3],
        pid=row[4],
        start_time=row[5],
        argv=tuple(str(a) for a in argv),
        cwd=row[7],
        created=row[8],
        state=cast(AgentState, row[9]),
        exit_status=row[10],
        exited=row[11],
        oom_kills=row[12],
        memory_current=row[13],
        memory_peak=row[14],
    )


def _event_from_row(row: Sequence[Any]) -> EventRecord:
    return EventRecord(
        id=row[0],
        ts=row[1],
        fleet=row[2],
        agent=row[3],
        kind=row[4],
        detail=_json_or(row[5], _unreadable, dict),
    )


# ----------------------------------------------------------- reconciliation


@dataclass(frozen=True, slots=True)
class LiveScope:
    """A scope systemd runs now, as the caller read it.

    ``pids`` are the processes in its cgroup; ``start_times`` maps each pid
    whose ``/proc/PID/stat`` could be read to its start time (field 22). A
    pid missing from ``start_times`` vanished mid-read and counts as gone.
    ``state`` is systemd's word for the unit (``"active"``, ``"running"``...)
    and is carried through, not interpreted.
    """

    unit: str
    pids: tuple[int, ...]
    start_times: Mapping[int, int]
    state: str = "active"

    def start_time(self, pid: int) -> int | None:
        """The start time of ``pid`` if it runs in this scope, else None."""
        if pid not in self.pids:
            return None
        return self.start_times.get(pid)


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    """What :func:`reconcile` found; the caller carries it out.

    - ``adopt``: open rows whose scope runs their very process (pid and start
      time equal). Manage them again.
    - ``unknown``: live scopes no open row claims. Not ours to close; report
      or stop them.
    - ``close``: open rows whose scope is gone (closed as ``lost``).
    - ``reused``: open rows whose pid runs in the scope with another start
      time, i.e. a new process got the old pid. Never adopted; closed as
      ``lost``.
    - ``headless``: open rows whose scope still runs but without their
      process (it exited, leaving children behind). Not adopted; closed as
      ``lost``; the caller may stop the scope.
    """

    adopt: tuple[AgentRecord, ...] = ()
    unknown: tuple[LiveScope, ...] = ()
    close: tuple[AgentRecord, ...] = ()
    reused: tuple[AgentRecord, ...] = ()
    headless: tuple[AgentRecord, ...] = ()

    @property
    def closures(self) -> tuple[tuple[AgentRecord, str], ...]:
        """Every row to close, with the reason: ``(record, reason)``."""
        return (
            tuple((r, REASON_SCOPE_GONE) for r in self.close)
            + tuple((r, REASON_PID_REUSED) for r in self.reused)
            + tuple((r, REASON_PROCESS_GONE) for r in self.headless)
        )


def reconcile(rows: Iterable[AgentRecord], live: Mapping[str, LiveScope]) -> ReconcilePlan:
    """Match registry rows against the scopes systemd runs; no I/O.

    ``rows`` are registry rows (closed ones are skipped: they are final);
    ``live`` maps unit name to scope. Pass the rows and scopes of one fleet,
    or of all fleets: matching is by unit name only. A process is identified
    by (pid, start time) so a reused pid is never adopted.

    Example::

        plan = reconcile(reg.agents("ci"), live_scopes_of("ci"))
        reg.apply_closures(plan)
    """
    adopt: list[AgentRecord] = []
    close: list[AgentRecord] = []
    reused: list[AgentRecord] = []
    headless: list[AgentRecord] = []
    claimed: set[str] = set()
    for row in rows:
        if row.closed:
            continue
        scope = live.get(row.unit)
        if scope is None:
            close.append(row)
            continue
        claimed.add(row.unit)
        if row.pid not in scope.pids or row.pid not in scope.start_times:
            headless.append(row)
        elif scope.start_times[row.pid] != row.start_time:
            reused.append(row)
        else:
            adopt.append(row)
    unknown = tuple(live[u] for u in sorted(live) if u not in claimed)
    return ReconcilePlan(
        adopt=tuple(adopt),
        unknown=unknown,
        close=tuple(close),
        reused=tuple(reused),
        headless=tuple(headless),
    )


LAUNCH_GRACE: Final = 120.0  # seconds a "starting" row may take before it is judged


def in_flight(rec: AgentRecord, *, proc_root: str = "/proc") -> bool:
    """Whether a row is a launch its launcher is still at work on.

    A young ``starting`` row whose child still runs (same start time) and
    is still its launcher's child. The gated child of a launcher that died
    exits in its gate, and one that exec'd is reparented to init or the
    manager (a subreaper, ``systemd``): either way no one will move the row
    on, so it is judged as any other. The one rule, for the launches of
    every path (the library, tmux, ``agentscope exec``'s take-in).
    """
    if rec.state != "starting" or time.time() - rec.created > LAUNCH_GRACE:
        return False
    try:
        with open(f"{proc_root}/{rec.pid}/stat", "rb") as f:
            data = f.read()
    except OSError:  # it ended
        return False
    fields = data[data.rindex(b")") + 2 :].split()
    if int(fields[19]) != rec.start_time or fields[0] in (b"Z", b"X"):
        return False
    ppid = int(fields[1])
    if ppid <= 1:
        return False
    try:
        with open(f"{proc_root}/{ppid}/comm", "rb") as f:
            parent = f.read().strip()
    except OSError:
        return False
    return parent != b"systemd"


def stale(rec: AgentRecord, scope_live: bool) -> bool:
    """Whether an open row may be closed: its scope is gone and no launcher is at work."""
    return not rec.closed and not scope_live and not in_flight(rec)


# ------------------------------------------------------------------- paths


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


def _fix_mode(path: Path, mode: int, flags: int) -> None:
    """Open ``path`` without following a symlink and narrow its mode if it is ours.

    Through the descriptor: with ``registry=`` in a shared directory, a link
    another user plants there must not make us chmod its target.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
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


def _insert_event(
    conn: sqlite3.Connection, ts: float, fleet: str, agent: str | None, kind: str, detail: str
) -> int:
    cur = conn.execute(
        "INSERT INTO events (ts, fleet, agent, kind, detail) VALUES (?, ?, ?, ?, ?)",
        (ts, fleet, agent, kind, detail),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


# ------------------------------------------------------------------ registry


class Registry:
    """The registry file, opened: one connection, safe to share between threads.

    Each method is one short transaction. Use it as a context manager, or
    call :meth:`close`. The async core calls it from a worker thread.

    Example::

        with Registry(default_registry_path("user")) as reg:
            rec = reg.record_launch("ci", "claude-1", unit, pid, start, argv, cwd)
            reg.set_state(rec.unit, "running")

    Raises:
        RegistryCorrupt: the file is not a database or is damaged.
        RegistryError: the file cannot be created, opened or migrated, or it
            was written by a newer agentscope.
    """

    def __init__(
        self,
        path: os.PathLike[str] | str,
        *,
        timeout: float = _DEFAULT_TIMEOUT,
        retention_seconds: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.retention_seconds = (
            _retention_from_env(os.environ) if retention_seconds is None else retention_seconds
        )
        self._pruned = -_PRUNE_EVERY
        self._lock = threading.Lock()
        self._spool = _spool.spool_dir(self.path)
        self._spool_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        try:
            _prepare_files(self.path)
        except OSError as exc:
            raise _map_error(self.path, exc, timeout) from exc
        try:
            conn = sqlite3.connect(
                self.path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _map_error(self.path, exc, timeout) from exc
        try:
            self._setup(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise _map_error(self.path, exc, timeout) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._prune_now()

    # -- lifecycle

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; later calls raise RegistryError. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._conn is None

    def __repr__(self) -> str:
        return f"<Registry {str(self.path)!r}{' closed' if self.closed else ''}>"

    # -- setup and transactions

    def _setup(self, conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self.timeout

        def wal() -> None:
            # Persistent in the file; switching needs an exclusive lock, so
            # only ask when it is not WAL yet.
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode != "wal":
                    raise RegistryError(self.path, f"cannot put {self.path} in WAL mode ({mode})")

        _retry_busy(wal, deadline)
        # NORMAL is durable across process crashes in WAL mode and loses at
        # most the last commits on power loss (sqlite.org/pragma.html#pragma_synchronous).
        conn.execute("PRAGMA synchronous=NORMAL")
        check = _retry_busy(lambda: conn.execute("PRAGMA quick_check(1)").fetchone(), deadline)
        if check is None or check[0] != "ok":
            found = " ".join(str(check[0]).split()) if check else "no answer"
            raise RegistryCorrupt(self.path, f"quick_check: {found}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != len(_MIGRATIONS):
            _retry_busy(lambda: self._migrate(conn), deadline)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: a concurrent opener may have
            # migrated meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            if version > len(_MIGRATIONS):
                raise RegistryError(
                    self.path,
                    f"the agentscope registry {self.path} has schema version {version}, "
                    f"newer than this agentscope knows ({len(_MIGRATIONS)}); upgrade agentscope",
                )
            has_tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0] > 0
            if app_id != _APPLICATION_ID and (version > 0 or has_tables):
                raise RegistryError(
                    self.path,
                    f"{self.path} is an SQLite database but not an agentscope registry; "
                    "point agentscope at another file",
                )
            for step in _MIGRATIONS[version:]:
                for statement in step:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {len(_MIGRATIONS)}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _transaction(self, body: Callable[[sqlite3.Connection], _T], *, write: bool) -> _T:
        self._take_spool()
        with self._lock:
            conn = self._conn
            if conn is None:
                raise RegistryError(self.path, f"the registry {self.path} is closed")

            def attempt() -> _T:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return result

            try:
                return _retry_busy(attempt, time.monotonic() + self.timeout)
            except sqlite3.Error as exc:
                raise _map_error(self.path, exc, self.timeout) from exc

    def _prune_now(self) -> None:
        """Keep the history bounded without anyone running ``gc``: at open, and
        at most every ten minutes of writes. Best effort: a registry busy with
        other writers is pruned next time."""
        self._pruned = time.monotonic()
        if self.retention_seconds <= 0:
            return
        cutoff = time.time() - self.retention_seconds

        def due(conn: sqlite3.Connection) -> bool:
            # Read first: most opens have nothing to prune and must not queue
            # behind another writer for the write lock.
            low, high, oldest = conn.execute(
                "SELECT min(id), max(id), min(ts) FROM events"
            ).fetchone()
            closed = conn.execute(
                "SELECT 1 FROM agents WHERE state IN ('exited', 'failed', 'lost')"
                " AND coalesce(exited, created) < ? LIMIT 1",
                (cutoff,),
            ).fetchone()
            return bool(closed) or (
                oldest is not None and (oldest < cutoff or high - low >= MAX_EVENTS)
            )

        try:
            if self._transaction(due, write=False):
                self.gc(self.retention_seconds, max_events=MAX_EVENTS)
        except RegistryError as exc:
            logging.getLogger("agentscope").debug("registry not pruned: %s", exc)

    def _take_spool(self) -> None:
        """Record the launches ``agentscope exec`` left in the spool (see :mod:`._spool`)."""
        paths = _spool.pending(self._spool)
        # Taking an entry runs transactions, which land here again: skip then.
        if not paths or not self._spool_lock.acquire(blocking=False):
            return
        try:
            for path in paths:
                self._take_entry(path)
        finally:
            self._spool_lock.release()

    def _take_entry(self, path: str) -> None:
        # Read from one open file, whose inode says later whether the name
        # still holds this entry (see _unlink_same).
        try:
            taken = _spool.read_held(path)
        except OSError as exc:
            # Unreadable for now (out of fds, a permission): kept for next time.
            logging.getLogger("agentscope").warning("spool entry %s not read: %s", path, exc)
            return
        if taken is None:
            return  # taken in meanwhile by another process
        entry, ino = taken
        state = entry.state() if entry is not None else "bad"
        if entry is None or state == "starting":  # "starting": its exec still waits
            if entry is None:
                _unlink_same(path, ino)
            return
        launch = (entry.fleet, entry.name, entry.unit, entry.pid, entry.start_time)
        try:
            try:
                self.record_launch(*launch, entry.argv, entry.cwd, "running", created=entry.created)
            except AgentExists as exc:
                held = self.by_unit(exc.unit)
                live = os.path.isdir(os.path.join(entry.slice_dir, exc.unit))
                if held is None or not stale(held, live):
                    raise  # two agents of one name (or one being launched): keep the registry's
                # The name's row is stale (its scope is gone): close it first.
                self._close_stale(entry.fleet, entry.name, exc.unit)
                self.record_launch(*launch, entry.argv, entry.cwd, "running", created=entry.created)
        except (AgentExists, RegistryError) as exc:
            # Recorded already (a reconcile found its scope first), or the name
            # is taken: the entry has nothing more to give.
            logging.getLogger("agentscope").info("spool entry %s not recorded: %s", path, exc)
            _unlink_same(path, ino)
            return
        detail = {"unit": entry.unit, "pid": entry.pid, "pids": [entry.pid], "via": "exec"}
        self.record_event(entry.fleet, entry.name, "adopted", detail, ts=entry.created)
        if state == "lost":  # it ended before anyone looked: as for any adopted agent
            self._close_stale(entry.fleet, entry.name, entry.unit)
        _unlink_same(path, ino)

    def _close_stale(self, fleet: str, name: str, unit: str) -> None:
        # One transaction, its event only if this call closed it: several
        # processes taking the spool in at once record one "lost".
        row = self.by_unit(unit)
        pid = row.pid if row is not None else None
        self.set_state(
            unit, "lost", event="lost", detail={"unit": unit, "pid": pid}, only_on_change=True
        )

    def _row_by_unit(self, conn: sqlite3.Connection, unit: str) -> AgentRecord:
        row = conn.execute(
            f"SELECT {_AGENT_COLUMNS} FROM agents WHERE unit = ?", (unit,)
        ).fetchone()
        if row is None:
            raise UnitNotFound(self.path, unit)
        return _agent_from_row(row)

    # -- writes

    def record_launch(
        self,
        fleet: str,
        name: str,
        unit: str,
        pid: int,
        start_time: int,
        argv: Sequence[str],
        cwd: str,
        state: AgentState = "starting",
        *,
        created: float | None = None,
    ) -> AgentRecord:
        """Record a new launch and return its row.

        ``start_time`` is field 22 of ``/proc/PID/stat``; ``created`` defaults
        to now.

        Raises:
            AgentExists: an open row already has this (fleet, name).
            RegistryError: the unit is already recorded (unit names are unique).
            ValueError: ``state`` is not an open state.
        """
        if state not in OPEN_STATES:
            raise ValueError(
                f"a launch starts in an open state {sorted(OPEN_STATES)}, not {state!r}"
            )
        argv_json = json.dumps(list(argv))
        when = time.time() if created is None else created

        def body(conn: sqlite3.Connection) -> AgentRecord:
            try:
                cur = conn.execute(
                    "INSERT INTO agents (fleet, name, unit, pid, start_time, argv, cwd, created,"
                    " state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (fleet, name, unit, pid, start_time, argv_json, cwd, when, state),
                )
            except sqlite3.IntegrityError as exc:
                holder = conn.execute(
                    "SELECT unit FROM agents WHERE fleet = ? AND name = ? AND state IN"
                    " ('starting', 'running', 'frozen', 'stopping')",
                    (fleet, name),
                ).fetchone()
                if holder is not None:
                    raise AgentExists(fleet, name, holder[0]) from exc
                raise RegistryError(
                    self.path, f"unit {unit} is already recorded in {self.path}: {exc}"
                ) from exc
            row = conn.execute(
                f"SELECT {_AGENT_COLUMNS} FROM agents WHERE id = ?", (cur.lastrowid,)
            ).fetchone()
            return _agent_from_row(row)

        return self._transaction(body, write=True)

    def set_state(
        self,
        unit: str,
        state: AgentState,
        *,
        exit_status: int | None = None,
        exited: float | None = None,
        event: str | None = None,
        detail: Mapping[str, Any] | None = None,
        only_on_change: bool = False,
    ) -> AgentRecord:
        """Move the row of ``unit`` to ``state`` and return the row as stored.

        Setting the state the row already has changes nothing (the first
        close wins: its exit status and time stay). Closing (exited, failed,
        lost) stores ``exit_status`` and ``exited`` (default: now).
        ``event`` (with ``detail``) also records that event about the row's
        agent, in the same transaction: a launch or an exit is then one
        commit instead of two. With ``only_on_change`` the event is recorded
        only if this call moved the row: of several processes closing one
        row, one records it.

        Raises:
            InvalidTransition: the lifecycle forbids the move, e.g. a closed
                row asked to reopen or to close again with another state.
            UnitNotFound: no row has that unit.
            ValueError: unknown state, or exit figures given for an open state.
        """
        if state not in _STATES:
            raise ValueError(f"unknown state {state!r}; one of {sorted(_STATES)}")
        closing = state in CLOSED_STATES
        if not closing and (exit_status is not None or exited is not None):
            raise ValueError("exit_status and exited go only with a closed state")
        detail_json = json.dumps(dict(detail or {}), sort_keys=True)

        def body(conn: sqlite3.Connection) -> AgentRecord:
            rec = self._row_by_unit(conn, unit)
            changed = rec.state != state
            if changed:
                if state not in _TRANSITIONS[rec.state]:
                    raise InvalidTransition(self.path, unit, rec.state, state)
                if closing:
                    when = time.time() if exited is None else exited
                    conn.execute(
                        "UPDATE agents SET state = ?, exit_status = ?, exited = ? WHERE id = ?",
                        (state, exit_status, when, rec.id),
                    )
                else:
                    conn.execute("UPDATE agents SET state = ? WHERE id = ?", (state, rec.id))
                rec = self._row_by_unit(conn, unit)
            if event is not None and (changed or not only_on_change):
                _insert_event(conn, time.time(), rec.fleet, rec.name, event, detail_json)
            return rec

        return self._transaction(body, write=True)

    def update_memory(
        self, unit: str, memory_current: int | None, memory_peak: int | None
    ) -> AgentRecord:
        """Store the last memory figures (bytes) read for ``unit``; any state.

        ``memory_peak`` is None where the kernel has no ``memory.peak``.

        Raises:
            UnitNotFound: no row has that unit.
        """

        def body(conn: sqlite3.Connection) -> AgentRecord:
            cur = conn.execute(
                "UPDATE agents SET memory_current = ?, memory_peak = ? WHERE unit = ?",
                (memory_current, memory_peak, unit),
            )
            if cur.rowcount == 0:
                raise UnitNotFound(self.path, unit)
            return self._row_by_unit(conn, unit)

        return self._transaction(body, write=True)

    def add_oom_kills(self, unit: str, n: int) -> AgentRecord:
        """Add ``n`` OOM kills to the count of ``unit``; any state.

        Raises:
            UnitNotFound: no row has that unit.
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"OOM kills only add up; got {n}")

        def body(conn: sqlite3.Connection) -> AgentRecord:
            cur = conn.execute(
                "UPDATE agents SET oom_kills = oom_kills + ? WHERE unit = ?", (n, unit)
            )
            if cur.rowcount == 0:
                raise UnitNotFound(self.path, unit)
            return self._row_by_unit(conn, unit)

        return self._transaction(body, write=True)

    def record_event(
        self,
        fleet: str,
        agent: str | None,
        kind: str,
        detail: Mapping[str, Any],
        *,
        ts: float | None = None,
    ) -> EventRecord:
        """Record an event; ``agent`` None for one about the whole fleet.

        Raises:
            TypeError: ``detail`` does not serialise to JSON.
        """
        detail_json = json.dumps(dict(detail), sort_keys=True)
        when = time.time() if ts is None else ts

        def body(conn: sqlite3.Connection) -> EventRecord:
            event_id = _insert_event(conn, when, fleet, agent, kind, detail_json)
            return EventRecord(event_id, when, fleet, agent, kind, json.loads(detail_json))

        record = self._transaction(body, write=True)
        if time.monotonic() - self._pruned >= _PRUNE_EVERY:
            self._prune_now()
        return record

    def apply_closures(self, plan: ReconcilePlan, *, now: float | None = None) -> list[AgentRecord]:
        """Close the rows a :class:`ReconcilePlan` found dead, as ``lost``.

        One transaction. Each closure also records a ``lost`` event whose
        detail holds the reason (``scope-gone``, ``pid-reused``,
        ``process-gone``), unit, pid and start time. A row closed meanwhile
        by another writer keeps its state: it knew better (an exit status)
        than we do. Returns the rows this call closed.
        """
        when = time.time() if now is None else now

        def body(conn: sqlite3.Connection) -> list[AgentRecord]:
            done: list[AgentRecord] = []
            for rec, reason in plan.closures:
                cur = conn.execute(
                    "UPDATE agents SET state = 'lost', exited = ? WHERE id = ? AND state IN"
                    " ('starting', 'running', 'frozen', 'stopping')",
                    (when, rec.id),
                )
                if cur.rowcount == 0:
                    continue
                detail = {
                    "reason": reason,
                    "unit": rec.unit,
                    "pid": rec.pid,
                    "start_time": rec.start_time,
                }
                conn.execute(
                    "INSERT INTO events (ts, fleet, agent, kind, detail) VALUES (?, ?, ?, ?, ?)",
                    (when, rec.fleet, rec.name, "lost", json.dumps(detail, sort_keys=True)),
                )
                done.append(self._row_by_unit(conn, rec.unit))
            return done

        return self._transaction(body, write=True)

    def gc(
        self,
        retention_seconds: float = 7 * 86400,
        now: float | None = None,
        *,
        fleet: str | None = None,
        max_events: int | None = None,
    ) -> int:
        """Prune closed rows that closed more than ``retention_seconds`` ago.

        Their events go with them: an event belongs to the latest launch of
        its (fleet, agent) created at or before it, so once those rows are
        gone, the events older than the cutoff that no remaining launch
        claims are deleted (fleet-wide ones included). Open rows are never
        pruned. ``fleet`` limits all this to one fleet (None: every fleet);
        ``max_events`` also drops the oldest events past that many. Returns
        the number of agent rows deleted.
        """
        cutoff = (time.time() if now is None else now) - retention_seconds
        scope, args = ("", ()) if fleet is None else (" AND fleet = ?", (fleet,))

        def body(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM agents WHERE state IN ('exited', 'failed', 'lost')"
                f" AND coalesce(exited, created) < ?{scope}",
                (cutoff, *args),
            )
            conn.execute(
                f"DELETE FROM events WHERE ts < ?{scope} AND NOT EXISTS ("
                " SELECT 1 FROM agents a WHERE a.fleet = events.fleet"
                " AND a.name = events.agent AND a.created <= events.ts)",
                (cutoff, *args),
            )
            if max_events is not None:
                # ids only grow (AUTOINCREMENT): the span is a cheap upper
                # bound of the count, checked before any scan.
                low, high = conn.execute("SELECT min(id), max(id) FROM events").fetchone()
                if low is not None and high - low >= max_events:
                    conn.execute(
                        "DELETE FROM events WHERE id <= (SELECT id FROM events"
                        " ORDER BY id DESC LIMIT 1 OFFSET ?)",
                        (max_events,),
                    )
            return cur.rowcount

        return self._transaction(body, write=True)

    def delete(self, unit: str) -> None:
        """Delete the row of ``unit`` and its events, whatever its state.

        For undoing a launch that never started; closed rows are better left
        to :meth:`gc`.

        Raises:
            UnitNotFound: no row has that unit.
        """

        def body(conn: sqlite3.Connection) -> None:
            rec = self._row_by_unit(conn, unit)
            nxt = conn.execute(
                "SELECT min(created) FROM agents WHERE fleet = ? AND name = ? AND created > ?",
                (rec.fleet, rec.name, rec.created),
            ).fetchone()[0]
            conn.execute(
                "DELETE FROM events WHERE fleet = ? AND agent = ? AND ts >= ?"
                " AND (? IS NULL OR ts < ?)",
                (rec.fleet, rec.name, rec.created, nxt, nxt),
            )
            conn.execute("DELETE FROM agents WHERE id = ?", (rec.id,))

        self._transaction(body, write=True)

    # -- reads

    def agents(self, fleet: str | None, *, include_closed: bool = False) -> list[AgentRecord]:
        """The rows of ``fleet`` (None: every fleet), oldest first; open ones only by default."""
        sql = f"SELECT {_AGENT_COLUMNS} FROM agents WHERE 1"
        args: list[Any] = []
        if fleet is not None:
            sql += " AND fleet = ?"
            args.append(fleet)
        if not include_closed:
            sql += " AND state IN ('starting', 'running', 'frozen', 'stopping')"
        sql += " ORDER BY created, id"
        rows = self._transaction(lambda c: c.execute(sql, args).fetchall(), write=False)
        return [_agent_from_row(r) for r in rows]

    def get(self, fleet: str, name: str) -> AgentRecord | None:
        """The latest row for ``name`` in ``fleet``, open or closed; None if none."""
        row = self._transaction(
            lambda c: c.execute(
                f"SELECT {_AGENT_COLUMNS} FROM agents WHERE fleet = ? AND name = ?"
                " ORDER BY created DESC, id DESC LIMIT 1",
                (fleet, name),
            ).fetchone(),
            write=False,
        )
        return None if row is None else _agent_from_row(row)

    def by_unit(self, unit: str) -> AgentRecord | None:
        """The row of ``unit``; None if none."""
        row = self._transaction(
            lambda c: c.execute(
                f"SELECT {_AGENT_COLUMNS} FROM agents WHERE unit = ?", (unit,)
            ).fetchone(),
            write=False,
        )
        return None if row is None else _agent_from_row(row)

    def events(
        self,
        fleet: str | None = None,
        *,
        agent: str | None = None,
        since: float | None = None,
        until: float | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        last: int | None = None,
    ) -> list[EventRecord]:
        """Events in the order recorded (by id), filtered.

        ``since`` keeps events with ``ts >= since`` and ``until`` those with
        ``ts < until``; ``after_id`` those with a greater id, so ``events
        --follow`` polls with the last id it saw; ``limit`` keeps the first
        ones and ``last`` the newest ones (still oldest first). Every filter
        runs in SQL: the cost is the rows returned, not the history's size.
        """
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE 1"
        args: list[Any] = []
        for clause, value in (
            (" AND fleet = ?", fleet),
            (" AND agent = ?", agent),
            (" AND ts >= ?", since),
            (" AND ts < ?", until),
            (" AND kind = ?", kind),
            (" AND id > ?", after_id),
        ):
            if value is not None:
                sql += clause
                args.append(value)
        if last is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT ?) ORDER BY id"
            args.append(last)
        else:
            sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = self._transaction(lambda c: c.execute(sql, args).fetchall(), write=False)
        return [_event_from_row(r) for r in rows]


def _unlink_same(path: str, ino: int) -> None:
    """Remove ``path`` only if it is still the file read (inode ``ino``).

    An exec may have claimed the name meanwhile (the entry read was freed
    to its unit's name and a new one linked): that claim must stay.
    """
    try:
        if os.stat(path).st_ino != ino:
            return
    except FileNotFoundError:
        return
    _unlink(path)


def _retention_from_env(env: Mapping[str, str]) -> float:
    """``AGENTSCOPE_RETENTION_DAYS`` in seconds (0: keep everything); a bad
    value falls back to the default rather than break every command."""
    raw = env.get(_RETENTION_ENV, "").strip()
    try:
        days = float(raw) if raw else DEFAULT_RETENTION / 86400
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


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
