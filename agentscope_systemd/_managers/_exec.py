"""Moving the calling process into a new agent scope, fast: what ``agentscope exec`` runs.

:meth:`AsyncFleet.adopt` for the calling process, in about the time of a
``systemd-run --scope``: no asyncio, no dbus-fast (:mod:`._wire` instead),
no SQLite (a spool entry instead, :mod:`._spool`). It only goes ahead when
what it can see cheaply says all is ordinary:

- the agents slice exists and has no memory limits (nothing to clear),
- no scope of that agent's name is in the slice and no exec of that name runs,
- the manager's address is a plain unix socket;

otherwise it raises :class:`SlowPath` before doing anything, and the caller
uses :meth:`Fleet.adopt`, which clears stale limits, checks the name against
the registry and says what is wrong.
"""

from __future__ import annotations

import os
import time

from .. import _names
from .._calls import _calls
from .._errors import BusError, LaunchError, SystemdUnavailable
from .._registry import _spool
from .._typecheck import TYPE_CHECKING
from . import _scope, _scopeprops, _wire

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["SlowPath", "adopt_self"]

_LIMIT_FILES = ("memory.high", "memory.max", "memory.swap.max")


class SlowPath(Exception):
    """The fast path cannot tell whether all is ordinary; nothing was done."""


def adopt_self(
    fleet: str,
    name: str,
    argv: Sequence[str],
    *,
    manager: str = "auto",
    memory_max: int | None = None,
    tasks_max: int | None = None,
    cpu_weight: int | None = None,
    io_weight: int | None = None,
    properties: Mapping[str, str | int] | None = None,
    reap_after: float | str = _scopeprops.DEFAULT_REAP_AFTER,
    slice: str = _names.DEFAULT_SLICE,
    agent_oom_score_adj: int = 800,
    env: Mapping[str, str] = os.environ,
    warn: Callable[[str], None] | None = None,
) -> str:
    """Move this process into a new scope of agent ``name`` about to exec ``argv``.

    Returns the scope's unit once its start job is done; the process then
    has ``agent_oom_score_adj``. ``warn`` receives warnings (by default the
    ``agentscope`` logger), among them each resource control that systemd
    dropped or changed, or the kernel does not enforce. The resource
    controls and ``reap_after`` are as for :meth:`AsyncFleet.launch`; the
    spool entry carries ``reap_after`` to the registry.

    Raises:
        SlowPath: use :meth:`Fleet.adopt` instead (nothing was done).
        InvalidName, InvalidConfig, SystemdUnavailable, BusError, LaunchError.
    """
    _names.validate_name("fleet", fleet)
    _names.validate_name("agent", name)
    controls, grace = _scopeprops.scope_settings(
        memory_max, tasks_max, cpu_weight, io_weight, properties, reap_after
    )
    manager = _names.resolve_manager(manager)
    slice_dir = _scope.slice_cgroup(manager, slice)
    _check_slice(slice_dir, f"agentscope-{fleet}-{name}-")
    state = _spool.state_dir(manager, env)
    if not os.path.isdir(state):
        raise SlowPath("no registry yet")  # the slow path creates it, with its modes
    unit = _names.scope_unit_name(fleet, name)
    pid = os.getpid()
    try:
        cwd = os.getcwd()
    except OSError:  # run from a removed directory
        cwd = ""
    start = _spool.start_time(pid) or 0
    entry = _spool.Entry(fleet, name, unit, pid, start, time.time(), slice_dir, cwd, argv, grace)
    spool = os.path.join(state, "spool")
    if len(_spool.pending(spool)) >= _spool.MAX_PENDING:
        # Nothing else may have opened the registry for a while: let the
        # library take the spool in now, so it never grows without bound.
        raise SlowPath(f"{_spool.MAX_PENDING} launches wait in the spool")
    try:
        claimed = _spool.claim(spool, entry)
    except OSError as exc:  # not ours to write (another user's registry): let the library say so
        raise SlowPath(f"cannot write the registry's spool: {exc}") from None
    if claimed is None:
        raise SlowPath(f"an exec of agent {name} runs")
    try:
        props = _scope.scope_properties(fleet, name, slice, controls)
        props["PIDs"] = ("au", [pid])  # this very process: its pid cannot be reused meanwhile
        _start(manager, env, unit, props, warn, controls)
    except BaseException:
        try:  # noqa: SIM105 (contextlib is one import too many on this path)
            os.unlink(claimed)
        except FileNotFoundError:
            pass
        raise
    # Still this scope's only process: into its agent leaf, so calls get cgroups (_calls.py).
    why = _calls.settle_process(pid)
    if why is not None:
        _calls.say_not_isolated(why, warn)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(agent_oom_score_adj))
    except OSError:
        pass  # lowering it needs CAP_SYS_RESOURCE; a higher one is kept
    return unit


