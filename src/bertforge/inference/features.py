"""Feature extraction: which hidden states to use (the BERT paper's recipes) and how to pool them.

Shapes: batch, seq, hidden; `states` is the tuple of the embeddings output and every layer's output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from bertforge.errors import BertforgeError

# The feature-based recipes of the BERT paper's NER study (section 5.3), by name.
LAYER_COMBINATIONS: dict[str, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    "last": lambda states: states[-1],
    "second_to_last": lambda states: states[-2],
    "sum_last_four": lambda states: torch.stack(states[-4:]).sum(0),
    "concat_last_four": lambda states: torch.cat(states[-4:], dim=-1),
    # A scalar mix with uniform weights, i.e. what an untrained learned mix of all layers computes.
    "weighted_sum_all": lambda states: torch.stack(states).mean(0),
    "embeddings": lambda states: states[0],
}


def _masked(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask[:, :, None].to(like.dtype)  # (batch, seq, 1)


POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cls": lambda hidden, mask: hidden[:, 0],
    "mean": lambda hidden, mask: (hidden * _masked(mask, hidden)).sum(1) / _masked(mask, hidden).sum(1).clamp(min=1),
    "max": lambda hidden, mask: hidden.masked_fill(mask[:, :, None] == 0, torch.finfo(hidden.dtype).min).max(1).values,
}


def check_choice(name: str, table: dict, what: str) -> None:
    if name not in table:
        raise BertforgeError(f"unknown {what} {name!r}; choose from {', '.join(table)}")


def token_features(model, input_ids, attention_mask, token_type_ids=None, layers: str = "last") -> torch.Tensor:
    """Per-token vectors (batch, seq, hidden or 4*hidden) from the chosen layer recipe."""
    check_choice(layers, LAYER_COMBINATIONS, "layer recipe")
    output = model(input_ids, attention_mask, token_type_ids, output_hidden_states=layers != "last")
    if layers == "last":
        return output.last_hidden_state
    return LAYER_COMBINATIONS[layers](output.hidden_states)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str = "mean") -> torch.Tensor:
    """(batch, seq, hidden) -> (batch, hidden), over real tokens only."""
    check_choice(pooling, POOLINGS, "pooling")
    return POOLINGS[pooling](hidden, attention_mask)


def pad_ids(sequences: Sequence[Sequence[int]], pad_value: int) -> torch.Tensor:
    """Right-pad lists of ints to the longest: (batch, seq)."""
    longest = max(len(ids) for ids in sequences)
    return torch.tensor([list(ids) + [pad_value] * (longest - len(ids)) for ids in sequences], dtype=torch.long)


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, so each batch pads only to its own longest."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


@torch.inference_mode()
def extract_features(model, tokenizer, texts: Sequence[str], layers: str = "last", pooling: str = "mean",
                     batch_size: int = 32, max_length: int | None = None, normalize: bool = False,
                     progress: bool = False) -> torch.Tensor:
    """One vector per text: (len(texts), hidden), in the order of `texts`.

    >>> extract_features(model, tokenizer, ["A cat.", "A dog."], pooling="mean", normalize=True).shape
    torch.Size([2, 384])
    """
    check_choice(layers, LAYER_COMBINATIONS, "layer recipe")
    check_choice(pooling, POOLINGS, "pooling")
    if batch_size < 1:
        raise BertforgeError(f"batch size must be at least 1, got {batch_size}")
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length or tokenizer.model_max_length)
    input_ids = encoded["input_ids"]
    batches = length_sorted_batches([len(ids) for ids in input_ids], batch_size)
    vectors: list[torch.Tensor | None] = [None] * len(input_ids)
    if progress:
        from tqdm import tqdm
        batches = tqdm(batches, desc="embedding", unit="batch")
    for indices in batches:
        ids = pad_ids([input_ids[i] for i in indices], tokenizer.pad_token_id)
        segments = pad_ids([encoded["token_type_ids"][i] for i in indices], 0)
        mask = pad_ids([encoded["attention_mask"][i] for i in indices], 0)
        pooled = pool(token_features(model, ids, mask, segments, layers), mask, pooling)
        if normalize:
            pooled = F.normalize(pooled, dim=-1)
        for i, vector in zip(indices, pooled):
            vectors[i] = vector
    if not vectors:
        return torch.empty(0, model.config.hidden_size)
    return torch.stack(vectors)
