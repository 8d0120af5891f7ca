"""The fine-tuning tasks by name, and the one answer to "what does this checkpoint hold".

A task row says how data files become model inputs, which head learns it, and how the head's raw outputs become
answers (decode); `Task.predict` runs a model and decodes, and the server runs the same rows through its batcher
and calls the same `decode`, so every entry point gives one answer. `inspect_checkpoint` reads a model directory
once for the CLI, the tasks, ONNX export and the server: its head, its task and the settings it was trained with.
A new task is one more row: its functions live in its own module (classification.py, token_classification.py,
question_answering.py); finetune.py runs every row the same way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bertforge.checkpoint.adapters import ADAPTER_CONFIG_FILE, PEFT_TASKS, inspect_base, is_adapter_folder
from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import SAFETENSORS_FILE, check_readable, config_path, read_state_dict
from bertforge.checkpoint.sentence_transformers import TRANSFORMER_CONFIG_FILE
from bertforge.config import FINETUNE_KEY, BertConfig, architectures_of, read_json_object
from bertforge.errors import CheckpointError, ConfigError, check_choice
from bertforge.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.model import BertModel
from bertforge.pretraining.heads import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining
from bertforge.tasks import classification, multi_label, question_answering, token_classification
from bertforge.tasks.data import Columns, EncodeSettings, Features, TextExample, read_text_examples, row_outputs
from bertforge.tasks.metrics import METRICS
from bertforge.tokenizer.files import CONFIG_FILE as TOKENIZER_CONFIG_FILE
from bertforge.tokenizer.files import means_no_limit

if TYPE_CHECKING:
    from bertforge.tasks.finetune import FinetuneConfig


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
        questions); `format` a key of data.DATA_FORMATS, else data_format decides from the file.
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
    """The task of a sequence classifier: the one its problem_type names (multi_label), else regression for one
    output, else classification."""
    named = next((row.name for row in TASKS.values() if problem_type and row.problem_type == problem_type), None)
    return named or ("regression" if num_labels == 1 else "classification")


def get_task(name: str) -> Task:
    check_choice(name, TASKS, "task")
    return TASKS[name]


# --- what a checkpoint holds -------------------------------------------------------------------------------------

RUN_CONFIG_FILE = "finetune_config.json"  # how a fine-tuned model was trained (tasks/finetune.py writes it)


@dataclass(frozen=True)
class Checkpoint:
    """What a model directory holds: the head its weights have, the task it does, and the fine-tuning run's
    settings (max_length, windows, decoding, doc stride, ...) when it has them."""

    directory: Path
    head: str  # a key of HEADS
    task: str | None  # a key of TASKS; None for an encoder without a trained head
    run: FinetuneConfig | None  # its finetune_config.json
    positions: int = 512  # max_position_embeddings: no input may be longer
    architectures: tuple[str, ...] = ()  # config.json's: the classes it was saved from (BertForMaskedLM, ...)
    # config.json's record of a bertforge run: its "finetuning_task" and "bertforge_finetune" (see recorded_settings)
    recorded: tuple[Any, Any] = (None, None)
    stated_length: int | None = None  # the longest input the folder's own files name (see stated_length)

    @property
    def model_class(self) -> type[nn.Module]:
        return HEADS[self.head].model_class

    def task_for(self, task: str | None = None) -> Task:
        """The task to run on this model (`task`, else its own), refused when its head was never trained, or was
        trained for another task sharing the head: its outputs mean something else there (a class's logit is no
        score, a softmax no set of independent labels). The one exception is a multi-label classifier from
        elsewhere whose config.json doesn't say so (no run config, no problem_type): it looks like a classifier."""
        name = task or self.task
        if name is None:
            other = next((model for model in self.architectures if model in OTHER_MODELS), None)
            what = f"a {other}, whose head Python loads as bertforge.{other}" if other else "an encoder"
            raise CheckpointError(f"{self.directory}: the model has no trained task head ({what}: fine-tune it "
                                  f"with `bertforge finetune`, or embed with it)")
        definition = get_task(name)
        if definition.head != self.head:
            raise CheckpointError(f"{self.directory}: task {name!r} needs a trained {definition.head} head; the "
                                  f"model holds a {self.head} {'model' if self.head == 'encoder' else 'head'}")
        if name == self.task or self.task is None:
            return definition
        if self.run is None and (self.task, name) == ("classification", "multi_label"):
            if BertConfig.load(config_path(self.directory)).problem_type is None:
                return definition
        raise ConfigError(f"{self.directory}: the model was fine-tuned for {self.task}, not {name}; --task {name} "
                          f"does not apply to it (leave --task out to run it as {self.task})")

    def settings(self, task: str | None = None) -> FinetuneConfig:
        """The run's settings (with `task` when given), else the task's defaults (see task_defaults)."""
        name = task or self.task
        if self.run is not None:
            return self.run if name in (None, self.run.task) else dataclasses.replace(self.run, task=name)
        defaults = task_defaults(name or "classification", min(self.positions, self.stated_length or self.positions))
        try:
            settings = recorded_settings(defaults.settings, defaults.task, *self.recorded)
        except (ConfigError, TypeError) as error:
            raise CheckpointError(f"{config_path(self.directory)}: {FINETUNE_KEY}: {error}") from None
        return dataclasses.replace(defaults, settings=settings)


def recorded_settings(settings: EncodeSettings, task: str, finetuning_task: Any, record: Any) -> EncodeSettings:
    """`settings` with the values config.json records of a bertforge run of `task` (its "finetuning_task" and
    "bertforge_finetune"), so that a copy without finetune_config.json (`export hf`'s), or a model in memory,
    reads and decodes as the run did; another task's record, or none, leaves them as they are."""
    if finetuning_task != task or not isinstance(record, dict):
        return settings
    known = {field.name for field in dataclasses.fields(settings)}
    return dataclasses.replace(settings, **{key: value for key, value in record.items() if key in known})


