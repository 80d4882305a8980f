"""An agent's resource controls: the vetted systemd properties, checked, packed, read back.

One builder (:func:`build`) for both D-Bus clients: the async core
(:mod:`._systemd`, dbus-fast) and ``agentscope exec``'s fast path
(:mod:`._exec`, :mod:`._wire`). Values are checked before any I/O and a bad
one raises :class:`InvalidConfig` naming the property. After the start job
the caller reads the scope's properties back and :func:`compare` says which
ones systemd dropped or changed, and which the kernel does not enforce (the
controller is not enabled for the scope: a user manager delegates only
``memory pids`` (247) or ``memory pids cpu`` (252+), never ``io`` or
``cpuset``).

Only :mod:`os`-level imports: the exec fast path imports this module.
"""

from __future__ import annotations

import os

from .. import _numbers
from .._errors import InvalidConfig
from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "DEFAULT_REAP_AFTER",
    "MEMORY_MAX_DEFAULT_SWAP",
    "PROPERTIES",
    "build",
    "cgroup_checks",
    "compare",
    "describe",
    "parse_property",
    "parse_reap_after",
    "read_cgroup_files",
    "scope_settings",
]

INFINITY = 2**64 - 1
DEFAULT_REAP_AFTER = 10.0
"""Seconds an agent's leftovers may outlive its main process by default (:mod:`._reaper`)."""
_MAX_REAP_AFTER = 7 * 86400.0
_MAX_TASKS = 2**62  # the kernel's PID_MAX_LIMIT is 2^22; systemd takes up to 2^64 - 2
_MAX_WEIGHT = 10000  # systemd.resource-control(5): CPUWeight=, IOWeight= take 1..10000
_MAX_CPUS = 8192  # a bitmask this wide covers any kernel's NR_CPUS on Debian (8192)
# With memory_max, the scope gets no swap unless MemorySwapMax is given.
MEMORY_MAX_DEFAULT_SWAP = 0

# name -> (D-Bus property, signature, cgroup file that enforces it, controller)
PROPERTIES: dict[str, tuple[str, str, str, str]] = {
    "TasksMax": ("TasksMax", "t", "pids.max", "pids"),
    "CPUWeight": ("CPUWeight", "t", "cpu.weight", "cpu"),
    "CPUQuota": ("CPUQuotaPerSecUSec", "t", "cpu.max", "cpu"),
    "IOWeight": ("IOWeight", "t", "io.weight", "io"),
    "MemoryMax": ("MemoryMax", "t", "memory.max", "memory"),
    "MemorySwapMax": ("MemorySwapMax", "t", "memory.swap.max", "memory"),
    "AllowedCPUs": ("AllowedCPUs", "ay", "cpuset.cpus", "cpuset"),
}
"""The systemd properties an agent's scope may be given (``-p NAME=VALUE``)."""

# Refused on purpose, with the reason the user is told.
_REFUSED = {
    "MemoryHigh": "it throttles instead of killing (processes sleep in the kernel, the whole "
    "agent freezes); use MemoryMax",
    "OOMPolicy": "agentscope sets it (continue) itself",
    "Slice": "agentscope chooses the slice",
    "Description": "agentscope names the scope",
    "Delegate": "agentscope delegates every agent's scope itself, for its calls (docs/calls.md)",
}


def _bounded_int(field: str, value: object, low: int, high: int, allowed: str) -> int:
    return _numbers.whole(field, value, low=low, high=high, allowed=allowed)


def _tasks(field: str, value: object) -> int:
    if value == "infinity":
        return INFINITY
    return _bounded_int(
        field, value, 1, _MAX_TASKS, f"a number of tasks from 1 to {_MAX_TASKS}, or 'infinity'"
    )


def _weight(field: str, value: object) -> int:
    return _bounded_int(field, value, 1, _MAX_WEIGHT, f"from 1 to {_MAX_WEIGHT}")


