"""Fleet, agent and unit names: validation and the unit naming scheme.

No I/O here; the async core and the CLI share these. Nothing heavy is
imported either (not even :mod:`re`, ~0.1 s under TCG): the ``exec`` fast
path validates and names with them.
"""

from __future__ import annotations

import os

from ._errors import InvalidName

__all__ = [
    "DEFAULT_SLICE",
    "describe",
    "is_unit_name",
    "parse_description",
    "resolve_manager",
    "scope_pattern",
    "scope_unit_name",
    "validate_name",
    "validate_slice",
]

DEFAULT_SLICE = "app-agentscope-agents.slice"
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_SLICE = r"[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*\.slice"


#: What a unit name may hold (systemd.unit(5): ASCII letters, digits, ":", "-",
#: "_", ".", "\\", and "@" of a template's instance).
_UNIT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_.-@\\")


def is_unit_name(text: str) -> bool:
    """Whether ``text`` may be a unit's name: 1 to 255 of the unit characters.

    The one check of a unit name read from a cgroup path or a file (the
    kernel's OOM lines, ``/proc/PID/cgroup``, a stored watermark): a path a
    process chose must not pass as a unit. The suffix is the caller's.
    """
    return 0 < len(text) <= 255 and set(text) <= _UNIT_CHARS


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid fleet or agent name, else raise :class:`InvalidName`.

    Valid: 1-64 characters of ``[A-Za-z0-9._-]``, not starting with ``.`` or ``-``.
    """
    if not isinstance(name, str):
        raise InvalidName(kind, name, f"must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidName(kind, name, "must not be empty")
    if len(name) > 64:
        raise InvalidName(kind, name, f"is {len(name)} characters long")
    if name[0] in ".-":
        raise InvalidName(kind, name, f"starts with {name[0]!r}")
    bad = sorted(set(name) - _NAME_CHARS)
    if bad:
        raise InvalidName(kind, name, f"contains {''.join(bad)!r}")
    return name


def validate_slice(name: object) -> str:
    """Return ``name`` if it is a plausible slice unit name, else raise :class:`InvalidName`."""
    import re

    if not isinstance(name, str) or not re.fullmatch(_SLICE, name) or len(name) > 255:
        raise InvalidName(
            "slice", name, "not a slice unit name", f"use a name like {DEFAULT_SLICE}"
        )
    return name


def scope_unit_name(fleet: str, agent: str, token: str | None = None) -> str:
    """The unit name of one launch: unique, since a scope name is once-only.

    At most 11 + 64 + 1 + 64 + 1 + 6 + 6 = 153 characters, well inside
    systemd's 255.
    """
    return f"agentscope-{fleet}-{agent}-{token or os.urandom(3).hex()}.scope"


def scope_pattern(fleet: str, agent: str | None = None) -> str:
    """A ListUnitsByPatterns glob for a fleet's scopes (or one agent's)."""
    return f"agentscope-{fleet}-{agent}-??????.scope" if agent else f"agentscope-{fleet}-*.scope"


def describe(fleet: str, agent: str) -> str:
    """The scope's Description, which names fleet and agent unambiguously.

    Unit names alone are ambiguous (fleet ``a-b`` agent ``c`` and fleet
    ``a`` agent ``b-c`` give the same prefix), so listings read this back.
    """
    return f"agentscope agent {agent} of fleet {fleet}"


def parse_description(description: str) -> tuple[str, str] | None:
    """(fleet, agent) from a Description written by :func:`describe`, else None."""
    words = description.split(" ")
    if len(words) != 6 or words[:2] != ["agentscope", "agent"] or words[3:5] != ["of", "fleet"]:
        return None
    return (words[5], words[2]) if words[2] and words[5] else None


#: The manager modes (_modes.py, #27): their state and runtime directories
#: are the system's for root, the user's otherwise, as ``auto``'s are.
MODES = ("systemd", "cgroup", "process")


def resolve_manager(manager: str) -> str:
    """``auto`` means the system manager for root, the user manager otherwise.

    The one place of this rule (the fleet's bus, exec's fast path). A mode
    (``systemd``, ``cgroup``, ``process``) resolves as ``auto`` does: whose
    directories the fleet uses.

    Raises:
        ValueError: not ``auto``, ``system``, ``user`` or a mode.
    """
    if manager == "auto" or manager in MODES:
        return "system" if os.geteuid() == 0 else "user"
    if manager not in ("system", "user"):
        raise ValueError(
            "manager must be 'auto', 'system', 'user', 'systemd', 'cgroup' or 'process', "
            f"not {manager!r}"
        )
    return manager
