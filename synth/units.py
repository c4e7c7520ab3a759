"""Quantities as people write them ("25 GB/s", "5 us", "256MiB") parsed into SI base units.

Topology files and CLI options carry units in the text, so a figure can be checked against
its spec sheet as written; everything inside the engine is bytes/s, seconds and bytes.
`b` is a bit and `B` a byte; `k M G T P` are decimal (powers of 1000) and `Ki Mi Gi Ti Pi`
binary (powers of 1024), as in SI and IEC 80000-13. `K` is read as `k`.
Every malformed, non-positive or wrongly-dimensioned value is a one-line UsageError that
names the value and shows a valid one.
"""

from __future__ import annotations

import math
import re

from synth.errors import UsageError

BANDWIDTH_EXAMPLE = "25 GB/s"
TIME_EXAMPLE = "5 us"
BYTES_EXAMPLE = "256MiB"

_NUMBER = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*\Z", re.DOTALL)
_PREFIXES = {
    "": 1,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_PREFIX = r"(?P<prefix>[kKMGTP]i?|)"
_BANDWIDTH_UNIT = re.compile(_PREFIX + r"(?P<base>B|b|bit)(?:/s|ps)\Z")
_SIZE_UNIT = re.compile(_PREFIX + r"(?P<base>B|b|bit)\Z")
# Divisors rather than factors: 5 / 1e6 is exactly the float nearest 5e-6, 5 * 1e-6 is not.
_TIMES = {"s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "\u03bcs": 1e6, "ns": 1e9}


def _fail(value, what: str, example: str, where: str | None, why: str = "") -> UsageError:
    prefix = f"{where}: " if where else ""
    reason = why or f"is not {what}"
    return UsageError(f"{prefix}{value!r} {reason}; write e.g. \"{example}\"")


def _kind_of_unit(unit: str) -> str | None:
    """Name the dimension a unit belongs to, so a wrong one gets a precise message."""
    if _BANDWIDTH_UNIT.match(unit):
        return "a bandwidth"
    if unit in _TIMES:
        return "a time"
    if _SIZE_UNIT.match(unit):
        return "a size"
    return None


def _split(text, what: str, example: str, where: str | None) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, str):
        raise _fail(text, what, example, where, f"is not {what} (expected a string with a unit)")
    match = _NUMBER.match(text)
    if not match:
        raise _fail(text, what, example, where)
    number = float(match.group(1))
    if not math.isfinite(number):
        raise _fail(text, what, example, where)
    return number, match.group(2)


def _check_positive(number: float, text, what: str, example: str, where: str | None) -> None:
    if number <= 0:
        raise _fail(text, what, example, where, f"is not a positive {what.removeprefix('a ')}")


def _wrong_unit(text, unit: str, what: str, example: str, where: str | None) -> UsageError:
    if not unit:
        return _fail(text, what, example, where, "has no unit")
    kind = _kind_of_unit(unit)
    if kind is not None and kind != what:
        return _fail(text, what, example, where, f"is {kind}, not {what}")
    return _fail(text, what, example, where)


def parse_bandwidth(text: str, where: str | None = None) -> float:
    """'300 GB/s' -> 3e11 bytes/s. Bits (b, bit) are divided by 8; '/s' may be written 'ps'."""
    what = "a bandwidth"
    number, unit = _split(text, what, BANDWIDTH_EXAMPLE, where)
    match = _BANDWIDTH_UNIT.match(unit)
    if not match:
        raise _wrong_unit(text, unit, what, BANDWIDTH_EXAMPLE, where)
    _check_positive(number, text, what, BANDWIDTH_EXAMPLE, where)
    scale = _PREFIXES[match.group("prefix")]
    if match.group("base") != "B":
        scale /= 8
    return number * scale


def parse_time(text: str, where: str | None = None) -> float:
    """'5 us' -> 5e-6 seconds. Microseconds may be written us, µs (micro sign) or μs (mu)."""
    what = "a time"
    number, unit = _split(text, what, TIME_EXAMPLE, where)
    if unit not in _TIMES:
        raise _wrong_unit(text, unit, what, TIME_EXAMPLE, where)
    _check_positive(number, text, what, TIME_EXAMPLE, where)
    return number / _TIMES[unit]


def parse_bytes(text: str | int, where: str | None = None) -> int:
    """'256MiB' -> 268435456. A bare number is bytes; the result must be a whole number of bytes.

    Bits are refused: a buffer size in bits is almost always a typo for bytes.
    """
    what = "a byte size"
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise _fail(text, what, BYTES_EXAMPLE, where, "is not a positive byte size")
        return text
    number, unit = _split(text, what, BYTES_EXAMPLE, where)
    match = _SIZE_UNIT.match(unit) if unit else None
    if unit and (not match or match.group("base") != "B"):
        if match:
            raise _fail(text, what, BYTES_EXAMPLE, where, "is in bits; sizes are in bytes (B)")
        kind = _kind_of_unit(unit)
        why = f"is {kind}, not {what}" if kind and kind != "a size" else f"is not {what}"
        raise _fail(text, what, BYTES_EXAMPLE, where, why)
    _check_positive(number, text, what, BYTES_EXAMPLE, where)
    scale = _PREFIXES[match.group("prefix")] if match else 1
    # Integer arithmetic where possible so 'GiB' sizes stay exact.
    mantissa = _whole_number(text)
    value = mantissa * scale if mantissa is not None and isinstance(scale, int) else number * scale
    if value != int(value):
        raise _fail(text, what, BYTES_EXAMPLE, where, "is not a whole number of bytes")
    return int(value)


def _whole_number(text: str) -> int | None:
    """The integer written at the start of `text`, or None when it has a fraction or exponent."""
    match = re.match(r"\s*\+?(\d+)(?![\d.eE])", text)
    return int(match.group(1)) if match else None


def _scaled(value: float, steps: list[tuple[float, str]], digits: int) -> str:
    for scale, unit in steps:
        if value >= scale:
            return f"{value / scale:.{digits}g} {unit}"
    scale, unit = steps[-1]
    return f"{value / scale:.{digits}g} {unit}"


def format_bandwidth(bytes_per_second: float, digits: int = 4) -> str:
    """3e11 -> '300 GB/s': decimal bytes, the convention of spec sheets and nccl-tests."""
    steps = [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1, "B/s")]
    return _scaled(bytes_per_second, steps, digits)


def format_time(seconds: float, digits: int = 4) -> str:
    """5e-6 -> '5 us'."""
    steps = [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]
    return _scaled(seconds, steps, digits)


def format_bytes(count: int, digits: int = 4) -> str:
    """268435456 -> '256 MiB': binary units, as buffer sizes are usually powers of two."""
    steps = [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")]
    return _scaled(count, steps, digits)
