"""``Fleet.call``: a harness runs a command as a tool call inside a named agent (#26).

The command is forked at the launch gate (:mod:`._spawn`) in the harness's
own cgroup, moved into a new ``call-LABEL-N`` of the agent's delegated scope
(:func:`._calls.create_call`) while it waits there, and only then execs: it
never runs, forks or allocates outside its call. The move is the kernel's
(a write to the call's ``cgroup.procs``) where the harness may make it (root,
or a harness inside the same user manager), else systemd's
``AttachProcessesToUnit`` with the call as sub-cgroup, which a delegated
unit accepts (systemd 238+; a user manager asks the system manager for a
process outside its tree). A thread ends what the command left running once
it has exited and removes the call's cgroup once it is empty, as
``agentscope call``'s remover does.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .._errors import BusError, LaunchError
from .._fleet._launchargs import check_argv
from .._fleet._spawn import spawn_gated
from . import _callevents, _calls

__all__ = ["Call", "start_call"]

Stdio = int | IO[Any] | None
Attach = Callable[[str, Sequence[int]], Awaitable[None]]


class Call:
    """A running tool call: ``pid``, its cgroup ``cgroup`` (a directory) and :meth:`wait`.

    ``popen`` is the ``subprocess.Popen`` of the command (its pipes when
    asked for ``PIPE``).
    """

    def __init__(self, agent: str, unit: str, cgroup: str, popen: subprocess.Popen[bytes]) -> None:
        self.agent = agent
        self.unit = unit
        self.cgroup = cgroup
        self.name = os.path.basename(cgroup)
        self.popen = popen
        self.pid = popen.pid

    def __repr__(self) -> str:
        return f"<Call {self.name} of {self.agent} pid={self.pid}>"

    async def wait(self) -> int:
        """The command's exit status once it has ended (``-N``: ended by signal N)."""
        return await asyncio.to_thread(self.popen.wait)


async def start_call(
    agent: str,
    unit: str,
    slice_dir: Path,
    argv: Sequence[str],
    attach: Attach,
    *,
    memory_max: int | str | None = None,
    tasks_max: int | str | None = None,
    name: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: Stdio = None,
    stdout: Stdio = None,
    stderr: Stdio = None,
    oom_score_adj: int | None = None,
    events_dir: str | None = None,
) -> Call:
    """Run ``argv`` as a call in ``unit`` (of the agents slice at ``slice_dir``).

    ``attach(sub_cgroup, pids)`` is systemd's ``AttachProcessesToUnit`` on
    ``unit``. Returns once the command has exec'd inside its call. The
    call's ``call_started`` and ``call_exited`` go to ``events_dir`` (the
    registry's :func:`._callevents.calls_dir`), written by the thread that
    removes the call once it is empty.

    Raises:
        InvalidConfig, InvalidName: a cap or name out of range (nothing made).
        LaunchError: a bad argv/cwd/env, a scope whose calls are not isolated
            (why is said), or the command could not be moved or exec'd.
    """
    limits = _calls.call_limits(memory_max=memory_max, tasks_max=tasks_max, name=name)
    where = None if cwd is None else os.fspath(cwd)
    check_argv(argv, env, where)
    scope_dir = str(slice_dir / unit)
    why = await asyncio.to_thread(_calls.delegation, scope_dir)
    if why is not None:
        raise LaunchError(f"calls are not isolated in agent {agent} ({unit}): {why}")
    try:
        await asyncio.to_thread(_calls.sweep, scope_dir)
        call_dir = await asyncio.to_thread(_calls.create_call, scope_dir, limits)
    except OSError as exc:
        raise LaunchError(
            f"cannot make a call's cgroup in {unit}: {exc.strerror or exc} ({exc.filename})"
        ) from exc
    try:
        child = await spawn_gated(
            argv,
            cwd=where,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            oom_score_adj=oom_score_adj,
        )
    except BaseException:
        await asyncio.to_thread(_calls.remove_when_empty, call_dir)
        raise
    try:
        await _move(call_dir, child.pid, attach)
    except BaseException:
        await child.abort()
        await asyncio.to_thread(_calls.remove_when_empty, call_dir)
        raise
    try:
        popen = await child.release()
    except OSError as exc:
        threading.Thread(
            target=_calls.remove_when_empty, args=(call_dir,), name="agentscope-call", daemon=True
        ).start()
        raise LaunchError(f"cannot exec {argv[0]!r} in a call of {agent}: {exc}") from exc
    watch = _callevents.CallWatch(
        events_dir,
        unit,
        os.path.basename(call_dir),
        popen.pid,
        _callevents.argv_summary(argv),
        (limits.memory_max, limits.tasks_max),
    )
    threading.Thread(
        target=_watch, args=(call_dir, popen, watch), name="agentscope-call", daemon=True
    ).start()
    return Call(agent, unit, call_dir, popen)


def _watch(call_dir: str, popen: subprocess.Popen[bytes], watch: _callevents.CallWatch) -> None:
    """The call's events around its life; once its command ended, its leftovers
    (:func:`._calls.end_leftovers`) and its cgroup's removal."""
    watch.begin()
    status = popen.wait()
    _calls.end_leftovers(call_dir)
    _calls.remove_when_empty(call_dir, on_empty=watch.measure)
    watch.end(status)


async def _move(call_dir: str, pid: int, attach: Attach) -> None:
    """``pid`` into ``call_dir``: the kernel's way where allowed, else systemd's."""
    try:
        await asyncio.to_thread(_calls.enter, call_dir, pid)
        return
    except PermissionError:
        pass  # not this harness's to move (a login session's process, a user manager's scope)
    except OSError as exc:
        raise LaunchError(f"cannot move the call into {call_dir}: {exc.strerror}") from exc
    try:
        await attach("/" + os.path.basename(call_dir), [pid])
    except BusError as exc:
        raise LaunchError(f"systemd could not move the call into {call_dir}: {exc}") from exc
