import dataclasses
import json

import pytest

from bertforge import BertConfig, BertModel, ConfigError


@pytest.mark.parametrize("name, layers, hidden, heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("medium", 8, 512, 8),
    ("base", 12, 768, 12), ("large", 24, 1024, 16),
])
def test_presets_have_the_published_sizes(name, layers, hidden, heads):
    config = BertConfig.preset(name)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden


def test_json_round_trip(tmp_path):
    config = BertConfig.mini(hidden_dropout_prob=0.2, id2label={0: "neg", 1: "pos"})
    config.save(tmp_path / "config.json")
    assert BertConfig.load(tmp_path / "config.json") == config
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["id2label"] == {"0": "neg", "1": "pos"} and data["label2id"] == {"neg": 0, "pos": 1}


def test_the_real_minilm_config_loads(minilm_dir):
    config = BertConfig.load(minilm_dir / "config.json")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (6, 384, 12)
    assert config.vocab_size == 30522


def test_hidden_size_must_divide_into_heads():
    """Checked when a model is built (tests/test_config_api.py), as transformers does: the config may hold it."""
    config = BertConfig(hidden_size=100)
    with pytest.raises(ConfigError, match=r"hidden_size \(100\) must be divisible by num_attention_heads \(12\)"):
        BertModel(config)


def write(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_unsupported_position_embedding_type_names_key_and_file(tmp_path):
    path = write(tmp_path, {**BertConfig.tiny().to_dict(), "position_embedding_type": "relative_key"})
    with pytest.raises(ConfigError, match=rf"{path}: position_embedding_type='relative_key' is not supported"):
        BertConfig.load(path)


def test_unknown_key_is_kept_and_reported_at_info_level(tmp_path, caplog):
    path = write(tmp_path, {"hidden_size": 128, "num_attention_heads": 2, "hiden_layers": 3})
    with caplog.at_level("INFO", logger="bertforge"):
        config = BertConfig.load(path)
    assert config.extra == {"hiden_layers": 3}
    assert f"{path}: keeping config keys bertforge does not use: hiden_layers" in caplog.text
    config.save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text())["hiden_layers"] == 3


@pytest.mark.parametrize("key, value", [("is_decoder", True), ("add_cross_attention", True),
                                        ("hidden_act", "swishy"), ("position_embedding_type", "relative_key_query")])
def test_values_bertforge_cannot_honour_name_key_value_and_file(tmp_path, key, value):
    path = write(tmp_path, {**BertConfig.tiny().to_dict(), key: value})
    with pytest.raises(ConfigError, match=rf"^{path}: {key}.*{value}.* not supported"):
        BertConfig.load(path)


def test_invalid_json_names_the_line(tmp_path):
    path = write(tmp_path, '{\n  "hidden_size": 128,\n  oops\n}')
    with pytest.raises(ConfigError, match=rf"{path}, line 3: invalid JSON"):
        BertConfig.load(path)


def test_wrong_value_type_is_a_config_error(tmp_path):
    path = write(tmp_path, {"num_hidden_layers": "six"})
    with pytest.raises(ConfigError, match=rf"{path}: num_hidden_layers must be a positive integer"):
        BertConfig.load(path)


def test_unknown_activation():
    with pytest.raises(ConfigError, match="hidden_act 'prelu' is not supported"):
        BertConfig(hidden_act="prelu")  # transformers' PReLU has a learnt slope no BERT checkpoint holds


def test_harmless_metadata_is_kept_and_does_not_change_the_model(tmp_path):
    path = write(tmp_path, {**BertConfig.tiny().to_dict(), "architectures": ["BertModel"],
                            "transformers_version": "4.8.2", "use_cache": True})
    config = BertConfig.load(path)
    assert config.extra == {"transformers_version": "4.8.2", "use_cache": True}
    assert dataclasses.replace(config, extra={}) == BertConfig.tiny()


def test_transformers_keywords_in_the_constructor():
    """BertConfig(num_labels=3) and BertConfig(**config.to_dict()), as transformers' BertConfig takes them."""
    transformers = pytest.importorskip("transformers")
    assert BertConfig(num_labels=3).id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    tiny = BertConfig.tiny(num_labels=2, use_cache=False)
    assert tiny.num_labels == 2 and tiny.extra == {"use_cache": False}
    assert BertConfig(**tiny.to_dict()) == tiny
    reference = transformers.BertConfig(hidden_size=64, num_attention_heads=2, num_labels=4, hidden_act="gelu_new")
    ours = BertConfig(**reference.to_dict())
    assert (ours.hidden_size, ours.num_labels, ours.hidden_act) == (64, 4, "gelu_new")
    assert ours == BertConfig.from_dict(reference.to_dict())
    with pytest.raises(ConfigError, match="position_embedding_type='relative_key' is not supported"):
        BertConfig(position_embedding_type="relative_key")
    with pytest.raises(ConfigError, match="unknown config field 'hiden_size'"):
        BertConfig(hiden_size=64)
    ours.num_labels = 2  # set, as transformers' configs are
    assert ours.id2label == {0: "LABEL_0", 1: "LABEL_1"} and ours.label2id == {"LABEL_0": 0, "LABEL_1": 1}
    ours.num_labels = 2
    assert ours.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    with pytest.raises(ConfigError, match="num_labels"):
        ours.num_labels = 0
    ours.update({"hidden_dropout_prob": 0.2, "use_cache": False})
    assert ours.hidden_dropout_prob == 0.2 and ours.extra["use_cache"] is False
    with pytest.raises(ConfigError, match="hidden_dropout_prob must be in"):
        ours.update({"hidden_dropout_prob": 1.5})


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", 0, "vocab_size must be a positive integer, got 0"),
    ("hidden_act", "bogus", "hidden_act 'bogus' is not supported"),
    ("num_attention_heads", 0, "num_attention_heads must be a positive integer, got 0"),
    ("hidden_dropout_prob", 5.0, r"hidden_dropout_prob must be in \[0, 1\), got 5.0"),
])
def test_a_field_set_after_the_config_was_made_is_checked_when_a_model_is_built(field, value, message):
    """transformers lets config.vocab_size = 0 be set; the model built from it then names the field, where it raised
    an IndexError, a KeyError or a ZeroDivisionError from inside the layers."""
    config = BertConfig.tiny(vocab_size=100)
    setattr(config, field, value)
    with pytest.raises(ConfigError, match=message):
        BertModel(config)


@pytest.mark.parametrize("make, message", [
    (lambda: BertConfig.from_dict(None), "a config is an object of fields, got null"),
    (lambda: BertConfig.from_dict([]), "a config is an object of fields, got an empty list"),
    (lambda: BertConfig(id2label=["neg", "pos"]), "id2label must be a dict of label ids and names"),
    (lambda: BertConfig.load(None), "a config file is named by its path, got None"),
    (lambda: BertConfig.load(""), "a config file is named by its path, got ''"),
])
def test_a_config_of_the_wrong_shape_is_refused_by_name(make, message):
    with pytest.raises(ConfigError, match=message):
        make()
