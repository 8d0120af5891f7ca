"""Smaller weights that keep a model's accuracy: int8 linear layers that keep outlier channels apart, and bf16.

BERT's hidden states carry a few dimensions that are an order of magnitude larger than the rest (in MiniLM
dimension 99 reaches ~30 at the feed-forward input where the median dimension peaks at ~2), and int8 activations
with one scale per tensor spend their range on them. Here each linear layer finds the input channels that
calibration shows largest (8 by default, in the layers where they stand out) and keeps them apart: either in
float32, a thin matmul beside the int8 one (LLM.int8's decomposition), or folded into the int8 product, divided by
how far they reach beyond the other channels with their weight columns multiplied by as much (SmoothQuant's
migration, for those channels only). The rest is int8: weights with one scale per output channel, activations with
one step and zero point per layer, calibrated on a sample of the user's data (static quantization: no pass over
each input to find its range). A few whole layers can stay float32 (`float_layers`): those whose int8 product alone
changes the model's output most on the sample.

The int8 product runs on oneDNN's kernel (VNNI on AVX-512 CPUs, AMX where present: 3-4x a float32 matmul on BERT's
shapes; on AVX2 without VNNI the kernel gets 7-bit weights, which cannot saturate its int16 sums); builds of torch
without oneDNN use its dynamic kernel (fbgemm), which finds the range per call. The kernel also applies the
feed-forward's GELU as it writes its output, which is why the up-projection folds its outliers by default (oneDNN
has no GELU after the addition of a float32 product), and the up-projection writes its output as the
down-projection's uint8 codes where the down-projection keeps no outliers: the widest activation of the layer is
never written in float32; an attention layer's query, key and value, which see the same input, run as one int8
product. SmoothQuant's migration for every channel is an option (`smoothing`); on MiniLM it helped less than
keeping the outliers apart, and hurt the down-projection, whose input follows a GELU.

A quantized model saves as an ordinary checkpoint directory whose config.json notes the quantization
(`quantization_config`) and whose safetensors hold the int8 weights and their scales; `from_pretrained` of that
directory gives the quantized model back.

Shapes: tokens (rows of a packed batch), in (input channels), out (output channels), outliers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge import attention_kernels
from bertforge.activations import ACTIVATIONS, ONEDNN_POST_OPS, Activation
from bertforge.atomic import write_text_atomic
from bertforge.checkpoint.hf_format import CONFIG_FILE, config_path
from bertforge.checkpoint.key_map import ENCODER_PREFIX
from bertforge.compress.gate import (
    DEFAULT_MAX_DROP,
    GateReport,
    Measurement,
    check_measurable,
    check_output,
    measure,
    write_if_accepted,
)
from bertforge.config import check_number, read_json_object
from bertforge.errors import ConfigError, check_choice
from bertforge.heads import every_position
from bertforge.model import BertModel, EncoderLayer, FeedForward, SelfAttention
from bertforge.model_output import ModelOutput
from bertforge.tasks.data import inference_batches
from bertforge.tasks.finetune import RUN_CONFIG_FILE, FinetunedModel

logger = logging.getLogger("bertforge")

# The config.json key that marks a quantized checkpoint (transformers' name for it; transformers skips a method it
# doesn't know, with a warning, so `export hf` refuses int8 rather than write what it would misread).
QUANTIZATION_KEY = "quantization_config"
QUANT_METHOD_PREFIX = "bertforge_"
# int8 activations: a range per layer from calibration, or per batch (what checkpoints before static int8 hold)
ACTIVATION_RANGES = ("static", "dynamic")
# int8: which layers with outlier channels fold them into their weights (see QuantizedLinear.from_linear) rather
# than multiply them in float32 beside the int8 product: none; those followed by an activation (GELU), which can
# then run inside the int8 kernel as it writes its output; all.
OUTLIER_FOLDING = ("none", "activation", "all")


@dataclass
class QuantizationConfig:
    """How a model was made smaller; saved in its config.json under `quantization_config`."""

    precision: str = "int8"  # a key of METHODS
    outlier_channels: int = 8  # int8: input channels per layer kept apart (the largest seen in calibration)
    # int8: a layer has outliers when its largest input channel exceeds this many times the median channel's largest
    # (MiniLM: 10-18x at the feed-forward and pooler inputs, 2-5x elsewhere); other layers skip the float32 path.
    outlier_ratio: float = 6.0
    smoothing: float | None = None  # int8: SmoothQuant's alpha (0-1) migrating range to the weights; None: off
    # int8: the input's range per layer from calibration ("static", oneDNN's kernel) or per batch ("dynamic",
    # fbgemm's kernel, which spends a pass over each input finding it)
    activations: str = "static"
    outlier_folding: str = "activation"  # int8: a key of OUTLIER_FOLDING
    # int8: how many layers stay float32, those whose int8 product alone changes the model's output most on the
    # calibration sample (Intel Neural Compressor's op-wise fallback, ranked without labels: `int8_sensitivity`)
    float_layers: int = 0
    modules: dict[str, int] = dataclasses.field(default_factory=dict)  # int8: quantized layer -> its outliers
    folded: list[str] = dataclasses.field(default_factory=list)  # int8: the layers that folded their outliers
    kept_float: list[str] = dataclasses.field(default_factory=list)  # int8: the float_layers layers, most changed first

    def __post_init__(self):
        check_choice(self.precision, METHODS, "precision")
        check_choice(self.activations, ACTIVATION_RANGES, "activations")
        check_choice(self.outlier_folding, OUTLIER_FOLDING, "outlier_folding")
        for name in ("outlier_channels", "float_layers"):
            check_number(name, getattr(self, name), minimum=0, integer=True)
        check_number("outlier_ratio", self.outlier_ratio, minimum=1)
        check_number("smoothing", self.smoothing, minimum=0, maximum=1, optional=True)

    def to_dict(self) -> dict[str, Any]:
        return {"quant_method": QUANT_METHOD_PREFIX + self.precision, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> QuantizationConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        method = data.get("quant_method", "")
        if not method.startswith(QUANT_METHOD_PREFIX):
            raise ConfigError(f"{source}: quantization method {method!r} is not bertforge's")
        unknown = set(data) - known - {"quant_method"}
        if unknown:
            raise ConfigError(f"{source}: unknown {QUANTIZATION_KEY} key {sorted(unknown)[0]!r}")
        # checkpoints from before static int8 (and before folding) don't say
        data = {"activations": "dynamic", "outlier_folding": "none", **data}
        try:
            return cls(**{key: value for key, value in data.items() if key in known})
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None


# The int8 recipes `bertforge quantize` falls back to, in turn, when the one asked for loses more than --max-drop on
# the dev set (accuracy-driven tuning, as Intel Neural Compressor's): each step more careful than the last, and
# usually slower. Outlier channels folded into the int8 weights coarsen those weights' columns; multiplied in
# float32 they are exact. A range calibrated on a sample can clip an input it did not see; each batch's own cannot.
# (Layers kept in float32, `float_layers`, are not a step: on MiniLM's fine-tuned models int8's error is spread over
# many layers, and on AMX each float32 layer costs more speed than dynamic ranges do; bench/README.md.)
CAREFUL_STEPS: tuple[dict[str, Any], ...] = (
    {"outlier_folding": "none"},
    {"activations": "dynamic"},
)


def recipe_name(config: QuantizationConfig) -> str:
    """A short name for what `config` asks beyond the default int8 recipe (e.g. "int8 outliers float32 dynamic")."""
    if config.precision != "int8":
        return config.precision
    parts = ["int8"]
    count = "" if config.outlier_channels == QuantizationConfig.outlier_channels else f"{config.outlier_channels} "
    if config.outlier_channels == 0:
        parts.append("no outliers")  # nothing kept apart: nothing to fold
    elif count or config.outlier_folding != "activation":
        where = {"none": " float32", "all": " folded everywhere", "activation": ""}[config.outlier_folding]
        parts.append(f"{count}outliers{where}")
    if config.smoothing is not None:
        parts.append(f"smoothing {config.smoothing}")
    if config.float_layers:
        parts.append(f"{config.float_layers} float32 layer{'s' if config.float_layers > 1 else ''}")
    if config.activations == "dynamic":
        parts.append("dynamic")
    return " ".join(parts)


def fallback_recipes(config: QuantizationConfig) -> list[QuantizationConfig]:
    """`config`, then for int8 each step of CAREFUL_STEPS applied on top of the one before (a step that changes
    nothing, such as float32 outliers where none are kept apart, is skipped)."""
    recipes = [config]
    if config.precision == "int8":
        for step in CAREFUL_STEPS:
            careful = dataclasses.replace(recipes[-1], **step)
            if recipe_name(careful) != recipe_name(recipes[-1]):
                recipes.append(careful)
    return recipes


def read_quantization(directory: Path) -> QuantizationConfig | None:
    """The quantization a checkpoint directory records in its config.json, or None for an ordinary one."""
    path = config_path(directory)
    data = read_json_object(path, "config").get(QUANTIZATION_KEY)
    return None if data is None else QuantizationConfig.from_dict(data, str(path))


def find_outliers(input_low: torch.Tensor, input_high: torch.Tensor, count: int, ratio: float) -> torch.Tensor:
    """The `count` input channels of largest magnitude (ascending indices), if the largest exceeds `ratio` times
    the median channel's largest; else none."""
    input_max = torch.maximum(input_low.abs(), input_high.abs())
    has_outliers = bool(input_max.max() > ratio * input_max.median())
    return input_max.topk(min(count, len(input_max)) if has_outliers else 0).indices.sort().values


