"""LoRA adapters in PEFT's format merge into bertforge's models: an adapter PEFT trained on transformers' BERT gives,
merged by bertforge, the outputs of PEFT's own merge (merge_and_unload) on real text; one PEFT trained on a bertforge
model gives PEFT's unmerged outputs; `export hf --adapter` writes the merged model transformers loads; adapters that
don't merge are one-line errors; a folder holding an adapter alone loads as its base with the adapter merged."""

import json
import shutil

import pytest
import torch

from bertforge import BertForSequenceClassification, BertModel, BertTokenizer
from bertforge.checkpoint.adapters import load_adapted, merge_lora
from bertforge.cli.main import main
from bertforge.errors import BertforgeError, CheckpointError, ConfigError
from bertforge.heads import BertForTokenClassification

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOLERANCE = 2e-5

# name -> (transformers' class, its options, PEFT's LoraConfig settings, bertforge's class)
ADAPTERS = {
    "classifier on every linear layer": (
        "BertForSequenceClassification", {"num_labels": 3},
        dict(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value", "dense"]),
        BertForSequenceClassification),
    "encoder, rsLoRA, an alpha per layer, the word embeddings": (
        "BertModel", {},
        dict(task_type="FEATURE_EXTRACTION", r=8, lora_alpha=16, use_rslora=True, alpha_pattern={"key": 4},
             target_modules=["key", "value", "word_embeddings"]),
        BertModel),
    "token classifier": (
        "BertForTokenClassification", {"num_labels": 5},
        dict(task_type="TOKEN_CLS", r=2, lora_alpha=2, target_modules=["query", "intermediate.dense"]),
        BertForTokenClassification),
}


@pytest.fixture(scope="module")
def batch(real_sentences, minilm_dir):
    return dict(BertTokenizer.from_pretrained(minilm_dir)(real_sentences, padding=True, truncation=True,
                                                          max_length=128, return_tensors="pt"))


def outputs(model, batch) -> torch.Tensor:
    with torch.inference_mode():
        output = model(**batch)
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def transformers_adapter(name, minilm_dir, directory):
    """A PEFT adapter on transformers' model, saved to `directory`, with random (non-zero) LoRA matrices and head;
    returns what PEFT's merged model computes."""
    class_name, options, settings, _ = ADAPTERS[name]
    torch.manual_seed(0)
    base = getattr(transformers, class_name).from_pretrained(minilm_dir, **options).eval()
    adapted = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **settings))
    adapted.save_pretrained(directory)
    return adapted.merge_and_unload().eval()


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_transformers_adapter_merges_as_peft_merges_it(name, minilm_dir, batch, tmp_path):
    merged = transformers_adapter(name, minilm_dir, tmp_path / "adapter")
    expected = outputs(merged, batch)
    real = batch["attention_mask"].bool()
    ours = load_adapted(minilm_dir, tmp_path / "adapter")
    assert type(ours) is ADAPTERS[name][3]
    unadapted = outputs(ADAPTERS[name][3].from_pretrained(minilm_dir, **ADAPTERS[name][1]), batch)
    got = outputs(ours, batch)
    if got.dim() == 3:  # per token: compared at real tokens (bertforge computes none at padding)
        got, expected, unadapted = got[real], expected[real], unadapted[real]
    assert (unadapted - expected).abs().max() > 0.05, "the adapter changes the outputs"
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)

    # merge_lora into a model already loaded as the base: the same numbers
    base = ADAPTERS[name][3].from_pretrained(minilm_dir, **ADAPTERS[name][1])
    again = outputs(merge_lora(base, tmp_path / "adapter"), batch)
    torch.testing.assert_close(again[real] if again.dim() == 3 else again, got, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ADAPTERS)
