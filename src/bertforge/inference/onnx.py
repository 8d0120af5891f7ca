"""ONNX export of the encoder and the BERT task models, checked against PyTorch with ONNX Runtime.

Inputs and outputs carry the names of transformers' ONNX exports, with dynamic batch and sequence axes:
input_ids, attention_mask, token_type_ids (int64, (batch, seq); (batch, choices, seq) for multiple choice) ->
last_hidden_state, pooler_output / logits (a masked-LM model's: per token and word piece) / start_logits,
end_logits. Needs the optional packages onnx, onnxscript
and onnxruntime (pip install bertforge[onnx]).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from bertforge.atomic import atomic_path
from bertforge.errors import BertforgeError, check_choice
from bertforge.runtime import warnings_silenced
from bertforge.validation import readable_length

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
MIN_OPSET = 18  # the oldest opset torch's default (dynamo) exporter targets
DEFAULT_TOLERANCE = 1e-4  # fp32: ONNX Runtime's kernels sum in a different order than PyTorch's
# int8 (a model bertforge.compress quantized, exported as QDQ): a float32 rounding difference can move an activation
# across an int8 step, and ONNX Runtime's fused integer matmul rounds its own way, so the graph and PyTorch differ
# by what quantization itself costs (MiniLM's hidden states reach ~6; measured 0.2 on the padded check batches).
INT8_TOLERANCE = 0.5


@dataclass(frozen=True)
class OnnxTask:
    """How a model's output becomes named tensors, and which of them are per token; the axes of its inputs. Which
    model a task name exports is the head registry's (tasks/registry.py HEADS), or `other_model`'s (a class of its
    OTHER_MODELS, whose head no task runs)."""

    outputs: Callable[[object], dict[str, torch.Tensor | None]]
    per_token: frozenset[str]
    input_axes: tuple[str, ...] = ("batch", "seq")
    other_model: str | None = None


# Hugging Face's task names (optimum's `--task`, HEADS' onnx_task); the CLI's --task choices are these keys.
ONNX_TASKS: dict[str, OnnxTask] = {
    "feature-extraction": OnnxTask(
        lambda out: {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output},
        frozenset({"last_hidden_state"})),
    "text-classification": OnnxTask(lambda out: {"logits": out.logits}, frozenset()),
    "token-classification": OnnxTask(lambda out: {"logits": out.logits}, frozenset({"logits"})),
    "question-answering": OnnxTask(
        lambda out: {"start_logits": out.start_logits, "end_logits": out.end_logits},
        frozenset({"start_logits", "end_logits"})),
    # a masked-LM model's (batch, seq, vocab) word-piece logits: what fills a [MASK], and what a SPLADE model pools
    "fill-mask": OnnxTask(lambda out: {"logits": out.logits}, frozenset({"logits"}), other_model="BertForMaskedLM"),
    # (batch, choices, seq) inputs, each choice read with its question (SWAG); (batch, choices) logits
    "multiple-choice": OnnxTask(lambda out: {"logits": out.logits}, frozenset(),
                                ("batch", "choices", "seq"), "BertForMultipleChoice"),
}


def model_class_of(task: str) -> type[nn.Module]:
    """The model class an ONNX task name exports: "question-answering" -> BertForQuestionAnswering."""
    from bertforge.tasks.registry import HEADS, OTHER_MODELS
    spec = check_task(task)
    if spec.other_model is not None:
        return OTHER_MODELS[spec.other_model]
    return next(head.model_class for head in HEADS.values() if head.onnx_task == task)

# Real sentences of very different lengths (and, paired up, with both segments) for the numerical check.
CHECK_TEXTS = (
    "The cat sat on the mat.",
    "Paris is the capital and most populous city of France, with an estimated population of more than two "
    "million residents in an area of about 105 square kilometres.",
    "It rained.",
    "Super Bowl 50 was an American football game to determine the champion of the National Football League "
    "for the 2015 season; the Denver Broncos defeated the Carolina Panthers 24 to 10 to earn their third title.",
    "A gripping, beautifully acted film that never overstays its welcome.",
    "Where was the game played?",
)


@dataclass
class ExportReport:
    """Where the graph went and how closely ONNX Runtime reproduced PyTorch on real inputs."""

    path: Path
    task: str
    opset: int
    output_names: tuple[str, ...]
    tolerance: float = DEFAULT_TOLERANCE
    # Largest absolute difference per output over every checked batch, at real tokens for per-token outputs.
    differences: dict[str, float] = field(default_factory=dict)
    # (batch, seq) of each checked batch; (batch, choices, seq) for multiple choice
    checked_shapes: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def max_difference(self) -> float:
        return max(self.differences.values(), default=0.0)


def require(module: str):
    """Import an optional dependency of the ONNX tools, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BertforgeError(f"ONNX export needs the package {module!r}: pip install bertforge[onnx]") from None


