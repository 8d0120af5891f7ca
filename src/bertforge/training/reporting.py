"""Where a training run's log records go besides its JSON-lines log: the dashboards of REPORTERS (TensorBoard),
with transformers' tag names (train/loss, train/learning_rate, eval/accuracy) so that a dashboard of a bertforge
run looks like one of a transformers Trainer run.

A reporter writes into OUTPUT/runs/ (`tensorboard --logdir OUTPUT/runs`), in the main process only. A resumed run
hides what the killed one reported from the checkpoint's step on (TensorBoard's purge_step) and reports again the
records at that step that the log kept, so that every step is on the dashboard once, as it is in the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import ConfigError, check_choice

RUNS_DIR = "runs"
# The events of a record that dashboards show: a record's "event" is the first part of its tags.
REPORTED_EVENTS = ("train", "eval")
# A log field's name on the dashboards where transformers names it otherwise.
TAG_NAMES = {"lr": "learning_rate"}
# Fields that are no curve: where the record belongs. An evaluation's epoch is the training records' (train/epoch).
NOT_REPORTED = {"train": {"event", "step"}, "eval": {"event", "step", "epoch"}}


def tags(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a log record under transformers' tag names: {"train/loss": 0.69, "train/learning_rate": 5e-5};
    nothing for a record of another event. A NaN stays a NaN (the JSON log writes it as null)."""
    event = record.get("event")
    if event not in REPORTED_EVENTS:
        return {}
    return {f"{event}/{TAG_NAMES.get(name, name)}": float(value) for name, value in record.items()
            if name not in NOT_REPORTED[event] and isinstance(value, (int, float)) and not isinstance(value, bool)}


def summary_writer_class():
    """torch's SummaryWriter, or a one-line ConfigError naming the package it needs."""
    try:
        # Asked for first: once torch.utils.tensorboard is imported it no longer checks that tensorboard is there.
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--report-to tensorboard needs the tensorboard package: "
                          "pip install 'bertforge[tensorboard]'") from None
    return SummaryWriter


class TensorBoardReporter:
    """Scalars in TensorBoard event files in `directory`/runs, at the optimizer step of each record."""

    EVENT_FILES = "events.out.tfevents.*"

    @staticmethod
    def check_installed() -> None:
        summary_writer_class()

    def __init__(self, directory: Path, resumed_from: int | None = None):
        runs = Path(directory) / RUNS_DIR
        earlier = sorted(runs.glob(self.EVENT_FILES))
        if resumed_from is None:
            for path in earlier:  # another run's curves: a fresh run starts its dashboard empty, as its log
                path.unlink()
        # The step from which this run reports what the log holds: the checkpoint's, or the first when the killed
        # run reported nothing (it ran without --report-to).
        self.first_step = resumed_from if resumed_from is not None and earlier else 0
        # purge_step: TensorBoard's reader hides the earlier files' events from that step on (those of the steps
        # the killed run made after its checkpoint, which this run makes again)
        self.writer = summary_writer_class()(log_dir=str(runs), purge_step=self.first_step if earlier else None)

    def report(self, record: dict[str, Any]) -> None:
        for tag, value in tags(record).items():
            self.writer.add_scalar(tag, value, global_step=record["step"])
        self.writer.flush()  # a killed run's curves are complete up to its last record, as its log is

    def close(self) -> None:
        self.writer.close()


# name -> reporter class: check_installed() (a ConfigError naming what to install), (directory, resumed_from),
# report(record), close()
REPORTERS: dict[str, type] = {"tensorboard": TensorBoardReporter}


def check_reporter_names(names: Sequence[str] | None) -> None:
    """A ConfigError for a name that is not one of REPORTERS' (a config's check; what is installed is the run's)."""
    for name in names or ():
        check_choice(name, REPORTERS, "reporter")


def report_to_names(value: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """A config's report_to as a tuple of checked names: JSON's list, or one name alone (transformers' report_to
    takes "tensorboard" too); None stays None."""
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else tuple(value)
    check_reporter_names(names)
    return names


def check_reporters(names: Sequence[str] | None) -> None:
    """check_reporter_names, and a ConfigError for a reporter whose package is missing: a run checks this before
    any work, not after its first steps."""
    check_reporter_names(names)
    for name in names or ():
        REPORTERS[name].check_installed()


class Reporters:
    """The reporters of one run: checked when made, opened by `start` once the run knows its first step, closed on
    leaving the `with` block (flushed, whether the run ended or failed)."""

    def __init__(self, names: Sequence[str] | None):
        check_reporters(names)
        self.names = tuple(names or ())
        self.open: list[Any] = []

    def start(self, directory: Path, resumed_from: int | None = None, kept: Iterable[dict[str, Any]] = ()) -> None:
        """Open each reporter in `directory`; a resumed run (from the checkpoint of step `resumed_from`) reports
        again the records its log `kept` from each reporter's first step on."""
        self.close()
        self.open = [REPORTERS[name](directory, resumed_from) for name in self.names]
        kept = list(kept)
        for reporter in self.open:
            for record in kept:
                if record.get("step", 0) >= reporter.first_step:
                    reporter.report(record)

    def report(self, record: dict[str, Any]) -> None:
        for reporter in self.open:
            reporter.report(record)

    def close(self) -> None:
        while self.open:
            self.open.pop().close()

    def __enter__(self) -> Reporters:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
