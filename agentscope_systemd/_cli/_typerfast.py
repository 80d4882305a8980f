"""Typer's value conversion without pydantic for the plain values the CLI takes.

typer 0.29 converts every option's value with a pydantic ``TypeAdapter``,
built on the first value it sees: importing pydantic costs every command
about 65 ms natively, ``agentscope ls`` included (issue 28). The values our
commands take are plain: ``str``, ``bool``, ``int`` and ``float`` with a
lower bound, an enum, a list of ``str``. :func:`quicken` gives each such
parameter a converter that takes the plain spellings itself (``5``,
``0.5``, ``user``) and hands anything else to typer's own converter, built
then: an unusual spelling or a bad value gets exactly typer's answer and
message, at typer's cost. A parameter with a ``parser=`` (the number
grammar's options, agentscope_systemd/_cli/_parse.py) is converted by its parser, as typer's
converter does it (typer wraps the parser in a pydantic validator and adds
nothing); a value the parser refuses goes to typer's converter, which calls
the parser again and reports its refusal as typer does. ``tests/
test_cli_fast.py`` checks that both give the same value wherever the
quick one answers.

With a typer that converts through click's types (0.28 and older) there is
nothing to do, and nothing is done.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["QuickHelp", "quick_value", "quicken"]


class _Unknown:
    """The quick converter cannot tell: typer's own converter decides."""


UNKNOWN: Any = _Unknown()
_MAX_DIGITS = 15  # a float holds 15 significant digits exactly


def quick_value(annotation: Any, info: Any, value: Any) -> Any:
    """``value`` converted for ``annotation`` as typer would, or :data:`UNKNOWN`."""
    if getattr(info, "click_type", None) is not None:
        return UNKNOWN
    parser = getattr(info, "parser", None)
    if parser is not None:
        return _parsed(parser, annotation, value)
    if annotation is str:
        return value if isinstance(value, str) else UNKNOWN
    if annotation is bool:
        return value if isinstance(value, bool) else UNKNOWN
    if annotation is int or annotation is float:
        return _number(annotation, info, value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if getattr(info, "case_sensitive", True) is not True or not isinstance(value, str):
            return UNKNOWN
        for member in annotation:
            if member.value == value:
                return member
        return UNKNOWN
    if (
        getattr(annotation, "__origin__", None) is list
        and annotation.__args__ == (str,)
        and isinstance(value, list | tuple)
        and all(isinstance(v, str) for v in value)
    ):
        return list(value)
    return UNKNOWN


def _parsed(parser: Any, annotation: Any, value: Any) -> Any:
    """``value`` through the parameter's own ``parser``, item by item for a list (as
    typer applies it); :data:`UNKNOWN` where the parser refuses it."""
    if getattr(annotation, "__origin__", None) is list:
        if not isinstance(value, list | tuple):
            return UNKNOWN
        items = [_parsed(parser, None, item) for item in value]
        return UNKNOWN if any(item is UNKNOWN for item in items) else items
    if getattr(annotation, "__origin__", None) is tuple:
        return UNKNOWN
    try:
        return parser(value)
    except Exception:  # typer's converter calls it again and reports its refusal
        return UNKNOWN


def _number(annotation: type, info: Any, value: Any) -> Any:
    if getattr(info, "clamp", False) or isinstance(value, bool):
        return UNKNOWN
    if isinstance(value, str):
        number = _plain_number(value, fraction=annotation is float)
        if number is None:
            return UNKNOWN
        value = annotation(number)
    elif type(value) is not annotation:
        return UNKNOWN
    if value != value or value in (float("inf"), float("-inf")):
        return UNKNOWN
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if (low is not None and value < low) or (high is not None and value > high):
        return UNKNOWN  # typer's message says what the bound is
    return value


def _plain_number(text: str, *, fraction: bool) -> str | None:
    """``text`` if it is ``-?digits`` (with ``.digits`` when ``fraction``), else None."""
    digits = text[1:] if text.startswith("-") else text
    whole, dot, part = digits.partition(".")
    if dot and not fraction:
        return None
    if not _digits(whole) or (dot and not _digits(part)):
        return None
    if len(whole) + len(part) > _MAX_DIGITS:
        return None
    return text


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


class _QuickParam:
    """A typer parameter's converter: :func:`quick_value`, else typer's own."""

    __slots__ = ("_descriptor", "_slow")

    def __init__(self, descriptor: Any) -> None:
        self._descriptor = descriptor
        self._slow: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        quick = quick_value(self._descriptor.annotation, self._descriptor.parameter_info, value)
        if quick is not UNKNOWN:
            return quick
        return self.slow().coerce(value, param=param, ctx=ctx)

    def slow(self) -> Any:
        """typer's own converter of this parameter (pydantic), built on first use."""
        if self._slow is None:
            from typer import core

            self._slow = core.build_runtime_param(self._descriptor)  # type: ignore[attr-defined]
        return self._slow

    def __getattr__(self, name: str) -> Any:
        return getattr(self.slow(), name)


def quicken(command: Any) -> Any:
    """Give ``command``'s parameters :class:`_QuickParam` converters; returns ``command``.

    The help option, made per command when a context first asks for it, is
    given its converter by :class:`QuickHelp`.
    """
    for param in getattr(command, "params", ()):
        _quicken_param(param)
    return command


def _quicken_param(param: Any) -> Any:
    if getattr(param, "_runtime_param", False) is None and hasattr(param, "type_descriptor"):
        param._runtime_param = _QuickParam(param.type_descriptor)
    return param


class QuickHelp:
    """Mixed into a click command: its ``-h``/``--help`` option converts like the others."""

    def get_help_option(self, ctx: Any) -> Any:
        return _quicken_param(super().get_help_option(ctx))  # type: ignore[misc]
