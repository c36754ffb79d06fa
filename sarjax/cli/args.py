"""The argument types the ``sarjax`` commands share."""

from __future__ import annotations

import argparse


def positive_int(s: str) -> int:
    """An argparse type: an integer >= 1."""
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def positive_float(s: str) -> float:
    """An argparse type: a finite float > 0."""
    v = float(s)
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {s}")
    return v


def nonnegative_float(s: str) -> float:
    """An argparse type: a finite float >= 0."""
    v = float(s)
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v
