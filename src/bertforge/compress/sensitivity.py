"""Which linear layers int8 hurts most: each made int8 alone, the rest float32, on the calibration sample.

`bertforge quantize --float-layers N` keeps the N layers that change the model's output most in float32 (Intel
Neural Compressor's op-wise fallback, ranked without labels, so the user's dev set is not spent choosing them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from bertforge.compress.int8_linear import replace_module
from bertforge.model import BertModel, EncoderLayer, reads_packed_tokens
from bertforge.model_output import ModelOutput

# How many calibration examples rank the layers for `float_layers` (a model's pass for each linear layer): the
# ranking needs fewer than the input ranges do.
SENSITIVITY_EXAMPLES = 64


def leading_batches(batches: list[dict[str, torch.Tensor]], examples: int) -> list[dict[str, torch.Tensor]]:
    """The first of `batches` holding at least `examples` examples between them (all, if they hold fewer)."""
    taken, count = [], 0
    for batch in batches:
        if count >= examples:
            break
        taken.append(batch)
        count += len(batch["input_ids"])
    return taken


@torch.inference_mode()
def int8_sensitivity(model: nn.Module, batches: list[dict[str, torch.Tensor]], linears: dict[str, nn.Linear],
                     int8_layer: Callable[[str], nn.Module]) -> dict[str, float]:
    """How much each of `linears`, made int8 by `int8_layer` while the rest stay float32, changes the model's
    output on `batches`: name -> squared error over the float32 output's squared norm. It needs no labels, so the
    user's dev set is not spent choosing which layers stay float32.

    Each pass starts where the int8 layer first acts: the encoder layers before it give back what they gave in
    float32 (recorded once) instead of computing it again, so a model with L encoder layers costs about (L + 1) / 2
    of them per linear layer rather than L."""
    layers = [module for module in model.modules() if isinstance(module, EncoderLayer)]
    expected, recorded = [], []  # per batch: the float32 output, and each encoder layer's outputs in call order
    for batch in batches:
        with recording_outputs(layers) as outputs:
            expected.append(model_outputs(model, batch))
        recorded.append(outputs)
    changes = {}
    for name, linear in linears.items():
        upstream = layers_before(model, name, layers)
        replace_module(model, name, int8_layer(name))
        try:
            error = norm = 0.0
            for batch, wanted, outputs in zip(batches, expected, recorded):
                with replaying_outputs(upstream, outputs):
                    got = model_outputs(model, batch)
                for value, want in zip(got, wanted):
                    error += float((value - want).square().sum())
                    norm += float(want.square().sum())
        finally:
            replace_module(model, name, linear)
        changes[name] = error / max(norm, 1e-30)
    return changes


def layers_before(model: nn.Module, name: str, layers: list[nn.Module]) -> list[nn.Module]:
    """The encoder layers whose output cannot depend on the module `name`: those before its own layer in the same
    encoder, or all of its encoder's for one after them (the pooler); for a module outside every encoder (a task
    head), `layers`: all of the model's."""
    path = name.split(".")
    for depth in range(len(path) - 1, 0, -1):
        parent = model.get_submodule(".".join(path[:depth]))
        if isinstance(parent, EncoderLayer):  # the layer list holding it, at its index
            return list(model.get_submodule(".".join(path[:depth - 1])))[:int(path[depth - 1])]
        if isinstance(parent, BertModel):
            return list(parent.encoder.layers)
    return layers


@contextmanager
def recording_outputs(layers: list[nn.Module]) -> Iterator[dict[nn.Module, list[Any]]]:
    """What each of `layers` returns while the block runs, in call order: layer -> [output, ...]."""
    outputs: dict[nn.Module, list[Any]] = {layer: [] for layer in layers}
    handles = [layer.register_forward_hook(reads_packed_tokens(
                   lambda module, inputs, output: outputs[module].append(output))) for layer in layers]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replaying_outputs(layers: list[nn.Module], outputs: dict[nn.Module, list[Any]]) -> Iterator[None]:
    """Each of `layers` gives back, call by call, what `recording_outputs` recorded of it, computing nothing."""
    own = {layer: vars(layer).get("forward") for layer in layers}  # an instance's own forward, if it had one
    for layer in layers:
        replay = iter(outputs[layer])
        layer.forward = lambda *args, replay=replay, **kwargs: next(replay)
    try:
        yield
    finally:
        for layer, forward in own.items():
            if forward is None:
                del layer.forward  # the class's forward again
            else:
                layer.forward = forward


def model_outputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The floating-point tensors of `model`'s output on `batch` (logits, hidden states, ...). Padding positions
    need no masking: the packed forward leaves them 0 in every output, int8 or not."""
    output = model(**batch)
    values = output.to_tuple() if isinstance(output, ModelOutput) else output
    values = values if isinstance(values, tuple) else (values,)
    return [value for value in values if isinstance(value, torch.Tensor) and value.is_floating_point()]


