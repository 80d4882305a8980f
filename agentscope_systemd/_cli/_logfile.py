"""An agent's log file, as ``run`` writes it: its last lines, and following it.

``logs`` reads here for agents launched without ``--tmux``. The file is the
agent's output: any bytes, any line length. Lines are decoded leniently
(undecodable bytes become U+FFFD), and the tail reads backwards from the
end in blocks, so a log of gigabytes costs the lines asked for, not the file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["follow", "tail"]

_BLOCK = 64 * 1024
_POLL = 0.25
#: Memory bounds against an agent that writes without newlines: a tail reads
#: at most this far back, and a followed line longer than this is cut.
_TAIL_BUDGET = 16 << 20
_MAX_LINE = 1 << 20


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def tail(path: Path, lines: int) -> tuple[list[str], int]:
    """The last ``lines`` lines of ``path`` (without their newlines), and its size read.

    Raises:
        OSError: it cannot be opened (FileNotFoundError when it is not there).
    """
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        if lines == 0:
            return [], end
        pos, data = end, b""
        # One newline more than asked: the first line found may be cut.
        while pos > 0 and data.count(b"\n") <= lines and len(data) < _TAIL_BUDGET:
            step = min(_BLOCK, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
        text = data[:-1] if data.endswith(b"\n") else data
        found = text.split(b"\n") if text else []
        if pos > 0 and len(found) <= lines:
            found = found[1:]  # the budget ran out inside a line: not a whole one
        return [_decode(line) for line in found[-lines:]], end


def follow(
    path: Path,
    offset: int,
    emit: Callable[[str], None],
    *,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Emit each line added to ``path`` after ``offset``, until interrupted (like ``tail -F``).

    A file cut short (truncated) is read again from its start; one replaced
    (rotated: another inode at the path) is reopened from its start. A
    partial last line waits for its newline.
    """
    pause = sleep if sleep is not None else time.sleep
    f = path.open("rb")
    try:
        inode = os.fstat(f.fileno()).st_ino
        f.seek(offset)
        pending = b""
        while True:
            chunk = f.read(_BLOCK)
            if chunk:
                pending += chunk
                *done, pending = pending.split(b"\n")
                for line in done:
                    emit(_decode(line))
                while len(pending) >= _MAX_LINE:  # no newline in sight: cut it
                    emit(_decode(pending[:_MAX_LINE]))
                    pending = pending[_MAX_LINE:]
                continue
            pause(_POLL)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                continue  # mid-rotation: the new file comes
            if now.st_ino != inode:
                f.close()
                f = path.open("rb")
                inode, pending = os.fstat(f.fileno()).st_ino, b""
            elif now.st_size < f.tell():
                f.seek(0)
                pending = b""
    finally:
        f.close()
