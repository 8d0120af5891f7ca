"""The ecosystem's checkpoint directory: config.json + model.safetensors (or pytorch_model.bin, or either sharded
with an index file naming each tensor's shard) + the tokenizer's files."""

from __future__ import annotations

import json
import os
import pickle
import re
import zipfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertforge.atomic import atomic_path
from bertforge.errors import CheckpointError
from bertforge.runtime import warnings_silenced

CONFIG_FILE = "config.json"
GOOGLE_CONFIG_FILE = "bert_config.json"  # the original BERT release's (google-research/bert)
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
INDEX_SUFFIX = ".index.json"  # model.safetensors.index.json: {"weight_map": {tensor name: shard file}}
# Weights files of the hub's other frameworks, which only transformers 4 converts: named when they are all there is.
# file -> (what it holds, the from_pretrained flag of transformers 4 that converts it)
UNREAD_WEIGHTS = {"tf_model.h5": ("Keras weights", "from_tf"), "flax_model.msgpack": ("Flax weights", "from_flax")}


def config_path(directory: Path) -> Path:
    """Where a model directory's config is: config.json, or the original BERT release's bert_config.json beside its
    TensorFlow checkpoint."""
    path = directory / CONFIG_FILE
    if not path.is_file() and (directory / GOOGLE_CONFIG_FILE).is_file():
        return directory / GOOGLE_CONFIG_FILE
    return path


def with_variant(name: str, variant: str | None) -> str:
    """transformers' file name of a weights variant: model.safetensors -> model.fp16.safetensors,
    model.safetensors.index.json -> model.safetensors.index.fp16.json."""
    if not variant:
        return name
    stem, suffix = name.rsplit(".", 1)
    return f"{stem}.{variant}.{suffix}"


def read_state_dict(directory: Path, use_safetensors: bool | None = None, variant: str | None = None
                    ) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of a checkpoint directory (safetensors preferred, whole or sharded; else the original BERT
    release's TensorFlow checkpoint) under transformers' names, and the file they came from (the index file for
    a sharded checkpoint). As transformers' from_pretrained: `use_safetensors` True reads safetensors only, False
    the PyTorch files only; `variant` ("fp16") reads model.fp16.safetensors and its kin."""
    formats = [(SAFETENSORS_FILE, read_safetensors), (PYTORCH_FILE, read_pytorch)]
    if use_safetensors is not None:
        formats = formats[:1] if use_safetensors else formats[1:]
    for name, read in formats:
        path = directory / with_variant(name, variant)
        if path.is_file():
            return read(path), path
        index = directory / with_variant(name + INDEX_SUFFIX, variant)
        if index.is_file():
            state = {}
            for shard in _shards(index):
                state |= read(shard)
            return state, index
    if use_safetensors is None and not variant:
        from bertforge.checkpoint.tf_checkpoint import find_tf_checkpoint, read_tf_checkpoint, transformers_state_dict

        prefix = find_tf_checkpoint(directory)
        if prefix is not None:
            source = prefix.with_name(prefix.name + ".index")
            return transformers_state_dict(read_tf_checkpoint(prefix), source), source
        for name, (holding, flag) in UNREAD_WEIGHTS.items():
            if (directory / name).is_file():
                raise CheckpointError(f"{directory}: the weights are in {name} ({holding}), which bertforge does not "
                                      f"read (nor does transformers 5); convert them to {SAFETENSORS_FILE} with "
                                      f"transformers 4: BertModel.from_pretrained(folder, {flag}=True)"
                                      f".save_pretrained(new_folder)")
        raise CheckpointError(f"{directory}: no {SAFETENSORS_FILE} or {PYTORCH_FILE} (or their {INDEX_SUFFIX} for "
                              f"a sharded checkpoint, or a TensorFlow checkpoint) in the model directory")
    wanted = " or ".join(with_variant(name, variant) for name, _ in formats)
    asked = ", ".join(part for part in (f"use_safetensors={use_safetensors}" if use_safetensors is not None else "",
                                        f"variant={variant!r}" if variant else "") if part)
    raise CheckpointError(f"{directory}: no {wanted} (whole or sharded) in the model directory, as {asked} asks")


def _shards(index: Path) -> list[Path]:
    """The shard files an index names, each once, in order; a missing one is an error naming it."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = list(dict.fromkeys(weight_map.values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{index}: not a checkpoint index (a JSON object with a weight_map): {error}") from None
    for name in files:
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{index}: the weight_map names a shard {name!r}; expected a file name")
    shards = [index.parent / name for name in files]
    for shard in shards:
        if not shard.is_file() or shard.parent != index.parent:
            raise CheckpointError(f"{index}: names the shard {shard.name!r}, which is not in {index.parent}")
    return shards


def check_readable(path: Path) -> None:
    """A weights file this process can't open is a CheckpointError with the system's reason (safetensors reports
    a permission problem as a missing file)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise CheckpointError(f"{path}: can't read the weights: {error.strerror or error}") from None


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file; an unreadable one is a one-line CheckpointError naming it."""
    check_readable(path)
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: unreadable safetensors file: {error}") from None


def read_pytorch(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a PyTorch pickle (pytorch_model.bin), loaded without running code; else a CheckpointError."""
    try:
        # weights_only: a .bin is a pickle, and unpickling arbitrary objects would run arbitrary code.
        with warnings_silenced():  # torch's notes on pickle protocols say nothing to the user
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, zipfile.BadZipFile) as error:
        if "weights_only" in str(error):  # torch's several lines of advice are to load unsafely
            raise CheckpointError(f"{path}: unreadable PyTorch checkpoint: it holds Python objects besides "
                                  "tensors, which could run code when loaded (convert it to safetensors)") from None
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path}: unreadable PyTorch checkpoint: {reason}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dictionary of tensors")
    return state


def write_state_dict(state: dict[str, torch.Tensor], directory: Path) -> Path:
    path = directory / SAFETENSORS_FILE
    save_safetensors({name: tensor.detach().contiguous().cpu() for name, tensor in state.items()}, path)
    return path


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write `tensors` to the safetensors file `path` atomically. safetensors reports a failed write (a full disk)
    as its own error, with the OS's error number in the text ('(os error 28)'; before 0.5 'Os { code: 28, ...'):
    it becomes the OSError that names `path`."""
    with atomic_path(path) as temporary:
        try:
            save_file(tensors, temporary, metadata={"format": "pt"})
        except SafetensorError as error:
            found = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", str(error))
            if found is None:
                raise
            number = int(found[1] or found[2])
            raise OSError(number, os.strerror(number)) from None
