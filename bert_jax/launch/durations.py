"""A duration as launch's flags spell it (`90s`, `45m`, `2h`, `1d`, or plain seconds) and back:
one table of units, read by the parser and by what help and checks show."""

from __future__ import annotations

import argparse
import math

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> float:
    """A duration flag's value in seconds: `90`, `90s`, `30m`, `2h`."""
    try:
        if text and text[-1] in UNITS:
            return float(text[:-1]) * UNITS[text[-1]]
        return float(text)
    except ValueError:
        # argparse prints this message as is (a ValueError would be "invalid seconds value").
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 45m, 2h)") from None


def text(value: float) -> str:
    """`seconds`' spelling back, in the largest unit that divides it: 90 -> "90s", 120 -> "2m",
    3600 -> "1h"; a value that is not finite as Python writes it (`inf`, `nan`)."""
    if not math.isfinite(value):
        return f"{value:g}"
    dividing = [unit for unit, size in UNITS.items() if value % size == 0]
    unit = max(dividing, key=UNITS.get, default="s")
    return f"{value / UNITS[unit]:g}{unit}"
