"""The BERT encoder (Devlin et al., 2018): embeddings, post-LN Transformer layers, pooler.

Shapes: batch, seq (positions per sequence), hidden, heads, head_dim = hidden // heads,
tokens = the real (non-padding) positions of a batch, which is what the layers run on (packing.py removes the
padding after the embeddings and puts it back after the last layer; attention sees each sequence whole).
"""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge import attention_kernels
from bertforge.activations import Activation, softmax
from bertforge.attention_kernels import recording_graph
from bertforge.checkpoint.pretrained import Pretrained
from bertforge.config import BertConfig, bert_config
from bertforge.errors import BertforgeError
from bertforge.model_output import ModelOutput, returned
from bertforge.packing import PackedBatch, documents_by_position, is_pairwise, pack_batch, pairwise_batch


@dataclass
class EncoderOutput(ModelOutput):
    last_hidden_state: torch.Tensor  # (batch, seq, hidden); zeros at padding positions, except where every position
    # is computed (see BertModel.forward); (batch, 1, hidden) for first_token_only
    pooler_output: torch.Tensor | None  # (batch, hidden); None for a model built without the pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings output + one per layer
    attentions: tuple[torch.Tensor, ...] | None = None  # one (batch, heads, seq, seq) per layer


class Embeddings(nn.Module):
    """Token + learned position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, hidden_size: int, max_positions: int, num_segments: int,
                 pad_token_id: int, dropout: float, layer_norm_eps: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.positions = nn.Embedding(max_positions, hidden_size)
        self.segments = nn.Embedding(num_segments, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        """(batch, seq) ids each -> (batch, seq, hidden); segments default to 0, positions to 0, 1, 2, ...
        `inputs_embeds` (batch, seq, hidden): the token vectors given instead of looked up from input_ids."""
        words = self.tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if token_type_ids is None:
            token_type_ids = torch.zeros(words.shape[:2], dtype=torch.long, device=words.device)
        if position_ids is None:
            position_ids = torch.arange(words.shape[1], device=words.device).expand(words.shape[:2])
        x = words + self.segments(token_type_ids) + self.positions(position_ids)
        return self.dropout(self.norm(x))

    # transformers' names for the same modules, for code that reaches for them (Captum's recipes attribute to
    # `bert.embeddings.word_embeddings`)
    word_embeddings = property(lambda self: self.tokens)
    position_embeddings = property(lambda self: self.positions)
    token_type_embeddings = property(lambda self: self.segments)
    LayerNorm = property(lambda self: self.norm)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention over the real tokens of each sequence."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)  # on the attention probabilities

    def forward(self, x: torch.Tensor, batch: PackedBatch, need_weights: bool = False, first_token_only: bool = False):
        """(tokens, hidden) -> (tokens, hidden), and the attention probabilities if `need_weights` (which needs a
        batch packed with `keep_positions`: one block, the batch's own positions). `first_token_only`: only each
        sequence's first token asks (its keys and values are still every token's) -> (sequences, hidden)."""
        attend = partial(self.attend, need_weights=need_weights)
        q, k, v = self.project(x, batch.first_tokens(x) if first_token_only else None)
        context, probs = batch.attend_in_blocks(attend, q, k, v, first_token_queries=first_token_only)
        return self.output(context), probs

    def project(self, x: torch.Tensor, query_input: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, hidden) -> the queries, keys and values, (tokens, hidden) each; the queries of `query_input`'s
        rows alone where given (the last layer's first tokens, when no other query is read). (An int8 model computes
        them in fewer products: compress/int8_linear.py's FusedProjections takes this method's place.)"""
        return self.query(x if query_input is None else query_input), self.key(x), self.value(x)

    def attend(self, q, k, v, bias: torch.Tensor | None, need_weights: bool):
        """softmax(q k^T / sqrt(head_dim) + bias) v per head, on one padded block: (batch, seq, hidden) each ->
        (batch, seq, hidden), and the probabilities (batch, heads, seq, seq) if `need_weights`."""
        q, k, v = (self.split_heads(t) for t in (q, k, v))  # (batch, heads, seq, head_dim) each
        dropout_p = self.dropout.p if self.training else 0.0
        if attention_kernels.explicit_attention(q, dropout_p, need_weights):
            # Each head's rows laid out side by side let the products read them in place (matmul would copy them,
            # the keys transposed: a slower copy).
            q, k, v = (t.contiguous() for t in (q, k, v))
            scores = q @ k.transpose(-1, -2)  # (batch, heads, seq, seq)
            scale = 1 / math.sqrt(self.head_dim)
            scores = scores.mul_(scale) if bias is None else torch.add(bias, scores, alpha=scale)  # one pass
            probs = softmax(scores)
            context = self.dropout(probs) @ v
        else:  # the same, fused (attention_kernels.py says which kernel runs)
            with attention_kernels.fused_kernels(q):
                context, probs = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p), None
        return self.merge_heads(context), probs if need_weights else None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, seq, _ = x.shape
        return x.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)  # (batch, seq, hidden)


