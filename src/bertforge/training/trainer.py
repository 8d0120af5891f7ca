"""One training loop for every task. It knows nothing about BERT (minGPT's rule): a model, batches, a loss.

Gradient accumulation, clipping, bf16 autocast, evaluation every epoch or every N optimizer steps, the best model
kept through a `save` callback, early stopping, seeding, a progress bar, and metrics written as JSON.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertforge import fast_cpu
from bertforge.atomic import write_text_atomic
from bertforge.checkpoint.pretrained import encoders_of, set_gradient_checkpointing
from bertforge.checkpoint.train_state import load_train_state, restore_rng_states, rng_states, save_train_state
from bertforge.errors import BertforgeError, ConfigError, InputError, check_choice
from bertforge.json_config import JsonConfig
from bertforge.outputs import to_json
from bertforge.progress import progress_bar
from bertforge.runtime import bf16_supported, resolve_device, seed_everything, to_device
from bertforge.training import distributed
from bertforge.training.optim import LR_SCHEDULES, build_optimizer, warmup_schedule
from bertforge.training.reporting import Reporters, report_to_names
from bertforge.training.stopping import Stopped, StopRequests, stop_on_sigterm
from bertforge.validation import MAX_SEED, check_number

logger = logging.getLogger("bertforge")
# What a person follows while a run goes on (each evaluation's metrics); the command line shows it without -v.
progress = logging.getLogger("bertforge.progress")

METRICS_FILE = "metrics.json"
TRAIN_LOG_FILE = "train_log.jsonl"
CHECKPOINT_DIR = "checkpoint"


@dataclass
class TrainConfig(JsonConfig):
    """Optimisation and bookkeeping settings; defaults are BERT's fine-tuning recipe."""

    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_ratio: float = 0.0  # fraction of all optimizer steps spent warming up
    warmup_steps: int | None = None  # overrides warmup_ratio
    lr_schedule: str = "linear"  # after the warm-up (a key of optim.LR_SCHEDULES): linear (BERT's), cosine, constant
    # Below 1, each level down the encoder trains at this factor of the level above's rate (optim.parameter_groups)
    layer_lr_decay: float = 1.0
    # Cross-entropy against labels smoothed towards uniform by this much (transformers' label_smoothing_factor)
    label_smoothing: float = 0.0
    epochs: int = 3
    max_steps: int | None = None  # optimizer steps; overrides epochs
    grad_accumulation: int = 1  # batches per optimizer step
    max_grad_norm: float | None = 1.0  # None or 0: no clipping
    eval_every: int | None = None  # optimizer steps between evaluations; None: after every epoch
    seed: int = 42
    bf16: bool = False  # bf16 autocast, where the hardware supports it
    # Recompute each encoder layer's activations in the backward pass: less memory, about a third more compute.
    gradient_checkpointing: bool = False
    early_stopping_patience: int | None = None  # evaluations without improvement before stopping
    log_every: int = 50  # optimizer steps between lines of the training log
    # Optimizer steps between resumable checkpoints (output_dir/checkpoint); None: after every evaluation only.
    save_every: int | None = None
    output_dir: str | None = None  # where metrics.json, train_log.jsonl and checkpoint/ go; None: nowhere
    # Dashboards that get the log's records too, in output_dir/runs (keys of reporting.REPORTERS: "tensorboard");
    # one name alone is read as a tuple of it, as transformers' report_to="tensorboard"
    report_to: tuple[str, ...] | str | None = None
    progress: bool = True
    device: str | None = None  # None: CUDA when available, else CPU

    def __post_init__(self):
        self.betas = tuple(self.betas)
        self.report_to = report_to_names(self.report_to)
        check_number("lr", self.lr, minimum=0.0, exclusive=True)
        check_number("weight_decay", self.weight_decay, minimum=0.0)
        check_number("eps", self.eps, minimum=0.0, exclusive=True)
        check_number("warmup_ratio", self.warmup_ratio, minimum=0.0)
        if self.warmup_ratio > 1:
            raise ConfigError(f"warmup_ratio must be in [0, 1], got {self.warmup_ratio!r}")
        check_number("warmup_steps", self.warmup_steps, minimum=0, integer=True, optional=True)
        check_choice(self.lr_schedule, LR_SCHEDULES, "lr_schedule")
        check_number("layer_lr_decay", self.layer_lr_decay, minimum=0.0, maximum=1.0, exclusive=True)
        check_number("label_smoothing", self.label_smoothing, minimum=0.0)
        if self.label_smoothing >= 1:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        check_number("epochs", self.epochs, minimum=1, integer=True)
        check_number("max_steps", self.max_steps, minimum=1, integer=True, optional=True)
        check_number("grad_accumulation", self.grad_accumulation, minimum=1, integer=True)
        check_number("max_grad_norm", self.max_grad_norm, minimum=0.0, optional=True)
        check_number("eval_every", self.eval_every, minimum=1, integer=True, optional=True)
        check_number("seed", self.seed, minimum=0, maximum=MAX_SEED, integer=True)
        check_number("early_stopping_patience", self.early_stopping_patience, minimum=1, integer=True,
                     optional=True)
        check_number("log_every", self.log_every, minimum=1, integer=True)
        check_number("save_every", self.save_every, minimum=1, integer=True, optional=True)
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {list(self.betas)!r}")



