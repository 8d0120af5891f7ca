"""A pre-training run's log.jsonl drawn as one PNG: training loss, accuracies, learning rate and held-out
evaluations, each against the optimizer step. Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError, InputError

# panel title -> its curves: (log event, record key, legend label). A curve the log lacks (no sentence pairs,
# no held-out evaluation) is left out; a panel with none says so.
PANELS: dict[str, list[tuple[str, str, str]]] = {
    "training loss": [("train", "loss", "objective (mean per micro-batch)")],
    "accuracy": [("train", "mlm_accuracy", "masked LM"), ("train", "sentence_pair_accuracy", "NSP / SOP"),
                 ("train", "replaced_token_accuracy", "replaced token (ELECTRA)"),
                 ("eval", "accuracy", "held-out masked LM")],
    "learning rate": [("train", "lr", "learning rate")],
    "held-out masked-LM loss": [("eval", "loss", "held-out")],
}


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a log.jsonl; a missing or empty log, or a line that isn't a JSON object, is an InputError."""
    if not path.is_file():
        raise InputError("no such log: expected the output folder of `bertforge pretrain train`", path)
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InputError("not a JSON line", path, line=number) from None
        if not isinstance(record, dict) or "step" not in record:
            raise InputError("not a log record (a JSON object with a step)", path, line=number)
        records.append(record)
    if not any(record.get("event") == "train" for record in records):
        raise InputError("the log has no training steps yet: nothing to plot", path)
    return records


def plot_log(records: list[dict[str, Any]], output: Path, title: str = "") -> None:
    """Draw PANELS from `records` into a 2 x 2 PNG at `output`, written atomically."""
    from bertforge.atomic import atomic_path

    try:
        # The Figure class alone, not pyplot: no GUI backend and no global figure state to manage.
        from matplotlib.figure import Figure
    except ImportError:
        raise BertforgeError('plotting needs matplotlib: pip install "bertforge[plot]"') from None
    figure = Figure(figsize=(11, 7), layout="constrained")
    figure.suptitle(f"pre-training: {title}" if title else "pre-training")
    for axes, (panel, curves) in zip(figure.subplots(2, 2).flat, PANELS.items()):
        axes.set_title(panel)
        axes.set_xlabel("step")
        drawn = 0
        for event, key, label in curves:
            points = [(record["step"], record[key]) for record in records
                      if record.get("event") == event and isinstance(record.get(key), (int, float))]
            if points:
                steps, values = zip(*points)
                # Evaluations are few and far between: markers show where they were taken.
                axes.plot(steps, values, label=label, marker="o" if event == "eval" else None)
                drawn += 1
        if drawn:
            axes.legend(fontsize="small")
            axes.grid(alpha=0.3)
        else:
            axes.text(0.5, 0.5, "not in this log", ha="center", va="center", transform=axes.transAxes)
    with atomic_path(output) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
