"""Parity with transformers' BertTokenizerFast (the Rust tokenizers library) on the MiniLM vocabulary:
every line of the real datasets, pairs under each truncation strategy, and the hard cases."""

from __future__ import annotations

import random

import pytest

from bertforge.errors import InputError
from bertforge.tokenizer import BertTokenizer

HARD_CASES = [
    "", " ", "   \t\n  ", "\u200b", "\x00\x01",
    "Hello, world!", "Unaffable café owners!", "Café İstanbul naïve Ångström ÉCOLE", "e\u0301x re\u0301sume\u0301",
    "ﬁne ligature", "ΟΔΟΣ Σίσυφος", "Straße", "a\u200bb zero\u200dwidth\ufeffjoiners", "tab\tnew\nline\rcr\x0bvt\x0cff",
    "nbsp\u00a0thin\u2009ideo\u3000space\u2028line\u2029para\u0085nel", "ctrl\x00\x01\x1f\x7fchars\ufffd",
    "中文字符和English混合", "日本語のテキスト、カタカナ。", "한국어 텍스트", "𠀀𪜀 extension CJK 丽",
    "emoji 😀👍🏽 👨‍👩‍👧 ❤️ flags 🇫🇷", "math ≠ ≤ ∑ x² ½ ⅓", "«quotes» “curly” ‘single’ — dash – en … ellipsis",
    "x" * 150, "y" * 100, "z" * 101, "supercalifragilisticexpialidocious" * 3, "https://example.com/a?b=c&d=e#f",
    "[MASK] is a [SEP] token [CLS] [PAD] [UNK]", "a[MASK]b [mask] [Mask] [[MASK]] [MASK][MASK]", "[SEP]", "[MASKED]",
    "Ǆemal ǅ ǆ İ ı ß ẞ", "Ωmega ohm Ω K kelvin Å angstrom", "\u0300leading mark", "x\u0338", "a≠b≮c",
    "$100 +5% ^caret^ `tick` ~tilde~ |pipe| \\back\\ @at #hash", "don't won't y'all ’tis",
]


def assert_same(ours_encoding, reference_encoding, texts, keys=("input_ids", "token_type_ids", "attention_mask",
                                                                 "offset_mapping")):
    for key in keys:
        expected = [[tuple(x) if isinstance(x, list) else x for x in row] for row in reference_encoding[key]]
        got = ours_encoding[key]
        if got != expected:
            index = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            raise AssertionError(f"{key} differs for text {index}: {texts[index]!r}\n ours: {got[index]}\n"
                                 f" reference: {expected[index]}")


def assert_corpus_parity(ours, reference, texts, pairs=None, fast_path=True, **kwargs):
    got = ours(texts, pairs, return_offsets_mapping=True, return_word_ids=True, **kwargs)
    expected = reference(texts, pairs, return_offsets_mapping=True, **kwargs)
    assert_same(got, expected, texts)
    word_ids = [expected.word_ids(i) for i in range(len(texts))]
    assert got["word_ids"] == word_ids
    if fast_path:  # the fast path (no offsets asked) must give the same ids as the offset-tracking path
        assert ours(texts, pairs, **kwargs)["input_ids"] == got["input_ids"]


CORPORA = ["sst2", "conll2003", "squad_questions", "squad_contexts", "wikitext2", "pretrain_en"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CORPORA)
def test_every_line_uncased(ours, reference, corpora, name):
    assert_corpus_parity(ours, reference, corpora[name], truncation=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", CORPORA)
def test_every_line_cased(ours_cased, reference_cased, corpora, name):
    assert_corpus_parity(ours_cased, reference_cased, corpora[name], truncation=False)


@pytest.mark.parametrize("cased", [False, True])
def test_hard_cases(ours, reference, ours_cased, reference_cased, cased):
    tokenizer, ref = (ours_cased, reference_cased) if cased else (ours, reference)
    assert_corpus_parity(tokenizer, ref, HARD_CASES, truncation=False)
    for text in HARD_CASES:
        assert tokenizer.tokenize(text) == ref.tokenize(text), text


def code_point_texts(step: int = 200) -> list[str]:
    """Every code point above ASCII (surrogates aside) once, each between two letters: "aXb aYb ..."."""
    codes = [code for code in range(0x80, 0x110000) if not 0xD800 <= code <= 0xDFFF]
    return [" ".join(f"a{chr(code)}b" for code in codes[start:start + step]) for start in range(0, len(codes), step)]


@pytest.mark.slow
@pytest.mark.parametrize("cased", [False, True])
def test_every_code_point(ours, reference, ours_cased, reference_cased, cased):
    """Punctuation, accents and controls as the reference reads them (Unicode 8.0), whatever this Python's
    unicodedata says: characters added or recategorised since then are where the two would part."""
    tokenizer, ref = (ours_cased, reference_cased) if cased else (ours, reference)
    texts = code_point_texts()
    for start in range(0, len(texts), 500):  # no ASCII text here: the "fast" path is the offsets' one
        assert_corpus_parity(tokenizer, ref, texts[start:start + 500], fast_path=False, truncation=False)


def random_texts(seed: int, count: int) -> list[str]:
    """Strings of random code points from every plane (mostly the BMP), spaces and special tokens between."""
    rng = random.Random(seed)

    def char() -> str:
        code = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0x80, 0xFFFF), rng.randint(0x80, 0xFFFF),
                           rng.randint(0x10000, 0x10FFFF)])
        return " " if 0xD800 <= code <= 0xDFFF else chr(code)

    return ["".join(rng.choice([" ", "[MASK]", "\t"]) if rng.random() < 0.15 else char()
                    for _ in range(rng.randint(0, 60))) for _ in range(count)]