def _check_slice(slice_dir: str, prefix: str) -> None:
    try:
        for limit in _LIMIT_FILES:
            try:
                with open(f"{slice_dir}/{limit}", "rb") as f:
                    if f.read().strip() != b"max":
                        raise SlowPath(f"the agents slice has a {limit}")
            except FileNotFoundError:
                if limit != "memory.swap.max":  # absent without swap accounting
                    raise
        names = os.listdir(slice_dir)
    except OSError as exc:
        raise SlowPath(f"cannot read the agents slice: {exc}") from None
    if any(n.startswith(prefix) and len(n) == len(prefix) + len("123abc.scope") for n in names):
        raise SlowPath("a scope of that name runs")


def _start(
    manager: str,
    env: Mapping[str, str],
    unit: str,
    props: dict[str, tuple[str, object]],
    warn: Callable[[str], None] | None,
    controls: dict[str, tuple[str, object]] | None = None,
) -> None:
    tried: list[str] = []
    addresses = _wire.addresses(manager, env)
    for address, direct in addresses:
        try:
            conn = _wire.Connection(manager, address, direct)
        except _wire.Unsupported as exc:
            raise SlowPath(f"bus address {exc} is not a unix socket path") from None
        except SystemdUnavailable as exc:
            tried.append(f"{address} ({exc.reason})")
            continue
        try:
            _run(conn, unit, props, warn)
            if controls:
                _read_back(conn, unit, controls, warn)
        finally:
            conn.close()
        return
    raise SystemdUnavailable(manager, ", ".join(a for a, _ in addresses), "; ".join(tried))


def _run(
    conn: _wire.Connection,
    unit: str,
    props: dict[str, tuple[str, object]],
    warn: Callable[[str], None] | None,
) -> None:
    signature = "ssa(sv)a(sa(sv))"
    opening = conn.greet()
    fallback = _scope.OOMPolicyFallback()
    sent = fallback.properties(props)
    serial = conn.send("StartTransientUnit", signature, [unit, "fail", sent.items(), []])
    for opened, method in opening:
        conn.reply(opened, method)
    try:
        (job,) = conn.reply(serial, "StartTransientUnit")
    except BusError as exc:
        if not fallback.refused(sent, exc.dbus_name, exc.message):
            raise
        (version,) = conn.reply(
            conn.send(
                "Get",
                "ss",
                [_wire.SD_MANAGER, "Version"],
                interface=_wire.PROPERTIES,
            ),
            "Get",
        )
        warning = fallback.warning(version)
        if warning is not None:
            _calls.warn_or_log(warn, warning)
        retry = [unit, "fail", fallback.properties(props).items(), []]
        (job,) = conn.call("StartTransientUnit", signature, retry)
    result = conn.job_result(job)
    if result != "done":
        raise LaunchError(_scope.job_failed_message(unit, result, conn.manager))


def _read_back(
    conn: _wire.Connection,
    unit: str,
    controls: dict[str, tuple[str, object]],
    warn: Callable[[str], None] | None,
) -> None:
    """Warn of each of ``controls`` the started scope does not hold or enforce."""
    try:
        (path,) = conn.call("GetUnit", "s", [unit])
        (read,) = conn.reply(
            conn.send(
                "GetAll",
                "s",
                [_wire.SD_SCOPE],
                path=str(path),
                interface=_wire.PROPERTIES,
            ),
            "GetAll",
        )
    except BusError:
        return  # gone already: nothing to say of it
    cgroup = str(read.get("ControlGroup") or "")
    root = _scope.CGROUP_ROOT
    files = _scopeprops.read_cgroup_files(root + cgroup, controls) if cgroup else {}
    for issue in _scopeprops.compare(controls, read, files):
        _calls.warn_or_log(warn, _scopeprops.describe(unit, issue))
