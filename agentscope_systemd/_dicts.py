"""JSON-ready dicts of the library's frozen dataclasses, for ``to_dict``; JSON objects read back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import PurePath
from typing import Any, ClassVar

# Most values are these; checked first, they skip the conversions below (a
# report's to_dict converts hundreds of records).
_SCALARS = frozenset({int, float, str, bool, type(None)})
# dataclasses.fields() filters and rebuilds its tuple on every call.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


class Record:
    """A frozen record whose JSON-ready dict is its fields, in order (:func:`as_dict`).

    The one ``to_dict`` of the library's plain records (readings, reports,
    rows): tuples become lists, paths strings, nested records their dicts.
    A record that renders a field itself writes its own ``to_dict``.
    """

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return as_dict(self)


class Kinded:
    """An event record (the monitor's, the guard's): its dict is its ``kind``, then its fields.

    The one ``to_dict`` of the events that are their fields as they are
    (:func:`as_dict`); an event that renders a field itself (``LimitFound``)
    writes its own.
    """

    __slots__ = ()
    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event, with its ``kind``."""
        return {"kind": self.kind, **as_dict(self)}


def as_dict(obj: Any) -> dict[str, Any]:
    """``obj``'s dataclass fields, in order, as a JSON-ready dict.

    A value with its own ``to_dict`` is converted with it, tuples and lists
    become lists, mappings dicts and paths strings; anything else is kept.
    """
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in fields(obj))
    return {name: _plain(getattr(obj, name)) for name in names}


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:
        return value
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, PurePath):
        return str(value)
    return value


def json_object(raw: str | bytes) -> dict[str, Any] | None:
    """The JSON object ``raw`` holds; None for anything else (not JSON, or not an object).

    The first check of every record the library reads back from a file or
    a pipe (a journal entry, a call's event, a guard's kill line, a scope's
    record); each reader then checks the fields it takes.
    """
    try:
        doc = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        return None
    return doc if isinstance(doc, dict) else None
