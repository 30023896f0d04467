"""Percentiles of timed samples, printed the same way by every process benchmark."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "us_line"]


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0-100) of ``samples``, which must not be empty."""
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[rank]


def us_line(label: str, seconds: Sequence[float], points: Sequence[float] = (50, 90, 99)) -> str:
    """``label  n=...  p50=... µs ...`` for samples in seconds."""
    cells = "  ".join(f"p{p:g}={percentile(seconds, p) * 1e6:8.1f}" for p in points)
    return f"{label:<44} n={len(seconds):<6} {cells} µs"