def task_of(model: nn.Module) -> str:
    """The task name of a model instance, from the head registry: BertForQuestionAnswering -> 'question-answering'."""
    from bertforge.tasks.registry import HEADS, head_of
    other = next((name for name, spec in ONNX_TASKS.items() if spec.other_model == type(model).__name__), None)
    return other if other is not None else HEADS[head_of(model)].onnx_task


def check_task(name: str) -> OnnxTask:
    check_choice(name, ONNX_TASKS, "task", error=BertforgeError)
    return ONNX_TASKS[name]


class _Graph(nn.Module):
    """The model with positional tensor inputs and a tuple of tensor outputs, which is what an exporter traces."""

    def __init__(self, model: nn.Module, outputs: Callable[[object], dict[str, torch.Tensor | None]]):
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, input_ids, attention_mask, token_type_ids):
        named = self.outputs(self.model(input_ids, attention_mask, token_type_ids))
        return tuple(tensor for tensor in named.values() if tensor is not None)


@contextmanager
def exportable(model: nn.Module) -> Iterator[nn.Module]:
    """The model in eval mode, its mode restored on exit (an exported graph keeps every position: see
    BertModel.forward)."""
    from bertforge.compress.int8_linear import QuantizedLinear

    was_training = model.training
    model.eval()
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.packed = None  # torch's prepacked int8 weight can't be traced; the graph uses the int8 buffers
    try:
        yield model
    finally:
        model.train(was_training)


@contextmanager
def float32_weights(model: nn.Module) -> Iterator[nn.Module]:
    """A bf16 model (`bertforge quantize --precision bf16`) in float32 while it is exported and checked, its dtype
    restored on exit: its weights are bf16 values, exact in float32, and ONNX Runtime's CPU kernels are float32
    (it has no bf16 Expand, for one)."""
    dtype = next(model.parameters()).dtype
    if dtype == torch.float32:
        yield model
        return
    model.float()
    try:
        yield model
    finally:
        model.to(dtype)


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's notes about its own internals (missing torchvision ops, deprecations, and onnxscript's
    tracebacks of an opset conversion it gave up, which export_onnx reports in one line)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL if logger.name == "onnxscript" else logging.ERROR)
    try:
        with warnings_silenced():
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def check_batches(tokenizer, max_length: int, texts: Sequence[str] = CHECK_TEXTS,
                  spec: OnnxTask = ONNX_TASKS["feature-extraction"],
                  pairs: bool = True) -> list[dict[str, torch.Tensor]]:
    """Padded real batches of three shapes: all texts, the first one alone (batch 1), and text pairs (unless not
    `pairs`: a model of one segment type reads no pair); for a task of (batch, choices, seq) inputs, questions with
    their choices: two with three choices each, one with two."""
    # On the right whatever the tokenizer's padding_side: BERT reads [CLS] at position 0.
    encode = dict(truncation=True, max_length=max_length, padding=True, padding_side="right", return_tensors="pt")
    if "choices" in spec.input_axes:
        return [choice_batch(tokenizer, texts[:2], texts[2:5], encode), choice_batch(tokenizer, texts[5:6],
                                                                                      texts[:2], encode)]
    half = len(texts) // 2
    batches = [dict(tokenizer(list(texts), **encode)), dict(tokenizer(texts[:1], **encode))]
    if pairs:
        batches.append(dict(tokenizer(list(texts[:half]), list(texts[half:2 * half]), **encode)))
    return batches


def choice_batch(tokenizer, questions: Sequence[str], choices: Sequence[str], encode: dict) -> dict[str, torch.Tensor]:
    """Every question paired with every choice, as (questions, choices, seq) inputs."""
    pairs = [(question, choice) for question in questions for choice in choices]
    rows = tokenizer([question for question, _ in pairs], [choice for _, choice in pairs], **encode)
    return {name: rows[name].view(len(questions), len(choices), -1) for name in INPUT_NAMES}


