"""BasicTokenizer: BERT's text cleanup, lower-casing and accent stripping, and punctuation/CJK splitting.

Behaves as Hugging Face tokenizers' BertNormalizer + BertPreTokenizer (the reference for every released
BERT), and keeps for every output character the index of the input character it came from, so offsets
point into the original text however the normalisation changed it. Punctuation, accents and control
characters are those of Unicode 8.0, as in the reference (unicode_8.py), whatever Unicode version this
Python's unicodedata has.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Iterable

from bertforge.tokenizer import unicode_8

ASCII_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
# The Unicode White_Space property (Rust's char::is_whitespace, which the reference uses), minus the
# characters that cleanup deletes before whitespace is looked at: \v, \f and U+0085 are controls.
WHITESPACE = "\t\n\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
             "\u2028\u2029\u202f\u205f\u3000"
# The "Chinese character" blocks of BERT (CJK Unified Ideographs and extensions, compatibility ideographs);
# Japanese kana and Hangul are not in them and are split like any other letters. Extension E starts at
# 0x2B920 here, not 0x2B820 as in the original BERT: the reference (tokenizers) has it so, and we follow it.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)

# Bound on the per-character rule cache: real text uses a few thousand distinct characters at most.
MAX_CACHED_CHARS = 1 << 16
# A word: normalised text, the offset of its first character in the original text, and for each of its
# characters the original index it came from (None when word[k] is simply text[start + k]).
Word = tuple[str, int, tuple[int, ...] | None]

_ASCII_PUNCTUATION_CLASS = "[" + re.escape(ASCII_PUNCTUATION) + "]"
# Clean ASCII text (no control characters) holds only whitespace, punctuation and letters/digits, so one
# regex finds BERT's words: runs of letters/digits, and each punctuation mark alone.
_ASCII_WORD = re.compile("[0-9A-Za-z]+|" + _ASCII_PUNCTUATION_CLASS)
_ASCII_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Any text: runs of characters that are neither whitespace nor ASCII punctuation, or one ASCII punctuation
# mark. A run that isn't clean ASCII is normalised character by character and split again.
_RAW_PIECE = re.compile("[^" + re.escape(WHITESPACE + ASCII_PUNCTUATION) + "]+|" + _ASCII_PUNCTUATION_CLASS)


def in_ranges(ranges: tuple[tuple[int, int], ...]) -> Callable[[str], bool]:
    """A test for membership of a character in sorted (first, last) code point ranges."""
    starts = [first for first, _ in ranges]

    def contains(char: str) -> bool:
        code = ord(char)
        index = bisect_right(starts, code) - 1
        return index >= 0 and code <= ranges[index][1]
    return contains


is_unicode_8_control = in_ranges(unicode_8.CONTROLS)
is_unicode_8_punctuation = in_ranges(unicode_8.PUNCTUATION)
is_nonspacing_mark = in_ranges(unicode_8.NONSPACING_MARKS)
in_cjk_ranges = in_ranges(tuple(sorted(CJK_RANGES)))


def is_control(char: str) -> bool:
    """Characters cleanup deletes: control, format, private-use and surrogate code points (Cc, Cf, Co, Cs)
    except tab, newline and carriage return, and U+FFFD, the replacement character (already-lost data).
    'a\u200bb' reads as 'ab'. Code points unassigned in Unicode 8.0 are kept, as the reference keeps them."""
    if char in "\t\n\r":
        return False
    return char == "\ufffd" or is_unicode_8_control(char)


def is_punctuation(char: str) -> bool:
    """ASCII symbols (BERT counts '$', '+', '^' ... as punctuation) and Unicode 8.0's P* characters."""
    return char in ASCII_PUNCTUATION or is_unicode_8_punctuation(char)


def is_cjk(char: str) -> bool:
    """A CJK ideograph: '中' yes, 'か' (kana) and '한' (Hangul) no."""
    return in_cjk_ranges(char)


def traced(chars: list[str], origins: list[int]) -> Word:
    """A word of normalised characters and the text index each came from; None when those are the text's
    characters from the first on, one for one (as for most words, whatever their normalisation)."""
    in_place = origins[-1] - origins[0] == len(origins) - 1 and len(set(origins)) == len(origins)
    return "".join(chars), origins[0], None if in_place else tuple(origins)


