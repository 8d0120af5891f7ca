"""Encoder inference throughput: bertforge vs transformers (SDPA) on the same weights and inputs, one run.

    python bench/bench_encoder.py [--threads 2] [--repeats 5] [--models minilm,base]

Workloads: a batch of 32 full 128-token sequences (real SQuAD text), and real variable-length text
(SST-2 dev sentences in batches of 32, in file order, each batch padded to its longest).
Everything runs twice: with glibc's default allocator, then after `tune_cpu_allocator()` (what the bertforge
command does at start-up). The allocator setting is process-wide, so the reference gains from it too.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from real_text import read_squad_contexts, read_sst2_dev  # bench/ is the script's folder, so on sys.path
from same_weights import load_pair

from bertforge import BertTokenizer
from bertforge.runtime import tune_cpu_allocator


def workloads(tokenizer: BertTokenizer) -> dict[str, list[dict[str, torch.Tensor]]]:
    long_enough = [text for text in read_squad_contexts() if len(tokenizer.tokenize(text)) >= 126][:32]
    full = tokenizer(long_enough, truncation=True, max_length=128, return_tensors="pt")
    sentences = read_sst2_dev()
    variable = [tokenizer(sentences[i:i + 32], padding=True, return_tensors="pt")
                for i in range(0, len(sentences) - len(sentences) % 32, 32)]
    return {"full 32x128": [dict(full)], "SST-2 dev, batch 32": [dict(batch) for batch in variable]}


def run_pass(model, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        model(**batch)
    return time.perf_counter() - start


def compare(ours, reference, batches, repeats: int) -> tuple[float, float]:
    """Median seconds per pass of each model, interleaved and alternating who goes first, so that neither
    inherits a warmer cache or allocator state from the other."""
    times = {"ours": [], "reference": []}
    with torch.inference_mode():
        run_pass(ours, batches[:1]), run_pass(reference, batches[:1])  # warm-up
        for repeat in range(repeats):
            order = [("ours", ours), ("reference", reference)]
            for name, model in order if repeat % 2 == 0 else order[::-1]:
                times[name].append(run_pass(model, batches))
    return statistics.median(times["ours"]), statistics.median(times["reference"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="minilm,base")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = BertTokenizer.from_pretrained("default")
    inputs = workloads(tokenizer)

    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats}")
    print(f"{'allocator':<10}{'model':<8}{'workload':<22}{'real tokens':>12}{'bertforge seq/s':>17}"
          f"{'transformers seq/s':>20}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as scratch:
        loaded = {name: load_pair(name, Path(scratch)) for name in args.models.split(",")}
        for allocator in ("default", "tuned"):
            if allocator == "tuned":
                tune_cpu_allocator()
            for name, (ours, reference) in loaded.items():
                for workload, batches in inputs.items():
                    sequences = sum(len(b["input_ids"]) for b in batches)
                    fill = (sum(int(b["attention_mask"].sum()) for b in batches)
                            / sum(b["input_ids"].numel() for b in batches))
                    ours_s, reference_s = compare(ours, reference, batches, args.repeats)
                    print(f"{allocator:<10}{name:<8}{workload:<22}{fill:>11.0%} {sequences / ours_s:>16.1f}"
                          f"{sequences / reference_s:>20.1f}{reference_s / ours_s:>7.2f}x", flush=True)

if __name__ == "__main__":
    main()
