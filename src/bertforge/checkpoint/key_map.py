"""The one table between our parameter names and the Hugging Face BERT names; both directions derive from it.

Entries name modules; the parameter suffix (.weight, .bias) carries over unchanged. `{layer}` stands for a
layer index. Task models hold the encoder as `bert`, exactly as Hugging Face does, so that prefix passes through.
"""

from __future__ import annotations

import re

MODULE_NAMES = {
    "embeddings.tokens": "embeddings.word_embeddings",
    "embeddings.positions": "embeddings.position_embeddings",
    "embeddings.segments": "embeddings.token_type_embeddings",
    "embeddings.norm": "embeddings.LayerNorm",
    "encoder.layers.{layer}.attention.query": "encoder.layer.{layer}.attention.self.query",
    "encoder.layers.{layer}.attention.key": "encoder.layer.{layer}.attention.self.key",
    "encoder.layers.{layer}.attention.value": "encoder.layer.{layer}.attention.self.value",
    "encoder.layers.{layer}.attention.output": "encoder.layer.{layer}.attention.output.dense",
    "encoder.layers.{layer}.attention_norm": "encoder.layer.{layer}.attention.output.LayerNorm",
    "encoder.layers.{layer}.feed_forward.up": "encoder.layer.{layer}.intermediate.dense",
    "encoder.layers.{layer}.feed_forward.down": "encoder.layer.{layer}.output.dense",
    "encoder.layers.{layer}.output_norm": "encoder.layer.{layer}.output.LayerNorm",
    "pooler.dense": "pooler.dense",
    # Pre-training heads (BertForPreTraining, BertForMaskedLM). The masked-LM decoder is the word-embedding
    # matrix, which checkpoints store once, under the embeddings; only an untied one has a module of its own.
    "masked_lm.dense": "cls.predictions.transform.dense",
    "masked_lm.decoder": "cls.predictions.decoder",
    "masked_lm.norm": "cls.predictions.transform.LayerNorm",
    "masked_lm": "cls.predictions",  # its output bias: masked_lm.bias <-> cls.predictions.bias
    "next_sentence": "cls.seq_relationship",
}

# Copies of tied tensors that some checkpoints carry (older transformers and TF conversions): name -> the tensor
# it duplicates. Loading uses the original and checks that the copy agrees.
TIED_HF_KEYS = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}

# Buffers some checkpoints carry that are not parameters of the model (recomputed, never learned).
IGNORED_HF_KEYS = re.compile(r"(^|\.)embeddings\.position_ids$")

# Old conversions of the original TensorFlow checkpoints name LayerNorm parameters gamma and beta.
LEGACY_SUFFIXES = {"gamma": "weight", "beta": "bias"}

ENCODER_PREFIX = "bert."


def _compile(table: dict[str, str]) -> list[tuple[re.Pattern, str]]:
    rules = []
    for source, target in table.items():
        pattern = re.escape(source).replace(re.escape("{layer}"), r"(?P<layer>\d+)")
        rules.append((re.compile(rf"^(?P<prefix>(?:\w+\.)*?){pattern}\.(?P<param>\w+)$"), target))
    return rules


_TO_HF = _compile(MODULE_NAMES)
_FROM_HF = _compile({hf: ours for ours, hf in MODULE_NAMES.items()})


def _translate(name: str, rules: list[tuple[re.Pattern, str]]) -> str:
    for pattern, target in rules:
        match = pattern.match(name)
        if match:
            module = target.replace("{layer}", match["layer"]) if "{layer}" in target else target
            return f"{match['prefix']}{module}.{match['param']}"
    return name  # heads without an entry keep their name (e.g. "classifier.weight")


def to_hf(name: str) -> str:
    """'encoder.layers.3.attention_norm.weight' -> 'encoder.layer.3.attention.output.LayerNorm.weight'."""
    return _translate(name, _TO_HF)


def from_hf(name: str) -> str:
    """The inverse of `to_hf`; also accepts legacy gamma/beta LayerNorm names."""
    module, _, param = name.rpartition(".")
    if module.endswith("LayerNorm") and param in LEGACY_SUFFIXES:
        name = f"{module}.{LEGACY_SUFFIXES[param]}"
    return _translate(name, _FROM_HF)
