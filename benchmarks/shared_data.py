"""Where the benchmarks find the public data sets (LoCoMo, LongMemEval); they are read in place, never copied.

The folder is, in order: the ``--data`` argument, the ``TKG_BENCH_DATA`` environment variable, or ``shared/data``
beside the checkout (``../shared/data`` from the repository root). A benchmark that needs a data set which is
not there says so and is skipped by ``run.py``; it never falls back to invented data.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


# ----------------------------------------------------------------------------------------------------------
# LoCoMo's structure (one reader for every benchmark and the converter)


def session_time(text: str) -> datetime:
    """A LoCoMo session date ("1:56 pm on 8 May, 2023") as a UTC datetime."""
    return datetime.strptime(text.upper(), "%I:%M %p ON %d %B, %Y").replace(tzinfo=UTC)


def locomo_sessions(record: Mapping[str, Any]) -> Iterator[tuple[int, datetime, list[dict[str, Any]]]]:
    """The sessions of one LoCoMo conversation in order: number, date, and turns as the file has them."""
    conv = record["conversation"]
    n = 1
    while f"session_{n}" in conv:  # sessions, not the (partly orphan) _date_time keys
        yield n, session_time(conv[f"session_{n}_date_time"]), conv[f"session_{n}"]
        n += 1


def turn_line(turn: Mapping[str, Any], *, captions: bool = True) -> str:
    """``"Speaker: text"``; with ``captions``, a shared image as its caption, as in the LoCoMo paper."""
    text = f"{turn['speaker']}: {turn['text']}"
    if captions and turn.get("blip_caption"):
        text += f" [shares image: {turn['blip_caption']}]"
    return text
