"""Text in a terminal's columns: the tables the commands print line up whatever script their texts are in.

A terminal gives a wide East Asian character (CJK, kana, Hangul, most emoji) two cells, and a combining mark, a
format character (a zero-width joiner) or a Hangul vowel or final consonant written as a jamo of its own none, where
str.ljust counts one cell for each; a tab or newline inside a text would break its row, so it is shown as a space.
"""

from __future__ import annotations

import unicodedata

ZERO_WIDTH_CATEGORIES = frozenset({"Mn", "Me", "Cf"})


def cell_width(character: str) -> int:
    if unicodedata.category(character) in ZERO_WIDTH_CATEGORIES or is_joining_jamo(character):
        return 0
    return 2 if unicodedata.east_asian_width(character) in ("W", "F") else 1


def is_joining_jamo(character: str) -> bool:
    """A Hangul vowel or final consonant of the conjoining kind: drawn inside the syllable its leading consonant
    starts (BERT's tokenizer splits such syllables into these pieces), so it takes no cell of its own."""
    return "\u1160" <= character <= "\u11ff" or "\ud7b0" <= character <= "\ud7ff"


def cells(text: str) -> int:
    """How many terminal cells `text` takes."""
    return sum(map(cell_width, text))


def printable(text: str) -> str:
    """`text` on one line: control characters (tabs, newlines) as spaces."""
    return "".join(" " if unicodedata.category(character) == "Cc" else character for character in text)


def fit(text: str, width: int) -> str:
    """`text` on one line, cut to at most `width` cells with an ellipsis where it is longer."""
    text = printable(text)
    if cells(text) <= width:
        return text
    kept, used = [], 0
    for character in text:
        if used + cell_width(character) > width - 1:
            break
        kept.append(character)
        used += cell_width(character)
    return "".join(kept) + "…"


def left(text: str, width: int) -> str:
    """`text` on one line, padded with spaces on the right to `width` cells (as f"{text:<{width}}" does for
    ASCII)."""
    text = printable(text)
    return text + " " * max(width - cells(text), 0)


def right(text: str, width: int) -> str:
    """`text` on one line, padded with spaces on the left to `width` cells."""
    text = printable(text)
    return " " * max(width - cells(text), 0) + text