@dataclass
class TrainResult:
    steps: int  # optimizer steps taken
    best: dict[str, Any] | None  # the evaluation record of the kept model; None without an evaluator
    history: list[dict[str, Any]] = field(default_factory=list)  # every evaluation record
    stopped_early: bool = False


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines log (none where there is no log yet); see numbered_records."""
    return [record for _, record in numbered_records(path)] if path.is_file() else []


def numbered_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, value) of each line of a JSON-lines log; a torn last line (the run was killed, or is still
    writing it) is dropped, a broken line elsewhere is an error naming the file and line."""
    lines = path.read_text(encoding="utf-8").split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: the write was cut short
                break
            raise InputError("not valid JSON; the log was edited or damaged", path, number) from None
    return records


def keep_log_until(path: Path, step: int, evaluations: int | None = None) -> None:
    """On resume, keep the log lines the checkpoint accounts for: those of the steps up to its own, and of those
    evaluations only its first `evaluations` when given (a final evaluation after the last checkpoint has its
    step). The lines after are about to be computed again; a torn last line is dropped."""
    kept = []
    for record in read_log(path):
        if record.get("event") == "eval" and evaluations is not None:
            if evaluations == 0:
                continue
            evaluations -= 1
        if record.get("step", 0) <= step:
            kept.append(record)
    write_text_atomic(path, "".join(to_json(record) + "\n" for record in kept))


@contextmanager
def recomputing(model: nn.Module, enable: bool) -> Iterator[None]:
    """Gradient checkpointing in `model`'s encoders for a run (when `enable`); each encoder as it was after."""
    if not enable:
        yield
        return
    encoders = encoders_of(model)
    before = [encoder.gradient_checkpointing for encoder in encoders]
    set_gradient_checkpointing(model, True)
    try:
        yield
    finally:
        for encoder, state in zip(encoders, before):
            encoder.gradient_checkpointing = state


def batch_size_of(batch: Any) -> int:
    """Rows in a batch: the first dimension of its first tensor."""
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    return next((value.shape[0] for value in values if isinstance(value, torch.Tensor)), 0)


def model_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The default loss: the model's own, from `model(**batch).loss`."""
    return model(**batch).loss


