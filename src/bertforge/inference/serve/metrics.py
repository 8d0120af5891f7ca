"""Prometheus metrics of one server (prometheus-client, a registry of its own): requests by route and status,
latency, queue depth, batch sizes and the tokens run through the model; beside them, text-embeddings-inference's
own families (te_*, tei_metrics.py), for the dashboards, alerts and benchmarks written against TEI. Also what one
request cost, answered in text-embeddings-inference's response headers (x-compute-*)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.inference.serve.tei_metrics import TEI_ROUTES, TeiMetrics

SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ServerMetrics:
    def __init__(self, queue_depth: Callable[[], int], max_input_length: int = 512):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:
            raise BertforgeError("the server needs prometheus-client for /metrics: "
                                 "pip install 'bertforge[serve]'") from None
        self.registry = CollectorRegistry()
        common = {"namespace": "bertforge", "registry": self.registry}
        self.requests = Counter("requests", "HTTP requests answered, by route and status", ["route", "status"],
                                **common)
        self.latency = Histogram("request_seconds", "Time from a request's arrival to its answer", ["route"],
                                 buckets=LATENCY_BUCKETS, **common)
        self.batch_rows = Histogram("batch_size", "Rows (texts, pairs or windows) per forward pass",
                                    buckets=SIZE_BUCKETS, **common)
        self.batch_tokens = Histogram("batch_tokens", "Real tokens per forward pass", buckets=TOKEN_BUCKETS,
                                      **common)
        self.tokens = Counter("tokens", "Tokens run through the model", **common)
        self.rows = Counter("rows", "Rows run through the model", **common)
        self.queue = Gauge("queue_depth", "Rows waiting for the model", **common)
        self.queue.set_function(queue_depth)
        self.tei = TeiMetrics(queue_depth, max_input_length)

    def count_batch(self, lengths: Sequence[int]) -> None:
        self.batch_rows.observe(len(lengths))
        self.batch_tokens.observe(sum(lengths))
        self.tokens.inc(sum(lengths))
        self.rows.inc(len(lengths))
        self.tei.count_batch(lengths)

    def count_request(self, route: str, status: int, seconds: float, path: str, cost: RequestCost) -> None:
        """A request's end: `route` is its metric label (its path, or "other"), `cost` what it cost."""
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)
        self.tei.count_request(path, status, seconds, cost)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry) + self.tei.render().encode(), CONTENT_TYPE_LATEST


@dataclass
class RequestCost:
    """What one request cost: the characters it sent, the tokens the model read, and the seconds spent tokenizing,
    waiting in the batcher's queue and in forward passes (the last two summed over its model inputs)."""

    characters: int = 0
    tokens: int = 0
    tokenizing: float = 0.0
    job_seconds: list[tuple[float, float]] = field(default_factory=list)  # each model input's (queue, inference)
    # text-embeddings-inference's metrics: (method, kind, inputs) of each of TEI's inference routes the request
    # went through (POST /vertex passes on several), and the err of a refusal where its status doesn't say it
    tei_calls: list[tuple[str, str, int]] = field(default_factory=list)
    tei_failure: str | None = None

    @property
    def rows(self) -> int:
        """Model inputs run."""
        return len(self.job_seconds)

    @property
    def waiting(self) -> float:
        return sum(waiting for waiting, _ in self.job_seconds)

    @property
    def running(self) -> float:
        return sum(running for _, running in self.job_seconds)

    def count_jobs(self, jobs: Sequence) -> None:
        """Jobs of the request that the batcher has run (their `started` and `finished` set)."""
        for job in jobs:
            self.tokens += job.length
            self.job_seconds.append((job.started - job.enqueued, job.finished - job.started))

    def headers(self, seconds: float, compute_type: str) -> list[tuple[bytes, bytes]]:
        """text-embeddings-inference's headers, in whole milliseconds: the request's time, its characters and
        tokens, the time spent tokenizing, and the average queue and inference time of its model inputs."""
        rows = max(self.rows, 1)
        values = {"x-compute-type": compute_type, "x-compute-time": milliseconds(seconds),
                  "x-compute-characters": self.characters, "x-compute-tokens": self.tokens,
                  "x-total-time": milliseconds(seconds), "x-tokenization-time": milliseconds(self.tokenizing),
                  "x-queue-time": milliseconds(self.waiting / rows),
                  "x-inference-time": milliseconds(self.running / rows)}
        return [(name.encode(), str(value).encode()) for name, value in values.items()]


# The cost of the request being answered: set by the request guard, added to where the server tokenizes and runs
# the model (worker threads started with asyncio.to_thread see the same one).
REQUEST_COST: ContextVar[RequestCost | None] = ContextVar("request_cost", default=None)


def milliseconds(seconds: float) -> int:
    return int(seconds * 1000)


COST_HEADERS = tuple(name.decode() for name, _ in RequestCost().headers(0.0, "cpu"))  # what a browser may read


def characters(value: Any) -> int:
    """The characters of the texts in a request's input: a text, texts, pairs, {"question": ..., "context": ...};
    a list of token ids counts its ids, as text-embeddings-inference counts them."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(characters(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(characters(item) for item in value)
    return 1 if isinstance(value, int) else 0  # a token id; None (no pair) is nothing


@contextmanager
def tokenizing(texts: Any = None) -> Iterator[None]:
    """Count the time spent in the block, and the texts' characters (the request's input, counted once), towards
    the request's cost."""
    started = time.monotonic()
    yield
    cost = REQUEST_COST.get()
    if cost is not None:
        cost.characters += characters(texts)
        cost.tokenizing += time.monotonic() - started


def count_characters(texts: Any) -> None:
    """Count a request's input where there is no tokenizing for the server to time: inside a pipeline, which
    tokenizes its texts itself, or token ids."""
    cost = REQUEST_COST.get()
    if cost is not None:
        cost.characters += characters(texts)


def count_jobs(jobs: Sequence) -> None:
    cost = REQUEST_COST.get()
    if cost is not None:
        cost.count_jobs(jobs)


def tei_request(single: bool, kind: str, inputs: int) -> None:
    """Count the request in text-embeddings-inference's metrics, as one of its inference routes takes it: one input
    (method single) or a list (batch), each to embed or predict (kind)."""
    cost = REQUEST_COST.get()
    if cost is not None:
        cost.tei_calls.append(("single" if single else "batch", kind, inputs))


def tei_failure(err: str) -> None:
    """Name the request's refusal in text-embeddings-inference's te_request_failure{err}, where its status alone
    would name it otherwise (the first one named stands)."""
    cost = REQUEST_COST.get()
    if cost is not None and cost.tei_failure is None:
        cost.tei_failure = err


def tei_refused_empty(path: str) -> None:
    """An empty list of inputs, refused before the route reads it: TEI counts it as a batch request that failed
    validation."""
    if path in TEI_ROUTES:
        tei_request(False, TEI_ROUTES[path], 0)
        tei_failure("validation")
