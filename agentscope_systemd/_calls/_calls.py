"""Tool calls as cgroups of their own inside an agent's scope (#26): the cgroup tree.

An agent's scope is started with ``Delegate=yes`` (:func:`._scope.scope_properties`).
cgroup v2 lets a cgroup enable controllers for its children only while it
holds no process itself (the "no internal processes" rule,
Documentation/admin-guide/cgroup-v2.rst), so a delegated scope takes this
shape before its agent execs (:func:`settle`)::

    agentscope-FLEET-NAME-abc123.scope/   subtree_control: +memory +pids
        agent/                            the agent's main process and its children
        claude-code-bash/                 ready for Claude Code's CLAUDE_CODE_TOOL_MEMORY_LIMIT
        call-LABEL-N/                     one per call: memory.max, pids.max, oom.group 1

A call (:func:`create_call`) is a sibling of ``agent``: a call that outgrows
its cap is killed as a whole tree (``memory.oom.group``) and the agent
lives. Who removes a call's cgroup: a small remover process forked by the
caller before it moves into the call (:func:`fork_remover`). It stays in
the caller's cgroup, waits until the caller has exec'd (its pipe closes on
exec), then until the call cgroup is empty (``cgroup.events``
``populated 0``, pollable), and removes it; once the caller (by then the
command) has exited, it ends what the call left running
(:func:`end_leftovers`). The call's command thereby keeps the caller's PID,
signals and exit status, as with ``exec``.

Plain functions over a cgroup root (tests point them at a fake tree), with
only :mod:`os`-level imports: ``agentscope call`` imports this module before
it execs, and must start as fast as ``agentscope exec``.
"""

from __future__ import annotations

import os

from .. import _names, _numbers
from .._errors import AgentscopeError
from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from ._callevents import CallWatch

__all__ = [
    "AGENT_LEAF",
    "CALL_PREFIX",
    "CLAUDE_CODE_BASH",
    "CONTROLLERS",
    "DEFAULTS_ENV",
    "CallLimits",
    "NotInAgent",
    "call_env",
    "call_in",
    "call_limits",
    "create_call",
    "delegation",
    "end_leftovers",
    "enter",
    "find_scope",
    "fork_remover",
    "kill_tree",
    "own_cgroup",
    "remove_when_empty",
    "say_not_isolated",
    "settle",
    "settle_process",
    "signal_tree",
    "sweep",
    "wait_empty",
    "warn_or_log",
]

CGROUP_ROOT = "/sys/fs/cgroup"
AGENT_LEAF = "agent"
"""The leaf of a delegated scope that holds the agent's own processes."""
CLAUDE_CODE_BASH = "claude-code-bash"
"""The cgroup Claude Code puts its Bash tool in, beside its own (CLAUDE_CODE_TOOL_MEMORY_LIMIT)."""
CALL_PREFIX = "call-"
CONTROLLERS = ("memory", "pids")
"""The controllers a delegated scope enables for its calls."""
DEFAULT_LABEL = "cmd"
DEFAULTS_ENV = {
    "memory_max": "AGENTSCOPE_CALL_MEMORY_MAX",
    "tasks_max": "AGENTSCOPE_CALL_TASKS_MAX",
}
"""The environment variables that give an agent's calls their caps when a call names none."""
_MAX_TASKS = 2**22  # the kernel's PID_MAX_LIMIT: more tasks cannot exist
_SCOPE_PREFIX = "agentscope-"
_KEEP: list[int] = []  # the remover's pipe, held until the exec


class NotInAgent(AgentscopeError):
    """A call was asked for outside any agentscope agent's scope; ``cgroup`` is where."""

    def __init__(self, cgroup: str | None, reason: str) -> None:
        self.cgroup = cgroup
        self.reason = reason
        where = f" (this process is in cgroup {cgroup})" if cgroup else ""
        super().__init__(
            f"{reason}{where}: a call runs only inside an agent's process tree; "
            "start the agent with agentscope run/exec or Fleet.launch, or use Fleet.call"
        )


