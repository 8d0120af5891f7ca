"""Inference throughput: bertforge vs transformers (SDPA) vs ONNX Runtime, on the same weights and inputs, one run.

    python bench/bench_inference.py [--threads 2] [--repeats 3] [--models minilm,base] [--no-extras]

ONNX Runtime runs the graph that bertforge's own `export_onnx` writes (checked against PyTorch before use).
Workloads, all real text except the token ids of the random base model's weights:
  full 32x128   32 SQuAD contexts of 128+ tokens, truncated to 128 (no padding)
  SST-2 b32     SST-2 dev sentences in file order, batches of 32, each padded to its longest
  SQuAD b16     SQuAD dev contexts in file order, truncated to --squad-length tokens, batches of 16
Model FLOPs utilisation counts only the useful work on real tokens (2 x the matmul parameters per token, plus
attention's 4 x length x hidden per token and layer) against --peak-gflops, so work spent on padding is waste.
The engines take turns pass by pass, a median of --repeats passes each, so that a slow spell of a shared machine
falls on all of them. Everything runs twice: with glibc's default allocator, then after `tune_cpu_allocator()`.
The setting is process-wide, so transformers gains from it too. Extras (MiniLM and base, full 32x128, tuned
allocator): the inference options --precision bf16, --precision int8 and --compile, speed-up and largest
difference from fp32.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import read_squad_contexts, read_sst2_dev
from same_weights import load_pair

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.errors import ConfigError
from bertforge.inference import InferenceOptions
from bertforge.inference.onnx import INPUT_NAMES, export_onnx, onnx_session
from bertforge.runtime import tune_cpu_allocator


def batched(texts: list[str], size: int) -> list[list[str]]:
    return [texts[start:start + size] for start in range(0, len(texts), size)]


def workloads(tokenizer: BertTokenizer, args) -> dict[str, list[dict[str, torch.Tensor]]]:
    encode = dict(truncation=True, padding=True, return_tensors="pt")
    contexts = read_squad_contexts()
    long_enough = [text for text in contexts if len(tokenizer.tokenize(text)) >= 126][:32]
    sentences = read_sst2_dev()[:args.sst2_sentences]
    return {
        "full 32x128": [dict(tokenizer(long_enough, max_length=128, **encode))],
        "SST-2 b32": [dict(tokenizer(batch, **encode)) for batch in batched(sentences, 32)],
        f"SQuAD b16 {args.squad_length}": [dict(tokenizer(batch, max_length=args.squad_length, **encode))
                                          for batch in batched(contexts[:args.squad_contexts], 16)],
    }


def forward_flops(config: BertConfig, batches: list[dict[str, torch.Tensor]]) -> float:
    """Useful forward FLOPs over the real tokens: matmuls 2 x params per token, attention 4 x length x hidden."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    matmul_params = layers * (4 * hidden * hidden + 2 * hidden * config.intermediate_size)
    flops = 0.0
    for batch in batches:
        for length in batch["attention_mask"].sum(1).tolist():
            flops += length * 2 * matmul_params + layers * 4 * length * length * hidden
    return flops


def seconds_per_pass(runs: dict, batches, repeats: int) -> dict[str, float]:
    """Median wall time of `repeats` passes over all batches for each run, after one warm-up batch each.

    The runs take turns pass by pass, so that a slow spell of the machine falls on all of them alike.
    """
    for run in runs.values():
        run(batches[0])
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            for batch in batches:
                run(batch)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def torch_runner(model):
    def run(batch):
        with torch.inference_mode():
            return model(**batch)
    return run


def onnx_runner(session):
    def run(batch):
        return session.run(None, {name: batch[name].numpy() for name in INPUT_NAMES})
    return run


def load_all(name: str, scratch: Path, tokenizer: BertTokenizer, threads: int):
    """bertforge (fp32 as `InferenceOptions()` prepares it, and as loaded), transformers and ONNX Runtime on the same
    weights: the real MiniLM, or a random preset size."""
    plain, reference = load_pair(name, scratch)
    start = time.perf_counter()
    report = export_onnx(plain, tokenizer, scratch / f"{name}.onnx")
    print(f"{name}: exported to ONNX in {time.perf_counter() - start:.0f} s, "
          f"max difference {report.max_difference:.1e}", flush=True)
    ours = InferenceOptions().apply(copy.deepcopy(plain))  # the CPU fast paths, as every loader applies them
    return ours, plain, reference, onnx_session(scratch / f"{name}.onnx", threads)


def largest_difference(expected, actual, batch) -> float:
    is_real = batch["attention_mask"].bool()
    return float((actual.last_hidden_state.float() - expected.last_hidden_state)[is_real].abs().max())


