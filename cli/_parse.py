"""Parsing of what users type: sizes, times, durations, signals, ``K=V``.

Plain functions, no I/O, and only light standard-library imports: the
``exec`` fast path uses them before it execs.
"""

from __future__ import annotations

import math
import re
import signal
from datetime import datetime

from ._errors import BadInput

__all__ = ["parse_duration", "parse_env", "parse_signal", "parse_since", "parse_size"]

_SIZE = re.compile(r"(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgtp]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_DURATION = re.compile(r"(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>s|m|h|d|w)?", re.IGNORECASE)
_MAX_DURATION = 100 * 365.25 * 86400
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``512K``, ``4G``, ``1.5GiB``, ``2TB`` (powers of 1024).

    Raises:
        BadInput: zero, negative, or not a size.
    """
    stripped = text.strip()
    if stripped.startswith("-"):
        raise BadInput(f"size {text!r} is negative; give a positive size like 512M or 4G")
    m = _SIZE.fullmatch(stripped)
    if m is None:
        raise BadInput(
            f"size {text!r} is not a size; use bytes or a K/M/G/T suffix "
            "(powers of 1024), like 4096, 512M, 1.5G or 2GiB"
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


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``30s``, ``10m``, ``2h``, ``1d`` or ``1w``.

    Raises:
        BadInput: not a duration, or negative.
    """
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise BadInput(
            f"duration {text!r} is not a duration; "
            "use seconds or a s/m/h/d/w suffix, like 10m or 2h"
        )
    seconds = float(m["num"]) * _SECONDS[(m["unit"] or "").lower()]
    if not seconds <= _MAX_DURATION:
        raise BadInput(f"duration {text!r} is more than 100 years")
    return seconds


def parse_since(text: str, now: float) -> float:
    """A unix time from unix seconds, ISO 8601, or a time ago like ``10m``, ``2h``, ``1d``.

    An ISO time without a zone is local time.

    Raises:
        BadInput: none of these.
    """
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise BadInput(f"time {text!r} is not a time; give unix seconds like 1714567890")
        return seconds
    if _DURATION.fullmatch(stripped):
        return now - parse_duration(stripped)
    try:
        return datetime.fromisoformat(stripped.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadInput(
            f"time {text!r} is not a time; use unix seconds, ISO 8601 "
            "(2024-05-01T12:00:00), or a time ago like 10m, 2h or 1d"
        ) from None


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
