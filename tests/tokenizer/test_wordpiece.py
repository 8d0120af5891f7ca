"""WordPiece: greedy longest-match-first on a tiny hand-written vocabulary."""

from __future__ import annotations

from bertforge.tokenizer import WordPiece
from bertforge.tokenizer.vocab import Vocab
from bertforge.tokenizer.wordpiece import WordPieceCache


def test_greedy_longest_match(tiny_vocab):
    wordpiece = WordPiece(tiny_vocab)
    assert wordpiece.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert wordpiece.tokenize("wanted") == ["want", "##ed"]
    assert wordpiece.tokenize("running") == ["runn", "##ing"]
    assert wordpiece.split("unaffable") == ((5, 6, 7), ((0, 2), (2, 5), (5, 9)))


def test_uncoverable_word_is_one_unk(tiny_vocab):
    wordpiece = WordPiece(tiny_vocab)
    # "aff" exists only as a continuation; "unaffx" covers "un" + "##aff" and then fails on "x": the whole word goes.
    assert wordpiece.tokenize("affable") == ["[UNK]"]
    assert wordpiece.tokenize("unaffx") == ["[UNK]"]
    assert wordpiece.split("unaffx") == ((1,), ((0, 6),))


def test_word_length_limit(tiny_vocab):
    wordpiece = WordPiece(tiny_vocab)
    assert wordpiece.tokenize("a" + "b" * 99) == ["a"] + ["##b"] * 99  # exactly 100 characters: split
    assert wordpiece.tokenize("a" + "b" * 100) == ["[UNK]"]  # 101
    assert wordpiece.split("a" * 150) == ((1,), ((0, 150),))


def test_longest_not_first(tiny_vocab):
    # "##b" and "##c" exist, "##bc" doesn't: "abc" -> a ##b ##c; with "##bc" added it becomes a ##bc.
    assert WordPiece(tiny_vocab).tokenize("abc") == ["a", "##b", "##c"]
    assert WordPiece(Vocab(tiny_vocab.id_to_token + ["##bc"])).tokenize("abc") == ["a", "##bc"]


def test_added_tokens_are_not_pieces(tiny_vocab):
    # A token added after the vocabulary is matched whole in the text, never produced by WordPiece.
    tiny_vocab.add("##bc", len(tiny_vocab))
    assert WordPiece(tiny_vocab).tokenize("abc") == ["a", "##b", "##c"]


def test_cache_computes_once_and_stays_bounded(tiny_vocab):
    cache = WordPieceCache(WordPiece(tiny_vocab), max_words=2)
    assert cache["unaffable"] == WordPiece(tiny_vocab).split("unaffable")
    cache["wanted"], cache["running"]
    assert len(cache) <= 2 and "running" in cache
