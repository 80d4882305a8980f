"""sd_notify(3) over the unix datagram socket in ``$NOTIFY_SOCKET``, no dependency.

Only what ``agentscope monitor`` needs: ``READY=1``, ``WATCHDOG=1``,
``STATUS=...`` and ``STOPPING=1``, and the watchdog interval the manager
asks for (``$WATCHDOG_USEC``). An address starting with ``@`` is in the
abstract namespace (the ``@`` stands for a leading NUL byte).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ._errors import Failed

__all__ = ["Notifier", "format_state"]


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    """``WatchdogSec=`` as the manager passed it (``$WATCHDOG_USEC``), None when off.

    Like sd_watchdog_enabled(3): ``$WATCHDOG_PID``, when set, must be this
    process, so that a child started with our environment does not ping for us.
    """
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    from agentscope_systemd import _numbers

    try:
        # sd_watchdog_enabled(3) takes a uint64; the one grammar, ASCII digits.
        usec = _numbers.whole("WATCHDOG_USEC", env.get("WATCHDOG_USEC", ""), low=0, high=2**64 - 1)
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None


def format_state(**fields: object) -> str:
    """``KEY=value`` lines, one per field; a value is kept to one line."""
    return "\n".join(f"{key}={' '.join(str(value).splitlines())}" for key, value in fields.items())


class Notifier:
    """Sends states to the service manager; does nothing when ``$NOTIFY_SOCKET`` is unset.

    Raises (from :meth:`send`):
        OSError: the socket is set but cannot be reached.
        ValueError: an address that is neither a path nor ``@abstract``.
    """

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        address = env.get("NOTIFY_SOCKET", "")
        if address and address[0] not in "/@":
            raise Failed(
                f"NOTIFY_SOCKET={address!r} is not a unix socket (vsock: is not supported); "
                "run the monitor as Type=notify over a unix socket, or unset NOTIFY_SOCKET",
                "failed",
            )
        self.address = "\0" + address[1:] if address.startswith("@") else address
        #: Seconds within which the manager wants ``WATCHDOG=1``, or None.
        self.watchdog = _watchdog_seconds(env)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, **fields: object) -> bool:
        """Send one state message; False when there is no socket to send to."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(format_state(**fields).encode())
        except OSError as exc:
            raise Failed(
                f"cannot notify the service manager at NOTIFY_SOCKET={self.address!r}: "
                f"{exc.strerror or exc}; unset NOTIFY_SOCKET when systemd did not start this",
                "failed",
            ) from exc
        return True
