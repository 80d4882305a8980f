"""Ask root for the few things the in-VM suite and benchmarks may do as root.

The lingering user's runs have no sudo: guest.sh runs ``roothelper.sh`` as
root for each request line written to a FIFO and leaves its output in an
answer file. Run as root, the script is called directly. Standard library
only (the benchmarks import it too).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

__all__ = ["RootHelperError", "as_root"]

_DIR = Path("/run/agentscope-test")
_SCRIPT = Path(__file__).resolve().parent / "roothelper.sh"


class RootHelperError(RuntimeError):
    """The request failed or was refused; the message holds the helper's output."""


def as_root(*args: str, timeout: float = 60.0) -> str:
    """Run one roothelper.sh request as root; return its output."""
    if any(not a or any(c.isspace() for c in a) for a in args):
        raise ValueError(f"arguments must be single words: {args!r}")
    if os.geteuid() == 0:
        done = subprocess.run(
            ["sh", str(_SCRIPT), *args], capture_output=True, text=True, timeout=timeout
        )
        out, rc = done.stdout + done.stderr, done.returncode
    else:
        out, rc = _ask(args, timeout)
    if rc != 0:
        raise RootHelperError(f"root helper {' '.join(args)}: exit {rc}: {out.strip()}")
    return out


def _ask(args: tuple[str, ...], timeout: float) -> tuple[str, int]:
    request = secrets.token_hex(8)
    answer = _DIR / f"answer-{request}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            # Non-blocking: no reader (no guest.sh, or between two of its
            # reads) is ENXIO, not a hang.
            fd = os.open(_DIR / "requests", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RootHelperError(f"no root helper at {_DIR}: {exc}") from exc
            time.sleep(0.05)
    try:
        os.write(fd, f"{request} {' '.join(args)}\n".encode())
    finally:
        os.close(fd)
    while not answer.exists():
        if time.monotonic() > deadline:
            raise RootHelperError(f"root helper {' '.join(args)}: no answer in {timeout:.0f}s")
        time.sleep(0.05)
    *lines, last = answer.read_text().rstrip("\n").split("\n")
    return "\n".join(lines), int(last.removeprefix("rc="))
