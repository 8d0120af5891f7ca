"""The accuracy gate of `bertforge quantize` and `bertforge distill`: a smaller model is measured beside the one it
came from on the user's own dev set (the task's metric and the time to predict it), and written only when the
metric drops by no more than the points allowed.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bertforge.errors import InputError
from bertforge.outputs import check_parent, to_json
from bertforge.tasks.finetuned_model import FinetunedModel

COMPRESSION_FILE = "compression.json"
DEFAULT_MAX_DROP = 0.5  # points the smaller model may lose (--max-drop of quantize and distill)


@dataclass
class Measurement:
    """One model on the dev set: its metrics and the seconds to tokenize, predict and decode all of it."""

    name: str
    metrics: dict[str, float]
    seconds: float


@dataclass
class GateReport:
    metric: str  # the task's main metric; higher is better
    reference: Measurement
    candidate: Measurement
    max_drop: float  # points: 100 x the metric (0.5 = half a point of accuracy)
    # candidates measured before this one and refused (quantize's fallback tries a more careful recipe next)
    rejected: list[Measurement] = field(default_factory=list)

    @property
    def drop(self) -> float:
        """Points lost by the candidate (negative: it gained)."""
        return 100 * (self.reference.metrics[self.metric] - self.candidate.metrics[self.metric])

    @property
    def accepted(self) -> bool:
        return self.drop <= self.max_drop

    def table(self) -> str:
        """Both models side by side: every metric, the main one's change in points, and the predict time."""
        rows = (self.reference, *self.rejected, self.candidate)
        first = max(8, *(len(row.name) + 2 for row in rows))
        widths = {name: max(10, len(name) + 2) for name in self.reference.metrics}
        lines = [f"{'':<{first}}" + "".join(f"{name:>{width}}" for name, width in widths.items())
                 + f"{'points':>9}{'predict s':>11}{'speed-up':>10}"]
        for row in rows:
            values = "".join(f"{row.metrics.get(name, float('nan')):>{width}.4f}" for name, width in widths.items())
            lines.append(f"{row.name:<{first}}{values}{self.change(row):>+9.2f}{row.seconds:>11.2f}"
                         f"{self.reference.seconds / row.seconds:>9.2f}x")
        return "\n".join(lines)

    def verdict(self) -> str:
        # a negative max_drop asks the smaller model to gain that much: said as a gain, not as "a drop of -1"
        asked = (f"a drop of at most {self.max_drop} allowed" if self.max_drop >= 0 else
                 f"a gain of at least {-self.max_drop} asked for")
        change = self.change(self.candidate)
        # with earlier candidates refused, say which one this verdict is about
        which = f" with {self.candidate.name}" if self.rejected else ""
        if self.accepted:
            refused = "; ".join(f"{row.name} changed it by {self.change(row):+.2f}" for row in self.rejected)
            return (f"{self.metric} changed by {change:+.2f} points{which} ({asked}): accepted"
                    + (f" ({refused})" if refused else ""))
        tried = f", the last of {len(self.rejected) + 1} recipes tried," if self.rejected else ","
        if self.max_drop < 0:
            return (f"{self.metric} changed by {change:+.2f} points{which}{tried} short of the gain of at least "
                    f"{-self.max_drop} asked for (--max-drop {self.max_drop}): nothing written")
        return (f"{self.metric} dropped by {self.drop:.2f} points{which}{tried} more than the {self.max_drop} "
                f"allowed (--max-drop): nothing written")

    def change(self, row: Measurement) -> float:
        """Points `row` gained on the reference (negative: lost); no change reads +0.00, not -0.00."""
        return 0.0 + 100 * (row.metrics[self.metric] - self.reference.metrics[self.metric])

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "max_drop": self.max_drop, "drop": self.drop, "accepted": self.accepted,
                "reference": asdict(self.reference), "candidate": asdict(self.candidate),
                "rejected": [asdict(row) for row in self.rejected]}


def measure(name: str, finetuned: FinetunedModel, examples: Sequence[Any], batch_size: int = 64) -> Measurement:
    """Metrics on `examples`; the predictions (tokenizing, the model, decoding; not the scoring) timed after a
    warm-up (`warm_up_examples`)."""
    finetuned.predict(warm_up_examples(finetuned, examples, batch_size), batch_size)
    start = time.perf_counter()
    predictions = finetuned.predict(examples, batch_size)
    seconds = time.perf_counter() - start
    return Measurement(name, finetuned.task.score(predictions, examples, finetuned.id2label), seconds)


def check_measurable(metric: str, metrics: dict[str, float], dev: str | Path | None) -> None:
    """Refuse a dev set on which the original model's main metric is not a number (a correlation of scores that
    are all the same): no drop could be measured against it, and every candidate would be refused as NaN."""
    if not math.isfinite(metrics[metric]):
        raise InputError(f"{metric} is not a number on this dev set (for a correlation: every score the same), so "
                         "no drop can be measured; give a dev set the metric can score", dev)


def warm_up_examples(finetuned: FinetunedModel, examples: Sequence[Any], batch_size: int) -> Sequence[Any]:
    """What `measure` predicts untimed first: all of them. Every device's libraries pay a first call per batch
    shape, which a model in service pays once and which would otherwise decide the comparison: on a GPU cuBLAS
    choosing its kernel (on an H200 a bf16 pass over new shapes of SST-2 dev took 1.3-1.7x the next), on a CPU
    oneDNN making its int8 kernels (200 SST-2 sentences: int8's first pass took 2-3x the next, so the gate
    measured it slower than fp32, where it is 2x faster)."""
    return examples


def check_output(output: str | Path) -> Path:
    """The output directory, refused before any work if it already holds something (nothing is overwritten)."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise InputError("exists and is a file; the output is a model folder", output)
    if output.is_dir() and any(output.iterdir()):
        raise InputError("the output directory already exists and is not empty", output)
    check_parent(output, "output folder")
    return output


def write_if_accepted(report: GateReport | None, output: Path, write: Callable[[Path], None]) -> bool:
    """If the gate passes (or there is none: `report` None): `write(folder)` into a temporary folder beside
    `output`, add the report, and rename it to `output` in one step (a half-written model never appears there).
    Returns whether it wrote."""
    if report is not None and not report.accepted:
        return False
    temporary = None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}."))
        write(temporary)
        if report is not None:
            (temporary / COMPRESSION_FILE).write_text(to_json(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        os.chmod(temporary, 0o755)  # mkdtemp makes it private; the result is an ordinary directory
        os.replace(temporary, output)
    except OSError as error:  # a full disk: the temporary folder's name means nothing to the user
        raise InputError(f"can't write the model: {error.strerror or error}", output) from None
    finally:
        if temporary is not None and temporary.exists():
            shutil.rmtree(temporary)
    return True
