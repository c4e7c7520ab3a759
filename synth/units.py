"""Quantities as people write them ("25 GB/s", "5 us", "256MiB") parsed into SI base units.

Topology files and CLI options carry units in the text, so a figure can be checked against
its spec sheet as written; everything inside the engine is bytes/s, seconds and bytes.
`b` is a bit and `B` a byte; `k M G T P` are decimal (powers of 1000) and `Ki Mi Gi Ti Pi`
binary (powers of 1024), as in SI and IEC 80000-13. `K` is read as `k`.

The size rule (docs/model.md section 8 states it for users; this is the one implementation):

* Sizes synth reads (`--bytes`, files): a unit written out says what it means, `256MiB` binary
  (2^20), `256MB` decimal (10^6); nccl-tests' form, a number and one bare letter (`8M`, `1G`:
  `K M G T` in either case), is binary, as nccl-tests reads it.
* The flags that mirror nccl-tests' own, `-b/--minbytes` and `-e/--maxbytes` (synth's sweeps
  and the scripts and C programs it exports), read a size as nccl-tests does: the letter
  after the number decides, whatever follows it, so `-b 1MB` is 2^20 bytes, as
  `all_reduce_perf -b 1MB` takes it (`parse_bytes(..., nccl_tests=True)`).

The exported scripts and C files carry copies of both that tests hold to these.

Every malformed, non-positive, non-finite, absurdly large or wrongly-dimensioned value is a
one-line UsageError that names the value and shows a valid one; no input overflows.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from synth.errors import UsageError

BANDWIDTH_EXAMPLE = "25 GB/s"
TIME_EXAMPLE = "5 us"
BYTES_EXAMPLE = "256MiB"

# The largest values taken: beyond them no buffer, link or latency is meant, and products of
# them stay far from float overflow. A byte size of more than 1 PiB per device is a typo.
MAX_BYTES = 2**50
MAX_BANDWIDTH = 1e18  # bytes/s: 8 Eb/s
MAX_TIME = 86400.0  # seconds: a day

# ASCII digits only: Python's \d and float() also take other scripts' digits ("١MiB" is 1 MiB to
# them), which no exported script, nccl-tests or spec sheet reads alike.
_NUMBER = re.compile(r"\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(.*?)\s*\Z", re.DOTALL)
_PREFIXES = {
    "": 1,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_PREFIX = r"(?P<prefix>[kKMGTP]i?|)"
_BANDWIDTH_UNIT = re.compile(_PREFIX + r"(?P<base>B|b|bit)(?:/s|ps)\Z")
_SIZE_UNIT = re.compile(_PREFIX + r"(?P<base>B|b|bit)\Z")
_NCCL_TESTS_SUFFIX = re.compile(r"[kKmMgGtT]\Z")  # nccl-tests' -b/-e letters, binary
_NCCL_TESTS_FLAG_UNIT = re.compile(r"([kKmMgGtTpP])i?B?\Z")  # what nccl-tests' -b/-e take: the letter decides
# Divisors rather than factors: 5 / 1e6 is exactly the float nearest 5e-6, 5 * 1e-6 is not.
_TIMES = {"s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "\u03bcs": 1e6, "ns": 1e9}


ECHO_LIMIT = 40  # characters of a bad value repeated in its error message


def _fail(value, what: str, example: str, where: str | None, why: str = "") -> UsageError:
    prefix = f"{where}: " if where else ""
    reason = why or f"is not {what}"
    shown = repr(value)
    if len(shown) > ECHO_LIMIT:
        shown = f"{shown[:ECHO_LIMIT - 8]}... ({len(str(value))} characters)"
    return UsageError(f"{prefix}{shown} {reason}; write e.g. \"{example}\"")


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
    value = number * scale
    if not value <= MAX_BANDWIDTH:
        raise _fail(text, what, BANDWIDTH_EXAMPLE, where, "is more than 1 EB/s, faster than any link")
    return value


def parse_time(text: str, where: str | None = None) -> float:
    """'5 us' -> 5e-6 seconds. Microseconds may be written us, µs (micro sign) or μs (mu)."""
    what = "a time"
    number, unit = _split(text, what, TIME_EXAMPLE, where)
    if unit not in _TIMES:
        raise _wrong_unit(text, unit, what, TIME_EXAMPLE, where)
    _check_positive(number, text, what, TIME_EXAMPLE, where)
    value = number / _TIMES[unit]
    if not value <= MAX_TIME:
        raise _fail(text, what, TIME_EXAMPLE, where, "is more than a day, longer than any latency")
    if value == 0:
        raise _fail(text, what, TIME_EXAMPLE, where, "is too small to be a time (below 1e-300 s)")
    return value


def parse_bytes(text: str | int, where: str | None = None, nccl_tests: bool = False) -> int:
    """'256MiB' -> 268435456; nccl-tests' '256M' (binary) too. A bare number is bytes; the
    result must be a whole number of bytes, at most MAX_BYTES (1 PiB). `nccl_tests`: the
    size is an argument of a flag that mirrors nccl-tests' -b/-e, where '1MB' is 2^20 too.

    Bits are refused: a buffer size in bits is almost always a typo for bytes.
    """
    what = "a byte size"
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise _fail(text, what, BYTES_EXAMPLE, where, "is not a positive byte size")
        if text > MAX_BYTES:
            raise _too_large(text, where)
        return text
    number, unit = _split(text, what, BYTES_EXAMPLE, where)
    flag_unit = _NCCL_TESTS_FLAG_UNIT.match(unit) if nccl_tests else None
    if flag_unit:
        scale = 2 ** (10 * ("kmgtp".index(flag_unit.group(1).lower()) + 1))
    elif _NCCL_TESTS_SUFFIX.match(unit):
        scale = 2 ** (10 * ("kmgt".index(unit.lower()) + 1))
    else:
        match = _SIZE_UNIT.match(unit) if unit else None
        if unit and (not match or match.group("base") != "B"):
            if match:
                raise _fail(text, what, BYTES_EXAMPLE, where, "is in bits; sizes are in bytes (B)")
            kind = _kind_of_unit(unit)
            why = f"is {kind}, not {what}" if kind and kind != "a size" else f"is not {what}"
            raise _fail(text, what, BYTES_EXAMPLE, where, why)
        scale = _PREFIXES[match.group("prefix")] if match else 1
    _check_positive(number, text, what, BYTES_EXAMPLE, where)
    if not number * scale <= MAX_BYTES:  # before any exact arithmetic: 1e308PiB stays a float
        raise _too_large(text, where)
    # Exact decimal arithmetic (the bound above keeps it small), so '1.5KiB' is 1536 exactly and
    # '0.1KiB' is refused, as the exported scripts decide.
    value = Fraction(_number_text(text)) * Fraction(scale)
    if value.denominator != 1:
        raise _fail(text, what, BYTES_EXAMPLE, where, "is not a whole number of bytes")
    return int(value)


def _too_large(text, where: str | None) -> UsageError:
    return _fail(text, "a byte size", BYTES_EXAMPLE, where,
                 "is more than 1 PiB, the largest size synth takes (a size per device)")


def _number_text(text: str) -> str:
    return _NUMBER.match(text).group(1)


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
