"""The BERT encoder (Devlin et al., 2018): embeddings, post-LN Transformer layers, pooler.

Shapes: batch, seq (positions per sequence), hidden, heads, head_dim = hidden // heads,
tokens = the real (non-padding) positions of a batch, which is what the dense layers run on.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.activations import ACTIVATIONS, ONEDNN_POST_OPS
from bertforge.checkpoint.pretrained import Pretrained
from bertforge.config import BertConfig
from bertforge.errors import BertforgeError


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (batch, seq, hidden); zeros at padding positions
    pooler_output: torch.Tensor | None  # (batch, hidden); None for a model built without the pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings output + one per layer
    attentions: tuple[torch.Tensor, ...] | None = None  # one (batch, heads, seq, seq) per layer


# Cost model for grouping sequences into attention blocks, in query-key pairs of one sequence (all heads): each
# padded slot also costs its gathers and copies, and each block a fixed overhead (kernel calls, index tensors, a
# concat). Measured on a 2-core AVX2 CPU with MiniLM's sizes: ~50 ns a pair, ~0.2 us a slot, ~100 us a block.
SLOT_COST = 8
BLOCK_COST = 2048
# On a CPU, SDPA's kernel has a large cost per (sequence, head) that dominates short sequences; up to this length
# the explicit matmul-softmax-matmul path is faster (up to 2x at 8-16 tokens), beyond it SDPA is (2-3x at 256+).
EXPLICIT_ATTENTION_MAX_SEQ = 64


def group_by_length(lengths: list[int]) -> list[list[int]]:
    """Split sequences into blocks of similar length that each attend padded to their own longest.

    Sequences sorted longest first are cut into runs minimising sum(count * longest * (longest + SLOT_COST)) plus
    BLOCK_COST per block: padded attention work against the fixed cost of one more block. Runs of equal length are
    never cut (that only adds a block), so the dynamic programme is over distinct lengths. Empty sequences are left out.
    """
    order = sorted((i for i, length in enumerate(lengths) if length > 0), key=lambda i: -lengths[i])
    sequences_of_length = Counter(lengths[i] for i in order)
    distinct = sorted(sequences_of_length, reverse=True)
    counts = [sequences_of_length[length] for length in distinct]
    best, cut = [0.0] + [math.inf] * len(distinct), [0] * (len(distinct) + 1)
    for end in range(1, len(distinct) + 1):
        count = 0
        for start in range(end - 1, -1, -1):  # the block holds distinct[start:end]; its longest is distinct[start]
            count += counts[start]
            cost = best[start] + BLOCK_COST + count * distinct[start] * (distinct[start] + SLOT_COST)
            if cost < best[end]:
                best[end], cut[end] = cost, start
    block_of, end = {}, len(distinct)
    while end > 0:  # walk the cuts back from the shortest lengths
        block_of.update((length, cut[end]) for length in distinct[cut[end]:end])
        end = cut[end]
    blocks: dict[int, list[int]] = {}
    for i in order:
        blocks.setdefault(block_of[lengths[i]], []).append(i)
    return list(blocks.values())


def key_bias(is_real: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(batch, seq) mask -> (batch, 1, 1, seq) additive bias on attention scores: 0 for real keys, the dtype's
    minimum for padding (finite, so that a fully padded row gives a uniform softmax instead of NaN)."""
    bias = torch.zeros(is_real.shape, dtype=dtype, device=is_real.device)
    return bias.masked_fill_(~is_real, torch.finfo(dtype).min)[:, None, None, :]


@dataclass(frozen=True)
class AttentionBlock:
    """Sequences that attend together as one padded (batch, seq) rectangle: the packed tokens start:stop."""

    start: int
    stop: int
    batch: int
    seq: int
    bias: torch.Tensor | None = None  # (batch, 1, 1, seq) key_bias; None: no padding in the rectangle
    fill: torch.Tensor | None = None  # (batch * seq,) the token (from start) each slot reads; None: tokens in order
    slots: torch.Tensor | None = None  # (stop - start,) the slot of each token; None: tokens in order

    def gather(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, hidden) -> (batch, seq, hidden)."""
        x = tokens[self.start:self.stop]
        return (x if self.fill is None else x.index_select(0, self.fill)).view(self.batch, self.seq, -1)

    def scatter(self, rows: torch.Tensor) -> torch.Tensor:
        """(batch * seq, hidden) -> (stop - start, hidden): the block's own tokens, back in packed order."""
        return rows if self.slots is None else rows.index_select(0, self.slots)


