"""Small batches without Python between operators: an int8 encoder's forward recorded once as a graph
(torch.jit.trace) and replayed for batches of a few sentences.

For one sentence an eager int8 forward spends more time in Python and operator dispatch (~350 operator calls, ~100
module calls) than in its int8 products, which are no slower than ONNX Runtime's (MiniLM's shapes, 24 rows, a
2-core AVX2 EPYC: 170-230 us a call against 185-208): replayed, one SST-2 sentence takes 0.55-0.6 of its eager time,
level with ONNX Runtime's int8 where eagerly it took twice as long (bench/README.md). The graph computes every
position, padding included, where the eager forward packs the real tokens, so from a few hundred positions the
eager forward is the faster one (`REPLAY_MAX_WORK`).

`replay_small_batches(model)` gives each BertModel in `model` this forward (an attribute of the instance, as
`run_int8_eagerly` sets its layers'); the class, the parameters and the state dict are unchanged. A batch is
replayed only where the recorded graph gives what the eager forward would: in eval mode without gradients, on the
CPU, from input ids (no positions, embeddings, hooks, hidden states or attention weights asked for), each row's
first position real (right padding); everything else runs eagerly. Replayed outputs hold zeros at padding
positions, as eager ones do. A graph is recorded on first use (~0.5 s) for each way the model is called (all
positions, or the first alone) and range of lengths the forward branches on (`lengths_of`), and again after the
model's layers are replaced or load new tensors.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from bertforge import attention_kernels
from bertforge.activations import float32_lanes
from bertforge.attention_kernels import EXPLICIT_ATTENTION_MAX_SEQ, recording_graph
from bertforge.compress.int8_linear import has_forward_hooks, recorded_weights
from bertforge.model import BertModel, EncoderOutput, broadcast_row, check_decoder_options
from bertforge.model_output import returned
from bertforge.runtime import warnings_silenced

# The most work a batch may hold to be replayed: its real tokens, and each padding position three times (the graph
# computes them for nothing; the eager forward computes real tokens alone). Replayed time over eager on MiniLM int8
# (a 2-core AVX2 EPYC, SST-2 dev sentences): one sentence 0.55-0.65; batches sorted by length as `predict` makes
# them, of 4: 0.68, 8 (203 tokens + 7 padding): 0.75, 16 (399 + 10): 0.83-0.88, 32 (798 + 43): 1.06, 64: 1.14;
# shuffled, with more padding, 4 (101 + 48): 0.87, 8 (203 + 131): 0.99, 16 (406 + 305): 1.25.
REPLAY_MAX_WORK = 512
# The attributes in which int8 layers keep their prepacked weights (compress/int8_linear.py's QuantizedLinear)
PREPACKED = ("packed", "small_packed")


class Recording(nn.Module):
    """What is recorded: the eager forward on (input_ids, attention_mask, token_type_ids) -> its two outputs."""

    def __init__(self, model: BertModel, first_token_only: bool, weights: list[Any]):
        super().__init__()
        self.model, self.first_token_only = model, first_token_only
        # Prepacked int8 weights are opaque to the recorder unless the recorded module holds them: kept here, the
        # graph reads them from its own attributes.
        for index, weight in enumerate(weights):
            setattr(self, f"weight_{index}", weight)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
        output = BertModel.forward(self.model, input_ids, attention_mask, token_type_ids,
                                   first_token_only=self.first_token_only, return_dict=True)
        if output.pooler_output is None:
            return (output.last_hidden_state,)
        return output.last_hidden_state, output.pooler_output


class Replays:
    """A BertModel's recorded graphs (by `first_token_only` and the side of the attention's length branch) and the
    state of the model they were recorded from.
    Kept in the instance's __dict__, not as a submodule: no state dict keys; copies start empty."""

    def __init__(self):
        self.graphs: dict[tuple[bool, bool], torch.jit.ScriptModule] = {}
        self.recorded_from: tuple = ()
        self.lock = threading.Lock()  # a server's threads may ask for the same graph at once

    def graph(self, model: BertModel, first_token_only: bool, lengths: int) -> torch.jit.ScriptModule:
        with self.lock:
            if model_state(model) != self.recorded_from:
                self.graphs = {}
            if (first_token_only, lengths) not in self.graphs:
                self.graphs[first_token_only, lengths] = record(model, first_token_only, lengths)
                self.recorded_from = model_state(model)  # recording made the prepacked weights it reads
            return self.graphs[first_token_only, lengths]

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __deepcopy__(self, memo) -> Replays:
        return Replays()


def recording_sample(length: int) -> dict[str, torch.Tensor]:
    """The batch a graph is recorded on: two rows of `length` positions, one padded. The recorder fixes every size
    that is 1 (a batch of one sentence) as it broadcasts, so no size of this batch is."""
    attention_mask = torch.ones(2, length, dtype=torch.long)
    attention_mask[1, length - 2:] = 0
    return {"input_ids": torch.zeros(2, length, dtype=torch.long), "attention_mask": attention_mask,
            "token_type_ids": torch.zeros(2, length, dtype=torch.long)}


SHORTER_THAN_A_VECTOR, EXPLICIT, SDPA = range(3)  # the lengths one graph serves (see `lengths_of`)


