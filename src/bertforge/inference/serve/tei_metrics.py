"""text-embeddings-inference's own Prometheus families (te_*), beside bertforge's in /metrics (metrics.py), for the
dashboards, alerts and benchmarks written against TEI.

Names, types, labels, units and buckets as TEI's router sets them (router/src/prometheus.rs, router/src/lib.rs's
ResponseMetadata::record_metrics, router/src/http/server.rs, core/src/infer.rs, core/src/queue.rs,
core/src/tokenization.rs). TEI's exporter (metrics-exporter-prometheus) names a counter's sample as the counter,
without prometheus-client's `_total`, and dashboards query those names: so these families are written here, not by
prometheus-client. Left out, having nothing in bertforge to count: err="dropped" (TEI's count of an input whose
client went away before it was batched).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertforge.inference.serve.metrics import RequestCost

# seconds: 35 steps of x1.5 from 1.5e-5 (to about 14.6 s), TEI's buckets of every metric named *duration
TEI_DURATION_BUCKETS = tuple(0.00001 * 1.5 ** step for step in range(1, 36))
TEI_BATCH_SIZE_BUCKETS = tuple(2.0 ** power for power in range(13))  # 1 to 4096 inputs
TEI_BATCH_TOKENS_BUCKETS = tuple(2.0 ** power for power in range(21))  # 1 to 1048576 tokens

# TEI's routes that run the model and count their requests, and what each runs per input: "embed" (te_embed_count)
# or "predict" (te_predict_count; TEI's /rerank predicts each (query, text) pair). POST /, /invocations and /vertex
# count as the route whose request they pass on.
TEI_ROUTES = {"/embed": "embed", "/embed_all": "embed", "/embed_sparse": "embed", "/similarity": "embed",
              "/v1/embeddings": "embed", "/embeddings": "embed", "/predict": "predict", "/rerank": "predict"}

# te_request_failure's err for a refusal answered with this status, where the server hasn't named it (tei_failure):
# TEI's labels for the same refusals (an empty input: validation; more inputs than the server takes: batch_size; the
# wrong model for the route: model_type; no permit: overloaded). Anything else failed in the model: inference.
TEI_FAILURES = {400: "validation", 409: "model_type", 413: "batch_size", 422: "validation", 429: "overloaded"}
# Failures after TEI has counted the inputs (te_embed_count / te_predict_count are counted before tokenizing)
PAST_INPUT_CHECKS = ("tokenization", "inference")


class TeiHistogram:
    """A histogram's cumulative bucket counts, sum and count, as TEI's exporter writes them."""

    def __init__(self, buckets: Sequence[float]):
        self.buckets, self.counts = tuple(buckets), [0] * (len(buckets) + 1)  # the last: over every bound (+Inf)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        from prometheus_client.utils import floatToGoString
        lines, seen = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts):
            seen += count
            lines.append(f'{name}_bucket{{le="{floatToGoString(bound)}"}} {seen}')
        return [*lines, f"{name}_sum {floatToGoString(self.sum)}", f"{name}_count {self.count}"]


class TeiMetrics:
    """text-embeddings-inference's metric families, counted from the same events as bertforge's own: a request's
    end (RequestGuard, with its RequestCost) and each batch the batcher runs. A family appears once it is first
    counted, as in TEI; te_queue_size always."""

    HELP = {"te_request_count": "Requests to the inference routes, by method (single: one input, batch: a list)",
            "te_request_success": "Requests answered, by method",
            "te_request_failure": "Requests refused or failed, by err",
            "te_embed_count": "Inputs embedded (counted before tokenizing)",
            "te_embed_success": "Inputs embedded and answered",
            "te_predict_count": "Inputs predicted or reranked (counted before tokenizing)",
            "te_predict_success": "Inputs predicted or reranked and answered",
            "te_queue_size": "Inputs waiting for the model",
            "te_request_input_length": "Tokens of each model input",
            "te_batch_next_size": "Inputs per batch run",
            "te_batch_next_tokens": "Tokens per batch run",
            "te_request_duration": "Seconds from a request's arrival to its answer",
            "te_request_tokenization_duration": "Seconds a request spent tokenizing",
            "te_request_queue_duration": "Seconds a request's inputs waited for the model, on average",
            "te_request_inference_duration": "Seconds a request's inputs spent in the model, on average",
            "te_embed_duration": "Seconds to embed each input: its tokenizing, queue and inference time",
            "te_embed_tokenization_duration": "Seconds tokenizing each input embedded (its request's, shared out)",
            "te_embed_queue_duration": "Seconds each input embedded waited for the model",
            "te_embed_inference_duration": "Seconds of the forward pass that embedded each input",
            "te_predict_duration": "Seconds to predict each input: its tokenizing, queue and inference time",
            "te_predict_tokenization_duration": "Seconds tokenizing each input predicted (its request's, shared "
                                                "out)",
            "te_predict_queue_duration": "Seconds each input predicted waited for the model",
            "te_predict_inference_duration": "Seconds of the forward pass that predicted each input"}

    def __init__(self, queue_depth: Callable[[], int], max_input_length: int):
        self.queue_depth = queue_depth
        # batches are counted on the batcher's thread, requests on the event loop's
        self.lock = threading.Lock()
        self.counters: dict[str, dict[str, int]] = {}  # name -> {rendered labels ('' for none): value}
        self.histograms: dict[str, TeiHistogram] = {}
        length_buckets = [2.0 ** power for power in range(20) if 2 ** power <= max_input_length]
        self.buckets = {"te_request_input_length": length_buckets, "te_batch_next_size": TEI_BATCH_SIZE_BUCKETS,
                        "te_batch_next_tokens": TEI_BATCH_TOKENS_BUCKETS}

    def add(self, name: str, amount: int = 1, labels: str = "") -> None:
        family = self.counters.setdefault(name, {})
        family[labels] = family.get(labels, 0) + amount

    def observe(self, name: str, value: float) -> None:
        histogram = self.histograms.get(name)
        if histogram is None:
            histogram = self.histograms[name] = TeiHistogram(self.buckets.get(name, TEI_DURATION_BUCKETS))
        histogram.observe(value)

    def count_batch(self, lengths: Sequence[int]) -> None:
        """A batch the batcher runs: its size and tokens, and each input's length (TEI records those as it
        tokenizes the inputs of its inference routes: here, as they reach the model)."""
        with self.lock:
            self.observe("te_batch_next_size", len(lengths))
            self.observe("te_batch_next_tokens", sum(lengths))
            for length in lengths:
                self.observe("te_request_input_length", length)

    def count_request(self, path: str, status: int, seconds: float, cost: RequestCost) -> None:
        """A request's end: counted where one of TEI's inference routes took it (cost.tei_calls), or refused it as
        TEI counts a refusal (cost.tei_failure)."""
        failure = None
        if status != 200 and (cost.tei_calls or cost.tei_failure is not None and path in TEI_ROUTES):
            failure = cost.tei_failure or TEI_FAILURES.get(status, "inference")
        if failure is None and not cost.tei_calls:
            return
        rows = max(cost.rows, 1)
        with self.lock:
            for method, kind, inputs in cost.tei_calls:
                self.add("te_request_count", labels=f'method="{method}"')
                if status == 200:
                    self.add("te_request_success", labels=f'method="{method}"')
                    self.add(f"te_{kind}_count", inputs)
                    self.add(f"te_{kind}_success", inputs)
                    # the values of the x-*-time headers, in seconds, as TEI records its headers' values
                    self.observe("te_request_duration", seconds)
                    self.observe("te_request_tokenization_duration", cost.tokenizing)
                    self.observe("te_request_queue_duration", cost.waiting / rows)
                    self.observe("te_request_inference_duration", cost.running / rows)
                elif failure in PAST_INPUT_CHECKS:
                    self.add(f"te_{kind}_count", inputs)
            if failure is not None:
                self.add("te_request_failure", labels=f'err="{failure}"')
            elif cost.tei_calls:
                self.count_inputs(cost.tei_calls[0][1], cost)

    def count_inputs(self, kind: str, cost: RequestCost) -> None:
        """te_embed_*_duration or te_predict_*_duration, per model input of an answered request, as TEI records
        them per input: its queue and inference time are its own; bertforge tokenizes a request's inputs together,
        so each is given an equal share of that time."""
        tokenizing = cost.tokenizing / max(cost.rows, 1)
        for waiting, running in cost.job_seconds:
            self.observe(f"te_{kind}_duration", tokenizing + waiting + running)
            self.observe(f"te_{kind}_tokenization_duration", tokenizing)
            self.observe(f"te_{kind}_queue_duration", waiting)
            self.observe(f"te_{kind}_inference_duration", running)

    def render(self) -> str:
        """The families in Prometheus' text format, after prometheus-client's."""
        with self.lock:
            counters = {name: dict(values) for name, values in self.counters.items()}
            histograms = {name: histogram.lines(name) for name, histogram in self.histograms.items()}
        lines = []
        for name in sorted(counters):
            lines += [f"# HELP {name} {self.HELP[name]}", f"# TYPE {name} counter"]
            lines += [f"{name}{{{labels}}} {value}" if labels else f"{name} {value}"
                      for labels, value in sorted(counters[name].items())]
        lines += ["# HELP te_queue_size " + self.HELP["te_queue_size"], "# TYPE te_queue_size gauge",
                  f"te_queue_size {self.queue_depth()}"]
        for name in sorted(histograms):
            lines += [f"# HELP {name} {self.HELP[name]}", f"# TYPE {name} histogram", *histograms[name]]
        return "\n".join(lines) + "\n"
