"""``agentscope top``: a live view refreshed every second; ``q`` quits."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live

from ._render import top_view

if TYPE_CHECKING:
    from agentscope_systemd import Fleet

__all__ = ["run_top", "snapshot"]

_RECENT_EVENTS = 8
_EVENT_WINDOW = 3600.0


def snapshot(fleet: Fleet, now: float) -> dict[str, Any]:
    """What one screen shows: agents, host pressure and recent events, as plain data."""
    agents = [a.to_dict() for a in fleet.agents()]
    pressure = fleet.report(top=0).to_dict().get("pressure")
    # The newest few, by id: a refresh costs those rows, not the last hour's.
    recent = fleet.events(last=_RECENT_EVENTS)
    events = [e for e in (r.to_dict() for r in recent) if e["ts"] >= now - _EVENT_WINDOW]
    return {"agents": agents, "pressure": pressure, "events": events}


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """stdin in cbreak mode (its fd), or None when stdin is not a terminal."""
    if not sys.stdin.isatty():
        yield None
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_key(fd: int | None, timeout: float) -> str | None:
    if fd is None:
        time.sleep(timeout)
        return None
    ready, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 1).decode(errors="replace") if ready else None


def run_top(fleet: Fleet, interval: float = 1.0) -> None:
    """Refresh the view every ``interval`` seconds until ``q`` (or Ctrl-C: exit 130)."""
    console = Console()
    with _keys() as fd, Live(console=console, auto_refresh=False, screen=True) as live:
        while True:
            now = time.time()
            data = snapshot(fleet, now)
            live.update(top_view(data["agents"], data["pressure"], data["events"], now))
            live.refresh()
            if (_wait_key(fd, interval) or "").lower() == "q":
                return
