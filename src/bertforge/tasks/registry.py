"""The fine-tuning tasks by name, and the kinds of model a checkpoint holds.

A task row says how data files become model inputs, which head learns it, and how the head's raw outputs become
answers (decode); `Task.predict` runs a model and decodes, and the server runs the same rows through its batcher
and calls the same `decode`, so every entry point gives one answer. What a given model directory holds (its head,
its task, its settings) is read in checkpoint_contents.py. A new task is one more row: its functions live in its own
module (classification.py, token_classification.py, question_answering.py); finetune.py runs every row the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.errors import ConfigError, check_choice
from bertforge.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.model import BertModel
from bertforge.pretraining.heads import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining
from bertforge.tasks import classification, multi_label, question_answering, reranking, token_classification
from bertforge.tasks.data import Columns, EncodeSettings, Features, TextExample, read_text_examples, row_outputs
from bertforge.tasks.metrics import METRICS


@dataclass(frozen=True)
class Head:
    """A kind of model a checkpoint can hold: its class and Hugging Face's name for what it does."""

    model_class: type[nn.Module]
    onnx_task: str  # optimum's --task name, the ONNX export's
    weights: str | None  # prefix of the head's parameters in a checkpoint; None: a bare encoder


# The kinds of model, by name; a checkpoint is one of them (see inspect_checkpoint).
HEADS: dict[str, Head] = {
    "encoder": Head(BertModel, "feature-extraction", None),
    "sequence_classification": Head(BertForSequenceClassification, "text-classification", "classifier."),
    "token_classification": Head(BertForTokenClassification, "token-classification", "classifier."),
    "question_answering": Head(BertForQuestionAnswering, "question-answering", "qa_outputs."),
}

# bertforge's other models, whose heads no task, pipeline or ONNX export runs, by config.json's "architectures"
# name: to those, a checkpoint of one is its encoder; `export hf` keeps the head, and Python loads it by the class.
OTHER_MODELS: dict[str, type[nn.Module]] = {model_class.__name__: model_class for model_class in (
    BertForPreTraining, BertForMaskedLM, BertForNextSentencePrediction, BertForMultipleChoice)}


