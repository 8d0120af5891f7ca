"""Conformance with the ecosystem: directories written in this test run by the installed transformers (tokenizer-only
and whole-model saves; safetensors, .bin, sharded; tied and untied masked-LM decoders; every task head bertforge
has; added special and normal tokens; cased and uncased vocabularies) and config.json files holding the keys older
transformers versions wrote. Each loads in bertforge with transformers' token ids, offsets and outputs, and what
bertforge saves loads back in transformers with the same outputs.
"""

import json
import shutil

import pytest
import torch

import bertforge
from bertforge import BertTokenizer, InputError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ENCODER_TOLERANCE = dict(atol=1e-5, rtol=1e-5)
HEAD_TOLERANCE = dict(atol=1e-4, rtol=1e-4)
ADDED_SPECIAL = ["[E1]", "[/E1]"]
ADDED_NORMAL = ["covid19"]

# name -> (transformers class, bertforge class, config overrides, outputs to compare (name, per token?))
HEADS = {
    "encoder": ("BertModel", bertforge.BertModel, {}, [("last_hidden_state", True), ("pooler_output", False)]),
    "masked_lm": ("BertForMaskedLM", bertforge.BertForMaskedLM, {}, [("logits", True)]),
    "masked_lm_untied": ("BertForMaskedLM", bertforge.BertForMaskedLM, {"tie_word_embeddings": False},
                         [("logits", True)]),
    "pretraining": ("BertForPreTraining", bertforge.BertForPreTraining, {},
                    [("prediction_logits", True), ("seq_relationship_logits", False)]),
    "sequence_classification": ("BertForSequenceClassification", bertforge.BertForSequenceClassification,
                                {"num_labels": 3}, [("logits", False)]),
    "token_classification": ("BertForTokenClassification", bertforge.BertForTokenClassification,
                             {"num_labels": 5}, [("logits", True)]),
    "question_answering": ("BertForQuestionAnswering", bertforge.BertForQuestionAnswering, {},
                           [("start_logits", True), ("end_logits", True)]),
}


def save_bin(model, directory, shards: int = 1) -> None:
    """pytorch_model.bin (or shards and their index), as transformers 4 wrote them: the state dict, pickled."""
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return
    names = list(state)
    weight_map = {}
    for index in range(shards):
        file = f"pytorch_model-{index + 1:05d}-of-{shards:05d}.bin"
        part = names[index::shards]
        torch.save({name: state[name] for name in part}, directory / file)
        weight_map |= dict.fromkeys(part, file)
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


FORMATS = {
    "safetensors": lambda model, directory: model.save_pretrained(directory),
    "sharded_safetensors": lambda model, directory: model.save_pretrained(directory, max_shard_size="20KB"),
    "bin": lambda model, directory: (model.config.save_pretrained(directory), save_bin(model, directory)),
    "sharded_bin": lambda model, directory: (model.config.save_pretrained(directory), save_bin(model, directory, 3)),
}


