"""transformers' encoding options against BertTokenizerFast on real text: overflowing windows with a stride (SQuAD's
long contexts, sentence pairs where both sides overflow), truncation and padding on the left, pad_to_multiple_of,
the special-tokens mask and length, `pad` as a data collator uses it, and tokens added by the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.errors import BertforgeError, InputError
from bertforge.tokenizer import BertTokenizer

COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "offset_mapping", "special_tokens_mask",
           "overflow_to_sample_mapping", "length")


# A few texts that are hard to cut and pad: empty, all whitespace, one long word, CJK, accents, an emoji sequence.
AWKWARD = ["", "   \t ", "supercalifragilisticexpialidocious" * 3, "中文字符和English混合", "Café İstanbul naïve",
           "emoji 😀👍🏽 👨‍👩‍👧 ❤️"]


@pytest.fixture
def fresh(minilm_dir, fresh_reference):
    """A bertforge tokenizer and a reference of their own, for tests that change settings or add tokens."""
    return BertTokenizer.from_pretrained(minilm_dir), fresh_reference


def as_plain(encoding) -> dict:
    """A transformers encoding as lists, offsets as tuples (bertforge's form)."""
    plain = {}
    for key, value in encoding.items():
        value = value.tolist() if hasattr(value, "tolist") else value
        if key == "offset_mapping":
            value = [[tuple(pair) for pair in row] for row in value]
        plain[key] = value
    return plain


def assert_same_rows(got, expected):
    assert set(got) - {"word_ids"} == set(expected), (sorted(got), sorted(expected))
    for key in expected:
        assert as_plain(got)[key] == as_plain(expected)[key], key
    rows = len(expected["input_ids"])
    assert [got.word_ids(i) for i in range(rows)] == [expected.word_ids(i) for i in range(rows)]


@pytest.mark.parametrize("truncation_side", ["right", "left"])
@pytest.mark.parametrize("max_length,stride", [(384, 128), (128, 32), (64, 0)])
def test_squad_contexts_slide_as_in_transformers(fresh, squad_pairs, max_length, stride, truncation_side):
    """The question-answering recipe: question and context, the context in windows sharing `stride` tokens."""
    ours, reference = fresh
    ours.truncation_side = reference.truncation_side = truncation_side
    questions, contexts = map(list, zip(*squad_pairs[::40]))
    options = dict(truncation="only_second", max_length=max_length, stride=stride, return_overflowing_tokens=True,
                   return_offsets_mapping=True, padding="max_length")
    expected = reference(questions, contexts, **options)
    got = ours(questions, contexts, **options)
    assert len(expected["input_ids"]) > len(questions)  # contexts did overflow
    assert_same_rows(got, expected)


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pairs_overflowing_on_both_sides(fresh, glue_pairs, strategy, padding_side):
    """With longest_first both texts may overflow: every window of one meets every window of the other, in the
    Rust library's order. Pairs a one-sided strategy can't fit are refused by both (the reference panics)."""
    ours, reference = fresh
    ours.padding_side = reference.padding_side = padding_side
    compared = 0
    for first, second in glue_pairs[:400:4]:
        options = dict(truncation=strategy, max_length=24 if strategy == "longest_first" else 56, stride=3,
                       return_overflowing_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True,
                       return_length=True, padding=True)
        try:
            expected = reference(first, second, **options)
        except BaseException:  # noqa: B036 - tokenizers panics (PanicException derives from BaseException)
            with pytest.raises(BertforgeError):
                ours(first, second, **options)
            continue
        assert_same_rows(ours(first, second, **options), expected)
        compared += 1
    assert compared >= 50


def test_single_texts_overflow_with_padding_to_a_multiple(fresh, corpora):
    ours, reference = fresh
    texts = corpora["squad_contexts"][:30] + AWKWARD
    options = dict(max_length=48, truncation=True, stride=10, return_overflowing_tokens=True,
                   return_offsets_mapping=True, padding=True, pad_to_multiple_of=16, return_special_tokens_mask=True,
                   return_tensors="pt")
    expected = reference(texts, **options)
    got = ours(texts, **options)
    assert got["input_ids"].shape[1] % 16 == 0
    assert_same_rows(got, expected)
    # One text with overflow gives a batch, as in transformers.
    one = ours(texts[0], max_length=50, stride=10, return_overflowing_tokens=True)
    assert one["input_ids"] == reference(texts[0], max_length=50, stride=10, truncation=True,
                                         return_overflowing_tokens=True)["input_ids"]


def test_padding_past_the_truncation_length_is_refused_as_in_transformers(fresh, corpora):
    """Rows padded to a multiple beyond max_length would be longer than the model reads: both refuse."""
    ours, reference = fresh
    texts = corpora["squad_contexts"][:5]
    for options in (dict(max_length=50, padding=True), dict(max_length=50, padding="max_length"),
                    dict(padding="longest")):  # the last truncates to the model's 512
        with pytest.raises(ValueError, match="not a multiple of pad_to_multiple_of"):
            reference(texts, truncation=True, pad_to_multiple_of=24, **options)
        with pytest.raises(BertforgeError, match="multiple of 24 can't both hold"):
            ours(texts, truncation=True, pad_to_multiple_of=24, **options)
    # Without truncation, or with a max_length that is a multiple, rows are padded as there.
    for options in (dict(truncation=False, max_length=50, padding="max_length"),
                    dict(truncation=True, max_length=48, padding=True)):
        assert ours(texts, pad_to_multiple_of=24, **options)["input_ids"] == \
            reference(texts, pad_to_multiple_of=24, **options)["input_ids"]
    with pytest.raises(BertforgeError, match="pad_to_multiple_of"):
        ours(texts, padding=True, pad_to_multiple_of=0)


def test_padding_to_a_multiple_without_truncation_asked_for_cuts_where_both_hold(fresh, corpora):
    """bertforge cuts rows to fit the model when no truncation is named; padding to a multiple that 512 is not one
    of then cuts at the multiple below it. transformers, which cuts nothing then, pads as both do."""
    ours, reference = fresh
    short = corpora["sst2"][:6]
    assert ours(short, padding=True, pad_to_multiple_of=24)["input_ids"] == \
        reference(short, padding=True, pad_to_multiple_of=24)["input_ids"]
    longest = sorted(corpora["squad_contexts"], key=len)[-3:]  # over 512 tokens each
    long = ours(longest, padding=True, pad_to_multiple_of=24)
    lengths = {len(row) for row in long["input_ids"]}
    assert lengths == {504}  # 21 x 24: the multiple below 512


def test_truncation_that_leaves_a_side_nothing_and_a_stride_where_nothing_is_cut(fresh):
    """Edge cases of transformers' test suite: a sequence cut away entirely keeps its [SEP]; a stride as long as
    the room for text is only refused when a text is cut."""
    ours, reference = fresh
    for text, pair, max_length in (("a b c d", None, 2), ("a b c", "x", 4), ("one two three four", "five six", 5)):
        assert ours(text, pair, max_length=max_length, truncation=True)["input_ids"] == \
            reference(text, pair, max_length=max_length, truncation=True)["input_ids"]
    options = dict(max_length=5, truncation="only_second", stride=3, return_overflowing_tokens=True)
    assert ours("dogs barked", **options)["input_ids"] == reference("dogs barked", **options)["input_ids"]


def test_a_tokenizers_pickle_and_datasets_fingerprint_do_not_change_with_what_it_read(fresh, corpora):
    """datasets caches `map(tokenize)` by a hash of the tokenizer's pickle: the words it had split (its cache) were
    pickled too, so any call made the next map miss its cache and write another file; transformers' stays."""
    import pickle

    ours, reference = fresh
    before = pickle.dumps(ours)
    ours(corpora["sst2"][:50])
    assert pickle.dumps(ours) == before
    copy = pickle.loads(before)
    assert copy(corpora["sst2"][:5])["input_ids"] == reference(corpora["sst2"][:5])["input_ids"]
    fingerprint = pytest.importorskip("datasets.fingerprint")
    hashed = fingerprint.Hasher.hash(ours)
    ours("novel words: unaffable, Ångström")
    assert fingerprint.Hasher.hash(ours) == hashed


def test_an_encoding_is_pickled_and_read_as_transformers_reads_one(fresh, corpora):
    """A DataLoader's workers pickle what they tokenize; an encoding is indexed by row, converted to tensors and
    padded without its attention mask as transformers' are."""
    import pickle

    import torch
    from torch.utils.data import DataLoader

    ours, reference = fresh
    texts = corpora["sst2"][:4]
    encoding = ours(texts, padding=True)
    copy = pickle.loads(pickle.dumps(encoding))
    assert copy == encoding and [copy.word_ids(i) for i in range(4)] == [encoding.word_ids(i) for i in range(4)]
    expected = reference(texts, padding=True)
    assert encoding[1].ids == expected[1].ids and encoding[1].offsets == expected[1].offsets
    assert [row.tokens for row in encoding[:2]] == [row.tokens for row in expected[:2]]
    assert encoding.data == dict(expected.data)
    assert torch.equal(encoding.convert_to_tensors("pt")["input_ids"], expected.convert_to_tensors("pt")["input_ids"])
    rows = [{"input_ids": ours(text)["input_ids"]} for text in texts]
    padded = ours.pad(rows, return_attention_mask=False)
    assert "attention_mask" not in padded and dict(padded) == dict(reference.pad(rows, return_attention_mask=False))

    def tokenized(batch):
        return ours(batch, padding=True, return_tensors="pt")

    batches = list(DataLoader(texts, batch_size=2, num_workers=1, collate_fn=tokenized, timeout=120))
    assert torch.equal(batches[1]["input_ids"], ours(texts[2:], padding=True, return_tensors="pt")["input_ids"])


def test_stride_must_leave_room(ours):
    with pytest.raises(BertforgeError, match="stride=20 must be smaller than the 8 tokens"):
        ours("one two three four five six seven eight nine ten eleven", max_length=10, stride=20,
             return_overflowing_tokens=True)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("truncation_side", ["right", "left"])
def test_sides_and_output_flags(fresh, corpora, padding_side, truncation_side):
    ours, reference = fresh
    texts = corpora["sst2"][:50]
    ours.padding_side = reference.padding_side = padding_side
    ours.truncation_side = reference.truncation_side = truncation_side
    options = dict(max_length=12, truncation=True, padding="max_length", return_offsets_mapping=True,
                   return_special_tokens_mask=True, return_length=True)
    assert_same_rows(ours(texts, **options), reference(texts, **options))
    options = dict(return_token_type_ids=False, return_attention_mask=False)
    assert ours(texts, **options) == reference(texts, **options).data


def test_padding_and_truncation_sides_are_saved_and_read(fresh, tmp_path):
    ours, _ = fresh
    ours.padding_side, ours.truncation_side = "left", "left"
    ours.save_pretrained(tmp_path)
    reloaded = BertTokenizer.from_pretrained(tmp_path)
    assert (reloaded.padding_side, reloaded.truncation_side) == ("left", "left")
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (theirs.padding_side, theirs.truncation_side) == ("left", "left")
    assert reloaded(["a b c", "d"], padding=True)["input_ids"] == theirs(["a b c", "d"], padding=True)["input_ids"]
    (tmp_path / "tokenizer_config.json").write_text('{"padding_side": "middle"}')
    with pytest.raises(BertforgeError, match="tokenizer_config.json: padding_side must be 'right' or 'left'"):
        BertTokenizer.from_pretrained(tmp_path)


def test_pad_collates_like_transformers(fresh, corpora):
    """tokenizer.pad as a data collator calls it: encodings made without padding, labels kept as they are."""
    ours, reference = fresh
    texts = corpora["sst2"][:16]
    rows = [dict(ours(text), label=index % 2) for index, text in enumerate(texts)]
    reference_rows = [dict(reference(text), label=index % 2) for index, text in enumerate(texts)]
    for options in (dict(), dict(return_tensors="pt", pad_to_multiple_of=8), dict(padding="max_length", max_length=80),
                    dict(padding_side="left")):
        got, expected = ours.pad(rows, **options), reference.pad(reference_rows, **options)
        assert as_plain(got) == as_plain(expected), options
    columns = ours(texts)  # one dict of unpadded rows
    assert as_plain(ours.pad(columns)) == as_plain(reference.pad(reference(texts)))
    with pytest.raises(BertforgeError, match="input_ids"):
        ours.pad([{"label": 1}])


def test_pad_gives_back_the_arrays_it_was_given(fresh, corpora):
    """Encodings (and labels) as numpy arrays or torch tensors come back padded as such, as transformers' pad
    gives them back (its test_padding_accepts_tensors); lists stay lists."""
    import numpy as np
    import torch

    ours, reference = fresh
    texts = corpora["sst2"][:6]
    for make, kind in ((np.array, np.ndarray), (torch.tensor, torch.Tensor)):
        rows = [{"input_ids": make(ours(text)["input_ids"]), "label": make(index % 2)} for index, text in
                enumerate(texts)]
        got, expected = ours.pad(rows), reference.pad(rows)
        assert set(got) == set(expected) and all(isinstance(got[name], kind) for name in got)
        assert {name: values.tolist() for name, values in got.items()} == \
            {name: values.tolist() for name, values in expected.items()}
        batch = {"input_ids": make([ours(texts[0])["input_ids"][:5], ours(texts[1])["input_ids"][:5]])}
        assert isinstance(ours.pad(batch)["attention_mask"], kind)
        rows = {"input_ids": [make(ours(text)["input_ids"]) for text in texts[:3]]}  # a column of rows
        got, expected = ours.pad(rows), reference.pad(rows)
        assert {name: values.tolist() for name, values in got.items()} == \
            {name: values.tolist() for name, values in expected.items()} and isinstance(got["input_ids"], kind)
        rows = [{"input_ids": make([1][:0])}, {"input_ids": make([101, 102])}]  # the first row with tokens decides
        assert isinstance(ours.pad(rows)["input_ids"], kind)
    assert isinstance(ours.pad([{"input_ids": [1, 2]}, {"input_ids": [3]}])["input_ids"], list)


def test_added_tokens_encode_decode_and_save_as_in_transformers(fresh, corpora, tmp_path):
    ours, reference = fresh
    words = ["covid19", "MiniLM", "hello"]  # 'hello' is in the vocabulary already
    assert ours.add_tokens(words) == reference.add_tokens(words) == 3  # transformers 5 counts 'hello' too
    assert ours.add_special_tokens({"additional_special_tokens": ["[E1]", "[/E1]"]}) == 2
    reference.add_special_tokens({"additional_special_tokens": ["[E1]", "[/E1]"]})
    assert (len(ours), ours.vocab_size) == (len(reference), reference.vocab_size) == (30526, 30522)
    texts = [f"[E1] {text[:60]} [/E1] covid19s, COVID19 and minilm; hellothere" for text in corpora["sst2"][:40]]
    texts += ["[e1] is not [E1]", "MiniLM-L6 [/E1][E1]"]
    options = dict(return_offsets_mapping=True, padding=True)
    assert_same_rows(ours(texts, **options), reference(texts, **options))
    ids = ours(texts)["input_ids"]
    for skip in (True, False):
        assert ours.batch_decode(ids, skip_special_tokens=skip) == reference.batch_decode(ids,
                                                                                           skip_special_tokens=skip)
    assert ours.all_special_ids == reference.all_special_ids
    assert ours.all_special_tokens == reference.all_special_tokens
    for role in ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token"):
        assert getattr(ours, role) == getattr(reference, role)
    assert ours.additional_special_tokens == ["[E1]", "[/E1]"]
    ours.save_pretrained(tmp_path)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    reloaded = BertTokenizer.from_pretrained(tmp_path)
    assert theirs(texts)["input_ids"] == reloaded(texts)["input_ids"] == ids
    assert ours.add_tokens(["covid19", ""]) == 0  # nothing new


def test_additional_special_tokens_are_listed_replaced_and_saved_as_in_transformers(fresh, corpora, tmp_path):
    """add_special_tokens replaces the listed additional special tokens unless told not to (transformers 4's and 5's
    names for it); add_tokens' special tokens are not listed. The list is what all_special_ids,
    convert_ids_to_tokens' and the special-tokens mask's skipping read; decode drops every special token."""
    transformers = pytest.importorskip("transformers")
    ours, theirs = fresh
    steps = [lambda t, **replace: t.add_special_tokens({"additional_special_tokens": ["[E1]", "[E2]"]}),
             lambda t, **replace: t.add_special_tokens({"additional_special_tokens": ["[E3]"]}),
             lambda t, **replace: t.add_tokens(["[X]"], special_tokens=True),
             lambda t, **replace: t.add_special_tokens({"additional_special_tokens": ["[E4]", "[E3]"]}, **replace),
             lambda t, **replace: t.add_special_tokens({"extra_special_tokens": ["[E5]"]}, **replace)]
    texts = [f"{text[:40]} [E1] [E2] [E3] [X] [E4] [E5]" for text in corpora["sst2"][:10]]
    for step, replace in zip(steps, (None, None, None, "replace_additional_special_tokens",
                                     "replace_extra_special_tokens")):
        options = {replace: False} if replace else {}
        assert step(ours, **options) == step(theirs, **({"replace_extra_special_tokens": False} if replace else {}))
        assert ours.additional_special_tokens == ours.extra_special_tokens == theirs.extra_special_tokens
        assert (ours.all_special_ids, ours.all_special_tokens) == (theirs.all_special_ids, theirs.all_special_tokens)
        ids = ours(texts)["input_ids"]
        assert ids == theirs(texts)["input_ids"]
        for row in ids:
            assert ours.convert_ids_to_tokens(row, skip_special_tokens=True) == \
                theirs.convert_ids_to_tokens(row, skip_special_tokens=True)
            assert ours.get_special_tokens_mask(row, already_has_special_tokens=True) == \
                theirs.get_special_tokens_mask(row, already_has_special_tokens=True)
        assert ours.batch_decode(ids, skip_special_tokens=True) == theirs.batch_decode(ids, skip_special_tokens=True)
    assert ours.additional_special_tokens == ["[E3]", "[E4]", "[E5]"]  # [E1], [E2] replaced; [X] never listed
    # a role given another token: the one before stays special and is not listed; a plain added token made special
    # is listed; a text where a list belongs is refused (transformers: a ValueError), not read as its characters
    for tokenizer in (ours, theirs):
        tokenizer.add_special_tokens({"mask_token": "<mask>"})
        tokenizer.add_tokens(["[N]"])
    assert ours.add_special_tokens({"additional_special_tokens": ["[N]"]}, replace_additional_special_tokens=False) \
        == theirs.add_special_tokens({"additional_special_tokens": ["[N]"]}, replace_extra_special_tokens=False)
    assert ours.additional_special_tokens == theirs.extra_special_tokens == ["[E3]", "[E4]", "[E5]", "[N]"]
    assert (ours.all_special_ids, ours.all_special_tokens) == (theirs.all_special_ids, theirs.all_special_tokens)
    with pytest.raises(BertforgeError, match="additional_special_tokens takes a list of tokens"):
        ours.add_special_tokens({"additional_special_tokens": "[E6]"})
    # saved, the list reads back in both libraries
    ours.save_pretrained(tmp_path / "ours")
    theirs.save_pretrained(tmp_path / "theirs")
    for folder in ("ours", "theirs"):
        reloaded = BertTokenizer.from_pretrained(tmp_path / folder)
        reference = transformers.AutoTokenizer.from_pretrained(tmp_path / folder)
        assert reloaded.all_special_ids == reference.all_special_ids == ours.all_special_ids, folder
        assert reloaded(texts)["input_ids"] == reference(texts)["input_ids"] == ids, folder


def test_tokenizers_added_tokens_keep_their_flags_as_in_transformers(fresh, corpora, tmp_path):
    """transformers' AddedToken (the tokenizers library's) with its flags: added, made special, or given again
    to a token there already (a RoBERTa-style [MASK] that takes the space before it), as transformers adds it."""
    AddedToken = pytest.importorskip("tokenizers").AddedToken
    steps = [lambda t: t.add_special_tokens({"mask_token": AddedToken("[MASK]", lstrip=True, rstrip=True)}),
             lambda t: t.add_special_tokens({"additional_special_tokens": [AddedToken("[E1]", normalized=True)]}),
             lambda t: t.add_tokens([AddedToken("[E2]")], special_tokens=True),
             lambda t: t.add_tokens([AddedToken("covid", single_word=True)]),
             lambda t: t.add_tokens([AddedToken("covid", single_word=True, lstrip=True)]),
             lambda t: t.add_tokens([AddedToken("[SEP]", normalized=True, special=True)])]
    ours, theirs = fresh
    texts = [f"{text[:50]} [MASK]  [E1] [e1] [E2] [e2] covid covidness COVID [sep] [SEP]" for text in
             corpora["sst2"][:20]]
    for step in steps:
        assert step(ours) == step(theirs)
        options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
        assert_same_rows(ours(texts, **options), theirs(texts, **options))
        ids = ours(texts)["input_ids"]
        # (skip_special_tokens=True differs on purpose: transformers keeps the normalized special [e1], bertforge
        # drops it as the special token it is)
        assert ours.batch_decode(ids) == theirs.batch_decode(ids)
    ours.save_pretrained(tmp_path)
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)(texts)["input_ids"] == ours(texts)["input_ids"]


