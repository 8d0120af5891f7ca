"""Added tokens against the reference (tokenizers, through transformers' BertTokenizerFast): how normalized tokens
read back, and where single_word, lstrip and rstrip tokens match."""

from __future__ import annotations

import json
import unicodedata

import pytest

from bertforge.tokenizer import BertTokenizer
from bertforge.tokenizer.added import AddedToken, is_word_char

NEW_ID = 30522  # the first id past MiniLM's vocabulary
# Normalised, each reads back otherwise: accents stripped, lower-cased, CJK spaced, a control dropped.
NORMALIZED = ["Zürich", "COVID", "中文", "A\u200bB", "İs"]
TEXTS = ["Zürich COVID", "In Zürich, COVID", "zurich covid Covid ZÜRICH", "中文 and A\u200bB AB", "İs this", ""]


def test_normalized_token_shown_as_matched(tiny_vocab):
    tokenizer = BertTokenizer(tiny_vocab, added_tokens={21: AddedToken("CAFÉ2"), 22: AddedToken("[E1]", special=True,
                                                                                                  normalized=False)})
    assert tokenizer.convert_ids_to_tokens([21, 22]) == ["cafe2", "[E1]"]
    assert tokenizer.convert_tokens_to_ids(["CAFÉ2", "cafe2", "[E1]"]) == [21, 1, 22]
    assert tokenizer.tokenize("un Café2 [E1]") == ["un", "cafe2", "[E1]"]


@pytest.fixture(scope="module")
def saved_with_normalized_tokens(minilm_dir, tmp_path_factory):
    """A directory saved by transformers with NORMALIZED added: (its directory, the reference loaded from it)."""
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("normalized")
    reference = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    reference.add_tokens(NORMALIZED)
    reference.save_pretrained(directory)
    return directory, transformers.BertTokenizerFast.from_pretrained(directory)


def test_normalized_tokens_read_back_normalised(saved_with_normalized_tokens):
    directory, reference = saved_with_normalized_tokens
    ours = BertTokenizer.from_pretrained(directory)
    ids = list(range(NEW_ID, NEW_ID + len(NORMALIZED)))
    assert ours.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(ids)[:2] == ["zurich", "covid"]
    # Looked up by what was added; the normalised spelling is a different token ('zurich' is in the vocabulary).
    tokens = NORMALIZED + ["zurich", "covid"]
    assert ours.convert_tokens_to_ids(tokens) == reference.convert_tokens_to_ids(tokens)
    for text in TEXTS:
        assert ours.tokenize(text) == reference.tokenize(text), text
        encoded = ours(text, return_offsets_mapping=True)
        expected = reference(text, return_offsets_mapping=True)
        assert encoded["input_ids"] == expected["input_ids"], text
        assert encoded["offset_mapping"] == [tuple(span) for span in expected["offset_mapping"]], text
        for skip in (True, False):
            assert ours.decode(encoded["input_ids"], skip_special_tokens=skip) == \
                reference.decode(expected["input_ids"], skip_special_tokens=skip), text
    assert ours.decode(ours("In Zürich, COVID")["input_ids"], skip_special_tokens=True) == "in zurich, covid"


