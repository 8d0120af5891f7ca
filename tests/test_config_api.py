"""BertConfig as transformers' users and its ConfigTester use a config: attributes, json files, from_dict, and the
sizes a config may hold but a model may not. transformers' BertConfig is the reference."""

import copy
import dataclasses
import json
import pickle

import pytest
import torch

from bertforge import BertConfig, BertForSequenceClassification, BertModel, ConfigError

transformers = pytest.importorskip("transformers")

# Inputs of transformers' ConfigTester for BERT, and of code that reads a decoder's or generator's settings.
INPUTS = [{}, {"hidden_size": 37}, {"bos_token_id": 1, "eos_token_id": 2, "use_cache": False},
          {"hidden_size": 64, "num_attention_heads": 2, "torch_dtype": "bfloat16", "chunk_size_feed_forward": 4}]


@pytest.mark.parametrize("inputs", INPUTS, ids=str)
def test_attributes_and_to_dict_are_transformers(inputs):
    """Every key transformers' to_dict writes reads as the same attribute; every key ours writes has its value."""
    ours, theirs = BertConfig(**inputs), transformers.BertConfig(**inputs)
    for key in theirs.to_dict():
        if key not in ("id2label", "label2id"):  # an encoder names no labels: test_an_encoder_names_no_labels
            assert getattr(ours, key) == getattr(theirs, key), key
    for name in ("torch_dtype", "name_or_path", "use_return_dict", "num_attention_heads", "tie_word_embeddings"):
        assert getattr(ours, name) == getattr(theirs, name), name
    theirs_dict = theirs.to_dict() | {"torch_dtype": theirs.to_dict()["dtype"]}  # transformers 5 renames it
    for key, value in ours.to_dict().items():
        if key != "position_embedding_type":  # transformers 5 dropped it; older versions read it
            assert theirs_dict[key] == value, key
    assert not hasattr(ours, "no_such_key") and not hasattr(theirs, "no_such_key")


def test_set_attributes_are_kept_and_saved(tmp_path):
    config = BertConfig.tiny()
    config.num_choices, config.foo, config.use_cache = 4, 1, False
    assert (config.num_choices, config.foo, config.use_cache) == (4, 1, False)
    assert config.extra == {"num_choices": 4, "foo": 1, "use_cache": False}
    config.save_pretrained(tmp_path)
    for reader in (BertConfig, transformers.BertConfig):
        again = reader.from_pretrained(tmp_path)
        assert (again.num_choices, again.foo, again.use_cache) == (4, 1, False), reader
    theirs = transformers.BertConfig()
    theirs.num_choices = 4
    assert theirs.to_dict()["num_choices"] == config.to_dict()["num_choices"]

    copied = dataclasses.replace(config)  # shares `extra` with config until one of them sets a key
    copied.bar = 2
    assert "bar" not in config.extra and copied.bar == 2
    config.num_labels = 3  # fields and properties are set as before
    assert config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    with pytest.raises(ConfigError, match=r"is_decoder=True is not supported"):
        config.is_decoder = True
    with pytest.raises(ConfigError, match=r"model_type='roberta' is not supported"):
        config.model_type = "roberta"
    assert copy.deepcopy(config) == config == pickle.loads(pickle.dumps(config))


def test_dtype_reads_as_a_torch_dtype_and_saves_as_its_name(tmp_path):
    ours, theirs = BertConfig(torch_dtype="float16"), transformers.BertConfig(torch_dtype="float16")
    assert ours.dtype == ours.torch_dtype == theirs.dtype == torch.float16
    ours.dtype = torch.bfloat16  # written under the name config.json already has, so both never disagree
    assert ours.extra == {"torch_dtype": "bfloat16"} and ours.torch_dtype == torch.bfloat16
    assert BertConfig(dtype=torch.bfloat16).to_dict()["dtype"] == "bfloat16"
    ours.to_json_file(tmp_path / "config.json")
    assert transformers.BertConfig.from_json_file(tmp_path / "config.json").dtype == torch.bfloat16
    ours.name_or_path = tmp_path
    assert ours.name_or_path == str(tmp_path) and ours.to_dict()["_name_or_path"] == str(tmp_path)