def test_a_special_role_can_be_replaced(fresh):
    ours, _ = fresh
    assert ours.add_special_tokens({"sep_token": "<sep>"}) == 1
    assert ours("a b")["input_ids"][-1] == ours.sep_token_id == 30522
    with pytest.raises(BertforgeError, match="unknown special token role 'end_token'"):
        ours.add_special_tokens({"end_token": "</s>"})


def test_bos_and_eos_tokens_are_set_saved_and_read_as_in_transformers(fresh, tmp_path):
    """BERT's template has no bos or eos token, but bert2bert recipes name [CLS] and [SEP] so, or add their own:
    the ids, special tokens and saved files transformers gives, the encoding unchanged."""
    transformers = pytest.importorskip("transformers")
    ours, theirs = fresh
    assert (ours.bos_token, ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token, theirs.bos_token_id,
                                                                     theirs.eos_token_id) == (None, None, None)
    for tokenizer in (ours, theirs):
        tokenizer.bos_token = tokenizer.cls_token
        assert tokenizer.add_special_tokens({"eos_token": "</s>"}) == 1
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id) == (101, 30522)
    assert ours.all_special_ids == theirs.all_special_ids and ours.special_tokens_map == theirs.special_tokens_map
    text = "a b </s>"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"] == [101, 1037, 1038, 30522, 102]
    ours.save_pretrained(tmp_path)
    for reloaded in (BertTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)):
        assert (reloaded.bos_token, reloaded.eos_token, reloaded.eos_token_id) == ("[CLS]", "</s>", 30522)
        assert reloaded(text)["input_ids"] == ours(text)["input_ids"]