class Padding:
    """Where the real tokens of a padded batch sit: dense layers run on them only, attention in tight blocks.

    `remove` packs (batch, seq, ...) into (tokens, ...) and `restore` scatters back with zeros at padding; without
    padding both are free reshapes. Tokens are packed block by block: `blocks` group sequences of similar length,
    and each block attends as one rectangle padded only to its own longest sequence. Attention is blind to where
    keys sit, so each sequence's tokens fill the start of its row; padding slots repeat a token of their row and
    are masked out as keys. A block of equal lengths attends on its tokens as they are, without a copy.
    `keep_positions` lays attention out as the batch itself (one block), so that attention weights line up with the
    input. `pack=False` keeps every position and masks padding out of attention only: a graph exporter needs that,
    since packing asks a question of the data (is there padding, where) that a traced graph can't branch on; so
    does a batch without a single real token.
    """

    def __init__(self, attention_mask: torch.Tensor, dtype: torch.dtype, pack: bool = True,
                 keep_positions: bool = False):
        self.batch_size, self.seq_len = attention_mask.shape
        is_real = attention_mask.bool()
        self.indices = None  # positions in the flattened (batch * seq) of the packed tokens, in packed order
        lengths = is_real.sum(1)
        all_real = pack and bool(is_real.all())  # asked only when packing: an exporter can't trace the answer
        self.has_padding = pack and not all_real and bool(lengths.any())
        if not self.has_padding:
            bias = None if all_real else key_bias(is_real, dtype)
            size = self.batch_size * self.seq_len
            self.blocks = [AttentionBlock(0, size, self.batch_size, self.seq_len, bias)]
        elif keep_positions:
            flat = is_real.reshape(-1)
            self.indices = flat.nonzero().squeeze(1)
            fill = (flat.cumsum(0) - 1).clamp(min=0)  # a padding slot reads the token before it
            self.blocks = [AttentionBlock(0, len(self.indices), self.batch_size, self.seq_len,
                                          key_bias(is_real, dtype), fill, self.indices)]
        else:
            self.blocks = self.pack_in_blocks(is_real, lengths, dtype)

    def pack_in_blocks(self, is_real: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype
                       ) -> list[AttentionBlock]:
        """Sets `indices` to pack tokens block by block; returns the blocks."""
        device = is_real.device
        lengths = lengths.tolist()
        groups = group_by_length(lengths)
        order = torch.tensor([i for group in groups for i in group], device=device)
        rows, columns = is_real[order].nonzero(as_tuple=True)  # each sequence's tokens, sequences in block order
        self.indices = order[rows] * self.seq_len + columns
        blocks, start = [], 0
        for group in groups:
            group_lengths = [lengths[i] for i in group]
            count, seq, stop = len(group), group_lengths[0], start + sum(group_lengths)  # longest first
            if group_lengths[-1] == seq:
                blocks.append(AttentionBlock(start, stop, count, seq))
            else:
                slot = torch.arange(seq, device=device)
                group_lengths = torch.tensor(group_lengths, device=device)[:, None]  # (count, 1)
                slot_is_real = slot < group_lengths  # (count, seq)
                first_token = group_lengths.cumsum(0) - group_lengths
                fill = first_token + torch.minimum(slot, group_lengths - 1)  # padding repeats the last token
                blocks.append(AttentionBlock(start, stop, count, seq, key_bias(slot_is_real, dtype),
                                             fill.reshape(-1), slot_is_real.reshape(-1).nonzero().squeeze(1)))
            start = stop
        return blocks

    def remove(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(self.batch_size * self.seq_len, *x.shape[2:])
        return x.index_select(0, self.indices) if self.has_padding else x

    def restore(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_padding:
            padded = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
            x = padded.index_copy(0, self.indices, x)
        return x.view(self.batch_size, self.seq_len, *x.shape[1:])

    def from_blocks(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """Each block's (batch * seq, ...) attention output -> (tokens, ...)."""
        tokens = [block.scatter(block_rows) for block, block_rows in zip(self.blocks, rows)]
        return tokens[0] if len(tokens) == 1 else torch.cat(tokens)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, with a cheaper random mask on a CPU.

    torch draws a float per element there (about a tenth of a CPU fine-tuning step); here each element reads 16
    bits of a 64-bit random word, a quarter of the draws, and is kept with probability 1 - p to within 2^-16.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    words = torch.randint(-2**63, 2**63 - 1, ((x.numel() + 3) // 4,), dtype=torch.int64)
    keep = words.view(torch.int16)[:x.numel()].view(x.shape) >= round(p * 65536) - 32768
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Module):
    """nn.Dropout on `dropout` above."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Linear(nn.Linear):
    """nn.Linear, optionally followed by an activation, whose float32 inference on a CPU multiplies by a copy of the
    weight laid out for oneDNN and applies the activation as the product is written (one pass fewer over memory).

    oneDNN's kernels on a weight reordered once beat MKL's sgemm, which repacks the weight on every call, on
    BERT's shapes: 1.1-1.3x on an AVX-512 AMD CPU, and no slower with oneDNN held to AVX2. The copy serves eval
    mode without gradients only, and is made again after anything that may have changed the weight: a switch
    between train and eval mode, a forward pass with gradients (an optimizer step may follow), or an in-place
    update that moves the weight's version counter (a checkpoint load; fused AdamW's step does not move it).
    Training, autocast, other devices and dtypes, and graph capture (torch.compile, export) take nn.Linear's own
    path: oneDNN's op has no gradient and no ONNX form.
    """

    packed: tuple[tuple[int, int], torch.Tensor] | None = None  # ((data pointer, version) of weight, its copy)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 activation: str | None = None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation  # a name in ACTIVATIONS, or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.training or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32
                or self.weight.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
                or torch.compiler.is_compiling() or not torch.backends.mkldnn.is_available()):
            self.packed = None
            x = super().forward(x)
            return x if self.activation is None else ACTIVATIONS[self.activation](x)
        operation, algorithm = ONEDNN_POST_OPS[self.activation] if self.activation else ("none", "")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, operation, [], algorithm)

    def packed_weight(self) -> torch.Tensor:
        if self.weight.is_inference():  # made under inference_mode: no version counter to tell a change by
            return torch.ops.mkldnn._reorder_linear_weight(self.weight, None)
        key = (self.weight.data_ptr(), self.weight._version)
        if self.packed is None or self.packed[0] != key:
            self.packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None))
        return self.packed[1]

    def train(self, mode: bool = True) -> Linear:
        self.packed = None
        return super().train(mode)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "packed": None}  # oneDNN's layout can't be copied or pickled; it is made on use

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


class Embeddings(nn.Module):
    """Token + learned position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, hidden_size: int, max_positions: int, num_segments: int,
                 pad_token_id: int, dropout: float, layer_norm_eps: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.positions = nn.Embedding(max_positions, hidden_size)
        self.segments = nn.Embedding(num_segments, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def forward(self, input_ids, token_type_ids, position_ids):
        x = self.tokens(input_ids) + self.segments(token_type_ids) + self.positions(position_ids)
        return self.dropout(self.norm(x))  # (batch, seq, hidden)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention over the real tokens of each sequence."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.query = Linear(hidden_size, hidden_size)
        self.key = Linear(hidden_size, hidden_size)
        self.value = Linear(hidden_size, hidden_size)
        self.output = Linear(hidden_size, hidden_size)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, padding: Padding, need_weights: bool = False):
        """(tokens, hidden) -> (tokens, hidden), and the attention probabilities if `need_weights` (which needs
        padding laid out with `keep_positions`: one block, the batch's own positions)."""
        q, k, v = self.query(x), self.key(x), self.value(x)
        contexts, probs = [], None
        for block in padding.blocks:
            heads = (self.split_heads(block.gather(t)) for t in (q, k, v))  # (batch, heads, seq, head_dim) each
            context, probs = self.attend(*heads, block.bias, need_weights)
            contexts.append(context.transpose(1, 2).reshape(block.batch * block.seq, -1))
        return self.output(padding.from_blocks(contexts)), probs

    def attend(self, q, k, v, bias: torch.Tensor | None, need_weights: bool):
        """Scaled dot-product attention of one block: (batch, heads, seq, head_dim) each -> the same shape."""
        dropout_p = self.dropout if self.training else 0.0
        # An exported graph takes SDPA for every length: a branch on the length would fix it to one side.
        on_cpu = q.device.type == "cpu" and not torch.compiler.is_exporting()
        if need_weights or (on_cpu and (dropout_p > 0.0 or q.shape[2] <= EXPLICIT_ATTENTION_MAX_SEQ)):
            # The explicit path: for the weights themselves, for short sequences on a CPU, and for dropout on a CPU,
            # where SDPA computes the same thing with a costlier random mask.
            scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1 / math.sqrt(self.head_dim))  # (batch, heads, seq, seq)
            if bias is not None:
                scores = scores.add_(bias)
            probs = scores.softmax(dim=-1)
            return dropout(probs, dropout_p, training=True) @ v, probs if need_weights else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p), None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)


