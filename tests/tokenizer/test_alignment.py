"""Where each token came from, as transformers' fast tokenizers answer it (the QA and NER recipes of its course use
sequence_ids, char_to_token and word_ids), against BertTokenizerFast on real text: SQuAD questions with contexts in
overlapping windows, CoNLL sentences as words, SST-2 sentences, every token, character and word of every row."""

from __future__ import annotations

import pytest

from bertforge.errors import BertforgeError

AWKWARD = ["", "   \t ", "Café İstanbul naïve", "中文字符和English混合", "emoji 😀👍🏽 ok"]


def assert_same_alignment(got, expected, texts: list[tuple[str, ...]]):
    """`texts`: per row, its text (and pair), which the character positions count in."""
    rows = len(expected["input_ids"])
    assert got.n_sequences == expected.n_sequences
    for row in range(rows):
        assert got.tokens(row) == expected.tokens(row)
        assert got.sequence_ids(row) == expected.sequence_ids(row)
        assert got.word_ids(row) == expected.word_ids(row)
        for token in range(len(expected.tokens(row))):
            assert got.token_to_chars(row, token) == expected.token_to_chars(row, token), (row, token)
            assert got.token_to_word(row, token) == expected.token_to_word(row, token)
            assert got.token_to_sequence(row, token) == expected.token_to_sequence(row, token)
        for sequence, text in enumerate(texts[row]):
            for char in range(len(text) + 1):
                assert got.char_to_token(row, char, sequence) == expected.char_to_token(row, char, sequence), \
                    (row, sequence, char)
                assert got.char_to_word(row, char, sequence) == expected.char_to_word(row, char, sequence)
            words = {word for word in expected.word_ids(row) if word is not None}
            for word in range(max(words, default=-1) + 2):
                span = expected.word_to_tokens(row, word, sequence)
                assert got.word_to_tokens(row, word, sequence) == span
                # (transformers fails on a word the row lacks; bertforge says None)
                chars = expected.word_to_chars(row, word, sequence) if span is not None else None
                assert got.word_to_chars(row, word, sequence) == chars


def test_question_answering_windows(ours, reference, squad_pairs):
    questions, contexts = map(list, zip(*squad_pairs[:6]))
    options = dict(truncation="only_second", max_length=96, stride=32, return_overflowing_tokens=True,
                   padding="max_length")
    got, expected = ours(questions, contexts, **options), reference(questions, contexts, **options)
    assert len(expected["input_ids"]) > len(questions)  # contexts did overflow
    texts = [(questions[i], contexts[i]) for i in expected["overflow_to_sample_mapping"]]
    assert_same_alignment(got, expected, texts)


def test_sentences_and_words(ours, reference, corpora):
    texts = corpora["sst2"][:20] + AWKWARD
    got, expected = ours(texts, padding=True, return_tensors="pt"), reference(texts, padding=True, return_tensors="pt")
    assert_same_alignment(got, expected, [(text,) for text in texts])
    words = [sentence.split(" ") for sentence in corpora["conll2003"][1:11]]
    got, expected = ours(words, is_split_into_words=True), reference(words, is_split_into_words=True)
    for row in range(len(words)):  # the character positions of a word list count within each word
        assert got.tokens(row) == expected.tokens(row) and got.word_ids(row) == expected.word_ids(row)
        for word in range(len(words[row])):
            assert got.word_to_tokens(row, word) == expected.word_to_tokens(row, word)
    one_got, one_expected = ours("Unaffable cafés!"), reference("Unaffable cafés!")
    assert (one_got.char_to_token(12), one_got.token_to_chars(1), one_got.tokens()) == \
        (one_expected.char_to_token(12), tuple(one_expected.token_to_chars(1)), one_expected.tokens())


def test_pairs_as_tuples_and_without_special_tokens(ours, reference, glue_pairs):
    pairs = glue_pairs[:10]
    got, expected = ours(pairs), reference(pairs)
    assert got["input_ids"] == expected["input_ids"] and got["token_type_ids"] == expected["token_type_ids"]
    assert_same_alignment(got, expected, pairs)
    firsts, seconds = map(list, zip(*pairs))
    got = ours(firsts, seconds, add_special_tokens=False, truncation=True, max_length=20)
    expected = reference(firsts, seconds, add_special_tokens=False, truncation=True, max_length=20)
    assert_same_alignment(got, expected, pairs)


def test_collated_rows_do_not_know_their_text(ours):
    padded = ours.pad([ours("a b"), ours("c")])
    with pytest.raises(BertforgeError, match="does not know where its tokens came from"):
        padded.tokens(0)