def test_bertforge_pads_its_own_batches_on_the_right(fresh, corpora):
    """A checkpoint's tokenizer_config may say padding_side "left"; the batches bertforge pads itself (calibration,
    the ONNX export's checks) still start with [CLS], where BERT reads it."""
    from bertforge.compress.calibration import calibration_batches
    from bertforge.inference.onnx import check_batches

    ours, _ = fresh
    ours.padding_side = "left"
    assert ours(["a b c", "d"], padding=True)["input_ids"][1][0] == ours.pad_token_id
    for batch in calibration_batches(ours, corpora["sst2"][:20]) + check_batches(ours, 64):
        assert (batch["input_ids"][:, 0] == ours.cls_token_id).all()


@pytest.mark.parametrize("clean_up", [True, False])
def test_clean_up_tokenization_spaces_is_read_as_transformers_reads_it(minilm_dir, corpora, tmp_path, clean_up):
    """Older BERT checkpoints say clean_up_tokenization_spaces: true, and transformers then glues "it ' s" into
    "it's" in decode; bertforge reads the setting, saves it, and decodes real text as transformers does."""
    import json
    import shutil

    transformers = pytest.importorskip("transformers")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"clean_up_tokenization_spaces": clean_up}))
    ours, theirs = BertTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = corpora["wikitext2"][:200] + ["It's what they're doing, isn't it? I'm sure we've seen it ' s done ."]
    ids = ours(texts)["input_ids"]
    assert ours.batch_decode(ids) == theirs.batch_decode(ids)
    assert ours.batch_decode(ids, skip_special_tokens=True) == theirs.batch_decode(ids, skip_special_tokens=True)
    assert ("it's" in ours.decode(ids[-1])) == clean_up
    ours.save_pretrained(tmp_path / "saved")
    assert BertTokenizer.from_pretrained(tmp_path / "saved").clean_up_tokenization_spaces == clean_up


