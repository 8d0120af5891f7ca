"""Save and resume a training run: model, optimizer, scheduler, fp16 loss scaler, data position, RNG states and step,
in one file.

The file is written beside its final name and renamed over it only when complete, so an interruption during a
save leaves the previous checkpoint intact. Everything in it is tensors, numbers, strings, lists and dicts, so
it loads with torch.load(weights_only=True): resuming never runs code from the file.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.atomic import PythonWrites, atomic_path
from bertforge.errors import CheckpointError, ConfigError

TRAIN_STATE_FILE = "train_state.pt"
FORMAT = "bertforge-train-state"
VERSION = 1


@dataclass
class TrainState:
    """What a checkpoint restores besides the modules it loads into."""

    step: int  # optimizer steps completed
    data: dict[str, Any] = field(default_factory=dict)  # the data pipeline's position: its parts' state_dicts
    extra: dict[str, Any] = field(default_factory=dict)  # anything else the caller saved (e.g. its run config)


def rng_states() -> dict[str, Any]:
    """The global generators of Python, numpy and torch (CPU and every CUDA device): dropout draws from torch's."""
    algorithm, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": {"algorithm": algorithm, "keys": torch.from_numpy(keys.astype(np.int64)), "position": position,
                  "has_gauss": has_gauss, "cached_gaussian": cached_gaussian},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))  # tuples may come back as lists
    numpy_state = states["numpy"]
    np.random.set_state((numpy_state["algorithm"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_train_state(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                     step: int, data: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                     scaler: torch.amp.GradScaler | None = None) -> Path:
    """Write directory/train_state.pt atomically; `data` holds the data position (e.g. stream and collator
    state_dicts), `extra` anything else to get back on resume, `scaler` the fp16 loss scale and its schedule."""
    path = Path(directory) / TRAIN_STATE_FILE
    state = {"format": FORMAT, "version": VERSION, "step": step, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_states(),
             "data": data or {}, "extra": extra or {}}
    if scaler is not None and scaler.is_enabled():
        state["scaler"] = scaler.state_dict()
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        writer = PythonWrites(handle)
        try:
            torch.save(state, writer)
        except RuntimeError:
            if writer.error is None:
                raise
            raise writer.error from None
    return path


def read_train_state(directory: str | Path) -> dict[str, Any]:
    """The raw contents of directory/train_state.pt, checked to be a bertforge training checkpoint."""
    path = Path(directory) / TRAIN_STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: no training checkpoint to resume from")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: torch raises several unrelated types
        raise CheckpointError(f"{path}: not a readable training checkpoint ({type(error).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a bertforge training checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path}: training checkpoint version {state.get('version')} is not supported "
                              f"(expected {VERSION})")
    return state


def load_train_state(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                     scheduler: Any, scaler: torch.amp.GradScaler | None = None) -> TrainState:
    """Load a checkpoint into `model`, `optimizer`, `scheduler` (and an enabled `scaler`), restore the global RNG
    states, and return the step and saved data position for the caller to hand to its data pipeline."""
    state = read_train_state(directory)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(f"{Path(directory) / TRAIN_STATE_FILE}: the model doesn't match the checkpoint "
                              f"({first_line})") from None
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and scaler.is_enabled():
        if "scaler" not in state:
            raise CheckpointError(f"{Path(directory) / TRAIN_STATE_FILE}: the checkpoint has no fp16 loss scaler "
                                  "state (it was not saved from an fp16 run)")
        scaler.load_state_dict(state["scaler"])
    restore_rng_states(state["rng"])
    return TrainState(step=state["step"], data=state["data"], extra=state["extra"])


def check_same_settings(saved: dict[str, Any], current: dict[str, Any], changeable: Collection[str],
                        source: str | Path) -> None:
    """A resumed run's settings (`current`, as JSON) are those it started with (`saved`, read back through its
    config class, so that a field added since has its default), but for those in `changeable`, which don't change
    what is computed (a nested field by its dotted name: training.log_every); else a ConfigError naming the first
    that differs. Anything else would not be the run it continues."""
    before = flattened(saved)
    for name, now in flattened(current).items():
        if name not in changeable and now != before.get(name):
            raise ConfigError(f"{source}: the run was started with {name}={before.get(name)!r}, this one has "
                              f"{name}={now!r}; resume with the same settings, or start a new output")


def flattened(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's JSON with nested configs' fields under dotted names (training.lr)."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat |= flattened(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
