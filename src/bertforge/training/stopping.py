"""A stop asked for by the job's scheduler. SLURM, Kubernetes and spot instances send SIGTERM some time before they
kill a job: the step in flight ends, a checkpoint is saved, and the run stops where `--resume` continues it exactly,
instead of losing every step since its last checkpoint."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from bertforge.errors import BertforgeError
from bertforge.training import distributed


class Stopped(BertforgeError):
    """The run stopped on SIGTERM, after a step whose checkpoint it saved."""

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"stopped by SIGTERM after step {step}; its checkpoint is in {checkpoint}: continue the run "
                         "with --resume")
        self.step = step


@contextmanager
def stop_on_sigterm(device: torch.device) -> Iterator[Callable[[], bool]]:
    """Within the block SIGTERM only takes note; the function yielded says whether it came, to any process of the
    run (a collective: every process calls it after each step, and all stop after the same one). Off the main
    thread, where no signal arrives, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield lambda: distributed.all_reduce_sums({"stop": float(bool(received))}, device)["stop"] > 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