def test_numpy_arrays(fresh, corpora):
    ours, reference = fresh
    texts = corpora["sst2"][:8]
    got, expected = ours(texts, padding=True, return_tensors="np"), reference(texts, padding=True, return_tensors="np")
    for key in expected:
        assert got[key].dtype == expected[key].dtype and (got[key] == expected[key]).all()
    with pytest.raises(BertforgeError, match="return_tensors must be None, 'pt' .torch. or 'np'"):
        ours(texts, return_tensors="tf")


@pytest.mark.parametrize("split", [False, True])
def test_split_special_tokens_as_in_transformers(fresh, corpora, split):
    """split_special_tokens=True reads special tokens written in a text as text; added plain tokens still match."""
    ours, reference = fresh
    for tokenizer in fresh:
        tokenizer.add_tokens(["covid19"])
        tokenizer.add_special_tokens({"additional_special_tokens": ["[E1]"]})
    texts = [f"{text[:50]} [SEP] [MASK]x [E1] covid19 [CLS][PAD] [UNK]" for text in corpora["sst2"][:30]]
    options = dict(split_special_tokens=split, return_offsets_mapping=True)
    assert_same_rows(ours(texts, **options), reference(texts, **options))
    assert (ours.sep_token_id in ours(texts[0], **options)["input_ids"][1:-1]) != split
    lazily = ours(texts, split_special_tokens=split)  # word ids computed on first use, with the same reading
    assert [lazily.word_ids(i) for i in range(len(texts))] == [reference(texts, split_special_tokens=split).word_ids(i)
                                                               for i in range(len(texts))]