@pytest.fixture(scope="module")
def texts(squad_contexts, sst2_dev):
    """Real text with the added tokens in it: whole, inside words, and in the other case."""
    return [f"[E1] {sst2_dev[0][0]} [/E1] COVID19 and covid19s", squad_contexts[0][:300],
            f"Naïve café x[E1]y {sst2_dev[1][0]}", "covid19 [MASK] [e1] [SEP]covid19"]


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory, data_dir):
    """A small WordPiece vocabulary per casing, trained on real text (wikitext-2) with the tokenizers library."""
    lines = (data_dir / "wikitext2" / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines()[:3000]
    files = {}
    for cased in (False, True):
        trainer = tokenizers.BertWordPieceTokenizer(lowercase=not cased)
        trainer.train_from_iterator(lines, vocab_size=600, show_progress=False)
        folder = tmp_path_factory.mktemp("cased" if cased else "uncased")
        trainer.save_model(str(folder))
        files[cased] = folder / "vocab.txt"
    return files


def reference_tokenizer(vocab_file, cased: bool):
    tokenizer = transformers.BertTokenizer(vocab=str(vocab_file), do_lower_case=not cased)
    tokenizer.add_special_tokens({"additional_special_tokens": ADDED_SPECIAL})
    tokenizer.add_tokens(ADDED_NORMAL)
    return tokenizer


def assert_same_encodings(ours: BertTokenizer, theirs, texts, same_special_ids: bool = True) -> None:
    for text in texts:
        expected = theirs(text, return_offsets_mapping=True)
        encoded = ours(text, return_offsets_mapping=True)
        assert encoded["input_ids"] == expected["input_ids"], text
        assert encoded["offset_mapping"] == [tuple(span) for span in expected["offset_mapping"]], text
        assert encoded.word_ids() == expected.word_ids(), text
        for skip in (False, True):
            assert ours.decode(encoded["input_ids"], skip_special_tokens=skip) == \
                theirs.decode(expected["input_ids"], skip_special_tokens=skip)
    assert len(ours) == len(theirs)
    if same_special_ids:
        assert ours.all_special_ids == theirs.all_special_ids


# ---------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_tokenizer_saved_by_transformers(tmp_path, vocab_files, texts, cased):
    theirs = reference_tokenizer(vocab_files[cased], cased)
    theirs.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved" / "vocab.txt").exists()  # transformers 5 writes tokenizer.json only
    ours = BertTokenizer.from_pretrained(tmp_path / "saved")
    assert_same_encodings(ours, theirs, texts)
    ours.save_pretrained(tmp_path / "again")
    assert_same_encodings(ours, transformers.AutoTokenizer.from_pretrained(tmp_path / "again"), texts)


def test_minilm_tokenizer_with_added_tokens_and_its_padding_section_not_adopted(tmp_path, minilm_dir, texts):
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    theirs.add_special_tokens({"additional_special_tokens": ADDED_SPECIAL})
    theirs.add_tokens(ADDED_NORMAL)
    theirs.save_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    assert_same_encodings(ours, theirs, texts)
    assert len(ours) == 30525 and ours.convert_tokens_to_ids("[E1]") == 30522
    # Its tokenizer.json pads and truncates everything to 128; bertforge does as each call asks.
    assert json.loads((minilm_dir / "tokenizer.json").read_text())["padding"]["strategy"] == {"Fixed": 128}
    assert len(ours(texts[1])["input_ids"]) == len(theirs(texts[1])["input_ids"]) != 128


def test_added_token_flags_lstrip_rstrip_single_word(tmp_path, minilm_dir):
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    theirs.add_tokens([transformers.AddedToken("[X]", lstrip=True, rstrip=True, special=True, normalized=False),
                       transformers.AddedToken("zork", single_word=True)])
    theirs.save_pretrained(tmp_path)
    assert_same_encodings(BertTokenizer.from_pretrained(tmp_path), theirs,
                          ["a  [X]  b a[X]b", "zork zorky xzork zork. Zork"],
                          # add_tokens(special=True) isn't listed among transformers' special ids, but both skip it
                          same_special_ids=False)


def test_transformers_4_layout(tmp_path, minilm_dir, texts):
    """vocab.txt + tokenizer_config.json (added_tokens_decoder) + special_tokens_map.json + added_tokens.json."""
    shutil.copy(minilm_dir / "vocab.txt", tmp_path)
    flags = {"lstrip": False, "rstrip": False, "single_word": False}
    decoder = {str(i): {"content": token, "special": True, "normalized": False, **flags}
               for i, token in [(0, "[PAD]"), (100, "[UNK]"), (101, "[CLS]"), (102, "[SEP]"), (103, "[MASK]"),
                                (30522, "[E1]"), (30523, "[/E1]")]}
    decoder["30524"] = {"content": "covid19", "special": False, "normalized": True, **flags}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512,
        "added_tokens_decoder": decoder, "additional_special_tokens": ADDED_SPECIAL,
        "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "mask_token": "[MASK]"}))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"additional_special_tokens": ADDED_SPECIAL,
                                                                  "unk_token": "[UNK]"}))
    (tmp_path / "added_tokens.json").write_text(json.dumps({"[E1]": 30522, "[/E1]": 30523, "covid19": 30524}))
    assert_same_encodings(BertTokenizer.from_pretrained(tmp_path),
                          transformers.AutoTokenizer.from_pretrained(tmp_path), texts)


