"""LoRA adapters in PEFT's format (adapter_config.json + adapter_model.safetensors), merged into a model's weights.

A LoRA adapter trains, beside each chosen linear layer W (out, in), two thin matrices A (r, in) and B (out, r);
the adapted layer computes W + (alpha / r) B A (alpha / sqrt(r) with rsLoRA). Merging adds that product to W once,
so the adapted model is an ordinary checkpoint: every command (predict, serve, quantize, ONNX export) runs it at
the base model's speed, and nothing of PEFT is needed at run time. An adapter trained with PEFT on transformers'
BERT names its layers as transformers does; one trained on a bertforge model, as bertforge does: both merge.
The layers PEFT trained in full (`modules_to_save`, a task's classifier) are copied. A folder holding an adapter
alone (adapter_config.json, no config.json) is a model: its base, the adapter merged in (load_adapter_folder).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import CONFIG_FILE, read_pytorch, read_safetensors
from bertforge.checkpoint.key_map import ENCODER_PREFIX, from_hf
from bertforge.errors import CheckpointError, ConfigError
from bertforge.json_config import read_json_object
from bertforge.validation import check_number

if TYPE_CHECKING:
    from bertforge.tasks.checkpoint_contents import Checkpoint

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PEFT_PREFIX = "base_model.model."  # what PEFT puts before the base model's own names
# adapter_config.json settings whose adapters are no plain sum of B A (name -> what is refused)
UNMERGEABLE = {"use_dora": "DoRA (weight-decomposed) adapters", "lora_bias": "adapters with a trained LoRA bias",
               "layer_replication": "adapters that replicate layers"}
# PEFT's task_type -> the task registry's HEADS key of the model it adapts
PEFT_TASKS = {"SEQ_CLS": "sequence_classification", "TOKEN_CLS": "token_classification",
              "QUESTION_ANS": "question_answering", "FEATURE_EXTRACTION": "encoder"}
LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<kind>embedding_)?(?P<side>[AB])(?:\.[^.]+)?(?:\.weight)?$")


def merge_lora(model: nn.Module, adapter: str | Path) -> nn.Module:
    """`model` (changed in place and returned) with the LoRA adapter in the folder `adapter` merged into its weights.
    The model must be the adapter's base (the same encoder size and, for a task head the adapter trained, the same
    number of labels); anything of the adapter with no place in it is a one-line error."""
    return merged(model, *read_adapter(Path(adapter)))


def merged(model: nn.Module, settings: dict, tensors: dict[str, torch.Tensor], source: Path) -> nn.Module:
    """merge_lora of an adapter already read (read_adapter)."""
    from bertforge.compress.quantize import check_not_quantized

    check_not_quantized(model, "merge an adapter into")
    modules = dict(model.named_modules())
    parameters = dict(model.named_parameters())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    copied: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(PEFT_PREFIX)
        match = LORA_KEY.match(name)
        if match:
            pairs.setdefault(match["module"], {})[match["side"]] = tensor
        else:
            copied[own_name(f"{name}", parameters, source, key)] = tensor
    # Every name and shape is checked before any weight changes, so an adapter that doesn't fit leaves the model
    # as it was, not half merged.
    merges = []
    for saved_module, sides in pairs.items():
        if set(sides) != {"A", "B"}:
            raise CheckpointError(f"{source}: {saved_module} has lora_{next(iter(sides))} without its other half")
        module = modules[own_name(f"{saved_module}.weight", parameters, source, saved_module).removesuffix(".weight")]
        check_pair(module, sides["A"], sides["B"], f"{source}: {saved_module}")
        merges.append((module, sides["A"], sides["B"], scale(settings, saved_module, sides["A"])))
    for name, tensor in copied.items():
        if parameters[name].shape != tensor.shape:
            raise CheckpointError(f"{source}: {name} has shape {tuple(tensor.shape)}, the model's is "
                                  f"{tuple(parameters[name].shape)} (a base model with other labels?)")
    with torch.no_grad():
        for module, lora_a, lora_b, factor in merges:
            merge_pair(module, lora_a, lora_b, factor)
        for name, tensor in copied.items():
            parameters[name].copy_(tensor)
    return model


def is_adapter_folder(directory: Path) -> bool:
    """A folder holding a LoRA adapter alone, as PEFT and sentence-transformers save an adapted model (no
    config.json): the model is the base that adapter_config.json names, with the adapter."""
    return (directory / ADAPTER_CONFIG_FILE).is_file() and not (directory / CONFIG_FILE).is_file()


def adapter_base(directory: Path) -> str:
    """The base model an adapter folder's adapter_config.json names (base_model_name_or_path)."""
    base = read_json_object(directory / ADAPTER_CONFIG_FILE, "adapter config").get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise CheckpointError(f"{directory / ADAPTER_CONFIG_FILE}: no base_model_name_or_path, so the model it "
                              f"adapts is unknown: merge it with `bertforge export hf --model BASE --adapter "
                              f"{directory} --output MERGED`")
    return base


