"""Fewer layers from a fine-tuned model: a student made of every k-th layer of its teacher (DistilBERT, Sanh et al.,
2019), trained on the teacher's soft labels at a temperature beside the true labels (Hinton et al., 2015), with an
optional loss pulling each student layer's hidden states towards its teacher layer's (TinyBERT, Jiao et al., 2020).

The training loop is fine-tuning's (`bertforge.tasks.finetune.finetune` and its Trainer), with the student as the
model and `DistillationLoss` as the loss; the result passes the dev-set gate of `bertforge.compress.gate`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.compress.gate import (
    DEFAULT_MAX_DROP,
    GateReport,
    check_measurable,
    check_output,
    measure,
    write_if_accepted,
)
from bertforge.compress.quantize import check_not_quantized
from bertforge.errors import BertforgeError, ConfigError, InputError
from bertforge.heads import IGNORE_INDEX, every_position
from bertforge.inference.optimize import InferenceOptions
from bertforge.model import reads_packed_tokens
from bertforge.outputs import release_staging, staging_dir
from bertforge.runtime import parse_device
from bertforge.tasks.finetune import RUN_CONFIG_FILE, FinetuneConfig, FinetuneResult, finetune
from bertforge.tasks.finetuned_model import FinetunedModel
from bertforge.tasks.multi_label import PROBLEM_TYPE as MULTI_LABEL_PROBLEM
from bertforge.training import distributed
from bertforge.training.stopping import Stopped
from bertforge.training.trainer import model_loss
from bertforge.validation import check_number

# Tasks whose logits the soft-label loss reads: one vector per example, or one per token.
DISTILLABLE_TASKS = ("classification", "multi_label", "regression", "rerank", "ner")
DISTILL_CONFIG_FILE = "distill_config.json"


# Published recipes use 1 (TinyBERT) to 20 (Hinton et al.); far outside, logits / T or the loss's T^2 leave the
# floating-point range (1e308 overflowed) and the soft labels carry nothing.
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0


@dataclass
class DistillConfig:
    """How the student learns from its teacher; the data and optimisation settings are a FinetuneConfig's."""

    student_layers: int = 3
    temperature: float = 2.0  # softens both distributions, so the teacher's near-misses carry information
    soft_weight: float = 0.5  # weight of the teacher's soft labels; the true labels get 1 - soft_weight
    hidden_weight: float = 0.0  # weight of the hidden-state MSE (TinyBERT); 0: off
    use_teacher: bool = True  # False: the control, the same student trained on the true labels only

    def __post_init__(self):
        check_number("student_layers", self.student_layers, minimum=1, integer=True)
        check_number("temperature", self.temperature, minimum=MIN_TEMPERATURE, maximum=MAX_TEMPERATURE)
        check_number("soft_weight", self.soft_weight, minimum=0.0)
        check_number("hidden_weight", self.hidden_weight, minimum=0.0)
        if self.soft_weight > 1:
            raise ConfigError(f"soft_weight must be in [0, 1], got {self.soft_weight!r}")