@pytest.mark.parametrize("strip_accents", [None, False, True])
@pytest.mark.parametrize("lowercase", [True, False])
def test_random_text(minilm_dir, lowercase, strip_accents):
    """Random Unicode under each normaliser setting: ids, offsets and word ids as the reference's."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.tokenization_bert import load_vocab

    settings = dict(do_lower_case=lowercase, strip_accents=strip_accents)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir, **settings)
    ref = transformers.BertTokenizerFast(vocab=load_vocab(str(minilm_dir / "vocab.txt")), **settings)
    texts = random_texts(seed=1 + lowercase + 2 * (strip_accents is not None) + 4 * bool(strip_accents), count=600)
    assert_corpus_parity(tokenizer, ref, texts, truncation=False)


@pytest.mark.parametrize("max_length", [128, 384])
@pytest.mark.parametrize("strategy", ["longest_first", "only_second"])
def test_squad_pairs(ours, reference, squad_pairs, max_length, strategy):
    """Every 5th question of SQuAD dev with its paragraph (2,114 pairs from every article): the truncation of
    pairs; every question and every paragraph alone are in test_every_line_*."""
    questions, contexts = map(list, zip(*squad_pairs[::5]))
    assert_corpus_parity(ours, reference, questions, contexts, truncation=strategy, max_length=max_length)


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
@pytest.mark.parametrize("max_length", [24, 64, 512])
def test_glue_pairs(ours, reference, glue_pairs, strategy, max_length):
    """Pairs where a one-sided strategy can't fit raise in both libraries; those are checked one by one."""
    firsts, seconds = map(list, zip(*glue_pairs))
    try:
        expected = reference(firsts, seconds, truncation=strategy, max_length=max_length)
    except Exception:
        expected = None
    if expected is not None:
        assert_corpus_parity(ours, reference, firsts, seconds, truncation=strategy, max_length=max_length)
        return
    from bertforge import BertforgeError
    with pytest.raises(BertforgeError, match=strategy):
        ours(firsts, seconds, truncation=strategy, max_length=max_length)
    for first, second in glue_pairs[:300]:
        try:
            expected = reference(first, second, truncation=strategy, max_length=max_length,
                                 return_offsets_mapping=True)
        except Exception as error:
            assert "too short" in str(error)
            with pytest.raises(BertforgeError, match="can't fit"):
                ours(first, second, truncation=strategy, max_length=max_length)
            continue
        got = ours(first, second, truncation=strategy, max_length=max_length, return_offsets_mapping=True)
        assert_same({k: [v] for k, v in got.items()}, {k: [v] for k, v in expected.items()}, [(first, second)])


@pytest.mark.parametrize("padding", [True, "longest", "max_length"])
@pytest.mark.parametrize("truncation", [True, False, "only_first"])
def test_padding_and_truncation(ours, reference, corpora, padding, truncation):
    texts = corpora["squad_contexts"][:40] + HARD_CASES
    assert_corpus_parity(ours, reference, texts, padding=padding, truncation=truncation, max_length=64)
    single = texts[0]
    got = ours(single, padding=padding, truncation=truncation, max_length=64, return_offsets_mapping=True)
    expected = reference(single, padding=padding, truncation=truncation, max_length=64, return_offsets_mapping=True)
    assert_same({k: [v] for k, v in got.items()}, {k: [v] for k, v in expected.items()}, [single])
    assert got.word_ids() == expected.word_ids()