class BasicTokenizer:
    """Text -> words, each word normalised (lower-cased, accents stripped) and traced back to the text.

    >>> BasicTokenizer().split("Héllo, [MASK] wörld!中文")
    ['hello', ',', '[MASK]', 'world', '!', '中', '文']

    never_split: tokens kept whole when they appear verbatim in the text, matched case-sensitively
    before any normalisation (as transformers does for special tokens): "[MASK]" stays one word,
    "[mask]" becomes '[', 'mask', ']'.
    """

    def __init__(self, lowercase: bool = True, strip_accents: bool | None = None, split_cjk: bool = True,
                 never_split: Iterable[str] = ()):
        self.lowercase = lowercase
        # As in BERT: accents go with lower-casing unless explicitly asked for (or against).
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.split_cjk = split_cjk
        self.never_split = tuple(token for token in never_split if token)
        # Longest first, so that of two tokens sharing a prefix the longer one wins.
        alternatives = sorted(self.never_split, key=len, reverse=True)
        self._never_split = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        # char -> what it becomes: ((output char, stands alone as a word), ...); () when deleted.
        self._char_rules: dict[str, tuple[tuple[str, bool], ...]] = {}
        # The characters whose rule is one character that stays in its word ('É' -> 'e'), and that character.
        self._one_to_one: dict[str, str] = {}

    def __getstate__(self) -> dict:
        # Pickled without the characters' rules learned so far (see WordPieceCache.__reduce__).
        return self.__dict__ | {"_char_rules": {}, "_one_to_one": {}}

    def split(self, text: str) -> list[str]:
        """The normalised words of `text`: 'Hello, world!' -> ['hello', ',', 'world', '!']."""
        if self._is_clean_ascii(text) and not self._has_never_split(text):
            # Fast path, the common case: one C-level lower() and one findall for the whole text.
            return _ASCII_WORD.findall(text.lower() if self.lowercase else text)
        return [word for word, _, _ in self.split_with_offsets(text)]

    def split_with_offsets(self, text: str) -> list[Word]:
        """Words with where they came from: 'Ça, a\u200bb' -> [('ca', 0, None), (',', 2, None), ('ab', 4, (4, 6))]."""
        words: list[Word] = []
        position = 0
        if self._has_never_split(text):
            for match in self._never_split.finditer(text):
                words += self._segment_words(text[position:match.start()], position)
                words.append((match.group(), match.start(), None))
                position = match.end()
        words += self._segment_words(text[position:], position)
        return words

    def normalize(self, text: str) -> tuple[str, list[int]]:
        """The text as the reference's normaliser leaves it, and each character's index in `text`:
        'Ça 中' -> ('ca  中 ', [0, 1, 2, 3, 3, 3]): whitespace becomes a space, CJK characters get spaces around
        them. Added tokens with normalized=True are looked for in this text."""
        chars: list[str] = []
        origins: list[int] = []
        for index, char in enumerate(text):
            if char in WHITESPACE:
                chars.append(" ")
                origins.append(index)
                continue
            rule = self._char_rules.get(char)
            if rule is None:
                rule = self._rule(char)
            for output, _ in rule:
                padded = f" {output} " if self.split_cjk and is_cjk(output) else output
                chars.append(padded)
                origins += [index] * len(padded)
        return "".join(chars), origins

    def _has_never_split(self, text: str) -> bool:
        return self._never_split is not None and self._never_split.search(text) is not None

    @staticmethod
    def _is_clean_ascii(text: str) -> bool:
        return text.isascii() and _ASCII_CONTROL.search(text) is None

    def _segment_words(self, segment: str, base: int) -> list[Word]:
        """Words of a text holding no never_split token; `base` is its offset in the whole text."""
        if self._is_clean_ascii(segment):
            if self.lowercase:
                segment = segment.lower()
            return [(match.group(), base + match.start(), None) for match in _ASCII_WORD.finditer(segment)]
        # General path: split at whitespace and ASCII punctuation; pieces that are clean ASCII are words
        # already, the others (accents, controls, CJK, Unicode punctuation) go character by character.
        words: list[Word] = []
        for match in _RAW_PIECE.finditer(segment):
            piece = match.group()
            start = base + match.start()
            # Pieces hold no whitespace, so isprintable() is false exactly for ASCII control characters.
            if piece.isascii() and piece.isprintable():
                words.append((piece.lower() if self.lowercase else piece, start, None))
            else:
                words += self._normalize_piece(piece, start)
        return words

    def _normalize_piece(self, piece: str, base: int) -> list[Word]:
        """Normalise a whitespace-free piece char by char, splitting off punctuation and CJK characters.

        '«Ça»' at offset 10 -> [('«', 10, None), ('ca', 11, None), ('»', 13, None)];
        'a\u200bb' at 10 -> [('ab', 10, (10, 12))].
        """
        # Most pieces are one word of which each character becomes one character ('Ça' -> 'ca'): then the word's
        # characters are the piece's, in place, and one lookup a character makes it.
        one_to_one = self._one_to_one
        try:
            return [("".join([one_to_one[char] for char in piece]), base, None)]
        except KeyError:  # a character that goes, splits off, becomes several, or is not known yet
            pass
        words: list[Word] = []
        chars: list[str] = []
        origins: list[int] = []
        for offset, char in enumerate(piece, base):
            rule = self._char_rules.get(char)
            if rule is None:
                rule = self._rule(char)
            for output, alone in rule:
                if not alone:
                    chars.append(output)
                    origins.append(offset)
                    continue
                if chars:
                    words.append(traced(chars, origins))
                    chars, origins = [], []
                words.append((output, offset, None))
        if chars:
            words.append(traced(chars, origins))
        return words

    def _rule(self, char: str) -> tuple[tuple[str, bool], ...]:
        """`char`'s rule, worked out and cached (the cache is bounded: text of every script would grow it)."""
        if len(self._char_rules) >= MAX_CACHED_CHARS:
            self._char_rules.clear()
            self._one_to_one.clear()
        rule = self._char_rules[char] = self._char_rule(char)
        if len(rule) == 1 and not rule[0][1]:
            self._one_to_one[char] = rule[0][0]
        return rule

    def _char_rule(self, char: str) -> tuple[tuple[str, bool], ...]:
        """What one character becomes, in the reference's order: cleanup, CJK split, accents, lower case.

        'É' -> (('e', False),); '中' -> (('中', True),); '\\u200b' -> (); '≠' -> (('=', True),) once its
        combining slash is stripped.
        """
        if is_control(char):
            return ()
        alone = self.split_cjk and is_cjk(char)
        text = char
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if not is_nonspacing_mark(c))
        if self.lowercase:
            # Character by character, as the reference does: no final-sigma context rule.
            text = "".join(c.lower() for c in text)
        return tuple((c, alone or is_punctuation(c)) for c in text)