class FeedForward(nn.Module):
    """Position-wise up-projection, activation, down-projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "gelu"):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.activation = Activation(activation)
        self.down = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x):
        return self.down(self.activation(self.up(x)))


class EncoderLayer(nn.Module):
    """x -> LN(x + Attention(x)) -> LN(x + FeedForward(x)), as in the original BERT (post-LN)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, activation: str,
                 dropout: float, attention_dropout: float, layer_norm_eps: float):
        super().__init__()
        self.attention = SelfAttention(hidden_size, num_heads, attention_dropout)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.feed_forward = FeedForward(hidden_size, intermediate_size, activation)
        self.output_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, batch: PackedBatch, need_weights: bool = False, first_token_only: bool = False):
        """(tokens, hidden) -> (tokens, hidden); (sequences, hidden), each sequence's first token, if
        `first_token_only`: every token is still attended to, but no other position is computed."""
        attended, probs = self.attention(x, batch, need_weights, first_token_only)
        if first_token_only:
            x = batch.first_tokens(x)
        x = self.attention_norm(x + self.dropout(attended))
        x = self.output_norm(x + self.dropout(self.feed_forward(x)))
        return x, probs


class Encoder(nn.Module):
    """A stack of encoder layers; optionally keeps every layer's output and attention weights."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                         config.hidden_act, config.hidden_dropout_prob, config.attention_probs_dropout_prob,
                         config.layer_norm_eps)
            for _ in range(config.num_hidden_layers))
        # Memory for compute in training: each layer's activations recomputed in the backward pass instead of kept
        # (set by gradient_checkpointing_enable): every `checkpoint_every`-th layer from the first, the others keeping
        # theirs; with `offload_checkpoints`, what recomputation starts from waits in host memory (an accelerator's).
        self.gradient_checkpointing = False
        self.checkpoint_every = 1
        self.offload_checkpoints = False
        # The running batch's PackedBatch, for hooks on any module inside (README: hooks): layout.unpack(tokens)
        # is (batch, seq, ...). Set for each forward (not while torch.compile or export traces it).
        self.layout: PackedBatch | None = None

    def forward(self, x: torch.Tensor, batch: PackedBatch, output_hidden_states: bool, output_attentions: bool,
                first_token_only: bool = False):
        """`first_token_only`: the last layer computes each sequence's first token alone (see BertModel)."""
        hidden_states = [] if output_hidden_states else None
        attentions = [] if output_attentions else None
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            if output_hidden_states:  # the layer reads the (batch, seq) state it is given, so gradients reach it
                hidden_states.append(batch.unpack(x))
                x = batch.pack(hidden_states[-1])
            last = first_token_only and i == len(self.layers) - 1
            if recompute and i % self.checkpoint_every == 0:
                with offloaded(x.device, self.offload_checkpoints):
                    x, probs = checkpoint(layer, x, batch, output_attentions, last, use_reentrant=False)
            else:
                x, probs = layer(x, batch, need_weights=output_attentions, first_token_only=last)
            if output_attentions:
                attentions.append(probs)
        if output_hidden_states:
            hidden_states.append(batch.unpack(x))
        return x, hidden_states, attentions


# Forward hooks inside the encoder see its tokens packed, (tokens, hidden), where transformers' see (batch, seq,
# hidden): code written for those would read or patch the wrong numbers without an error, so a model says so, once.
# Hooks that read packed tokens on purpose (bertforge's own: the attention viewer's, calibration's, distillation's)
# are marked by `reads_packed_tokens`. Pre-hooks (pruning's, parametrizations') are left alone.
def reads_packed_tokens(hook):
    """Mark a forward hook as one that knows the encoder's layout (no warning)."""
    hook.reads_packed_tokens = True
    return hook


