"""What an agent's scope is: the properties it is started with, and where it lives.

Shared by the async core (:mod:`._fleet`, over dbus-fast) and the ``exec``
fast path (:mod:`._exec`, over :mod:`._wire`), so both make the same scope.
No I/O and only light imports here.
"""

from __future__ import annotations

import os

from .. import _names
from .._typecheck import TYPE_CHECKING
from . import _wire

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "CGROUP_ROOT",
    "NO_OOMPOLICY",
    "OOMPOLICY_WARNING",
    "OOMPolicyFallback",
    "job_failed_message",
    "manager_cgroup",
    "refuses_oom_policy",
    "scope_properties",
    "slice_cgroup",
    "slice_parts",
    "slice_relpath",
]

CGROUP_ROOT = "/sys/fs/cgroup"

# The errors of a systemd that does not know OOMPolicy on scopes (before
# 253, or vanilla 252.0-252.4).
NO_OOMPOLICY = (_wire.PROPERTY_READ_ONLY, _wire.UNKNOWN_PROPERTY)

OOMPOLICY_WARNING = (
    "systemd %s refuses OOMPolicy on scopes, so agents are launched without "
    "it: an OOM kill may then stop an agent's whole scope (systemd before the "
    "OOMPolicy support of 253 does so from its scope OOM handling on; 247 was "
    "measured to leave the scope running). Pin the policy with a "
    "DefaultOOMPolicy=continue drop-in for the manager, or use systemd 253+."
)


def scope_properties(
    fleet: str,
    agent: str,
    slice: str,
    controls: Mapping[str, tuple[str, Any]] | None = None,
    description: str | None = None,
) -> dict[str, tuple[str, Any]]:
    """The properties of an agent's scope, ``{name: (signature, value)}``.

    ``controls`` are its resource properties as :func:`._scopeprops.build`
    made them. Without the processes (``PIDs`` or ``PIDFDs``) and without
    ``OOMPolicy``, which :class:`OOMPolicyFallback` adds while this systemd
    accepts it.
    """
    props: dict[str, tuple[str, Any]] = {
        "Description": ("s", description or _names.describe(fleet, agent)),
        "Slice": ("s", slice),
        "CollectMode": ("s", "inactive-or-failed"),
        "MemoryAccounting": ("b", True),
        # Calls get cgroups of their own inside the scope (#26, _calls.py):
        # systemd leaves a delegated scope's subtree to its owner.
        "Delegate": ("b", True),
    }
    props.update(controls or {})
    return props


def refuses_oom_policy(dbus_name: str, message: str) -> bool:
    """Whether a StartTransientUnit error means: this systemd has no scope OOMPolicy."""
    return dbus_name in NO_OOMPOLICY and "OOMPolicy" in message


class OOMPolicyFallback:
    """The one OOMPolicy rule of both clients (``Scopes`` over dbus-fast, exec over ``_wire``).

    A scope is asked for with ``OOMPolicy=continue`` until this systemd
    refuses it once; from then on without. A client starts a scope with
    :meth:`properties`; when the start fails, :meth:`refused` says whether
    that was the refusal (then it starts again with :meth:`properties`, once)
    and :meth:`warning` gives the warning to log, to the first caller only:
    launches in flight together are all refused, and the user is told once.
    One object per fleet (the async core) or per process (exec).
    """

    __slots__ = ("_refused", "_warned")

    def __init__(self) -> None:
        self._refused = False
        self._warned = False

    def properties(self, props: dict[str, tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
        """``props`` with ``OOMPolicy=continue``, unless this systemd refused it."""
        return dict(props) if self._refused else {**props, "OOMPolicy": ("s", "continue")}

    def refused(self, sent: dict[str, tuple[str, Any]], dbus_name: str, message: str) -> bool:
        """Whether a start with ``sent`` failed for its OOMPolicy: then start again."""
        if "OOMPolicy" not in sent or not refuses_oom_policy(dbus_name, message):
            return False
        self._refused = True
        return True

    def warning(self, version: str) -> str | None:
        """The warning for the user, the first time only (None after that)."""
        if self._warned:
            return None
        self._warned = True
        return OOMPOLICY_WARNING % version


def job_failed_message(unit: str, result: str, manager: str) -> str:
    user = "--user " if manager == "user" else ""
    return (
        f"systemd could not start scope {unit}: job result {result!r}; "
        f"see journalctl {user}-u {unit}"
    )


def slice_parts(slice_name: str) -> list[str]:
    """``a-b-c.slice`` -> ``["a.slice", "a-b.slice", "a-b-c.slice"]`` (systemd.slice(5))."""
    if slice_name == "-.slice":
        return []
    stem, dot, suffix = slice_name.rpartition(".")
    if not dot or suffix != "slice" or not stem:
        raise ValueError(f"{slice_name!r} is not a slice name (expected NAME.slice)")
    pieces = stem.split("-")
    if not all(pieces) or "/" in stem:
        raise ValueError(
            f"{slice_name!r} is not a valid slice name: dashes separate the levels of the "
            "hierarchy, so it may not start or end with one or hold two in a row"
        )
    return ["-".join(pieces[: i + 1]) + ".slice" for i in range(len(pieces))]


def slice_relpath(slice: str) -> str:
    """The cgroup path of a slice below its manager's root: dashes are the hierarchy."""
    return "/".join(slice_parts(slice))


def manager_cgroup(manager: str, uid: int | None = None, root: str = CGROUP_ROOT) -> str:
    """The cgroup directory a manager runs its units in (a user manager's service)."""
    if manager != "user":
        return root
    uid = os.getuid() if uid is None else uid
    return f"{root}/user.slice/user-{uid}.slice/user@{uid}.service"


def slice_cgroup(manager: str, slice: str, uid: int | None = None, root: str = CGROUP_ROOT) -> str:
    """Where the manager puts the agents slice (before it is asked where it is)."""
    return f"{manager_cgroup(manager, uid, root)}/{slice_relpath(slice)}"
