"""Write one LoCoMo conversation as a ``tkg ingest`` input file: one message line per turn, with the speaker, the
text (a shared image as its caption) and the session's date as reference time (turns 30 s apart), and the turn's
LoCoMo id as the episode id, so that the file re-ingests idempotently.

    python benchmarks/locomo_jsonl.py conv-26 --out conv-26.jsonl      # then: tkg ingest conv-26.jsonl --store m.tkg
    python benchmarks/locomo_jsonl.py --list                           # the conversations in the data folder
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import shared_data  # benchmarks/ is the script's own folder, first on sys.path


def conversation_lines(record: dict[str, Any]) -> list[dict[str, str]]:
    """The ``tkg ingest`` message lines of one LoCoMo conversation, in order."""
    lines = []
    for _, when, turns in shared_data.locomo_sessions(record):
        for j, turn in enumerate(turns):
            text = shared_data.turn_line(turn).split(": ", 1)[1]
            lines.append(
                {
                    "speaker": turn["speaker"],
                    "text": text,
                    "reference_time": (when + timedelta(seconds=30 * j)).isoformat(),
                    "id": f"{record['sample_id']}.{turn['dia_id']}".replace(":", "."),
                }
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conversation", nargs="?", help="its sample id, e.g. conv-26")
    parser.add_argument("--out", help="JSONL file to write (default: stdout)")
    parser.add_argument("--list", action="store_true", help="list the conversations and exit")
    parser.add_argument("--data", help=shared_data.HELP)
    args = parser.parse_args(argv)
    path = shared_data.locomo_file(args.data)
    if path is None:
        print(shared_data.missing_message(), file=sys.stderr)
        return 2
    records = {record["sample_id"]: record for record in json.loads(path.read_text())}
    if args.list or args.conversation is None:
        for sample_id, record in records.items():
            print(f"{sample_id}: {len(conversation_lines(record))} turns")
        return 0
    if args.conversation not in records:
        print(f"no conversation {args.conversation!r}; there are {', '.join(records)}", file=sys.stderr)
        return 2
    text = "".join(
        json.dumps(line, ensure_ascii=False) + "\n" for line in conversation_lines(records[args.conversation])
    )
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}: {text.count(chr(10))} turns of {args.conversation}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