def class_loss(model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float = 0.0,
               class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of the model's logits against its class labels, with the labels smoothed towards uniform by
    `label_smoothing` (Szegedy et al., 2016; transformers' label_smoothing_factor: (1 - it) x the labels' loss + it x
    the loss averaged over all classes) and each term weighted by its class's weight, the mean taken over the weights
    (torch's CrossEntropyLoss(weight=)). Labels of -100 (padding, later word pieces) count for nothing."""
    labels = batch.get("labels") if isinstance(batch, dict) else None
    if labels is None or labels.is_floating_point():
        raise ConfigError("label smoothing and class weights need class labels (classification, ner); this run's "
                          "batches have " + ("none" if labels is None else
                                             "numbers (a regression's or a multi-label's targets)"))
    logits = model(**{name: value for name, value in batch.items() if name != "labels"}).logits
    weight = None if class_weights is None else class_weights.to(logits.device)
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                       weight=weight, label_smoothing=label_smoothing)


def not_a_number(value: Any) -> bool:
    """NaN, or the null a NaN becomes in JSON (a resumed run's history)."""
    return value is None or isinstance(value, float) and math.isnan(value)


def is_better(value: float, best: float | None, greater_is_better: bool) -> bool:
    """A NaN (e.g. a correlation of constant predictions) is worse than any number."""
    if best is None or (math.isnan(best) and not math.isnan(value)):
        return True
    return value > best if greater_is_better else value < best


class Trainer:
    """Trains `model` on `train_batches` (re-iterated every epoch, with a length).

    `loss_fn(model, batch) -> loss` defaults to the model's own `.loss`; with config.label_smoothing or
    `class_weights` (one per class, by label id), class_loss of its logits. `evaluate(model) -> {metric: value}`
    scores the model (a task's loop over its dev set); `save(model)` is called whenever `main_metric` improves,
    or once at the end when there is no evaluator.

    In a torchrun process group (training.distributed) the model trains in DistributedDataParallel on batches that
    are distributed.Shard's of the global batches; the main process alone evaluates, saves and writes, and the
    others follow its decisions (early stopping), so the run is the one a single process makes of the global
    batches. Outside one, nothing changes.
    """

    def __init__(self, model: nn.Module, config: TrainConfig, train_batches: Iterable,
                 evaluate: Callable[[nn.Module], dict[str, float]] | None = None, main_metric: str | None = None,
                 greater_is_better: bool = True, save: Callable[[nn.Module], None] | None = None,
                 loss_fn: Callable[[nn.Module, Any], torch.Tensor] = model_loss,
                 class_weights: Sequence[float] | None = None):
        if evaluate is not None and main_metric is None:
            raise ConfigError("an evaluator needs the name of the main metric that picks the best model")
        self.model, self.config, self.train_batches = model, config, train_batches
        self.evaluate, self.main_metric, self.greater_is_better = evaluate, main_metric, greater_is_better
        if config.label_smoothing or class_weights is not None:
            if loss_fn is not model_loss:
                raise ConfigError("label smoothing and class weights shape the model's own cross-entropy; this run "
                                  "has a loss of its own (distillation's)")
            loss_fn = partial(class_loss, label_smoothing=config.label_smoothing, class_weights=None
                              if class_weights is None else torch.tensor(class_weights, dtype=torch.float32))
        self.save, self.loss_fn = save, loss_fn
        self.device = resolve_device(config.device)
        self.use_bf16 = config.bf16 and bf16_supported(self.device.type)
        if config.bf16 and not self.use_bf16:
            logger.warning("bf16 was asked for but %s has no native bf16 support; training in float32",
                           self.device.type)
        self.output_dir = Path(config.output_dir) if config.output_dir else None
        if config.report_to and self.output_dir is None:
            raise ConfigError(f"report_to {', '.join(config.report_to)} writes into output_dir/runs: give an "
                              "output_dir")
        self.reporters = Reporters(config.report_to)  # a missing package is an error now, before any training
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None
        self.evaluations_without_improvement = 0

    @property
    def is_main(self) -> bool:
        """Whether this process writes: the only one, or rank 0 of a process group."""
        return distributed.is_main_process()

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.use_bf16 else nullcontext()

    def train(self, resume: bool = False) -> TrainResult:
        """The whole run, with the CPU fast paths (fast_cpu) swapped into the model while it lasts; `resume`
        continues from output_dir/checkpoint exactly where a killed run left off (the same batches, dropout and
        losses as without the stop)."""
        with fast_cpu.accelerated(self.model), recomputing(self.model, self.config.gradient_checkpointing), \
                self.reporters:  # closed (and flushed) however the run ends
            return self.run(resume)

    def run(self, resume: bool = False) -> TrainResult:
        config = self.config
        rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed.is_initialized() else (0, 1)
        # Every process its own dropout masks; the main one draws what a single process draws.
        seed_everything(distributed.rank_seed(config.seed, rank))
        model = self.model.to(self.device)
        optimizer = build_optimizer(model, config.lr, config.weight_decay, config.betas, config.eps,
                                    config.layer_lr_decay)
        num_batches = len(self.train_batches)
        if num_batches == 0:
            raise BertforgeError("no training batches")
        steps_per_epoch = math.ceil(num_batches / config.grad_accumulation)
        total_steps = config.max_steps or config.epochs * steps_per_epoch
        warmup_steps = (config.warmup_steps if config.warmup_steps is not None
                        else round(config.warmup_ratio * total_steps))
        scheduler = warmup_schedule(optimizer, warmup_steps, total_steps, config.lr_schedule)
        # The loop's own state; a checkpoint holds it, so that a resumed run carries on mid-epoch.
        loop = {"epoch": 0, "next_batch": 0, "last_evaluated": -1, "window_loss": 0.0, "window_steps": 0}
        step = 0
        if resume:
            step, loop = self.restore(optimizer, scheduler, rank)
        elif self.output_dir and self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / TRAIN_LOG_FILE).write_text("")
        if self.output_dir and self.is_main and self.reporters.names:  # the log is read again only for them
            self.reporters.start(self.output_dir, step if resume else None, read_log(self.output_dir / TRAIN_LOG_FILE))
        # DDP (in a process group) averages the gradients over the processes; `model` is what is saved and evaluated.
        synced = distributed.wrap_ddp(model, self.device)

        def save_checkpoint() -> None:
            if not self.output_dir:
                return
            # Each process's random state, so that a resumed run draws the dropout masks it would have drawn.
            ranks = distributed.gather_to_main(rng_states()) if world_size > 1 else None
            if self.is_main:
                extra = {"loop": loop, "best": self.best, "history": self.history,
                         "without_improvement": self.evaluations_without_improvement}
                save_train_state(self.output_dir / CHECKPOINT_DIR, model, optimizer, scheduler, step,
                                 data={"ranks": ranks} if ranks else None, extra=json.loads(json.dumps(extra)))

        bar = progress_bar(total=total_steps, initial=step, desc="training", unit="step",
                           enabled=config.progress and self.is_main)
        stop = step >= total_steps or self.is_patience_exhausted()
        if stop and loop["next_batch"] >= num_batches:
            # Checkpointed at the last step, at the end of its epoch: count the epoch as that run went on to.
            loop["epoch"], loop["next_batch"] = loop["epoch"] + 1, 0
        examples, started = 0, time.perf_counter()

        def log_window() -> None:
            """The training loss of the steps since the last line: the global batches', every process's shares of it
            summed. A run that stops before its next line logs it at the stop, before its last checkpoint. Its lr is
            the highest group's (the head's, under layer_lr_decay): the schedule of --lr."""
            window_loss = distributed.all_reduce_sums({"loss": loop["window_loss"]}, self.device)["loss"]
            self.log({"event": "train", "step": step, "epoch": loop["epoch"],
                      "loss": window_loss / loop["window_steps"], "lr": max(scheduler.get_last_lr()),
                      "examples_per_s": examples / (time.perf_counter() - started) * world_size})
            loop["window_loss"], loop["window_steps"] = 0.0, 0

        with stop_on_sigterm(self.device) if self.output_dir else nullcontext(StopRequests(None)) as stop_requested:
            while not stop:
                model.train()
                skip, loop["next_batch"] = loop["next_batch"], 0
                if hasattr(self.train_batches, "set_epoch"):  # a shuffled order of its own for each epoch
                    self.train_batches.set_epoch(loop["epoch"])
                for index, batch in enumerate(self.train_batches):
                    if index < skip:
                        continue  # done before the run was resumed
                    # Batches of one optimizer step are averaged; the last step of an epoch may have fewer of them.
                    window_start = index - index % config.grad_accumulation
                    window = min(config.grad_accumulation, num_batches - window_start)
                    is_last = index + 1 - window_start >= window
                    share = 1.0
                    if isinstance(batch, distributed.Shard):
                        batch, share = batch.batch, batch.share
                    # Micro-batches that don't step keep their gradients local; the last one all-reduces them.
                    with distributed.no_sync(synced, skip=not is_last):
                        with self.autocast():
                            loss = self.loss_fn(synced, to_device(batch, self.device))
                        # DDP averages gradients over processes: x world_size makes the sum of the shares' losses.
                        (loss * (share * world_size) / window).backward()
                    loop["window_loss"] += loss.item() * share / window
                    examples += batch_size_of(batch)
                    if not is_last:
                        continue
                    if config.max_grad_norm:
                        nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    step += 1
                    loop["window_steps"] += 1
                    speed = examples / (time.perf_counter() - started)
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss.item():.4f}", examples_per_s=f"{speed:.1f}")
                    if step % config.log_every == 0 or step == total_steps:
                        log_window()
                    evaluated = bool(config.eval_every and step % config.eval_every == 0)
                    if evaluated:
                        stop, loop["last_evaluated"] = self.evaluate_and_keep(step, loop["epoch"]), step
                    if step >= total_steps:
                        stop = True
                    if stop and loop["window_steps"]:  # stopped early: before the checkpoint, so logged once
                        log_window()
                    loop["next_batch"] = index + 1
                    saved = evaluated or bool(config.save_every and step % config.save_every == 0)
                    if saved:
                        save_checkpoint()
                    if stop:
                        break
                    if stop_requested():  # SIGTERM: the scheduler is about to kill the job
                        if not saved:
                            save_checkpoint()
                        raise Stopped(step, self.output_dir / CHECKPOINT_DIR, stop_requested.signum)
                # a whole epoch is counted, not one stopped part-way (the loop breaks only to stop)
                if not stop or loop["next_batch"] >= num_batches:
                    loop["epoch"] += 1
                    loop["next_batch"] = 0
                if not stop and config.eval_every is None:
                    stop, loop["last_evaluated"] = self.evaluate_and_keep(step, loop["epoch"]), step
                    if stop and loop["window_steps"]:
                        log_window()
                    save_checkpoint()
                if config.max_steps is None and loop["epoch"] >= config.epochs:
                    stop = True
        bar.close()
        stopped_early = self.is_patience_exhausted()
        if loop["last_evaluated"] != step and not stopped_early:
            self.evaluate_and_keep(step, loop["epoch"])  # the final weights compete too
        if self.evaluate is None and self.save is not None and self.is_main:
            self.save(model)
        return TrainResult(steps=step, best=self.best, history=self.history, stopped_early=stopped_early)

    def restore(self, optimizer, scheduler, rank: int = 0) -> tuple[int, dict[str, Any]]:
        """Load output_dir/checkpoint into the model, optimizer, scheduler, RNGs (this process's own), data order
        and evaluation record; the training log keeps its lines up to the checkpoint's step (those after it are
        about to be redone)."""
        if not self.output_dir:
            raise ConfigError("resuming needs the output_dir the run wrote its checkpoint to")
        state = load_train_state(self.output_dir / CHECKPOINT_DIR, self.model, optimizer, scheduler)
        ranks = state.data.get("ranks")
        world_size = dist.get_world_size() if distributed.is_initialized() else 1
        if len(ranks or [None]) != world_size:
            raise ConfigError(f"{self.output_dir / CHECKPOINT_DIR}: the run was started in {len(ranks or [None])} "
                              f"process(es), this one has {world_size}; resume it with as many (torchrun "
                              "--nproc_per_node)")
        if ranks is not None:
            restore_rng_states(ranks[rank])
        extra = state.extra
        self.best, self.history = extra["best"], extra["history"]
        self.evaluations_without_improvement = extra["without_improvement"]
        if self.is_main:
            keep_log_until(self.output_dir / TRAIN_LOG_FILE, state.step, len(self.history))
            logger.info("resuming from step %d", state.step)
        return state.step, extra["loop"]

    def evaluate_and_keep(self, step: int, epoch: int) -> bool:
        """Score the model, save it if it is the best so far, record the metrics; True means stop early.
        In a process group the main process does this alone and tells the others whether to stop."""
        if self.evaluate is None:
            return False
        stop = self.evaluate_and_record(step, epoch) if self.is_main else None
        # every process keeps the main one's record, so that they all stop, checkpoint and return alike
        self.best, self.history, self.evaluations_without_improvement, stop = distributed.broadcast_from_main(
            (self.best, self.history, self.evaluations_without_improvement, stop))
        return stop

    def evaluate_and_record(self, step: int, epoch: int) -> bool:
        with torch.inference_mode(), self.autocast():
            metrics = self.evaluate(self.model)
        self.model.train()
        if self.main_metric not in metrics:
            raise BertforgeError(f"the evaluator gave no {self.main_metric!r} metric (it gave {', '.join(metrics)})")
        record = {"step": step, "epoch": epoch, **metrics}
        if not_a_number(metrics[self.main_metric]) and not any(not_a_number(r.get(self.main_metric))
                                                               for r in self.history):  # said once
            logger.warning("%s is not a number on the dev set (for a correlation: every score the same): an "
                           "evaluation where it is NaN is kept as the best only when every one is (the first)",
                           self.main_metric)
        self.history.append(record)
        best_value = None if self.best is None else self.best[self.main_metric]
        if is_better(metrics[self.main_metric], best_value, self.greater_is_better):
            self.best, self.evaluations_without_improvement = record, 0
            if self.save is not None:
                self.save(self.model)
        else:
            self.evaluations_without_improvement += 1
        progress.info("step %d, dev: %s", step, ", ".join(f"{name}={value:.4f}" for name, value in metrics.items()))
        self.log({"event": "eval", **record})
        if self.output_dir:
            summary = {"main_metric": self.main_metric, "best": self.best, "evaluations": self.history}
            write_text_atomic(self.output_dir / METRICS_FILE, to_json(summary, indent=2) + "\n")
        return self.is_patience_exhausted()

    def is_patience_exhausted(self) -> bool:
        patience = self.config.early_stopping_patience
        return patience is not None and self.evaluations_without_improvement >= patience

    def log(self, record: dict[str, Any]) -> None:
        """Append one JSON line to the training log (a log grows line by line; metrics.json is atomic), and report
        the record to the run's dashboards."""
        if self.output_dir and self.is_main:
            with open(self.output_dir / TRAIN_LOG_FILE, "a", encoding="utf-8") as handle:
                handle.write(to_json(record) + "\n")
            self.reporters.report(record)
