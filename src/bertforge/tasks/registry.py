"""The fine-tuning tasks by name: what a task is (its workflow's steps), and the TASKS table the CLI offers.

A new task (token classification, question answering) is one more row: its functions live in its own module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.errors import ConfigError
from bertforge.heads import BertForSequenceClassification
from bertforge.tasks import classification
from bertforge.tasks.data import Columns, EncodeSettings, Features, read_text_examples


@dataclass(frozen=True)
class Task:
    """The steps from data files to metrics that differ between tasks; the trainer and finetune() do the rest.

    read_examples(path, columns, id2label=None, labelled=True) -> examples; `id2label` is a fine-tuned model's
        labels (any other label in the file is an error), `labelled=False` reads the inputs only (prediction).
    labels(training examples) -> id2label for a new model.
    encode(tokenizer, examples, settings, id2label) -> Features (rows of model inputs, and labels when known).
    predict(model, features, examples, batch_size) -> one JSON-ready answer per example.
    score(answers, examples, id2label) -> {metric: value}; `main_metric` (higher is better) picks the best model.
    """

    name: str
    description: str
    model_class: type[nn.Module]
    main_metric: str
    read_examples: Callable[..., list]
    labels: Callable[[Sequence[Any]], dict[int, str]]
    encode: Callable[[Any, Sequence[Any], EncodeSettings, dict[int, str]], Features]
    predict: Callable[[nn.Module, Features, Sequence[Any], int], list[dict[str, Any]]]
    score: Callable[[Sequence[dict[str, Any]], Sequence[Any], dict[int, str]], dict[str, float]]


def _text_examples(label_kind: str, path: str | Path, columns: Columns, id2label: dict[int, str] | None = None,
                   labelled: bool = True) -> list:
    """Classification checks labels against the model's; a regression target is any number."""
    names = list(id2label.values()) if id2label is not None and label_kind == "class" else None
    return read_text_examples(path, columns, label_kind if labelled else None, names)


TASKS: dict[str, Task] = {
    "classification": Task(
        name="classification",
        description="one label per text or text pair (sentiment, paraphrase, entailment)",
        model_class=BertForSequenceClassification,
        main_metric="accuracy",
        read_examples=partial(_text_examples, "class"),
        labels=classification.class_labels,
        encode=classification.encode,
        predict=classification.predict,
        score=classification.score,
    ),
    "regression": Task(
        name="regression",
        description="one score per text or text pair (semantic similarity, as STS-B)",
        model_class=BertForSequenceClassification,
        main_metric="spearman",
        read_examples=partial(_text_examples, "score"),
        labels=classification.regression_labels,
        encode=classification.encode,
        predict=classification.predict,
        score=classification.score,
    ),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]