def _size(field: str, value: object, low: int) -> int:
    # The one size grammar (--memory-max's): 512M, 1.5G, 50%, infinity.
    parsed = _numbers.size(field, value, low=low)
    return INFINITY if parsed is None else parsed


def _quota(field: str, value: object) -> int:
    # CPUQuota=200% is two CPUs' time per second: CPUQuotaPerSecUSec = 2,000,000.
    allowed = (
        "a percentage of one CPU above 0% and at most 100000%, two decimals at most, "
        "e.g. '50%' or '12.5%'"
    )
    text = value.strip() if isinstance(value, str) else ""
    if not text.endswith("%"):
        raise InvalidConfig(field, value, allowed)
    whole, dot, frac = text[:-1].partition(".")
    # systemd's own CPUQuota= takes two decimals (parse_permyriad): so do we.
    if not _numbers.is_digits(whole) or (dot and not (_numbers.is_digits(frac) and len(frac) <= 2)):
        raise InvalidConfig(field, value, allowed)
    percent = _numbers.real(field, text[:-1], low=0, high=100_000, above_low=True, allowed=allowed)
    usec = round(percent * 10000)
    if not 0 < usec <= 1000 * 1_000_000:  # 1000 CPUs' worth at most
        raise InvalidConfig(field, value, allowed)
    return usec