class CallLimits:
    """A call's caps, checked: bytes (None: no cap), swap bytes, tasks (None: no cap)."""

    __slots__ = ("label", "memory_max", "swap_max", "tasks_max")

    def __init__(
        self, label: str, memory_max: int | None, swap_max: int | None, tasks_max: int | None
    ) -> None:
        self.label = label
        self.memory_max = memory_max
        self.swap_max = swap_max
        self.tasks_max = tasks_max


def call_limits(
    *,
    memory_max: object = None,
    memory_swap_max: object = 0,
    tasks_max: object = None,
    name: object = None,
) -> CallLimits:
    """A call's caps and label from what a user wrote (``4G``, ``50%``, ``512``, ``make``).

    Sizes take the one size grammar (:func:`._numbers.size`, ``infinity``
    for no cap), the swap 0 unless asked, tasks a whole number from 1, the
    name an agent name's rules (:func:`._names.validate_name`).

    Raises:
        InvalidConfig, InvalidName: before anything is created.
    """
    label = DEFAULT_LABEL if name is None else _names.validate_name("call", name)
    memory = None if memory_max is None else _numbers.size("memory_max", memory_max, low=1)
    swap = (
        None
        if memory_swap_max is None
        else _numbers.size("memory_swap_max", memory_swap_max, low=0)
    )
    tasks = None
    if tasks_max is not None and tasks_max != "infinity":
        tasks = _numbers.whole(
            "tasks_max",
            tasks_max.strip() if isinstance(tasks_max, str) else tasks_max,
            low=1,
            high=_MAX_TASKS,
            allowed=f"a number of tasks from 1 to {_MAX_TASKS}, or 'infinity'",
        )
    return CallLimits(label, memory, swap, tasks)


def call_env(
    env: Mapping[str, str] | None, memory_max: object = None, tasks_max: object = None
) -> Mapping[str, str] | None:
    """An agent's environment with its calls' default caps (:data:`DEFAULTS_ENV`).

    ``env`` None is this process's environment, as for a launch; with no
    default given it is returned as is. The caps are checked as a call's
    (:func:`call_limits`) and written in bytes and tasks.

    Raises:
        InvalidConfig: a cap out of range (before anything is started).
    """
    if memory_max is None and tasks_max is None:
        return env
    limits = call_limits(memory_max=memory_max, tasks_max=tasks_max)
    out = dict(os.environ if env is None else env)
    for key, value in (("memory_max", limits.memory_max), ("tasks_max", limits.tasks_max)):
        if value is not None:
            out[DEFAULTS_ENV[key]] = str(value)
    return out


def call_in(path: str, unit: str) -> str | None:
    """The call (a ``call-*`` cgroup right below the scope ``unit``) the cgroup ``path``
    is in, at any depth; None: not in one (the agent's leaf, the scope itself)."""
    marker = f"/{unit}/"
    at = path.find(marker)
    if at < 0:
        return None
    child = path[at + len(marker) :].partition("/")[0]
    return child if child.startswith(CALL_PREFIX) else None


