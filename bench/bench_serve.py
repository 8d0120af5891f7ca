"""Load test of `bertforge serve` on loopback: concurrent clients posting /embed, bounded in time and count.

    python bench/bench_serve.py [--clients 64] [--seconds 20] [--model default] [--compare-unbatched]

The server runs in its own process (as `bertforge serve`, on a free 127.0.0.1 port). Each client thread keeps one
HTTP connection and posts real sentences (SST-2 dev) until the time or request budget runs out, with mixed request
sizes: 1-4 sentences mostly, 16 or 64 now and then. Reports requests/s, sentences/s, p50/p99 latency, the requests
shed with 503 (the bounded queue doing its job), failed requests (anything else; must be 0), how many large
requests were served, and the server's batch sizes. With --compare-unbatched it repeats the run against a server
with --max-batch-size 1 and prints the ratio. The server's resident memory after the warm-up and at the end shows
whether a long run grows it (per-shape kernel caches did: fast_cpu.prepacking_pays). The machine (lscpu model
name and AVX-512/AMX flags) is printed.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from machine import machine  # bench/ is the script's folder, so on sys.path

from bertforge.inference.serve.settings import ServeSettings

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# The CLI path (thread count, allocator tuning, argument parsing); registers `serve` itself if main.py doesn't yet.
SERVER_SCRIPT = """
import sys
from bertforge.cli import serve
from bertforge.cli.main import SUBCOMMANDS, main
SUBCOMMANDS.setdefault("serve", (serve, "the HTTP inference server"))
sys.exit(main(sys.argv[1:]))
"""


def read_sentences() -> list[str]:
    with open(DATA / "sst2" / "dev.tsv", encoding="utf-8") as handle:
        return [row["sentence"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(port: int, path: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
        return json.load(response)


class ServerProcess:
    """`bertforge serve` in a subprocess; stopped with SIGINT (then killed if it lingers)."""

    def __init__(self, model: str, threads: int, extra: list[str], start_timeout: float = 180.0):
        self.port = free_port()
        command = [sys.executable, "-c", SERVER_SCRIPT, "--threads", str(threads), "serve", "--model", model,
                   "--host", "127.0.0.1", "--port", str(self.port), *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + start_timeout
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited: {self.process.stderr.read()}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not answer /health within {start_timeout:.0f} s")
            try:
                get_json(self.port, "/health", timeout=1.0)
                return
            except OSError:
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# Sentences per request and how often: mostly small, with large requests mixed in.
REQUEST_SIZES = ((1, 40), (2, 20), (4, 25), (16, 10), (64, 5))
LARGE = 16  # requests of at least this many sentences count as large


def client(port: int, sentences: list[str], seed: int, end: float, max_requests: int, results: list) -> None:
    """Post /embed until `end` or `max_requests`; append (latency seconds, sentences, status) per request, status
    0 when the request failed without an HTTP answer."""
    rng = random.Random(seed)
    sizes, weights = zip(*REQUEST_SIZES)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(max_requests):
        if time.monotonic() >= end:
            break
        texts = rng.choices(sentences, k=rng.choices(sizes, weights)[0])
        body = json.dumps({"texts": texts})
        start = time.perf_counter()
        try:
            connection.request("POST", "/embed", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
            status = response.status
            if status == 200 and len(json.loads(payload)["embeddings"]) != len(texts):
                status = -1
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            status = 0
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        results.append((time.perf_counter() - start, len(texts), status))
    connection.close()


def resident_mb(pid: int) -> float:
    """A process's resident memory in MB (Linux's /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    except OSError:
        return float("nan")


def memory_once_idle(pid: int) -> float:
    """The server's resident memory after it has been quiet long enough to give freed memory back."""
    time.sleep(ServeSettings().release_memory_after + 2)  # the server runs with the default
    return resident_mb(pid)


