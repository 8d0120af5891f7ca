"""The int8 linear layer that `bertforge quantize` puts in a model's place, and the kernels it runs on.

y = W8 (x8 - zero_point) * scales + bias + x[:, outliers] @ W[:, outliers]^T: int8 weights with one scale per output
channel, the input quantized with one step and zero point per layer (calibrated, or per batch), and a few outlier
input channels kept apart, in float32 beside the int8 product or folded into it (compress/quantize.py says why).

The int8 product runs on oneDNN's kernel (VNNI on AVX-512 CPUs, AMX where present: 3-4x a float32 matmul on BERT's
shapes; on AVX2 without VNNI the kernel gets 7-bit weights, which cannot saturate its int16 sums); builds of torch
without oneDNN use its dynamic kernel (fbgemm), which finds the range per call. The kernel also applies the
feed-forward's GELU as it writes its output, which is why the up-projection folds its outliers by default (oneDNN
has no GELU after the addition of a float32 product), and the up-projection writes its output as the
down-projection's uint8 codes where the down-projection keeps no outliers: the widest activation of the layer is
never written in float32; an attention layer's query, key and value, which see the same input, run as one int8
product.

Shapes: tokens (rows of a packed batch), in (input channels), out (output channels), outliers.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable

import torch
from torch import nn

from bertforge import attention_kernels
from bertforge.activations import ACTIVATIONS, ONEDNN_POST_OPS
from bertforge.model import FeedForward, SelfAttention
from bertforge.runtime import warnings_silenced


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
        with warnings_silenced():  # torch announces its quantized tensors' move to torchao
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
        with warnings_silenced():  # torch announces its quantized tensors' move to torchao
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
            with warnings_silenced():  # torch announces its quantized tensors' move to torchao (pinned)
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
        return ((attention_kernels.replay_recording.active or rows < SMALL_PRODUCT_ROWS and int8_reduce_range())
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
        if (torch.compiler.is_exporting() or (torch.jit.is_tracing() and not attention_kernels.replay_recording.active)
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


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