def inspect_base(directory: Path, cache_dir: str | Path | None = None, revision: str | None = None) -> Checkpoint:
    """inspect_checkpoint of the base model an adapter folder names; a base not found names the adapter's file."""
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint

    base = adapter_base(directory)
    try:
        return inspect_checkpoint(resolve_model_dir(base, cache_dir=cache_dir, revision=revision))
    except CheckpointError as error:
        raise CheckpointError(f"{directory / ADAPTER_CONFIG_FILE}: its base model {base!r}: {error}") from None


def load_adapter_folder(model_class: type, directory: Path, options: dict[str, Any]) -> Any:
    """`model_class` loaded from an adapter-only folder as transformers loads one: its base model (a folder,
    'default', or a model in the local Hugging Face cache) with from_pretrained's `options`, the adapter merged in,
    and the folder's sentence-transformers layout in place of the base's when it has one."""
    from bertforge.checkpoint.sentence_transformers import read_sentence_embedding

    checkpoint = inspect_base(directory, options.get("cache_dir"), options.get("revision"))
    loaded = adapted_model(model_class, checkpoint, *read_adapter(directory), options)
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    layout = read_sentence_embedding(directory)
    if layout is not None:
        model.sentence_embedding = layout
    model.name_or_path = str(directory)
    return loaded


def load_adapted(base: str | Path, adapter: str | Path, head: str | None = None) -> nn.Module:
    """The checkpoint `base` loaded as the model the adapter was trained on, the adapter merged in. The model is
    `head` (a HEADS key), else PEFT's task_type (SEQ_CLS: a sequence classifier, ...), else what `base` holds."""
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint
    from bertforge.tasks.registry import HEADS

    checkpoint = inspect_checkpoint(base)
    directory = Path(adapter)
    settings, tensors, source = read_adapter(directory)
    task_type = settings.get("task_type")
    if head is None and task_type is not None and task_type not in PEFT_TASKS:
        raise ConfigError(f"{directory / ADAPTER_CONFIG_FILE}: task_type {task_type!r} is none of bertforge's "
                          f"models ({', '.join(PEFT_TASKS)})")
    head = head or PEFT_TASKS.get(task_type, checkpoint.head)
    weights = HEADS[head].weights
    if head != checkpoint.head and weights and not any(key.endswith(weights + "weight") for key in tensors):
        raise CheckpointError(f"{source}: no trained {weights.rstrip('.')} for the "
                              f"{HEADS[head].model_class.__name__} the adapter adapts, and {checkpoint.directory} "
                              f"holds none")
    return adapted_model(HEADS[head].model_class, checkpoint, settings, tensors, source, {})


def adapted_model(model_class: type, base: Checkpoint, settings: dict, tensors: dict[str, torch.Tensor],
                  source: Path, options: dict[str, Any]) -> Any:
    """`model_class`.from_pretrained(base.directory, **options) (`base`: inspect_checkpoint's) with the adapter read
    from `source` merged in. A head the base lacks comes from the adapter (PEFT's `modules_to_save`), its labels
    counted there."""
    from bertforge.tasks.registry import HEADS

    head = next((name for name, row in HEADS.items() if row.model_class is model_class), None)
    weights = HEADS[head].weights if head is not None and head != base.head else None
    weight = next((tensor for key, tensor in tensors.items() if weights and key.endswith(weights + "weight")), None)
    if weight is not None:
        options = {"num_labels": weight.shape[0]} | options
    quiet = logging.getLogger("bertforge")
    level = quiet.level
    if weight is not None:
        quiet.setLevel(logging.ERROR)  # the head the base lacks is reported new, but the adapter's replaces it
    try:
        loaded = model_class.from_pretrained(base.directory, **options)
    finally:
        quiet.setLevel(level)
    merged(loaded[0] if isinstance(loaded, tuple) else loaded, settings, tensors, source)
    return loaded