@dataclass(frozen=True)
class Task:
    """The steps from data files to metrics that differ between tasks; the trainer and finetune() do the rest.

    head: the key of HEADS that learns it.
    settings: the dataclass of its input and decoding options (max_length and the task's own), held by a
        fine-tuning run's FinetuneConfig.settings; its defaults are the task's.
    read_examples(path, columns, id2label=None, labelled=True, settings=None, format=None) -> examples;
        `id2label` is a fine-tuned model's labels (any other label in the file is an error), `labelled=False`
        reads the inputs only (prediction); `settings` are the task's settings (SQuAD v2 reads unanswerable
        questions); `format` a key of tables.DATA_FORMATS, else data_format decides from the file.
    example(text, text_pair) -> one unlabelled example from texts given on the command line or over HTTP.
    inputs(example) -> what a prediction echoes of its example ({"text": ...}).
    labels(training examples) -> id2label for a new model.
    encode(tokenizer, examples, settings, id2label) -> Features (rows of model inputs, and labels when known).
    outputs(model output) -> the tensors decoding needs, (batch, seq, ...) per token or (batch, ...) per row.
    decode(features, examples, outputs per row, model config) -> one JSON-ready answer per example.
    score(answers, examples, id2label) -> {metric: value}; `main_metric` (higher is better) picks the best model
        unless the run names another of `metrics` (those score may give) or "loss".
    per_label(answers, examples, id2label) -> {label: {"precision", "recall", "f1", "support"}}, for a task whose
        answers are labels (classes, entity types); None for the others.
    confusion(answers, examples, id2label) -> {"labels": [...], "matrix": [[count, ...], ...]}, a row per true
        label and a column per predicted one, for a task with one label per example; None for the others.
    problem_type: config.json's problem_type of its models (a key of heads.LOSSES), when the head needs one.
    calibrate(features, examples, outputs per row, model config) -> EncodeSettings fields chosen on the dev set
        at each evaluation (multi-label's decision threshold), saved with the model they were chosen for.
    """

    name: str
    description: str
    head: str
    main_metric: str
    settings: type[EncodeSettings]
    read_examples: Callable[..., list]
    example: Callable[[str, str | None], Any]
    inputs: Callable[[Any], dict[str, Any]]
    labels: Callable[[Sequence[Any]], dict[int, str]]
    encode: Callable[[Any, Sequence[Any], EncodeSettings, dict[int, str]], Features]
    outputs: Callable[[Any], tuple[torch.Tensor, ...]]
    decode: Callable[[Features, Sequence[Any], Sequence[tuple[torch.Tensor, ...]], Any], list[dict[str, Any]]]
    score: Callable[[Sequence[dict[str, Any]], Sequence[Any], dict[int, str]], dict[str, float]]
    problem_type: str | None = None
    per_label: Callable[[Sequence[dict[str, Any]], Sequence[Any], dict[int, str]],
                        dict[str, dict[str, float | int]]] | None = None
    confusion: Callable[[Sequence[dict[str, Any]], Sequence[Any], dict[int, str]], dict[str, list]] | None = None
    calibrate: Callable[[Features, Sequence[Any], Sequence[tuple[torch.Tensor, ...]], Any],
                        dict[str, Any]] | None = None
    metrics: tuple[str, ...] = ()
    # metric_names(id2label) -> the metrics score gives a model with these labels, where not all of `metrics`
    # (classification: f1 with two labels, macro_f1 with more); None: all of them.
    metric_names: Callable[[dict[int, str]], list[str]] | None = None

    @property
    def model_class(self) -> type[nn.Module]:
        return HEADS[self.head].model_class

    @property
    def learns_classes(self) -> bool:
        """Whether its loss is a cross-entropy over classes, one per example or word (what label smoothing
        smooths), not a regression's, a multi-label's sigmoids or a span's start and end."""
        return self.head in ("sequence_classification", "token_classification") and self.problem_type is None

    def predict(self, model: nn.Module, features: Features, examples: Sequence[Any],
                batch_size: int = 64) -> list[dict[str, Any]]:
        """One answer per example: the model's outputs on every row of `features`, decoded."""
        return self.decode(features, examples, row_outputs(model, features, batch_size, self.outputs), model.config)


def _text_examples(label_kind: str, path: str | Path, columns: Columns, id2label: dict[int, str] | None = None,
                   labelled: bool = True, settings: EncodeSettings | None = None, format: str | None = None) -> list:
    """Classification checks labels against the model's; a regression target is any number."""
    names = list(id2label.values()) if id2label is not None and label_kind != "score" else None
    return read_text_examples(path, columns, label_kind if labelled else None, names, format)


def _text_inputs(example: TextExample) -> dict[str, Any]:
    return {"text": example.text, **({"text_pair": example.text_pair} if example.text_pair is not None else {})}