def own_cgroup(pid: int | str = "self", proc_root: str = "/proc") -> str | None:
    """The cgroup v2 path of ``pid`` (``/proc/PID/cgroup``'s ``0::`` line); None: none or gone."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", "rb") as f:
            data = f.read(65536)
    except OSError:
        return None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def find_scope(cgroup: str | None) -> tuple[str, str]:
    """``(scope path, unit)`` of the agentscope scope that ``cgroup`` is in or below.

    The scope is the path's first ``agentscope-*.scope`` component whose
    parent is a slice: a call's agent is the one its caller runs in, so a
    call can never be placed in another agent's scope.

    Raises:
        NotInAgent: no cgroup v2 path, no scope, or a scope that is not agentscope's.
    """
    if not cgroup or not cgroup.startswith("/"):
        raise NotInAgent(None, "this process is in no cgroup v2 hierarchy")
    parts = cgroup.split("/")
    for i, part in enumerate(parts):
        if (
            part.startswith(_SCOPE_PREFIX)
            and part.endswith(".scope")
            and i > 0
            and parts[i - 1].endswith(".slice")
        ):
            return "/".join(parts[: i + 1]), part
    others = [p for p in parts if p.endswith(".scope")]
    if others:
        raise NotInAgent(cgroup, f"{others[-1]} is not an agentscope agent's scope")
    raise NotInAgent(cgroup, "this process is in no agent's scope")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode(errors="replace")
    except OSError:
        return None


def _mkdir(path: str) -> None:
    # The kernel makes a cgroup's interface files with it (tests/test_calls.py fakes that).
    os.mkdir(path)


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def delegation(scope_dir: str) -> str | None:
    """Why calls are not isolated in the scope at ``scope_dir``; None: they are.

    Isolated: the scope enables ``memory`` and ``pids`` for its children
    (:func:`settle` did) and holds no process itself.
    """
    enabled = _read(scope_dir + "/cgroup.subtree_control")
    if enabled is None:
        return f"cannot read {scope_dir}/cgroup.subtree_control (the scope is gone?)"
    missing = [c for c in CONTROLLERS if c not in enabled.split()]
    if not missing:
        return None
    lacking = _not_available(scope_dir)
    if lacking is not None:
        return lacking
    return (
        "the agent's processes are in its scope itself, not in an agent leaf (an adopted "
        "agent, one in a tmux window, one started before agentscope delegated scopes, or "
        "systemd did not delegate the scope)"
    )


def _not_available(scope_dir: str) -> str | None:
    """Which of :data:`CONTROLLERS` the scope cannot have, said for the user; None: all."""
    available = (_read(scope_dir + "/cgroup.controllers") or "").split()
    lacking = [c for c in CONTROLLERS if c not in available]
    if not lacking:
        return None
    return (
        f"the {' and '.join(lacking)} controller is not delegated to the agent's scope "
        f"(its cgroup.controllers: {' '.join(available) or 'none'}); for a user manager: "
        "systemctl edit user@.service, [Service] Delegate=pids memory"
    )


def settle(scope_dir: str, pid: int) -> str | None:
    """Give a delegated scope its shape (module docstring); None, or why it could not.

    ``pid`` must be the scope's only process (the launch gate holds it, or
    it is the caller of ``exec``): it moves into the ``agent`` leaf, then
    the scope enables ``memory`` and ``pids`` for its children, the leaf is
    marked for systemd-oomd to take last (:func:`_avoid_oomd`), and
    ``claude-code-bash`` is made with no swap. On failure the process stays
    where it was and the scope works as an undelegated one.
    """
    lacking = _not_available(scope_dir)
    if lacking is not None:
        return lacking
    leaf = f"{scope_dir}/{AGENT_LEAF}"
    try:
        _mkdir(leaf)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {leaf}: {exc.strerror} (was the scope delegated?)"
    try:
        _write(leaf + "/cgroup.procs", str(pid))
    except OSError as exc:
        _rmdir(leaf)
        return f"cannot move the agent into {leaf}: {exc.strerror}"
    try:
        _write(scope_dir + "/cgroup.subtree_control", " ".join("+" + c for c in CONTROLLERS))
    except OSError as exc:
        return f"cannot enable {' '.join(CONTROLLERS)} in the scope: {exc.strerror}"
    _avoid_oomd(leaf)
    bash = f"{scope_dir}/{CLAUDE_CODE_BASH}"
    try:
        _mkdir(bash)
        _write_optional(bash + "/memory.swap.max", "0")
    except OSError as exc:
        return f"cannot create {bash}: {exc.strerror}"
    return None


def _avoid_oomd(leaf: str) -> None:
    """Ask systemd-oomd to take the agent leaf last: after the calls beside it.

    oomd kills a whole candidate cgroup, a leaf or one with ``memory.oom.group``
    1 (systemd-oomd.service(8)): in a delegated scope the ``agent`` leaf and
    each call, never the scope, so a ``ManagedOOMPreference=avoid`` on the
    scope (agentscope's drop-in) no longer reaches any candidate. oomd reads
    the preference from the candidate's own ``user.oomd_avoid`` xattr, which
    is what systemd writes for ``avoid`` (src/oom/oomd-util.c,
    ``oomd_fetch_cgroup_oom_preference``); honoured when the leaf is root's or
    has the owner of the cgroup whose rule fired (a user manager's agents: the
    rules on ``user@UID.service`` and below, not ``-.slice``'s swap rule).
    "avoid" only orders: with no other candidate, oomd still takes the agent.
    """
    try:  # noqa: SIM105 (contextlib is one import too many on the call path)
        _set_xattr(leaf, "user.oomd_avoid", b"1")
    except OSError:
        pass  # no user xattrs on cgroupfs (Linux < 5.7): oomd ranks the leaf as any other


def _set_xattr(path: str, name: str, value: bytes) -> None:
    # cgroupfs holds user.* xattrs from Linux 5.7 (tests/test_calls.py fakes a failure).
    os.setxattr(path, name, value)


def settle_process(
    pid: int, cgroup_root: str = CGROUP_ROOT, proc_root: str = "/proc"
) -> str | None:
    """:func:`settle` the agentscope scope ``pid`` is in; None, or why calls are not isolated."""
    try:
        scope, _unit = find_scope(own_cgroup(pid, proc_root))
    except NotInAgent as exc:
        return exc.reason
    return settle(cgroup_root + scope, pid)


_SAID: set[str] = set()


def say_not_isolated(why: str, warn: Callable[[str], None] | None = None) -> None:
    """Log once per reason and process that an agent's calls are not isolated, and why."""
    if why in _SAID:
        return
    _SAID.add(why)
    warn_or_log(
        warn, f"tool calls are not isolated in this agent's scope: {why}; see docs/calls.md"
    )


def warn_or_log(warn: Callable[[str], None] | None, message: str) -> None:
    """``message`` to ``warn`` when given, else a warning in the "agentscope" log.

    The fast paths' (``exec``, ``call``) one way to warn: :mod:`logging` is
    imported only when nobody asked for the warning itself.
    """
    if warn is not None:
        warn(message)
        return
    import logging

    logging.getLogger("agentscope").warning("%s", message)


def _write_optional(path: str, value: str) -> None:
    """Write ``value`` unless the file is absent (``memory.swap.max``: no swap accounting)."""
    try:  # noqa: SIM105 (contextlib is one import too many on the call path)
        _write(path, value)
    except FileNotFoundError:
        pass


def _remove_cgroup(path: str) -> None:
    # The kernel removes a cgroup with its interface files (tests/test_calls.py fakes that).
    os.rmdir(path)


def _rmdir(path: str) -> bool:
    try:
        _remove_cgroup(path)
    except OSError:
        return False
    return True


def _call_number(names: Iterable[str], label: str) -> int:
    prefix = f"{CALL_PREFIX}{label}-"
    numbers = [
        int(n[len(prefix) :]) for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit()
    ]
    return max(numbers, default=0) + 1


def create_call(scope_dir: str, limits: CallLimits) -> str:
    """Make ``call-LABEL-N`` in the scope with ``limits``; its directory.

    ``N`` is one more than the highest of that label in the scope; two
    calls that race for it both succeed (the loser takes the next). Caps:
    ``memory.max``, ``memory.swap.max``, ``pids.max`` and
    ``memory.oom.group`` 1, so an OOM kill in the call ends the whole call.

    Raises:
        OSError: the scope is gone or not writable; the call is removed again.
    """
    n = _call_number(os.listdir(scope_dir), limits.label)
    while True:
        path = f"{scope_dir}/{CALL_PREFIX}{limits.label}-{n}"
        try:
            _mkdir(path)
            break
        except FileExistsError:
            n += 1
    try:
        if limits.memory_max is not None:
            _write(path + "/memory.max", str(limits.memory_max))
        if limits.swap_max is not None:
            _write_optional(path + "/memory.swap.max", str(limits.swap_max))
        if limits.tasks_max is not None:
            _write(path + "/pids.max", str(limits.tasks_max))
        _write(path + "/memory.oom.group", "1")
    except OSError:
        _rmdir(path)
        raise
    return path


def enter(path: str, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) into the cgroup ``path``, all its threads.

    Raises:
        OSError: refused (not delegated to this user, the cgroup gone).
    """
    _write(path + "/cgroup.procs", str(pid))


def populated(path: str) -> bool | None:
    """Whether the cgroup ``path`` or a descendant holds a process; None: it is gone."""
    text = _read(path + "/cgroup.events")
    if text is None:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() != "0"
    return None


def remove_when_empty(
    path: str,
    *,
    poll_interval: float = 1.0,
    on_empty: Callable[[str], None] | None = None,
) -> None:
    """Wait until the cgroup ``path`` is empty, then remove it (and its empty children).

    ``on_empty(path)`` is called once it is first found empty, before the
    removal (the call's last figures).
    """
    while wait_empty(path, None, poll_interval=poll_interval):
        if on_empty is not None:
            on_empty(path)
            on_empty = None
        _remove_tree(path)
        if not os.path.isdir(path):
            return


def wait_empty(path: str, timeout: float | None, *, poll_interval: float = 1.0) -> bool:
    """Wait until the cgroup ``path`` holds no process (True), it is gone or ``timeout`` passed.

    ``cgroup.events`` raises a poll event at each change of ``populated``;
    a periodic re-read covers a missed one.
    """
    import select
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = populated(path)
        if state is None:
            return False
        if not state:
            return True
        left = (
            poll_interval if deadline is None else min(poll_interval, deadline - time.monotonic())
        )
        if left <= 0:
            return False
        try:
            fd = os.open(path + "/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            os.read(fd, 4096)  # arm: a change after this read wakes the poll
            if populated(path) is False:
                continue
            poller.poll(int(left * 1000))
        finally:
            os.close(fd)


# A call's leftovers (``cmd &`` it did not wait for) may outlive its command
# this long, as an agent's by default (_scopeprops.DEFAULT_REAP_AFTER); then
# SIGTERM, and SIGKILL this long after (as the scope's stop job does).
LEFTOVER_GRACE = 10.0
TERM_GRACE = 5.0


def end_leftovers(
    path: str, proc_root: str = "/proc", *, grace: float = LEFTOVER_GRACE, term: float = TERM_GRACE
) -> int:
    """After a call's command ended: its leftovers get ``grace`` s, SIGTERM, ``term`` s, SIGKILL.

    Returns how many processes were signalled (0: the call emptied by itself).
    """
    import signal

    if wait_empty(path, grace) or populated(path) is None:
        return 0
    termed = len(signal_tree(path, signal.SIGTERM, proc_root))
    if wait_empty(path, term) or populated(path) is None:
        return termed
    return max(termed, len(kill_tree(path, proc_root)))


def signal_tree(path: str, sig: int, proc_root: str = "/proc") -> list[int]:
    """Send ``sig`` to each process of the cgroup ``path`` and below, through a pidfd,
    once ``/proc/PID/cgroup`` says it is still in it; the pids signalled."""
    import signal

    head, _, name = path.rstrip("/").rpartition("/")
    inside = f"/{head.rpartition('/')[2]}/{name}/"  # the scope's unit is unique
    sent = []
    for pid in _pids_below(path):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            where = own_cgroup(pid, proc_root)
            if where is not None and inside in where + "/":
                signal.pidfd_send_signal(pidfd, sig)
                sent.append(pid)
        except OSError:
            pass  # gone meanwhile
        finally:
            os.close(pidfd)
    return sent


def _pids_below(path: str) -> list[int]:
    pids: list[int] = []
    for top, _dirs, _files in os.walk(path):
        text = _read(top + "/cgroup.procs")
        if text is not None:
            pids.extend(int(p) for p in text.split() if p.isdigit())
    return pids


def kill_tree(path: str, proc_root: str = "/proc") -> list[int]:
    """SIGKILL every process of the cgroup ``path`` and below; the pids it held ([]: gone).

    ``cgroup.kill`` (Linux 5.14+) kills them all at once, forks racing the
    kill included. Before it, the cgroup is frozen (``cgroup.freeze``, 5.2+:
    none of it forks meanwhile; a frozen process still dies of SIGKILL,
    Documentation/admin-guide/cgroup-v2.rst), each process killed through a
    pidfd (:func:`signal_tree`), and thawed.
    """
    import signal

    held = _pids_below(path)
    try:
        _write(path + "/cgroup.kill", "1")
        return held
    except FileNotFoundError:
        if not os.path.isdir(path):
            return []
    except OSError:
        pass  # refused: pid by pid then
    try:
        _write(path + "/cgroup.freeze", "1")
        frozen = True
    except OSError:
        frozen = False
    try:
        return signal_tree(path, signal.SIGKILL, proc_root)
    finally:
        if frozen:
            try:  # noqa: SIM105 (contextlib is one import too many here)
                _write(path + "/cgroup.freeze", "0")
            except OSError:
                pass


def _remove_tree(path: str) -> None:
    """rmdir ``path`` and its sub-cgroups, deepest first (a call may have made its own)."""
    for top, dirs, _files in os.walk(path, topdown=False):
        for d in dirs:
            _rmdir(os.path.join(top, d))
    _rmdir(path)


def fork_remover(path: str, watch: CallWatch | None = None) -> None:
    """Fork a process that removes the cgroup ``path`` once the caller exec'd and it emptied.

    With ``watch``, it also writes the call's ``call_started`` (after the
    exec) and ``call_exited`` (once empty) events (:mod:`._callevents`).
    Once the caller (by then the command) has exited, what the call left
    running ends too (:func:`end_leftovers`).

    Called before the caller moves into ``path``. The remover is a
    grandchild in its own session (no terminal signal reaches it, and the
    command the caller execs does not get it as a child), with stdio on
    /dev/null and no other descriptor: a reader of the caller's output is
    not held open by it.
    """
    r, w = os.pipe()  # both close-on-exec: the caller's exec closes w, and r sees EOF
    try:  # the caller, whose exit (as its command) ends the call's leftovers
        caller: int | None = os.pidfd_open(os.getpid())
    except OSError:
        caller = None  # no pidfd (Linux before 5.3): leftovers end when they do
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            if os.fork() == 0:
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                low = 3
                for keep in sorted({r} if caller is None else {r, caller}):
                    os.closerange(low, keep)
                    low = keep + 1
                os.closerange(low, 1 << 20)
                while os.read(r, 1):
                    pass
                if watch is not None:
                    watch.begin()
                if caller is not None:
                    import select

                    select.select([caller], [], [])  # readable once it exited
                    end_leftovers(path)
                remove_when_empty(path, on_empty=None if watch is None else watch.measure)
                if watch is not None:
                    watch.end(None)
        finally:
            os._exit(0)
    os.close(r)
    if caller is not None:
        os.close(caller)
    os.waitpid(pid, 0)
    # w stays open in the caller: its exec (or exit) closes it, and that wakes the remover.
    _KEEP.append(w)


def sweep(scope_dir: str) -> list[str]:
    """Remove the empty ``call-*`` cgroups of a scope (a remover that was killed); what went."""
    try:
        names = os.listdir(scope_dir)
    except OSError:
        return []
    gone = []
    for name in names:
        if name.startswith(CALL_PREFIX):
            path = f"{scope_dir}/{name}"
            if populated(path) is False and _rmdir(path):
                gone.append(name)
    return gone
