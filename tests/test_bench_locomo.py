"""The benchmarks' LoCoMo reader (benchmarks/shared_data.py) and the converter to ``tkg ingest`` input
(benchmarks/locomo_jsonl.py), on a small conversation in LoCoMo's shape: no data folder needed."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import locomo_jsonl  # noqa: E402
import shared_data  # noqa: E402
from test_cli import no_llm_env, run  # noqa: E402

__all__ = ["no_llm_env"]  # the fixture, used by name

RECORD: dict[str, Any] = {
    "sample_id": "conv-x",
    "conversation": {
        "speaker_a": "Ann",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat."},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Look!", "blip_caption": "a photo of a dog"},
        ],
        "session_2_date_time": "9:05 AM on 1 June, 2023",
        "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "The cat is called Momo."}],
        "session_4_date_time": "10:00 am on 2 June, 2023",  # an orphan date, as the real files have
    },
    "qa": [],
}


def test_sessions_in_order_with_their_dates() -> None:
    sessions = list(shared_data.locomo_sessions(RECORD))
    assert [(n, when, len(turns)) for n, when, turns in sessions] == [
        (1, datetime(2023, 5, 8, 13, 56, tzinfo=UTC), 2),
        (2, datetime(2023, 6, 1, 9, 5, tzinfo=UTC), 1),
    ]
    ben = sessions[0][2][1]
    assert shared_data.turn_line(ben) == "Ben: Look! [shares image: a photo of a dog]"
    assert shared_data.turn_line(ben, captions=False) == "Ben: Look!"


def test_converted_conversation_ingests_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    lines = locomo_jsonl.conversation_lines(RECORD)
    assert lines[1] == {
        "speaker": "Ben",
        "text": "Look! [shares image: a photo of a dog]",
        "reference_time": "2023-05-08T13:56:30+00:00",
        "id": "conv-x.D1.2",
    }
    source = tmp_path / "conv.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    store = ["--store", str(tmp_path / "m.tkg"), "--embedder", "hash"]
    code, out, err = run(capsys, "ingest", str(source), *store)
    assert code == 0, err
    assert "added 3 episodes" in out
    code, out, _ = run(capsys, "ingest", str(source), *store)
    assert code == 0 and "skipped 3 lines" in out and "added 0 episodes" in out
    code, out, _ = run(capsys, "search", "Momo", *store, "--json")
    found = json.loads(out)["episodes"]
    assert found[0]["id"] == "conv-x.D2.1" and found[0]["reference_time"].startswith("2023-06-01T09:05")
