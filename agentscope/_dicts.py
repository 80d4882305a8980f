"""JSON-ready dicts of the library's frozen dataclasses, for ``to_dict``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import PurePath
from typing import Any


def as_dict(obj: Any) -> dict[str, Any]:
    """``obj``'s dataclass fields, in order, as a JSON-ready dict.

    A value with its own ``to_dict`` is converted with it, tuples and lists
    become lists, mappings dicts and paths strings; anything else is kept.
    """
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, PurePath):
        return str(value)
    return value
