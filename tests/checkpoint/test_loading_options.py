"""transformers' from_pretrained options as code written for it passes them (bertviz's attn_implementation, device_map,
output_loading_info, add_pooling_layer, the Hub's options, cache_dir / revision / subfolder of a local Hugging Face
cache), on the real MiniLM checkpoint against transformers where it has an answer."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

import bertforge
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
    assert info == reference and info["missing_keys"] == {"classifier.bias", "classifier.weight"}
    assert info["unexpected_keys"] == info["mismatched_keys"] == set()


def test_loading_info_names_a_head_of_another_size_as_transformers_does(minilm_dir, tmp_path):
    transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).save_pretrained(tmp_path)
    options = {"num_labels": 3, "ignore_mismatched_sizes": True, "output_loading_info": True}
    _, info = BertForSequenceClassification.from_pretrained(tmp_path, **options)
    _, reference = transformers.BertForSequenceClassification.from_pretrained(tmp_path, **options)
    assert info == reference
    assert info["mismatched_keys"] == {("classifier.weight", (2, 384), (3, 384)), ("classifier.bias", (2,), (3,))}


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


def test_the_cache_the_environment_names(minilm_dir, tmp_path, batch, minilm, monkeypatch):
    """huggingface_hub's older $HUGGINGFACE_HUB_CACHE names the cache as $HF_HUB_CACHE does; sentence-transformers'
    model classes look in $SENTENCE_TRANSFORMERS_HOME when no cache_folder is given, as there."""
    from bertforge import CrossEncoder, SentenceEncoder

    for cache in ("hub", "sentence-transformers"):
        repository = tmp_path / cache / "models--someone--tiny"
        shutil.copytree(minilm_dir, repository / "snapshots" / ("a" * 40))
        (repository / "refs").mkdir()
        (repository / "refs" / "main").write_text("a" * 40)
    for variable in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "SENTENCE_TRANSFORMERS_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(BertforgeError, match="not in the Hugging Face cache"):
        BertModel.from_pretrained("someone/tiny")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "hub"))
    with torch.inference_mode():
        assert torch.equal(BertModel.from_pretrained("someone/tiny")(**batch).last_hidden_state,
                           minilm(**batch).last_hidden_state)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE")
    monkeypatch.setenv("SENTENCE_TRANSFORMERS_HOME", str(tmp_path / "sentence-transformers"))
    texts = ["a cat sat on the mat"]
    assert np.allclose(SentenceEncoder("someone/tiny").encode(texts), SentenceEncoder(minilm_dir).encode(texts))
    assert CrossEncoder("someone/tiny").num_labels == 1
    with pytest.raises(BertforgeError, match="not in the Hugging Face cache"):
        BertModel.from_pretrained("someone/tiny")  # a model class of transformers' does not look there


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


def test_config_overrides_as_transformers_takes_them(minilm_dir, tmp_path, batch, minilm):
    """num_labels, transformers' own keys (use_cache), config= in config.json's place: the same labels and
    numbers as transformers gives."""
    ours, theirs = (module.BertConfig.from_pretrained(minilm_dir, num_labels=5, use_cache=False)
                    for module in (bertforge, transformers))
    assert ours.num_labels == theirs.num_labels == 5
    assert ours.id2label == theirs.id2label and ours.label2id == theirs.label2id
    ours.save_pretrained(tmp_path / "config")
    assert transformers.BertConfig.from_pretrained(tmp_path / "config").use_cache is False
    for config in (ours, theirs, tmp_path / "config", str(tmp_path / "config" / "config.json")):
        model = BertForSequenceClassification.from_pretrained(minilm_dir, config=config)
        assert model.config.id2label == theirs.id2label, config
    smaller = BertModel.from_pretrained(minilm_dir, config=BertConfig.from_pretrained(minilm_dir,
                                                                                      output_hidden_states=True))
    with torch.inference_mode():
        assert len(smaller(**batch).hidden_states) == minilm.config.num_hidden_layers + 1
    with pytest.raises(ConfigError, match="unknown config field 'num_layers'"):
        BertConfig.from_pretrained(minilm_dir, num_layers=3)
    with pytest.raises(ConfigError, match="is_decoder=True is not supported"):
        BertModel.from_pretrained(minilm_dir, is_decoder=True)


def test_weights_variants_and_formats(minilm_dir, tmp_path, batch, minilm):
    """variant= reads model.VARIANT.safetensors, use_safetensors= one format only, as transformers (its loader
    options from_tf / weights_only change nothing: bertforge picks the loader by the files)."""
    directory = tmp_path / "variants"
    shutil.copytree(minilm_dir, directory)
    (directory / "model.safetensors").rename(directory / "model.fp16.safetensors")
    reference = transformers.BertModel.from_pretrained(directory, variant="fp16").eval()
    model = BertModel.from_pretrained(directory, variant="fp16", from_tf=False, weights_only=True)
    with torch.inference_mode():
        expected = minilm(**batch).last_hidden_state
        assert torch.equal(model(**batch).last_hidden_state, expected)
        real = batch["attention_mask"].bool()
        assert (reference(**batch).last_hidden_state - expected)[real].abs().max() < TOLERANCE
    with pytest.raises(BertforgeError, match="no model.safetensors or pytorch_model.bin"):
        BertModel.from_pretrained(directory)
    torch.save(dict(minilm.state_dict()), directory / "elsewhere.bin")
    with pytest.raises(BertforgeError, match="no pytorch_model.bin .* as use_safetensors=False asks"):
        BertModel.from_pretrained(minilm_dir, use_safetensors=False)
    with pytest.raises(BertforgeError, match="no model.bf16.safetensors or pytorch_model.bf16.bin"):
        BertModel.from_pretrained(directory, variant="bf16")


def test_devices_this_machine_lacks_are_one_line_errors(minilm_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    for device_map in ("cuda", "cuda:1", 0):
        with pytest.raises(ConfigError, match="this machine can't place a model there") as raised:
            BertModel.from_pretrained(minilm_dir, device_map=device_map)
        assert "\n" not in str(raised.value)


@pytest.mark.parametrize("load", [BertModel.from_pretrained, BertTokenizer.from_pretrained,
                                  BertForSequenceClassification.from_pretrained, BertConfig.from_pretrained])
def test_an_empty_name_is_refused_not_read_as_the_current_folder(load, minilm_dir, monkeypatch):
    monkeypatch.chdir(minilm_dir)  # which holds a model: "" must not load it
    with pytest.raises(BertforgeError, match="^the model path is empty"):
        load("")


def test_tokenizer_options_as_transformers_takes_them(minilm_dir):
    text = "Hello <ent> don't [UNK] unaffable <mask> [MASK]"
    reference = transformers.AutoTokenizer.from_pretrained
    for options in ({"additional_special_tokens": ["<ent>"]}, {"extra_special_tokens": ["<ent>"]},
                    {"mask_token": "<mask>"}, {"unk_token": "[MASK]"},
                    {"model_input_names": ["input_ids", "attention_mask"]}, {"do_basic_tokenize": True}):
        ours, theirs = BertTokenizer.from_pretrained(minilm_dir, **options), reference(minilm_dir, **options)
        assert dict(ours(text)) == dict(theirs(text)), options
        assert dict(ours([text, "x"], padding=True)) == dict(theirs([text, "x"], padding=True)), options
        assert (len(ours), ours.mask_token, ours.mask_token_id, ours.unk_token) == \
            (len(theirs), theirs.mask_token, theirs.mask_token_id, theirs.unk_token), options
    # model_input_names is saved, and read back by both
    narrow = BertTokenizer.from_pretrained(minilm_dir, model_input_names=["input_ids", "attention_mask"])
    assert "token_type_ids" in narrow("x", return_token_type_ids=True)
    with pytest.raises(ConfigError, match="do_basic_tokenize=False is not supported"):
        BertTokenizer.from_pretrained(minilm_dir, do_basic_tokenize=False)
    with pytest.raises(ConfigError, match="never_split is transformers' slow tokenizer's"):
        BertTokenizer.from_pretrained(minilm_dir, never_split=["don't"])


def test_model_input_names_are_saved(minilm_dir, tmp_path):
    narrow = BertTokenizer.from_pretrained(minilm_dir, model_input_names=["input_ids", "attention_mask"])
    narrow.save_pretrained(tmp_path)
    assert set(BertTokenizer.from_pretrained(tmp_path)("x")) == {"input_ids", "attention_mask"}
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path)("x")) == {"input_ids", "attention_mask"}


def test_name_or_path_is_kept_as_transformers_keeps_it(minilm_dir):
    theirs = transformers.BertModel.from_pretrained(minilm_dir)
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    assert BertModel.from_pretrained(minilm_dir).name_or_path == theirs.name_or_path == str(minilm_dir)
    assert BertTokenizer.from_pretrained(minilm_dir).name_or_path == their_tokenizer.name_or_path == str(minilm_dir)
    assert BertModel.from_pretrained("default").name_or_path == "default"
    assert BertModel(BertConfig.tiny()).name_or_path == ""


def test_what_transformers_code_asks_of_a_model(minilm_dir, tmp_path, batch):
    """base_model (what code that freezes the encoder uses), the memory footprint, the input-embedding grad hook,
    and save_pretrained's options (is_main_process, state_dict), against transformers' BertForSequenceClassification."""
    ours = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    assert ours.base_model is ours.bert and BertModel.from_pretrained(minilm_dir).base_model.__class__ is BertModel
    # transformers counts its position_ids buffer too; the parameters alone are the same bytes
    assert ours.get_memory_footprint(return_buffers=False) == theirs.get_memory_footprint(return_buffers=False)

    for parameter in ours.base_model.parameters():
        parameter.requires_grad_(False)
    ours.enable_input_require_grads()
    seen = []
    hook = ours.get_input_embeddings().register_forward_hook(lambda m, i, output: seen.append(output.requires_grad))
    ours(**batch)
    ours.disable_input_require_grads()
    ours(**batch)
    hook.remove()
    assert seen == [True, False]

    assert ours.save_pretrained(tmp_path / "not-main", is_main_process=False) == tmp_path / "not-main"
    assert not (tmp_path / "not-main").exists()
    replaced = {name: torch.zeros_like(tensor) if name == "classifier.bias" else tensor
                for name, tensor in ours.state_dict().items()}
    ours.save_pretrained(tmp_path / "given", state_dict=replaced)
    reloaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "given")
    assert torch.equal(reloaded.classifier.bias, torch.zeros(2))
    assert torch.equal(reloaded.classifier.weight, ours.classifier.weight)
    with pytest.raises(ConfigError, match="safetensors only"):
        ours.save_pretrained(tmp_path / "pickled", safe_serialization=False)
    with pytest.raises(ConfigError, match="runs offline"):
        ours.save_pretrained(tmp_path / "hub", push_to_hub=True)


@pytest.mark.parametrize("ours_class, theirs_name", [(BertModel, "BertModel"),
                                                     (BertForSequenceClassification, "BertForSequenceClassification"),
                                                     (bertforge.BertForMaskedLM, "BertForMaskedLM"),
                                                     (bertforge.BertForPreTraining, "BertForPreTraining")])
def test_load_state_dict_takes_a_transformers_state_dict(minilm_dir, batch, ours_class, theirs_name):
    """model.load_state_dict(transformers_model.state_dict()) (or torch.load of a pytorch_model.bin), strictly:
    the tied decoder's copy checked and dropped, position_ids ignored; then the same outputs as transformers."""
    torch.manual_seed(0)
    theirs = getattr(transformers, theirs_name).from_pretrained(minilm_dir, attn_implementation="eager").eval()
    with torch.no_grad():  # heads of their own, not the fresh initialisation ours would also get
        for name, parameter in theirs.named_parameters():
            if not name.startswith("bert.") and "word_embeddings" not in name:
                parameter.normal_(0, 0.02)
    state = theirs.state_dict()
    prefix = "bert." if theirs_name != "BertModel" else ""
    # the position ids buffer, as transformers 4 saved it
    state[f"{prefix}embeddings.position_ids"] = torch.arange(theirs.config.max_position_embeddings)[None]
    ours = ours_class(BertConfig.load(minilm_dir / "config.json")).eval()
    assert ours.load_state_dict(state) is not None
    with torch.inference_mode():
        mine, reference = ours(**batch), theirs(**batch)
    real = batch["attention_mask"].bool()
    for name, tensor in reference.items():
        if isinstance(tensor, torch.Tensor):
            got, expected = getattr(mine, name), tensor
            if got.dim() >= 2 and got.shape[:2] == real.shape:
                got, expected = got[real], expected[real]
            assert (got - expected).abs().max() < TOLERANCE, name
    ours.load_state_dict(ours.state_dict())  # its own names, as ever
    state[f"{prefix}encoder.layer.0.attention.self.query.weight"] = torch.zeros(1, 384)
    with pytest.raises(RuntimeError, match=r"size mismatch for (bert\.)?encoder.layers.0.attention.query.weight"):
        ours.load_state_dict(state)