def test_edges_as_transformers_has_them(fresh):
    """A strategy with nothing to cut is no error; a stride that leaves no room is refused even when nothing
    overflows (transformers: ValueError, or a panic of the Rust library); `length` of one text is a list; pad() of
    one encoding gives it back flat, and 'max_length' without a max_length pads to model_max_length."""
    ours, reference = fresh
    text, pair = "one two three four five", "six seven eight nine"
    assert ours(text, truncation="only_second", max_length=40) == reference(text, truncation="only_second",
                                                                             max_length=40).data
    for args, options in (((text,), dict(max_length=8, stride=7)), ((text,), dict(max_length=5, stride=3)),
                          ((text, pair), dict(max_length=8, stride=2))):
        with pytest.raises(BaseException):  # noqa: B017 - a ValueError, or tokenizers' PanicException
            reference(*args, truncation=True, **options)
        with pytest.raises(BertforgeError, match="stride="):
            ours(*args, truncation=True, **options)
    assert ours(text, return_length=True)["length"] == reference(text, truncation=True, return_length=True)["length"]
    one = ours(text)
    assert ours.pad(one) == reference.pad(reference(text, truncation=True)).data
    padded = ours.pad([one], padding="max_length")
    assert padded == reference.pad([reference(text, truncation=True)], padding="max_length").data
    assert len(padded["input_ids"][0]) == 512


