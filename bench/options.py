"""Parsers for command-line values: sizes ("1KiB", "64k", "4MiB", "100"), comma lists of them,
and key=value pairs for client and broker settings."""

from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 100, 1KiB, 64k, 4MiB)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def sizes(text: str) -> list[int]:
    return [size(part) for part in text.split(",") if part.strip()]


def ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def size_label(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}KiB" if unit == "KiB" else f"{n // scale}MiB"
    return f"{n}B"
