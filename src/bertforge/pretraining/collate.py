"""Instances -> a padded, freshly masked batch with the names the pre-training models take.

Masking happens here, per batch, rather than once when the data is prepared (RoBERTa's dynamic masking): the
same sentence gets new masks every epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice

import numpy as np
import torch

from bertforge.batching import collate
from bertforge.errors import ConfigError
from bertforge.pretraining.instances import Instance, InstanceStream
from bertforge.pretraining.masking import Masker


class PretrainingCollator:
    """list[Instance] -> {input_ids, attention_mask, token_type_ids, labels[, next_sentence_label]}, all (batch, seq)
    except next_sentence_label (batch,), which is present when the instances are sentence pairs.

    Pads on the right to the longest instance, or to `pad_to` (a fixed shape, e.g. max_seq_length), rounded up
    to a multiple of `pad_to_multiple_of` (8 suits tensor cores). The masks come from the collator's own seeded
    generator; `state_dict()` saves it so that a resumed run draws the masks it would have drawn.
    """

    def __init__(self, masker: Masker, pad_token_id: int, seed: int = 0, pad_to: int | None = None,
                 pad_to_multiple_of: int = 1):
        if pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
        self.masker, self.pad_token_id = masker, pad_token_id
        self.pad_to, self.pad_to_multiple_of = pad_to, pad_to_multiple_of
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, instances: Sequence[Instance]) -> dict[str, torch.Tensor]:
        lengths = [len(instance.input_ids) for instance in instances]
        seq = max(lengths) if self.pad_to is None else self.pad_to
        if seq < max(lengths):
            raise ConfigError(f"an instance has {max(lengths)} tokens, more than pad_to={self.pad_to}")
        seq = -(-seq // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = collate([{"input_ids": np.asarray(instance.input_ids).tolist(),
                          "token_type_ids": np.asarray(instance.token_type_ids).tolist()} for instance in instances],
                        self.pad_token_id, length=seq)
        # [PAD] is a special token, which the masker never chooses: padding stays unmasked with label -100.
        masked = self.masker(batch["input_ids"], self.generator)
        batch |= {"input_ids": masked.input_ids, "labels": masked.labels}
        labels = [instance.next_sentence_label for instance in instances]
        if any(label is not None for label in labels):
            if None in labels:
                raise ConfigError("a batch mixes sentence pairs and single segments")
            batch["next_sentence_label"] = torch.tensor(labels, dtype=torch.long)
        return batch

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def batches(stream: InstanceStream, collator: PretrainingCollator, batch_size: int) -> Iterator[dict]:
    """Collated batches drawn in this process, so the stream's and collator's state are exactly the position."""
    instances: Iterator[Instance] = iter(stream)
    while chunk := list(islice(instances, batch_size)):
        yield collator(chunk)