def hooked_module(encoder: nn.Module) -> str | None:
    """The name of the first module inside `encoder` with an unmarked forward hook, or None. The modules are listed
    once (a walk of the tree costs ~50 us a forward, the list ~3 us): a module put in later (an adapter's) goes
    unseen."""
    modules = encoder.__dict__.get("modules_for_hooks")
    if modules is None:
        modules = encoder.__dict__["modules_for_hooks"] = list(encoder.named_modules())
    return next((name for name, module in modules if module._forward_hooks and not all(
        getattr(hook, "reads_packed_tokens", False) for hook in module._forward_hooks.values())), None)


def warn_of_packed_hooks(name: str) -> None:
    warnings.warn(f"a forward hook on encoder.{name} sees the encoder's real tokens packed: (tokens, hidden), padding "
                  "removed and sequences grouped by length, not transformers' (batch, seq, hidden). In the hook, "
                  "the encoder's layout (model.encoder.layout; a task model's model.bert.encoder.layout) unpacks "
                  "it: layout.unpack(x) is (batch, seq, ...) and layout.pack(h) packs it back (a hook on "
                  "encoder.layers[i] also gets the layout as inputs[1]); output_hidden_states=True gives every "
                  "layer's (batch, seq, hidden) (README: hooks)", stacklevel=3)


def offloaded(device: torch.device, offload: bool):
    """Where the tensors a checkpointed layer saves wait: host memory (pinned) for an accelerator's, if asked."""
    if not offload or device.type == "cpu":
        return nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=True, device_type=device.type)


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence representation the NSP and classification heads read."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, last_hidden_state):
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


# The index types an embedding lookup takes.
ID_DTYPES = (torch.long, torch.int)


def check_input_types(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds) -> None:
    """Every given input a torch tensor, the ids of a type the embeddings look up and the token vectors floating
    point: a one-line error rather than torch's from deep inside the lookup."""
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
              "position_ids": position_ids, "inputs_embeds": inputs_embeds}
    for name, value in inputs.items():
        if value is not None and not isinstance(value, torch.Tensor):
            kind = "a numpy array" if type(value).__module__ == "numpy" else f"a {type(value).__name__}"
            raise BertforgeError(f"{name} must be a torch tensor, got {kind} (the tokenizer gives tensors with "
                                 f"return_tensors='pt')")
    for name in ("input_ids", "token_type_ids", "position_ids"):
        if inputs[name] is not None and inputs[name].dtype not in ID_DTYPES:
            raise BertforgeError(f"{name} must hold integer ids (torch.long or torch.int32), got {inputs[name].dtype}")
    if inputs_embeds is not None and not inputs_embeds.is_floating_point():
        raise BertforgeError(f"inputs_embeds must be floating point, got {inputs_embeds.dtype}")


def check_input_shapes(axes: tuple[str, ...], hidden: int, input_ids, attention_mask, token_type_ids, position_ids,
                       inputs_embeds) -> None:
    """input_ids or inputs_embeds (one of the two) tensors shaped (*axes) or (*axes, hidden), none of them empty,
    and the other inputs shaped as they are: a one-line error naming what is wrong otherwise."""
    if (input_ids is None) == (inputs_embeds is None):
        raise BertforgeError("give input_ids or inputs_embeds, one of the two")
    check_input_types(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
    layout = ", ".join(axes)
    if input_ids is not None and input_ids.dim() != len(axes):
        raise BertforgeError(f"input_ids must be ({layout}), got shape {tuple(input_ids.shape)}")
    if inputs_embeds is not None and (inputs_embeds.dim() != len(axes) + 1 or inputs_embeds.shape[-1] != hidden):
        raise BertforgeError(f"inputs_embeds must be ({layout}, {hidden}), got shape {tuple(inputs_embeds.shape)}")
    name, given = ("input_ids", input_ids) if inputs_embeds is None else ("inputs_embeds", inputs_embeds)
    shape = tuple(given.shape[:len(axes)])
    if 0 in shape:  # nothing to encode, and nothing a pooler or [CLS] head could read
        raise BertforgeError(f"{name} is empty, shape {tuple(given.shape)}: give at least one sequence of at least "
                             f"one token")
    for other, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                          ("position_ids", position_ids)):
        if tensor is not None and tuple(tensor.shape) != shape:
            raise BertforgeError(f"{other} has shape {tuple(tensor.shape)}, {name} has {shape}")


