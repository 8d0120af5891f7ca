"""Arguments of the wrong kind get a one-line error naming the argument (and the item, in a batch), where they
used to be read as something else (a dict as a batch of its keys, a None pair as no pair) or fail deep inside
(TypeError from a regex, KeyError); the kinds of batch the tokenizer takes keep working."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.errors import ConfigError, InputError
from bertforge.tokenizer import BertTokenizer


def test_the_kinds_of_batch_taken_encode_alike(ours):
    texts = ["a b", "c"]
    expected = ours(texts)["input_ids"]
    for batch in (tuple(texts), np.array(texts), (text for text in texts), iter(texts)):
        assert ours(batch)["input_ids"] == expected, type(batch).__name__
    assert ours(texts, np.array(["d", "e f"]))["input_ids"] == ours(texts, ["d", "e f"])["input_ids"]
    assert ours([])["input_ids"] == [] and ours("")["input_ids"] == [101, 102]


def test_a_generator_is_read_once_and_still_aligns(ours):
    """Alignment calls the tokenizer again with the texts: a generator, read already, gave it nothing."""
    encoding = ours(text for text in ["a b", "c"])
    assert encoding.encodings[1].tokens == ["[CLS]", "c", "[SEP]"]


@pytest.mark.parametrize("text, kind", [({"hello": 1, "world": 2}, "dict"), ({"hello"}, "set"), (5, "int"),
                                        (1.5, "float"), (b"hello", "bytes: decode them first")])
def test_what_is_no_text_or_batch_is_refused_by_kind(ours, text, kind):
    with pytest.raises(InputError, match=f"^text must be a string or a list of strings, got {kind}$"):
        ours(text)
    with pytest.raises(InputError, match=f"^text_pair must be a string or a list of strings, got {kind}"):
        ours(["a"], text)


def test_a_bad_item_in_a_batch_is_named_with_its_index(ours):
    with pytest.raises(InputError, match=r"^text\[1\] must be a string, got None$"):
        ours(["a", None])
    with pytest.raises(InputError, match=r"^text\[0\] must be a string, got bytes: decode them first$"):
        ours([b"hi"])
    with pytest.raises(InputError, match=r"^text\[1\] must be a string, got int$"):
        ours(["a", 3])
    with pytest.raises(InputError, match=r"^text\[0\]\[1\] must be a string, got None$"):
        ours([("a", None)])


def test_a_none_pair_in_a_batch_is_refused_not_dropped(ours):
    with pytest.raises(InputError, match=r"^text_pair\[1\] must be a string, got None$"):
        ours(["a", "c"], ["b", None])


@pytest.mark.parametrize("max_length", ["8", 1.5, True])
def test_max_length_must_be_an_integer(ours, max_length):
    with pytest.raises(ConfigError, match=f"^max_length must be an integer, got {max_length!r}$"):
        ours("hello there", max_length=max_length, truncation=True)


def test_max_length_may_be_a_numpy_integer(ours):
    assert ours("hello there my friend", max_length=np.int64(3))["input_ids"] == [101, 7592, 102]


def test_windows_with_no_room_for_a_sequence_are_refused_by_their_length(ours):
    """A pair whose specials and other text leave one sequence no token can't be cut into windows of it."""
    with pytest.raises(InputError, match="^max_length=4 leaves no room for a window of this sequence beside the "
                                         "special tokens and the other sequence: give a larger max_length$"):
        ours("a b", "c", truncation=True, max_length=4, return_overflowing_tokens=True)


def test_tokenize_takes_one_text(ours):
    for text, kind in ((None, "NoneType"), (["a", "b"], "list")):
        with pytest.raises(InputError, match=f"^tokenize takes one text \\(and one pair\\), got {kind}"):
            ours.tokenize(text)


def test_decoding_nothing_is_refused(ours):
    with pytest.raises(InputError, match="^decode takes token ids .* got NoneType$"):
        ours.decode(None)
    with pytest.raises(InputError, match="^decode takes token ids .* got float$"):
        ours.decode(1.5)
    with pytest.raises(InputError, match="^batch_decode takes sequences of token ids, got NoneType$"):
        ours.batch_decode(None)
    with pytest.raises(InputError, match="^convert_tokens_to_ids takes a token or a list of tokens, got NoneType$"):
        ours.convert_tokens_to_ids(None)


def test_pad_names_what_it_was_given(ours):
    with pytest.raises(InputError, match="^pad takes a list of encodings .* got None$"):
        ours.pad(None)
    with pytest.raises(InputError, match=r"^pad takes a list of encodings .* got \[\]$"):
        ours.pad([])
    with pytest.raises(InputError, match="^pad: encoding 1 has no 'input_ids', which the first has$"):
        ours.pad([{"input_ids": [1, 2]}, {}])
    with pytest.raises(InputError, match="^pad: encoding 2 has no 'labels', which the first has$"):
        ours.pad([{"input_ids": [1, 2], "labels": 0}, {"input_ids": [1], "labels": 1}, {"input_ids": [1]}])


def test_add_tokens_refuses_what_is_no_token_and_adds_nothing(tiny_vocab):
    tokenizer = BertTokenizer(tiny_vocab)
    size = len(tokenizer)
    for tokens, kind in ((None, "NoneType"), (5, "int")):
        with pytest.raises(InputError, match=f"^add_tokens takes a token .* got {kind}$"):
            tokenizer.add_tokens(tokens)
    # one bad item among good ones: none of them is added
    with pytest.raises(InputError, match="^tokens to add must be strings or AddedTokens, got NoneType$"):
        tokenizer.add_tokens(["zorb", None])
    assert len(tokenizer) == size and "zorb" not in tokenizer.get_vocab()