def quantization_of(input_range: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint8 step and zero point that map (low, high), which holds 0, onto 0-255 with 0 exactly on a code."""
    low, high = input_range
    step = ((high - low) / 255).clamp(min=1e-12)
    return step, torch.round(-low / step).clamp(0, 255).to(torch.long)


def int8_reduce_range() -> bool:
    """Whether an int8 product must leave one operand a bit short: without VNNI the CPU sums pairs of u8 x s8
    products in int16 (vpmaddubsw), which saturates at 255 * 127 * 2; with it (AVX-512 VNNI, AVX-VNNI, AMX)
    products accumulate in int32 and all 8 bits are safe."""
    return not torch.cpu._is_vnni_supported()


@functools.cache
def static_kernel_available() -> bool:
    """Whether oneDNN's int8 linear kernel runs in this build of torch (x86 builds have it): tried once on a
    product small enough to check by hand."""
    if not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return False
    try:
        packed = torch.ops.onednn.qlinear_prepack(torch.tensor([[1, -2], [3, 4]], dtype=torch.int8), None)
        y = torch.ops.onednn.qlinear_pointwise(torch.tensor([[12, 14]], dtype=torch.uint8), 0.5, 10, packed,
                                               torch.ones(2), torch.zeros(2, dtype=torch.long), None, 1.0, 0,
                                               torch.float32, "none", [], "")
    except RuntimeError:
        return False
    return y.tolist() == [[-3.0, 11.0]]  # codes (12, 14) are x = (1, 2): W x = (1 - 4, 3 + 8)


# Without VNNI, oneDNN's int8 kernel costs 130-180 us a call before any arithmetic on MiniLM's shapes (a 2-core AMD
# EPYC with AVX2), 2-4x what fbgemm's static-input kernel takes for up to ~30 rows and 1.15x at 120; from ~480 rows
# oneDNN is 3-9% faster. Products of fewer rows (one sentence, a few; the last layer's [CLS] rows; the pooler) run
# on fbgemm there: the same codes and weights, but the two kernels' float32 rounding differs in the last bit, which
# moves an occasional code of a later layer by one. So on such a CPU a sentence alone and the same sentence in a
# large batch differ slightly (MiniLM: token cosine >= 0.997, mean 0.9997; int8 against fp32 differs ~2x more);
# oneDNN alone gives a sentence the same numbers in any batch. A sentence at a time is ~1.5x faster for it.
SMALL_PRODUCT_ROWS = 256


@functools.cache
def small_product_kernel_available() -> bool:
    """Whether fbgemm's static-input int8 linear (float in, calibrated step and zero point, float out) runs in this
    build of torch: tried once on a product small enough to check by hand."""
    if not hasattr(torch.ops.quantized, "linear_with_input_q_dq_qweight_dq_output_fp32"):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch announces its quantized tensors' move to torchao
            weight = torch._make_per_channel_quantized_tensor(torch.tensor([[1, -2], [3, 4]], dtype=torch.int8),
                                                              torch.ones(2, dtype=torch.double),
                                                              torch.zeros(2, dtype=torch.long), 0)
            packed = torch.ops.quantized.linear_prepack(weight, None)
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(torch.tensor([[1.0, 2.0]]), 0.5, 10,
                                                                              packed)
    except RuntimeError:
        return False
    return y.tolist() == [[-3.0, 11.0]]


class QuantizedLinear(nn.Module):
    """y = W8 (x8 - zero_point) * scales + bias + x[:, outliers] @ W[:, outliers]^T, then the activation.

    x8 = round(x * input_scale / input_step) + zero_point in uint8, with the step and zero point calibrated for the
    layer (`input_range`); the outlier channels leave the int8 product (their codes are the zero point) and the
    float32 one adds them back. `input_scale` is SmoothQuant's 1/s per input channel (0 at the outliers), empty
    without smoothing. The int8 weight has one scale per output channel.
    """

    packed = None  # the kernel's prepacked weight, made on first use from the buffers
    small_packed = None  # fbgemm's, for products of few rows on a CPU without VNNI (SMALL_PRODUCT_ROWS)
    next_input_range: torch.Tensor | None = None  # set by writes_codes: the next layer's input range
    folded = False  # set by from_linear: outlier channels were folded into the int8 weights
    loads = 0  # how many times a state dict was loaded into the layer

    def __init__(self, in_features: int, out_features: int, num_outliers: int, activation: str | None = None,
                 smoothed: bool = False, static: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features))
        # dynamic layers zero their outliers with it (the kernel quantizes what it is given)
        scales_input = smoothed or (not static and num_outliers > 0)
        self.register_buffer("input_scale", torch.ones(in_features if scales_input else 0))
        # static layers: (low, high) of the int8 part's input
        self.register_buffer("input_range", torch.tensor([-1.0, 1.0]) if static else None)
        self.register_buffer("outlier_index", torch.zeros(num_outliers, dtype=torch.long))
        self.register_buffer("outlier_weight", torch.zeros(num_outliers, out_features))  # (outliers, out)

    @classmethod
    def from_linear(cls, linear: nn.Linear, input_low: torch.Tensor, input_high: torch.Tensor, outlier_channels: int,
                    smoothing: float | None = None, outlier_ratio: float = 6.0, static: bool = True,
                    fold_outliers: bool = False, activation: str | None = None) -> QuantizedLinear:
        """Quantize `linear` (followed by `activation`, a name in ACTIVATIONS) given the smallest and largest input
        of each input channel seen in calibration.

        With `fold_outliers`, a layer's outlier channels stay in the int8 product, divided by how far they reach
        beyond the other channels (their weight columns multiplied by as much: SmoothQuant's migration, for those
        channels only), so that no float32 product has to be added before the activation. The cost falls on the
        few output channels with a large weight on an outlier channel, whose int8 weights get a coarser step.
        """
        weight = linear.weight.detach().float()  # (out, in)
        input_max = torch.maximum(input_low.abs(), input_high.abs())
        outliers = find_outliers(input_low, input_high, outlier_channels, outlier_ratio)
        kept = torch.ones(linear.in_features, dtype=torch.bool)  # the channels of the int8 product
        kept[outliers] = False
        smooth = torch.ones(linear.in_features)
        if smoothing is not None:
            spread = input_max.clone()
            spread[outliers] = spread.median()  # outliers leave the int8 product: they must not shape its scales
            smooth = (spread.clamp(min=1e-5) ** smoothing / weight.abs().amax(0).clamp(min=1e-5) ** (1 - smoothing))
            smooth = smooth.clamp(min=1e-5)
        folded = fold_outliers and len(outliers) > 0
        if folded:
            reach = input_max / smooth
            smooth[outliers] *= (reach[outliers] / reach[kept].max()).clamp(min=1)
            outliers, kept = outliers[:0], torch.ones_like(kept)
        module = cls(linear.in_features, linear.out_features, len(outliers), activation,
                     smoothed=smoothing is not None or folded, static=static)
        module.folded = folded
        scaled = weight * smooth  # (out, in): x/s @ (W*s)^T = x @ W^T
        scaled[:, outliers] = 0
        weight_scale = scaled.abs().amax(1).clamp(min=1e-12) / 127
        input_scale = 1 / smooth
        input_scale[outliers] = 0
        # The int8 input's range: the kept channels' (divided by s, which is positive), and 0, where outliers sit.
        zero = torch.zeros(1)
        low = float(torch.cat([(input_low * input_scale)[kept], zero]).min())
        high = float(torch.cat([(input_high * input_scale)[kept], zero]).max())
        with torch.no_grad():
            # Without VNNI the kernel takes 7-bit weights (int8_reduce_range): rounded to every other code here,
            # from the float weights, the halving in packed_weight is exact (halving 8-bit codes rounds twice,
            # which costs ~0.0015 of token cosine on MiniLM). Such a checkpoint gives the same numbers on any CPU.
            grid = 2 if int8_reduce_range() else 1
            codes = grid * torch.round(scaled / (grid * weight_scale[:, None])).clamp(-127 // grid, 127 // grid)
            module.weight.copy_(codes.to(torch.int8))
            module.weight_scale.copy_(weight_scale)
            if len(module.input_scale):
                module.input_scale.copy_(input_scale)
            if static:
                module.input_range.copy_(torch.tensor([low, high]))
            module.outlier_index.copy_(outliers)
            module.outlier_weight.copy_(weight[:, outliers].t())
            if linear.bias is not None:
                module.bias.copy_(linear.bias.detach().float())
        return module

    def input_quantization(self, scaled: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The uint8 step and zero point that map the calibrated input range onto 0-255 (0 exactly on a code), as
        tensors (an exporter traces them from the buffer); the range of `scaled` for a checkpoint without one."""
        if self.input_range is None:
            return quantization_of(torch.stack([scaled.min().clamp(max=0), scaled.max().clamp(min=0)]))
        return quantization_of(self.input_range)

    def runs_static(self) -> bool:
        """Whether this layer runs on the static kernel: calibrated, and in a build of torch that has it."""
        return self.input_range is not None and static_kernel_available()

    def kernel_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The int8 weight and its per-channel scales as the kernel takes them: 7-bit without VNNI, which keeps
        255 * 64 * 2 within the int16 sums (int8_reduce_range), 8-bit with it."""
        if int8_reduce_range():
            return torch.round(self.weight / 2).to(torch.int8), self.weight_scale * 2
        return self.weight, self.weight_scale

    def packed_weight(self):
        if self.packed is None:
            weight, scale = self.kernel_weight()
            if self.runs_static():
                zero_points = torch.zeros(self.out_features, dtype=torch.long)  # symmetric weights
                step, zero_point = (number.item() for number in self.input_quantization(None))
                output = (1.0, 0, torch.float32)  # the output's step, zero point and dtype: float32
                if self.next_input_range is not None:
                    output = (*(number.item() for number in quantization_of(self.next_input_range)), torch.uint8)
                self.packed = (torch.ops.onednn.qlinear_prepack(weight, None), scale, zero_points, step, zero_point,
                               *output)
            else:
                self.packed = self.fbgemm_packed_weight()
        return self.packed

    def fbgemm_packed_weight(self):
        """The int8 weight, its per-channel scales and the bias prepacked for torch's fbgemm kernels."""
        weight, scale = self.kernel_weight()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch announces its quantized tensors' move to torchao
            weight = torch._make_per_channel_quantized_tensor(weight, scale.double(),
                                                              torch.zeros(self.out_features, dtype=torch.long), 0)
            return torch.ops.quantized.linear_prepack(weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:  # codes the layer before wrote at this layer's input step (see `writes_codes`)
            return self.static_product(x)
        x = x.float()
        scaled = x * self.input_scale if len(self.input_scale) else x
        if torch.compiler.is_exporting():
            y = self.quantize_dequantize(scaled)
        elif self.runs_static():
            if self.fuses_activation():
                return self.static_product(scaled, *ONEDNN_POST_OPS[self.activation])
            y = self.static_product(scaled)
        else:
            y = self.dynamic_product(scaled)
        if len(self.outlier_index):
            outliers = x.index_select(-1, self.outlier_index)  # (..., outliers)
            y.view(-1, self.out_features).addmm_(outliers.reshape(-1, len(self.outlier_index)), self.outlier_weight)
        return y if self.activation is None else ACTIVATIONS[self.activation](y)

    def fuses_activation(self) -> bool:
        """Whether the static kernel applies the activation as it writes its output: it can, unless a float32
        outlier product must be added first (oneDNN's int8 kernel has no activation after an addition)."""
        return self.activation in ONEDNN_POST_OPS and not len(self.outlier_index)

    def takes_codes(self) -> bool:
        """Whether this layer can take its input as uint8 codes written by the layer before: a static layer whose
        int8 product sees the input as it is (no outlier channels to take out, no smoothing scale to apply)."""
        return self.runs_static() and not len(self.outlier_index) and not len(self.input_scale)

    def writes_codes(self, next_layer: QuantizedLinear | None) -> None:
        """Have this layer write its output as `next_layer`'s uint8 input codes (its calibrated step and zero
        point) rather than in float32, where both allow it; None: float32. For a layer whose output is only that
        layer's input (a feed-forward's up-projection, for its down-projection): it saves a float32 pass and a
        quantizing pass over the widest activation of the model."""
        chains = (next_layer is not None and self.runs_static() and (self.activation is None or self.fuses_activation())
                  and next_layer.takes_codes())
        self.next_input_range = next_layer.input_range if chains else None
        self.packed = self.small_packed = None

    def static_product(self, scaled: torch.Tensor, post_op: str = "none", algorithm: str = "") -> torch.Tensor:
        """The int8 product on oneDNN's kernel, the input quantized with the calibrated step and zero point (or
        given as codes, uint8), and the output passed through `post_op` (a oneDNN eltwise: ONEDNN_POST_OPS) as it
        is written: in float32, or as the next layer's input codes (see `writes_codes`)."""
        weight, weight_scale, weight_zero_points, step, zero_point, *output = self.packed_weight()
        if scaled.dtype != torch.uint8 and self.runs_small(scaled.numel() // self.in_features):
            return self.small_product(scaled, step, zero_point, post_op != "none")
        if scaled.dtype == torch.uint8:
            codes = scaled.reshape(-1, self.in_features)
        else:
            rows = scaled.reshape(-1, self.in_features).contiguous()  # the pooler's [CLS] rows are a strided view
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch announces its quantized tensors' move to torchao (pinned)
                quantized = torch.quantize_per_tensor(rows, step, zero_point, torch.quint8)  # one pass, rounding too
            # The kernel takes plain uint8 codes: a view of the quantized tensor's storage (int_repr() would copy).
            codes = torch.empty(0, dtype=torch.uint8).set_(quantized.untyped_storage(), quantized.storage_offset(),
                                                           quantized.shape, quantized.stride())
            if len(self.outlier_index):
                codes.index_fill_(-1, self.outlier_index, zero_point)  # outliers: 0 here, added back in float32
        y = torch.ops.onednn.qlinear_pointwise(codes, step, zero_point, weight, weight_scale, weight_zero_points,
                                               self.bias, *output, post_op, [], algorithm)
        return y.view(*scaled.shape[:-1], self.out_features)

    def runs_small(self, rows: int) -> bool:
        """Whether a product of `rows` rows runs on fbgemm's static-input kernel (see SMALL_PRODUCT_ROWS), as every
        product does while inference/replay.py records the model as a graph (oneDNN's takes arguments the recorder
        can't hold)."""
        return ((attention_kernels.recording_for_replay or rows < SMALL_PRODUCT_ROWS and int8_reduce_range())
                and not torch.compiler.is_compiling() and small_product_kernel_available())

    def recorded_weight(self):
        """The prepacked weight a recorded graph of this layer reads (fbgemm's), made now if not yet."""
        if not self.runs_static():
            return self.packed_weight()
        if self.small_packed is None:
            self.small_packed = self.fbgemm_packed_weight()
        return self.small_packed

    def small_product(self, scaled: torch.Tensor, step: float, zero_point: int, activate: bool) -> torch.Tensor:
        """The static int8 product on fbgemm: the input quantized with the calibrated step and zero point (the
        outlier channels at 0, as their codes are in static_product), the output in float32, then the activation
        when the caller asked the kernel for it. A layer asked to write the next layer's codes writes float32
        instead; the next layer quantizes it with the same step, to the same codes."""
        if self.small_packed is None:
            self.small_packed = self.fbgemm_packed_weight()
        rows = self.without_outliers(scaled).reshape(-1, self.in_features).contiguous()
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(rows, step, zero_point,
                                                                              self.small_packed)
        y = y.view(*scaled.shape[:-1], self.out_features)
        return ACTIVATIONS[self.activation](y) if activate else y

    def without_outliers(self, scaled: torch.Tensor) -> torch.Tensor:
        """The int8 part's float input: the outlier channels at 0, where `input_scale` has not zeroed them already
        (a static layer without smoothing holds none; its kernel path zeroes their codes instead)."""
        if len(self.outlier_index) and not len(self.input_scale):
            return scaled.index_fill(-1, self.outlier_index, 0.0)
        return scaled

    def dynamic_product(self, scaled: torch.Tensor) -> torch.Tensor:
        """The int8 product on torch's dynamic kernel (fbgemm), which quantizes the input with its own range to
        8 bits (without VNNI the weights are the ones cut to 7 bits, as for the static kernel)."""
        return torch.ops.quantized.linear_dynamic(self.without_outliers(scaled), self.packed_weight(), False)

    def quantize_dequantize(self, scaled: torch.Tensor) -> torch.Tensor:
        """The int8 product as an exporter traces it, for ONNX (QDQ): the int8 weight and its per-channel scales
        dequantized, the input quantized to uint8 with the calibrated step and zero point and back, then a float
        matmul. The static kernel's numbers up to float32 rounding; ONNX Runtime fuses the pattern into an integer
        matmul (MatMulIntegerToFloat)."""
        from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

        decomposed = torch.ops.quantized_decomposed
        scaled = self.without_outliers(scaled)
        weight = decomposed.dequantize_per_channel(self.weight, self.weight_scale,
                                                   torch.zeros(self.out_features, dtype=torch.long), 0, -127, 127,
                                                   torch.int8)  # (out, in)
        step, zero_point = self.input_quantization(scaled)
        quantized = decomposed.quantize_per_tensor.tensor(scaled, step, zero_point, 0, 255, torch.uint8)
        scaled = decomposed.dequantize_per_tensor.tensor(quantized, step, zero_point, 0, 255, torch.uint8)
        # A leading dimension keeps the product a MatMul in ONNX Runtime's eyes: a 2-D MatMul followed by the bias's
        # Add becomes a float Gemm before its int8 fusions run, and stays float.
        return (scaled.unsqueeze(0) @ weight.t()).squeeze(0) + self.bias

    def _load_from_state_dict(self, *args, **kwargs):
        self.packed = self.small_packed = None  # new weights: prepack again
        self.loads += 1  # and tell a FusedProjections made from them
        super()._load_from_state_dict(*args, **kwargs)

    def __getstate__(self) -> dict:
        # the prepacked weights can't be copied; they are made on use
        return {**self.__dict__, "packed": None, "small_packed": None}

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8, "
                f"outliers={len(self.outlier_index)}" + (f", activation={self.activation}" if self.activation else ""))


class FusedProjections:
    """An attention layer's query, key and value as one int8 product, in the place of SelfAttention.project; key and
    value as one where the queries come from other rows (the last layer's first tokens).

    The three layers see the same input, so calibration gives them the same input range and outlier channels: one
    quantizing pass, one kernel call and one outlier product do the work of three each (MiniLM: ~2.5% of an int8
    model's time on batches of short sentences, a fifth of it on one sentence, where the calls' fixed costs
    dominate). A product is made from the attention layer's layers on first use, and again after any of them loads
    new tensors or is replaced; the layers stay the model's and the checkpoint's. Layers that quantize their input
    differently, layers with hooks (the attention view reads queries and keys by hooks) and graph export run one by
    one.
    """

    def __init__(self, attention: SelfAttention):
        self.attention = attention
        # layer names -> (the layers and how many times each had loaded when the product was made, the product)
        self.products: dict[tuple[str, ...], tuple[tuple, QuantizedLinear | None]] = {}

    @property
    def fused(self) -> QuantizedLinear | None:
        """The query-key-value product, once made (None: not made, or the layers can't be joined)."""
        return self.products.get(("query", "key", "value"), ((), None))[1]

    def __call__(self, x: torch.Tensor, query_input: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        names = ("query", "key", "value") if query_input is None else ("key", "value")
        layers = tuple(getattr(self.attention, name) for name in names)  # as they are now
        fused = self.product(names, layers)
        outputs = (tuple(layer(x) for layer in layers) if fused is None
                   else fused(x).split([layer.out_features for layer in layers], dim=-1))
        return outputs if query_input is None else (self.attention.query(query_input), *outputs)

    def product(self, names: tuple[str, ...], layers: tuple[nn.Module, ...]) -> QuantizedLinear | None:
        """The joint layer for `layers`, made again if they changed; None where they must run one by one. (Under
        torch.compile there is no FusedProjections: `run_int8_eagerly` removes it. A graph recorder other than
        replay's, whose recording module holds `recorded_weights`, can't read the joint layer's weight.)"""
        if (torch.compiler.is_exporting() or (torch.jit.is_tracing() and not attention_kernels.recording_for_replay)
                or not all(isinstance(layer, QuantizedLinear) for layer in layers)
                or any(has_forward_hooks(layer) for layer in layers)):
            return None
        made_from = tuple((layer, layer.loads) for layer in layers)
        if self.products.get(names, ((), None))[0] != made_from:
            with torch.inference_mode(False):  # made within an inference_mode call, it still serves calls with grad
                self.products[names] = (made_from, concatenate(layers))
        return self.products[names][1]


def concatenate(layers: Iterable[QuantizedLinear]) -> QuantizedLinear | None:
    """One static int8 layer computing the outputs of `layers` side by side, if they quantize their input the same
    way (range, outlier channels, smoothing scale) and apply nothing after the product; else None."""
    first, *others = layers = list(layers)
    if not all(layer.runs_static() and layer.activation is None and layer.next_input_range is None
               for layer in layers):
        return None
    if not all(torch.equal(getattr(layer, name), getattr(first, name)) for layer in others
               for name in ("input_range", "outlier_index", "input_scale")):
        return None
    fused = QuantizedLinear(first.in_features, sum(layer.out_features for layer in layers), len(first.outlier_index),
                            smoothed=len(first.input_scale) > 0)
    for name in ("weight", "weight_scale", "bias"):  # the outputs side by side
        setattr(fused, name, torch.cat([getattr(layer, name) for layer in layers]))
    fused.outlier_weight = torch.cat([layer.outlier_weight for layer in layers], dim=1)  # (outliers, out)
    for name in ("input_range", "outlier_index", "input_scale"):  # the input, shared
        setattr(fused, name, getattr(first, name))
    return fused


def has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks
                or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)


def encoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers of the model's encoders (attention, feed-forward, pooler) by name. Task heads stay as
    they are: a few hundred weights at most, and they carry the loss."""
    encoders = [name for name, module in model.named_modules() if isinstance(module, BertModel)]
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and any(name.startswith(f"{encoder}.") or not encoder
                                                     for encoder in encoders)}


@torch.inference_mode()
def calibrate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], names: Iterable[str]
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The smallest and largest input of each input channel of the named linear layers over `batches` (model
    inputs): name -> (low, high), each (in,)."""
    ranges: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(name):
        def hook(module, inputs):
            rows = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            low, high = rows.amin(0), rows.amax(0)
            if name in ranges:
                low, high = torch.minimum(ranges[name][0], low), torch.maximum(ranges[name][1], high)
            ranges[name] = (low, high)
        return hook

    handles = [model.get_submodule(name).register_forward_pre_hook(record(name)) for name in names]
    was_training = model.training
    model.eval()
    try:
        with every_position(model):  # every token's range, so the model stays right wherever its layers are used
            for batch in batches:
                model(**batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    missing = [name for name in names if name not in ranges]
    if missing:
        raise ConfigError(f"calibration never reached {missing[0]}: no calibration batches?")
    return ranges


def calibration_batches(tokenizer, texts: Iterable[str] | None = None, batch_size: int = 16,
                        max_length: int = 128) -> list[dict[str, torch.Tensor]]:
    """Model inputs for `calibrate`: `texts` (default: the bundled real sentences of compress/calibration.py)."""
    from bertforge.compress.calibration import CALIBRATION_SENTENCES

    texts = list(CALIBRATION_SENTENCES if texts is None else texts)
    return [dict(tokenizer(texts[i:i + batch_size], max_length=max_length, padding=True, padding_side="right",
                           return_tensors="pt"))
            for i in range(0, len(texts), batch_size)]


def quantize_int8(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]] | None,
                  config: QuantizationConfig) -> nn.Module:
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("int8 quantization runs on CPU only; load the model on the CPU")
    if batches is None:
        # Random tokens miss most of the outlier channels that real text finds (on MiniLM, 0-6 of 8 per layer).
        raise ConfigError("int8 quantization needs calibration batches: a sample of the data the model will see")
    from bertforge.fast_cpu import make_plain

    make_plain(model)  # quantize the plain nn.Linear layers
    linears = encoder_linears(model)
    narrowest = min(linear.in_features for linear in linears.values())
    if config.outlier_channels >= narrowest:  # the int8 product needs some channels left to multiply
        raise ConfigError(f"outlier_channels must be fewer than a layer's {narrowest} input channels, "
                          f"got {config.outlier_channels}")
    if config.float_layers >= len(linears):
        raise ConfigError(f"float_layers must be fewer than the model's {len(linears)} linear layers, "
                          f"got {config.float_layers}")
    batches = list(batches)
    ranges = calibrate(model, batches, linears)
    before_activation = activation_layers(model, linears)

    def int8_layer(name: str, activation: str | None = None) -> QuantizedLinear:
        fold = config.outlier_folding == "all" or (config.outlier_folding == "activation"
                                                   and name in before_activation)
        return QuantizedLinear.from_linear(linears[name], *ranges[name], config.outlier_channels, config.smoothing,
                                           config.outlier_ratio, static=config.activations == "static",
                                           fold_outliers=fold, activation=activation)

    if config.float_layers:
        sensitivity = int8_sensitivity(model, leading_batches(batches, SENSITIVITY_EXAMPLES), linears, int8_layer)
        config.kept_float = sorted(sensitivity, key=sensitivity.get, reverse=True)[:config.float_layers]
        linears = {name: linear for name, linear in linears.items() if name not in config.kept_float}
    activations = take_activations(model, linears)
    for name in linears:
        quantized = int8_layer(name, activations.get(name))
        replace_module(model, name, quantized)
        config.modules[name] = len(quantized.outlier_index)
        if quantized.folded:
            config.folded.append(name)
    return join_int8_layers(model)


def join_int8_layers(model: nn.Module) -> nn.Module:
    """Each int8 feed-forward's up-projection writes its down-projection's input codes where both allow it, each
    attention layer with int8 query, key and value computes them as one product where they allow it, and small
    batches replay a recorded graph (inference/replay.py)."""
    for module in model.modules():
        if (isinstance(module, FeedForward) and isinstance(module.up, QuantizedLinear)
                and isinstance(module.down, QuantizedLinear)):
            module.up.writes_codes(module.down)
        if isinstance(module, SelfAttention) and isinstance(module.query, QuantizedLinear):
            module.project = FusedProjections(module)
    if small_product_kernel_available():  # the kernel a recorded graph runs
        from bertforge.inference.replay import replay_small_batches
        replay_small_batches(model)
    return model


def recorded_weights(model: nn.Module) -> list:
    """The prepacked weights a recorded graph of `model` reads (made now where not yet), for the recording module
    to hold: the tracer records only what its module tree holds. The model must have run once before (the joint
    query-key-value layers are made on first use)."""
    layers = [module for module in model.modules() if isinstance(module, QuantizedLinear)]
    for attention in model.modules():
        if isinstance(attention, SelfAttention) and isinstance(vars(attention).get("project"), FusedProjections):
            layers += [layer for _, layer in attention.project.products.values() if layer is not None]
    return [layer.recorded_weight() for layer in layers]


def run_int8_eagerly(model: nn.Module) -> nn.Module:
    """Each int8 layer of `model` runs eagerly inside torch.compile, the float32 parts around it compiled: inductor
    cannot lower oneDNN's int8 kernel on a weight prepacked outside the graph (an error at the first batch)."""
    eager_forward = torch.compiler.disable(QuantizedLinear.forward)
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.forward = types.MethodType(eager_forward, module)  # bound as a method: deepcopy rebinds it
        if isinstance(module, SelfAttention):
            vars(module).pop("project", None)  # query, key and value one by one, each eagerly
    return model


def activation_layers(model: nn.Module, names: Iterable[str]) -> dict[str, str]:
    """The layers among `names` that a feed-forward activation follows (up-projections): name -> activation."""
    names = set(names)
    return {f"{name}.up": module.activation.name for name, module in model.named_modules()
            if isinstance(module, FeedForward) and isinstance(module.activation, Activation) and f"{name}.up" in names}


def take_activations(model: nn.Module, names: Iterable[str]) -> dict[str, str]:
    """Each feed-forward activation whose up-projection is among the layers `names`, taken out of its FeedForward
    to be applied by the quantized layer (inside the int8 kernel where it can): layer name -> activation name."""
    taken = activation_layers(model, names)
    for name in taken:
        model.get_submodule(name.removesuffix(".up")).activation = nn.Identity()
    return taken


# How many calibration examples rank the layers for `float_layers` (a model's pass for each linear layer): the
# ranking needs fewer than the input ranges do.
SENSITIVITY_EXAMPLES = 64


def leading_batches(batches: list[dict[str, torch.Tensor]], examples: int) -> list[dict[str, torch.Tensor]]:
    """The first of `batches` holding at least `examples` examples between them (all, if they hold fewer)."""
    taken, count = [], 0
    for batch in batches:
        if count >= examples:
            break
        taken.append(batch)
        count += len(batch["input_ids"])
    return taken


@torch.inference_mode()
def int8_sensitivity(model: nn.Module, batches: list[dict[str, torch.Tensor]], linears: dict[str, nn.Linear],
                     int8_layer: Callable[[str], nn.Module]) -> dict[str, float]:
    """How much each of `linears`, made int8 by `int8_layer` while the rest stay float32, changes the model's
    output on `batches`: name -> squared error over the float32 output's squared norm. It needs no labels, so the
    user's dev set is not spent choosing which layers stay float32.

    Each pass starts where the int8 layer first acts: the encoder layers before it give back what they gave in
    float32 (recorded once) instead of computing it again, so a model with L encoder layers costs about (L + 1) / 2
    of them per linear layer rather than L."""
    layers = [module for module in model.modules() if isinstance(module, EncoderLayer)]
    expected, recorded = [], []  # per batch: the float32 output, and each encoder layer's outputs in call order
    for batch in batches:
        with recording_outputs(layers) as outputs:
            expected.append(model_outputs(model, batch))
        recorded.append(outputs)
    changes = {}
    for name, linear in linears.items():
        upstream = layers_before(model, name, layers)
        replace_module(model, name, int8_layer(name))
        try:
            error = norm = 0.0
            for batch, wanted, outputs in zip(batches, expected, recorded):
                with replaying_outputs(upstream, outputs):
                    got = model_outputs(model, batch)
                for value, want in zip(got, wanted):
                    error += float((value - want).square().sum())
                    norm += float(want.square().sum())
        finally:
            replace_module(model, name, linear)
        changes[name] = error / max(norm, 1e-30)
    return changes


def layers_before(model: nn.Module, name: str, layers: list[nn.Module]) -> list[nn.Module]:
    """The encoder layers whose output cannot depend on the module `name`: those before its own layer in the same
    encoder, or all of its encoder's for one after them (the pooler); for a module outside every encoder (a task
    head), `layers`: all of the model's."""
    path = name.split(".")
    for depth in range(len(path) - 1, 0, -1):
        parent = model.get_submodule(".".join(path[:depth]))
        if isinstance(parent, EncoderLayer):  # the layer list holding it, at its index
            return list(model.get_submodule(".".join(path[:depth - 1])))[:int(path[depth - 1])]
        if isinstance(parent, BertModel):
            return list(parent.encoder.layers)
    return layers


@contextmanager
def recording_outputs(layers: list[nn.Module]) -> Iterator[dict[nn.Module, list[Any]]]:
    """What each of `layers` returns while the block runs, in call order: layer -> [output, ...]."""
    outputs: dict[nn.Module, list[Any]] = {layer: [] for layer in layers}
    handles = [layer.register_forward_hook(lambda module, inputs, output: outputs[module].append(output))
               for layer in layers]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replaying_outputs(layers: list[nn.Module], outputs: dict[nn.Module, list[Any]]) -> Iterator[None]:
    """Each of `layers` gives back, call by call, what `recording_outputs` recorded of it, computing nothing."""
    own = {layer: vars(layer).get("forward") for layer in layers}  # an instance's own forward, if it had one
    for layer in layers:
        replay = iter(outputs[layer])
        layer.forward = lambda *args, replay=replay, **kwargs: next(replay)
    try:
        yield
    finally:
        for layer, forward in own.items():
            if forward is None:
                del layer.forward  # the class's forward again
            else:
                layer.forward = forward


def model_outputs(model: nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The floating-point tensors of `model`'s output on `batch` (logits, hidden states, ...). Padding positions
    need no masking: the packed forward leaves them 0 in every output, int8 or not."""
    output = model(**batch)
    values = output.to_tuple() if isinstance(output, ModelOutput) else output
    values = values if isinstance(values, tuple) else (values,)
    return [value for value in values if isinstance(value, torch.Tensor) and value.is_floating_point()]


def cast_bf16(model: nn.Module, batches: Any, config: QuantizationConfig) -> nn.Module:
    """bf16 weights where the hardware computes in bf16 natively; elsewhere the (exactly representable) bf16 values
    in float32, which is what the checkpoint will hold either way."""
    from bertforge.inference.optimize import run_in_bf16
    from bertforge.runtime import bf16_supported

    device = next(model.parameters()).device
    if bf16_supported(device.type):
        return run_in_bf16(model.eval())
    logger.warning("this %s has no native bf16: the model runs in float32 on bf16-rounded weights", device.type)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
    return model


# precision -> (model, calibration batches or None, config) -> the model made smaller, in place.
METHODS: dict[str, Callable[[nn.Module, Any, QuantizationConfig], nn.Module]] = {
    "int8": quantize_int8,
    "bf16": cast_bf16,
}


def auto_precision(device_type: str = "cpu") -> str:
    """The precision `auto` stands for: bf16 where the device computes it natively, else int8 on a CPU."""
    from bertforge.runtime import bf16_supported

    if bf16_supported(device_type):
        return "bf16"
    if device_type == "cpu":
        return "int8"
    raise ConfigError(f"this {device_type} has no native bf16 and int8 runs on CPU only; keep fp32")


def quantize(model: nn.Module, config: QuantizationConfig | None = None,
             batches: Iterable[dict[str, torch.Tensor]] | None = None) -> nn.Module:
    """`model` (changed in place and returned) in eval mode at `config.precision`; `batches` of model inputs from
    the user's own data calibrate int8 (a few hundred sentences are plenty: calibration finds each layer's largest
    input channels and the range of its int8 input, and ranks the layers for `config.float_layers`). The model
    remembers its config for `save_quantized`."""
    check_not_quantized(model, "quantize")
    # what quantizing records is the model's own (the config given may quantize another model after this one)
    config = dataclasses.replace(config or QuantizationConfig(), modules={}, folded=[], kept_float=[])
    model = METHODS[config.precision](model.eval(), batches, config)
    model.quantization = config
    return model


def check_not_quantized(model: nn.Module | Path, action: str, source: str | Path = "this model") -> None:
    """A model `bertforge quantize` wrote (loaded, or its directory) is an end point: quantizing, distilling or
    training it again would compound the rounding, and its int8 layers are no float weights to start from."""
    config = read_quantization(model) if isinstance(model, Path) else getattr(model, "quantization", None)
    if config is not None:
        raise ConfigError(f"{source}: already quantized ({config.precision}); {action} the fp32 model it was "
                          "made from")


def prepare_quantized(model: nn.Module, config: QuantizationConfig) -> nn.Module:
    """An unloaded `model` shaped for a quantized checkpoint's tensors (its int8 layers empty), ready for loading."""
    if config.precision == "int8":
        names = names_in(model, config.modules)
        activations = take_activations(model, names.values())
        for saved, name in names.items():
            linear = model.get_submodule(name)
            replace_module(model, name, QuantizedLinear(
                linear.in_features, linear.out_features, config.modules[saved], activations.get(name),
                smoothed=config.smoothing is not None or saved in config.folded, static=config.activations == "static"))
        join_int8_layers(model)
    model.quantization = config
    return model


def names_in(model: nn.Module, saved: Iterable[str]) -> dict[str, str]:
    """Module names as the quantized model's class recorded them -> the same modules in `model`, matched with or
    without the encoder's `bert.` prefix as their tensors are (a classifier's checkpoint loads into the bare
    encoder). A module `model` has no place for (a masked-LM model's pooler) is left out, as its tensors are."""
    own = {name.removeprefix(ENCODER_PREFIX): name for name, _ in model.named_modules()}
    return {name: own[name.removeprefix(ENCODER_PREFIX)] for name in saved if name.removeprefix(ENCODER_PREFIX) in own}


def finish_loading(model: nn.Module) -> nn.Module:
    """After a quantized checkpoint's tensors are loaded: a bf16 checkpoint runs in bf16 where that is native."""
    config = getattr(model, "quantization", None)
    if config is not None and config.precision == "bf16":
        return cast_bf16(model, None, config)
    return model


def save_quantized(model: nn.Module, directory: str | Path) -> Path:
    """save_pretrained of a quantized model, which notes the quantization in config.json (bf16 weights are stored
    as bf16); refused for a model that was not quantized."""
    if getattr(model, "quantization", None) is None:
        raise ConfigError("this model was not quantized (use bertforge.compress.quantize first)")
    return model.save_pretrained(directory)


def note_quantization(directory: Path, config: QuantizationConfig) -> None:
    """Record a quantized model's config in the config.json just written to `directory` (save_pretrained)."""
    path = directory / CONFIG_FILE
    data = read_json_object(path, "config") | {QUANTIZATION_KEY: config.to_dict()}
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def is_blank(example: Any) -> bool:
    """An example with nothing to read: a blank line's text, or a sentence of no words."""
    text = getattr(example, "text", None)
    return (isinstance(text, str) and not text.strip()) or getattr(example, "words", None) == []


def quantize_finetuned(model: str | Path, dev: str | Path, output: str | Path, precision: str = "int8",
                       max_drop: float = DEFAULT_MAX_DROP, calibration: str | Path | None = None,
                       calibration_examples: int = 256, outlier_channels: int = 8, smoothing: float | None = None,
                       batch_size: int = 64, activations: str = "static", outlier_folding: str = "activation",
                       device: str = "cpu", format: str | None = None, fallback: bool = True,
                       float_layers: int = 0) -> GateReport:
    """Quantize a fine-tuned model directory, measure it beside the original on the labelled `dev` file (in
    `format`, a key of DATA_FORMATS; default: its extension's), and write it to `output` only if the task's metric
    drops by at most `max_drop` points (see `GateReport.accepted`). With `fallback`, an int8 model that drops more
    is followed by the more careful recipes of `fallback_recipes`, in turn; the first within `max_drop` is written.

    int8 calibrates on the first `calibration_examples` of `calibration` (default: the dev file): each layer's
    largest input channels, with static `activations` the range of its int8 input, and with `float_layers` which
    layers stay float32. `precision="auto"` is bf16 where `device` runs it natively, else int8. Both models run on
    `device` (int8: CPU only).
    """
    from bertforge.inference.optimize import InferenceOptions, check_device

    output = check_output(output)
    check_number("max_drop", max_drop)  # finite (negative: the smaller model must gain that much)
    device_type = check_device(device).type  # before any loading: a one-line error
    if precision == "auto":
        precision = auto_precision(device_type)
    if precision == "int8" and device_type != "cpu":
        raise ConfigError(f"--device {device}: int8 runs on CPU only (use --device cpu, or --precision bf16)")
    config = QuantizationConfig(precision, outlier_channels=outlier_channels, smoothing=smoothing,
                                activations=activations, outlier_folding=outlier_folding, float_layers=float_layers)
    placement = InferenceOptions(device=device)
    reference = FinetunedModel.load(model, inference=placement)
    check_not_quantized(reference.model, "quantize", model)
    examples = reference.read(dev, reference.columns(), labelled=True, format=format)
    batches = None
    if precision == "int8":
        # calibration needs inputs only: unlabelled files (a plain .txt, one text a line) do
        sample = examples if calibration is None else reference.read(calibration, reference.columns(path=calibration),
                                                                     labelled=False)
        sample = [example for example in sample if not is_blank(example)]  # a .txt file's blank lines
        features = reference.task.encode(reference.tokenizer, sample[:calibration_examples],
                                         reference.settings, reference.id2label)
        batches = [batch for _, batch in inference_batches(features, batch_size, reference.tokenizer.pad_token_id)]
    fp32 = measure("fp32", reference, examples, batch_size)
    check_measurable(reference.task.main_metric, fp32.metrics, dev)
    rejected: list[Measurement] = []
    for recipe in fallback_recipes(config) if fallback else [config]:
        candidate = FinetunedModel.load(model, inference=placement)
        quantize(candidate.model, recipe, batches)
        report = GateReport(reference.task.main_metric, fp32, measure(recipe_name(recipe), candidate, examples,
                                                                      batch_size), max_drop, list(rejected))
        if report.accepted:
            break
        rejected.append(report.candidate)

    def write(folder: Path) -> None:
        save_quantized(candidate.model, folder)
        candidate.tokenizer.save_pretrained(folder)
        candidate.run.save(folder / RUN_CONFIG_FILE)

    write_if_accepted(report, output, write)
    return report
