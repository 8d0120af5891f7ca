"""BertTokenizer: the encoding contract on a tiny vocabulary (worked examples), save/load, API and errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bertforge import BertforgeError
from bertforge.tokenizer import BertTokenizer

CLS, SEP, PAD, UNK = 2, 3, 0, 1


@pytest.fixture
def tiny(tiny_vocab) -> BertTokenizer:
    return BertTokenizer(tiny_vocab, model_max_length=16)


def test_single_text(tiny):
    encoding = tiny("Unaffable, wanted!", return_offsets_mapping=True, return_word_ids=True)
    assert tiny.convert_ids_to_tokens(encoding["input_ids"]) == [
        "[CLS]", "un", "##aff", "##able", ",", "want", "##ed", "!", "[SEP]"]
    assert encoding["token_type_ids"] == [0] * 9 and encoding["attention_mask"] == [1] * 9
    assert encoding["offset_mapping"] == [(0, 0), (0, 2), (2, 5), (5, 9), (9, 10), (11, 15), (15, 17), (17, 18),
                                          (0, 0)]
    assert encoding["word_ids"] == [None, 0, 0, 0, 1, 2, 2, 3, None]
    assert encoding.word_ids() == encoding["word_ids"]


def test_pair_segments(tiny):
    encoding = tiny("un", text_pair="wanted cafe")
    assert encoding["input_ids"] == [CLS, 5, SEP, 8, 9, 15, SEP]
    assert encoding["token_type_ids"] == [0, 0, 0, 1, 1, 1, 1]


def test_offsets_survive_normalisation(tiny):
    encoding = tiny("CAFÉ\u200b中", return_offsets_mapping=True)
    assert tiny.convert_ids_to_tokens(encoding["input_ids"]) == ["[CLS]", "cafe", "中", "[SEP]"]
    assert encoding["offset_mapping"] == [(0, 0), (0, 4), (5, 6), (0, 0)]


def test_special_tokens_in_text_stay_whole(tiny):
    assert tiny.tokenize("a [MASK] b[SEP]") == ["a", "[MASK]", "b", "[SEP]"]
    assert tiny.tokenize("[mask]") == ["[UNK]", "[UNK]", "[UNK]"]  # lower-case: ordinary text; "[" isn't in the vocab


def test_batches_are_lists_of_lists(tiny):
    encoding = tiny(["un", "wanted cafe"])
    assert encoding["input_ids"] == [[CLS, 5, SEP], [CLS, 8, 9, 15, SEP]]
    padded = tiny(["un", "wanted cafe"], padding=True)
    assert padded["input_ids"] == [[CLS, 5, SEP, PAD, PAD], [CLS, 8, 9, 15, SEP]]
    assert padded["attention_mask"] == [[1, 1, 1, 0, 0], [1] * 5]
    assert tiny(["un"], padding="max_length", max_length=6)["input_ids"] == [[CLS, 5, SEP, PAD, PAD, PAD]]
    assert tiny([])["input_ids"] == []


def test_tensors(tiny):
    batch = tiny(["un", "wanted cafe"], padding=True, return_tensors="pt")
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (2, 5)
    assert tiny("un", return_tensors="pt")["input_ids"].shape == (1, 3)
    with pytest.raises(BertforgeError, match="padding=True"):
        tiny(["un", "wanted cafe"], return_tensors="pt")


def test_truncation_strategies(tiny):
    first, second = "un un un un un un", "a a a"  # 6 and 3 tokens
    lengths = {}
    for strategy in ("longest_first", "only_first", "only_second"):
        try:
            ids = tiny(first, text_pair=second, truncation=strategy, max_length=9)["input_ids"]
        except BertforgeError as error:
            lengths[strategy] = str(error)
        else:
            lengths[strategy] = (ids.index(SEP) - 1, len(ids) - ids.index(SEP) - 2)
    # budget 9 - 3 = 6: longest_first trims the longer to 3 (3 + 3); only_first cuts the first to 3;
    # only_second would have to drop all 3 tokens of the second text, which both libraries refuse.
    assert lengths["longest_first"] == (3, 3) and lengths["only_first"] == (3, 3)
    assert "only_second" in lengths["only_second"] and "can't fit" in lengths["only_second"]
    # Both over half the budget: split evenly, the odd token going to the longer text.
    ids = tiny(first, text_pair="a a a a a", truncation=True, max_length=8)["input_ids"]
    assert ids == [CLS, 5, 5, 5, SEP, 17, 17, SEP]
    assert tiny(first, max_length=4)["input_ids"] == [CLS, 5, 5, SEP]
    assert len(tiny("un " * 40)["input_ids"]) == 16  # model_max_length
    assert len(tiny("un " * 40, truncation=False)["input_ids"]) == 42


def test_truncation_errors(tiny):
    with pytest.raises(BertforgeError, match="needs a text_pair"):
        tiny("un un", truncation="only_second", max_length=3)
    with pytest.raises(BertforgeError, match="no room"):
        tiny("un", text_pair="un", max_length=2)
    with pytest.raises(BertforgeError, match="unknown truncation"):
        tiny("un", truncation="longest")
    with pytest.raises(BertforgeError, match="unknown padding"):
        tiny("un", padding="shortest")
    with pytest.raises(BertforgeError, match="2 texts but 1"):
        tiny(["un", "un"], text_pair=["un"])


def test_decode(tiny):
    ids = tiny("Unaffable, wanted [MASK] café!")["input_ids"]
    assert tiny.decode(ids, skip_special_tokens=True) == "unaffable, wanted cafe!"
    assert tiny.decode(ids) == "[CLS] unaffable, wanted [MASK] cafe! [SEP]"  # transformers' default keeps them
    assert tiny.decode(torch.tensor(ids), skip_special_tokens=True) == "unaffable, wanted cafe!"


def test_vocabulary_api(tiny, tiny_tokens):
    assert len(tiny) == tiny.vocab_size == len(tiny_tokens)
    assert (tiny.cls_token_id, tiny.sep_token_id, tiny.pad_token_id, tiny.mask_token_id, tiny.unk_token_id) == (
        CLS, SEP, PAD, 4, UNK)
    assert tiny.all_special_ids == [UNK, SEP, PAD, CLS, 4]
    assert tiny.convert_tokens_to_ids(["un", "nope"]) == [5, UNK] and tiny.convert_tokens_to_ids("un") == 5
    assert tiny.convert_ids_to_tokens(5) == "un"
    with pytest.raises(BertforgeError, match="outside the vocabulary"):
        tiny.convert_ids_to_tokens([999])


def test_save_and_load_round_trip(tmp_path, tiny_vocab):
    tokenizer = BertTokenizer(tiny_vocab, do_lower_case=False, strip_accents=True, model_max_length=32)
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is False and config["strip_accents"] is True and config["model_max_length"] == 32
    loaded = BertTokenizer.from_pretrained(tmp_path)
    assert loaded.vocab.id_to_token == tokenizer.vocab.id_to_token
    for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length"):
        assert getattr(loaded, key) == getattr(tokenizer, key)
    assert loaded("Café un")["input_ids"] == tokenizer("Café un")["input_ids"]


def test_saved_directory_loads_in_transformers(tmp_path, ours):
    transformers = pytest.importorskip("transformers")
    ours.save_pretrained(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Unaffable café owners, [MASK]!"
    assert reference(text)["input_ids"] == ours(text)["input_ids"]


def test_from_pretrained_settings(ours):
    assert ours.do_lower_case is True and ours.model_max_length == 512 and len(ours) == 30522
    cased = BertTokenizer.from_pretrained("default", do_lower_case=False)
    assert cased.tokenize("Hello") != ours.tokenize("Hello")
    with pytest.raises(BertforgeError, match="unknown tokenizer setting 'lowercase'"):
        BertTokenizer.from_pretrained("default", lowercase=False)


def test_loading_errors(tmp_path):
    with pytest.raises(BertforgeError, match="no such model directory"):
        BertTokenizer.from_pretrained(tmp_path / "missing")
    with pytest.raises(BertforgeError, match="vocab.txt: vocabulary file not found"):
        BertTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    without_unk = BertTokenizer.from_pretrained(tmp_path)  # [UNK] is needed only for a word it can't spell
    assert without_unk("hello")["input_ids"] == [1, 4, 2]
    with pytest.raises(BertforgeError, match=r"vocab.txt: the vocabulary has no unk token '\[UNK\]'"):
        without_unk("goodbye")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BertforgeError, match="tokenizer_config.json: not valid JSON"):
        BertTokenizer.from_pretrained(tmp_path)


TOKENIZER_JSON_MISTAKES = [  # (file, where in it, the value there, what the error says)
    ("tokenizer.json", ("added_tokens", 0, "id"), "x", r"added_tokens\[0\]'s id: expected a token id"),
    ("tokenizer.json", ("added_tokens", 1), "[X]", r"added_tokens\[1\]'s id: expected a token id"),
    ("tokenizer.json", ("added_tokens", 2, "content"), 5, r"added_tokens\[2\]: expected a token"),
    ("tokenizer.json", ("added_tokens",), 7, "added_tokens must be a list of tokens, got 7"),
    ("tokenizer.json", ("pre_tokenizer",), "x", "pre_tokenizer 'x' is not supported"),
    ("tokenizer.json", ("model", "max_input_chars_per_word"), "x", "max_input_chars_per_word must be a whole number"),
    ("tokenizer_config.json", ("added_tokens_decoder",), ["[X]"], "added_tokens_decoder must be an object"),
    ("tokenizer_config.json", ("added_tokens_decoder",), {"one": {"content": "[X]"}},
     r"added_tokens_decoder\['one'\]: expected a token id"),
    ("tokenizer_config.json", ("additional_special_tokens",), 2.5, "additional_special_tokens must be a list"),
    ("tokenizer_config.json", ("mask_token",), ["[X]"], r"mask_token: expected a token .*got \['\[X\]'\]"),
    ("tokenizer_config.json", ("model_input_names",), None, "model_input_names must list input_ids"),
    ("special_tokens_map.json", ("unk_token",), {"text": "[UNK]"}, "unk_token: expected a token"),
    ("special_tokens_map.json", ("extra_special_tokens",), [{"content": 5}], "extra_special_tokens: expected"),
]


@pytest.mark.parametrize("file, where, value, message", TOKENIZER_JSON_MISTAKES)
def test_a_malformed_tokenizer_file_is_a_one_line_error_naming_it(minilm_dir, tmp_path, file, where, value, message):
    """Values of the wrong kind in the files transformers writes: each was a TypeError, KeyError or ValueError
    from deep in the reading."""
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    data = json.loads((tmp_path / file).read_text())
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    (tmp_path / file).write_text(json.dumps(data))
    with pytest.raises(BertforgeError, match=f"{file}: .*{message}"):
        BertTokenizer.from_pretrained(tmp_path)


def test_word_ids_computed_on_demand(ours, reference):
    texts = ["Unaffable café owners!", "a [MASK] b"]
    encoding = ours(texts, padding=True)
    assert "word_ids" not in encoding
    expected = reference(texts, padding=True)
    assert [encoding.word_ids(i) for i in range(2)] == [expected.word_ids(i) for i in range(2)]
