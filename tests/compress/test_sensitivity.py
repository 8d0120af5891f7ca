"""Ranking the linear layers by how much int8 alone changes the model's output (`float_layers`): resumed after the
layers an int8 layer cannot reach, as whole passes would rank them."""

import dataclasses

import torch

from bertforge import BertForSequenceClassification
from bertforge.compress import QuantizedLinear
from bertforge.compress.calibration import calibrate
from bertforge.compress.int8_linear import replace_module
from bertforge.compress.sensitivity import int8_sensitivity


def test_ranking_resumed_after_the_layers_an_int8_layer_cannot_reach_gives_what_whole_passes_give(tiny_config):
    """int8_sensitivity starts each pass where the int8 layer first acts (the encoder layers before it give back
    their recorded float32 output): the ranking is exactly that of whole forward passes, computed here directly,
    for layers early, late, in the pooler and after it; and each layer computes again afterwards."""
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, num_hidden_layers=3)
    config.num_labels = 3
    model = BertForSequenceClassification(config).eval()
    inputs = [{"input_ids": torch.randint(5, 99, (4, 12)), "attention_mask": torch.ones(4, 12, dtype=torch.long)}
              for _ in range(2)]
    inputs[1]["attention_mask"][1:, 7:] = 0
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    ranges = calibrate(model, inputs, linears)

    def int8_layer(name):
        return QuantizedLinear.from_linear(linears[name], *ranges[name], 4)

    ranked = int8_sensitivity(model, inputs, linears, int8_layer)
    with torch.inference_mode():
        expected = [model(**batch).logits for batch in inputs]
        for name, linear in linears.items():
            replace_module(model, name, int8_layer(name))
            got = [model(**batch).logits for batch in inputs]
            replace_module(model, name, linear)
            error = sum(float((g - e).square().sum()) for g, e in zip(got, expected))
            assert ranked[name] == error / sum(float(e.square().sum()) for e in expected), name
    assert set(ranked) == set(linears) and {"classifier", "bert.pooler.dense"} <= set(ranked)
    assert all(ranked[name] > 0 for name in linears)
    assert all("forward" not in vars(layer) for layer in model.bert.encoder.layers)
    with torch.inference_mode():
        assert torch.equal(model(**inputs[1]).logits, expected[1])
