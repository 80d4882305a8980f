"""The one number grammar: every count, size, weight, interval, port and limit.

Every CLI option, environment variable, config field and API argument that
holds a number goes through these functions, so that they all take the same
spellings and refuse the same way (:class:`InvalidConfig`, naming the field
and its range, before any I/O):

- digits are ASCII ``0-9`` only: :meth:`str.isdigit` and :func:`int` also
  take ``²``, ``٣`` (Arabic-Indic) or ``1_000``, none of which a user means
  as a number here;
- every field has bounds, and a value outside them is refused, never
  clamped;
- a real number is finite: ``nan``, ``inf`` and ``1e309`` are refused where a
  finite value is meant (``infinity`` is a word of its own where a field
  takes it, like ``MemoryMax=infinity``);
- texts are short: at most :data:`MAX_DIGITS` digits, so that no parse does
  quadratic work or holds memory for a number no field takes.

Plain functions over :mod:`os` only, no :mod:`re`: the ``exec`` fast path
imports this module before it execs, and pays for every import under TCG.
"""

from __future__ import annotations

import os

from ._errors import InvalidConfig
from ._typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable

__all__ = [
    "MAX_DIGITS",
    "MAX_SIZE",
    "duration",
    "is_digits",
    "physical_memory",
    "real",
    "size",
    "whole",
]

MAX_DIGITS = 40
"""The longest number, in digits, any field takes (2^128 has 39)."""

MAX_SIZE = 2**63
"""The largest size in bytes: 8 EiB (systemd's 2^64 - 1 means "infinity")."""

_BLANKS = " \t\n"
_INF = float("inf")
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50, "e": 2**60}
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
_SPAN_HINT = "a time span like 90s, 10min, 1h30min, 500ms or 7d (systemd.time(7))"
_NUMBER_CHARS = frozenset("0123456789.")
_UNIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\u00b5\u03bc")


def _not_a_number(field: str, value: object, allowed: str) -> InvalidConfig:
    return InvalidConfig(field, value, allowed, problem="is not a number this field takes")


def is_digits(text: str | bytes) -> bool:
    """Whether ``text`` is one or more ASCII digits (``str.isdigit`` also takes ``²``)."""
    return bool(text) and text.isascii() and text.isdigit()


def _isfinite(number: float) -> bool:
    return number == number and -_INF < number < _INF  # NaN != NaN


def _decimal(text: str) -> bool:
    """``1``, ``1.5``, ``1.``, ``.5``: ASCII digits with at most one dot."""
    head, _dot, tail = text.partition(".")
    return (
        (bool(head) or bool(tail))
        and (not head or is_digits(head))
        and (not tail or is_digits(tail))
    )


def _from_text(
    field: str,
    value: object,
    what: str,
    spelt: Callable[[str], bool],
    read: Callable[[str], object],
) -> object:
    """``value`` as given, or the number its text stands for (blanks around it stripped).

    The one rule of :func:`whole` and :func:`real` for a text: ``spelt``
    says whether it is spelt as the field takes it, ``read`` converts it.
    """
    if not isinstance(value, str):
        return value
    text = value.strip(_BLANKS)
    if not spelt(text):
        raise _not_a_number(field, value, what)
    return read(text)


def _real_text(text: str) -> bool:
    """A decimal with an optional sign and a short exponent (``-1.5e3``)."""
    body = text[1:] if text[:1] in "+-" else text
    mantissa, e, exponent = body.replace("E", "e").partition("e")
    if e:
        exponent = exponent[1:] if exponent[:1] in "+-" else exponent
        if not is_digits(exponent) or len(exponent) > 3:
            return False
    return len(mantissa) <= 2 * MAX_DIGITS and _decimal(mantissa)


def _whole_text(text: str) -> bool:
    body = text[1:] if text[:1] in "+-" else text
    return is_digits(body) and len(body) <= MAX_DIGITS


def whole(field: str, value: object, *, low: int, high: int, allowed: str | None = None) -> int:
    """A whole number from ``low`` to ``high``: an int, or a text of ASCII digits.

    A text may have blanks around it and a sign; nothing else (no ``_``,
    no ``1e3``, no ``2.0``). A bool is not a number here.

    Raises:
        InvalidConfig: not a whole number, or outside ``low..high``.
    """
    what = allowed or f"a whole number (ASCII digits) from {low} to {high}"
    number = _from_text(field, value, what, _whole_text, int)
    if not isinstance(number, int) or isinstance(number, bool):
        raise _not_a_number(field, value, what)
    if not low <= number <= high:
        raise InvalidConfig(field, value, what)
    return number


def real(
    field: str,
    value: object,
    *,
    low: float,
    high: float,
    above_low: bool = False,
    allowed: str | None = None,
) -> float:
    """A finite real number in ``low..high`` (``low`` excluded with ``above_low``).

    Takes an int, a float or a text such as ``2``, ``0.5``, ``.5`` or
    ``1e3`` (ASCII digits, an exponent of at most three digits). NaN and
    the infinities are refused.

    Raises:
        InvalidConfig: not a finite number, or outside the range.
    """
    span = f"above {low:g} and at most {high:g}" if above_low else f"from {low:g} to {high:g}"
    what = allowed or f"a finite number {span}"
    number = _from_text(field, value, what, _real_text, float)
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise _not_a_number(field, value, what)
    try:
        as_float = float(number)
    except OverflowError:  # an int past a double's range
        raise InvalidConfig(field, value, what) from None
    if not _isfinite(as_float) or not high >= as_float >= low:
        raise InvalidConfig(field, value, what)
    if above_low and as_float == low:
        raise InvalidConfig(field, value, what)
    return as_float