def test_an_empty_pair_of_one_text_is_no_pair(fresh):
    """transformers reads `text_pair=""` (or no words) beside one text as no pair, and keeps it in a batch."""
    ours, reference = fresh
    for args, options in ((("hello there", ""), {}), ((["hello", "there"], []), dict(is_split_into_words=True)),
                          ((["hello", "there"], ["", "x"]), {})):
        expected = reference(*args, truncation=True, **options)
        assert ours(*args, **options) == expected.data, args
    assert ours.encode("hello", "") == reference.encode("hello", "")


@pytest.mark.parametrize("truncation", [False, "longest_first", "only_second"])
def test_without_special_tokens_as_in_transformers(fresh, glue_pairs, corpora, truncation):
    """add_special_tokens=False: the texts' tokens alone (pairs keep segment 1), max_length counting only them."""
    ours, reference = fresh
    firsts, seconds = map(list, zip(*glue_pairs[:40]))
    max_length = 64 if truncation == "only_second" else 24  # only_second: room for every first text
    options = dict(add_special_tokens=False, truncation=truncation, max_length=max_length, return_offsets_mapping=True,
                   return_special_tokens_mask=True, return_length=True)
    assert_same_rows(ours(firsts, seconds, **options), reference(firsts, seconds, **options))
    if truncation != "only_second":
        texts = corpora["sst2"][:40] + AWKWARD
        assert_same_rows(ours(texts, **options), reference(texts, **options))
        assert ours.encode(texts[0], add_special_tokens=False) == reference.encode(texts[0], add_special_tokens=False)


