"""Text in a terminal's columns: the tables the commands print line up whatever script their texts are in.

A terminal gives a wide East Asian character (CJK, kana, Hangul, most emoji) two cells, and a combining mark, a
format character (a zero-width joiner) or a Hangul vowel or final consonant written as a jamo of its own none, where
str.ljust counts one cell for each. An emoji sequence is one glyph of two cells: emoji joined by zero-width joiners
(a family), an emoji and its skin tone, a flag's two regional indicators, a character made an emoji by variation
selector 16. A tab or newline inside a text would break its row, so it is shown as a space.
"""

from __future__ import annotations

import unicodedata

ZERO_WIDTH_CATEGORIES = frozenset({"Mn", "Me", "Cf"})
ZERO_WIDTH_JOINER = "\u200d"
EMOJI_PRESENTATION = "\ufe0f"  # variation selector 16
SKIN_TONES = ("\U0001f3fb", "\U0001f3ff")  # the emoji modifiers, first and last
REGIONAL_INDICATORS = ("\U0001f1e6", "\U0001f1ff")


def cell_width(character: str) -> int:
    if unicodedata.category(character) in ZERO_WIDTH_CATEGORIES or is_joining_jamo(character):
        return 0
    # A regional indicator is drawn as a flag with the next, or alone as a boxed letter: two cells either way.
    return 2 if unicodedata.east_asian_width(character) in ("W", "F") or is_regional_indicator(character) else 1


def is_joining_jamo(character: str) -> bool:
    """A Hangul vowel or final consonant of the conjoining kind: drawn inside the syllable its leading consonant
    starts (BERT's tokenizer splits such syllables into these pieces), so it takes no cell of its own."""
    return "\u1160" <= character <= "\u11ff" or "\ud7b0" <= character <= "\ud7ff"


def glyphs(text: str) -> list[tuple[str, int]]:
    """`text` as the glyphs a terminal draws, each with the cells it takes: a character with the marks, joiners,
    modifiers and selectors drawn into it."""
    drawn: list[tuple[str, int]] = []
    for character in text:
        width = cell_width(character)
        if drawn and draws_into(character, width, *drawn[-1]):
            glyph, cells_taken = drawn[-1]
            drawn[-1] = (glyph + character, 2 if character == EMOJI_PRESENTATION else cells_taken)
        else:
            drawn.append((character, width))
    return drawn


def draws_into(character: str, width: int, glyph: str, cells_taken: int) -> bool:
    """Whether `character` is drawn inside the glyph before it."""
    emoji = cells_taken == 2
    return (width == 0 or (emoji and glyph.endswith(ZERO_WIDTH_JOINER))  # the next emoji of a joined sequence
            or (emoji and SKIN_TONES[0] <= character <= SKIN_TONES[1])
            or (len(glyph) == 1 and is_regional_indicator(glyph) and is_regional_indicator(character)))


def is_regional_indicator(character: str) -> bool:
    return REGIONAL_INDICATORS[0] <= character <= REGIONAL_INDICATORS[1]


def cells(text: str) -> int:
    """How many terminal cells `text` takes."""
    return sum(width for _, width in glyphs(text))


def printable(text: str) -> str:
    """`text` on one line: control characters (tabs, newlines) as spaces."""
    return "".join(" " if unicodedata.category(character) == "Cc" else character for character in text)


def fit(text: str, width: int) -> str:
    """`text` on one line, cut to at most `width` cells with an ellipsis where it is longer."""
    text = printable(text)
    drawn = glyphs(text)
    if sum(cells_taken for _, cells_taken in drawn) <= width:
        return text
    kept, used = [], 0
    for glyph, cells_taken in drawn:  # a glyph is kept whole: a family is not cut to its first person
        if used + cells_taken > width - 1:
            break
        kept.append(glyph)
        used += cells_taken
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
