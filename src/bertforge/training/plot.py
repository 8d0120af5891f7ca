"""A training log (one JSON object per line, each with a step) drawn as one PNG of panels against the optimizer step:
pre-training's log.jsonl (`bertforge pretrain plot`) and the Trainer's train_log.jsonl (`bertforge finetune` writes
curves.png). Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError, InputError

# A curve: (log event, record key, legend label). A panel is a title and its curves.
Curve = tuple[str, str, str]

CURVES_FILE = "curves.png"
# Up to this many points a curve marks each one, so that a short run (a single evaluation, a few steps) shows.
MARKED_POINTS = 60


def trainer_panels(main_metric: str | None) -> dict[str, list[Curve]]:
    """The Trainer's curves: training loss, learning rate, and the dev metric that picks the best model."""
    return {"training loss": [("train", "loss", "training loss")],
            "learning rate": [("train", "lr", "learning rate")],
            f"dev {main_metric or 'metric'}": [("eval", main_metric, "dev")] if main_metric else []}


def plot_trainer_run(output_dir: Path, title: str = "") -> Path:
    """Draw the Trainer's train_log.jsonl in `output_dir` as curves.png beside it, the dev panel showing the main
    metric named in metrics.json (none without a dev set); returns the PNG's path."""
    from bertforge.training.trainer import METRICS_FILE, TRAIN_LOG_FILE

    metrics = output_dir / METRICS_FILE
    main_metric = json.loads(metrics.read_text(encoding="utf-8"))["main_metric"] if metrics.is_file() else None
    records = read_log(output_dir / TRAIN_LOG_FILE, "bertforge finetune")
    path = output_dir / CURVES_FILE
    plot_log(records, trainer_panels(main_metric), path, title, columns=3)
    return path


def read_log(path: Path, producer: str) -> list[dict[str, Any]]:
    """The records of a log, as far as it is written (a run still writing it, or killed, may have torn its last
    line); a missing or empty log, or a line that isn't a JSON object with a step, is an InputError (`producer`
    names the command whose output folder holds the log)."""
    from bertforge.training.trainer import numbered_records

    if not path.is_file():
        raise InputError(f"no such log: expected the output folder of `{producer}`", path)
    records = []
    for number, record in numbered_records(path):
        if not isinstance(record, dict) or "step" not in record:
            raise InputError("not a log record (a JSON object with a step)", path, line=number)
        records.append(record)
    if not any(record.get("event") == "train" for record in records):
        raise InputError("the log has no training steps yet: nothing to plot", path)
    return records


def plot_log(records: list[dict[str, Any]], panels: dict[str, list[Curve]], output: Path, title: str,
             columns: int = 2, panel_size: tuple[float, float] = (5.5, 3.5)) -> None:
    """Draw `panels` from `records` into a PNG at `output` (written atomically), `columns` panels a row. A curve
    the log lacks is left out; a panel with none says so."""
    from bertforge.atomic import atomic_path

    try:
        # The Figure class alone, not pyplot: no GUI backend and no global figure state to manage.
        from matplotlib.figure import Figure
    except ImportError:
        raise BertforgeError('plotting needs matplotlib: pip install "bertforge[plot]"') from None
    rows = math.ceil(len(panels) / columns)
    image_format = output.suffix[1:].lower() or "png"  # x.svg draws SVG; a name without a suffix gets PNG
    supported = Figure().canvas.get_supported_filetypes()
    if image_format not in supported:
        raise InputError(f"can't draw a .{image_format} image; name a file ending in one of "
                         f"{', '.join('.' + name for name in sorted(supported))}", output)
    figure = Figure(figsize=(panel_size[0] * columns, panel_size[1] * rows), layout="constrained")
    figure.suptitle(title)
    for axes, (panel, curves) in zip(figure.subplots(rows, columns, squeeze=False).flat, panels.items()):
        axes.set_title(panel)
        axes.set_xlabel("step")
        drawn = 0
        for event, key, label in curves:
            points = [(record["step"], record[key]) for record in records
                      if record.get("event") == event and isinstance(record.get(key), (int, float))]
            if points:
                steps, values = zip(*points)
                # Evaluations are few and far between, and a line through one point draws nothing: markers.
                marker = "o" if event == "eval" or len(points) <= MARKED_POINTS else None
                axes.plot(steps, values, label=label, marker=marker, markersize=4 if event == "eval" else 3)
                drawn += 1
        if drawn:
            if len(curves) > 1:
                axes.legend(fontsize="small")
            axes.grid(alpha=0.3)
        else:
            axes.text(0.5, 0.5, "not in this log", ha="center", va="center", transform=axes.transAxes)
    with atomic_path(output) as temporary:
        figure.savefig(temporary, format=image_format, dpi=100)