def test_vocabulary_without_pad_or_mask_loads_and_fails_only_when_they_are_needed(tmp_path, vocab_files, texts):
    tokens = [token for token in vocab_files[False].read_text().splitlines() if token not in ("[PAD]", "[MASK]")]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    ours = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.BertTokenizer(vocab=str(tmp_path / "vocab.txt"))
    assert ours(texts[1])["input_ids"] == theirs(texts[1])["input_ids"]
    with pytest.raises(InputError, match=r"vocab.txt: the vocabulary has no pad token '\[PAD\]', which padding"):
        ours(texts[:2], padding=True)
    with pytest.raises(InputError, match=r"vocab.txt: the vocabulary has no mask token '\[MASK\]', which masking"):
        ours.convert_ids_to_tokens([ours.mask_token_id])


# ---------------------------------------------------------------- whole models


def compare(ours, theirs, encoded, outputs, tolerance) -> None:
    is_real = encoded["attention_mask"].bool()
    with torch.inference_mode():
        mine = ours(encoded["input_ids"], encoded["attention_mask"], encoded["token_type_ids"])
        reference = theirs(**encoded)
    for name, per_token in outputs:
        got, expected = getattr(mine, name), getattr(reference, name)
        if per_token:
            got, expected = got[is_real], expected[is_real]
        torch.testing.assert_close(got, expected, **tolerance)


def build(tmp_path, vocab_files, head, form, cased=False):
    """A random transformers model with a head, and its tokenizer, saved together in one directory."""
    hf_class, _, overrides, _ = HEADS[head]
    tokenizer = reference_tokenizer(vocab_files[cased], cased)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=256,
                                     initializer_range=0.2, **overrides)
    torch.manual_seed(0)
    model = getattr(transformers, hf_class)(config).eval()
    if head == "masked_lm_untied":
        assert not torch.equal(model.cls.predictions.decoder.weight, model.bert.embeddings.word_embeddings.weight)
        with torch.no_grad():  # as after training: transformers 5 gives an untied decoder a bias of its own
            model.cls.predictions.decoder.bias.normal_()
        assert not torch.equal(model.cls.predictions.decoder.bias, model.cls.predictions.bias)
    directory = tmp_path / "reference"
    FORMATS[form](model, directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer, directory


@pytest.mark.parametrize("form", list(FORMATS))
@pytest.mark.parametrize("head", list(HEADS))
def test_model_saved_by_transformers(tmp_path, vocab_files, texts, head, form, one_thread):
    _, ours_class, _, outputs = HEADS[head]
    theirs, reference_tok, directory = build(tmp_path, vocab_files, head, form, cased=form == "bin")
    tokenizer = BertTokenizer.from_pretrained(directory)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    expected = reference_tok(texts, padding=True, return_tensors="pt")
    assert all(torch.equal(encoded[name], expected[name]) for name in expected)
    ours = ours_class.from_pretrained(directory)
    compare(ours, theirs, encoded, outputs, ENCODER_TOLERANCE if head == "encoder" else HEAD_TOLERANCE)
    # The bare encoder reads every checkpoint, skipping its head (an untied decoder included).
    encoder = bertforge.BertModel.from_pretrained(directory)
    compare(encoder, getattr(theirs, "bert", theirs), encoded, [("last_hidden_state", True)], ENCODER_TOLERANCE)
    # What bertforge saves, transformers reads back to the same outputs.
    ours.save_pretrained(tmp_path / "ours")
    tokenizer.save_pretrained(tmp_path / "ours")
    back = getattr(transformers, HEADS[head][0]).from_pretrained(tmp_path / "ours").eval()
    compare(ours, back, encoded, outputs, ENCODER_TOLERANCE if head == "encoder" else HEAD_TOLERANCE)
    back_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    assert torch.equal(back_tokenizer(texts, padding=True, return_tensors="pt")["input_ids"], expected["input_ids"])


@pytest.mark.parametrize("change, message", [
    (lambda index: index.pop("weight_map"), "not a checkpoint index"),
    (lambda index: index.update(weight_map=["model-00001.safetensors"]), "not a checkpoint index"),
    (lambda index: index["weight_map"].update(dict.fromkeys(index["weight_map"], 3)),  # was a TypeError
     "the weight_map names a shard 3; expected a file name"),
    (lambda index: index["weight_map"].update({next(iter(index["weight_map"])): "../elsewhere.safetensors"}),
     "names the shard 'elsewhere.safetensors', which is not in"),
])
def test_a_malformed_shard_index_is_a_one_line_error(tmp_path, vocab_files, change, message):
    _, _, directory = build(tmp_path, vocab_files, "encoder", "sharded_safetensors")
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))
    with pytest.raises(bertforge.CheckpointError, match=f"model.safetensors.index.json: {message}"):
        bertforge.BertModel.from_pretrained(directory)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "distilbert", "gpt2"])