def size(
    field: str,
    value: object,
    *,
    low: int = 1,
    physical: int | None = None,
) -> int | None:
    """Bytes from a size as systemd takes it for ``MemoryMax=``; None for ``infinity``.

    ``4096``, ``512K``, ``4G``, ``1.5GiB``, ``2TB`` (K/M/G/T/P/E in powers of
    1024, an optional ``B`` or ``iB``), ``50%`` (of ``physical`` bytes, by
    default this machine's RAM, whole pages as systemd rounds it), or
    ``infinity``. An int is taken as bytes. The result is from ``low`` to
    :data:`MAX_SIZE` (8 EiB).

    Raises:
        InvalidConfig: not a size, a fraction of a byte, or out of range.
    """
    what = (
        f"a size from {low} byte{'s' if low != 1 else ''} to 8 EiB: bytes or a K/M/G/T/P/E "
        "suffix (powers of 1024), a percentage of RAM, or infinity; like 4096, 512M, 1.5G, "
        "2GiB, 50% or infinity"
    )
    if isinstance(value, int) and not isinstance(value, bool):
        if not low <= value <= MAX_SIZE:
            raise InvalidConfig(field, value, what)
        return value
    if not isinstance(value, str):
        raise _not_a_number(field, value, what)
    stripped = value.strip(_BLANKS)
    if stripped.lower() == "infinity":
        return None
    if stripped.endswith("%"):
        share = stripped[:-1].rstrip(" \t")
        head, dot, tail = share.partition(".")
        if not (
            is_digits(head) and len(head) <= 3 and (not dot or (is_digits(tail) and len(tail) <= 2))
        ):
            raise _not_a_number(field, value, what)
        permyriad = int(head) * 100 + int(tail.ljust(2, "0"))
        if not 0 < permyriad <= 10000:
            raise InvalidConfig(field, value, "a share of RAM above 0% and at most 100%")
        # systemd's physical_memory_scale(): whole pages, rounded down.
        page = os.sysconf("SC_PAGE_SIZE")
        total = physical_memory() if physical is None else physical
        return max(page, total // page * permyriad // 10000 * page)
    cut = 0
    while cut < len(stripped) and stripped[cut] in _NUMBER_CHARS:
        cut += 1
    num, rest = stripped[:cut], stripped[cut:].lstrip(" \t").lower()
    unit = rest[:1] if rest[:1] in _SIZE_UNITS else ""
    if not _decimal(num) or rest[len(unit) :] not in ("", "b", "ib"):
        raise _not_a_number(field, value, what)
    if len(num) > MAX_DIGITS:
        raise InvalidConfig(field, value, what)
    # Exact integers, never a float: 9007199254740993 must stay itself.
    whole_text, _, frac = num.partition(".")
    scale: int = 10 ** len(frac)
    scaled = (int(whole_text or "0") * scale + int(frac or "0")) * _SIZE_UNITS[unit]
    count, remainder = divmod(scaled, scale)
    if remainder:
        raise InvalidConfig(field, value, what, problem="is not a whole number of bytes")
    if not low <= count <= MAX_SIZE:
        raise InvalidConfig(field, value, what)
    return count


def physical_memory() -> int:
    """This machine's RAM in bytes, as systemd counts it for ``MemoryMax=50%``."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _past(text: str, pos: int, chars: str | frozenset[str]) -> int:
    """Where the run of ``chars`` that starts at ``pos`` of ``text`` ends."""
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def _span_text(seconds: float) -> str:
    """``seconds`` as the largest systemd unit that holds it whole: ``1d``, ``100ms``, ``90s``."""
    if seconds == _MAX_DURATION:
        return "100 years"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def duration(
    field: str,
    value: object,
    *,
    low: float = 0.0,
    high: float = _MAX_DURATION,
    allowed: str | None = None,
) -> float:
    """Seconds from a systemd time span: ``90``, ``30s``, ``10min``, ``1h30min``, ``500ms``, ``7d``.

    Units as systemd.time(7) spells them (``m`` and ``min`` are minutes,
    ``M`` months); parts add up, with or without blanks between them. An
    int or a float is taken as seconds. The result is finite and in
    ``low..high`` (by default at most 100 years). ``allowed`` replaces the
    message's description of what the field takes.

    Raises:
        InvalidConfig: not a time span, or out of range.
    """
    what = allowed or f"{_SPAN_HINT}, from {_span_text(low)} to {_span_text(high)}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return real(field, value, low=low, high=high, allowed=what)
    if not isinstance(value, str):
        raise InvalidConfig(field, value, what)
    stripped = value.strip(_BLANKS)
    total, pos, end = 0.0, 0, len(stripped)
    while pos < end:
        start = _past(stripped, pos, " \t")
        pos = _past(stripped, start, _NUMBER_CHARS)
        num = stripped[start:pos]
        unit_start = _past(stripped, pos, " \t")
        pos = _past(stripped, unit_start, _UNIT_CHARS)
        unit = stripped[unit_start:pos]
        if not _decimal(num) or len(num) > MAX_DIGITS:
            raise InvalidConfig(field, value, what, problem="is not a time span")
        factor = _SPAN_UNITS.get(unit)
        if factor is None:
            raise InvalidConfig(field, value, what, problem=f"has no unit {unit!r}")
        total += float(num) * factor
    if not stripped:
        raise InvalidConfig(field, value, what, problem="is not a time span")
    if not (_isfinite(total) and low <= total <= high):
        raise InvalidConfig(field, value, what)
    return total
