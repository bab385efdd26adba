"""Name normalisation shared by resolution and every backend's name index."""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$", re.UNICODE)


#: Latin and Greek, whose combining marks are accents on a letter ("é", "ö", "ά"). Elsewhere a mark can make
#: another letter (Cyrillic "й" is not "и", Japanese "ガ" is not "カ"), so it stays.
_ACCENTED_SCRIPTS = ((0x0000, 0x03FF), (0x1E00, 0x1FFF))


def fold_accents(text: str) -> str:
    """``text`` without the accents of Latin and Greek letters (``"Zoë Łukasz José"`` -> ``"Zoe Łukasz Jose"``;
    a letter of its own such as "Ł" stays, and so does the text of every other script).

    >>> fold_accents("Zoë Müller, Jiří, Ἀθῆναι, Андрей, 東京, ガ")
    'Zoe Muller, Jiri, Αθηναι, Андрей, 東京, ガ'
    """
    out: list[str] = []
    base = 0
    for char in unicodedata.normalize("NFD", text):
        if unicodedata.combining(char):
            if any(lo <= base <= hi for lo, hi in _ACCENTED_SCRIPTS):
                continue
        else:
            base = ord(char)
        out.append(char)
    return unicodedata.normalize("NFC", "".join(out))


def normalize_name(name: str) -> str:
    """Case-, width- and whitespace-insensitive form of a name: ``"  Dr.  ALICE Smith "`` -> ``"dr. alice smith"``."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _SPACE.sub(" ", text).strip()
    stripped = _EDGE_PUNCT.sub("", text)
    return stripped or text
