"""Start a child that waits at a gate until its scope exists, then execs.

A child is born into its parent's cgroup, and moving a PID moves only that
process: an agent that forks or allocates before its scope exists leaves
work (and memory charges, which cgroup v2 never migrates) in the manager's
cgroup. So the child stops at a gate before it execs the agent: it takes
the agent's name, reports that it is ready, blocks until the parent says go
(the scope's start job is done) or abort, sets its ``oom_score_adj`` and
only then execs. The launch returns only once the exec happened, or raises
the exec's error.

The gate is a compiled program, ``agentscope-gate`` (``native/gate.c``,
built into the wheel): ``subprocess.Popen`` execs it with no
``preexec_fn``, so the fork of the threaded manager runs no Python code
(issue #31) and Popen may use vfork. It tries the same paths, in the same
order, as Popen would have, and execs with the argv, environment and
descriptors it was given: an exec of ``/bin/sh`` as the gate would lose
them (dash reaches no descriptor above 9 and drops environment entries
whose names are not shell identifiers; sh exports ``PWD`` and ``SHLVL`` and
runs a file with no ``#!`` line as a script where ``execve`` refuses it).

An install built where no C compiler was (``AGENTSCOPE_BUILD_GATE``,
docs/install.md) has no program: the gate then runs in ``preexec_fn``,
where it makes raw ``os`` calls only and takes no Python-level lock, which
is what a forked copy of a threaded process can safely do. ``agentscope
doctor`` says which gate an install has.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import select
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._calls import _calls
from .._kernel._fdlimit import child_limit
from .._kernel._proc import exec_comm

__all__ = ["GatedChild", "gate_program", "spawn_gated"]

_GO = b"g"
_ABORT = b"a"
_READY = b"r"
Stdio = int | IO[Any] | None

# Where the wheel's build hook (hatch_build.py) puts the compiled gate.
_PROGRAM = Path(__file__).with_name("agentscope-gate")


def gate_program() -> str | None:
    """The compiled gate's path, or None when this install has none (the gate runs in Python)."""
    path = os.fspath(_PROGRAM)
    return path if os.access(path, os.X_OK) else None


def _exec_paths(argv0: str, env: Mapping[str, str] | None) -> list[str]:
    """The files an exec of ``argv0`` tries, in order: ``subprocess.Popen``'s own search.

    Popen searches the ``PATH`` of the environment the child gets (the
    parent's when ``env`` is None), and only for a name without a slash.
    """
    if os.path.dirname(argv0):
        return [argv0]
    return [os.path.join(d, argv0) for d in os.get_exec_path(env)]


@dataclass(frozen=True)
class _Request:
    """What a launch asked for: the agent's argv, where, with what, at what score."""

    argv: Sequence[str]
    cwd: str | None
    env: Mapping[str, str] | None
    stdio: tuple[Stdio, Stdio, Stdio]
    oom_score_adj: int | None

    def popen(self, argv: Sequence[str], **gate: Any) -> subprocess.Popen[bytes]:
        """Popen ``argv`` (the agent's, or the gate program's) as the launch asked."""
        stdin, stdout, stderr = self.stdio
        return subprocess.Popen(
            list(argv),
            cwd=self.cwd,
            env=self.env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            close_fds=True,
            **gate,
        )


def _gate_fds() -> tuple[int, int, int, int, int]:
    """Two close-on-exec pipes (read, write, read, write) and a pidfd of this process.

    One may fail with EMFILE: the others are closed, not leaked.
    """
    opened: list[int] = []
    try:
        opened += os.pipe2(os.O_CLOEXEC)
        opened += os.pipe2(os.O_CLOEXEC)
        opened.append(os.pidfd_open(os.getpid()))
    except OSError:
        for fd in opened:
            os.close(fd)
        raise
    a_r, a_w, b_r, b_w, parent_fd = opened
    return a_r, a_w, b_r, b_w, parent_fd