def load_test(port: int, sentences: list[str], clients: int, seconds: float, max_requests: int, pid: int) -> dict:
    # Warm-up outside the measurement: first forward passes allocate and pick kernels.
    for size in (1, 4, 16):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/embed",
                                         data=json.dumps({"texts": sentences[:size]}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=60).read()
    before, memory_before = get_json(port, "/health"), resident_mb(pid)
    results: list[tuple[float, int, int]] = []  # list.append is atomic: the threads share it
    start = time.monotonic()
    end = start + seconds
    threads = [threading.Thread(target=client, args=(port, sentences, seed, end, max_requests // clients, results))
               for seed in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    elapsed = time.monotonic() - start
    after = get_json(port, "/health")
    latencies = sorted(latency for latency, _, status in results if status == 200)
    batches, texts = after["batches"] - before["batches"], after["texts"] - before["texts"]
    large = [status for _, size, status in results if size >= LARGE]
    return {
        "requests": len(results),
        "shed": sum(status == 429 for _, _, status in results),  # the queue full: load shed by design
        "failed": sum(status not in (200, 429) for _, _, status in results),
        "large_served": f"{large.count(200)}/{len(large)}",
        "requests_per_s": len(latencies) / elapsed,
        "sentences_per_s": sum(n for _, n, status in results if status == 200) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan"),
        "mean_batch": texts / batches if batches else 0.0,
        "largest_batch": after["largest_batch"],
        "seconds": elapsed,
        "mb_start": memory_before,
        "mb_end": resident_mb(pid),
        "mb_idle": memory_once_idle(pid),
    }


def report(name: str, figures: dict) -> str:
    return (f"{name:<22}{figures['requests_per_s']:>10.1f}{figures['sentences_per_s']:>13.1f}"
            f"{figures['p50_ms']:>10.1f}{figures['p99_ms']:>10.1f}{figures['mean_batch']:>12.1f}"
            f"{figures['requests']:>10d}{figures['shed']:>7d}{figures['large_served']:>13}{figures['failed']:>8d}"
            f"{figures['mb_start']:>10.0f}{figures['mb_end']:>8.0f}{figures['mb_idle']:>8.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-requests", type=int, default=200_000, help="upper bound on requests in all")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    # On a small machine the clients need a core: a torch thread that shares one with them waits at every barrier.
    parser.add_argument("--server-threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="torch threads in the server (default: all cores but one, left to the clients)")
    parser.add_argument("--compare-unbatched", action="store_true", help="also run with --max-batch-size 1")
    args = parser.parse_args()

    sentences = read_sentences()
    runs = {"micro-batched": ["--max-wait-ms", str(args.max_wait_ms)]}
    if args.compare_unbatched:
        runs["unbatched (batch 1)"] = ["--max-batch-size", "1"]
    mix = ", ".join(f"{size} ({weight}%)" for size, weight in REQUEST_SIZES)
    print(f"{machine()}")
    print(f"bertforge serve, model {args.model}, {args.server_threads} torch thread(s): {args.clients} clients x "
          f"{args.seconds:.0f} s on 127.0.0.1, SST-2 dev sentences per POST /embed: {mix}")
    print(f"{'server':<22}{'req/s':>10}{'sentences/s':>13}{'p50 ms':>10}{'p99 ms':>10}{'mean batch':>12}"
          f"{'requests':>10}{'503':>7}{'large served':>13}{'failed':>8}{'MB start':>10}{'end':>8}{'idle':>8}")
    figures = {}
    for name, extra in runs.items():
        server = ServerProcess(args.model, args.server_threads, extra)
        try:
            figures[name] = load_test(server.port, sentences, args.clients, args.seconds, args.max_requests,
                                      server.process.pid)
        finally:
            server.stop()
        print(report(name, figures[name]), flush=True)
    if args.compare_unbatched:
        ratio = figures["micro-batched"]["sentences_per_s"] / figures["unbatched (batch 1)"]["sentences_per_s"]
        print(f"micro-batching: {ratio:.2f}x the sentences/s of one text per forward pass")
    return 1 if any(f["failed"] for f in figures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
