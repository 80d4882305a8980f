"""The launcher's descriptor budget: room under ``RLIMIT_NOFILE`` for its agents.

Each agent a process launched holds one pidfd there for as long as the
fleet watches its exit, so a launcher of 2,000 agents needs some 2,000
descriptors, and systemd gives every service and session a soft limit of
1024 (hard 524288, systemd.exec(5) ``LimitNOFILE=``). Past it, a launch
fails with ``EMFILE`` in the middle of its fork. systemd's advice for a
program that needs more (and Go's runtime since 1.19) is what is done here:
raise the soft limit to the hard one, once, when the agents held come near
it, and give every agent (and the fleet's tmux server: both start through
the gate, ``_spawn``) the soft limit the process started with, since
programs written for ``select()`` break on descriptors numbered 1024 and up.
(The short-lived ``tmux`` commands a fleet runs keep the raised one.)
Nothing in agentscope uses ``select()`` on a descriptor it opened (asyncio's
loop is epoll; the gate and the guard poll; ``agentscope top`` selects on
its stdin only). The limit is never lowered.

When even the hard limit leaves no room, the launch that finds no
descriptor fails with what to do (:func:`no_room`), and leaves nothing
started: no scope, no registry row.
"""

from __future__ import annotations

import errno
import logging
import resource
import threading
from typing import TypeGuard

from .._errors import LaunchError

__all__ = [
    "LAUNCH_FDS",
    "RESERVE",
    "child_limit",
    "hold",
    "make_room",
    "no_room",
    "out_of_descriptors",
    "release",
]

log = logging.getLogger("agentscope")

#: Descriptors kept free for everything else of the process: the bus, the
#: registry's SQLite files, the event loop, a monitor, the launches in
#: flight, the caller's own files.
RESERVE = 256
#: What one launch opens at most while it runs: the gate's two pipes and
#: the parent's pidfd, Popen's status pipe and its stdio pipes, the pidfd
#: systemd gets, and the agent's own pidfd.
LAUNCH_FDS = 16

_lock = threading.Lock()
_held = 0
# The soft limit before this process raised it: what its children get back.
_inherited: int | None = None


def hold(n: int = 1) -> None:
    """Count ``n`` descriptors held for an agent (its pidfd) until :func:`release`."""
    global _held
    with _lock:
        _held += n


def release(n: int = 1) -> None:
    """The agent's descriptors were closed."""
    global _held
    with _lock:
        _held = max(0, _held - n)


def _unlimited(value: int) -> bool:
    return value == resource.RLIM_INFINITY


def make_room(extra: int = LAUNCH_FDS, *, force: bool = False) -> bool:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one if the agents held, ``extra`` and the
    reserve come near it; whether it was raised now.

    Once raised, the two are equal and nothing more can be done here; a
    launch that still finds no descriptor says so (:func:`no_room`).
    ``force`` raises it whatever the count says (an ``EMFILE`` was seen:
    descriptors nobody counted fill the table).
    """
    global _inherited
    with _lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == hard or _unlimited(soft):
            return False
        if _held + extra + RESERVE <= soft and not force:
            return False
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if _inherited is None:
            _inherited = soft
        log.info(
            "raised this process's soft RLIMIT_NOFILE from %d to its hard limit %s: it holds "
            "a pidfd per agent (%d now); its agents still start with %d",
            soft,
            "infinity" if _unlimited(hard) else hard,
            _held,
            _inherited,
        )
        return True


def child_limit() -> tuple[int, int] | None:
    """The ``RLIMIT_NOFILE`` a child must get back, None when this process never raised it."""
    if _inherited is None:
        return None
    return _inherited, resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def out_of_descriptors(exc: BaseException) -> TypeGuard[OSError]:
    """Whether ``exc`` says this process (EMFILE) or the host (ENFILE) ran out of descriptors."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def no_room(what: str, exc: OSError) -> LaunchError:
    """The error of a launch that found no free descriptor: what happened, what to do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if exc.errno == errno.ENFILE:
        return LaunchError(
            f"cannot start {what!r}: the host is out of file descriptors ({exc.strerror}); "
            "raise fs.file-max (sysctl) or stop what holds them"
        )
    return LaunchError(
        f"cannot start {what!r}: this process is out of file descriptors ({exc.strerror}): it "
        f"holds one for each of its {_held} agents and its RLIMIT_NOFILE is {soft} soft, "
        f"{hard} hard. Raise the hard limit (LimitNOFILE= in its unit, 'ulimit -Hn' before it "
        "starts, /etc/security/limits.conf), close descriptors it does not need, or launch "
        "agents from more than one process; nothing was started"
    )
