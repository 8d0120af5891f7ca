"""The BERT encoder (Devlin et al., 2018): embeddings, post-LN Transformer layers, pooler.

Shapes: batch, seq (positions per sequence), hidden, heads, head_dim = hidden // heads,
tokens = the real (non-padding) positions of a batch, which is what the dense layers run on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.activations import ACTIVATIONS
from bertforge.checkpoint.pretrained import Pretrained
from bertforge.config import BertConfig
from bertforge.errors import BertforgeError


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (batch, seq, hidden); zeros at padding positions
    pooler_output: torch.Tensor | None  # (batch, hidden); None for a model built without the pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings output + one per layer
    attentions: tuple[torch.Tensor, ...] | None = None  # one (batch, heads, seq, seq) per layer


class Padding:
    """Where the real tokens of a padded batch sit, so that dense layers skip the padding.

    `remove` packs (batch, seq, ...) into (tokens, ...) and `restore` scatters back with zeros at padding;
    without padding both are free reshapes. Only attention needs the padded (batch, seq) layout.
    `pack=False` keeps every position (padding is only masked out of attention): a graph exporter needs that,
    since packing asks a question of the data (is there padding, where) that a traced graph can't branch on.
    """

    def __init__(self, attention_mask: torch.Tensor, dtype: torch.dtype, pack: bool = True):
        self.batch_size, self.seq_len = attention_mask.shape
        is_real = attention_mask.reshape(-1).bool()
        self.has_padding = pack and not bool(is_real.all())
        self.indices = is_real.nonzero().squeeze(1) if self.has_padding else None
        # Additive bias on the attention scores: 0 for real keys, the dtype's minimum for padding keys
        # (finite, so that a fully padded row gives a uniform softmax instead of NaN).
        self.attention_bias = None
        if self.has_padding or not pack:
            bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
            bias.masked_fill_(attention_mask == 0, torch.finfo(dtype).min)
            self.attention_bias = bias[:, None, None, :]  # (batch, 1, 1, seq)

    def remove(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(self.batch_size * self.seq_len, *x.shape[2:])
        return x.index_select(0, self.indices) if self.has_padding else x

    def restore(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_padding:
            padded = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
            x = padded.index_copy(0, self.indices, x)
        return x.view(self.batch_size, self.seq_len, *x.shape[1:])


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
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, padding: Padding, need_weights: bool = False):
        """(tokens, hidden) -> (tokens, hidden), and the attention probabilities if `need_weights`."""
        q, k, v = (self.split_heads(padding.restore(project(x))) for project in (self.query, self.key, self.value))
        dropout_p = self.dropout if self.training else 0.0
        if need_weights or (dropout_p > 0.0 and x.device.type == "cpu"):
            # The explicit path: for the weights themselves, and for dropout on a CPU, where SDPA computes the
            # same thing with a costlier random mask.
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (batch, heads, seq, seq)
            if padding.attention_bias is not None:
                scores = scores + padding.attention_bias
            probs = scores.softmax(dim=-1)
            context = dropout(probs, dropout_p, training=True) @ v
            probs = probs if need_weights else None
        else:
            probs = None
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=padding.attention_bias,
                                                     dropout_p=dropout_p)
        context = context.transpose(1, 2).flatten(2)  # (batch, seq, hidden)
        return self.output(padding.remove(context)), probs

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)


class FeedForward(nn.Module):
    """Position-wise up-projection, activation, down-projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "gelu"):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.down = nn.Linear(intermediate_size, hidden_size)
        self.activation = ACTIVATIONS[activation]

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
        self.dense = nn.Linear(hidden_size, hidden_size)

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

        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (batch, seq, hidden)
        padding = Padding(attention_mask, dtype=torch.get_autocast_dtype(x.device.type)
                          if torch.is_autocast_enabled(x.device.type) else x.dtype, pack=self.pack_tokens)
        x, hidden_states, attentions = self.encoder(padding.remove(x), padding,
                                                    output_hidden_states, output_attentions)
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
