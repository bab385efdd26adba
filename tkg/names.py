"""Name normalisation shared by resolution and every backend's name index."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

_SPACE = re.compile(r"\s+")
_LEADING_PUNCT = re.compile(r"^[\W_]+", re.UNICODE)
_TRAILING_PUNCT = re.compile(r"[\W_]+$", re.UNICODE)
_KEPT_SUFFIX = re.compile(r"[+#]*")  # part of the name: C++, C#, F#, A+


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
    """Case-, width- and whitespace-insensitive form of a name, without the punctuation around it but for a final
    ``+`` or ``#`` (``C++``, ``C#`` and ``C`` are three names): ``"  Dr.  ALICE Smith. "`` -> ``"dr. alice smith"``.

    >>> normalize_name('"ACME Corp."'), normalize_name("C++."), normalize_name("C#"), normalize_name("#AI")
    ('acme corp', 'c++', 'c#', 'ai')
    """
    text = unicodedata.normalize("NFKC", name).casefold()
    text = _SPACE.sub(" ", text).strip()
    stripped = _LEADING_PUNCT.sub("", text)
    tail = _TRAILING_PUNCT.search(stripped)
    if tail is not None:
        kept = _KEPT_SUFFIX.match(tail.group()).group() if tail.start() > 0 else ""  # type: ignore[union-attr]
        stripped = stripped[: tail.start()] + kept
    return stripped or text


def name_keys(name: str, aliases: Sequence[str] = ()) -> list[str]:
    """The keys an entity is found by in a name index: the normalised form of its name and of each alias
    (:func:`normalize_name`), sorted, each once."""
    return sorted({normalize_name(n) for n in (name, *aliases)})