def measure_extras(name: str, model: BertModel, plain: BertModel, batches, repeats: int, only: str | None = None
                   ) -> None:
    """The model as `from_pretrained` returns it (eval mode, without bertforge.fast_cpu's transform), and the
    inference options as `--precision bf16`, `--precision int8` and `--compile` apply them (each to a copy of the
    model as loaded), against fp32 bertforge: speed-up and max |difference|. torch.compile compiles during the
    warm-up batch."""
    expected = torch_runner(model)(batches[0])
    variants = {"as loaded": lambda loaded: loaded.eval(),
                "bf16": InferenceOptions(precision="bf16").apply,
                "int8": partial(InferenceOptions(precision="int8").apply, calibration=batches),  # int8: calibrate
                "torch.compile": InferenceOptions(compile=True).apply}
    for variant, prepare in variants.items():
        if only is not None and variant not in only.split(","):
            continue
        try:
            run = torch_runner(prepare(copy.deepcopy(plain)))
        except ConfigError as error:  # bf16 on a CPU without native support
            print(f"{name:<8}{variant:<16}  ({error})", flush=True)
            continue
        seconds = seconds_per_pass({"fp32": torch_runner(model), variant: run}, batches, repeats)
        fp32_s, variant_s = seconds["fp32"], seconds[variant]
        difference = largest_difference(expected, run(batches[0]), batches[0])
        scale = float(expected.last_hidden_state[batches[0]["attention_mask"].bool()].abs().max())
        print(f"{name:<8}{variant:<16}{fp32_s / variant_s:>9.2f}x{difference:>14.2e}{difference / scale:>12.1%}",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="minilm,base")
    parser.add_argument("--sst2-sentences", type=int, default=872, help="first N SST-2 dev sentences (872: all)")
    parser.add_argument("--squad-contexts", type=int, default=32, help="first N SQuAD dev contexts")
    parser.add_argument("--squad-length", type=int, default=256, choices=(256, 384))
    parser.add_argument("--peak-gflops", type=float, default=552.0, help="fp32 peak of the CPU (PERFORMANCE.md)")
    parser.add_argument("--no-extras", action="store_true", help="skip the bf16, int8 and torch.compile measurements")
    parser.add_argument("--extras", default=None, help="only these extras, e.g. 'as loaded,int8' (default: all)")
    parser.add_argument("--extras-only", action="store_true", help="skip the table against transformers and ORT")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = BertTokenizer.from_pretrained("default")
    inputs = workloads(tokenizer, args)
    print(f"{machine()}; torch {torch.__version__}, {args.threads} threads, median of {args.repeats}; "
          f"MFU against {args.peak_gflops:.0f} GFLOP/s")

    with tempfile.TemporaryDirectory() as scratch:
        loaded = {name: load_all(name, Path(scratch), tokenizer, args.threads) for name in args.models.split(",")}
        print(f"{'':<39}{'sequences/s':^24}{'real tokens/s':^24}{'bf speed-up':^14}{'MFU':^18}")
        print(f"{'allocator':<10}{'model':<8}{'workload':<16}{'real':>5}" + f"{'bf':>8}{'tf':>8}{'ORT':>8}" * 2
              + f"{'vs tf':>7}{'vs ORT':>7}" + f"{'bf':>6}{'tf':>6}{'ORT':>6}")
        for allocator in ("default", "tuned") if not args.extras_only else ():
            if allocator == "tuned":
                tune_cpu_allocator()
            for name, (ours, _, reference, session) in loaded.items():
                for workload, batches in inputs.items():
                    sequences = sum(len(b["input_ids"]) for b in batches)
                    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
                    fill = tokens / sum(b["input_ids"].numel() for b in batches)
                    gflop = forward_flops(ours.config, batches) / 1e9
                    seconds = tuple(seconds_per_pass({"bf": torch_runner(ours), "tf": torch_runner(reference),
                                                      "ORT": onnx_runner(session)}, batches, args.repeats).values())
                    ours_s, reference_s, onnx_s = seconds
                    print(f"{allocator:<10}{name:<8}{workload:<16}{fill:>5.0%}"
                          + "".join(f"{sequences / s:>8.1f}" for s in seconds)
                          + "".join(f"{tokens / s:>8.0f}" for s in seconds)
                          + f"{reference_s / ours_s:>6.2f}x{onnx_s / ours_s:>6.2f}x"
                          + "".join(f"{gflop / s / args.peak_gflops:>6.0%}" for s in seconds), flush=True)
        if not args.no_extras:
            print(f"\n{'model':<8}{'variant':<16}{'speed-up':>10}{'max |diff|':>14}{'of max |h|':>12}   "
                  "(vs bertforge fp32, full 32x128, last_hidden_state at real tokens)")
            for name, (ours, plain, _, _) in loaded.items():
                measure_extras(name, ours, plain, inputs["full 32x128"], args.repeats, args.extras)


if __name__ == "__main__":
    main()
