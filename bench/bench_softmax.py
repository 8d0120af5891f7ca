"""Attention's softmax on short rows: `activations.softmax` vs torch's own, one run.

    python bench/bench_softmax.py [--threads 2] [--repeats 10] [--questions 2048]

First the softmax alone on 64 x 12 rows of each key count (float32; from one vector's lanes on, both are torch's
kernel, and their ratio shows the noise), then the default model (all-MiniLM-L6-v2) end to end on SQuAD's dev
questions (real short texts: ~14 tokens), sorted by length into batches of 64, in float32 and int8, with
attention's softmax being `activations.softmax` or torch's, the two taking turns pass by pass.
Prints each time and the ratio bertforge's / torch's (below 1: faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from real_text import DATA  # bench/ is the script's folder, so on sys.path

from bertforge import BertModel, BertTokenizer
from bertforge import model as model_module
from bertforge.activations import float32_lanes, softmax
from bertforge.checkpoint import default_model_dir
from bertforge.compress import QuantizationConfig, quantize
from bertforge.runtime import tune_cpu_allocator

SOFTMAXES = {"bertforge": softmax, "torch": lambda scores: scores.softmax(dim=-1)}


def seconds(run, repeats: int) -> float:
    run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats


def rows_alone(repeats: int) -> None:
    print(f"softmax alone, 64 x 12 rows of each length, float32 (vector lanes here: {float32_lanes()})")
    for keys in (4, 8, 12, 15, 16, 24, 32):
        scores = torch.randn(64, 12, keys, keys)
        times = {name: seconds(lambda function=function, scores=scores: function(scores), repeats * 20)
                 for name, function in SOFTMAXES.items()}
        print(f"  {keys:3d} keys  bertforge {times['bertforge'] * 1e3:7.3f} ms  torch {times['torch'] * 1e3:7.3f} ms  "
              f"ratio {times['bertforge'] / times['torch']:.3f}")


def end_to_end(questions: list[str], precision: str, repeats: int) -> None:
    directory = default_model_dir()
    model, tokenizer = BertModel.from_pretrained(directory).eval(), BertTokenizer.from_pretrained(directory)
    batches = []
    for start in range(0, len(questions), 64):
        encoded = tokenizer(questions[start:start + 64], padding=True, return_tensors="pt")
        batches.append({name: encoded[name] for name in ("input_ids", "attention_mask", "token_type_ids")})
    if precision == "int8":
        quantize(model, QuantizationConfig("int8"), batches[:4])
    times: dict[str, list[float]] = {name: [] for name in SOFTMAXES}
    try:
        with torch.inference_mode():
            for repeat in range(repeats + 1):
                for name in (list(SOFTMAXES) if repeat % 2 == 0 else list(SOFTMAXES)[::-1]):
                    model_module.softmax = SOFTMAXES[name]
                    start = time.perf_counter()
                    for batch in batches:
                        model(**batch)
                    if repeat:  # the first round warms up
                        times[name].append(time.perf_counter() - start)
    finally:
        model_module.softmax = softmax
    ratios = [ours / theirs for ours, theirs in zip(times["bertforge"], times["torch"])]
    print(f"{precision:5s} bertforge {statistics.median(times['bertforge']):.3f} s  "
          f"torch {statistics.median(times['torch']):.3f} s  "
          f"ratio pass by pass: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--questions", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    rows_alone(args.repeats)
    squad = json.loads((DATA / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    questions = [qa["question"] for article in squad["data"] for paragraph in article["paragraphs"]
                 for qa in paragraph["qas"]][:args.questions]
    questions.sort(key=len)
    print(f"MiniLM on {len(questions)} SQuAD dev questions, batches of 64, attention's softmax switched pass by pass")
    for precision in ("fp32", "int8"):
        end_to_end(questions, precision, args.repeats)


if __name__ == "__main__":
    main()