TASKS: dict[str, Task] = {
    "classification": Task(
        name="classification",
        description="one label per text or text pair (sentiment, paraphrase, entailment)",
        head="sequence_classification",
        main_metric="accuracy",
        settings=classification.ClassificationSettings,
        read_examples=partial(_text_examples, "class"),
        example=TextExample,
        inputs=_text_inputs,
        labels=classification.class_labels,
        encode=classification.encode,
        outputs=classification.outputs,
        decode=classification.decode,
        score=classification.score,
        per_label=classification.per_label,
        confusion=classification.confusion,
        metrics=tuple(METRICS["classification"]),
        metric_names=classification.metric_names,
    ),
    "regression": Task(
        name="regression",
        description="one score per text or text pair (semantic similarity, as STS-B)",
        head="sequence_classification",
        main_metric="spearman",
        settings=classification.ClassificationSettings,
        read_examples=partial(_text_examples, "score"),
        example=TextExample,
        inputs=_text_inputs,
        labels=classification.regression_labels,
        encode=classification.encode,
        outputs=classification.outputs,
        decode=classification.decode,
        score=classification.score,
        problem_type="regression",  # written to config.json: transformers' pipeline then applies no sigmoid
        metrics=tuple(METRICS["regression"]),
    ),
    "multi_label": Task(
        name="multi_label",
        description="any number of labels per text or text pair (topics, tags): a sigmoid per label",
        head="sequence_classification",
        main_metric="micro_f1",
        settings=multi_label.MultiLabelSettings,
        read_examples=partial(_text_examples, "classes"),
        example=TextExample,
        inputs=_text_inputs,
        labels=multi_label.label_names,
        encode=multi_label.encode,
        outputs=classification.outputs,
        decode=multi_label.decode,
        score=multi_label.score,
        per_label=multi_label.per_label,
        problem_type=multi_label.PROBLEM_TYPE,
        calibrate=multi_label.choose_threshold,
        metrics=tuple(METRICS["multi_label"]),
    ),
    "rerank": Task(
        name="rerank",
        description="how relevant a document is to a query: one sigmoid score per pair (a cross-encoder reranker)",
        head="sequence_classification",
        main_metric="ndcg@10",
        settings=classification.ClassificationSettings,
        read_examples=reranking.read_examples,
        example=TextExample,
        inputs=_text_inputs,
        labels=reranking.output_labels,
        encode=reranking.encode,
        outputs=classification.outputs,
        decode=reranking.decode,
        score=reranking.score,
        # binary cross-entropy on the one output, as transformers trains it for this problem_type; its pipeline,
        # sentence-transformers' CrossEncoder and text-embeddings-inference all answer the output's sigmoid
        problem_type="multi_label_classification",
        metrics=tuple(METRICS["reranking"]),
    ),
    "ner": Task(
        name="ner",
        description="a tag per word and the entities they make (CoNLL-2003 named entities)",
        head="token_classification",
        main_metric="f1",
        settings=token_classification.NerSettings,
        read_examples=token_classification.read_sentences,
        example=token_classification.sentence_from_text,
        inputs=token_classification.inputs,
        labels=token_classification.collect_labels,
        encode=token_classification.encode,
        outputs=token_classification.outputs,
        decode=token_classification.decode,
        score=token_classification.score,
        per_label=token_classification.per_label,
        metrics=tuple(METRICS["token_classification"]),
    ),
    "qa": Task(
        name="qa",
        description="the answer to a question as a span of its context (SQuAD v1.1, or v2 with version_2)",
        head="question_answering",
        main_metric="f1",
        settings=question_answering.QASettings,
        read_examples=question_answering.read_examples,
        example=question_answering.example_from_text,
        inputs=question_answering.inputs,
        labels=question_answering.no_labels,
        encode=question_answering.encode,
        outputs=question_answering.outputs,
        decode=question_answering.decode,
        score=question_answering.score,
        metrics=tuple(METRICS["question_answering"]),
    ),
}


def head_of(model: nn.Module) -> str:
    """The HEADS key of an in-memory model: BertForQuestionAnswering -> "question_answering"."""
    head = next((name for name, row in HEADS.items() if isinstance(model, row.model_class)), None)
    if head is None:
        raise ConfigError(f"a {type(model).__name__} is none of the models bertforge's tasks, pipelines and ONNX "
                          f"export run: {', '.join(row.model_class.__name__ for row in HEADS.values())}")
    return head


def task_of_model(model: nn.Module) -> Task | None:
    """The task an in-memory model does by its head (see sequence_task); None for an encoder. A model directory
    says more: inspect_checkpoint."""
    head = head_of(model)
    if head == "sequence_classification":
        return TASKS[sequence_task(model.config.num_labels, model.config.problem_type)]
    return next((row for row in TASKS.values() if row.head == head), None)


def sequence_task(num_labels: int | None, problem_type: str | None) -> str:
    """The task of a sequence classifier: reranking for one sigmoid output (a multi-label problem_type), else the
    task its problem_type names (multi_label), else regression for one output, else classification."""
    if num_labels == 1 and problem_type == TASKS["rerank"].problem_type:
        return "rerank"
    named = next((row.name for row in TASKS.values()
                  if problem_type and row.problem_type == problem_type and row.name != "rerank"), None)
    return named or ("regression" if num_labels == 1 else "classification")


def get_task(name: str) -> Task:
    check_choice(name, TASKS, "task")
    return TASKS[name]

