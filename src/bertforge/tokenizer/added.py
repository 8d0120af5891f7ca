"""Added tokens: tokens matched whole in the text before basic tokenization, as transformers' tokenizers do.

Special tokens ([CLS], [MASK], an added [E1]) are usually `normalized=False`: matched as written, case and all.
Tokens added with `add_tokens` are `normalized=True`: matched in the normalised (lower-cased, accent-stripped)
text, so "COVID19" finds the added "covid19". Either kind is found inside words too ("covid19s" -> covid19, s).
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from bertforge.errors import InputError

# (start, end, id): a span of the text, with the id of the added token it is, or None for ordinary text.
Segment = tuple[int, int, int | None]


@dataclass(frozen=True)
class AddedToken:
    """One added token and transformers' flags for it (tokenizer.json "added_tokens", "added_tokens_decoder")."""

    content: str
    special: bool = False  # dropped by decode(skip_special_tokens=True)
    normalized: bool | None = None  # matched in the normalised text rather than as written; default: not special
    single_word: bool = False  # matched only where no letter or digit touches it
    lstrip: bool = False  # takes the whitespace on its left with it
    rstrip: bool = False  # and on its right

    def __post_init__(self):
        if self.normalized is None:  # the tokenizers library's default
            object.__setattr__(self, "normalized", not self.special)

    @classmethod
    def of(cls, token: Any, special: bool = False) -> AddedToken:
        """A token as add_tokens takes it: a string (transformers' defaults: special ones matched as written), this
        class, or the tokenizers library's AddedToken (transformers'), whose flags it keeps. Added as `special`,
        the token becomes special, as the tokenizers library makes it (its normalized then defaults to False)."""
        if isinstance(token, str):
            return cls(token, special=special)
        if isinstance(token, AddedToken):
            return dataclasses.replace(token, special=True) if special and not token.special else token
        flags = ("special", "normalized", "single_word", "lstrip", "rstrip")
        if not isinstance(getattr(token, "content", None), str) or not all(hasattr(token, name) for name in flags):
            raise InputError(f"tokens to add must be strings or AddedTokens, got {type(token).__name__}")
        if special and not token.special:
            token.special = True  # as the tokenizers library marks the token it is given, which settles normalized
        return cls(token.content, **{name: bool(getattr(token, name)) for name in flags})

    @classmethod
    def from_dict(cls, data: str | dict[str, Any], special: bool = False) -> AddedToken:
        """From transformers' JSON: a bare string or {"content": ..., "special": ..., ...}."""
        if isinstance(data, str):
            return cls(data, special=special, normalized=not special)
        flags = {name: bool(data[name]) for name in ("special", "normalized", "single_word", "lstrip", "rstrip")
                 if name in data}
        flags.setdefault("special", special)
        flags.setdefault("normalized", not flags["special"])
        return cls(str(data["content"]), **flags)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:  # the token itself, as the tokenizers library prints its AddedToken
        return self.content


# Rust regex's Unicode \w, which the reference tests single_word tokens against: Alphabetic, marks, decimal digits,
# connector punctuation and the two joiners. Python's \w differs both ways: it takes '²' and '½' (No) as word
# characters, and not marks ('zorb\u0301', 'zorbा'), '‿' or U+200D. Alphabetic is approximated by the letter
# categories, Nl and the symbols below; the rest of Other_Alphabetic are marks, counted already. Characters newer
# than Python's Unicode tables (unassigned there) count as no word characters.
WORD_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Mn", "Mc", "Me", "Nd", "Pc"})
JOIN_CONTROLS = "\u200c\u200d"
# The Other_Alphabetic characters that are symbols (So): circled and squared Latin letters, 'Ⓐ' and '🄰'.
ALPHABETIC_SYMBOLS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))
# Rust's char::is_whitespace (the Unicode White_Space property), what lstrip and rstrip take. Python's \s also
# takes the separators \x1c-\x1f, which the reference leaves alone.
WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                       "\u200a\u2028\u2029\u202f\u205f\u3000")


def is_word_char(char: str) -> bool:
    """Whether a single_word token next to `char` is inside a word: 'a', 'é', '7', '\u0301', '_' yes; ' ', '-',
    '²' no."""
    if unicodedata.category(char) in WORD_CATEGORIES or char in JOIN_CONTROLS:
        return True
    code = ord(char)
    return any(low <= code <= high for low, high in ALPHABETIC_SYMBOLS)


