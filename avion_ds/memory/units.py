"""Byte quantities with explicit units: ``24GiB``, ``1.5 TB``, ``512MiB``.

A bare number such as ``24`` is refused (is it GB or GiB?): planner inputs are memory budgets
and a silent guess would pick configurations that do not fit.
"""

from __future__ import annotations

import re

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,  # shorthand as in `free -g` / docker: binary
}
_PATTERN = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | float, name: str = "size") -> int:
    """Parse ``text`` (e.g. ``"24GiB"``) into bytes; raise ValueError naming ``name`` and the value.

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and the
    one-letter K/M/G/T shorthands) powers of 1024. Unit-less and negative sizes are errors.
    """
    raw = str(text)
    m = _PATTERN.match(raw)
    if m is None:
        raise ValueError(f"{name}={raw!r} is not a memory size (expected e.g. 24GiB or 80GB)")
    number, unit = m.group(1), m.group(2).lower()
    if not unit:
        raise ValueError(f"{name}={raw!r} has no unit: write e.g. {number}GiB or {number}GB")
    if unit not in _UNITS:
        raise ValueError(f"{name}={raw!r}: unknown unit {m.group(2)!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    value = float(number)
    if value < 0:
        raise ValueError(f"{name}={raw!r} is negative")
    return round(value * _UNITS[unit])


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``23.4 GiB``."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"  # unreachable
