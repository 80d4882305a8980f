"""Start a child that waits at a gate until its scope exists, then execs.

A child is born into its parent's cgroup, and moving a PID moves only that
process: an agent that forks or allocates before its scope exists leaves
work (and memory charges, which cgroup v2 never migrates) in the manager's
cgroup. So the child stops in ``preexec_fn`` before exec: it reports its
PID, blocks until the parent says go (the scope's start job is done) or
abort, sets its ``oom_score_adj`` and only then execs. ``subprocess.Popen``
keeps its close-on-exec status pipe, so the launch returns only once the
exec happened, or raises the exec's error.

Popen blocks its thread until the exec, so it runs in a thread of its own
while the event loop talks to systemd.

Why the gate is Python in ``preexec_fn`` and not a trampoline (issue #31,
tried 2026-12-03): the gate makes raw ``os`` calls only and takes no
Python-level lock, which is what a forked copy of a threaded process can
safely do. An exec of ``/bin/sh`` as the gate would lose what the launch
promises: dash reaches no inherited descriptor above 9 (``pass_fds`` keeps
the launcher's numbers), drops environment entries whose names are not
shell identifiers and exports ``PWD``; bash, Fedora's ``/bin/sh``, exports
``SHLVL``; ``env -i NAME=VALUE ...`` would put the agent's environment in a
command line every user can read; and sh runs a file with no ``#!`` line
as a script where ``execve`` refuses it. A gate that keeps every
behaviour needs a compiled helper.
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
from typing import IO, Any

from .._calls import _calls
from .._kernel._fdlimit import child_limit
from .._kernel._proc import exec_comm

__all__ = ["GatedChild", "spawn_gated"]

_GO = b"g"
_ABORT = b"a"
Stdio = int | IO[Any] | None


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


class GatedChild:
    """A forked child waiting at the gate; ``pid`` is known, nothing has run yet."""

    def __init__(self, pid: int, go_w: int, popen: asyncio.Future[subprocess.Popen[bytes]]):
        self.pid = pid
        self.into_leaf = False
        self._go_w = go_w
        self._popen = popen

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
        return await self._popen

    async def abort(self) -> None:
        """Make the child exit before it execs, and reap it."""
        self._send(_ABORT)
        try:
            popen = await self._popen
        except (subprocess.SubprocessError, OSError):
            return  # the child exited in the gate, and Popen reaped it
        # Not expected: the exec happened after all. Kill it and reap it.
        popen.kill()
        await asyncio.to_thread(popen.wait)


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
    """Fork a child that waits at the gate; return once its PID is known.

    ``into_leaf``: its scope is delegated, and :meth:`GatedChild.release` moves
    it into the scope's agent leaf before it execs (:mod:`._calls`).
    """
    loop = asyncio.get_running_loop()
    opened: list[int] = []
    try:  # one may fail with EMFILE: the others are closed, not leaked
        pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
        opened += (pid_r, pid_w)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        opened += (go_r, go_w)
        parent_fd = os.pidfd_open(os.getpid())
    except OSError:
        for fd in opened:
            os.close(fd)
        raise
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
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                close_fds=True,
                preexec_fn=lambda: _gate(pid_w, go_r, go_w, parent_fd, oom_score_adj, comm, nofile),
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
            child = GatedChild(int(pid_fut.result()), go_w, popen_fut)
            child.into_leaf = into_leaf
            return child
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
            await asyncio.gather(popen_fut, return_exceptions=True)
