"""What the guard does to processes: lock its own memory, and kill a victim.

- :func:`prepare_process` locks the process's pages (``mlockall`` with
  ``MCL_ONFAULT``: only the pages in use, not every reserved arena) and,
  when configured, lowers its ``oom_score_adj``; what it cannot do it says
  once and goes on.
- :func:`kill_process` signals through a pidfd after re-checking the
  start time (no pid-reuse race) and, for the guard, that the victim is
  still in its scope under the agents slice; then calls
  ``process_mrelease`` so the memory comes back before the victim has
  finished exiting. A victim in a tool call (``<scope>/call-*``, #26) takes
  its whole call with it (:func:`._calls.kill_tree`): the call's other processes
  (the ``make`` above the runaway compiler), never the agent's own leaf nor
  another call.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .._calls._calls import call_in, kill_tree
from .._kernel._proc import PROC_ROOT, read_cgroup, same_process
from ._guardpolicy import GuardConfig

__all__ = ["kill_process", "prepare_process"]

log = logging.getLogger("agentscope.guard")

#: process_mrelease(2), Linux 5.15; the same number on every architecture
#: with the generic syscall table (and x86-64).
SYS_PROCESS_MRELEASE = 448
_MCL_CURRENT, _MCL_FUTURE, _MCL_ONFAULT = 1, 2, 4

_libc = ctypes.CDLL(None, use_errno=True)
_said: set[str] = set()  # the "cannot" notes already logged, once per process


def _say_once(key: str, message: str, *args: object) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)


# ---------------------------------------------------------------------------
# The process the guard runs in


def _lock_memory() -> str | None:
    """mlockall the current process; None when done, else why not."""
    flags = _MCL_CURRENT | _MCL_FUTURE | _MCL_ONFAULT
    if _libc.mlockall(flags) == 0:
        return None
    err = ctypes.get_errno()
    if err == errno.EINVAL:  # a kernel before 4.4 has no MCL_ONFAULT
        if _libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) == 0:
            return None
        err = ctypes.get_errno()
    return os.strerror(err)


def _lock_advice() -> str:
    """The memory-lock limit and how to lift it: the rest of the refusal's note."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:  # not the limit: raising it would not help
        return "RLIMIT_MEMLOCK is unlimited, so the kernel refused for another reason"
    return (
        f"RLIMIT_MEMLOCK is {soft // 1024} KiB and the process maps more; to lock it, raise"
        " the limit (ulimit -l, or LimitMEMLOCK= in the unit it runs in) or grant CAP_IPC_LOCK"
    )


def prepare_process(config: GuardConfig, proc_root: Path = PROC_ROOT) -> list[str]:
    """Lock this process's memory and set its oom_score_adj as ``config`` asks.

    mlockall(``MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT``) locks the pages in
    use and those faulted in later, so the guard's code and data are never
    swapped out or dropped under pressure. Without CAP_IPC_LOCK the kernel
    refuses when the process maps more than ``RLIMIT_MEMLOCK`` (8 MiB by
    default): the reason is logged once and the guard runs unlocked.
    Returns the notes of what could not be done (empty: all done).
    """
    notes: list[str] = []
    if config.lock_memory:
        reason = _lock_memory()
        if reason is not None:
            note = (
                f"cannot lock the guard's memory (mlockall: {reason}); running unlocked: "
                + _lock_advice()
            )
            _say_once("mlock", "%s", note)
            notes.append(note)
    if config.oom_score_adj is not None:
        try:
            with open(proc_root / "self" / "oom_score_adj", "w") as f:
                f.write(f"{config.oom_score_adj}\n")
        except OSError as exc:
            note = f"cannot set the guard's oom_score_adj to {config.oom_score_adj}: {exc}"
            _say_once("oom_score_adj", "%s", note)
            notes.append(note)
    return notes


# ---------------------------------------------------------------------------
# The kill


@dataclass(frozen=True, slots=True)
class _Killed:
    pidfd: int
    released: bool
    signalled_at: float  # time.monotonic()
    call: str | None = None  # the tool call killed with it, whole
    processes: int = 1  # how many processes the kill signalled


def _mrelease(pidfd: int) -> bool:
    """process_mrelease(pidfd): reap a killed process's memory now; False when refused."""
    if _libc.syscall(SYS_PROCESS_MRELEASE, pidfd, 0) == 0:
        return True
    err = ctypes.get_errno()
    # ENOSYS: before 5.15; EINVAL: not dying yet, or its memory already
    # released; ESRCH: exited already. The memory then returns as it exits.
    key = f"mrelease:{err}"
    if key not in _said:
        _said.add(key)
        log.info(
            "process_mrelease refused (%s): memory returns as the victim exits", os.strerror(err)
        )
    return False


def kill_process(pid: int, start_time: int, proc_root: Path = PROC_ROOT) -> bool | None:
    """SIGKILL ``pid`` if it is still the process that started at ``start_time``.

    Opens a pidfd first, then re-reads the start time, so the signal goes
    to that process and never to another that took its pid. Returns None
    when it was not signalled (gone, or its pid reused), else whether
    ``process_mrelease`` gave its memory back at once.

    Raises:
        OSError: other than the process being gone (EPERM: another user's).
    """
    killed = _kill(pid, start_time, proc_root)
    if killed is None:
        return None
    os.close(killed.pidfd)
    return killed.released


def _kill(
    pid: int,
    start_time: int,
    proc_root: Path,
    in_scope: tuple[str, str] | None = None,
    slice_dir: Path | None = None,
) -> _Killed | None:
    """pidfd, the re-checks (start time; ``in_scope``: (slice name, unit) still), SIGKILL.

    With ``slice_dir`` (the agents slice's cgroup directory) and
    ``in_scope``, a victim in a call of its scope takes the whole call.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    call = None
    try:
        if same_process(pid, start_time, proc_root, zombie=True) is None:
            os.close(pidfd)
            return None
        # Chosen up to a second ago: a process that left the slice since
        # (moved by its owner, or by systemd) is no longer the guard's.
        if in_scope is not None:
            path = read_cgroup(pid, proc_root)
            marker = f"/{in_scope[0]}/{in_scope[1]}/"
            if path is None or marker not in path + "/":
                os.close(pidfd)
                return None
            call = call_in(path, in_scope[1])
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        os.close(pidfd)
        return None
    except BaseException:
        os.close(pidfd)
        raise
    at = time.monotonic()
    released = _mrelease(pidfd)
    if call is None or slice_dir is None or in_scope is None:
        return _Killed(pidfd, released, at)
    # The victim may have left the call's cgroup.procs already (reaped by mrelease).
    others = set(kill_tree(str(slice_dir / in_scope[1] / call), os.fspath(proc_root))) - {pid}
    return _Killed(pidfd, released, at, call, 1 + len(others))
