"""How every benchmark summarises timings: one percentile definition, stated once.

A percentile here is the linear-interpolated one (numpy's default, Hyndman-Fan type 7): the values are sorted,
the q-th percentile sits at position ``(n - 1) * q / 100`` and is interpolated between its two neighbours. So
``p50`` is the median, ``p95`` of 20 samples lies between the 19th and the 20th, and ``p100`` is the maximum.
Every "p50" and "p95" in ``results/RESULTS.md`` means exactly this.

Pure Python on purpose: the Graphiti side of the comparison runs in its own virtual environment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of ``values``, linearly interpolated; NaN when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile lies in [0, 100], not {q}")
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise_ms(values_s: Sequence[float]) -> dict[str, float]:
    """p50, p95, mean and max in milliseconds, and the count, of durations given in seconds."""
    ms = [v * 1000.0 for v in values_s]
    if not ms:
        return {"p50": float("nan"), "p95": float("nan"), "mean": float("nan"), "max": float("nan"), "n": 0}
    return {
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "mean": math.fsum(ms) / len(ms),
        "max": max(ms),
        "n": len(ms),
    }


#: The embedded PostgreSQL server's settings in the benchmarks: a buffer cache that holds a 100,000-fact memory
#: (~1 GB with its indexes), as any server sized for its data would have; PostgreSQL's default is 128 MB.
POSTGRES_SETTINGS = {"shared_buffers": "4GB"}


def server_settings(pairs: Sequence[str]) -> dict[str, str]:
    """``--server-setting name=value`` arguments as a dict, over :data:`POSTGRES_SETTINGS`."""
    settings = dict(POSTGRES_SETTINGS)
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--server-setting takes name=value, not {pair!r}")
        settings[name.strip()] = value.strip()
    return settings
