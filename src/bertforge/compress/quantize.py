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

The int8 layer and the kernels it runs on are compress/int8_linear.py; the ranking of layers for `float_layers`,
compress/sensitivity.py. SmoothQuant's migration for every channel is an option (`smoothing`); on MiniLM it helped
less than keeping the outliers apart, and hurt the down-projection, whose input follows a GELU.

A quantized model saves as an ordinary checkpoint directory whose config.json notes the quantization
(`quantization_config`) and whose safetensors hold the int8 weights and their scales; `from_pretrained` of that
directory gives the quantized model back.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.activations import Activation
from bertforge.atomic import write_text_atomic
from bertforge.checkpoint.hf_format import CONFIG_FILE, config_path
from bertforge.checkpoint.key_map import ENCODER_PREFIX
from bertforge.compress.calibration import calibrate
from bertforge.compress.gate import (
    DEFAULT_MAX_DROP,
    GateReport,
    Measurement,
    check_measurable,
    check_output,
    measure,
    write_if_accepted,
)
from bertforge.compress.int8_linear import QuantizedLinear, join_int8_layers, replace_module
from bertforge.compress.sensitivity import SENSITIVITY_EXAMPLES, int8_sensitivity, leading_batches
from bertforge.errors import ConfigError, check_choice
from bertforge.json_config import read_json_object
from bertforge.model import BertModel, FeedForward
from bertforge.tasks.data import inference_batches
from bertforge.tasks.finetune import RUN_CONFIG_FILE
from bertforge.tasks.finetuned_model import FinetunedModel
from bertforge.validation import check_number

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


def encoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers of the model's encoders (attention, feed-forward, pooler) by name. Task heads stay as
    they are: a few hundred weights at most, and they carry the loss."""
    encoders = [name for name, module in model.named_modules() if isinstance(module, BertModel)]
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and any(name.startswith(f"{encoder}.") or not encoder
                                                     for encoder in encoders)}


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