def test_tensors_match(ours, reference):
    texts = ["A short one.", "A somewhat longer second sentence, with a comma."]
    got = ours(texts, padding=True, return_tensors="pt", return_offsets_mapping=True)
    expected = reference(texts, padding=True, return_tensors="pt", return_offsets_mapping=True)
    for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
        assert got[key].dtype == expected[key].dtype
        assert got[key].tolist() == expected[key].tolist()
    single = ours("One text.", return_tensors="pt")["input_ids"]
    assert single.tolist() == reference("One text.", return_tensors="pt")["input_ids"].tolist()


def test_decoding_helpers_match(ours, reference, corpora):
    texts = corpora["squad_questions"][:50]
    batch = ours(texts, padding=True, return_tensors="pt")["input_ids"]
    assert ours.batch_decode(batch, skip_special_tokens=True) == reference.batch_decode(batch, skip_special_tokens=True)
    assert ours.batch_decode(batch.tolist()) == reference.batch_decode(batch.tolist())
    first = batch[0]
    for one in (int(first[1]), first[1]):  # one id: a token, not its letters
        assert ours.decode(one) == reference.decode(one)
    tokens = ours.convert_ids_to_tokens(first)
    assert ours.convert_tokens_to_string(tokens) == reference.convert_tokens_to_string(tokens)
    assert ours.encode(texts[0], texts[1]) == reference.encode(texts[0], texts[1])
    assert ours.get_vocab() == reference.get_vocab()
    # transformers 5's forms: several sequences to decode, one sequence to batch_decode, several texts to encode
    for several in (batch.tolist()[:3], batch[:3]):
        assert ours.decode(several) == reference.decode(several)
    assert ours.batch_decode(batch[0].tolist()) == reference.batch_decode(batch[0].tolist())
    assert ours.encode(texts[:3]) == reference.encode(texts[:3])
    with pytest.raises(InputError, match="decode takes token ids"):
        ours.decode(["hello"])


@pytest.mark.parametrize("cased", [False, True])
def test_decode_matches(ours, reference, ours_cased, reference_cased, corpora, cased):
    tokenizer, ref = (ours_cased, reference_cased) if cased else (ours, reference)
    texts = corpora["wikitext2"][:300] + corpora["squad_questions"][:300] + HARD_CASES
    for ids in tokenizer(texts, truncation=False)["input_ids"]:
        assert tokenizer.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
        assert tokenizer.decode(ids) == ref.decode(ids)  # the same default too


def test_words_given_split_match(ours, reference, data_dir):
    # CoNLL sentences as words (is_split_into_words): ids, word ids (one per given word) and offsets within words.
    sentences, words = [], []
    for line in (data_dir / "conll2003" / "eng.testa").read_text(encoding="utf-8").splitlines()[:6000]:
        if line.split() and line.split()[0] != "-DOCSTART-":
            words.append(line.split()[0])
        elif words:
            sentences, words = sentences + [words], []
    sentences.append(["New", "York", "", "U.S.-based", "café", "İstanbul"])  # an empty word, and splits inside words
    for start in range(0, len(sentences), 32):
        batch = sentences[start:start + 32]
        encoded = ours(batch, is_split_into_words=True, return_offsets_mapping=True, truncation=False)
        expected = reference(batch, is_split_into_words=True, return_offsets_mapping=True)
        assert encoded["input_ids"] == expected["input_ids"]
        for row in range(len(batch)):
            assert encoded.word_ids(row) == expected.word_ids(row), batch[row]
            assert encoded["offset_mapping"][row] == [tuple(span) for span in expected["offset_mapping"][row]]
    pair = ours(["Hello", "world"], ["New", "York"], is_split_into_words=True)
    assert pair["input_ids"] == reference(["Hello", "world"], ["New", "York"], is_split_into_words=True)["input_ids"]
    assert pair.word_ids() == [None, 0, 1, None, 0, 1, None]
    pairs = list(zip(sentences[:8], sentences[8:16]))  # a batch of (words, words) items, as a QA recipe gives
    encoded = ours(pairs, is_split_into_words=True, return_offsets_mapping=True, truncation=False)
    expected = reference(pairs, is_split_into_words=True, return_offsets_mapping=True)
    assert (encoded["input_ids"], encoded["token_type_ids"]) == (expected["input_ids"], expected["token_type_ids"])
    for row in range(len(pairs)):
        assert (encoded.word_ids(row), encoded.sequence_ids(row)) == (expected.word_ids(row),
                                                                      expected.sequence_ids(row))
    with pytest.raises(InputError, match="a list of words"):
        ours("not split", is_split_into_words=True)
