"""Name normalisation shared by resolution and every backend's name index."""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$", re.UNICODE)


def normalize_name(name: str) -> str:
    """Case-, width- and whitespace-insensitive form of a name: ``"  Dr.  ALICE Smith "`` -> ``"dr. alice smith"``."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _SPACE.sub(" ", text).strip()
    stripped = _EDGE_PUNCT.sub("", text)
    return stripped or text
