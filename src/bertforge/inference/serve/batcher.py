"""The micro-batcher: one bounded queue of jobs (one text, pair or window each) and the one worker thread, the
only code that touches the model, which runs them in batches.

A batch takes jobs in arrival order up to max_batch_size rows and max_batch_tokens padded tokens, waiting at
most max_wait_ms after the oldest arrived for company. A request is admitted whole while fewer than max_queue
jobs wait (so a large request has the same chance as a small one; the queue overshoots by at most one request)
and is refused whole otherwise. A worker idle for `release_memory_after` seconds after a batch gives the memory
freed since back to the system.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from bertforge.errors import BertforgeError
from bertforge.runtime import release_freed_memory

# Under load a server keeps the memory its batches free (glibc holds it, up to tune_cpu_allocator's gigabyte, and
# new pages cost more than the matrix products that fill them); a quiet one gives it back: on AVX2, /predict took
# a server from 355 to 753 MB in 2,400 requests, and malloc_trim back to 407.
RELEASE_MEMORY_AFTER = 10.0  # seconds of quiet


@dataclass
class Job:
    """One model row waiting for the model; `run(model, jobs)` computes the results of a list of jobs of its kind."""

    run: Callable[[torch.nn.Module, list[Job]], list[Any]]
    row: dict[str, Any]  # input_ids, token_type_ids (+ whatever `run` needs) of one row
    options: dict[str, Any] = field(default_factory=dict)
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None  # when the worker began its forward pass, and when that ended
    finished: float | None = None

    @property
    def length(self) -> int:
        return len(self.row["input_ids"])


class QueueFull(BertforgeError):
    """The batcher holds max_queue jobs already, or is shutting down."""


class MicroBatcher:
    """A bounded queue of jobs and the one worker thread that runs them on the model in batches."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int = 32, max_batch_tokens: int = 16384,
                 max_wait_ms: float = 5.0, max_queue: int = 256,
                 release_memory_after: float = RELEASE_MEMORY_AFTER,
                 on_batch: Callable[[Sequence[Job]], None] | None = None):
        self.model = model
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self.max_wait, self.max_queue = max_wait_ms / 1000, max_queue
        self.on_batch = on_batch  # told of every batch before it runs (metrics)
        self.release_memory_after = release_memory_after  # seconds of quiet; 0: never
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._ran_since_release = False  # a batch ran since the worker last gave memory back
        self.batches = self.rows = self.largest_batch = 0
        self._thread = threading.Thread(target=self._work, name="bertforge-batcher", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(self, jobs: list[Job]) -> list[Future]:
        """Queue all of `jobs`, or none (QueueFull) when max_queue jobs wait already."""
        with self._ready:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"the server is busy ({len(self._queue)} texts queued); retry shortly")
            self._queue.extend(jobs)
            self._ready.notify()
        return [job.future for job in jobs]

    def stop(self, timeout: float | None = 60.0) -> None:
        """Refuse new jobs, finish the queued ones, then end the worker."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(timeout)

    def _fits(self, batch: list[Job], job: Job) -> bool:
        longest = max([job.length, *(queued.length for queued in batch)])
        return len(batch) < self.max_batch_size and (len(batch) + 1) * longest <= self.max_batch_tokens

    def _take(self) -> list[Job]:
        batch = [self._queue.popleft()]  # always one, however long
        while self._queue and self._fits(batch, self._queue[0]):
            batch.append(self._queue.popleft())
        return batch

    def _next_batch(self) -> list[Job] | None:
        with self._ready:
            while not self._queue and not self._stopping:
                if not self._ran_since_release or not self.release_memory_after:
                    self._ready.wait()
                elif not self._ready.wait(self.release_memory_after) and not self._queue and not self._stopping:
                    self._ran_since_release = False
                    self._ready.release()  # a request arriving meanwhile queues at once
                    try:
                        release_freed_memory()
                    finally:
                        self._ready.acquire()
            if not self._queue:
                return None
            # Wait for company until the oldest job has waited max_wait: jobs that queued up during the previous
            # forward pass go at once.
            deadline = self._queue[0].enqueued + self.max_wait
            while not self._stopping and len(self._queue) < self.max_batch_size and \
                    sum(job.length for job in self._queue) < self.max_batch_tokens:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            return self._take()

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            # Skip jobs whose request went away; the others can't be cancelled from now on.
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            self.batches += 1
            self._ran_since_release = True
            self.rows += len(batch)
            self.largest_batch = max(self.largest_batch, len(batch))
            if self.on_batch is not None:
                self.on_batch(batch)
            by_run: dict[Callable, list[Job]] = {}
            for job in batch:
                by_run.setdefault(job.run, []).append(job)
            for run, jobs in by_run.items():
                # Longest first: the padded batch then reads like evaluation's length-sorted ones.
                jobs.sort(key=lambda job: job.length, reverse=True)
                started = time.monotonic()
                try:
                    with torch.inference_mode():
                        results = run(self.model, jobs)
                except Exception as error:  # handed to each request, which reports it
                    if isinstance(error, StopIteration):  # asyncio can't carry it across into a request
                        error = RuntimeError(f"StopIteration in the model: {error}")
                    for job in jobs:
                        job.future.set_exception(error)
                    continue
                finished = time.monotonic()
                for job, result in zip(jobs, results):
                    job.started, job.finished = started, finished
                    job.future.set_result(result)
