"""Checkpoint I/O: strict loading of the real checkpoint, round trips with transformers, clear errors."""

import errno
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertforge.checkpoint.hf_format as hf_format
from bertforge import BertConfig, BertModel, CheckpointError, ConfigError
from bertforge.checkpoint import load_hf_state_dict, resolve_model_dir
from bertforge.checkpoint.hf_format import read_state_dict
from bertforge.checkpoint.key_map import MODULE_NAMES, from_hf, to_hf

transformers = pytest.importorskip("transformers")


def hf_config(config: BertConfig):
    return transformers.BertConfig(**config.to_dict())


def inputs(config, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, config.vocab_size, (2, 9), generator=generator)
    attention_mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    token_type_ids = torch.tensor([[0] * 4 + [1] * 5, [0] * 3 + [1] * 2 + [0] * 4])
    return input_ids, attention_mask, token_type_ids


def assert_same_outputs(ours: BertModel, reference, config):
    input_ids, attention_mask, token_type_ids = inputs(config)
    with torch.inference_mode():
        mine = ours.eval()(input_ids, attention_mask, token_type_ids)
        theirs = reference.eval()(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    real = attention_mask.bool()
    assert (mine.last_hidden_state[real] - theirs.last_hidden_state[real]).abs().max() < 1e-5
    assert (mine.pooler_output - theirs.pooler_output).abs().max() < 1e-5


def test_real_checkpoint_loads_strictly(minilm_dir):
    state, source = read_state_dict(minilm_dir)
    model = BertModel(BertConfig.load(minilm_dir / "config.json"))
    report = load_hf_state_dict(model, state, source)
    assert report.skipped == [] and report.initialised == []
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[to_hf(name)]), name


def test_every_parameter_has_a_table_entry():
    names = BertModel(BertConfig.tiny()).state_dict()
    assert all(to_hf(name) != name or name.startswith("pooler.") for name in names)
    assert all(from_hf(to_hf(name)) == name for name in names)
    assert len(MODULE_NAMES) == len({hf for hf in MODULE_NAMES.values()})


@pytest.mark.parametrize("config", [BertConfig.tiny(vocab_size=512), BertConfig.base()], ids=["tiny", "base"])
def test_transformers_checkpoint_loads_into_bertforge(tmp_path, config):
    torch.manual_seed(0)
    reference = transformers.BertModel(hf_config(config))
    reference.save_pretrained(tmp_path)
    assert_same_outputs(BertModel.from_pretrained(tmp_path), reference, config)


@pytest.mark.parametrize("config", [BertConfig.tiny(vocab_size=512), BertConfig.base()], ids=["tiny", "base"])
def test_bertforge_checkpoint_loads_into_transformers(tmp_path, config):
    torch.manual_seed(0)
    ours = BertModel(config)
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"
    assert_same_outputs(ours, transformers.BertModel.from_pretrained(tmp_path), config)


def test_save_load_identity(tmp_path, tiny_config):
    model = BertModel(tiny_config)
    model.save_pretrained(tmp_path)
    loaded = BertModel.from_pretrained(tmp_path)
    assert loaded.config == tiny_config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert not loaded.training, "from_pretrained returns a model in eval mode, as users expect"


def test_task_checkpoint_with_prefix_and_heads_loads_into_the_encoder(tmp_path, caplog):
    config = BertConfig.tiny(vocab_size=512)
    torch.manual_seed(0)
    pretraining = transformers.BertForPreTraining(hf_config(config))
    pretraining.save_pretrained(tmp_path)
    with caplog.at_level("INFO", logger="bertforge"):
        ours = BertModel.from_pretrained(tmp_path)
    assert "skipped" in caplog.text and "cls.predictions" in caplog.text and "cls.seq_relationship" in caplog.text
    assert_same_outputs(ours, pretraining.bert, config)


def test_pytorch_bin_and_legacy_layer_norm_names(tmp_path, tiny_config):
    model = BertModel(tiny_config)
    state = {to_hf(name).replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): t
             for name, t in model.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    tiny_config.save(tmp_path / "config.json")
    loaded = BertModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.embeddings.norm.weight, model.embeddings.norm.weight)