def _pattern(alternatives: list[tuple[str, int]]) -> re.Pattern | None:
    """One regex over every token's text, longest first so that the longest match at the leftmost position wins
    (the reference's leftmost-longest search); each alternative has one group, so match.lastindex says which."""
    if not alternatives:
        return None
    return re.compile("|".join("(" + re.escape(text) + ")" for text, _ in alternatives))


def _longest_first(alternatives: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(text, id) pairs without empty texts, in the pattern's order: group number - 1 indexes them."""
    return sorted([(text, token_id) for text, token_id in alternatives if text], key=lambda item: len(item[0]),
                  reverse=True)


class AddedTokens:
    """Finds added tokens in a text: first those matched as written, then, in the text between them, those
    matched after normalisation (`normalize(text)` -> normalised text and each character's original index)."""

    def __init__(self, tokens: dict[int, AddedToken], normalize: Callable[[str], tuple[str, list[int]]]):
        self.tokens = tokens
        self.normalize = normalize
        raw = _longest_first([(token.content, token_id) for token_id, token in tokens.items()
                              if not token.normalized])
        normalized = _longest_first([(normalize(token.content)[0], token_id) for token_id, token in tokens.items()
                                     if token.normalized])
        self._raw, self._raw_ids = _pattern(raw), [token_id for _, token_id in raw]
        self._normalized, self._normalized_ids = _pattern(normalized), [token_id for _, token_id in normalized]

    def may_match(self, text: str) -> bool:
        """False when the text surely holds no added token (the common case, checked cheaply)."""
        return self._normalized is not None or (self._raw is not None and self._raw.search(text) is not None)

    def split(self, text: str) -> list[Segment]:
        """'a [E1] COVID19s' (with [E1] raw, covid19 normalised) -> [(0, 2, None), (2, 6, id), (6, 7, None),
        (7, 14, id), (14, 15, None)]."""
        segments: list[Segment] = []
        position = 0
        if self._raw is not None:
            for start, end, token_id in self._find(self._raw, self._raw_ids, text):
                segments += self._split_normalized(text, position, start)
                segments.append((start, end, token_id))
                position = end
        segments += self._split_normalized(text, position, len(text))
        return segments

    def _find(self, pattern: re.Pattern, ids: list[int], text: str) -> Iterator[tuple[int, int, int]]:
        """(start, end, id) of the tokens in `text`, as the reference finds them: a single_word match that a word
        character touches is dropped (the search goes on after it), lstrip and rstrip widen the span over
        whitespace, though not back into the previous token's."""
        position = 0
        for match in pattern.finditer(text):
            start, end = match.span()
            token_id = ids[match.lastindex - 1]
            token = self.tokens[token_id]
            if start < position:  # inside whitespace the previous token's rstrip took
                continue
            if token.single_word and ((start > 0 and is_word_char(text[start - 1])) or
                                      (end < len(text) and is_word_char(text[end]))):
                continue
            if token.lstrip:
                while start > position and text[start - 1] in WHITESPACE:
                    start -= 1
            if token.rstrip:
                while end < len(text) and text[end] in WHITESPACE:
                    end += 1
            yield start, end, token_id
            position = end

    def _split_normalized(self, text: str, start: int, end: int) -> list[Segment]:
        if start >= end:
            return []
        if self._normalized is None:
            return [(start, end, None)]
        normalized, origins = self.normalize(text[start:end])
        segments: list[Segment] = []
        position = start
        for found_start, found_end, token_id in self._find(self._normalized, self._normalized_ids, normalized):
            # The match covers the original characters its first and last normalised characters came from; but
            # whitespace that lstrip or rstrip took may be what the normaliser put around a Chinese character
            # ("文" -> " 文 ", all three from the one character), which stays outside the match.
            first, last = origins[found_start], origins[found_end - 1]
            if normalized[found_start] in WHITESPACE and found_start > 0 and origins[found_start - 1] == first:
                first += 1
            if (normalized[found_end - 1] in WHITESPACE and found_end < len(normalized)
                    and origins[found_end] == last):
                last -= 1
            begin, finish = start + first, start + last + 1
            if begin < position:
                continue
            if begin > position:
                segments.append((position, begin, None))
            segments.append((begin, finish, token_id))
            position = finish
        if position < end:
            segments.append((position, end, None))
        return segments
