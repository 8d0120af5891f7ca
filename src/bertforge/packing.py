"""Removing padding from a batch and putting it back: the encoder's dense layers run on the real tokens only, and
attention runs in blocks of sequences of similar length, each padded only to its own longest.

Shapes: batch, seq (positions per sequence), tokens = the real (non-padding) positions of the batch.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Cost model for grouping sequences into attention blocks, in query-key pairs of one sequence (all heads): each
# padded slot also costs its gathers and copies, and each block a fixed overhead (kernel calls, index tensors, a
# concat). Measured on a 2-core AVX2 CPU with MiniLM's sizes: ~50 ns a pair, ~0.2 us a slot, ~100 us a block.
SLOT_COST = 8
BLOCK_COST = 2048


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
    bias: torch.Tensor | None = None  # (batch, 1, 1, seq) key_bias, or (batch, 1 or heads, seq, seq) per query and
    # key (pairwise_batch); None: no padding in the rectangle
    fill: torch.Tensor | None = None  # (batch * seq,) the token (from start) each slot reads; None: tokens in order
    slots: torch.Tensor | None = None  # (stop - start,) the slot of each token; None: tokens in order

    def gather(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, hidden) -> (batch, seq, hidden)."""
        x = tokens[self.start:self.stop]
        return (x if self.fill is None else x.index_select(0, self.fill)).view(self.batch, self.seq, -1)

    def scatter(self, rows: torch.Tensor) -> torch.Tensor:
        """(batch * seq, hidden) -> (stop - start, hidden): the block's own tokens, back in packed order."""
        return rows if self.slots is None else rows.index_select(0, self.slots)


@dataclass(frozen=True)
class PackedBatch:
    """Where the real tokens of a padded (batch, seq) batch sit in the packed (tokens, ...) layout, and the blocks
    that attention runs in. `pack` removes the padding, `unpack` puts it back as zeros; without padding both are free
    reshapes. Made by `pack_batch`."""

    batch: int
    seq: int
    blocks: list[AttentionBlock]
    first_tokens_at: torch.Tensor  # (sequences,) where each sequence's first token sits among the packed tokens
    indices: torch.Tensor | None = None  # positions in the flattened (batch * seq) of the packed tokens; None: all
    order: torch.Tensor | None = None  # (sequences,) the batch row of each sequence in block order; None: in order

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) -> (tokens, ...)."""
        x = x.reshape(self.batch * self.seq, *x.shape[2:])
        return x if self.indices is None else x.index_select(0, self.indices)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (batch, seq, ...), zeros at padding."""
        if self.indices is not None:
            x = x.new_zeros(self.batch * self.seq, *x.shape[1:]).index_copy(0, self.indices, x)
        return x.view(self.batch, self.seq, *x.shape[1:])

    def first_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (sequences, ...): each sequence's first token, sequences in block order."""
        return x.index_select(0, self.first_tokens_at)

    def unpack_first_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(sequences, ...) in block order -> (batch, 1, ...); zeros for a row without a real token."""
        if self.order is not None:
            x = x.new_zeros(self.batch, *x.shape[1:]).index_copy_(0, self.order, x)
        return x.view(self.batch, 1, *x.shape[1:])

    def from_blocks(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """Each block's (batch * seq, ...) attention output -> (tokens, ...)."""
        tokens = [block.scatter(block_rows) for block, block_rows in zip(self.blocks, rows)]
        return tokens[0] if len(tokens) == 1 else torch.cat(tokens)

    def attend_in_blocks(self, attend: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         first_token_queries: bool = False):
        """(tokens, hidden) each -> (tokens, hidden): `attend(q, k, v, bias) -> (context, probs)` on each block's
        (batch, seq, hidden) rectangle. The probabilities returned are the last block's (the only one when the
        batch was packed with `keep_positions`). With `first_token_queries`, q is (sequences, hidden), each
        sequence's first token only (`first_tokens`), and so is the output."""
        if first_token_queries:
            contexts, first = [], 0
            for block in self.blocks:
                queries = q[first:first + block.batch].view(block.batch, 1, -1)
                bias = None if block.bias is None else block.bias[..., :1, :]  # the first query's row of a pairwise one
                contexts.append(attend(queries, block.gather(k), block.gather(v), bias)[0].squeeze(1))
                first += block.batch
            return (contexts[0] if len(contexts) == 1 else torch.cat(contexts)), None
        contexts, probs = [], None
        for block in self.blocks:
            context, probs = attend(block.gather(q), block.gather(k), block.gather(v), block.bias)
            contexts.append(context.reshape(block.batch * block.seq, -1))
        return self.from_blocks(contexts), probs