# transformers' BertModel.forward arguments for BERT as a decoder (cross-attention, a cache of keys and values) and
# the head mask of transformers 4: code written for any model passes them to an encoder as None (use_cache as
# anything: an encoder keeps no cache), which asks for nothing; a value is refused by name.
DECODER_OPTIONS = ("use_cache", "encoder_hidden_states", "encoder_attention_mask", "past_key_values", "cache",
                   "cache_position", "head_mask")


def check_decoder_options(options: dict[str, object]) -> None:
    for name, value in options.items():
        if name not in DECODER_OPTIONS:
            raise TypeError(f"forward() got an unexpected keyword argument {name!r}")
        if value is not None and name != "use_cache":
            raise BertforgeError(f"{name}: bertforge's BERT is an encoder, without cross-attention, a cache or a "
                                 f"head mask")


def broadcast_row(ids: torch.Tensor | None, given: torch.Tensor | None) -> torch.Tensor | None:
    """`ids` given for one row, (seq,) or (1, seq), expanded to the batch of `given` (input ids or embeddings)."""
    if not isinstance(ids, torch.Tensor) or not isinstance(given, torch.Tensor) or given.dim() < 2 or \
            ids.shape[-1:] != given.shape[1:2]:
        return ids  # nothing to broadcast, or a type or shape check_inputs will name
    if ids.dim() == 1 or (ids.dim() == 2 and ids.shape[0] == 1):
        return ids.reshape(1, -1).expand(given.shape[0], -1)
    return ids


