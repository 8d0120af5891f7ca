"""The fine-tuning tasks by name: what a task is (its workflow's steps), and the TASKS table the CLI offers.

A new task is one more row: its functions live in its own module (classification.py, token_classification.py,
question_answering.py); finetune.py runs every row the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.errors import check_choice
from bertforge.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertforge.tasks import classification, question_answering, token_classification
from bertforge.tasks.data import Columns, EncodeSettings, Features, TextExample, read_text_examples


@dataclass(frozen=True)
class Task:
    """The steps from data files to metrics that differ between tasks; the trainer and finetune() do the rest.

    max_length: default tokens per input.
    read_examples(path, columns, id2label=None, labelled=True, settings=None) -> examples; `id2label` is a
        fine-tuned model's labels (any other label in the file is an error), `labelled=False` reads the inputs
        only (prediction); `settings` are the EncodeSettings (SQuAD v2 reads unanswerable questions).
    example(text, text_pair) -> one unlabelled example from texts given on the command line.
    inputs(example) -> what a prediction echoes of its example ({"text": ...}).
    labels(training examples) -> id2label for a new model.
    encode(tokenizer, examples, settings, id2label) -> Features (rows of model inputs, and labels when known).
    predict(model, features, examples, batch_size) -> one JSON-ready answer per example.
    score(answers, examples, id2label) -> {metric: value}; `main_metric` (higher is better) picks the best model.
    """

    name: str
    description: str
    model_class: type[nn.Module]
    main_metric: str
    max_length: int
    read_examples: Callable[..., list]
    example: Callable[[str, str | None], Any]
    inputs: Callable[[Any], dict[str, Any]]
    labels: Callable[[Sequence[Any]], dict[int, str]]
    encode: Callable[[Any, Sequence[Any], EncodeSettings, dict[int, str]], Features]
    predict: Callable[[nn.Module, Features, Sequence[Any], int], list[dict[str, Any]]]
    score: Callable[[Sequence[dict[str, Any]], Sequence[Any], dict[int, str]], dict[str, float]]


def _text_examples(label_kind: str, path: str | Path, columns: Columns, id2label: dict[int, str] | None = None,
                   labelled: bool = True, settings: EncodeSettings | None = None) -> list:
    """Classification checks labels against the model's; a regression target is any number."""
    names = list(id2label.values()) if id2label is not None and label_kind == "class" else None
    return read_text_examples(path, columns, label_kind if labelled else None, names)


def _text_inputs(example: TextExample) -> dict[str, Any]:
    return {"text": example.text, **({"text_pair": example.text_pair} if example.text_pair is not None else {})}


TASKS: dict[str, Task] = {
    "classification": Task(
        name="classification",
        description="one label per text or text pair (sentiment, paraphrase, entailment)",
        model_class=BertForSequenceClassification,
        main_metric="accuracy",
        max_length=128,
        read_examples=partial(_text_examples, "class"),
        example=TextExample,
        inputs=_text_inputs,
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
        max_length=128,
        read_examples=partial(_text_examples, "score"),
        example=TextExample,
        inputs=_text_inputs,
        labels=classification.regression_labels,
        encode=classification.encode,
        predict=classification.predict,
        score=classification.score,
    ),
    "ner": Task(
        name="ner",
        description="a tag per word and the entities they make (CoNLL-2003 named entities)",
        model_class=BertForTokenClassification,
        main_metric="f1",
        max_length=128,
        read_examples=token_classification.read_sentences,
        example=token_classification.sentence_from_text,
        inputs=token_classification.inputs,
        labels=token_classification.collect_labels,
        encode=token_classification.encode,
        predict=token_classification.predict,
        score=token_classification.score,
    ),
    "qa": Task(
        name="qa",
        description="the answer to a question as a span of its context (SQuAD v1.1, or v2 with version_2)",
        model_class=BertForQuestionAnswering,
        main_metric="f1",
        max_length=384,
        read_examples=question_answering.read_examples,
        example=question_answering.example_from_text,
        inputs=question_answering.inputs,
        labels=question_answering.no_labels,
        encode=question_answering.encode,
        predict=question_answering.predict,
        score=question_answering.score,
    ),
}


def get_task(name: str) -> Task:
    check_choice(name, TASKS, "task")
    return TASKS[name]