def test_other_architectures_are_refused_by_name(tmp_path, vocab_files, model_type):
    """RoBERTa and its kin save BERT's tensor names but offset their positions: refused, not loaded wrongly."""
    _, _, directory = build(tmp_path, vocab_files, "encoder", "safetensors")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"model_type": model_type}))
    with pytest.raises(bertforge.ConfigError, match=rf"config.json: model_type='{model_type}' is not supported"):
        bertforge.BertModel.from_pretrained(directory)


def test_a_half_precision_checkpoint_is_saved_as_what_it_now_is(tmp_path, vocab_files, texts):
    """Loaded from bf16 (computed in float32), saved in float32: config.json must say float32, or transformers
    loads the copy in bf16."""
    theirs, _, directory = build(tmp_path, vocab_files, "encoder", "safetensors")
    theirs.to(torch.bfloat16).save_pretrained(directory)
    assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"
    bertforge.BertModel.from_pretrained(directory).save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["dtype"] == "float32"
    back = transformers.BertModel.from_pretrained(tmp_path / "ours")
    assert back.dtype == torch.float32


def test_ids_past_the_embedding_tables_are_one_line_errors(tmp_path, vocab_files):
    _, tokenizer, directory = build(tmp_path, vocab_files, "sequence_classification", "safetensors")
    tokenizer.add_tokens(["zzyzx"])  # the model is not resized for it
    tokenizer.save_pretrained(directory)
    model = bertforge.BertForSequenceClassification.from_pretrained(directory)
    ids = BertTokenizer.from_pretrained(directory)("zzyzx", return_tensors="pt")["input_ids"]
    with pytest.raises(bertforge.BertforgeError, match=rf"token id {model.config.vocab_size} is outside the "
                                                       rf"model's vocab_size of {model.config.vocab_size}"):
        model(ids)
    single = bertforge.BertForSequenceClassification(model.config.__class__(**{
        **{f: getattr(model.config, f) for f in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                 "num_attention_heads", "intermediate_size")},
        "type_vocab_size": 1}))
    with pytest.raises(bertforge.BertforgeError, match="segment id 1 is outside the model's type_vocab_size of 1"):
        single(torch.tensor([[2, 5, 3, 6, 3]]), token_type_ids=torch.tensor([[0, 0, 0, 1, 1]]))


def test_saved_files_are_readable_by_others(tmp_path, vocab_files):
    import os
    import stat

    _, _, directory = build(tmp_path, vocab_files, "encoder", "safetensors")
    previous = os.umask(0o022)
    try:
        bertforge.BertModel.from_pretrained(directory).save_pretrained(tmp_path / "ours")
        BertTokenizer.from_pretrained(directory).save_pretrained(tmp_path / "ours")
    finally:
        os.umask(previous)
    for path in (tmp_path / "ours").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


# Keys transformers 2.x-4.x wrote into config.json, which transformers itself ignores or derives.
OLD_KEYS = {
    "_num_labels": 3, "num_labels": 3, "output_past": True, "pruned_heads": {}, "torchscript": False,
    "use_bfloat16": False, "xla_device": None, "is_encoder_decoder": False, "max_length": 20, "min_length": 0,
    "num_beams": 1, "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0,
    "length_penalty": 1.0, "no_repeat_ngram_size": 0, "num_return_sequences": 1, "early_stopping": False,
    "bad_words_ids": None, "task_specific_params": None, "language": "english", "name": "Bert",
    "finetuning_task": "sst-2", "prefix": None, "decoder_start_token_id": None, "output_attentions": False,
    "output_hidden_states": False, "is_decoder": False, "torch_dtype": "float32", "gradient_checkpointing": False,
    "directionality": "bidi", "pooler_type": "first_token_transform", "tokenizer_class": "BertTokenizer",
    "architectures": ["BertForSequenceClassification"],
}