class BertModel(Pretrained, nn.Module):
    """The bare BERT encoder: input ids in, contextual vectors and the pooled [CLS] vector out.

    `add_pooler=False` leaves the pooler out, for heads that read every token (as transformers does for them);
    `add_pooling_layer`, transformers' name for it, is taken too (and wins where both are given).
    """

    def __init__(self, config: BertConfig, add_pooler: bool = True, add_pooling_layer: bool | None = None):
        super().__init__()
        if add_pooling_layer is not None:
            add_pooler = add_pooling_layer
        self.config = config = bert_config(config)
        self.embeddings = Embeddings(config.vocab_size, config.hidden_size, config.max_position_embeddings,
                                     config.type_vocab_size, config.pad_token_id, config.hidden_dropout_prob,
                                     config.layer_norm_eps)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config.hidden_size) if add_pooler else None
        self.apply(self.init_weights)

    def init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: normal(0, initializer_range) weights, zero biases, LayerNorm 1 and 0."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, first_token_only: bool = False,
                return_dict: bool | None = None, **decoder_options) -> EncoderOutput:
        """`attention_mask`: (batch, seq), 1 at real tokens and 0 at padding; or per query and key, (batch, seq, seq)
        or transformers' 4-D (batch, 1 or heads, seq, seq), for packed documents and custom attention patterns
        (every position is then computed; see packing.pairwise_batch). A batch packs its real tokens and gives zeros
        at padding, unless a row starts with padding (left padding, a row without a real token): then every
        position is computed, as transformers computes it. `position_ids` without an attention_mask: wherever a
        position is not the one before it plus one, a new document starts, which attends to itself alone (as
        transformers reads them: packing.documents_by_position). `output_hidden_states`, `output_attentions`:
        return every layer's output, every layer's attention weights (None: as config says). `inputs_embeds`
        (batch, seq, hidden): token vectors in the place of input_ids' lookup (attribution, adversarial training).
        `return_dict=False`: a tuple, as transformers. `decoder_options`: transformers' for a decoder and its cache,
        taken where they ask nothing of an encoder (see check_decoder_options).

        `first_token_only`: last_hidden_state is (batch, 1, hidden), each sequence's first position ([CLS]) alone,
        all that the pooler and [CLS] pooling read. The last layer then computes only that position (its keys and
        values are still every token's, so the result is the same): most of one layer's work, 10-15% of MiniLM's
        forward. Ignored when every layer's output or attention weights are asked for."""
        check_decoder_options(decoder_options)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        given = input_ids if inputs_embeds is None else inputs_embeds
        # one row of positions or segments for the whole batch, (seq,) or (1, seq), as transformers broadcasts it
        token_type_ids, position_ids = (broadcast_row(ids, given) for ids in (token_type_ids, position_ids))
        self.check_inputs(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        batch_size, seq_len, device = *given.shape[:2], given.device
        # Packing asks the data where its padding is (and where documents start), which a traced graph can't branch
        # on: an exported or traced graph computes every position (the same outputs at real tokens; padding
        # positions then hold values, not zeros).
        exporting = recording_graph()
        if attention_mask is None and position_ids is not None:
            attention_mask = documents_by_position(position_ids, always=exporting)
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, seq_len, dtype=torch.long, device=device)

        scores_dtype = (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                        else next(self.embeddings.parameters()).dtype)
        if is_pairwise(attention_mask):  # (batch, seq, seq): no padding to leave out, every position is computed
            batch = pairwise_batch(attention_mask, scores_dtype)
        else:
            # transformers computes every position, padding too, and its pooler and [CLS] heads read the first: a
            # batch with a row that starts with padding is computed whole, so that they read the same vector here.
            pack = not exporting and bool(attention_mask[:, 0].all())
            batch = pack_batch(attention_mask, scores_dtype, pack=pack, keep_positions=output_attentions)
        first_token_only = first_token_only and not (output_hidden_states or output_attentions)
        # After the embeddings (whose output is the batch as given, as code that hooks them expects), everything
        # runs on the real tokens only: (tokens, hidden).
        x = batch.pack(self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds))
        tracing = torch.compiler.is_compiling()  # a graph being recorded holds no Python state of the run
        if not (tracing or self.__dict__.get("warned_of_packed_hooks")):
            hooked = hooked_module(self.encoder)
            if hooked is not None:
                warn_of_packed_hooks(hooked)
                self.warned_of_packed_hooks = True
        if not tracing:
            self.encoder.layout = batch
        x, hidden_states, attentions = self.encoder(x, batch, output_hidden_states, output_attentions,
                                                    first_token_only)
        if not tracing:
            self.encoder.layout = None
        last_hidden_state = batch.unpack_first_tokens(x) if first_token_only else \
            hidden_states[-1] if output_hidden_states else batch.unpack(x)
        return returned(EncoderOutput(
            last_hidden_state=last_hidden_state,
            pooler_output=self.pooler(last_hidden_state) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        ), return_dict)

    def check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds=None) -> None:
        """Type, shape and range errors a user can make, caught here rather than deep inside an embedding lookup."""
        pairwise = isinstance(attention_mask, torch.Tensor) and is_pairwise(attention_mask)  # else checked below
        check_input_shapes(("batch", "seq"), self.config.hidden_size, input_ids, None if pairwise else attention_mask,
                           token_type_ids, position_ids, inputs_embeds)
        given = input_ids if inputs_embeds is None else inputs_embeds
        shape = tuple(given.shape[:2])
        if pairwise:
            batch, seq = shape
            heads = {1, self.config.num_attention_heads}
            if attention_mask.shape[0] != batch or attention_mask.shape[-2:] != (seq, seq) or (
                    attention_mask.dim() == 4 and attention_mask.shape[1] not in heads):
                raise BertforgeError(f"attention_mask has shape {tuple(attention_mask.shape)}; a mask per query and "
                                     f"key must be ({batch}, {seq}, {seq}) or ({batch}, 1 or "
                                     f"{self.config.num_attention_heads} heads, {seq}, {seq})")
        if shape[1] > self.config.max_position_embeddings:
            raise BertforgeError(f"sequence length {shape[1]} exceeds max_position_embeddings "
                                 f"({self.config.max_position_embeddings}); truncate the input")
        # Ids past an embedding table (a tokenizer with tokens the model was never resized for, a pair for a model
        # of one segment) would fail deep in the lookup; checked where it costs nothing (CPU, eager).
        if given.device.type != "cpu" or recording_graph() or not given.numel():
            return
        tables = (("token id", input_ids, "vocab_size", "is the tokenizer larger than the model?"),
                  ("segment id", token_type_ids, "type_vocab_size", "the model reads single texts, not pairs"),
                  ("position id", position_ids, "max_position_embeddings", "positions count from 0"))
        for name, ids, field, hint in tables:
            if ids is None:
                continue
            size, low, high = getattr(self.config, field), int(ids.min()), int(ids.max())
            if low < 0 or high >= size:
                raise BertforgeError(f"{name} {high if high >= size else low} is outside the model's {field} of "
                                     f"{size} (config.json): {hint}")