def pack_batch(attention_mask: torch.Tensor, dtype: torch.dtype, pack: bool = True,
               keep_positions: bool = False) -> PackedBatch:
    """The packed layout of a batch with this (batch, seq) mask; attention biases in `dtype`.

    Tokens are packed block by block: sequences of similar length (`group_by_length`) attend as one rectangle
    padded to their own longest. Attention is blind to where keys sit, so each sequence's tokens fill the start of
    its row; padding slots repeat a token of their row and are masked out as keys. A block of equal lengths attends
    on its tokens as they are, without a copy. `keep_positions` lays attention out as the batch itself (one block),
    so that attention weights line up with the input. `pack=False` keeps every position and masks padding out of
    attention only: a graph exporter needs that, since packing asks a question of the data (is there padding,
    where) that a traced graph can't branch on; so does a batch without a single real token.
    """
    batch, seq = attention_mask.shape
    is_real = attention_mask.bool()
    lengths = is_real.sum(1)
    all_real = pack and bool(is_real.all())  # asked only when packing: an exporter can't trace the answer
    if not pack or all_real or not bool(lengths.any()):
        return unpacked_batch(batch, seq, None if all_real else key_bias(is_real, dtype), attention_mask.device)
    if keep_positions:
        flat = is_real.reshape(-1)
        indices = flat.nonzero().squeeze(1)
        fill = (flat.cumsum(0) - 1).clamp(min=0)  # a padding slot reads the token before it
        block = AttentionBlock(0, len(indices), batch, seq, key_bias(is_real, dtype), fill, indices)
        return PackedBatch(batch, seq, [block], fill.view(batch, seq)[:, 0], indices)
    return pack_in_blocks(is_real, lengths.tolist(), dtype)


def unpacked_batch(batch: int, seq: int, bias: torch.Tensor | None, device: torch.device) -> PackedBatch:
    """The layout that keeps every position of a (batch, seq) batch: one block, attention biased by `bias`."""
    first_tokens_at = torch.arange(batch, device=device) * seq
    return PackedBatch(batch, seq, [AttentionBlock(0, batch * seq, batch, seq, bias)], first_tokens_at)


def is_pairwise(attention_mask: torch.Tensor | None) -> bool:
    """Whether a mask says which keys each query sees, (batch, seq, seq) or (batch, 1 or heads, seq, seq), rather
    than which positions are real, (batch, seq)."""
    return attention_mask is not None and attention_mask.dim() in (3, 4)


def real_token_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The (batch, seq) mask of real tokens that a model's attention_mask gives, for losses over real tokens only;
    None (every position real) for a mask per query and key, which leaves no padding out."""
    return None if is_pairwise(attention_mask) else attention_mask


def documents_by_position(position_ids: torch.Tensor, always: bool = False) -> torch.Tensor | None:
    """The (batch, seq, seq) mask per query and key of documents packed into rows and told apart by their positions
    alone (transformers' DataCollatorWithFlattening): True where query and key are in one document. As transformers
    reads position_ids given without an attention_mask, a document starts wherever a position is not the one before
    it plus one. None where each row is one document, unless `always` (a recorded graph can't branch on that)."""
    starts = position_ids.diff(dim=1, prepend=position_ids[:, :1] - 1) != 1  # (batch, seq); never a row's first
    if not always and not bool(starts.any()):
        return None
    document = starts.cumsum(1)  # (batch, seq): each position's document, numbered from 0 in its row
    return document[:, :, None] == document[:, None, :]


def pairwise_batch(attention_mask: torch.Tensor, dtype: torch.dtype) -> PackedBatch:
    """The layout of a batch whose mask is per query and key (packed documents, custom attention patterns): every
    position is computed, as there is no padding to leave out, and attention adds the mask's bias.

    (batch, seq, seq): 1 (or True) where query i may attend to key j, as transformers' 3-D masks were read.
    (batch, 1 or heads, seq, seq), as transformers 5 takes a 4-D mask: bool, True where i may attend to j; floating,
    a bias added to the scores as it is (0 to attend, a large negative number not to); whole numbers, 1 to attend.
    """
    if attention_mask.dim() == 4 and attention_mask.is_floating_point():
        bias = attention_mask.to(dtype)
    else:
        mask = attention_mask.bool()
        mask = mask if mask.dim() == 4 else mask[:, None]
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    return unpacked_batch(attention_mask.shape[0], attention_mask.shape[-1], bias, attention_mask.device)


def pack_in_blocks(is_real: torch.Tensor, lengths: list[int], dtype: torch.dtype) -> PackedBatch:
    """The layout of a padded batch whose tokens are packed block by block (see `pack_batch`)."""
    device = is_real.device
    batch, seq = is_real.shape
    groups = group_by_length(lengths)
    order = torch.tensor([i for group in groups for i in group], device=device)
    rows, columns = is_real[order].nonzero(as_tuple=True)  # each sequence's tokens, sequences in block order
    blocks, start, first_tokens_at = [], 0, []
    for group in groups:
        group_lengths = [lengths[i] for i in group]
        count, longest, stop = len(group), group_lengths[0], start + sum(group_lengths)  # longest first
        first_tokens_at.extend(itertools.accumulate(group_lengths[:-1], initial=start))
        if group_lengths[-1] == longest:
            blocks.append(AttentionBlock(start, stop, count, longest))
        else:
            slot = torch.arange(longest, device=device)
            group_lengths = torch.tensor(group_lengths, device=device)[:, None]  # (count, 1)
            slot_is_real = slot < group_lengths  # (count, longest)
            first_token = group_lengths.cumsum(0) - group_lengths
            fill = first_token + torch.minimum(slot, group_lengths - 1)  # padding repeats the last token
            blocks.append(AttentionBlock(start, stop, count, longest, key_bias(slot_is_real, dtype),
                                         fill.reshape(-1), slot_is_real.reshape(-1).nonzero().squeeze(1)))
        start = stop
    return PackedBatch(batch, seq, blocks, torch.tensor(first_tokens_at, device=device), order[rows] * seq + columns,
                       order)
