"""The alignment methods at their edges, against the tokenizers library's Encoding and transformers' BatchEncoding:
token indexes past the row, and pairs where one text gives no tokens (a space, a zero-width space)."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

# Pairs with a side that gives no tokens, each side in turn, and both.
EMPTY_SIDED_PAIRS = [(" ", "Paris"), ("Paris", " "), ("\u200b", "My name is John"), ("My name is John", "\u200b"),
                     (" ", "\u200b")]
TOKEN_METHODS = ("token_to_chars", "token_to_word", "token_to_sequence")


def assert_same_answers(mine, theirs, n_tokens: int, n_chars: int, n_words: int):
    """mine(method, *arguments) == theirs(method, *arguments) for every alignment method at every token,
    character and word index up to past the end, in both sequences and in one no row has (2)."""
    for token in [*range(n_tokens + 2), 1200]:
        for method in TOKEN_METHODS:
            assert mine(method, token) == theirs(method, token), (method, token)
    for sequence in (0, 1, 2):
        for char in range(n_chars + 2):
            for method in ("char_to_token", "char_to_word"):
                assert mine(method, char, sequence) == theirs(method, char, sequence), (method, char, sequence)
        for word in range(n_words + 2):
            for method in ("word_to_tokens", "word_to_chars"):
                assert mine(method, word, sequence) == theirs(method, word, sequence), (method, word, sequence)


def asking(encoding):
    return lambda method, *arguments: getattr(encoding, method)(*arguments)


def asking_row(batch, row: int):
    def ask(method, *arguments):
        if method == "word_to_chars" and batch.word_to_tokens(row, *arguments) is None:
            return None  # transformers fails on a word the row lacks; bertforge says None
        return getattr(batch, method)(row, *arguments)
    return ask


def assert_same_alignment(got, expected, texts: list[str]):
    """Each row of two BatchEncodings, as Encodings and through the batch's own methods."""
    assert got.n_sequences == expected.n_sequences
    assert len(got.encodings) == len(expected.encodings)
    n_chars = max(map(len, texts))
    for row, (mine, theirs) in enumerate(zip(got.encodings, expected.encodings)):
        assert (mine.n_sequences, mine.sequence_ids, mine.word_ids) == \
            (theirs.n_sequences, theirs.sequence_ids, theirs.word_ids)
        n_words = max((word for word in theirs.word_ids if word is not None), default=0)
        assert_same_answers(asking(mine), asking(theirs), len(theirs), n_chars, n_words)
        assert_same_answers(asking_row(got, row), asking_row(expected, row), len(theirs), n_chars, n_words)


def test_a_token_past_the_row_is_none(ours, reference):
    """As the tokenizers library's own tests ask it, and as transformers' BatchEncoding passes it on."""
    encoding = ours("My name is John", "pair").encodings[0]
    assert (encoding.token_to_sequence(1200), encoding.token_to_chars(50), encoding.token_to_word(50)) == \
        (None, None, None)
    for texts in (["My name is John"], ["My name is John", "pair"]):
        assert_same_alignment(ours(*texts), reference(*texts), texts)


def test_a_negative_token_counts_from_the_end(ours):
    """As transformers' BatchEncoding means it (its tokenizers Encoding rejects any negative index); past the
    start, None as past the end."""
    batch = ours("My name is John", "pair")
    encoding, last = batch.encodings[0], len(batch["input_ids"]) - 1
    for method in TOKEN_METHODS:
        assert getattr(encoding, method)(-2) == getattr(encoding, method)(last - 1) is not None
        assert getattr(batch, method)(0, -2) == getattr(batch, method)(0, last - 1)
        assert getattr(encoding, method)(-last - 2) is None


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("pair", EMPTY_SIDED_PAIRS, ids=ascii)
def test_a_pair_with_an_empty_side(ours, reference, pair, add_special_tokens):
    """The empty side has no tokens to answer with: it must not answer with the other side's (without special
    tokens, a pair whose second text gave none is still a pair, as the tokenizer says)."""
    got, expected = ours(*pair, add_special_tokens=add_special_tokens), \
        reference(*pair, add_special_tokens=add_special_tokens)
    assert got["input_ids"] == expected["input_ids"]
    assert_same_alignment(got, expected, list(pair))


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_empty_sides_in_padded_batches_of_windows(ours, reference, padding_side, add_special_tokens):
    """Rows that shift (left padding) beside the windows of a pair that overflows."""
    firsts, seconds = map(list, zip(*EMPTY_SIDED_PAIRS, ("Who?", "Paris is the capital and largest city of France.")))
    options = dict(padding=True, padding_side=padding_side, truncation="only_second", max_length=9, stride=2,
                   return_overflowing_tokens=True, add_special_tokens=add_special_tokens)
    got, expected = ours(firsts, seconds, **options), reference(firsts, seconds, **options)
    assert got["input_ids"] == expected["input_ids"] and len(got["input_ids"]) > len(firsts)
    assert_same_alignment(got, expected, firsts + seconds)
