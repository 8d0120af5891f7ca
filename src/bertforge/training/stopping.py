"""A stop asked for by the job's scheduler. SLURM, Kubernetes and spot instances send SIGTERM some time before they
kill a job: the step in flight ends, a checkpoint is saved, and the run stops where `--resume` continues it exactly,
instead of losing every step since its last checkpoint. SIGHUP (the terminal closed: an ssh session dropped under a
run started without nohup) is answered the same way."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from bertforge.errors import BertforgeError
from bertforge.training import distributed

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BertforgeError):
    """The run stopped on SIGTERM (or SIGHUP), after a step whose checkpoint it saved."""

    def __init__(self, step: int, checkpoint: Path, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; its checkpoint is in "
                         f"{checkpoint}: continue the run with --resume")
        self.step, self.signum = step, signum


class StopRequests:
    """Called after each step: whether a stop signal came, to any process of the run (a collective: every process
    calls it, and all stop after the same step). `signum`: the signal this process received (else SIGTERM)."""

    def __init__(self, device: torch.device | None):
        self.device, self.received = device, []

    def __call__(self) -> bool:
        if self.device is None:
            return False
        return distributed.all_reduce_sums({"stop": float(bool(self.received))}, self.device)["stop"] > 0

    @property
    def signum(self) -> int:
        return self.received[0] if self.received else signal.SIGTERM


@contextmanager
def stop_on_sigterm(device: torch.device) -> Iterator[Callable[[], bool]]:
    """Within the block SIGTERM and SIGHUP only take note (see StopRequests). Off the main thread, where no signal
    arrives, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield StopRequests(None)
        return
    requests = StopRequests(device)
    # a signal ignored stays ignored: under nohup, SIGHUP is (the run was started to outlive its terminal)
    previous = {signum: signal.signal(signum, lambda signum, frame: requests.received.append(signum))
                for signum in STOP_SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield requests
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