@pytest.mark.parametrize("use_diff", [True, False])
def test_json_files_each_library_reads_of_the_other(tmp_path, use_diff):
    inputs = {"hidden_size": 37, "num_labels": 3, "use_cache": False, "bos_token_id": 1}
    ours, theirs = BertConfig(**inputs), transformers.BertConfig(**inputs)
    ours.to_json_file(tmp_path / "ours.json", use_diff=use_diff)
    theirs.to_json_file(tmp_path / "theirs.json", use_diff=use_diff)
    assert json.loads(ours.to_json_string(use_diff=use_diff)) == ours.to_diff_dict() == ours.to_dict()
    assert BertConfig.from_json_file(tmp_path / "ours.json") == ours
    for read in (BertConfig.from_json_file(tmp_path / "theirs.json"),
                 transformers.BertConfig.from_json_file(tmp_path / "ours.json")):
        for key in ("hidden_size", "num_labels", "id2label", "use_cache", "bos_token_id", "is_decoder"):
            assert getattr(read, key) == getattr(theirs, key), key


def test_from_dict_takes_transformers_keywords():
    data = {"hidden_size": 64, "num_attention_heads": 2, "seen": 1}
    ours, ours_unused = BertConfig.from_dict(dict(data), num_labels=3, use_cache=False, hidden_dropout_prob=0.3,
                                             seen=2, name_or_path="me/tiny", foo=1, return_unused_kwargs=True)
    theirs, theirs_unused = transformers.BertConfig.from_dict(
        dict(data), num_labels=3, use_cache=False, hidden_dropout_prob=0.3, seen=2, name_or_path="me/tiny", foo=1,
        return_unused_kwargs=True)
    for key in ("num_labels", "use_cache", "hidden_dropout_prob", "seen", "name_or_path", "hidden_size"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours_unused == theirs_unused == {"foo": 1}
    assert BertConfig.from_dict(dict(data), dtype="auto") == BertConfig.from_dict(dict(data))
    with pytest.raises(ConfigError, match="unknown config field 'foo'"):  # transformers drops it unsaid
        BertConfig.from_dict(dict(data), foo=1)
    with pytest.raises(ConfigError, match="hidden_dropout_prob must be in"):
        BertConfig.from_dict(dict(data), hidden_dropout_prob=1.5)


def test_transformers_config_tester_steps(tmp_path):
    """tests/test_configuration_common.py's ConfigTester, run as BertModelTest runs it (hidden_size=37)."""
    inputs = {"hidden_size": 37}
    config = BertConfig(**inputs)
    for value, name in enumerate(["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"]):
        setattr(config, name, value)
        assert getattr(config, name) == value
    config = BertConfig(**inputs)
    assert all(json.loads(config.to_json_string())[key] == value for key, value in inputs.items())
    config.to_json_file(tmp_path / "config.json")
    assert BertConfig.from_json_file(tmp_path / "config.json").to_dict() == config.to_dict()
    config.save_pretrained(tmp_path / "saved")
    assert BertConfig.from_pretrained(tmp_path / "saved").to_dict() == config.to_dict()
    config = BertConfig(**inputs, num_labels=5)
    assert len(config.id2label) == len(config.label2id) == 5
    config.num_labels = 3
    assert len(config.id2label) == len(config.label2id) == 3


def test_heads_must_divide_hidden_size_when_a_model_is_built(tmp_path):
    """As in transformers, the config holds any sizes; the model refuses them, in one line naming both numbers."""
    config = BertConfig.tiny(hidden_size=100, num_attention_heads=12)
    message = r"^hidden_size \(100\) must be divisible by num_attention_heads \(12\)$"
    for build in (BertModel, BertForSequenceClassification):
        with pytest.raises(ConfigError, match=message):
            build(config)
    with pytest.raises(ConfigError, match=message):
        BertModel(transformers.BertConfig(**config.to_dict()))
    # from a checkpoint folder: refused before the weights are read (these are no safetensors file at all)
    config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="config.json: " + message[1:]):  # naming the file it read
        BertModel.from_pretrained(tmp_path)


def test_an_encoder_names_no_labels():
    """Not transformers' two: an encoder's config.json stays without label names, and a classifier built on it
    gets transformers' two (LABEL_0, LABEL_1), as a transformers classifier would."""
    assert BertConfig().num_labels == 0 and "id2label" not in BertConfig().to_dict()
    classifier = BertForSequenceClassification(BertConfig.tiny())
    assert classifier.config.id2label == transformers.BertConfig().id2label