def test_pytorch_bin_is_read_without_unpickling_code(tmp_path, tiny_config):
    tiny_config.save(tmp_path / "config.json")
    torch.save({"weights": {"not": "a tensor"}, "code": print}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: unreadable PyTorch checkpoint"):
        BertModel.from_pretrained(tmp_path)


@pytest.fixture
def saved_tiny(tmp_path, tiny_config):
    BertModel(tiny_config).save_pretrained(tmp_path)
    return tmp_path


def edit_weights(directory, edit):
    path = directory / "model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path)


def test_missing_tensor_names_the_key_and_file(saved_tiny):
    edit_weights(saved_tiny, lambda state: state.pop("encoder.layer.1.output.dense.bias"))
    with pytest.raises(CheckpointError, match=r"model.safetensors: missing tensor 'encoder.layer.1.output.dense.bias'"):
        BertModel.from_pretrained(saved_tiny)


def test_wrong_shape_names_the_key_and_file(saved_tiny):
    def widen(state):
        state["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(40, 32)
    edit_weights(saved_tiny, widen)
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'encoder.layer.0.intermediate.dense.weight' "
                                              r"has shape \(40, 32\), the model expects \(37, 32\)"):
        BertModel.from_pretrained(saved_tiny)


def test_extra_encoder_layer_is_an_error(saved_tiny):
    def add_layer(state):
        state["encoder.layer.2.output.dense.bias"] = torch.zeros(32)
    edit_weights(saved_tiny, add_layer)
    with pytest.raises(CheckpointError, match=r"'encoder.layer.2.output.dense.bias' has no place in this model"):
        BertModel.from_pretrained(saved_tiny)


def test_missing_pooler_is_initialised_with_a_warning(saved_tiny, caplog):
    edit_weights(saved_tiny, lambda state: [state.pop(k) for k in ("pooler.dense.weight", "pooler.dense.bias")])
    with caplog.at_level("WARNING", logger="bertforge"):
        BertModel.from_pretrained(saved_tiny)
    assert "newly initialised" in caplog.text and "pooler.dense.weight" in caplog.text


def test_corrupt_weights_file(saved_tiny):
    (saved_tiny / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable safetensors file"):
        BertModel.from_pretrained(saved_tiny)


def test_missing_weights_file(saved_tiny):
    (saved_tiny / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        BertModel.from_pretrained(saved_tiny)


@pytest.mark.parametrize(("weights", "flag"), [("tf_model.h5", "from_tf"), ("flax_model.msgpack", "from_flax")])
def test_weights_of_another_framework_are_named_with_how_to_convert_them(saved_tiny, weights, flag):
    """A hub folder whose only weights are Keras' or Flax's (transformers 5 reads neither): the error names the file
    and the transformers 4 call that converts it."""
    (saved_tiny / "model.safetensors").unlink()
    (saved_tiny / weights).write_bytes(b"\x89HDF\r\n")
    with pytest.raises(CheckpointError, match=rf"the weights are in {weights} \(.*{flag}=True\)\.save_pretrained"):
        BertModel.from_pretrained(saved_tiny)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such model directory"):
        BertModel.from_pretrained(tmp_path / "nowhere")


def test_bad_config_key_in_checkpoint(saved_tiny):
    config = json.loads((saved_tiny / "config.json").read_text())
    (saved_tiny / "config.json").write_text(json.dumps({**config, "add_cross_attention": True}))
    with pytest.raises(ConfigError, match=r"config.json: add_cross_attention=True is not supported"):
        BertModel.from_pretrained(saved_tiny)


def test_unknown_override_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown config field 'hidden_dropout'"):
        BertModel.from_pretrained("default", hidden_dropout=0.2)


def test_default_names_resolve_to_the_embedded_model(minilm_dir):
    assert resolve_model_dir("default") == resolve_model_dir("all-MiniLM-L6-v2") == minilm_dir


def test_a_failed_save_keeps_the_previous_checkpoint(saved_tiny, monkeypatch, tiny_config):
    before = (saved_tiny / "model.safetensors").read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-write")
    monkeypatch.setattr(hf_format, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        BertModel(tiny_config).save_pretrained(saved_tiny)
    assert (saved_tiny / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in saved_tiny.iterdir()) == ["config.json", "model.safetensors"]


def test_a_full_disk_names_the_weights_file_and_keeps_the_previous_one(saved_tiny, tiny_config, file_size_limit):
    """safetensors reports a failed write as its own error, the OS's number in its text ("I/O error: File too large
    (os error 27)"): it is the OSError that names the file."""
    path = saved_tiny / "model.safetensors"
    before = path.read_bytes()
    for limit in (4096, len(before) // 2, len(before) - 100):
        with file_size_limit(limit), pytest.raises(OSError) as failure:
            BertModel(tiny_config).save_pretrained(saved_tiny)
        assert (failure.value.errno, failure.value.filename) == (errno.EFBIG, str(path))
        assert path.read_bytes() == before
        assert sorted(p.name for p in saved_tiny.iterdir()) == ["config.json", "model.safetensors"]


def test_config_names_the_architecture_for_auto_classes(tmp_path, tiny_config):
    BertModel(tiny_config).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertModel"]
    auto = transformers.AutoModel.from_pretrained(tmp_path)
    assert type(auto).__name__ == "BertModel"


def test_weights_this_process_cannot_open_say_why(saved_tiny, monkeypatch):
    """safetensors reports a permission problem as "No such file or directory"; the system's reason is given.
    (Simulated: the tests may run as root, whom chmod does not stop.)"""
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint

    def denied(path, mode="r", *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(hf_format, "open", denied, raising=False)
    with pytest.raises(CheckpointError, match="model.safetensors: can't read the weights: Permission denied"):
        BertModel.from_pretrained(saved_tiny)
    with pytest.raises(CheckpointError, match="model.safetensors: can't read the weights: Permission denied"):
        inspect_checkpoint(saved_tiny)


@pytest.mark.parametrize("wording", ["Error while serializing: I/O error: File too large (os error 27)",
                                     'Error while serializing: IoError(Os { code: 27, kind: FileTooLarge, message: '
                                     '"File too large" })'])
def test_a_failed_safetensors_write_is_the_operating_systems_error_in_either_wording(tmp_path, monkeypatch, wording):
    """safetensors 0.5 and later say '(os error 27)', 0.4 'Os { code: 27, ...}' (what safetensors 0.4.3 printed for
    RLIMIT_FSIZE): either is the OSError, naming the file, that a full disk is everywhere else."""
    from safetensors import SafetensorError

    def failing_save(*args, **kwargs):
        raise SafetensorError(wording)

    monkeypatch.setattr(hf_format, "save_file", failing_save)
    with pytest.raises(OSError) as raised:
        hf_format.save_safetensors({"x": torch.zeros(2)}, tmp_path / "model.safetensors")
    assert raised.value.errno == errno.EFBIG and not isinstance(raised.value, SafetensorError)
