"""Parsing of what users type: sizes, times, durations, signals, ``K=V``.

Plain functions, no I/O, and only light standard-library imports: the
``exec`` fast path uses them before it execs.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Callable
from datetime import datetime

from agentscope_systemd import _numbers
from agentscope_systemd._errors import InvalidConfig

from ._errors import BadInput

__all__ = [
    "duration_option",
    "parse_duration",
    "parse_env",
    "parse_signal",
    "parse_since",
    "parse_size",
    "physical_memory",
    "real_option",
    "whole_option",
]

_NUMBER_HINT = "ASCII digits"


def physical_memory() -> int:
    """This machine's RAM in bytes, as systemd counts it for ``MemoryMax=50%``."""
    return _numbers.physical_memory()


def parse_size(
    text: str, *, physical: int | None = None, option: str = "--memory-max"
) -> int | None:
    """Bytes from a size as systemd takes it for ``MemoryMax=``; None for ``infinity``.

    ``4096``, ``512K``, ``4G``, ``1.5GiB``, ``2TB`` (K/M/G/T/P/E in powers
    of 1024, an optional ``B`` or ``iB``), ``50%`` (of ``physical`` bytes,
    by default this machine's RAM, rounded down to whole pages as systemd
    does), or ``infinity`` (no limit); from 1 byte to 8 EiB
    (:func:`agentscope_systemd._numbers.size`, the one size grammar).

    Raises:
        BadInput: zero, negative, more than 100 % or 8 EiB, or not a size.
    """
    try:
        return _numbers.size(option, text, physical=physical)
    except InvalidConfig as exc:
        raise BadInput(str(exc)) from None


def parse_duration(text: str, *, option: str = "duration") -> float:
    """Seconds from a systemd time span: ``90``, ``30s``, ``10min``, ``1h30min``, ``500ms``, ``7d``.

    Units as systemd.time(7) spells them (``m`` and ``min`` are minutes,
    ``M`` months); parts add up, with or without spaces between them
    (:func:`agentscope_systemd._numbers.duration`).

    Raises:
        BadInput: not a time span, or more than 100 years.
    """
    try:
        return _numbers.duration(option, text)
    except InvalidConfig as exc:
        raise BadInput(str(exc)) from None


def parse_since(text: str, now: float) -> float:
    """A unix time from a point in time as ``journalctl --since`` takes it.

    Unix seconds (``1714567890``, ``@1714567890``), ISO 8601 (local time
    without a zone), ``now``, ``today``, ``yesterday``, ``tomorrow``, a time
    relative to now (``-1h``, ``+30min``, ``2h ago``), or a bare time span,
    which means that long ago (``10m``, ``1h30min``).

    Raises:
        BadInput: none of these.
    """
    stripped = text.strip()
    unix = stripped.removeprefix("@")
    if _UNIX.fullmatch(unix):
        seconds = float(unix)
        if not math.isfinite(seconds):
            raise BadInput(f"time {text!r} is not a time; give unix seconds like 1714567890")
        return seconds
    word = stripped.lower()
    if word == "now":
        return now
    if word in _DAYS:
        midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight.timestamp() + _DAYS[word] * 86400
    sign, span = -1.0, stripped
    if stripped[:1] in ("+", "-"):
        sign, span = (1.0 if stripped[0] == "+" else -1.0), stripped[1:]
    elif word.endswith(" ago"):
        span = stripped[: -len(" ago")]
    if _numbers.is_digits(span[:1]) or span[:1] == ".":
        try:
            return now + sign * parse_duration(span)
        except BadInput:
            if stripped[:1] in ("+", "-") or word.endswith(" ago"):
                raise
    try:
        return datetime.fromisoformat(stripped.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadInput(
            f"time {text!r} is not a time; use unix seconds, ISO 8601 "
            "(2024-05-01T12:00:00), now, today, yesterday, or a time relative to now "
            "like -1h, -10min or 2h ago"
        ) from None


_DAYS = {"today": 0, "yesterday": -1, "tomorrow": 1}
_UNIX = re.compile(r"[+-]?(?:[0-9]{1,12}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})", re.ASCII)


def parse_signal(text: str) -> signal.Signals:
    """A signal from ``TERM``, ``SIGTERM``, ``sigkill`` or ``9``.

    Raises:
        BadInput: no such signal.
    """
    stripped = text.strip()
    try:
        if _numbers.is_digits(stripped):
            return signal.Signals(_numbers.whole("signal", stripped, low=1, high=64))
        name = stripped.upper()
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):  # InvalidConfig is a ValueError
        raise BadInput(
            f"no signal {text!r}; use a name like TERM, SIGKILL or HUP, or a number like 9"
        ) from None


def parse_env(items: list[str]) -> dict[str, str]:
    """``{"K": "V"}`` from ``["K=V", ...]``.

    Raises:
        BadInput: an item without ``=`` or with an empty name.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--env {item!r} is not NAME=VALUE")
        out[key] = value
    return out


def whole_option(option: str, low: int, high: int) -> Callable[[object], int]:
    """A typer ``parser=`` for a whole-number option in ``low..high`` (ASCII digits).

    Typer's own ``int`` takes ``٣`` and has no upper bound; this is
    :func:`agentscope_systemd._numbers.whole`, the one grammar, with the option's
    name in the message.
    """

    def parse(value: object) -> int:
        return _numbers.whole(option, value, low=low, high=high)

    return parse


def real_option(
    option: str, low: float, high: float, *, above_low: bool = False
) -> Callable[[object], float]:
    """A typer ``parser=`` for a finite real option in ``low..high`` (no NaN, no inf)."""

    def parse(value: object) -> float:
        return _numbers.real(option, value, low=low, high=high, above_low=above_low)

    return parse


def duration_option(option: str, low: float, high: float) -> Callable[[object], float]:
    """A typer ``parser=`` for a time option: seconds from a systemd time span in ``low..high``.

    Every time option of the command line takes systemd.time(7)'s spans
    (``90``, ``500ms``, ``1min 30s``, ``2h``; a bare number is seconds):
    :func:`agentscope_systemd._numbers.duration`, the one grammar, with the
    option's name in the message.
    """

    def parse(value: object) -> float:
        return _numbers.duration(option, value, low=low, high=high)

    return parse