def teacher_layers(teacher_count: int, student_count: int) -> list[int]:
    """The teacher layer each student layer starts from: every k-th, ending with the last (whose output the task
    head was trained on). 6 -> 3: [1, 3, 5]; 12 -> 4: [2, 5, 8, 11]."""
    if student_count > teacher_count:  # as many is self-distillation (a "born-again" network), which may gain
        raise ConfigError(f"a student of {student_count} layers has more than its teacher ({teacher_count} layers): "
                          f"a student is cut from the teacher's layers")
    return [(i + 1) * teacher_count // student_count - 1 for i in range(student_count)]


def student_from_teacher(teacher: nn.Module, num_layers: int) -> nn.Module:
    """A copy of `teacher` (embeddings, head, pooler) that keeps only the layers `teacher_layers` picks."""
    layers = teacher_layers(teacher.config.num_hidden_layers, num_layers)
    student = type(teacher)(dataclasses.replace(teacher.config, num_hidden_layers=num_layers))
    state = {}
    for name, tensor in teacher.state_dict().items():
        prefix, is_layer, rest = name.partition("encoder.layers.")
        if not is_layer:
            state[name] = tensor
            continue
        index, _, parameter = rest.partition(".")
        if int(index) in layers:
            state[f"{prefix}encoder.layers.{layers.index(int(index))}.{parameter}"] = tensor
    student.load_state_dict(state)
    return student


class LayerOutputs:
    """Records the output of each encoder layer of a model while `recording()`: (tokens, hidden) each, in the packed
    order, which is the same for two models given the same batch."""

    def __init__(self, model: nn.Module):
        self.outputs: list[torch.Tensor] | None = None
        encoder = next(module for module in model.modules() if isinstance(getattr(module, "layers", None),
                                                                          nn.ModuleList))
        for layer in encoder.layers:  # compared packed, as the two models pack the same batch alike
            layer.register_forward_hook(reads_packed_tokens(lambda module, inputs, output: self.record(output)))

    def record(self, output: tuple[torch.Tensor, Any]) -> None:
        if self.outputs is not None:
            self.outputs.append(output[0])

    @contextmanager
    def recording(self):
        self.outputs = []
        try:
            yield self.outputs
        finally:
            self.outputs = None


class DistillationLoss:
    """loss_fn(student, batch) for the Trainer: (1 - soft_weight) x the student's own loss on the true labels
    + soft_weight x T² x KL(teacher || student) at temperature T (for multi-label and reranking, the mean over
    labels of each label's two-way KL; MSE to the teacher's score for regression)
    + hidden_weight x the mean MSE between each student layer's output and its teacher layer's."""

    def __init__(self, teacher: nn.Module, student: nn.Module, config: DistillConfig):
        self.teacher, self.config = teacher.eval(), config
        self.multi_label = getattr(student.config, "problem_type", None) == MULTI_LABEL_PROBLEM
        self.layers = teacher_layers(teacher.config.num_hidden_layers, student.config.num_hidden_layers)
        self.recorders = (LayerOutputs(teacher), LayerOutputs(student)) if config.hidden_weight > 0 else None

    def __call__(self, student: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        self.teacher.to(batch["input_ids"].device)
        with ExitStack() as stack:
            states = [stack.enter_context(recorder.recording()) for recorder in self.recorders or ()]
            if states:
                stack.enter_context(every_position(self.teacher, student))
            with torch.no_grad():
                teacher_logits = self.teacher(**inputs).logits.float()
            output = student(**batch)
        loss = (1 - self.config.soft_weight) * output.loss
        loss = loss + self.config.soft_weight * self.soft_loss(output.logits.float(), teacher_logits, batch["labels"])
        if states:
            teacher_states, student_states = states
            hidden = sum(F.mse_loss(student_states[i].float(), teacher_states[layer].float())
                         for i, layer in enumerate(self.layers))
            loss = loss + self.config.hidden_weight * hidden / len(self.layers)
        return loss

    def soft_loss(self, logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.dim() == 3:  # per token: the positions the task scores (first sub-words), as its own loss does
            scored = labels != IGNORE_INDEX
            logits, teacher_logits = logits[scored], teacher_logits[scored]
        temperature = self.config.temperature
        if self.multi_label:  # independent labels (a reranker's one relevance): each a yes/no, sigmoid(logit / T)
            target = torch.sigmoid(teacher_logits / temperature)
            cross_entropy = F.binary_cross_entropy_with_logits(logits / temperature, target)
            entropy = F.binary_cross_entropy_with_logits(teacher_logits / temperature, target)
            return (cross_entropy - entropy) * temperature ** 2
        if logits.shape[-1] == 1:  # regression: the teacher's score is the soft label
            return F.mse_loss(logits, teacher_logits)
        return F.kl_div(F.log_softmax(logits / temperature, dim=-1), F.log_softmax(teacher_logits / temperature, -1),
                        reduction="batchmean", log_target=True) * temperature ** 2


@dataclass
class DistillResult:
    training: FinetuneResult
    report: GateReport | None  # None without a dev set
    written: bool


def distill(config: FinetuneConfig, distillation: DistillConfig | None = None, max_drop: float = DEFAULT_MAX_DROP,
            launch: distributed.ProcessInfo | None = None) -> DistillResult:
    """Train a student of `distillation.student_layers` layers from the fine-tuned teacher `config.model` on
    `config.train`. With `config.dev` the student is measured beside its teacher and written to `config.output`
    only if the task's metric drops by at most `max_drop` points; without one it is written as trained.

    Under torchrun (`launch`, or torchrun's environment when None) the processes train the student together, as
    `finetune` does, and rank 0 alone measures and writes it; the others return with nothing written. Each process's
    hidden-state loss is a mean over its own tokens, weighted as the task's loss is (by rows, or labelled tokens), so
    with `hidden_weight` the run is close to a single process's rather than the same."""
    distillation = distillation or DistillConfig()
    launch = distributed.read_environment() if launch is None else launch
    if config.output is None:
        raise ConfigError("an output directory is required (--output)")
    output = check_output(config.output)
    check_number("max_drop", max_drop)  # finite (negative: the smaller model must gain that much)
    teacher = FinetunedModel.load(config.model)
    check_not_quantized(teacher.model, "distill", config.model)  # a student is cut from float weights
    if teacher.task.name not in DISTILLABLE_TASKS:
        raise ConfigError(f"distillation covers {', '.join(DISTILLABLE_TASKS)}; the teacher does {teacher.task.name}")
    # the teacher's task; a config written for another one (a library caller's default) takes the teacher's settings
    # (as a new run takes them: what the teacher's run chose on its dev set, its student chooses on its own)
    settings = config.settings if type(config.settings) is teacher.task.settings else teacher.run.to_train().settings
    config = dataclasses.replace(config, task=teacher.task.name, settings=settings)
    if distillation.use_teacher:  # the teacher's run's recipe for the true labels' loss, which distillation replaces
        config = dataclasses.replace(config, class_weights=None,
                                     training=dataclasses.replace(config.training, label_smoothing=0.0))
    student = student_from_teacher(teacher.model, distillation.student_layers)
    examples = None
    if config.dev is not None:  # read and scored before training: a dev set the gate can't use is known at once
        examples = teacher.read(config.dev, config.columns, labelled=True, format=config.format)
        check_measurable(teacher.task.main_metric, teacher.evaluate(examples, config.eval_batch_size), config.dev)
    loss_fn = DistillationLoss(teacher.model, student, distillation) if distillation.use_teacher else model_loss
    output.parent.mkdir(parents=True, exist_ok=True)
    training_dir = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.training."))
    try:
        try:
            result = finetune(dataclasses.replace(config, output=str(training_dir)), model=student, loss_fn=loss_fn,
                              launch=launch)
        except OSError as error:  # a full disk: the student's temporary folders mean nothing to the user
            if not str(error.filename).startswith(str(training_dir)):
                raise
            raise InputError(f"can't write the student: {error.strerror or error}", output) from None
        except Stopped as stop:  # its checkpoint is in the temporary folder, removed below: nothing resumes
            raise BertforgeError(f"stopped by SIGTERM after step {stop.step}; distillation does not resume, and "
                                 f"nothing was written to {output}") from None
        if launch.rank != 0:  # rank 0 saved the student into its own training folder, and measures it there
            return DistillResult(result, None, written=False)
        report = None
        if examples is not None:
            # Both where the student was trained (the teacher went there to teach it; the control's stayed put).
            placement = InferenceOptions(device=str(parse_device(config.training.device)))
            placement.apply(teacher.model)
            trained = FinetunedModel.load(training_dir, inference=placement)
            report = GateReport(teacher.task.main_metric, measure("teacher", teacher, examples, config.eval_batch_size),
                                measure("student", trained, examples, config.eval_batch_size), max_drop)

        def write(folder: Path) -> None:
            shutil.copytree(training_dir, folder, dirs_exist_ok=True)
            run = FinetuneConfig.load(folder / RUN_CONFIG_FILE)  # where it was trained -> where it now lives
            dataclasses.replace(run, output=str(output), training=dataclasses.replace(
                run.training, output_dir=str(output))).save(folder / RUN_CONFIG_FILE)
            (folder / DISTILL_CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(distillation), indent=2) + "\n")

        written = write_if_accepted(report, output, write)
    finally:  # the student's training folder, and the staging folder a failed run leaves beside it to resume
        release_staging(training_dir)
        for folder in (training_dir, staging_dir(training_dir)):
            shutil.rmtree(folder, ignore_errors=True)
    return DistillResult(result, report, written)