def test_transformers_4_names_encode_as_calls_do(ours, reference, glue_pairs, minilm_dir, tmp_path):
    """encode_plus and batch_encode_plus (transformers 4's tutorials; gone from 5, where calls do the same work),
    with their old pad_to_max_length, give what a call of transformers' tokenizer gives; the special-token builders,
    the length limits answer as transformers' do, and save_vocabulary writes the checkpoint's vocab.txt."""
    import torch

    pairs = glue_pairs[:16]
    options = dict(max_length=48, truncation=True, padding="max_length", return_attention_mask=True)
    one = ours.encode_plus(*pairs[0], return_tensors="pt", **options)
    expected = reference(*pairs[0], return_tensors="pt", **options)
    assert one.keys() == expected.keys() and all(torch.equal(one[key], expected[key]) for key in expected)
    old_flag = ours.encode_plus(pairs[0][0], max_length=48, truncation=True, pad_to_max_length=True)
    assert old_flag["input_ids"] == reference(pairs[0][0], max_length=48, truncation=True,
                                              padding="max_length")["input_ids"]
    batch = ours.batch_encode_plus(pairs, **options)
    assert dict(batch) == dict(reference(pairs, **options))
    singles = [first for first, _ in pairs]
    assert dict(ours.batch_encode_plus(singles, pad_to_max_length=True, max_length=40)) == dict(
        reference(singles, padding="max_length", max_length=40, truncation=True))
    # a transformers 4 tutorial's call: tokenizer(text, max_length=..., pad_to_max_length=True)
    assert ours(singles[0], max_length=40, truncation=True, pad_to_max_length=True)["input_ids"] == \
        ours.encode(singles[0], max_length=40, truncation=True, pad_to_max_length=True) == \
        reference(singles[0], padding="max_length", max_length=40, truncation=True)["input_ids"]
    with pytest.raises(BertforgeError, match="batch_encode_plus takes a list"):
        ours.batch_encode_plus("one text")

    first, second = (ours(text, add_special_tokens=False)["input_ids"] for text in pairs[1])
    together = ours(*pairs[1])
    assert ours.build_inputs_with_special_tokens(first, second) == together["input_ids"]
    assert ours.create_token_type_ids_from_sequences(first, second) == together["token_type_ids"]
    assert ours.build_inputs_with_special_tokens(first) == ours(pairs[1][0])["input_ids"]
    assert ours.create_token_type_ids_from_sequences(first) == [0] * (len(first) + 2)
    assert (ours.max_len_single_sentence, ours.max_len_sentences_pair) == (
        reference.max_len_single_sentence, reference.max_len_sentences_pair)
    (path,) = ours.save_vocabulary(tmp_path, filename_prefix="mine")
    assert path == str(tmp_path / "mine-vocab.txt")
    assert (tmp_path / "mine-vocab.txt").read_text(encoding="utf-8") == (minilm_dir / "vocab.txt").read_text(
        encoding="utf-8")


def test_constructed_as_transformers_constructs_it(minilm_dir, reference, corpora):
    """BertTokenizer(vocab_file=...) (transformers 4's name), BertTokenizer(vocab={token: id}) and special tokens
    as keyword arguments tokenize real text as transformers' tokenizer built the same way; a vocabulary with
    gaps in its ids, a second vocabulary and an unknown setting are one-line errors."""
    transformers = pytest.importorskip("transformers")
    texts = corpora["sst2"][:50] + corpora["squad_questions"][:50]
    vocab_file = minilm_dir / "vocab.txt"
    by_id = dict(reference.get_vocab())
    for ours in (BertTokenizer(vocab_file=vocab_file), BertTokenizer(by_id), BertTokenizer(vocab=str(vocab_file))):
        assert [ours.tokenize(text) for text in texts] == [reference.tokenize(text) for text in texts]
    # [MASK] as the unknown token, and the words the vocabulary can't spell become it
    ours, theirs = BertTokenizer(vocab_file, unk_token="[MASK]"), transformers.BertTokenizer(by_id, unk_token="[MASK]")
    odd = ["ᚠᛇᚻ runes", "a 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 word"]
    assert [ours.tokenize(text) for text in odd] == [theirs.tokenize(text) for text in odd]
    assert all("[MASK]" in ours.tokenize(text) for text in odd)
    assert ours.unk_token_id == theirs.unk_token_id == by_id["[MASK]"]
    with pytest.raises(BertforgeError, match="number its tokens 0 to n-1"):
        BertTokenizer({"[UNK]": 0, "a": 2})
    with pytest.raises(BertforgeError, match="one vocabulary"):
        BertTokenizer(vocab_file, vocab_file=vocab_file)
    with pytest.raises(BertforgeError, match="unknown tokenizer setting 'lowercase'"):
        BertTokenizer(vocab_file, lowercase=True)


