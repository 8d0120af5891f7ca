"""How a pre-training run is scored: the per-batch counts behind the logged loss, accuracies, tokens/s and MFU,
and `evaluate_mlm`, held-out masked-LM loss, perplexity and accuracy beside the frequency baseline."""

from __future__ import annotations

import math
from itertools import islice
from typing import Any

import torch
from torch import nn

from bertforge.errors import BertforgeError, ConfigError
from bertforge.heads import IGNORE_INDEX
from bertforge.pretraining.collate import PretrainingCollator, batches
from bertforge.pretraining.corpus import CorpusReader
from bertforge.pretraining.heads import (
    BertForMaskedLM,
    BertForPreTraining,
    ElectraForPreTraining,
    ElectraOutput,
    PreTrainingOutput,
)
from bertforge.pretraining.instances import InstanceStream
from bertforge.pretraining.masking import Masker
from bertforge.runtime import to_device


def _masked_predictions(output: Any) -> torch.Tensor:
    """The masked-LM logits of an objective's output, (masked, vocab), in the order of labels != -100."""
    return output.generator_logits if isinstance(output, ElectraOutput) else \
        output.prediction_logits if isinstance(output, PreTrainingOutput) else output.logits


def batch_counts(output: Any, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Sums for the log: loss, masked tokens and correct predictions, sentence pairs and correct labels."""
    labels = batch["labels"][batch["labels"] != IGNORE_INDEX]
    predicted = _masked_predictions(output).argmax(-1)
    counts = {"masked": labels.numel(), "mlm_correct": (predicted == labels).sum().item(),
              "tokens": batch["attention_mask"].sum().item()}
    if isinstance(output, PreTrainingOutput):
        pair_labels = batch["next_sentence_label"]
        counts["pairs"] = pair_labels.numel()
        counts["pair_correct"] = (output.seq_relationship_logits.argmax(-1) == pair_labels).sum().item()
    if isinstance(output, ElectraOutput):
        real = batch["attention_mask"].bool()
        counts["real"] = real.sum().item()
        counts["replaced_correct"] = ((output.discriminator_logits > 0) == output.replaced)[real].sum().item()
    return counts


def summarise(window: dict[str, float], seconds: float, parameters: int, peak_gflops: float) -> dict:
    """Window sums -> the logged means. MFU: 6 x parameters x tokens (forward 2, backward 4 FLOPs per parameter
    and token) per second, over the peak; real tokens only, so padding counts as waste."""
    record = {"loss": window["loss"] / max(1, window["micro_batches"]),
              "mlm_accuracy": window["mlm_correct"] / max(1, window["masked"])}
    if window.get("pairs"):
        record["sentence_pair_accuracy"] = window["pair_correct"] / window["pairs"]
    if window.get("real"):
        record["replaced_token_accuracy"] = window["replaced_correct"] / window["real"]
    tokens_per_s = window["tokens"] / max(seconds, 1e-9)
    record["tokens_per_s"] = tokens_per_s
    record["mfu"] = 6 * parameters * tokens_per_s / (peak_gflops * 1e9)
    return record


def masked_lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(encoder, masked-LM head, word-embedding matrix) of any model with a masked-LM head (ELECTRA: its
    generator's)."""
    if isinstance(model, ElectraForPreTraining):
        return model.generator, model.generator_head, model.discriminator.embeddings.tokens.weight
    if isinstance(model, (BertForPreTraining, BertForMaskedLM)):
        return model.bert, model.masked_lm, model.bert.embeddings.tokens.weight
    raise ConfigError(f"{type(model).__name__} has no masked-LM head to evaluate")


@torch.inference_mode()
def evaluate_mlm(model: nn.Module, reader: CorpusReader, masker: Masker, pad_token_id: int, batch_size: int = 32,
                 seq_len: int = 128, max_batches: int | None = None, seed: int = 0,
                 device: torch.device | str | None = None) -> dict[str, float]:
    """Masked-LM loss (mean over masked tokens), perplexity (its exp) and accuracy on `reader`'s documents.

    One pass over them as single segments, masked by a generator seeded with `seed`: the same model and data
    always give the same numbers, so evaluations during and after training compare.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    encoder, head, word_embeddings = masked_lm_parts(model)
    was_training = model.training
    model.eval()
    stream = InstanceStream(reader, max_seq_length=seq_len, sentence_pairs=None, seed=seed, epochs=1)
    collator = PretrainingCollator(masker, pad_token_id, seed=seed)
    loss_sum, correct, masked, count = 0.0, 0, 0, 0
    label_counts = torch.zeros(word_embeddings.shape[0], dtype=torch.long)
    for batch in islice(batches(stream, collator, batch_size), max_batches):
        batch = to_device(batch, device)
        is_masked = batch["labels"] != IGNORE_INDEX
        hidden = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        logits = head(hidden[is_masked], word_embeddings).float()  # (masked, vocab)
        labels = batch["labels"][is_masked]
        loss_sum += nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
        masked += labels.numel()
        label_counts += torch.bincount(labels.cpu(), minlength=len(label_counts))
        count += 1
    model.train(was_training)
    if masked == 0:
        raise BertforgeError("the evaluation data gave no masked tokens")
    loss = loss_sum / masked
    # What a model that knows only token frequencies scores: always the most frequent masked token. Counted on
    # these very labels, so the baseline is, if anything, flattered.
    baseline = label_counts.max().item() / masked
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": correct / masked,
            "frequency_baseline_accuracy": baseline, "masked_tokens": masked, "batches": count}
