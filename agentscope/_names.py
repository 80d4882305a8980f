"""Fleet, agent and unit names: validation and the unit naming scheme.

No I/O here; the async core and the CLI share these.
"""

from __future__ import annotations

import re
import secrets

from ._errors import InvalidName

__all__ = [
    "DEFAULT_SLICE",
    "describe",
    "parse_description",
    "scope_pattern",
    "scope_unit_name",
    "validate_name",
    "validate_slice",
]

DEFAULT_SLICE = "app-agentscope-agents.slice"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_DESCRIPTION = re.compile(r"agentscope agent (?P<agent>\S+) of fleet (?P<fleet>\S+)")
_SLICE = re.compile(r"[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*\.slice")


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
    if not _NAME.fullmatch(name):
        bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
        raise InvalidName(kind, name, f"contains {''.join(bad)!r}")
    return name


def validate_slice(name: object) -> str:
    """Return ``name`` if it is a plausible slice unit name, else raise :class:`InvalidName`."""
    if not isinstance(name, str) or not _SLICE.fullmatch(name) or len(name) > 255:
        raise InvalidName(
            "slice", name, "not a slice unit name", f"use a name like {DEFAULT_SLICE}"
        )
    return name


def scope_unit_name(fleet: str, agent: str, token: str | None = None) -> str:
    """The unit name of one launch: unique, since a scope name is once-only.

    At most 11 + 64 + 1 + 64 + 1 + 6 + 6 = 153 characters, well inside
    systemd's 255.
    """
    return f"agentscope-{fleet}-{agent}-{token or secrets.token_hex(3)}.scope"


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
    m = _DESCRIPTION.fullmatch(description)
    return (m["fleet"], m["agent"]) if m else None
