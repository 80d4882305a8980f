"""What an agent's scope is: the properties it is started with, and where it lives.

Shared by the async core (:mod:`._fleet`, over dbus-fast) and the ``exec``
fast path (:mod:`._exec`, over :mod:`._wire`), so both make the same scope.
No I/O and only light imports here.
"""

from __future__ import annotations

import os

from . import _names

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "CGROUP_ROOT",
    "NO_OOMPOLICY",
    "OOMPOLICY_WARNING",
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
NO_OOMPOLICY = (
    "org.freedesktop.DBus.Error.PropertyReadOnly",
    "org.freedesktop.DBus.Error.UnknownProperty",
)

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
    memory_max: int | None,
    description: str | None = None,
) -> dict[str, tuple[str, Any]]:
    """The properties of an agent's scope, ``{name: (signature, value)}``.

    Without the processes (``PIDs`` or ``PIDFDs``) and without ``OOMPolicy``,
    which the caller adds when this systemd accepts it.
    """
    props: dict[str, tuple[str, Any]] = {
        "Description": ("s", description or _names.describe(fleet, agent)),
        "Slice": ("s", slice),
        "CollectMode": ("s", "inactive-or-failed"),
        "MemoryAccounting": ("b", True),
    }
    if memory_max is not None:
        props["MemoryMax"] = ("t", memory_max)
        props["MemorySwapMax"] = ("t", 0)
    return props


def refuses_oom_policy(dbus_name: str, message: str) -> bool:
    """Whether a StartTransientUnit error means: this systemd has no scope OOMPolicy."""
    return dbus_name in NO_OOMPOLICY and "OOMPolicy" in message


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
