"""The library's log on the CLI's stderr (shared by the app and the exec fast path)."""

from __future__ import annotations

import sys

__all__ = ["setup_logging"]


def setup_logging(debug: bool) -> None:
    """Send the library's log (stale slice limits, no OOMPolicy...) to stderr."""
    import logging

    class StderrHandler(logging.Handler):
        """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

        def emit(self, record: logging.LogRecord) -> None:
            sys.stderr.write(self.format(record) + "\n")

    logger = logging.getLogger("agentscope")
    if not any(type(h).__name__ == "StderrHandler" for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("agentscope: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