def lengths_of(length: int) -> int:
    """Which graph serves sequences of `length` positions. The eager forward branches on the length twice (the
    explicit attention up to EXPLICIT_ATTENTION_MAX_SEQ, attention_kernels.py; softmax over rows shorter than a vector,
    activations.py), and a graph keeps the side its recording took: one graph for each side of each."""
    if length > EXPLICIT_ATTENTION_MAX_SEQ:
        return SDPA
    return SHORTER_THAN_A_VECTOR if length < float32_lanes() else EXPLICIT


def record(model: BertModel, first_token_only: bool, lengths: int) -> torch.jit.ScriptModule:
    """The graph of `model`'s forward on (input_ids, attention_mask, token_type_ids), for the sequences `lengths`
    names (see `lengths_of`), recorded on a sample of such a length."""
    length = {SHORTER_THAN_A_VECTOR: max(3, float32_lanes() // 2), EXPLICIT: float32_lanes() + 8,
              SDPA: EXPLICIT_ATTENTION_MAX_SEQ + 8}[lengths]
    sample = recording_sample(min(length, model.config.max_position_embeddings))
    with torch.inference_mode(False), torch.no_grad():
        BertModel.forward(model, **sample, first_token_only=first_token_only)  # makes what is made on first use
        recording = Recording(model, first_token_only, recorded_weights(model))
        with warnings_silenced(), recording_for_replay():  # the tracer's notes on Python numbers it records
            return torch.jit.trace(recording, tuple(sample.values()), check_trace=False)


@contextmanager
def recording_for_replay() -> Iterator[None]:
    """Within: the model takes its branches on the sequence length as it does eagerly (see attention_kernels.py),
    and its int8 products run on the kernel a graph can record (compress/int8_linear.py)."""
    attention_kernels.replay_recording.active = True
    try:
        yield
    finally:
        attention_kernels.replay_recording.active = False


def model_state(model: BertModel) -> tuple:
    """What a graph depends on: the model's tensors, which it shares, and the prepacked int8 weights, which it
    holds (a layer that loads new tensors drops its own, to make them again). The graphs keep all of these alive,
    so no newer object can take the identity of one of them while they last."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    prepacked = (vars(module).get(name) for module in model.modules() for name in PREPACKED)
    return tuple(map(id, itertools.chain(tensors, prepacked)))


def replayable(model: BertModel, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
               output_hidden_states, output_attentions) -> bool:
    """Whether the recorded graph gives this call's outputs (see the module docstring)."""
    if (model.training or torch.is_grad_enabled() or recording_graph()
            or inputs_embeds is not None or position_ids is not None or not isinstance(input_ids, torch.Tensor)):
        return False
    hidden_states = model.config.output_hidden_states if output_hidden_states is None else output_hidden_states
    attentions = model.config.output_attentions if output_attentions is None else output_attentions
    if hidden_states or attentions:
        return False
    if input_ids.dim() != 2 or input_ids.device.type != "cpu" or not 0 < input_ids.numel() <= REPLAY_MAX_WORK:
        return False
    for given in (attention_mask, token_type_ids):
        if given is not None and (not isinstance(given, torch.Tensor) or given.device.type != "cpu"):
            return False
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape or not bool(attention_mask[:, 0].all()):
            return False  # left padding: the eager forward computes every position then, as transformers does
        padding = input_ids.numel() - int(attention_mask.count_nonzero())
        if input_ids.numel() + 2 * padding > REPLAY_MAX_WORK:
            return False
    return not any(map(has_forward_hooks, model.modules()))  # hooks see what a replayed graph has none of


def forward(self: BertModel, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
            inputs_embeds=None, output_hidden_states=None, output_attentions=None, first_token_only=False,
            return_dict=None, **decoder_options):
    """BertModel.forward, replaying a recorded graph for small batches (see the module docstring)."""
    check_decoder_options(decoder_options)
    token_type_ids = broadcast_row(token_type_ids, input_ids)
    if not replayable(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                      output_hidden_states, output_attentions):
        return BertModel.forward(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_hidden_states, output_attentions, first_token_only, return_dict)
    self.check_inputs(input_ids, attention_mask, token_type_ids, None)  # the eager forward's one-line errors
    inputs = {"input_ids": input_ids,
              "attention_mask": torch.ones_like(input_ids) if attention_mask is None else attention_mask,
              "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids}
    graph = vars(self)["replays"].graph(self, bool(first_token_only), lengths_of(input_ids.shape[1]))
    last_hidden_state, *pooled = graph(*inputs.values())
    if not first_token_only and attention_mask is not None:
        last_hidden_state = last_hidden_state.masked_fill(~attention_mask.bool()[..., None], 0.0)
    return returned(EncoderOutput(last_hidden_state=last_hidden_state, pooler_output=pooled[0] if pooled else None),
                    return_dict)


def replay_small_batches(model: nn.Module) -> nn.Module:
    """Each BertModel in `model` (changed in place, and returned) replays small batches from a recorded graph."""
    for module in model.modules():
        if isinstance(module, BertModel):
            vars(module)["replays"] = Replays()
            # a partial, not a bound method: a copy or an unpickled model gets its own (a bound method unpickles
            # as getattr(model, "forward") of a model not yet filled in: the class's forward)
            module.forward = functools.partial(forward, module)
    return model