def _cpus(field: str, value: object) -> bytes:
    # systemd's AllowedCPUs= on the bus is a bitmask, CPU n in bit n % 8 of byte n // 8.
    allowed = f"a list of CPUs such as '0-3,6', each from 0 to {_MAX_CPUS - 1}"
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfig(field, value, allowed)
    cpus: set[int] = set()
    for part in value.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        first = _numbers.whole(field, low, low=0, high=_MAX_CPUS - 1, allowed=allowed)
        last = (
            _numbers.whole(field, high, low=0, high=_MAX_CPUS - 1, allowed=allowed)
            if dash
            else first
        )
        if not _numbers.is_digits(low) or (dash and not _numbers.is_digits(high)) or first > last:
            raise InvalidConfig(field, value, allowed)
        cpus.update(range(first, last + 1))
    mask = bytearray(max(cpus) // 8 + 1)
    for cpu in cpus:
        mask[cpu // 8] |= 1 << (cpu % 8)
    return bytes(mask)


def parse_reap_after(value: object) -> float | None:
    """A launch's ``reap_after``: seconds (0 to a week), or None for ``"keep"``.

    Seconds as a number, or a systemd time span (``30s``, ``5min``, ``1h``).

    Here, not in :mod:`._reaper`, because ``agentscope exec`` checks it
    before any heavy import.

    Raises:
        InvalidConfig: not a number of seconds in range, nor ``"keep"``.
    """
    if value == "keep":
        return None
    allowed = (
        f"a time span (seconds, 30s, 5min, 1h) from 0 to {_MAX_REAP_AFTER / 86400:g}d, or 'keep'"
    )
    return _numbers.duration("reap_after", value, low=0, high=_MAX_REAP_AFTER, allowed=allowed)


def parse_property(name: str, value: object) -> tuple[str, str, Any]:
    """``(D-Bus property, signature, value)`` of one vetted property.

    Raises:
        InvalidConfig: not a vetted property, or a value out of its range.
    """
    if name in _REFUSED:
        raise InvalidConfig(name, value, f"not set by -p: {_REFUSED[name]}")
    if name not in PROPERTIES:
        raise InvalidConfig(
            "property", name, "one of " + ", ".join(sorted(PROPERTIES)) + " (NAME=VALUE)"
        )
    dbus, sig, _file, _ctl = PROPERTIES[name]
    parsed: Any
    if name == "TasksMax":
        parsed = _tasks(name, value)
    elif name in ("CPUWeight", "IOWeight"):
        parsed = _weight(name, value)
    elif name == "CPUQuota":
        parsed = _quota(name, value)
    elif name == "MemoryMax":
        parsed = _size(name, value, 1)
    elif name == "MemorySwapMax":
        parsed = _size(name, value, 0)
    else:
        parsed = _cpus(name, value)
    return dbus, sig, parsed


def scope_settings(
    memory_max: int | None,
    tasks_max: int | None,
    cpu_weight: int | None,
    io_weight: int | None,
    properties: Mapping[str, object] | None,
    reap_after: object,
) -> tuple[dict[str, tuple[str, Any]], float | None]:
    """A new scope's resource controls (:func:`build`) and its leftovers' grace.

    The one rule for what a launch, an adoption and ``agentscope exec``
    ask of a scope: the controls are checked first, then ``reap_after``
    (:func:`parse_reap_after`).

    Raises:
        InvalidConfig: as :func:`build` and :func:`parse_reap_after` say.
    """
    controls = build(
        memory_max=memory_max,
        tasks_max=tasks_max,
        cpu_weight=cpu_weight,
        io_weight=io_weight,
        properties=properties,
    )
    return controls, parse_reap_after(reap_after)


def build(
    *,
    memory_max: int | None = None,
    tasks_max: int | None = None,
    cpu_weight: int | None = None,
    io_weight: int | None = None,
    properties: Mapping[str, object] | None = None,
) -> dict[str, tuple[str, Any]]:
    """The resource properties of a scope, ``{D-Bus name: (signature, value)}``.

    ``memory_max`` also sets ``MemorySwapMax=0`` (no swap) unless
    ``properties`` gives one. A keyword and its property in ``properties``
    (``tasks_max`` and ``TasksMax``) may not both be given.

    Raises:
        InvalidConfig: a value out of range, an unknown or refused property,
            or one given twice.
    """
    given: dict[str, object] = {}
    keywords: tuple[tuple[str, str, object], ...] = (
        ("memory_max", "MemoryMax", memory_max),
        ("tasks_max", "TasksMax", tasks_max),
        ("cpu_weight", "CPUWeight", cpu_weight),
        ("io_weight", "IOWeight", io_weight),
    )
    if properties is not None and not callable(getattr(properties, "items", None)):
        # A list of "NAME=VALUE" texts (the CLI's -p form) ended in dict()'s ValueError.
        raise InvalidConfig(
            "properties", properties, "a mapping of property names to values, e.g. {'TasksMax': 64}"
        )
    for key, name, value in keywords:
        if value is None:
            continue
        if isinstance(value, str) or not isinstance(value, int) or isinstance(value, bool):
            raise InvalidConfig(key, value, "a whole number")
        if properties is not None and name in properties:
            raise InvalidConfig(key, value, f"given once: {name} is in properties too")
        given[name] = value
    given.update(properties or {})
    props: dict[str, tuple[str, Any]] = {}
    for name, raw in given.items():
        dbus, sig, parsed = parse_property(name, raw)
        props[dbus] = (sig, parsed)
    if "MemoryMax" in props and "MemorySwapMax" not in props:
        props["MemorySwapMax"] = ("t", MEMORY_MAX_DEFAULT_SWAP)
    return props


def _enforced(
    name: str, dbus: str, cgroup_files: Mapping[str, str | None], sent: Any
) -> str | None:
    """Why the kernel does not enforce ``name`` (None: it does, or cannot tell)."""
    _dbus, _sig, file, controller = next(p for p in PROPERTIES.values() if p[0] == dbus)
    if file not in cgroup_files:
        return None  # not read: no claim
    text = cgroup_files[file]
    if text is None:
        return f"the {controller} controller is not enabled for the scope ({file} is missing)"
    if dbus == "AllowedCPUs":
        effective = cgroup_files.get("cpuset.cpus.effective")
        if effective and _cpus(name, effective) != bytes(sent).rstrip(b"\0"):
            return f"the kernel gives the scope CPUs {effective} only"
    return None


def compare(
    sent: Mapping[str, tuple[str, Any]],
    read: Mapping[str, Any],
    cgroup_files: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """What systemd and the kernel did not take of ``sent``: one dict per property.

    ``read`` is the scope's properties as systemd reports them (``GetAll``
    on its Scope interface); ``cgroup_files`` what the scope's cgroup files
    read (None for a missing file), when the caller read them. Each issue
    is ``{"property", "sent", "read", "reason"}`` with reason ``dropped``
    (systemd does not report it), ``changed`` (it holds another value) or
    ``not_enforced`` (with ``detail``). An empty list: all taken as sent.
    """
    issues: list[dict[str, Any]] = []
    names = {dbus: name for name, (dbus, *_rest) in PROPERTIES.items()}
    for dbus, (_sig, value) in sent.items():
        name = names.get(dbus)
        if name is None:
            continue  # not a resource control (Description, Slice...)
        shown = _show(dbus, value)
        if dbus not in read:
            issues.append({"property": name, "sent": shown, "read": None, "reason": "dropped"})
            continue
        got = read[dbus]
        if isinstance(got, list | bytearray):
            got = bytes(got)
        if isinstance(value, bytes) and isinstance(got, bytes):
            # a mask may come back with trailing zero bytes, or shorter
            equal = value.rstrip(b"\0") == got.rstrip(b"\0")
        else:
            equal = got == value
        if not equal:
            issues.append(
                {"property": name, "sent": shown, "read": _show(dbus, got), "reason": "changed"}
            )
            continue
        why = _enforced(name, dbus, cgroup_files or {}, value)
        if why is not None:
            issues.append(
                {
                    "property": name,
                    "sent": shown,
                    "read": shown,
                    "reason": "not_enforced",
                    "detail": why,
                }
            )
    return issues


def _show(dbus: str, value: Any) -> Any:
    """A property's value as a user wrote it (JSON-ready)."""
    if isinstance(value, bytes | bytearray):
        cpus = [i for i in range(len(value) * 8) if value[i // 8] >> (i % 8) & 1]
        return _ranges(cpus)
    if value == INFINITY:
        return "infinity"
    if dbus == "CPUQuotaPerSecUSec" and isinstance(value, int):
        return f"{value / 10000:g}%"
    return value


def _ranges(cpus: list[int]) -> str:
    out: list[str] = []
    for cpu in cpus:
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == cpu - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        elif out and "-" not in out[-1] and int(out[-1]) == cpu - 1:
            out[-1] = f"{out[-1]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def cgroup_checks(sent: Mapping[str, tuple[str, Any]]) -> list[str]:
    """The cgroup files of a scope that say whether ``sent`` is enforced."""
    files = [p[2] for p in PROPERTIES.values() if p[0] in sent]
    if "cpuset.cpus" in files:
        files.append("cpuset.cpus.effective")
    return files


def read_cgroup_files(
    cgroup: str | os.PathLike[str], sent: Mapping[str, tuple[str, Any]]
) -> dict[str, str | None]:
    """The files of :func:`cgroup_checks` in the scope's cgroup (None: missing)."""
    out: dict[str, str | None] = {}
    for name in cgroup_checks(sent):
        try:
            with open(os.path.join(cgroup, name), "rb") as f:
                out[name] = f.read(4096).decode(errors="replace").strip()
        except FileNotFoundError:
            out[name] = None
        except OSError:
            continue  # unreadable (gone meanwhile, a permission): no claim
    if not os.path.isdir(cgroup):
        return {}  # the scope ended meanwhile: its files say nothing
    return out


def describe(unit: str, issue: Mapping[str, Any]) -> str:
    """One line for the log: what happened to a property of ``unit``."""
    name, sent = issue["property"], issue["sent"]
    if issue["reason"] == "dropped":
        return f"{unit}: systemd did not keep {name}={sent} (it does not report it)"
    if issue["reason"] == "changed":
        return f"{unit}: systemd holds {name}={issue['read']}, not the {sent} asked for"
    return f"{unit}: {name}={sent} is not enforced: {issue.get('detail', '')}"
