"""Fine-tuning end to end: data files -> a model directory (tasks/finetuned_model.py loads and uses it).

The output directory is an ordinary checkpoint (config.json with id2label, model.safetensors, vocab.txt,
tokenizer_config.json) that bertforge and transformers both load, plus finetune_config.json (how it was made),
metrics.json (every evaluation and the best one) and train_log.jsonl.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import config_path
from bertforge.checkpoint.train_state import TRAIN_STATE_FILE, check_same_settings
from bertforge.config import FINETUNE_KEY, BertConfig, dropout_overrides
from bertforge.errors import BertforgeError, ConfigError, InputError, check_choice
from bertforge.heads import encoder_of
from bertforge.json_config import JsonConfig, check_field_types, read_json_object
from bertforge.outputs import (
    check_not_in_use,
    check_output_dir,
    finish_staging,
    staging_dir,
    start_staging,
)
from bertforge.runtime import resolve_device, seed_everything, to_device
from bertforge.tasks.checkpoint_contents import RUN_CONFIG_FILE
from bertforge.tasks.data import (
    IGNORE_INDEX,
    Columns,
    EncodeSettings,
    Features,
    check_label_separator,
    inference_batches,
    row_outputs,
    training_batches,
)
from bertforge.tasks.metrics import greater_is_better
from bertforge.tasks.registry import TASKS, Task, get_task
from bertforge.tasks.tables import DATA_FORMATS
from bertforge.tokenizer import BertTokenizer
from bertforge.training import distributed
from bertforge.training.reporting import check_reporters
from bertforge.training.trainer import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    TRAIN_LOG_FILE,
    TrainConfig,
    Trainer,
    model_loss,
    read_log,
)
from bertforge.validation import check_number, check_paths, check_within_positions

logger = logging.getLogger("bertforge")

DEV_LOSS = "loss"  # the name of the dev-set loss among the metrics


def balanced_weights(counts: Sequence[int]) -> list[float]:
    """scikit-learn's class_weight="balanced": rows / (classes x the class's rows), so that every class weighs as
    much in the loss as any other; a class without rows (a head's label absent from this data) keeps 1."""
    present = [count for count in counts if count]
    return [sum(present) / (len(present) * count) if count else 1.0 for count in counts]


# How a run weighs each class's terms of the loss, from the training rows' counts of each label id.
CLASS_WEIGHTS: dict[str, Callable[[Sequence[int]], list[float]]] = {"balanced": balanced_weights}


def label_counts(features: Features, num_labels: int) -> list[int]:
    """Rows (or labelled words) of each label id: the terms of the loss, so a long text's windows count each."""
    counts = [0] * num_labels
    for row in features.rows:
        labels = row["labels"] if isinstance(row["labels"], list) else [row["labels"]]
        for label in labels:
            if label != IGNORE_INDEX:
                counts[label] += 1
    return counts


@dataclass
class FinetuneConfig(JsonConfig):
    """Everything a fine-tuning run needs; `bertforge finetune` flags and `--config run.json` fill it.

    `settings` are the task's own (TASKS[task].settings: max_length, and e.g. qa's doc_stride and n_best). In the
    JSON file they are top-level keys, as every run has written them ({"task": "qa", "max_length": 384,
    "doc_stride": 128, ...}); a "settings" object is read too.
    """

    train: str | None = None  # training data file (.csv, .tsv, .jsonl; CoNLL for ner, SQuAD .json for qa)
    output: str | None = None  # output model directory
    task: str = "classification"
    model: str = "default"  # pre-trained model directory, or "default" (all-MiniLM-L6-v2)
    random_init: bool = False  # model's architecture with fresh weights: the from-scratch baseline
    dropout: float | None = None  # replaces the model's dropout (hidden and attention); None keeps the checkpoint's
    dev: str | None = None  # evaluation data file; without one the final model is kept
    format: str | None = None  # both files' format (a key of DATA_FORMATS); None: each file's extension says
    text_column: str = "sentence"
    text_pair_column: str | None = None
    label_column: str = "label"
    label_separator: str | None = None  # multi_label: what separates labels in a text cell ("|"); JSON lists need none
    settings: EncodeSettings | None = None  # the task's settings; None: its defaults
    batch_size: int = 32
    eval_batch_size: int = 64
    max_train_examples: int | None = None  # use only the first N training examples
    # The dev metric that picks the kept model (one the task reports, or "loss"); None: the task's main metric.
    # Lower is better for a loss, higher for every other metric.
    metric_for_best_model: str | None = None
    # How each class's terms weigh in the loss (a key of CLASS_WEIGHTS: "balanced"); None: all alike
    class_weights: str | None = None
    # The embeddings and the lowest N encoder layers keep their pre-trained weights (with all the layers: only the
    # pooler and the head learn); 0: everything learns
    freeze_layers: int = 0
    training: TrainConfig = field(default_factory=TrainConfig)
    # The settings the run chose on its dev set, not given (multi-label's threshold): the kept model predicts with
    # the chosen values in `settings`, and a run started from this config chooses them again (see to_train).
    chosen_on_dev: tuple[str, ...] = ()

    def __post_init__(self):
        # A config built in Python (fit's, a notebook's) gets the type checks a JSON file gets in from_dict.
        check_field_types(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                          type(self).__name__)
        if isinstance(self.training, dict):
            self.training = TrainConfig.from_dict(self.training, "training")
        kind = get_task(self.task).settings
        if self.settings is None:
            self.settings = kind()
        elif isinstance(self.settings, dict):
            self.settings = kind.from_dict(self.settings, "settings")
        elif type(self.settings) is not kind:
            raise ConfigError(f"settings: task {self.task!r} takes {kind.__name__}, got {type(self.settings).__name__}")
        self.chosen_on_dev = tuple(self.chosen_on_dev)  # JSON's list
        unknown = sorted(set(self.chosen_on_dev) - {f.name for f in dataclasses.fields(self.settings)})
        if unknown:
            raise ConfigError(f"chosen_on_dev: {unknown[0]!r} is no setting of task {self.task!r}")
        check_paths(train=self.train, output=self.output, model=self.model, dev=self.dev)
        check_label_separator(self.label_separator)
        dropout_overrides(self.dropout)  # validates it
        if self.format is not None:
            check_choice(self.format, DATA_FORMATS, "format")
        for name in ("batch_size", "eval_batch_size"):
            check_number(name, getattr(self, name), minimum=1, integer=True)
        check_number("max_train_examples", self.max_train_examples, minimum=1, integer=True, optional=True)
        check_number("freeze_layers", self.freeze_layers, minimum=0, integer=True)
        if self.metric_for_best_model is not None:
            check_choice(self.metric_for_best_model, best_model_metrics(TASKS[self.task]), f"{self.task} metric")
        if self.class_weights is not None:
            check_choice(self.class_weights, CLASS_WEIGHTS, "class_weights")
        for name, value, what in (("label_smoothing", self.training.label_smoothing, "smooth"),
                                  ("class_weights", self.class_weights, "weigh")):
            if value and not TASKS[self.task].learns_classes:
                raise ConfigError(f"{name}: task {self.task!r} has no classes to {what}; "
                                  f"{' and '.join(name for name, task in TASKS.items() if task.learns_classes)} have")

    def to_train(self) -> FinetuneConfig:
        """This config as a new run (or a resumed one) takes it: what an earlier run chose on its dev set is
        chosen again, not fixed at that run's values (a student distilled from the model chooses its own)."""
        if not self.chosen_on_dev:
            return self
        again = dataclasses.replace(self.settings, **dict.fromkeys(self.chosen_on_dev))
        return dataclasses.replace(self, settings=again, chosen_on_dev=())

    @property
    def best_model_metric(self) -> str:
        return self.metric_for_best_model or TASKS[self.task].main_metric

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> FinetuneConfig:
        """A run config; a task setting may also be a top-level key (as older runs wrote them, and as the command
        line's flags arrive), which wins over the same key in "settings"."""
        if isinstance(data, dict):  # the types first: a "task" or "settings" of the wrong kind is read below
            check_field_types(cls, data, source)
            get_task(data.get("task", "classification"))  # before its settings, which an unknown task has none of
        if isinstance(data, dict) and data.get("task", "classification") in TASKS:
            data = dict(data)
            flat = {key: data.pop(key) for key in list(data) if key in SETTING_DEFAULTS}
            if flat or isinstance(data.get("settings"), dict):
                task = data.get("task", "classification")
                data["settings"] = TASKS[task].settings.from_dict(
                    (data.get("settings") or {}) | task_settings(flat, task, source), f"{source}, settings")
        return super().from_dict(data, source)

    def to_dict(self) -> dict[str, Any]:
        """The task's settings as top-level keys, where the field stands."""
        # (chosen_on_dev only where a run chose something: a file that an earlier release reads, otherwise)
        items = [(name, value) for name, value in super().to_dict().items() if name != "chosen_on_dev" or value]
        position = [name for name, _ in items].index("settings")
        return dict(items[:position] + list(items[position][1].items()) + items[position + 1:])

    @property
    def max_length(self) -> int:
        return self.settings.max_length

    @property
    def columns(self) -> Columns:
        return Columns(self.text_column, self.text_pair_column, self.label_column, self.label_separator)


def setting_defaults() -> dict[str, dict[str, Any]]:
    """Every task setting's name -> {task: its default} for the tasks whose settings have it."""
    defaults: dict[str, dict[str, Any]] = {}
    for name, task in TASKS.items():
        for setting in dataclasses.fields(task.settings):
            defaults.setdefault(setting.name, {})[name] = setting.default
    return defaults


SETTING_DEFAULTS = setting_defaults()


def task_settings(flat: dict[str, Any], task: str, source: str) -> dict[str, Any]:
    """The top-level keys of a run config that are settings of `task`: another task's setting at its
    default (older runs wrote every task's) or None (older runs' "the task's default") is dropped; one set to
    something else is an error naming the tasks it belongs to."""
    own = {f.name for f in dataclasses.fields(TASKS[task].settings)}
    kept = {}
    for key, value in flat.items():
        if value is None:
            continue
        if key in own:
            kept[key] = value
        elif value not in SETTING_DEFAULTS[key].values():
            raise ConfigError(f"{source}: {key} is a setting of task {' and '.join(SETTING_DEFAULTS[key])}, "
                              f"not of {task}")
    return kept


def best_model_metrics(task: Task) -> list[str]:
    """What may pick the kept model: a metric the task reports, or the model's own loss on the dev set."""
    return list(dict.fromkeys([*task.metrics, task.main_metric, DEV_LOSS]))


def training_labels(task: Task, examples: Sequence, source: str | Path | None) -> dict[int, str]:
    """The task's labels of the training examples; an error about them names the file they came from. Data that
    names its label numbers (a ClassLabel feature) keeps that numbering, every name included, as transformers'
    run_glue and run_ner keep it: the model's label ids are the data's, even for a name the sample lacks."""
    try:
        labels = task.labels(examples)
    except InputError as error:
        if error.path is None and source is not None:
            raise InputError(str(error), source) from None
        raise
    declared = {getattr(example, "label_names", None) for example in examples}
    if len(declared) == 1 and (names := declared.pop()) and set(labels.values()) <= set(names):
        return dict(enumerate(names))
    return labels


def check_best_model_metric(task: Task, metric: str | None, id2label: dict[int, str]) -> None:
    """Before training: the metric that picks the kept model is one the evaluations of this model will give."""
    if metric is None or metric == DEV_LOSS or task.metric_names is None:
        return
    given = task.metric_names(id2label)
    if metric not in given:
        raise ConfigError(f"--metric-for-best-model {metric}: a {task.name} model with {len(id2label)} labels is "
                          f"scored by {', '.join(given)} (or {DEV_LOSS})")


def dev_loss(model: nn.Module, features: Features, batch_size: int, pad_token_id: int) -> float:
    """The model's own loss on labelled dev rows (dropout off), averaged over rows as training averages a batch."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    for indices, batch in inference_batches(features, batch_size, pad_token_id, keys=list(features.rows[0])):
        total += model_loss(model, to_device(batch, device)).item() * len(indices)
    model.train(was_training)
    return total / len(features)


@dataclass
class FinetuneResult:
    output_dir: Path
    best: dict[str, Any] | None  # metrics of the kept model (None without a dev set)
    history: list[dict[str, Any]]  # every evaluation
    steps: int
    stopped_early: bool
    notes: list[str]  # what the data preparation changed, e.g. how many examples were truncated


def finetune(config: FinetuneConfig, train_examples: Sequence[Any] | None = None,
             dev_examples: Sequence[Any] | None = None, model: nn.Module | None = None,
             loss_fn: Callable[[nn.Module, Any], Any] = model_loss, overwrite: bool = False, resume: bool = False,
             launch: distributed.ProcessInfo | None = None) -> FinetuneResult:
    """Fine-tune `config.model` on the training data and keep the best model on the dev data (by the task's main
    metric, or `config.metric_for_best_model`).

    Examples may be given directly (in memory) instead of `config.train` / `config.dev`. Every data error is
    raised before the model is loaded. `model` (with its labels) trains instead of one loaded from `config.model`
    (whose tokenizer is used), and `loss_fn(model, batch)` replaces the model's own loss: distillation passes its
    student and loss (bertforge.compress.distill). The run writes into OUTPUT.incomplete/ and moves it to OUTPUT
    when it ends; a folder holding a model is replaced only with `overwrite`; `resume` continues a killed run from
    its last checkpoint exactly (the same losses as a run never stopped).

    `launch` is this process's place in a torchrun launch (None: read from torchrun's environment; rank 0 of 1
    without it). With several processes each trains on its shard of every global batch of `batch_size` rows with
    DistributedDataParallel, and rank 0 alone evaluates, saves and writes: the run one process makes of the same
    batches. The process group is joined here (unless the caller has one) and left on return.
    """
    launch = distributed.read_environment() if launch is None else launch
    device = distributed.select_device(config.training.device, launch)
    config = config.to_train()
    with distributed.process_group(launch, device):
        return _finetune(config, train_examples, dev_examples, model, loss_fn, overwrite, resume, launch, device)


def _finetune(config: FinetuneConfig, train_examples: Sequence[Any] | None, dev_examples: Sequence[Any] | None,
              model: nn.Module | None, loss_fn: Callable[[nn.Module, Any], Any], overwrite: bool, resume: bool,
              launch: distributed.ProcessInfo, device) -> FinetuneResult:
    if config.output is None:
        raise ConfigError("an output directory is required (--output, or \"output\" in the run config)")
    if train_examples is None and config.train is None:
        raise ConfigError("training data is required (--train, or \"train\" in the run config)")
    if config.metric_for_best_model is not None and dev_examples is None and config.dev is None:
        # without dev data there is nothing to pick by: the last model is kept, whatever the metric
        raise ConfigError(f"--metric-for-best-model {config.metric_for_best_model} picks the kept model on the dev "
                          "set: give --dev too (without one the last model is kept)")
    # Checked when a run starts, not where a config is read: a model saved by an earlier run still loads.
    if config.label_separator is not None and config.task != "multi_label":
        raise ConfigError(f"label_separator splits a cell into several labels (multi_label); task {config.task} "
                          "reads one label per example")
    if config.training.early_stopping_patience is not None and dev_examples is None and config.dev is None:
        raise ConfigError(f"--early-stopping {config.training.early_stopping_patience} stops when the dev metric "
                          "stops improving: give --dev too")
    resolve_device(config.training.device)
    check_reporters(config.training.report_to)  # a missing tensorboard before the data is read, not after
    output = Path(config.output)
    staging = staging_dir(output)
    if resume:
        check_not_in_use(output)  # a killed run's folder, not a running one's
        finished = finished_run(output, staging)
        if finished is not None:
            check_same_run(config, output / RUN_CONFIG_FILE)
            shutil.rmtree(output / CHECKPOINT_DIR, ignore_errors=True)  # if killed before it was removed
            return finished
        resume = check_resumable(config, staging)
    else:
        check_output_dir(output, overwrite, inputs=(config.train, config.dev), models=(config.model,))
        if (staging / CHECKPOINT_DIR).exists() and not overwrite:
            raise InputError(f"holds a killed run into {output}; pass --resume to continue it, or --overwrite to "
                             "start again", staging)
    task = get_task(config.task)
    # A given model (a distilled student) keeps its labels: the training file must use them, checked as it is read
    # (file, line, field) rather than failing on an unknown label when the rows are encoded.
    known = model.config.id2label if model is not None else None
    if train_examples is None:
        train_examples = task.read_examples(config.train, config.columns, known, settings=config.settings,
                                            format=config.format)
    train_examples = list(train_examples)[:config.max_train_examples]
    id2label = known if known is not None else training_labels(task, train_examples, config.train)
    head_labels = {} if known is not None or config.random_init else checkpoint_labels(config.model)
    if id2label and set(id2label.values()) <= set(head_labels.values()):
        id2label = head_labels  # continuing a fine-tuned model on its own labels: its head's rows keep their meaning
    check_best_model_metric(task, config.metric_for_best_model, id2label)
    if dev_examples is None and config.dev is not None:
        dev_examples = task.read_examples(config.dev, config.columns, id2label, settings=config.settings,
                                          format=config.format)

    tokenizer = BertTokenizer.from_pretrained(config.model)
    train_features = task.encode(tokenizer, train_examples, config.settings, id2label)
    notes = [f"training data: {note}" for note in train_features.notes]
    dev_features = None
    if dev_examples is not None:
        dev_features = task.encode(tokenizer, dev_examples, config.settings, id2label)
        notes += [f"dev data: {note}" for note in dev_features.notes]

    if model is None:
        model = load_task_model(task, config.model, id2label, config.random_init, config.training.seed,
                                config.dropout)
        if head_labels and id2label and head_labels != id2label and len(head_labels) == len(id2label) \
                and hasattr(model, "classifier"):
            # Its head's rows were other labels' (transformers keeps a head of the same size; another is new).
            logger.warning("%s: its classifier (labels %s) starts anew: the training data's labels are other ones",
                           config.model, ", ".join(head_labels.values()))
            model.classifier.apply(model.bert.init_weights)
    freeze_lowest_layers(model, config.freeze_layers)
    if config.max_length != SETTING_DEFAULTS["max_length"][config.task]:  # a choice, not the task's default,
        # which a small model with fewer positions still reads short texts with
        check_within_positions(config.max_length, model.config.max_position_embeddings)
    is_main = launch.rank == 0
    distributed.barrier()  # every process has checked the output folder before the main one changes it
    if is_main:
        start_staging(output, keep=resume)
        dataclasses.replace(config, training=dataclasses.replace(config.training, output_dir=str(output))).save(
            staging / RUN_CONFIG_FILE)
        # Where other tools look: transformers truncates at tokenizer_config.json's model_max_length.
        tokenizer.save_pretrained(staging, model_max_length=config.max_length)
    model.config.extra |= {"finetuning_task": config.task, FINETUNE_KEY: finetune_record(config)}
    training = dataclasses.replace(config.training, output_dir=str(staging))
    if launch.is_distributed:
        training = dataclasses.replace(training, device=str(device))  # cuda: this process's own GPU

    def evaluate(model: nn.Module) -> dict[str, float]:
        metrics = score_features(task, model, dev_features, dev_examples, id2label, config.eval_batch_size,
                                 calibrate=True)
        # config.json records the chosen settings too: the model saved after this evaluation (the best) carries them.
        model.config.extra[FINETUNE_KEY] |= chosen_settings(metrics, config.settings)
        if config.best_model_metric == DEV_LOSS:  # one more pass over the dev set, only when it decides
            metrics[DEV_LOSS] = dev_loss(model, dev_features, config.eval_batch_size, tokenizer.pad_token_id)
        return metrics

    batches = training_batches(train_features, config.batch_size, tokenizer.pad_token_id, training.seed,
                               launch.rank, launch.world_size)
    class_weights = None
    if config.class_weights is not None:
        class_weights = CLASS_WEIGHTS[config.class_weights](label_counts(train_features, len(id2label)))
        logger.info("class weights (%s): %s", config.class_weights,
                    ", ".join(f"{id2label[i]} {weight:.3g}" for i, weight in enumerate(class_weights)))
    trainer = Trainer(model, training, batches, evaluate=evaluate if dev_features is not None else None,
                      main_metric=config.best_model_metric,
                      greater_is_better=greater_is_better(config.best_model_metric),
                      save=lambda model: model.save_pretrained(staging),
                      loss_fn=loss_fn, class_weights=class_weights)
    result = trainer.train(resume=resume)
    if is_main:
        chosen = chosen_settings(result.best or {}, config.settings)
        if chosen:  # the kept model's threshold is the one to predict with
            saved = FinetuneConfig.load(staging / RUN_CONFIG_FILE)
            dataclasses.replace(saved, settings=dataclasses.replace(saved.settings, **chosen),
                                chosen_on_dev=tuple(chosen)).save(staging / RUN_CONFIG_FILE)
        draw_curves(staging, f"fine-tuning: {output}")
        finish_staging(output)  # the run's last step: an interrupted run leaves the earlier model as it was
        # The optimizer state is twice the model. Removed once the run is in place: a kill before that resumes.
        shutil.rmtree(output / CHECKPOINT_DIR, ignore_errors=True)
    return FinetuneResult(output, result.best, result.history, result.steps, result.stopped_early, notes)


def score_features(task: Task, model: nn.Module, features: Features, examples: Sequence[Any],
                   id2label: dict[int, str], batch_size: int = 64, calibrate: bool = False) -> dict[str, float]:
    """The task's metrics of `model` on encoded examples. With `calibrate`, the settings the task chooses on them
    (multi-label's decision threshold, unless the run fixed it) are chosen first, used, and returned among the
    metrics ("threshold")."""
    outputs = row_outputs(model, features, batch_size, task.outputs)
    chosen = {}
    if calibrate and task.calibrate is not None:
        chosen = task.calibrate(features, examples, outputs, model.config)
        features = dataclasses.replace(features, settings=dataclasses.replace(features.settings, **chosen))
    return task.score(task.decode(features, examples, outputs, model.config), examples, id2label) | chosen


def chosen_settings(metrics: dict[str, Any], settings: EncodeSettings) -> dict[str, Any]:
    """The task settings chosen on the dev set among an evaluation's metrics: {"threshold": 0.45} or {}."""
    return {f.name: metrics[f.name] for f in dataclasses.fields(settings) if f.name in metrics}


def draw_curves(directory: Path, title: str) -> None:
    """curves.png from the run's log, where matplotlib is installed (the CLI says when it isn't)."""
    if importlib.util.find_spec("matplotlib") is None:
        return
    from bertforge.training.plot import plot_trainer_run
    try:
        plot_trainer_run(directory, title=title)
    except BertforgeError as error:  # a picture is not worth the trained model
        logger.warning("no curves drawn: %s", error)


def finetune_record(config: FinetuneConfig) -> dict[str, Any]:
    """How inputs were read in training, as config.json records it for other tools (finetune_config.json has all)."""
    return config.settings.to_dict()


# Run settings that a resumed run may change: they don't affect what is computed.
RESUMABLE_CHANGES = frozenset({"output", "train", "dev", "eval_batch_size", "training.progress",
                               "training.output_dir", "training.device", "training.save_every",
                               "training.log_every", "training.report_to"})


def check_resumable(config: FinetuneConfig, staging: Path) -> bool:
    """Whether the killed run in `staging` has a checkpoint to continue from (False: it was killed before its first,
    and starts again). A run resumes only with the settings it started with: anything else would not be the run it
    continues."""
    if not staging.is_dir():
        raise InputError("no killed run to resume here; start the run without --resume", staging)
    if not (staging / CHECKPOINT_DIR / TRAIN_STATE_FILE).is_file():
        if (staging / RUN_CONFIG_FILE).is_file():  # killed before it even saved its settings: nothing to compare
            check_same_run(config, staging / RUN_CONFIG_FILE)
        logger.warning("%s: the run was killed before its first checkpoint; it starts again", staging)
        return False
    check_same_run(config, staging / RUN_CONFIG_FILE)
    return True


def check_same_run(config: FinetuneConfig, saved_config: Path) -> None:
    """The settings of `config` are those a run saved (but for RESUMABLE_CHANGES), else a ConfigError naming one."""
    check_same_settings(FinetuneConfig.load(saved_config).to_train().to_dict(), config.to_train().to_dict(),
                        RESUMABLE_CHANGES, saved_config)


def finished_run(output: Path, staging: Path) -> FinetuneResult | None:
    """The result of a run that already ended (nothing to resume: it is not run or evaluated again)."""
    if staging.exists() or not (output / RUN_CONFIG_FILE).is_file():
        return None
    summary = read_json_object(output / METRICS_FILE, "metrics") if (output / METRICS_FILE).is_file() else {}
    history = summary.get("evaluations", [])
    best = summary.get("best")
    steps = max([record.get("step", 0) for record in read_log(output / TRAIN_LOG_FILE)] or [0])
    return FinetuneResult(output, best, history, steps, False, [f"the run in {output} had already finished"])


def checkpoint_labels(model: str) -> dict[int, str]:
    """The label names a fine-tuned checkpoint's head was trained for; {} for none, or for transformers' default
    names (LABEL_0, LABEL_1, ...), which say nothing of what its rows mean."""
    try:
        id2label = BertConfig.load(config_path(resolve_model_dir(model))).id2label
    except BertforgeError:
        return {}  # loading the model reports it
    return {} if all(label == f"LABEL_{i}" for i, label in id2label.items()) else id2label


def freeze_lowest_layers(model: nn.Module, layers: int) -> None:
    """Keep the embeddings and the lowest `layers` encoder layers of `model` as they are: no gradients, so neither
    the optimizer (optim.parameter_groups leaves them out) nor the backward pass below them spends anything."""
    if not layers:
        return
    encoder = encoder_of(model)
    available = len(encoder.encoder.layers)
    if layers > available:
        raise ConfigError(f"freeze_layers {layers}: the model has {available} layers")
    for part in (encoder.embeddings, *encoder.encoder.layers[:layers]):
        part.requires_grad_(False)


def load_task_model(task: Task, model: str, id2label: dict[int, str], random_init: bool, seed: int,
                    dropout: float | None = None) -> nn.Module:
    """The task's model on the encoder of `model`: pre-trained, or (random_init) freshly initialised with BERT's
    scheme, seeded, so that a pre-trained encoder can be compared with the same architecture trained from scratch.
    A span model (qa) has no labels to name; `dropout` replaces the checkpoint's."""
    overrides = dropout_overrides(dropout)
    if id2label:
        # A fine-tuned model of another number of labels starts a new head on its encoder (said as a warning).
        overrides |= {"id2label": id2label, "label2id": {label: i for i, label in id2label.items()}}
    if task.head == "sequence_classification":  # the task's loss, not one a reused checkpoint's config names
        overrides["problem_type"] = task.problem_type
    seed_everything(seed)  # the new head's initial weights are the seed's: a run repeats, a resumed run matches
    if not random_init:
        from bertforge.compress.quantize import check_not_quantized  # compress builds on the tasks

        loaded = task.model_class.from_pretrained(model, ignore_mismatched_sizes=True, **overrides)
        check_not_quantized(loaded, "fine-tune", model)  # its int8 layers have no gradient: it would barely learn
        return loaded
    config = BertConfig.load(config_path(resolve_model_dir(model)))
    return task.model_class(dataclasses.replace(config, **overrides))