def test_a_trainers_output_folder_names_its_checkpoints(minilm_dir, tmp_path):
    """transformers' Trainer saves checkpoint-N folders into its output_dir (the model itself only at the end): given
    that folder, the error names them and the one to give, in step order (checkpoint-10 after checkpoint-2)."""
    from bertforge.errors import CheckpointError

    for step in (2, 10):
        shutil.copytree(minilm_dir, tmp_path / "out" / f"checkpoint-{step}")
    with pytest.raises(CheckpointError, match=r"out: no config.json, but the checkpoints checkpoint-2, checkpoint-10 "
                                              r"\(a Trainer's output_dir\): give one, e.g. .*out/checkpoint-10$"):
        BertModel.from_pretrained(tmp_path / "out")
    assert BertModel.from_pretrained(tmp_path / "out" / "checkpoint-10").config.hidden_size == 384
    # a folder holding a model beside its checkpoints (the end of a run; a PEFT adapter's weights) is that model
    shutil.copy(minilm_dir / "model.safetensors", tmp_path / "out")
    with pytest.raises(BertforgeError, match="config.json") as raised:
        BertModel.from_pretrained(tmp_path / "out")
    assert "checkpoint-2" not in str(raised.value)
    for name in ("config.json", "vocab.txt"):
        shutil.copy(minilm_dir / name, tmp_path / "out")
    assert BertModel.from_pretrained(tmp_path / "out").config.hidden_size == 384


def test_a_config_of_more_layers_than_the_weights_is_refused_before_it_is_built(tiny_model_dir, tmp_path):
    """A downloaded config.json of 40,000 layers over weights of 2 built 2.4 GB of layers for 38 s before a tensor
    was found missing; the layers the weights hold are counted first (transformers' names, as saved)."""
    from bertforge.errors import CheckpointError

    folder = shutil.copytree(tiny_model_dir, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 5000}))
    with pytest.raises(CheckpointError, match=r"model.safetensors: holds 2 layers, where config.json says "
                                              r"num_hidden_layers 5000 \(does config.json match the weights\?\)$"):
        BertModel.from_pretrained(folder)
    with pytest.raises(CheckpointError, match="where the config given says num_hidden_layers 24"):
        BertModel.from_pretrained(tiny_model_dir, num_hidden_layers=24)
