"""Summaries of latency samples. Samples are seconds (numpy arrays); summaries are milliseconds."""

from __future__ import annotations

import numpy as np

MB = 1e6  # throughput is reported in decimal megabytes per second, like the published peers
GiB = 2**30  # per-GiB figures (CPU, PUTs, bytes stored) use binary gigabytes

LATENCY_KEYS = ("count", "mean", "p50", "p99", "p999", "max")


def latency_ms(samples: np.ndarray) -> dict:
    """count, mean, p50, p99, p99.9 and max in milliseconds; every figure None without samples."""
    if samples.size == 0:
        return {"count": 0, **{k: None for k in LATENCY_KEYS[1:]}}
    ms = samples * 1000.0
    p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
    return {
        "count": int(ms.size),
        "mean": _round(ms.mean()),
        "p50": _round(p50),
        "p99": _round(p99),
        "p999": _round(p999),
        "max": _round(ms.max()),
    }


def per_gib(value: float | None, nbytes: float) -> float | None:
    if value is None or nbytes <= 0:
        return None
    return _round(value / (nbytes / GiB))


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return round(a / b, 3)


def _round(x: float) -> float:
    return float(round(float(x), 3))