def test_config_with_the_keys_older_transformers_wrote(tmp_path, vocab_files, texts, caplog):
    theirs, reference_tok, directory = build(tmp_path, vocab_files, "sequence_classification", "safetensors")
    config = json.loads((directory / "config.json").read_text())
    for key in ("id2label", "label2id"):
        config.pop(key, None)  # old checkpoints often had only the count
    (directory / "config.json").write_text(json.dumps(config | OLD_KEYS))
    theirs = transformers.BertForSequenceClassification.from_pretrained(directory).eval()
    with caplog.at_level("INFO", logger="bertforge"):
        ours = bertforge.BertForSequenceClassification.from_pretrained(directory)
    assert "keeping config keys bertforge does not use" not in caplog.text  # all of them are transformers' keys
    assert ours.config.id2label == theirs.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    encoded = BertTokenizer.from_pretrained(directory)(texts, padding=True, return_tensors="pt")
    compare(ours, theirs, encoded, HEADS["sequence_classification"][3], HEAD_TOLERANCE)
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert {key: saved[key] for key in OLD_KEYS if key not in ("num_labels", "_num_labels")} == \
        {key: value for key, value in OLD_KEYS.items() if key not in ("num_labels", "_num_labels")}
    back = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    compare(ours, back, encoded, HEADS["sequence_classification"][3], HEAD_TOLERANCE)


def test_label_names_given_one_way_round_as_transformers_5_writes_them(tmp_path, vocab_files, texts):
    """transformers 5 saves a config made with id2label alone as "label2id": null, and reads it back."""
    tokenizer = reference_tokenizer(vocab_files[False], False)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=37,
                                     id2label={0: "negative", 1: "neutral", 2: "positive"})
    torch.manual_seed(0)
    theirs = transformers.BertForSequenceClassification(config).eval()
    theirs.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    if saved.get("label2id", "absent") is not None:
        pytest.skip("this transformers writes label2id; the case is a null one")
    ours = bertforge.BertForSequenceClassification.from_pretrained(tmp_path)
    assert ours.config.id2label == theirs.config.id2label
    assert ours.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    encoded = BertTokenizer.from_pretrained(tmp_path)(texts, padding=True, return_tensors="pt")
    compare(ours, theirs, encoded, HEADS["sequence_classification"][3], HEAD_TOLERANCE)
    # label2id with a count and no id2label: transformers names the labels by the count (LABEL_0, ...)
    (tmp_path / "config.json").write_text(json.dumps({**{key: value for key, value in saved.items()
                                                          if key not in ("id2label", "label2id")},
                                                       "label2id": {"neg": 0, "pos": 1, "mid": 2}, "num_labels": 3}))
    assert bertforge.BertConfig.from_pretrained(tmp_path).id2label == \
        transformers.BertConfig.from_pretrained(tmp_path).id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}


def test_local_hugging_face_cache(tmp_path, vocab_files, monkeypatch):
    """org/name resolves to the snapshot refs/main names in $HF_HUB_CACHE; nothing else is tried."""
    _, _, directory = build(tmp_path, vocab_files, "encoder", "safetensors")
    repository = tmp_path / "hub" / "models--someone--tiny-bert"
    shutil.copytree(directory, repository / "snapshots" / "abc123")
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = bertforge.BertModel.from_pretrained("someone/tiny-bert")
    assert model.config.hidden_size == 32
    assert len(BertTokenizer.from_pretrained("someone/tiny-bert")) == len(reference_tokenizer(vocab_files[False],
                                                                                            False))
    with pytest.raises(bertforge.CheckpointError, match=rf"someone/other: no such model directory, not 'default'"
                                                        rf".*Hugging Face cache {tmp_path / 'hub'}"):
        bertforge.BertModel.from_pretrained("someone/other")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert bertforge.BertModel.from_pretrained("someone/tiny-bert").config.hidden_size == 32
