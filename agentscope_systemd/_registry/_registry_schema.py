"""The registry's schema and its migrations: the one place the tables are defined.

``_MIGRATIONS`` holds every step from the empty file to :data:`SCHEMA_VERSION`;
:func:`setup` puts a connection in WAL mode, checks the file and runs the
steps it lacks, once, under the write lock. A new column or table is a new
step appended here.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Final

from .._errors import RegistryCorrupt, RegistryError
from ._registry_file import _retry_busy

__all__ = ["SCHEMA_VERSION", "setup"]

_APPLICATION_ID: Final = 0x41675363  # "AgSc", PRAGMA application_id (sqlite.org/fileformat.html)

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
    # OOM kills recovered after no monitor ran (_recovery.py): each row's
    # last accounted memory.events oom_kill (the kills recorded so far), and
    # one watermark per fleet (the slice's counter, the kernel log position).
    (
        "ALTER TABLE agents ADD COLUMN oom_kill_seen INTEGER NOT NULL DEFAULT 0",
        "UPDATE agents SET oom_kill_seen = oom_kills",
        "CREATE TABLE oom_marks (fleet TEXT PRIMARY KEY, mark TEXT NOT NULL)",
    ),
    # Leftovers (_reaper.py): each launch's grace before its leftovers are
    # stopped (NULL: the default; negative: kept), and when its main process
    # was seen gone while its scope still held processes.
    (
        "ALTER TABLE agents ADD COLUMN reap_after REAL",
        "ALTER TABLE agents ADD COLUMN lingering REAL",
    ),
]
SCHEMA_VERSION: Final = len(_MIGRATIONS)
"""The schema version (``PRAGMA user_version``) this code writes."""


def setup(conn: sqlite3.Connection, path: Path, timeout: float) -> None:
    """Put a new connection in WAL mode, check the file, and migrate it to this schema.

    Raises:
        RegistryCorrupt: ``quick_check`` found damage.
        RegistryError: WAL mode refused, a newer schema, or not a registry.
        sqlite3.Error: anything else; the caller maps it.
    """
    deadline = time.monotonic() + timeout

    def wal() -> None:
        # Persistent in the file; switching needs an exclusive lock, so
        # only ask when it is not WAL yet.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise RegistryError(path, f"cannot put {path} in WAL mode ({mode})")

    _retry_busy(wal, deadline)
    # NORMAL is durable across process crashes in WAL mode and loses at
    # most the last commits on power loss (sqlite.org/pragma.html#pragma_synchronous).
    conn.execute("PRAGMA synchronous=NORMAL")
    check = _retry_busy(lambda: conn.execute("PRAGMA quick_check(1)").fetchone(), deadline)
    if check is None or check[0] != "ok":
        found = " ".join(str(check[0]).split()) if check else "no answer"
        raise RegistryCorrupt(path, f"quick_check: {found}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != len(_MIGRATIONS):
        _retry_busy(lambda: _migrate(conn, path), deadline)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Read again under the write lock: a concurrent opener may have
        # migrated meanwhile.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if version > len(_MIGRATIONS):
            raise RegistryError(
                path,
                f"the agentscope registry {path} has schema version {version}, "
                f"newer than this agentscope knows ({len(_MIGRATIONS)}); upgrade agentscope",
            )
        has_tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0] > 0
        if app_id != _APPLICATION_ID and (version > 0 or has_tables):
            raise RegistryError(
                path,
                f"{path} is an SQLite database but not an agentscope registry; "
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