class FeedForward(nn.Module):
    """Position-wise up-projection, activation, down-projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "gelu"):
        super().__init__()
        self.up = Linear(hidden_size, intermediate_size, activation=activation)
        self.down = Linear(intermediate_size, hidden_size)

    def forward(self, x):
        return self.down(self.up(x))


class EncoderLayer(nn.Module):
    """x -> LN(x + Attention(x)) -> LN(x + FeedForward(x)), as in the original BERT (post-LN)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, activation: str,
                 dropout: float, attention_dropout: float, layer_norm_eps: float):
        super().__init__()
        self.attention = SelfAttention(hidden_size, num_heads, attention_dropout)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.feed_forward = FeedForward(hidden_size, intermediate_size, activation)
        self.output_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, padding: Padding, need_weights: bool = False):
        attended, probs = self.attention(x, padding, need_weights)
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

    def forward(self, x: torch.Tensor, padding: Padding, output_hidden_states: bool, output_attentions: bool):
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, padding, need_weights=output_attentions)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(probs)
        return x, hidden_states, attentions


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence representation the NSP and classification heads read."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)

    def forward(self, last_hidden_state):
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class BertModel(Pretrained, nn.Module):
    """The bare BERT encoder: input ids in, contextual vectors and the pooled [CLS] vector out.

    `add_pooler=False` leaves the pooler out, for heads that read every token (as transformers does for them).
    """

    # Dense layers run on the real tokens only. ONNX export turns this off (see Padding); the outputs at real
    # tokens are the same, and padding positions then hold values computed from padding instead of zeros.
    pack_tokens: bool = True

    def __init__(self, config: BertConfig, add_pooler: bool = True):
        super().__init__()
        self.config = config
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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> EncoderOutput:
        self.check_inputs(input_ids, attention_mask, token_type_ids, position_ids)
        batch_size, seq_len = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=input_ids.device).expand(batch_size, seq_len)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)

        device = input_ids.device.type
        scores_dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                        else next(self.embeddings.parameters()).dtype)
        padding = Padding(attention_mask, scores_dtype, pack=self.pack_tokens, keep_positions=output_attentions)
        # From the embedding lookup on, everything runs on the real tokens only: (tokens, hidden).
        x = self.embeddings(*(padding.remove(ids) for ids in (input_ids, token_type_ids, position_ids)))
        x, hidden_states, attentions = self.encoder(x, padding, output_hidden_states, output_attentions)
        last_hidden_state = padding.restore(x)
        return EncoderOutput(
            last_hidden_state=last_hidden_state,
            pooler_output=self.pooler(last_hidden_state) if self.pooler is not None else None,
            hidden_states=tuple(padding.restore(h) for h in hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids) -> None:
        """Shape errors a user can make, caught here rather than deep inside an embedding lookup."""
        if input_ids.dim() != 2:
            raise BertforgeError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
        for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                             ("position_ids", position_ids)):
            if tensor is not None and tensor.shape != input_ids.shape:
                raise BertforgeError(f"{name} has shape {tuple(tensor.shape)}, "
                                     f"input_ids has {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise BertforgeError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                                 f"({self.config.max_position_embeddings}); truncate the input")
