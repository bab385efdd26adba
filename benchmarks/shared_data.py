"""Where the benchmarks find the public data sets (LoCoMo, LongMemEval); they are read in place, never copied.

The folder is, in order: the ``--data`` argument, the ``TKG_BENCH_DATA`` environment variable, or ``shared/data``
beside the checkout (``../shared/data`` from the repository root). A benchmark that needs a data set which is
not there says so and is skipped by ``run.py``; it never falls back to invented data.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "TKG_BENCH_DATA"
BESIDE_CHECKOUT = Path(__file__).resolve().parents[2] / "shared" / "data"
LOCOMO = Path("locomo") / "locomo10_dev.json"
LONGMEMEVAL = Path("longmemeval") / "longmemeval_s_dev100.json.gz"
#: The ``--data`` option's help, the same in every benchmark.
HELP = f"the data folder holding locomo/ (default: ${ENV}, or shared/data beside the checkout)"


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The data folder (one that holds ``locomo/``), or None when there is none."""
    if explicit:
        candidates = [Path(explicit)]
    elif os.environ.get(ENV):
        candidates = [Path(os.environ[ENV])]
    else:
        candidates = [BESIDE_CHECKOUT]
    for candidate in candidates:
        if (candidate / "locomo").is_dir():
            return candidate
    return None


def locomo_file(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The LoCoMo dev file, or None when the data folder is not found."""
    root = data_dir(explicit)
    return root / LOCOMO if root is not None and (root / LOCOMO).is_file() else None


def missing_message(what: str = "the LoCoMo dev split") -> str:
    return f"{what} not found: pass --data DIR or set {ENV} to the folder holding locomo/ (default {BESIDE_CHECKOUT})"