def test_normalized_tokens_saved_as_added(saved_with_normalized_tokens, tmp_path):
    """The files keep what was added ('Zürich'); transformers and tokenizers read them back as the original."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    directory, reference = saved_with_normalized_tokens
    BertTokenizer.from_pretrained(directory).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert [entry["content"] for entry in saved["added_tokens"] if entry["id"] >= NEW_ID] == NORMALIZED
    assert "zurich" in saved["model"]["vocab"] and "Zürich" not in saved["model"]["vocab"]
    ids = list(range(NEW_ID, NEW_ID + len(NORMALIZED)))
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert [backend.id_to_token(i) for i in ids] == reference.convert_ids_to_tokens(ids)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert again.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)
    for text in TEXTS:
        assert again(text)["input_ids"] == reference(text)["input_ids"], text


# ---------------------------------------------------------------- single_word, lstrip, rstrip

# Next to a token: where Python's \w or \s and the reference's (Rust regex's Unicode \w, char::is_whitespace)
# disagree, then ordinary cases.
FLAG_TEXTS = [
    "zorb²", "zorb½ x", "zorb\u0301", "zorbा", "zorb‿", "\u200dzorb", "zorb\u200c", "Ⓐzorb", "zorb\x1c",
    "zorb\x1cx", "a zorb\u2003\x1f b", "zorb\u180ex", "zorb zorbs xzorb zorb. Zorb", "zorb_", "zorb7", "ǅzorb",
    "ⅻzorb", "zorbzorb zorb", "  zorb  ", "zorb\t\n\x0b\x0c\r\x85x", "zorb\u00a0\u3000end", "x\u0301 zorb",
]
FLAGS = [{"single_word": True}, {"single_word": True, "rstrip": True}, {"single_word": True, "lstrip": True},
         {"lstrip": True, "rstrip": True}]


@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("flags", FLAGS, ids=lambda flags: "+".join(flags))
def test_flags_match_where_the_reference_does(minilm_dir, flags, normalized):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    reference.add_tokens([transformers.AddedToken("zorb", normalized=normalized, **flags)])
    ours = BertTokenizer(minilm_dir / "vocab.txt",
                         added_tokens={NEW_ID: AddedToken("zorb", normalized=normalized, **flags)})
    for text in FLAG_TEXTS:
        expected = reference(text, return_offsets_mapping=True)
        encoded = ours(text, return_offsets_mapping=True)
        assert encoded["input_ids"] == expected["input_ids"], text
        assert encoded["offset_mapping"] == [tuple(span) for span in expected["offset_mapping"]], text


CHINESE_TEXTS = ["文 zorb", "文zorb", "zorb文", "zorb 文", "文  zorb  字", "x文 zorb 文x", "zorb\u3000文"]


@pytest.mark.parametrize("flags", [{"lstrip": True}, {"rstrip": True}, {"lstrip": True, "rstrip": True}],
                         ids=lambda flags: "+".join(flags))
def test_stripping_next_to_a_chinese_character_keeps_the_character(minilm_dir, flags):
    # The normaliser puts spaces around Chinese characters; the whitespace a normalized token strips must not take
    # the character it came from (which was dropped).
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    reference.add_tokens([transformers.AddedToken("zorb", normalized=True, **flags)])
    ours = BertTokenizer(minilm_dir / "vocab.txt", added_tokens={NEW_ID: AddedToken("zorb", normalized=True, **flags)})
    for text in CHINESE_TEXTS:
        encoded = ours(text, return_offsets_mapping=True)
        assert encoded["input_ids"] == reference(text)["input_ids"], text
        # Each character's own span; the reference's span for the token reaches back over the character too.
        spans = dict(zip(encoded["offset_mapping"], ours.convert_ids_to_tokens(encoded["input_ids"])))
        assert all(spans.get((i, i + 1)) in ("文", "[UNK]") for i, char in enumerate(text) if char in "文字"), text


def test_word_characters():
    word = ["a", "É", "ǅ", "中", "7", "٣", "Ⅻ", "_", "‿", "\u0301", "ा", "\u20dd", "\u200c", "\u200d", "Ⓐ", "🅰"]
    other = [" ", "-", ".", "²", "½", "௰", "\u200b", "\x1c", "€", "😀", "\u00a0"]
    assert [char for char in word if not is_word_char(char)] == []
    assert [char for char in other if is_word_char(char)] == []


def test_word_characters_are_the_references(minilm_dir):
    """is_word_char against the reference's single_word check on every code point of the Basic Multilingual Plane
    that Python's Unicode tables assign (newer assignments may differ), and on the astral symbols it lists."""
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    backend.no_padding()
    backend.no_truncation()
    backend.add_tokens([tokenizers.AddedToken("zorb", single_word=True, normalized=False)])
    chars = [chr(code) for code in [*range(0xD800), *range(0xE000, 0x10000), *range(0x1F12F, 0x1F18B)]
             if unicodedata.category(chr(code)) != "Cn"]
    # "zorb" + c, two spaces apart (7 characters each): the token is found at its segment's start just when c is no
    # word character.
    encoding = backend.encode("  ".join("zorb" + char for char in chars))
    found = {start for token_id, (start, _) in zip(encoding.ids, encoding.offsets) if token_id == NEW_ID}
    expected = [(7 * index) not in found for index in range(len(chars))]
    got = [is_word_char(char) for char in chars]
    wrong = [f"U+{ord(char):04X}" for char, mine, theirs in zip(chars, got, expected) if mine != theirs]
    assert not wrong, wrong[:20]
