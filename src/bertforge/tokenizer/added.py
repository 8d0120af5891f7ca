"""Added tokens: tokens matched whole in the text before basic tokenization, as transformers' tokenizers do.

Special tokens ([CLS], [MASK], an added [E1]) are usually `normalized=False`: matched as written, case and all.
Tokens added with `add_tokens` are `normalized=True`: matched in the normalised (lower-cased, accent-stripped)
text, so "COVID19" finds the added "covid19". Either kind is found inside words too ("covid19s" -> covid19, s).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# (start, end, id): a span of the text, with the id of the added token it is, or None for ordinary text.
Segment = tuple[int, int, int | None]


@dataclass(frozen=True)
class AddedToken:
    """One added token and transformers' flags for it (tokenizer.json "added_tokens", "added_tokens_decoder")."""

    content: str
    special: bool = False  # dropped by decode(skip_special_tokens=True)
    normalized: bool = True  # matched in the normalised text rather than as written
    single_word: bool = False  # matched only where no letter or digit touches it
    lstrip: bool = False  # takes the whitespace on its left with it
    rstrip: bool = False  # and on its right

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


def _pattern(alternatives: list[tuple[str, AddedToken]]) -> re.Pattern | None:
    """One regex over every token, longest first so that the longest match at a position wins; each
    alternative has exactly one group, so match.lastindex says which token matched."""
    if not alternatives:
        return None
    parts = []
    for text, token in sorted(alternatives, key=lambda item: len(item[0]), reverse=True):
        part = "(" + re.escape(text) + ")"
        if token.single_word:
            part = r"(?<!\w)" + part + r"(?!\w)"
        parts.append((r"\s*" if token.lstrip else "") + part + (r"\s*" if token.rstrip else ""))
    return re.compile("|".join(parts))


class AddedTokens:
    """Finds added tokens in a text: first those matched as written, then, in the text between them, those
    matched after normalisation (`normalize(text)` -> normalised text and each character's original index)."""

    def __init__(self, tokens: dict[int, AddedToken], normalize: Callable[[str], tuple[str, list[int]]]):
        self.tokens = tokens
        self.normalize = normalize
        raw = [(token.content, token) for token in tokens.values() if not token.normalized]
        normalized = [(normalize(token.content)[0], token) for token in tokens.values() if token.normalized]
        self._raw = _pattern(raw)
        self._normalized = _pattern([(text, token) for text, token in normalized if text])
        self._raw_ids = self._ids_by_group(raw)
        self._normalized_ids = self._ids_by_group([(text, token) for text, token in normalized if text])

    def _ids_by_group(self, alternatives: list[tuple[str, AddedToken]]) -> list[int]:
        """Group number - 1 -> token id, in the pattern's (longest first) order."""
        ids = {token: token_id for token_id, token in self.tokens.items()}
        ordered = sorted(alternatives, key=lambda item: len(item[0]), reverse=True)
        return [ids[token] for _, token in ordered]

    def may_match(self, text: str) -> bool:
        """False when the text surely holds no added token (the common case, checked cheaply)."""
        return self._normalized is not None or (self._raw is not None and self._raw.search(text) is not None)

    def split(self, text: str) -> list[Segment]:
        """'a [E1] COVID19s' (with [E1] raw, covid19 normalised) -> [(0, 2, None), (2, 6, id), (6, 7, None),
        (7, 14, id), (14, 15, None)]."""
        segments: list[Segment] = []
        position = 0
        if self._raw is not None:
            for match in self._raw.finditer(text):
                segments += self._split_normalized(text, position, match.start())
                segments.append((match.start(), match.end(), self._raw_ids[match.lastindex - 1]))
                position = match.end()
        segments += self._split_normalized(text, position, len(text))
        return segments

    def _split_normalized(self, text: str, start: int, end: int) -> list[Segment]:
        if start >= end:
            return []
        if self._normalized is None:
            return [(start, end, None)]
        normalized, origins = self.normalize(text[start:end])
        segments: list[Segment] = []
        position = start
        for match in self._normalized.finditer(normalized):
            if match.end() == match.start():
                continue
            # The match covers the original characters its first and last normalised characters came from.
            begin, finish = start + origins[match.start()], start + origins[match.end() - 1] + 1
            if begin < position:
                continue
            if begin > position:
                segments.append((position, begin, None))
            segments.append((begin, finish, self._normalized_ids[match.lastindex - 1]))
            position = finish
        if position < end:
            segments.append((position, end, None))
        return segments
