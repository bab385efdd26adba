"""The context constructor χ: search results -> the text an agent puts in its prompt."""

from __future__ import annotations

from datetime import datetime

from tkg.search import SearchResults

_DATE = "%Y-%m-%d %H:%M"


def _when(value: datetime | None, missing: str) -> str:
    return missing if value is None else value.strftime(_DATE) + " UTC"


def build_context(results: SearchResults, *, max_chars: int | None = None, include_episodes: bool = False) -> str:
    """Facts with their validity ranges, then entities with summaries (then episodes, when asked).

    Sections are filled best-first; with ``max_chars`` the lowest-ranked lines are left out so the whole string
    fits the budget.
    """
    sections: list[tuple[str, list[str]]] = [
        (
            "FACTS (each with the period it held: from - to; 'present' means it still holds)",
            [
                f"- {s.record.fact} ({_when(s.record.valid_at, 'unknown')} - {_when(s.record.invalid_at, 'present')})"
                for s in results.facts
            ],
        ),
        (
            "ENTITIES (name: summary)",
            [f"- {s.record.name}: {s.record.summary or '(no summary yet)'}" for s in results.entities],
        ),
    ]
    if results.communities:
        sections.append(
            ("COMMUNITIES (name: summary)", [f"- {s.record.name}: {s.record.summary}" for s in results.communities])
        )
    if include_episodes:
        sections.append(
            (
                "EPISODES (source material, with its time)",
                [f"- [{_when(s.record.reference_time, '')}] {s.record.content}" for s in results.episodes],
            )
        )
    kept: list[tuple[str, list[str]]] = [(title, []) for title, _ in sections]
    for (_, lines), (_, chosen) in zip(sections, kept, strict=True):
        for line in lines:
            chosen.append(line)
            if max_chars is not None and len(_render(kept)) > max_chars:
                chosen.pop()
                break
    return _render(kept)


def _render(sections: list[tuple[str, list[str]]]) -> str:
    blocks = []
    for title, lines in sections:
        if lines:
            tag = title.split(" ", 1)[0]
            blocks.append("\n".join([f"# {title}", f"<{tag}>", *lines, f"</{tag}>"]))
    return "\n\n".join(blocks)
