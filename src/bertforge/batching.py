"""Where batches are made and padding is added: rows of token ids -> right-padded tensors, and the orders that
group rows of similar length. Every padding and collation of the library goes through here (the tokenizer's
padding=True, fine-tuning and evaluation batches, embeddings, the server); packing.py is where padding is removed
again inside the encoder.

Shapes: batch, seq (the longest row of the batch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from bertforge.heads import IGNORE_INDEX

# Padding value of each per-token key; "input_ids" takes the tokenizer's [PAD] id. Labels pad with the value the
# loss skips; offsets and word ids are the tokenizer's per-token details, (0, 0) and None as for special tokens.
PAD_VALUES: dict[str, Any] = {"token_type_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX,
                              "offset_mapping": (0, 0), "word_ids": None, "special_tokens_mask": 1}


MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")  # what an encoder takes of a row


def padding_for(key: str, pad_token_id: int) -> Any:
    return pad_token_id if key == "input_ids" else PAD_VALUES.get(key, 0)


def pad_lists(rows: Sequence[list], target: int, value: Any, left: bool = False) -> None:
    """Pad each list on the right (or the left) to `target` items, in place (lists already as long are left
    alone)."""
    for row in rows:
        if len(row) < target:
            if left:
                row[:0] = [value] * (target - len(row))
            else:
                row += [value] * (target - len(row))


def pad_ids(sequences: Sequence[Sequence[int]], pad_value: int, length: int = 0) -> torch.Tensor:
    """Right-pad lists of ints to the longest (or to `length`, when that is longer): (batch, seq)."""
    longest = max(length, *(len(ids) for ids in sequences))
    return torch.tensor([list(ids) + [pad_value] * (longest - len(ids)) for ids in sequences], dtype=torch.long)


def collate(rows: Sequence[dict[str, Any]], pad_token_id: int, length: int = 0) -> dict[str, torch.Tensor]:
    """Rows of model inputs -> one batch: per-token lists right-padded to the longest row (or to `length`, a fixed
    shape) with PAD_VALUES, one-value keys (a class label, an answer's start) stacked; an attention mask is added
    when the rows have none."""
    batch = {}
    for key in rows[0]:
        values = [row[key] for row in rows]
        batch[key] = pad_ids(values, padding_for(key, pad_token_id), length) if isinstance(values[0], list) else \
            torch.tensor(values)
    if "attention_mask" not in batch:
        batch["attention_mask"] = pad_ids([[1] * len(row["input_ids"]) for row in rows], 0, length)
    return batch


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, so each batch pads only to its own longest (for inference:
    the order doesn't matter, the caller puts the outputs back in place)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


class LengthGroupedBatches:
    """Training batches of similar length in random order: shuffle, cut into pools of 50 batches, sort each pool
    by length, then shuffle the batches. Padding stays small and every epoch sees a new order.

    Epoch e uses the generator seed `seed + e`, so a run repeats exactly, and a resumed run picks up the order of
    the epoch it stopped in (set_epoch).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, pool_batches: int = 50):
        self.lengths, self.batch_size, self.seed, self.pool_batches = list(lengths), batch_size, seed, pool_batches
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        pool_size = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(order), pool_size):
            pool = sorted(order[start:start + pool_size], key=lambda i: self.lengths[i], reverse=True)
            batches += [pool[i:i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        yield from (batches[i] for i in torch.randperm(len(batches), generator=generator).tolist())