def export_onnx(model: nn.Module, tokenizer, path: str | Path, task: str | None = None, opset: int | None = None,
                check_texts: Sequence[str] = CHECK_TEXTS, tolerance: float | None = None) -> ExportReport:
    """Export `model` to an ONNX file with dynamic batch and sequence axes, and check it with ONNX Runtime.

    The graph is checked before it replaces `path`: on real padded batches of shapes other than the traced one,
    every output must be within `tolerance` of PyTorch (at real tokens); otherwise nothing is written. A model
    that bertforge.compress quantized to int8 exports as QDQ (int8 weights, DequantizeLinear with one scale per
    output channel; each layer's input quantized and dequantized per tensor, as the int8 kernel does), checked
    within INT8_TOLERANCE unless `tolerance` says otherwise.

    >>> export_onnx(BertModel.from_pretrained("default"), tokenizer, "minilm.onnx").max_difference < 1e-4
    True
    """
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module)
    if opset is not None and opset < MIN_OPSET:
        raise BertforgeError(f"opset {opset} is too old; the exporter writes opset {MIN_OPSET} or newer")
    newest = require("onnx").defs.onnx_opset_version()
    if opset is not None and opset > newest:
        raise BertforgeError(f"opset {opset} is newer than the installed onnx knows (up to {newest})")
    path = Path(path)
    task = task or task_of(model)
    spec = check_task(task)
    if type(model) is not model_class_of(task):
        raise BertforgeError(f"task {task!r} exports a {model_class_of(task).__name__}, got a {type(model).__name__}")
    max_length = readable_length(model, tokenizer)
    device = next(model.parameters()).device
    encode = dict(padding=True, padding_side="right", return_tensors="pt")
    texts = ["Hello world.", "The export traces this pair of sentences.", "And this one."]
    sample = choice_batch(tokenizer, texts[:2], texts, encode) if "choices" in spec.input_axes else \
        tokenizer(texts[:2], **encode)
    sample = tuple(sample[name].to(device) for name in INPUT_NAMES)
    limits = {"batch": 4096, "choices": 64, "seq": model.config.max_position_embeddings}
    axes = {axis: torch.export.Dim(axis, min=1, max=limits[axis]) for axis in spec.input_axes}

    with float32_weights(model):
        with torch.no_grad():
            output_names = tuple(name for name, tensor in spec.outputs(model(*sample)).items() if tensor is not None)
        with exportable(model), torch.no_grad():
            graph = _Graph(model, spec.outputs)
            with _quiet_exporter():
                program = torch.onnx.export(graph, sample, input_names=list(INPUT_NAMES),
                                            output_names=list(output_names),
                                            dynamic_shapes={name: dict(enumerate(axes.values()))
                                                            for name in INPUT_NAMES},
                                            opset_version=opset, dynamo=True, verbose=False,
                                            custom_translation_table=qdq_translations())
        asked, opset = opset, next(entry.version for entry in program.model_proto.opset_import
                                   if entry.domain in ("", "ai.onnx"))
        if asked is not None and opset != asked:  # the exporter writes its own opset, then converts, or gives up
            raise BertforgeError(f"the exporter could not convert its opset {opset} graph to opset {asked}; nothing "
                                 f"was written to {path}: try another --opset, or leave it to the exporter")
        if tolerance is None:
            quantization = getattr(model, "quantization", None)
            tolerance = INT8_TOLERANCE if quantization is not None and quantization.precision == "int8" else \
                DEFAULT_TOLERANCE
        report = ExportReport(path=path, task=task, opset=opset, output_names=output_names, tolerance=tolerance)
        try:
            with atomic_path(path) as temporary:
                program.save(temporary, external_data=False)
                keep_inferable_shapes(temporary)
                try:
                    batches = check_batches(tokenizer, max_length, check_texts, spec,
                                            pairs=model.config.type_vocab_size > 1)
                    compare_with_pytorch(model, temporary, batches, spec, report)
                except Exception as error:
                    if not type(error).__module__.startswith("onnxruntime"):
                        raise
                    # Some opsets the exporter writes, ONNX Runtime can't load or run (its Attention at 23-24, 26).
                    problem = str(error).splitlines()[0][:200]
                    raise BertforgeError(f"ONNX Runtime {require('onnxruntime').__version__} can't run the opset "
                                         f"{opset} graph ({problem}); nothing was written to {path}: try another "
                                         f"--opset, or leave it to the exporter") from None
                if report.max_difference > tolerance:
                    worst = max(report.differences, key=report.differences.get)
                    raise BertforgeError(f"the ONNX graph differs from PyTorch by {report.max_difference:.2e} in "
                                         f"{worst!r} (tolerance {tolerance:.0e}); nothing was written to {path}")
        except OSError as error:
            raise BertforgeError(f"{path}: can't write the ONNX file: {error.strerror or error}") from None
    return report


