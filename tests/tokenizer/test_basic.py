"""BasicTokenizer: cleanup, lower-casing and accents, punctuation and CJK splitting, offsets, fast vs general path."""

from __future__ import annotations

import unicodedata

import pytest

from bertforge.tokenizer import BasicTokenizer


def words(text: str, **settings) -> list[str]:
    return BasicTokenizer(**settings).split(text)


def test_whitespace_and_punctuation():
    assert words("  Hello,\tworld!\n") == ["hello", ",", "world", "!"]
    assert words("don't $5+3=8 a_b") == ["don", "'", "t", "$", "5", "+", "3", "=", "8", "a", "_", "b"]
    assert words("«Ça va?» — oui…") == ["«", "ca", "va", "?", "»", "—", "oui", "…"]
    assert words("") == [] and words(" \t\n\u3000") == []


def test_lower_case_and_accents():
    assert words("Café NAÏVE Ångström") == ["cafe", "naive", "angstrom"]
    assert words("Café NAÏVE", lowercase=False) == ["Café", "NAÏVE"]
    assert words("Café NAÏVE", lowercase=False, strip_accents=True) == ["Cafe", "NAIVE"]
    assert words("Café NAÏVE", lowercase=True, strip_accents=False) == ["café", "naïve"]
    assert words("İstanbul") == ["istanbul"]  # I + combining dot above; the dot is stripped
    assert words("ΟΔΟΣ") == ["οδοσ"]  # character by character: no final sigma


def test_cjk_characters_stand_alone():
    assert words("中文abc字") == ["中", "文", "abc", "字"]
    assert words("中文abc字", split_cjk=False) == ["中文abc字"]
    # Kana and Hangul are not CJK ideographs (cased here: uncased NFD would decompose the Hangul syllables).
    assert words("カタカナ한국어", lowercase=False) == ["カタカナ한국어"]


def test_control_and_zero_width_characters_are_removed():
    assert words("a\u200bb c\x00d e\ufffdf g\x7fh") == ["ab", "cd", "ef", "gh"]
    assert words("tab\tnl\ncr\rnbsp\u00a0") == ["tab", "nl", "cr", "nbsp"]
    assert words("a\x0bb") == ["ab"]  # vertical tab is a control character, deleted before whitespace is seen


def test_never_split_is_case_sensitive_and_unnormalised():
    tokenizer = BasicTokenizer(never_split=["[MASK]", "[SEP]"])
    assert tokenizer.split("a [MASK]b[SEP] [mask]") == ["a", "[MASK]", "b", "[SEP]", "[", "mask", "]"]


def test_offsets_point_into_the_original_text():
    tokenizer = BasicTokenizer(never_split=["[MASK]"])
    text = "Cafe\u0301 a\u200bb, 中[MASK]"
    result = tokenizer.split_with_offsets(text)
    assert [word for word, _, _ in result] == ["cafe", "ab", ",", "中", "[MASK]"]
    assert result[0] == ("cafe", 0, None)  # the stripped U+0301 (index 4) leaves c, a, f, e in place
    assert result[1] == ("ab", 6, (6, 8))  # the zero-width space at 7 is gone
    assert result[2] == (",", 9, None) and result[3] == ("中", 11, None) and result[4] == ("[MASK]", 12, None)


def test_fast_path_equals_general_path(corpora):
    """Clean ASCII text goes through one regex; the per-character path must split it the same way."""
    tokenizer = BasicTokenizer()
    ascii_lines = [line for line in corpora["wikitext2"][:3000] + corpora["sst2"][:3000] if line.isascii()]
    for line in ascii_lines:
        general = [word for piece in line.split() for word, _, _ in tokenizer._normalize_piece(piece, 0)]
        assert tokenizer.split(line) == general, line



def test_a_word_whose_characters_are_the_texts_in_place_is_traced_as_such(monkeypatch):
    """A word whose characters each come from one of the text's, in order and in place ('Ça' -> 'ca'), has origins
    None, as an ASCII word; one missing a character, or with a character that became several, lists them. The same
    on the first call (characters not yet known) and on later ones (one lookup a character), and with a rule cache
    so small that it is cleared on the way."""
    text = "Ça résumé, Straße naïve\u0301 한국 a\u200bb Ça"
    hangul = unicodedata.normalize("NFD", "한국")  # each syllable becomes three letters (jamo)
    expected = [("ca", 0, None), ("resume", 3, None), (",", 9, None), ("straße", 11, None), ("naive", 18, None),
                (hangul, 25, (25, 25, 25, 26, 26, 26)), ("ab", 28, (28, 30)), ("ca", 32, None)]
    tokenizer = BasicTokenizer()
    assert tokenizer.split_with_offsets(text) == expected
    assert tokenizer.split_with_offsets(text) == expected
    monkeypatch.setattr("bertforge.tokenizer.basic.MAX_CACHED_CHARS", 4)
    small = BasicTokenizer()
    for _ in range(3):
        assert small.split_with_offsets(text) == expected
        assert len(small._char_rules) <= 4 and len(small._one_to_one) <= 4


@pytest.mark.parametrize("lowercase", [True, False])
def test_every_character_against_the_reference(reference, reference_cased, lowercase):
    """Each code point assigned in Unicode 3.2, between two letters, splits as in the reference.

    Characters added later differ where Python's Unicode tables (14.0 for 3.11) and those compiled into
    tokenizers disagree; four older ones changed category since (listed below). Those are known differences.
    """
    changed_since = {0x166D, 0x1734, 0x1885, 0x1886}
    ref = reference if lowercase else reference_cased
    normalizer, pre_tokenizer = ref.backend_tokenizer.normalizer, ref.backend_tokenizer.pre_tokenizer
    tokenizer = BasicTokenizer(lowercase=lowercase)
    code_points = [c for c in range(0x110000) if unicodedata.ucd_3_2_0.category(chr(c)) != "Cn"
                   and not 0xD800 <= c <= 0xDFFF and c not in changed_since]
    for start in range(0, len(code_points), 5000):
        chunk = code_points[start:start + 5000]
        text = " ".join("x" + chr(c) + "x" for c in chunk)
        expected = [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
        if tokenizer.split(text) != expected:
            for c in chunk:
                one = "x" + chr(c) + "x"
                expected = [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(one))]
                assert tokenizer.split(one) == expected, f"U+{c:04X} {unicodedata.name(chr(c), '')}"