def test_tokens_of_pairs_targets_and_added_tokens_as_in_transformers(fresh, glue_pairs, tmp_path):
    """tokenize with a pair and special tokens, text_target's labels, convert_ids_to_tokens skipping the special
    ones, clean_up_tokenization, the added-token maps, setting a special token and the files save_pretrained
    reports, each as transformers' tokenizer gives them on GLUE pairs."""
    ours, reference = fresh
    for first, second in glue_pairs[:20]:
        for special in (False, True):
            assert ours.tokenize(first, pair=second, add_special_tokens=special) == reference.tokenize(
                first, pair=second, add_special_tokens=special)
        assert ours.tokenize(first, add_special_tokens=True) == reference.tokenize(first, add_special_tokens=True)
    firsts, seconds = [first for first, _ in glue_pairs[:8]], [second for _, second in glue_pairs[:8]]
    options = dict(padding=True, truncation=True, max_length=32, verbose=False)
    assert dict(ours(firsts, text_target=seconds, **options)) == dict(reference(firsts, text_target=seconds,
                                                                                 **options))
    assert dict(ours(text_target=seconds, **options)) == dict(reference(text_target=seconds, **options))
    ids = ours(*glue_pairs[0])["input_ids"]
    assert ours.convert_ids_to_tokens(ids, skip_special_tokens=True) == reference.convert_ids_to_tokens(
        ids, skip_special_tokens=True)
    decoded = ours.decode(ids, clean_up_tokenization_spaces=False)
    assert ours.clean_up_tokenization(decoded) == reference.clean_up_tokenization(decoded)
    assert ours.clean_up_tokenization(decoded) == reference.decode(ids, clean_up_tokenization_spaces=True)

    assert ours.add_tokens(["covid19"]) == reference.add_tokens(["covid19"])
    assert ours.get_added_vocab() == reference.get_added_vocab()
    assert ours.added_tokens_encoder == reference.added_tokens_encoder
    assert {token_id: str(token) for token_id, token in ours.added_tokens_decoder.items()} == {
        token_id: str(token) for token_id, token in reference.added_tokens_decoder.items()}
    ours.pad_token, reference.pad_token = "[UNK]", "[UNK]"
    assert (ours.pad_token, ours.pad_token_id) == (reference.pad_token, reference.pad_token_id)
    assert dict(ours(firsts[:3], padding=True)) == dict(reference(firsts[:3], padding=True))
    written = ours.save_pretrained(tmp_path / "saved")
    assert sorted(written) == sorted(str(path) for path in (tmp_path / "saved").iterdir())
    assert set(reference.save_pretrained(tmp_path / "theirs")) <= {str(tmp_path / "theirs" / Path(path).name)
                                                                    for path in written}
    assert "vocab_size=30522" in repr(ours) and "'pad_token': '[UNK]'" in repr(ours)
    ours.pad_token_id, reference.pad_token_id = 1, 1  # by id, as fine-tuning scripts set it
    assert (ours.pad_token, ours.pad_token_id) == (reference.pad_token, reference.pad_token_id)
    assert dict(ours(firsts[:3], padding=True)) == dict(reference(firsts[:3], padding=True))
    with pytest.raises(InputError, match="pad_token_id must be a token id below"):
        ours.pad_token_id = len(ours)
    for skip in (False, True):  # taken, as the fast tokenizer takes it
        assert ours.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=False) == \
            reference.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=False)
    assert ours.batch_decode([ids], spaces_between_special_tokens=False) == \
        reference.batch_decode([ids], spaces_between_special_tokens=False)


def test_errors_are_value_errors_as_transformers_raises_them(ours, fresh_reference):
    """Code (and test suites) written for transformers catch ValueError: bertforge's errors are ones."""
    for call in (lambda tokenizer: tokenizer("a", padding="sideways"),
                 lambda tokenizer: tokenizer(["a", "b"], ["c"])):
        for tokenizer in (ours, fresh_reference):
            with pytest.raises(ValueError):
                call(tokenizer)


def test_no_beginning_or_end_of_text_token_as_in_transformers(ours, fresh_reference):
    for name in ("bos_token", "bos_token_id", "eos_token", "eos_token_id"):
        assert getattr(ours, name) is getattr(fresh_reference, name) is None, name
