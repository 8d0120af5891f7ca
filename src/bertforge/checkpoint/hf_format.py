"""The ecosystem's checkpoint directory: config.json + model.safetensors (or pytorch_model.bin) + vocab.txt."""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertforge.atomic import atomic_path
from bertforge.errors import CheckpointError

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"


def read_state_dict(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of a checkpoint directory (safetensors preferred) and the file they came from."""
    safetensors_path, pytorch_path = directory / SAFETENSORS_FILE, directory / PYTORCH_FILE
    if safetensors_path.is_file():
        try:
            return load_file(safetensors_path), safetensors_path
        except (SafetensorError, OSError, ValueError) as error:
            raise CheckpointError(f"{safetensors_path}: unreadable safetensors file: {error}") from None
    if pytorch_path.is_file():
        try:
            # weights_only: a .bin is a pickle, and unpickling arbitrary objects would run arbitrary code.
            with warnings.catch_warnings():  # torch's notes on pickle protocols say nothing to the user
                warnings.simplefilter("ignore")
                state = torch.load(pytorch_path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, zipfile.BadZipFile) as error:
            if "weights_only" in str(error):  # torch's several lines of advice are to load unsafely
                raise CheckpointError(f"{pytorch_path}: unreadable PyTorch checkpoint: it holds Python objects besides "
                                      "tensors, which could run code when loaded (convert it to safetensors)") from None
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CheckpointError(f"{pytorch_path}: unreadable PyTorch checkpoint: {reason}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{pytorch_path}: expected a dictionary of tensors")
        return state, pytorch_path
    raise CheckpointError(f"{directory}: no {SAFETENSORS_FILE} or {PYTORCH_FILE} in the model directory")


def write_state_dict(state: dict[str, torch.Tensor], directory: Path) -> Path:
    path = directory / SAFETENSORS_FILE
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state.items()}
    with atomic_path(path) as temporary:
        save_file(tensors, temporary, metadata={"format": "pt"})
    return path
