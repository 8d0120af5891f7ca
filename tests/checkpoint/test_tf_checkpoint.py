"""The original BERT release's TensorFlow checkpoints (bert_config.json, vocab.txt, bert_model.ckpt.index/.data-*),
read without TensorFlow: checkpoints written by TensorFlow itself (its Saver, as google-research/bert's scripts save
them) under the release's variable names, from MiniLM's real weights and from random pre-training and classifier
heads, give transformers' outputs for the same weights."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from bertforge import BertForSequenceClassification, BertModel, BertTokenizer
from bertforge.cli.main import main
from bertforge.errors import CheckpointError
from bertforge.pretraining.heads import BertForPreTraining

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="writing reference checkpoints needs TensorFlow (the dev extra has it)")

# TensorFlow's Saver, in a process of its own (TensorFlow and torch each bring their own thread pools)
WRITER = """
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
names, arrays = json.load(open(sys.argv[1])), np.load(sys.argv[2])
variables = {name: tf.compat.v1.Variable(arrays[f"t{i}"], name=f"v{i}") for i, name in enumerate(names)}
with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    tf.compat.v1.train.Saver(variables).save(session, sys.argv[3], write_meta_graph=False)
"""

# transformers' names -> the release's (modeling.py, run_pretraining.py, run_classifier.py); kernels are (in, out)
LAYER_NAMES = {
    "attention.self.query": "attention/self/query", "attention.self.key": "attention/self/key",
    "attention.self.value": "attention/self/value", "attention.output.dense": "attention/output/dense",
    "attention.output.LayerNorm": "attention/output/LayerNorm", "intermediate.dense": "intermediate/dense",
    "output.dense": "output/dense", "output.LayerNorm": "output/LayerNorm",
}
FIXED_NAMES = {
    "bert.embeddings.word_embeddings.weight": "bert/embeddings/word_embeddings",
    "bert.embeddings.position_embeddings.weight": "bert/embeddings/position_embeddings",
    "bert.embeddings.token_type_embeddings.weight": "bert/embeddings/token_type_embeddings",
    "bert.embeddings.LayerNorm.weight": "bert/embeddings/LayerNorm/gamma",
    "bert.embeddings.LayerNorm.bias": "bert/embeddings/LayerNorm/beta",
    "bert.pooler.dense.weight": "bert/pooler/dense/kernel", "bert.pooler.dense.bias": "bert/pooler/dense/bias",
    "cls.predictions.transform.dense.weight": "cls/predictions/transform/dense/kernel",
    "cls.predictions.transform.dense.bias": "cls/predictions/transform/dense/bias",
    "cls.predictions.transform.LayerNorm.weight": "cls/predictions/transform/LayerNorm/gamma",
    "cls.predictions.transform.LayerNorm.bias": "cls/predictions/transform/LayerNorm/beta",
    "cls.predictions.bias": "cls/predictions/output_bias",
    "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
    "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
    "classifier.weight": "output_weights", "classifier.bias": "output_bias",
}


def release_name(name: str) -> tuple[str | None, bool]:
    """(the release's variable name, whether to store the matrix transposed) for a transformers tensor name."""
    if name in FIXED_NAMES:
        return FIXED_NAMES[name], FIXED_NAMES[name].endswith("/kernel")
    parts = name.split(".")
    if parts[:3] == ["bert", "encoder", "layer"]:
        module, kind = ".".join(parts[4:-1]), parts[-1]
        suffix = {"weight": "gamma", "bias": "beta"}[kind] if module.endswith("LayerNorm") else \
            {"weight": "kernel", "bias": "bias"}[kind]
        return f"bert/encoder/layer_{parts[3]}/{LAYER_NAMES[module]}/{suffix}", suffix == "kernel"
    return None, False  # cls.predictions.decoder.*: tied to the word embeddings, not stored


def write_release(model: torch.nn.Module, directory, tokenizer_dir, optimizer_state: bool = True):
    """`model`'s weights as the release lays out a model: TensorFlow checkpoint, bert_config.json, vocab.txt."""
    directory.mkdir(parents=True)
    names, arrays = [], {}
    for name, tensor in model.state_dict().items():
        bare = not name.startswith(("bert.", "cls.", "classifier."))  # a bare encoder's: the release's bert/ scope
        google, transpose = release_name("bert." + name if bare else name)
        if google is None:
            continue
        array = tensor.detach().numpy()
        names.append(google)
        arrays[f"t{len(names) - 1}"] = array.T.copy() if transpose else array
        if optimizer_state:  # run_pretraining.py saves Adam's moments beside each weight
            for slot in ("adam_m", "adam_v"):
                names.append(f"{google}/{slot}")
                arrays[f"t{len(names) - 1}"] = np.zeros_like(arrays[f"t{len(names) - 2}"])
    names.append("global_step")
    arrays[f"t{len(names) - 1}"] = np.array(1000, dtype=np.int64)
    (directory / "names.json").write_text(json.dumps(names))
    np.savez(directory / "arrays.npz", **arrays)
    subprocess.run([sys.executable, "-c", WRITER, str(directory / "names.json"), str(directory / "arrays.npz"),
                    str(directory / "bert_model.ckpt")], check=True, capture_output=True)
    (directory / "names.json").unlink()
    (directory / "arrays.npz").unlink()
    config = {key: value for key, value in model.config.to_dict().items() if key in (
        "attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size", "initializer_range",
        "intermediate_size", "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
        "type_vocab_size", "vocab_size")}
    (directory / "bert_config.json").write_text(json.dumps(config))
    shutil.copy(tokenizer_dir / "vocab.txt", directory / "vocab.txt")
    return directory


@pytest.fixture(scope="module")
def release_minilm(tmp_path_factory, minilm_dir):
    reference = transformers.BertModel.from_pretrained(minilm_dir).eval()
    return write_release(reference, tmp_path_factory.mktemp("release") / "minilm", minilm_dir), reference


def test_the_release_layout_loads_with_transformers_outputs(release_minilm, real_sentences):
    directory, reference = release_minilm
    assert not (directory / "config.json").exists() and (directory / "bert_model.ckpt.index").is_file()
    model, tokenizer = BertModel.from_pretrained(directory), BertTokenizer.from_pretrained(directory)
    batch = tokenizer(real_sentences[:8], padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        ours, theirs = model(**batch), reference(**batch)
    real = batch["attention_mask"].bool()
    assert (ours.last_hidden_state - theirs.last_hidden_state)[real].abs().max() < 1e-5
    assert (ours.pooler_output - theirs.pooler_output).abs().max() < 1e-5


def test_export_turns_the_release_into_transformers_layout(release_minilm, real_sentences, tmp_path):
    directory, reference = release_minilm
    assert main(["export", "hf", "--model", str(directory), "--output", str(tmp_path / "hf")]) == 0
    converted = transformers.BertModel.from_pretrained(tmp_path / "hf").eval()
    batch = BertTokenizer.from_pretrained(tmp_path / "hf")(real_sentences[:4], padding=True, return_tensors="pt")
    with torch.inference_mode():
        difference = converted(**batch).last_hidden_state - reference(**batch).last_hidden_state
    assert difference[batch["attention_mask"].bool()].abs().max() < 1e-5


def test_pre_training_and_classifier_heads(tmp_path, minilm_dir, tiny_config, random_batch):
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(**{key: value for key, value in tiny_config.to_dict().items()
                                           if key not in ("id2label", "label2id")})
    pretraining = transformers.BertForPreTraining(hf_config).eval()
    with torch.no_grad():
        pretraining.cls.predictions.bias.normal_()  # the output bias starts at zero: make the comparison bite
    ours = BertForPreTraining.from_pretrained(write_release(pretraining, tmp_path / "pretraining", minilm_dir),
                                              require_heads=True)
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=3, seq_len=10)
    with torch.inference_mode():
        mine = ours(input_ids, attention_mask, token_type_ids)
        theirs = pretraining(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    real = attention_mask.bool()
    assert (mine.prediction_logits - theirs.prediction_logits)[real].abs().max() < 1e-5
    assert (mine.seq_relationship_logits - theirs.seq_relationship_logits).abs().max() < 1e-5

    hf_config.num_labels = 3
    classifier = transformers.BertForSequenceClassification(hf_config).eval()
    directory = write_release(classifier, tmp_path / "classifier", minilm_dir, optimizer_state=False)
    ours = BertForSequenceClassification.from_pretrained(directory, num_labels=3, require_heads=True)
    with torch.inference_mode():
        difference = ours(input_ids, attention_mask, token_type_ids).logits - \
            classifier(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
    assert difference.abs().max() < 1e-5


def test_damaged_and_foreign_checkpoints_are_one_line_errors(release_minilm, tmp_path):
    directory, _ = release_minilm
    damaged = shutil.copytree(directory, tmp_path / "damaged")
    index = damaged / "bert_model.ckpt.index"
    index.write_bytes(index.read_bytes()[:-20])
    with pytest.raises(CheckpointError, match="bert_model.ckpt.index: not a TensorFlow checkpoint index"):
        BertModel.from_pretrained(damaged)
    truncated = shutil.copytree(directory, tmp_path / "truncated")
    data = next(truncated.glob("*.data-*"))
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="past the end of its data file"):
        BertModel.from_pretrained(truncated)
    # An entry's fields not as they should be (a name that isn't UTF-8) was a UnicodeDecodeError's traceback
    garbled = shutil.copytree(directory, tmp_path / "garbled")
    index = garbled / "bert_model.ckpt.index"
    raw = index.read_bytes()
    assert raw.count(b"word_embeddings") == 1
    index.write_bytes(raw.replace(b"word_embeddings", b"word_embeddin\xff\xfe"))
    with pytest.raises(CheckpointError, match="bert_model.ckpt.index: unreadable TensorFlow checkpoint entry: 'utf-8'"):
        BertModel.from_pretrained(garbled)
