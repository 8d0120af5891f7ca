"""Where each token came from, as transformers' fast tokenizers answer it (the QA and NER recipes of its course use
sequence_ids, char_to_token and word_ids), against BertTokenizerFast on real text: SQuAD questions with contexts in
overlapping windows, CoNLL sentences as words, SST-2 sentences, every token, character and word of every row."""

from __future__ import annotations

import pytest

from bertforge.errors import BertforgeError
from bertforge.tokenizer import BertTokenizer

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


ENCODING_FIELDS = ("ids", "type_ids", "tokens", "offsets", "attention_mask", "special_tokens_mask", "word_ids",
                   "sequence_ids", "n_sequences")


def assert_same_encodings(got, expected, longest_text: int):
    """batch.encodings: each row as the tokenizers library's Encoding, fields and alignment methods."""
    assert len(got.encodings) == len(expected.encodings)
    for mine, theirs in zip(got.encodings, expected.encodings):
        assert {name: getattr(mine, name) for name in ENCODING_FIELDS} == \
            {name: getattr(theirs, name) for name in ENCODING_FIELDS}
        assert len(mine) == len(theirs)
        assert [row.ids for row in mine.overflowing] == [row.ids for row in theirs.overflowing]
        for token in range(len(theirs)):
            for method in ("token_to_chars", "token_to_word", "token_to_sequence"):
                assert getattr(mine, method)(token) == getattr(theirs, method)(token), (method, token)
        for sequence in (0, 1):  # a single text asked about sequence 1 answers as about its only one
            for char in range(longest_text + 1):
                assert mine.char_to_token(char, sequence) == theirs.char_to_token(char, sequence), (char, sequence)
                assert mine.char_to_word(char, sequence) == theirs.char_to_word(char, sequence), (char, sequence)
            for word in range(max((w for w in theirs.word_ids if w is not None), default=-1) + 1):
                assert mine.word_to_tokens(word, sequence) == theirs.word_to_tokens(word, sequence), (word, sequence)
                assert mine.word_to_chars(word, sequence) == theirs.word_to_chars(word, sequence), (word, sequence)


def test_each_row_as_the_tokenizers_librarys_encoding(ours, reference, squad_pairs, corpora):
    questions, contexts = map(list, zip(*squad_pairs[:3]))
    options = dict(truncation="only_second", max_length=96, stride=32, return_overflowing_tokens=True,
                   padding="max_length")
    expected = reference(questions, contexts, **options)
    assert any(row.overflowing for row in expected.encodings)  # the first window of a context lists the others
    assert_same_encodings(ours(questions, contexts, **options), expected, max(map(len, contexts)))
    texts = corpora["sst2"][:8] + AWKWARD
    for options in ({"padding": True, "return_tensors": "pt"}, {"return_token_type_ids": False,
                                                                "return_attention_mask": False}):
        assert_same_encodings(ours(texts, **options), reference(texts, **options), max(map(len, texts)))
    assert_same_encodings(ours(texts[0]), reference(texts[0]), len(texts[0]))


def test_an_encoding_keeps_the_inputs_and_settings_it_was_made_with(minilm_dir, fresh_reference, corpora):
    """Tokens, word ids and positions are worked out when first asked for, but answer for the call as it was made:
    the caller's lists edited afterwards, tokens added or settings changed leave them as transformers keeps them."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    sentences = corpora["conll2003"][:3]
    words = [sentence.split() for sentence in sentences]
    texts = corpora["sst2"][:3]
    calls = []
    for tokenizer in (ours, fresh_reference):
        as_words, as_texts = [list(row) for row in words], list(texts)
        made = [tokenizer(as_words, is_split_into_words=True), tokenizer(as_texts, as_texts[::-1]),
                tokenizer(as_texts[0], truncation=True, max_length=6), tokenizer(as_texts[1], padding="max_length",
                                                                                max_length=40)]
        as_words[0].pop(0)
        as_words.pop()
        as_texts[0] = "another text altogether"
        tokenizer.add_tokens([as_texts[1].split()[1]])
        tokenizer.add_special_tokens({"cls_token": "[unused1]"})
        tokenizer.truncation_side = "left"
        tokenizer.padding_side = "left"
        tokenizer.model_max_length = 4
        calls.append(made)
    for got, expected in zip(*calls):
        for row in range(len(expected["input_ids"]) if isinstance(expected["input_ids"][0], list) else 1):
            assert got.tokens(row) == expected.tokens(row)
            assert got.word_ids(row) == expected.word_ids(row)
            assert got.sequence_ids(row) == expected.sequence_ids(row)
            assert [got.token_to_chars(row, token) for token in range(len(expected.tokens(row)))] == \
                [expected.token_to_chars(row, token) for token in range(len(expected.tokens(row)))]


def test_a_subclass_that_changes_the_text_aligns_with_its_own_ids(minilm_dir):
    """A tokenizer subclass whose __call__ adds a prompt: tokens and word ids are those of the ids it made."""
    class Prompted(BertTokenizer):
        def __call__(self, text, *args, **kwargs):
            return super().__call__(f"query: {text}" if isinstance(text, str) else text, *args, **kwargs)

    prompted = Prompted.from_pretrained(minilm_dir)
    encoding = prompted("hello world")
    assert encoding.tokens() == ["[CLS]", "query", ":", "hello", "world", "[SEP]"]
    assert len(encoding.tokens()) == len(encoding["input_ids"]) and encoding.word_ids() == [None, 0, 1, 2, 3, None]
