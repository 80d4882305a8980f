"""Parsing of what users type: sizes, times, durations, signals, ``K=V``.

Plain functions, no I/O, and only light standard-library imports: the
``exec`` fast path uses them before it execs.
"""

from __future__ import annotations

import math
import os
import re
import signal
from datetime import datetime

from ._errors import BadInput

__all__ = [
    "parse_duration",
    "parse_env",
    "parse_signal",
    "parse_since",
    "parse_size",
    "physical_memory",
]

_SIZE = re.compile(r"(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgtpe]?)(?:i?b)?", re.IGNORECASE)
_PERCENT = re.compile(r"(?P<whole>\d{1,3})(?:\.(?P<frac>\d{1,2}))?\s*%")
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50, "e": 2**60}
_INFINITY = "infinity"
_MAX_DURATION = 100 * 365.25 * 86400
# systemd.time(7)'s time spans, spelled (and cased) as systemd takes them:
# "M" is a month there, "m" a minute.
_SPAN_UNITS = {
    **dict.fromkeys(("usec", "us", "\u00b5s", "\u03bcs"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s", ""), 1.0),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 7 * 86400.0),
    **dict.fromkeys(("months", "month", "M"), 30.44 * 86400),
    **dict.fromkeys(("years", "year", "y"), 365.25 * 86400),
}
_SPAN_PART = re.compile(r"\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[^\W\d_]*)")
_SPAN_HINT = "a time span like 90s, 10min, 1h30min, 500ms or 7d (systemd.time(7))"


def physical_memory() -> int:
    """This machine's RAM in bytes, as systemd counts it for ``MemoryMax=50%``."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_size(text: str, *, physical: int | None = None) -> int | None:
    """Bytes from a size as systemd takes it for ``MemoryMax=``; None for ``infinity``.

    ``4096``, ``512K``, ``4G``, ``1.5GiB``, ``2TB`` (K/M/G/T/P/E in powers
    of 1024, an optional ``B`` or ``iB``), ``50%`` (of ``physical`` bytes,
    by default this machine's RAM, rounded down to whole pages as systemd
    does), or ``infinity`` (no limit).

    Raises:
        BadInput: zero, negative, more than 100 %, or not a size.
    """
    stripped = text.strip()
    if stripped.lower() == _INFINITY:
        return None
    if stripped.startswith("-"):
        raise BadInput(f"size {text!r} is negative; give a positive size like 512M or 4G")
    pct = _PERCENT.fullmatch(stripped)
    if pct is not None:
        return _percent_of_memory(text, pct, physical)
    m = _SIZE.fullmatch(stripped)
    if m is None:
        raise BadInput(
            f"size {text!r} is not a size; use bytes or a K/M/G/T suffix "
            "(powers of 1024), a percentage of RAM or infinity, like 4096, 512M, "
            "1.5G, 2GiB, 50% or infinity"
        )
    if len(m["num"]) > 40:  # past 2^64 in any unit (and int() caps digits at 4300)
        raise BadInput(f"size {text!r} is 2^64 bytes or more; systemd takes at most 16 EiB")
    # Exact integers, never a float: 9007199254740993 must stay itself.
    whole, _, frac = str(m["num"]).partition(".")
    scale: int = 10 ** len(frac)
    scaled = (int(whole or "0") * scale + int(frac or "0")) * _UNITS[m["unit"].lower()]
    value, rest = divmod(scaled, scale)
    if rest:
        raise BadInput(f"size {text!r} is not a whole number of bytes")
    if value < 1:
        raise BadInput(f"size {text!r} is zero; give a positive size like 512M or 4G")
    if value >= 2**64:
        raise BadInput(f"size {text!r} is 2^64 bytes or more; systemd takes at most 16 EiB")
    return value


def _percent_of_memory(text: str, m: re.Match[str], physical: int | None) -> int:
    permyriad = int(m["whole"]) * 100 + int((m["frac"] or "").ljust(2, "0"))
    if not 0 < permyriad <= 10000:
        raise BadInput(f"size {text!r} is not a share of RAM; give more than 0% and at most 100%")
    # systemd's physical_memory_scale(): whole pages, rounded down.
    page = os.sysconf("SC_PAGE_SIZE")
    total = physical_memory() if physical is None else physical
    return max(page, total // page * permyriad // 10000 * page)


def parse_duration(text: str) -> float:
    """Seconds from a systemd time span: ``90``, ``30s``, ``10min``, ``1h30min``, ``500ms``, ``7d``.

    Units as systemd.time(7) spells them (``m`` and ``min`` are minutes,
    ``M`` months); parts add up, with or without spaces between them.

    Raises:
        BadInput: not a time span, or more than 100 years.
    """
    stripped = text.strip()
    total, pos = 0.0, 0
    for m in _SPAN_PART.finditer(stripped):
        if m.start() != pos:
            break
        factor = _SPAN_UNITS.get(m["unit"])
        if factor is None:
            raise BadInput(f"duration {text!r} has no unit {m['unit']!r}; use {_SPAN_HINT}")
        total += float(m["num"]) * factor
        pos = m.end()
    if not stripped or pos != len(stripped):
        raise BadInput(f"duration {text!r} is not a time span; use {_SPAN_HINT}")
    if not total <= _MAX_DURATION:
        raise BadInput(f"duration {text!r} is more than 100 years")
    return total


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
    try:
        seconds = float(stripped.removeprefix("@"))
    except ValueError:
        pass
    else:
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
    if span[:1].isdigit() or span[:1] == ".":
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


def parse_signal(text: str) -> signal.Signals:
    """A signal from ``TERM``, ``SIGTERM``, ``sigkill`` or ``9``.

    Raises:
        BadInput: no such signal.
    """
    stripped = text.strip()
    try:
        if stripped.isdigit():
            return signal.Signals(int(stripped))
        name = stripped.upper()
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
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
