"""Sizes and durations as people write them (``512M``, ``2G``, ``10m``), for settings, the CLI and
the store alike.

Kept free of pydantic and other heavy imports: the local backend's host side uses it too.
"""

from __future__ import annotations

import re

from hermes_sandboxes.errors import InvalidInput

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str | int, *, unit_required: bool = False) -> int:
    """``"2G"`` -> 2147483648. Units K, M, G, T are powers of 1024; a bare number is bytes, unless
    ``unit_required`` (memory limits: ``512`` is far more likely meant as megabytes than bytes)."""
    if isinstance(text, bool):
        raise InvalidInput(f"{text!r} is not a size: write a number with a unit, e.g. 512M or 2G")
    if isinstance(text, int):
        if text <= 0:
            raise InvalidInput(f"size must be positive, got {text}")
        return text
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(f"{text!r} is not a size: write a number with a unit, e.g. 512M or 2G")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
    if value < 1:
        raise InvalidInput(f"size must be at least one byte, got {text!r}")
    if unit_required and not match.group(2) and not text.strip().upper().endswith("B"):
        raise InvalidInput(f"{text.strip()!r} has no unit, so it could mean bytes or megabytes: write e.g. "
                           f"{text.strip()}M or {text.strip()}B")
    return int(value)


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | float) -> float:
    """``"10m"`` -> 600.0 seconds. Units s, m, h, d; a bare number is seconds; never negative."""
    if isinstance(text, bool):
        raise InvalidInput(f"{text!r} is not a duration: write seconds or a number with a unit, e.g. 10m")
    if isinstance(text, int | float):
        if text < 0:
            raise InvalidInput(f"a duration cannot be negative, got {text}")
        return float(text)
    match = _DURATION_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(f"{text!r} is not a duration: write seconds or a number with a unit, e.g. 10m")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