WINDOW_SHARES = ("max_query_length", "doc_stride")  # settings measured in tokens of a window


def task_defaults(task: str, limit: int) -> FinetuneConfig:
    """The settings of a task model without a run config (a checkpoint from elsewhere, or made in memory): the
    task's defaults, reading inputs up to `limit` tokens (the model's positions, or less where its files say so),
    as transformers' pipelines and text-embeddings-inference read them; a question-answering model reads its
    windows of run_qa's 384 tokens or fewer."""
    from bertforge.tasks.finetune import FinetuneConfig
    settings = get_task(task).settings()
    windowed = any(hasattr(settings, name) for name in WINDOW_SHARES)
    max_length = min(settings.max_length, limit) if windowed else limit
    # Windows over long contexts shrink with the model: the question's share and the overlap keep their fraction
    # of the window (64 and 128 of 384 by default), so a model of 64 positions still reads contexts.
    scaled = {name: max(1, getattr(settings, name) * max_length // settings.max_length)
              for name in WINDOW_SHARES if hasattr(settings, name)}
    return FinetuneConfig(task=task, settings=dataclasses.replace(settings, max_length=max_length, **scaled))


def stated_length(directory: Path) -> int | None:
    """The longest input a model folder's own files name: sentence-transformers' max_seq_length (an embedding
    model's or cross-encoder's), else the tokenizer's model_max_length; None where neither says (or says "no
    limit")."""
    for name, key in ((TRANSFORMER_CONFIG_FILE, "max_seq_length"), (TOKENIZER_CONFIG_FILE, "model_max_length")):
        path = directory / name
        value = read_json_object(path, "config").get(key) if path.is_file() else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1 and not means_no_limit(value):
            return value
    return None


def _weight_names(directory: Path) -> set[str]:
    if (directory / SAFETENSORS_FILE).is_file():
        from safetensors import safe_open
        check_readable(directory / SAFETENSORS_FILE)
        try:
            with safe_open(directory / SAFETENSORS_FILE, framework="pt") as handle:
                return set(handle.keys())
        except Exception as error:  # safetensors raises its own error types for a damaged header
            raise CheckpointError(f"{directory / SAFETENSORS_FILE}: unreadable weights: {error}") from None
    return set(read_state_dict(directory)[0])


def adapted_checkpoint(directory: Path) -> Checkpoint:
    """A LoRA adapter alone (PEFT's or sentence-transformers' save): what its base model holds, read from this
    folder, where the models load the base with the adapter merged in. An adapter that gives the base another head
    (PEFT's task_type) is merged with `export hf` first, which makes that head."""
    base = inspect_base(directory)
    task_type = read_json_object(directory / ADAPTER_CONFIG_FILE, "adapter config").get("task_type")
    head = PEFT_TASKS.get(task_type, base.head) if isinstance(task_type, str) else base.head
    if head != base.head:
        raise CheckpointError(f"{directory}: a {task_type} adapter over {base.directory}, whose model is a "
                              f"{HEADS[base.head].model_class.__name__}: merge them first with `bertforge export hf "
                              f"--model {base.directory} --adapter {directory} --output MERGED`")
    return dataclasses.replace(base, directory=directory)


def inspect_checkpoint(name_or_path: str | Path) -> Checkpoint:
    """What a model directory (or "default") holds, read from its files without loading the model.

    The head is what the weights have: span outputs (qa_outputs.*) make a question-answering model; a classifier
    is a token classifier when config.json's "architectures" says so (or, without the name, when there is no
    pooler to read [CLS]), and a sequence classifier otherwise; without a task's head, or named as one of
    OTHER_MODELS (whose heads no task runs), an encoder. The task is the fine-tuning run's, else the head's
    (regression for a one-output sequence classifier).
    """
    directory = resolve_model_dir(name_or_path)
    if is_adapter_folder(directory):
        return adapted_checkpoint(directory)
    path = config_path(directory)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable model config: {error}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    names = _weight_names(directory)
    architectures = architectures_of(config, path)
    if any(name in OTHER_MODELS for name in architectures):
        head = "encoder"  # a head no task runs (multiple choice's one-score classifier, pre-training's)
    elif any(name.startswith(HEADS["question_answering"].weights) for name in names):
        head = "question_answering"
    elif any(name.startswith("classifier.") for name in names):
        if BertForTokenClassification.__name__ in architectures:
            head = "token_classification"
        elif BertForSequenceClassification.__name__ in architectures:
            head = "sequence_classification"
        else:
            head = "sequence_classification" if any("pooler." in name for name in names) else "token_classification"
    else:
        head = "encoder"
    run = None
    if (directory / RUN_CONFIG_FILE).is_file():
        from bertforge.tasks.finetune import FinetuneConfig
        run = FinetuneConfig.load(directory / RUN_CONFIG_FILE)
    if run is not None:
        task = run.task
    elif head == "sequence_classification":
        labels = config.get("id2label") or {}
        task = sequence_task(len(labels) or config.get("num_labels"), config.get("problem_type"))
    else:
        task = next((name for name, row in TASKS.items() if row.head == head), None)
    positions = config.get("max_position_embeddings", 512)
    return Checkpoint(directory, head, task, run, positions if isinstance(positions, int) else 512,
                      tuple(architectures), (config.get("finetuning_task"), config.get(FINETUNE_KEY)),
                      stated_length(directory) if run is None else None)