def test_an_adapter_folder_loads_as_transformers_loads_it(name, minilm_dir, real_sentences, batch, tmp_path):
    """A folder holding a LoRA adapter alone (PEFT's save_pretrained; sentence-transformers saves an adapted model
    so too) loads as transformers loads one: the base model adapter_config.json names, the adapter merged in (its
    trained head, with its labels, in place of the base's); the tokenizer is the base's when the folder has none.
    The commands read such a folder as what its base holds."""
    from bertforge import SentenceEncoder
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint

    merged = transformers_adapter(name, minilm_dir, tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "config.json").exists()
    expected = outputs(merged, batch)
    model_class = ADAPTERS[name][3]
    got = outputs(model_class.from_pretrained(tmp_path / "adapter"), batch)
    real = batch["attention_mask"].bool()
    if got.dim() == 3:
        got, expected = got[real], expected[real]
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)
    base_tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    assert BertTokenizer.from_pretrained(tmp_path / "adapter")(real_sentences)["input_ids"] == \
        base_tokenizer(real_sentences)["input_ids"]
    if model_class is BertModel:
        # the base's sentence-transformers layout (mean pooling over its 256 tokens, unit length) over the adapted
        # token vectors
        long_batch = dict(base_tokenizer(real_sentences, padding=True, truncation=True, max_length=256,
                                         return_tensors="pt"))
        states, real = outputs(merged, long_batch), long_batch["attention_mask"].bool()
        pooled = (states * real[..., None]).sum(1) / real.sum(1, keepdim=True)
        vectors = SentenceEncoder(tmp_path / "adapter").encode(real_sentences, convert_to_tensor=True)
        torch.testing.assert_close(vectors, torch.nn.functional.normalize(pooled, dim=-1), atol=TOLERANCE, rtol=0)
        checkpoint = inspect_checkpoint(tmp_path / "adapter")
        assert (checkpoint.head, checkpoint.directory) == ("encoder", tmp_path / "adapter")
    else:  # a head the base (an encoder) lacks: `export hf --adapter` makes it
        with pytest.raises(CheckpointError, match=r"adapter over .*: merge them first with `bertforge export hf"):
            inspect_checkpoint(tmp_path / "adapter")


def test_an_adapter_folder_whose_base_is_missing_is_a_one_line_error(minilm_dir, tmp_path, capsys):
    transformers_adapter("classifier on every linear layer", minilm_dir, tmp_path / "adapter")
    config = tmp_path / "adapter" / "adapter_config.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps(settings | {"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(CheckpointError, match=r"adapter_config.json: its base model .*gone.*: .*no such model"):
        BertForSequenceClassification.from_pretrained(tmp_path / "adapter")
    (tmp_path / "texts.txt").write_text("a first line\na second line\n")
    capsys.readouterr()
    for command in ("embed", "predict"):
        assert main([command, "--model", str(tmp_path / "adapter"), "--input", str(tmp_path / "texts.txt"),
                     "--output", str(tmp_path / f"{command}.jsonl")]) == 1
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and "adapter_config.json: its base model" in error and "gone" in error, error
    config.write_text(json.dumps(settings | {"base_model_name_or_path": None}))
    with pytest.raises(CheckpointError, match="no base_model_name_or_path, so the model it adapts is unknown"):
        BertForSequenceClassification.from_pretrained(tmp_path / "adapter")


def test_an_adapter_peft_trained_on_bertforge_merges_to_peft_s_outputs(minilm_dir, batch, tmp_path):
    """PEFT wraps bertforge's model as it is (its layers' names: query, value, up, down); trained a few steps, its
    unmerged outputs are what the merged bertforge model computes."""
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    adapted = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=16,
                                                         target_modules=["query", "value", "up", "down"]))
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert trainable < 0.01 * sum(p.numel() for p in adapted.parameters())
    optimizer = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-3)
    labels = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0, 1])
    adapted.train()
    for _ in range(3):
        optimizer.zero_grad()
        adapted(**batch, labels=labels).loss.backward()
        optimizer.step()
    adapted.eval()
    expected = outputs(adapted, batch)
    adapted.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["target_modules"] and saved["peft_type"] == "LORA"

    merged = load_adapted(minilm_dir, tmp_path / "adapter")
    torch.testing.assert_close(outputs(merged, batch), expected, atol=TOLERANCE, rtol=0)


def test_peft_prompt_tuning_runs_on_bertforge_as_on_transformers(minilm_dir, batch, tmp_path):
    """PEFT's prompt tuning asks `"text_config" in model.config` (a TypeError on bertforge's config); with the same
    virtual tokens, bertforge's classifier gives transformers' logits."""
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).save_pretrained(tmp_path)
    models = [BertForSequenceClassification.from_pretrained(tmp_path),
              transformers.BertForSequenceClassification.from_pretrained(tmp_path)]
    logits = []
    for model in models:
        torch.manual_seed(1)  # the virtual tokens' initial vectors
        adapted = peft.get_peft_model(model, peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=5))
        assert sum(p.numel() for p in adapted.parameters() if p.requires_grad) == 5 * 384 + 2 * 384 + 2
        logits.append(outputs(adapted.eval(), batch))
    torch.testing.assert_close(logits[0], logits[1], atol=TOLERANCE, rtol=0)


def test_export_hf_writes_the_merged_model_transformers_loads(minilm_dir, batch, tmp_path, capsys):
    name = "classifier on every linear layer"
    expected = outputs(transformers_adapter(name, minilm_dir, tmp_path / "adapter"), batch)
    assert main(["export", "hf", "--model", str(minilm_dir), "--adapter", str(tmp_path / "adapter"),
                 "--output", str(tmp_path / "merged")]) == 0
    assert "wrote" in capsys.readouterr().out
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(outputs(theirs, batch), expected, atol=TOLERANCE, rtol=0)
    ours = BertForSequenceClassification.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(outputs(ours, batch), expected, atol=TOLERANCE, rtol=0)


