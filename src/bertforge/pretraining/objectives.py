"""The pre-training objectives by name: which model each trains, how its data pairs segments, how a batch is scored.

A batch is a mapping with transformers' names: input_ids, attention_mask, token_type_ids, labels (original ids at
the masked positions, -100 elsewhere) and, for the sentence-pair objectives, next_sentence_label (0 = B is A's
real continuation / in order, 1 = B is a random segment / swapped). Every loss returns the model's output, whose
`loss` is what to minimise and whose `*_loss` fields are worth logging.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertforge.config import BertConfig
from bertforge.errors import check_choice
from bertforge.pretraining.heads import BertForMaskedLM, BertForPreTraining, ElectraForPreTraining
from bertforge.pretraining.masking import BERT_REPLACEMENT, ELECTRA_REPLACEMENT, Replacement

Batch = Mapping[str, torch.Tensor]


def masked_lm_loss(model: BertForMaskedLM, batch: Batch, generator: torch.Generator | None = None):
    """Mean cross-entropy of the original token at each masked position."""
    return model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"),
                 labels=batch["labels"], masked_logits_only=True)


def masked_lm_and_sentence_pair_loss(model: BertForPreTraining, batch: Batch,
                                     generator: torch.Generator | None = None):
    """Masked-LM loss + the mean cross-entropy of the pair label on [CLS] (BERT's sum of the two means)."""
    return model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"),
                 labels=batch["labels"], next_sentence_label=batch["next_sentence_label"], masked_logits_only=True)


def electra_loss(model: ElectraForPreTraining, batch: Batch, generator: torch.Generator | None = None):
    """Generator masked-LM loss + 50 x the discriminator's replaced-token binary cross-entropy over real tokens."""
    return model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"),
                 labels=batch["labels"], rng=generator)


@dataclass(frozen=True)
class Objective:
    description: str
    build_model: Callable[[BertConfig], nn.Module]
    # How the data side makes segment B: "next_sentence" (half the time a random segment instead of the real
    # continuation, BERT's NSP), "sentence_order" (half the time A and B swapped, ALBERT's SOP), or None (one
    # stretch of text per sequence, no pair label).
    sentence_pairs: str | None
    loss: Callable[[Any, Batch, torch.Generator | None], Any]
    replacement: Replacement = BERT_REPLACEMENT  # what the masked tokens become in the model's input


# The CLI's --objective choices are these keys.
OBJECTIVES: dict[str, Objective] = {
    "mlm": Objective("masked language modelling only (RoBERTa-style)", BertForMaskedLM, None, masked_lm_loss),
    "mlm+nsp": Objective("masked LM + next-sentence prediction (the original BERT)", BertForPreTraining,
                         "next_sentence", masked_lm_and_sentence_pair_loss),
    "mlm+sop": Objective("masked LM + sentence-order prediction (ALBERT)", BertForPreTraining,
                         "sentence_order", masked_lm_and_sentence_pair_loss),
    "electra": Objective("replaced-token detection with a small masked-LM generator (ELECTRA)",
                         ElectraForPreTraining, None, electra_loss, ELECTRA_REPLACEMENT),
}


def get_objective(name: str) -> Objective:
    check_choice(name, OBJECTIVES, "pre-training objective")
    return OBJECTIVES[name]