def keep_inferable_shapes(path: Path) -> None:
    """Keep only the exporter's shapes of the graph's inner values (optional in ONNX) that tools can trust.

    Shapes it records for weights (initializers) go: a weight's shape is in the weight, and a tool that rewrites one
    leaves the copy stale (ONNX Runtime 1.30's quantize_dynamic transposes each Gemm's weight in place and then
    stopped on "Inferred shape and existing shape differ in dimension 0: (384) vs (1536)"). The rest go too where
    ONNX's strict shape inference, as ONNX Runtime's quantizer and optimizers run it, disagrees with one."""
    onnx = require("onnx")
    model = onnx.load(str(path))
    weights = {tensor.name for tensor in model.graph.initializer}
    shapes = [value for value in model.graph.value_info if value.name not in weights]
    changed = len(shapes) < len(model.graph.value_info)
    if changed:
        del model.graph.value_info[:]
        model.graph.value_info.extend(shapes)
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError:
        del model.graph.value_info[:]
        changed = True
    if changed:
        onnx.save(model, str(path))


def qdq_translations() -> dict:
    """ONNX for the per-tensor quantize/dequantize of an int8 layer's input (compress.QuantizedLinear), whose scale
    and zero point are computed in the graph: torch's own translation takes them as constants only; and for the
    per-channel dequantize of its weight, which torch 2.7's exporter has no translation of with any onnxscript
    (0.2.2 to 0.7.0 checked; later torch brings its own)."""
    from onnx import TensorProto
    from onnxscript import opset18 as op
    from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

    def quantize(input, scale, zero_point, quant_min: int, quant_max: int, dtype: int):
        return op.QuantizeLinear(input, scale, op.Cast(zero_point, to=TensorProto.UINT8))

    def dequantize(input, scale, zero_point, quant_min: int, quant_max: int, dtype: int, out_dtype: int = -1):
        return op.DequantizeLinear(input, scale, op.Cast(zero_point, to=TensorProto.UINT8))

    def dequantize_per_channel(input, scales, zero_points, axis: int, quant_min: int, quant_max: int, dtype: int,
                               out_dtype: int = -1):
        return op.DequantizeLinear(input, scales, op.Cast(zero_points, to=TensorProto.INT8), axis=axis)

    decomposed = torch.ops.quantized_decomposed
    return {decomposed.quantize_per_tensor.tensor: quantize, decomposed.dequantize_per_tensor.tensor: dequantize,
            decomposed.dequantize_per_channel.default: dequantize_per_channel}


def onnx_session(path: str | Path, threads: int | None = None, spinning: bool = False):
    """An ONNX Runtime CPU session with `threads` intra-op threads (default: torch's thread count)."""
    onnxruntime = require("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    # ORT's idle workers spin waiting for work by default, and keep spinning after a call returns: in a process that
    # also runs torch they take cores from torch's threads (int8 MiniLM on SST-2, 2 cores: 1.30 s against 1.17 s
    # beside a spinning session), and ORT itself ran no slower without it (1.08 s against 1.11 s alone).
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 4  # fatal only: a graph it can't load or run raises, and the caller says so once
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def compare_with_pytorch(model: nn.Module, onnx_path: Path, batches: list[dict[str, torch.Tensor]],
                         spec: OnnxTask, report: ExportReport) -> None:
    """Run each batch through PyTorch (with token packing, as users run it) and ONNX Runtime; record differences."""
    session = onnx_session(onnx_path)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for inputs in batches:
            with torch.no_grad():
                expected = spec.outputs(model(*(inputs[name].to(device) for name in INPUT_NAMES)))
            actual = session.run(list(report.output_names), {name: inputs[name].numpy() for name in INPUT_NAMES})
            is_real = inputs["attention_mask"].bool()  # (batch, seq)
            for name, values in zip(report.output_names, actual):
                difference = (torch.from_numpy(values) - expected[name].float().cpu()).abs()
                if name in spec.per_token:
                    difference = difference[is_real]  # padding positions are never read
                report.differences[name] = max(report.differences.get(name, 0.0), float(difference.max()))
            report.checked_shapes.append(tuple(inputs["input_ids"].shape))
    finally:
        model.train(was_training)
