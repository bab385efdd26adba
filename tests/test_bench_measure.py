"""The benchmarks' one percentile definition (benchmarks/measure.py) is numpy's default, linear interpolation."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from measure import percentile, summarise_ms

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=60), st.floats(min_value=0, max_value=100))
def test_percentile_is_numpys_linear_interpolation(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_ends_and_middle() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0 and percentile(values, 50) == 3.0
    assert percentile(list(range(1, 21)), 95) == pytest.approx(19.05)  # between the 19th and the 20th
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summarise_ms_converts_seconds() -> None:
    summary = summarise_ms([0.001, 0.002, 0.003])
    assert summary == {"p50": 2.0, "p95": pytest.approx(2.9), "mean": pytest.approx(2.0), "max": 3.0, "n": 3}
    assert summarise_ms([])["n"] == 0
