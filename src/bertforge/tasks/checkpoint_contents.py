"""What a model directory holds, read once from its files for the CLI, the tasks, ONNX export and the server: the
head its weights have, the task it does, and the settings it was fine-tuned with (`inspect_checkpoint`); a model
fine-tuned elsewhere gets its task's defaults, reading inputs as long as its own files allow (`task_defaults`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from bertforge.checkpoint.adapters import ADAPTER_CONFIG_FILE, PEFT_TASKS, inspect_base, is_adapter_folder
from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import SAFETENSORS_FILE, check_readable, config_path, read_state_dict
from bertforge.checkpoint.sentence_transformers import TRANSFORMER_CONFIG_FILE
from bertforge.config import FINETUNE_KEY, BertConfig, architectures_of
from bertforge.errors import CheckpointError, ConfigError
from bertforge.heads import BertForSequenceClassification, BertForTokenClassification
from bertforge.json_config import read_json_object
from bertforge.tasks.data import MIN_LENGTH, EncodeSettings
from bertforge.tasks.registry import HEADS, OTHER_MODELS, TASKS, Task, get_task, sequence_task
from bertforge.tokenizer.files import CONFIG_FILE as TOKENIZER_CONFIG_FILE
from bertforge.tokenizer.files import means_no_limit

logger = logging.getLogger("bertforge")

if TYPE_CHECKING:
    from bertforge.tasks.finetune import FinetuneConfig


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

    @property
    def trained_on_pairs(self) -> bool | None:
        """Whether the model reads a text pair: a reranker always does; a run of another text task did where it
        named a second column (fit() reads rows in memory by the same columns). None where that is unknown (a model
        from elsewhere) or the task reads its own columns (qa's question and context)."""
        if self.task == "rerank":
            return True
        if self.run is None or self.run.task == "qa":
            return None
        return self.run.text_pair_column is not None

    def task_for(self, task: str | None = None) -> Task:
        """The task to run on this model (`task`, else its own), refused when its head was never trained, or was
        trained for another task sharing the head: its outputs mean something else there (a class's logit is no
        score, a softmax no set of independent labels). The exceptions are models from elsewhere whose config.json
        doesn't say what they are (no run config, no problem_type): a multi-label classifier looks like a classifier,
        and a reranker (an MS MARCO cross-encoder, whose output's sigmoid is its score) like a regressor."""
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
        if self.run is None and (self.task, name) in (("classification", "multi_label"), ("regression", "rerank")):
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
        try:
            value = read_json_object(path, "config").get(key) if path.is_file() else None
        except ConfigError as error:  # the tokenizer's own loading names a broken tokenizer_config.json
            logger.warning("%s; its length is not read", error)
            continue
        if value is None or means_no_limit(value):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= MIN_LENGTH:
            return value
        logger.warning("%s: %s %r is no input length; it is not read", path, key, value)
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
