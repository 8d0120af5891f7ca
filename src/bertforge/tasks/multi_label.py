"""Multi-label classification: any number of labels per text (topics, tags), as transformers'
problem_type="multi_label_classification": one sigmoid per label on the pooled [CLS] vector, binary cross-entropy.

Examples and windows are classification's; a label is predicted when its probability is over the decision
threshold, which fine-tuning chooses on the dev set (choose_threshold) and saves with the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from bertforge.errors import ConfigError, InputError
from bertforge.tasks import classification
from bertforge.tasks.data import Features, TextExample
from bertforge.tasks.metrics import LabelScores, compute_metrics, multi_label_micro_f1, multi_label_scores
from bertforge.validation import check_number

PROBLEM_TYPE = "multi_label_classification"  # config.json's problem_type, which transformers reads

# The decision thresholds tried on the dev set: a coarse grid, so the choice does not chase the dev set's noise.
THRESHOLDS = tuple(round(0.05 * step, 2) for step in range(1, 20))  # 0.05 .. 0.95
DEFAULT_THRESHOLD = 0.5


@dataclass
class MultiLabelSettings(classification.ClassificationSettings):
    """Classification's inputs, and the decision threshold: a label applies when its probability is over it."""

    threshold: float | None = None  # None: chosen on the dev set at each evaluation (DEFAULT_THRESHOLD without one)

    def __post_init__(self):
        super().__post_init__()
        check_number("threshold", self.threshold, minimum=0.0, optional=True)
        if self.threshold is not None and self.threshold >= 1.0:
            raise ConfigError(f"threshold must be below 1, got {self.threshold!r}")


def label_names(examples: Sequence[TextExample]) -> dict[int, str]:
    """id2label from every label of the training examples, sorted: [("b", "a"), ("c",), ()] -> {0: a, 1: b, 2: c}."""
    names = {name for example in examples for name in label_tuple(example.label)}
    if len(names) < 2:
        raise InputError(f"multi-label classification needs at least two labels in the training data, found "
                         f"{sorted(names)}")
    return classification.sorted_labels(names)


def label_tuple(labels: Any) -> tuple[str, ...]:
    """A multi-label example's labels: a tuple (or list) of names; a single text is a mistake, not its letters."""
    if not isinstance(labels, tuple | list):
        raise InputError(f"a multi-label example's label is a list of label names, got {labels!r}")
    return tuple(labels)


def multi_hot(labels: tuple[str, ...], label2id: dict[str, int]) -> tuple[float, ...]:
    """A row's targets, one 0/1 per label: ("b",) with {a: 0, b: 1} -> (0.0, 1.0). A tuple, not a list: collate
    stacks it as one value per row instead of padding it like per-token ids. A file's labels were checked as it was
    read, naming the line; examples made in memory are checked here."""
    targets = [0.0] * len(label2id)
    for name in label_tuple(labels):
        if name not in label2id:
            raise InputError(f"label {name!r} is not one of the model's labels ({', '.join(label2id)})")
        targets[label2id[name]] = 1.0
    return tuple(targets)


encode = partial(classification.encode, targets=multi_hot)


def probabilities(features: Features, outputs: Sequence[tuple[torch.Tensor, ...]], num_examples: int
                  ) -> torch.Tensor:
    """(examples, labels) sigmoid of each example's logits (the mean of its windows' logits)."""
    return classification.example_logits(features, outputs, num_examples).sigmoid()


def is_predicted(probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """The one decision rule: a label applies when its probability is over the threshold."""
    return probs > threshold


def decode(features: Features, examples: Sequence[TextExample], outputs: Sequence[tuple[torch.Tensor, ...]],
           config) -> list[dict[str, Any]]:
    """One answer per example: {"labels": {label: p} for every label over the threshold, most probable first,
    "probabilities": {label: p} for all}."""
    threshold = getattr(features.settings, "threshold", None)
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    probs = probabilities(features, outputs, len(examples))
    id2label = config.id2label
    answers = []
    for row, chosen in zip(probs.tolist(), is_predicted(probs, threshold).tolist()):
        over = sorted((i for i in range(len(row)) if chosen[i]), key=lambda i: -row[i])
        answers.append({"labels": {id2label[i]: row[i] for i in over},
                        "probabilities": {id2label[i]: p for i, p in enumerate(row)}})
    return answers


def indicator_rows(label_sets: Sequence[Sequence[str]], id2label: dict[int, str]) -> np.ndarray:
    """(examples, labels) 0/1 matrix, columns in id2label's order."""
    column = {label: j for j, label in enumerate(id2label.values())}
    rows = np.zeros((len(label_sets), len(column)), dtype=np.int64)
    for i, names in enumerate(label_sets):
        rows[i, [column[name] for name in names]] = 1
    return rows


def score(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
          id2label: dict[int, str]) -> dict[str, float]:
    """Micro-F1 (every example-label decision), macro-F1 (the mean of the labels' F1) and subset accuracy."""
    predicted = indicator_rows([list(p["labels"]) for p in predictions], id2label)
    true = indicator_rows([e.label for e in examples], id2label)
    return compute_metrics("multi_label", predicted, true)


def per_label(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
              id2label: dict[int, str]) -> dict[str, LabelScores]:
    """Each label's precision, recall, F1 and support (the examples that carry it), every label listed."""
    predicted = indicator_rows([list(p["labels"]) for p in predictions], id2label)
    true = indicator_rows([e.label for e in examples], id2label)
    return multi_label_scores(predicted, true, list(id2label.values()))


def choose_threshold(features: Features, examples: Sequence[TextExample],
                     outputs: Sequence[tuple[torch.Tensor, ...]], config) -> dict[str, float]:
    """{"threshold": t}: the THRESHOLDS value with the best micro-F1 on these (dev) examples; of equal ones, the
    nearest to 0.5. {} when the run fixed its threshold."""
    if getattr(features.settings, "threshold", None) is not None:
        return {}
    probs = probabilities(features, outputs, len(examples))
    true = indicator_rows([e.label for e in examples], config.id2label)
    scored = [(multi_label_micro_f1(is_predicted(probs, t).numpy(), true), -abs(t - DEFAULT_THRESHOLD), t)
              for t in THRESHOLDS]
    return {"threshold": max(scored)[2]}
