"""Prometheus metrics of one server (prometheus-client, a registry of its own): requests by route and status,
latency, queue depth, batch sizes and the tokens run through the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bertforge.errors import BertforgeError

SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ServerMetrics:
    def __init__(self, queue_depth: Callable[[], int]):
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

    def count_batch(self, lengths: Sequence[int]) -> None:
        self.batch_rows.observe(len(lengths))
        self.batch_tokens.observe(sum(lengths))
        self.tokens.inc(sum(lengths))
        self.rows.inc(len(lengths))

    def count_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
