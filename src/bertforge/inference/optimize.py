"""Inference-time speed options for any bertforge model: bf16 weights, int8 linear layers, torch.compile.

Each trades some exactness (or start-up time) for speed. `bench/bench_inference.py` measures the speed-up and
the largest numeric difference; `bertforge evaluate --precision int8` measures the cost on a task's own metric.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertforge import fast_cpu, runtime
from bertforge.errors import ConfigError, check_choice

# fp32: as trained. bf16: weights and activations in bfloat16 (GPUs, and CPUs with AVX-512 BF16 or AMX).
# auto: bf16 where the device computes it natively, else fp32.
# int8: the encoder's linear layers as bertforge.compress quantizes them (one int8 path): int8 weights with a scale
# per output channel, each layer's input range and few outlier input channels found by calibration on real text
# (the caller's batches, else bundled sentences); CPU only.
PRECISIONS = ("fp32", "auto", "bf16", "int8")


def check_device(name: str) -> torch.device:
    """The torch device --device names (cpu, cuda, cuda:N, mps), or a one-line error naming the flag when it is
    malformed or this machine has no such device: the Python API's check (runtime.resolve_device)."""
    return runtime.resolve_device(str(name), named="--device")


@dataclass(frozen=True)
class InferenceOptions:
    """How a loaded model is prepared for inference; the defaults leave it exactly as trained."""

    precision: str = "fp32"
    compile: bool = False  # torch.compile the forward pass (dynamic shapes); the first batches are slow
    device: str = "cpu"  # cpu, cuda, cuda:N or mps; checked when applied

    def __post_init__(self):
        check_choice(self.precision, PRECISIONS, "precision")

    def apply(self, model: nn.Module, tokenizer=None, calibration: Iterable[dict[str, torch.Tensor]] | None = None
              ) -> nn.Module:
        """`model` in eval mode at this precision (changed in place, and returned): same class, same outputs'
        types (float32 tensors), so every caller works unchanged. int8 calibrates on `calibration` (batches of
        model inputs from the user's data) when given, else on bundled real sentences encoded by `tokenizer`."""
        model.eval()
        quantization = getattr(model, "quantization", None)  # a checkpoint that `bertforge quantize` wrote
        device = check_device(self.device) if self.device != "cpu" else next(model.parameters()).device
        int8 = self.precision == "int8" or (quantization is not None and quantization.precision == "int8")
        if int8 and device.type != "cpu":  # before anything moves: its kernels are oneDNN's, for CPUs
            raise ConfigError(f"int8, which runs on CPU only, can't run on {device} (use --device cpu)")
        model.to(device)
        precision = resolve_precision(self.precision, device.type)
        if quantization is not None:
            if self.precision not in ("fp32", "auto"):
                raise ConfigError(f"this model is already quantized ({quantization.precision}); load it at "
                                  "the default precision")
            precision = "fp32"  # as it was saved
            if (quantization.precision == "bf16" and runtime.bf16_supported(device.type)
                    and next(model.parameters()).dtype == torch.float32):
                run_in_bf16(model)  # loaded where bf16 is not native (held as float32), moved to where it is
        if precision == "int8":
            from bertforge.compress.calibration import calibration_batches
            from bertforge.compress.quantize import QuantizationConfig, quantize
            if calibration is None:
                if tokenizer is None:
                    raise ConfigError("int8 calibrates on text: give the model's tokenizer or calibration batches")
                calibration = calibration_batches(tokenizer)
            quantize(model, QuantizationConfig("int8"), calibration)
        elif precision == "bf16":
            if not runtime.bf16_supported(device.type):
                raise ConfigError(f"this {device.type} has no native bf16 (on CPU: AVX-512 BF16 or AMX); "
                                  "use fp32 or int8")
            run_in_bf16(model)
        elif fast_cpu.prepacking_pays():
            fast_cpu.accelerate(model)  # oneDNN on prepacked weights: the same outputs, sooner
        if self.compile:
            from bertforge.compress.int8_linear import run_int8_eagerly
            run_int8_eagerly(model)
            model.compile(dynamic=True)  # in place: the module keeps its class and attributes
        return model


def run_in_bf16(model: nn.Module) -> nn.Module:
    """`model`'s weights and computation in bf16, its outputs in float32: callers (numpy conversion, softmax over
    logits, cosine scores) expect float32."""
    model.to(torch.bfloat16)
    model.register_forward_hook(outputs_in_float32)  # a named function: the model still pickles (pool workers)
    return model


def outputs_in_float32(module: nn.Module, inputs: Any, output: Any) -> Any:
    return to_float32(output)


def resolve_precision(precision: str, device_type: str) -> str:
    """The precision that runs: `auto` is bf16 where `device_type` computes it natively, else fp32."""
    if precision == "auto":
        return "bf16" if runtime.bf16_supported(device_type) else "fp32"
    return precision


# The default everywhere a model is loaded for inference: exactly as trained.
AS_TRAINED = InferenceOptions()


def to_float32(value: Any) -> Any:
    """Every floating tensor in a model output (a tensor, tuple or output dataclass) as float32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(to_float32(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{field.name: to_float32(getattr(value, field.name))
                                             for field in dataclasses.fields(value) if field.init})
    return value