class GatedChild:
    """A child waiting at the gate; ``pid`` is known, nothing of the agent has run yet."""

    def __init__(self, pid: int, go_w: int):
        self.pid = pid
        self.into_leaf = False
        self._go_w = go_w

    def _send(self, what: bytes) -> None:
        if self._go_w >= 0:
            try:
                os.write(self._go_w, what)
            finally:
                os.close(self._go_w)
                self._go_w = -1

    async def release(self) -> subprocess.Popen[bytes]:
        """Let the child exec; return its Popen once the exec happened.

        When spawned with ``into_leaf``, the child, still the only process of its delegated
        scope, first moves into the scope's agent leaf (:func:`._calls.settle`),
        so that its tool calls can have cgroups of their own; where that
        cannot be, the agent runs as in an undelegated scope, and why is
        logged once.

        Raises the exec's error (FileNotFoundError, PermissionError, ...).
        """
        if self.into_leaf and self._go_w >= 0:
            why = await asyncio.to_thread(_calls.settle_process, self.pid)
            if why is not None:
                _calls.say_not_isolated(why)
        self._send(_GO)
        return await self._exec_outcome()

    async def abort(self) -> None:
        """Make the child exit before it execs, and reap it."""
        self._send(_ABORT)
        await self._reap()

    async def _exec_outcome(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    async def _reap(self) -> None:
        raise NotImplementedError


async def spawn_gated(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    oom_score_adj: int | None,
    into_leaf: bool = False,
) -> GatedChild:
    """Start a child that waits at the gate; return once its PID is known.

    ``into_leaf``: its scope is delegated, and :meth:`GatedChild.release` moves
    it into the scope's agent leaf before it execs (:mod:`._calls`).
    """
    program = gate_program()
    request = _Request(argv, cwd, env, (stdin, stdout, stderr), oom_score_adj)
    child: GatedChild
    if program is not None:
        child = await _ProgramChild.start(program, request)
    else:
        child = await _PreexecChild.start(request)
    child.into_leaf = into_leaf
    return child


async def _read(fd: int, *, upto: int | None = None) -> bytes:
    """Read ``fd`` (non-blocking) from the event loop: ``upto`` bytes, or to EOF."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    got = bytearray()

    def on_readable() -> None:
        try:
            chunk = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError as exc:
            if not done.done():
                done.set_exception(exc)
            return
        got.extend(chunk)
        finished = not chunk or (upto is not None and len(got) >= upto)
        if finished and not done.done():
            done.set_result(bytes(got))

    os.set_blocking(fd, False)
    loop.add_reader(fd, on_readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


class _ProgramChild(GatedChild):
    """The gate as the compiled program: Popen execs it; it execs the agent after go."""

    def __init__(self, popen: subprocess.Popen[bytes], go_w: int, status_r: int, argv0: str):
        super().__init__(popen.pid, go_w)
        self._popen = popen
        self._status_r = status_r
        self._argv0 = argv0

    @classmethod
    async def start(cls, program: str, request: _Request) -> _ProgramChild:
        go_r, go_w, status_r, status_w, parent_fd = _gate_fds()
        argv, oom_score_adj = request.argv, request.oom_score_adj
        nofile = child_limit()
        paths = _exec_paths(argv[0], request.env)
        gate_argv = [
            program,
            str(go_r),
            str(status_w),
            str(parent_fd),
            "-" if oom_score_adj is None else str(oom_score_adj),
            *(("-", "-") if nofile is None else (str(nofile[0]), str(nofile[1]))),
            exec_comm(argv[0]),
            str(len(paths)),
            *paths,
            "--",
            *argv,
        ]

        # Popen returns once the gate is exec'd (a millisecond or so): in a
        # thread, since nothing blocks the loop, and shielded, so that a
        # cancelled launch still gets the Popen to reap.
        pass_fds = (go_r, status_w, parent_fd)
        started = asyncio.ensure_future(
            asyncio.to_thread(request.popen, gate_argv, pass_fds=pass_fds)
        )
        try:
            proc = await asyncio.shield(started)
        except BaseException:
            for fd in (go_w, status_r):
                os.close(fd)  # the gate, if it started, sees EOF and exits
            with contextlib.suppress(BaseException):
                await asyncio.to_thread((await started).wait)
            raise
        finally:
            for fd in (go_r, status_w, parent_fd):
                os.close(fd)
        child = cls(proc, go_w, status_r, argv[0])
        try:
            ready = await _read(status_r, upto=len(_READY))
            if ready != _READY:
                raise RuntimeError(
                    f"the launch gate exited before it was ready ({ready!r}); "
                    "this is a bug in agentscope"
                )
        except BaseException:
            await child.abort()
            raise
        return child

    async def _exec_outcome(self) -> subprocess.Popen[bytes]:
        # The status pipe is close-on-exec in the gate: EOF is a done exec;
        # "e<errno>" is an exec (or a step before it) that failed.
        try:
            status = await _read(self._status_r)
        finally:
            self._close_status()
        if not status:
            return self._popen
        await asyncio.to_thread(self._popen.wait)
        if status.startswith(b"e") and status[1:].isascii() and status[1:].isdigit():
            err = int(status[1:])
            raise OSError(err, os.strerror(err), self._argv0)
        raise RuntimeError(f"the launch gate said {status!r}; this is a bug in agentscope")

    async def _reap(self) -> None:
        self._close_status()
        await asyncio.to_thread(self._popen.wait)

    def _close_status(self) -> None:
        if self._status_r >= 0:
            os.close(self._status_r)
            self._status_r = -1


def _gate(
    pid_w: int,
    go_r: int,
    go_w: int,
    parent_fd: int,
    oom_score_adj: int | None,
    comm: bytes,
    nofile: tuple[int, int] | None,
) -> None:  # pragma: no cover - runs in the forked child
    # Only os calls here: this runs after fork() in a copy of a possibly
    # multi-threaded process, where taking any Python-level lock can hang.
    os.close(go_w)
    # Named as the agent it will become before anyone can see it: a monitor
    # sampling the scope while the child waits here must not record the
    # manager's name for it.
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY)
        try:
            os.write(fd, comm)
        finally:
            os.close(fd)
    except OSError:
        pass
    os.write(pid_w, str(os.getpid()).encode())
    os.close(pid_w)
    poller = select.poll()
    poller.register(go_r, select.POLLIN)
    poller.register(parent_fd, select.POLLIN)  # a pidfd turns readable when the parent dies
    while True:
        ready = dict(poller.poll())
        if go_r in ready:
            if os.read(go_r, 1) == _GO:
                break
            raise RuntimeError("launch aborted")
        if parent_fd in ready:
            raise RuntimeError("the launching process died")
    os.close(go_r)
    os.close(parent_fd)
    if oom_score_adj is not None:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(oom_score_adj).encode())
        finally:
            os.close(fd)
    if nofile is not None:
        # The launcher raised its own soft limit for its pidfds (_fdlimit): the
        # agent gets the one it would have had, as programs built on select()
        # expect. setrlimit(2) is a plain C call: no Python lock.
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)


class _PreexecChild(GatedChild):
    """The gate in ``preexec_fn``, for an install without the compiled program."""

    def __init__(self, pid: int, go_w: int, popen: asyncio.Future[subprocess.Popen[bytes]]):
        super().__init__(pid, go_w)
        self._popen = popen

    async def _exec_outcome(self) -> subprocess.Popen[bytes]:
        return await self._popen

    async def _reap(self) -> None:
        await _reap_popen(self._popen)

    @classmethod
    async def start(cls, request: _Request) -> _PreexecChild:
        loop = asyncio.get_running_loop()
        pid_r, pid_w, go_r, go_w, parent_fd = _gate_fds()
        argv, oom_score_adj = request.argv, request.oom_score_adj
        nofile = child_limit()
        comm = exec_comm(argv[0]).encode()
        popen_fut: asyncio.Future[subprocess.Popen[bytes]] = loop.create_future()

        def settle(result: subprocess.Popen[bytes] | None, exc: BaseException | None) -> None:
            if popen_fut.done():
                return
            if exc is not None:
                popen_fut.set_exception(exc)
            else:
                popen_fut.set_result(result)  # type: ignore[arg-type]

        def run() -> None:
            try:
                popen = request.popen(
                    argv,
                    preexec_fn=lambda: _gate(
                        pid_w, go_r, go_w, parent_fd, oom_score_adj, comm, nofile
                    ),
                )
            except BaseException as exc:
                loop.call_soon_threadsafe(settle, None, exc)
            else:
                loop.call_soon_threadsafe(settle, popen, None)
            finally:
                os.close(pid_w)
                os.close(go_r)
                os.close(parent_fd)

        pid_fut: asyncio.Future[bytes] = loop.create_future()

        def on_pid() -> None:
            data = os.read(pid_r, 32)
            loop.remove_reader(pid_r)
            if not pid_fut.done():
                pid_fut.set_result(data)

        loop.add_reader(pid_r, on_pid)
        # One thread per launch: Popen holds it until the exec, and a pool of a
        # few workers would serialize concurrent launches behind each other.
        threading.Thread(target=run, name="agentscope-spawn", daemon=True).start()
        ok = False
        try:
            waiting: list[asyncio.Future[Any]] = [pid_fut, popen_fut]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if pid_fut.done() and pid_fut.result():
                ok = True
                return cls(int(pid_fut.result()), go_w, popen_fut)
            await popen_fut  # the child failed before the gate (a bad cwd, say): Popen raises it
            raise RuntimeError("the child exited before reporting its pid")
        finally:
            loop.remove_reader(pid_r)
            os.close(pid_r)
            if not ok:
                # Cancelled or failed: the child must not pass the gate.
                with contextlib.suppress(OSError):  # the child is gone already
                    os.write(go_w, _ABORT)
                os.close(go_w)
                # Popen may return here: a cancel closed pid_r under the
                # child's write, SIGPIPE (restored for the child) took it before
                # the gate, and Popen read its end as an exec. Any other
                # failure of Popen is the one raised above, not a second one.
                with contextlib.suppress(Exception):
                    await _reap_popen(popen_fut)


async def _reap_popen(popen: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    """Reap the Python gate's child that will not be released.

    Popen raised: the child exited in the gate, and Popen reaped it. Popen
    returned: it took the child's end for an exec (an exec after all, or a
    death before the gate); kill the child and reap it.
    """
    try:
        child = await popen
    except (subprocess.SubprocessError, OSError):
        return
    child.kill()
    await asyncio.to_thread(child.wait)
