"""A pre-training run's log.jsonl drawn as one PNG: training loss, accuracies, learning rate and held-out
evaluations, each against the optimizer step (drawn by bertforge.training.plot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.training import plot
from bertforge.training.plot import Curve

# panel title -> its curves. A curve the log lacks (no sentence pairs, no held-out evaluation) is left out.
PANELS: dict[str, list[Curve]] = {
    "training loss": [("train", "loss", "objective (mean per micro-batch)")],
    "accuracy": [("train", "mlm_accuracy", "masked LM"), ("train", "sentence_pair_accuracy", "NSP / SOP"),
                 ("train", "replaced_token_accuracy", "replaced token (ELECTRA)"),
                 ("eval", "accuracy", "held-out masked LM")],
    "learning rate": [("train", "lr", "learning rate")],
    "held-out masked-LM loss": [("eval", "loss", "held-out")],
}


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a pre-training run's log.jsonl (see training.plot.read_log)."""
    return plot.read_log(path, "bertforge pretrain train")


def plot_log(records: list[dict[str, Any]], output: Path, title: str = "") -> None:
    """Draw PANELS from `records` into a 2 x 2 PNG at `output`, written atomically."""
    plot.plot_log(records, PANELS, output, f"pre-training: {title}" if title else "pre-training")