def check_mergeable(settings: dict, path: Path) -> None:
    """One-line errors for adapters that are not LoRA, or whose LoRA is more than a sum of B A."""
    kind = settings.get("peft_type")
    if kind != "LORA":
        raise ConfigError(f"{path}: peft_type {kind!r}: only LoRA adapters merge into the weights")
    for setting, what in UNMERGEABLE.items():
        if settings.get(setting):
            raise ConfigError(f"{path}: {setting}: {what} don't merge as a sum of B A")
    try:
        for setting in ("r", "lora_alpha"):  # NaN or infinity would merge as NaN weights
            check_number(setting, settings.get(setting), minimum=0, exclusive=True)
        patterns = settings.get("alpha_pattern") or {}  # layer-name pattern -> that layer's own alpha
        if not isinstance(patterns, dict):
            raise ConfigError(f"alpha_pattern must be an object of layer-name patterns to numbers, got "
                              f"{patterns!r:.60}")
        for pattern, value in patterns.items():
            check_number(f"alpha_pattern[{pattern!r}]", value, minimum=0, exclusive=True)
            try:
                re.compile(pattern)
            except re.error as error:
                raise ConfigError(f"alpha_pattern: {pattern!r} is not a regular expression ({error})") from None
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    if not isinstance(settings.get("task_type"), str | None):
        raise ConfigError(f"{path}: task_type must be a name ({', '.join(PEFT_TASKS)}) or null, got "
                          f"{settings['task_type']!r:.60}")


def read_adapter(directory: Path) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """An adapter folder's settings (checked mergeable), its tensors, and the file they came from."""
    settings = read_json_object(directory / ADAPTER_CONFIG_FILE, "adapter config")
    check_mergeable(settings, directory / ADAPTER_CONFIG_FILE)
    for name, read in zip(ADAPTER_FILES, (read_safetensors, read_pytorch), strict=True):
        if (directory / name).is_file():
            return settings, read(directory / name), directory / name
    raise CheckpointError(f"{directory}: no {' or '.join(ADAPTER_FILES)} beside {ADAPTER_CONFIG_FILE}")


def own_name(saved: str, parameters: dict[str, nn.Parameter], source: Path, key: str) -> str:
    """The model's parameter name for an adapter's name (transformers' or bertforge's, with or without the encoder's
    `bert.` prefix, as the adapter's base model had it)."""
    name = from_hf(saved)
    for candidate in (name, ENCODER_PREFIX + name, name.removeprefix(ENCODER_PREFIX)):
        if candidate in parameters:
            return candidate
    raise CheckpointError(f"{source}: {key} has no place in this model (is it the adapter's base model?)")


def scale(settings: dict, saved_module: str, lora_a: torch.Tensor) -> float:
    """alpha / r, or alpha / sqrt(r) with rsLoRA; PEFT's alpha_pattern gives some layers their own alpha (its keys
    match the end of a layer's name). r is the adapter's own: the rows of A."""
    alpha = settings["lora_alpha"]
    for pattern, value in (settings.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?(?:{pattern})$", saved_module):
            alpha = value
            break
    rank = lora_a.shape[0]
    return alpha / (math.sqrt(rank) if settings.get("use_rslora") else rank)


def check_pair(module: nn.Module, lora_a: torch.Tensor, lora_b: torch.Tensor, where: str) -> None:
    """A one-line error unless `module` is a Linear or an Embedding whose weight B A fits: for a Linear, A (r, in)
    and B (out, r); for an Embedding, PEFT's lora_embedding_A (r, rows) and lora_embedding_B (dim, r), whose product
    is the table's transpose."""
    if not isinstance(module, nn.Linear | nn.Embedding):
        raise CheckpointError(f"{where}: a LoRA adapter on a {type(module).__name__}, which doesn't merge here")
    if lora_a.dim() != 2 or lora_b.dim() != 2 or lora_b.shape[1] != lora_a.shape[0]:
        raise CheckpointError(f"{where}: lora_A has shape {tuple(lora_a.shape)} and lora_B {tuple(lora_b.shape)}, "
                              f"which don't multiply as B A")
    product = (lora_b.shape[0], lora_a.shape[1])
    if isinstance(module, nn.Embedding):
        product = product[::-1]
    if product != tuple(module.weight.shape):
        raise CheckpointError(f"{where}: B A has shape {product}, the layer's weight {tuple(module.weight.shape)}")


def merge_pair(module: nn.Module, lora_a: torch.Tensor, lora_b: torch.Tensor, factor: float) -> None:
    """W += factor * B A, `module` and its pair checked by check_pair."""
    delta = lora_b.float() @ lora_a.float()
    if isinstance(module, nn.Embedding):
        delta = delta.t()
    module.weight.add_((factor * delta).to(module.weight.dtype))