def test_adapters_that_do_not_merge_are_one_line_errors(minilm_dir, tmp_path, capsys):
    transformers_adapter("classifier on every linear layer", minilm_dir, tmp_path / "adapter")
    settings = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())

    def variant(name, **changes):
        directory = tmp_path / name
        shutil.copytree(tmp_path / "adapter", directory)
        (directory / "adapter_config.json").write_text(json.dumps({**settings, **changes}))
        return directory

    cases = [
        (variant("dora", use_dora=True), ConfigError, "use_dora: DoRA"),
        (variant("prefix", peft_type="PREFIX_TUNING"), ConfigError, "only LoRA adapters merge"),
        (variant("alpha", lora_alpha="big"), ConfigError, "lora_alpha must be a number, got 'big'"),
        (variant("nan", lora_alpha=float("nan")), ConfigError, "lora_alpha must be a finite number"),  # merged NaNs
        (variant("pattern", alpha_pattern=["query"]), ConfigError, "alpha_pattern must be an object of"),
        (variant("pattern-value", alpha_pattern={"query": "x"}), ConfigError,
         r"alpha_pattern\['query'\] must be a number"),
        (variant("pattern-regex", alpha_pattern={"query(": 4}), ConfigError,
         r"alpha_pattern: 'query\(' is not a regular expression"),
        (variant("task-list", task_type=["SEQ_CLS"]), ConfigError, "task_type must be a name"),
        (variant("task", task_type="CAUSAL_LM"), ConfigError, "task_type 'CAUSAL_LM' is none of bertforge's"),
        (tmp_path / "nowhere", ConfigError, "adapter_config.json: no such adapter config file"),
    ]
    for directory, error, message in cases:
        with pytest.raises(error, match=message):
            load_adapted(minilm_dir, directory)
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "adapter_config.json").write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match="no adapter_model.safetensors or adapter_model.bin"):
        load_adapted(minilm_dir, tmp_path / "no-weights")

    # Another base: the classifier has 3 labels, this model 2; a bare encoder has no classifier at all.
    other_labels = r"classifier\.\w+ has shape \(3.*\), the model's is \(2.*\) \(a base model with other labels\?\)"
    with pytest.raises(CheckpointError, match=other_labels):
        merge_lora(BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2), tmp_path / "adapter")
    no_place = r"classifier\.\w+ has no place in this model \(is it the adapter's base model\?\)"
    with pytest.raises(CheckpointError, match=no_place):
        merge_lora(BertModel.from_pretrained(minilm_dir), tmp_path / "adapter")

    capsys.readouterr()  # what transformers printed as it loaded
    for arguments in (["--adapter", str(tmp_path / "dora")], ["--adapter", str(tmp_path / "nowhere")]):
        assert main(["export", "hf", "--model", str(minilm_dir), *arguments,
                     "--output", str(tmp_path / "out")]) == 1
        error = capsys.readouterr().err.strip()
        assert error and "\n" not in error and "Traceback" not in error, error
        assert not (tmp_path / "out").exists()


def test_merging_refuses_a_quantized_model(minilm_dir, tmp_path):
    from bertforge.compress.calibration import calibration_batches
    from bertforge.compress.quantize import QuantizationConfig, quantize

    transformers_adapter("classifier on every linear layer", minilm_dir, tmp_path / "adapter")
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    quantized = quantize(model, QuantizationConfig(precision="int8"), calibration_batches(tokenizer)[:1])
    with pytest.raises(BertforgeError, match="already quantized"):
        merge_lora(quantized, tmp_path / "adapter")


def test_an_adapter_that_does_not_fit_leaves_the_model_as_it_was(minilm_dir, tmp_path):
    """Every name and shape is checked before any weight changes: an adapter that fails late (its classifier has
    other labels; its layers go deeper than the model's) leaves no layer merged, so a corrected call merges once."""
    from bertforge import BertConfig

    transformers_adapter("classifier on every linear layer", minilm_dir, tmp_path / "adapter")
    two_labels = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    shallow = BertForSequenceClassification(BertConfig.from_pretrained(minilm_dir, num_hidden_layers=2, num_labels=3))
    for model, message in ((two_labels, r"classifier\.\w+ has shape \(3.*\), the model's is \(2.*\)"),
                           (shallow, r"encoder\.layer\.2\.\S+ has no place in this model")):
        before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        with pytest.raises(CheckpointError, match=message):
            merge_lora(model, tmp_path / "adapter")
        changed = [name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])]
        assert changed == []
