"""transformers' from_pretrained options as code written for it passes them (bertviz's attn_implementation, device_map,
output_loading_info, add_pooling_layer, the Hub's options, cache_dir / revision / subfolder of a local Hugging Face
cache), on the real MiniLM checkpoint against transformers where it has an answer."""

import json
import shutil

import pytest
import torch
import transformers

from bertforge import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer
from bertforge.errors import BertforgeError, ConfigError

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def batch(tokenizer):
    return tokenizer(["The cat sat on the mat.", "It was tired."], padding=True, return_tensors="pt")


def test_bertviz_style_loading_gives_transformers_attentions(minilm_dir, batch):
    """bertviz's recipe: from_pretrained(name, output_attentions=True, attn_implementation="eager")."""
    ours = BertModel.from_pretrained(minilm_dir, output_attentions=True, attn_implementation="eager")
    theirs = transformers.BertModel.from_pretrained(minilm_dir, output_attentions=True, attn_implementation="eager")
    with torch.inference_mode():
        mine, reference = ours(**batch).attentions, theirs.eval()(**batch).attentions
    real = batch["attention_mask"].bool()
    for a, b in zip(mine, reference):
        queries = real[:, None, :].expand(a.shape[:3])
        assert (a - b)[queries].abs().max() < TOLERANCE
    with pytest.raises(ConfigError, match="unknown attn_implementation 'fast'"):
        BertModel.from_pretrained(minilm_dir, attn_implementation="fast")


def test_hub_options_are_accepted_and_change_nothing(minilm, minilm_dir, batch):
    loaded = BertModel.from_pretrained(minilm_dir, token=None, local_files_only=True, trust_remote_code=False,
                                       low_cpu_mem_usage=True, use_safetensors=True, force_download=False)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir, use_fast=True, local_files_only=True, token=None)
    assert tokenizer("The cat sat.")["input_ids"] == BertTokenizer.from_pretrained(minilm_dir)("The cat sat.")[
        "input_ids"]
    with torch.inference_mode():
        assert torch.equal(loaded(**batch).last_hidden_state, minilm(**batch).last_hidden_state)


@pytest.mark.parametrize("device_map", ["cpu", "auto", {"": "cpu"}, torch.device("cpu")])
def test_device_map_places_the_model_on_one_device(minilm_dir, device_map):
    expected = "cuda" if device_map == "auto" and torch.cuda.is_available() else "cpu"
    model = BertModel.from_pretrained(minilm_dir, device_map=device_map)
    assert {parameter.device.type for parameter in model.parameters()} == {expected}


def test_device_map_over_several_devices_is_refused(minilm_dir):
    with pytest.raises(ConfigError, match="one device"):
        BertModel.from_pretrained(minilm_dir, device_map={"embeddings": "cpu", "encoder": "cpu"})
    with pytest.raises(ConfigError, match="is not a device"):
        BertModel.from_pretrained(minilm_dir, device_map="gpu please")


def test_loading_info_names_what_transformers_names(minilm_dir):
    model, info = BertForSequenceClassification.from_pretrained(minilm_dir, output_loading_info=True)
    _, reference = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, output_loading_info=True)
    assert isinstance(model, BertForSequenceClassification)
    assert sorted(info["missing_keys"]) == sorted(reference["missing_keys"]) == ["classifier.bias",
                                                                                 "classifier.weight"]
    assert info["unexpected_keys"] == [] and info["mismatched_keys"] == []


def test_no_pooling_layer(minilm, minilm_dir, batch):
    bare = BertModel.from_pretrained(minilm_dir, add_pooling_layer=False)
    with torch.inference_mode():
        output = bare(**batch)
        assert output.pooler_output is None
        assert torch.equal(output.last_hidden_state, minilm(**batch).last_hidden_state)
    with pytest.raises(ConfigError, match="add_pooling_layer: BertForSequenceClassification takes no such option"):
        BertForSequenceClassification.from_pretrained(minilm_dir, add_pooling_layer=False)


def test_cache_dir_revision_and_subfolder(minilm_dir, tmp_path, batch, minilm):
    """A Hugging Face cache laid out as huggingface_hub writes it: refs/<branch> names a commit under snapshots/."""
    repository = tmp_path / "cache" / "models--someone--tiny"
    for commit, ref in (("a" * 40, "main"), ("b" * 40, "v2")):
        shutil.copytree(minilm_dir, repository / "snapshots" / commit / "model")
        (repository / "refs").mkdir(parents=True, exist_ok=True)
        (repository / "refs" / ref).write_text(commit)
    for revision in (None, "v2", "b" * 40):
        model = BertModel.from_pretrained("someone/tiny", cache_dir=tmp_path / "cache", revision=revision,
                                          subfolder="model")
        tokenizer = BertTokenizer.from_pretrained("someone/tiny", cache_dir=tmp_path / "cache", revision=revision,
                                                  subfolder="model")
        with torch.inference_mode():
            assert torch.equal(model(**batch).last_hidden_state, minilm(**batch).last_hidden_state)
        assert tokenizer.vocab_size == minilm.config.vocab_size
    with pytest.raises(BertforgeError, match="at revision 'v3'"):
        BertModel.from_pretrained("someone/tiny", cache_dir=tmp_path / "cache", revision="v3", subfolder="model")
    with pytest.raises(BertforgeError, match="no such subfolder"):
        BertModel.from_pretrained("someone/tiny", cache_dir=tmp_path / "cache", subfolder="elsewhere")


@pytest.mark.parametrize("ours_class,theirs_name", [(BertModel, "BertModel"),
                                                    (BertForSequenceClassification, "BertForSequenceClassification")])
def test_model_and_config_answer_what_transformers_answers(minilm_dir, ours_class, theirs_name, tmp_path):
    ours = ours_class.from_pretrained(minilm_dir, dtype=torch.bfloat16)
    theirs = getattr(transformers, theirs_name).from_pretrained(minilm_dir, dtype=torch.bfloat16)
    for options in ({}, {"exclude_embeddings": True}, {"only_trainable": True}):
        assert ours.num_parameters(**options) == theirs.num_parameters(**options), options
    for name in ("dtype", "device", "main_input_name", "base_model_prefix"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.can_generate() is theirs.can_generate() is False
    assert ours.config.model_type == theirs.config.model_type == "bert"
    config = BertConfig.from_pretrained(minilm_dir, output_attentions=True)
    assert config.output_attentions and config.hidden_size == theirs.config.hidden_size
    assert json.loads(config.to_json_string()) == config.to_dict()
    config.save_pretrained(tmp_path / "config-only")
    assert BertConfig.from_pretrained(tmp_path / "config-only") == config
    assert transformers.BertConfig.from_pretrained(tmp_path / "config-only").output_attentions
