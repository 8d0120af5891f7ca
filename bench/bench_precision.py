"""What the inference precisions cost on real tasks: a fine-tuned model's dev metric and evaluation time at fp32,
int8 (the per-channel int8 of bertforge.compress, calibrated on bundled sentences) and bf16 (where the hardware has
it), one run.

    python bench/bench_precision.py [--runs-dir runs] [--threads 2]

It scores the models that `bench/finetune_tasks.py` leaves in RUNS_DIR/RUN/bertforge (run those first), each on
its own dev file with `bertforge.tasks.finetuned_model.evaluate`, the function behind `bertforge evaluate --precision`.
Wall-clock covers loading, preparing (quantizing), tokenizing and predicting.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from finetune_tasks import DATA, RUNS, data_files  # bench/ is the script's folder, so on sys.path

from bertforge.errors import ConfigError
from bertforge.inference import PRECISIONS, InferenceOptions
from bertforge.runtime import tune_cpu_allocator
from bertforge.tasks.checkpoint_contents import inspect_checkpoint
from bertforge.tasks.finetuned_model import evaluate
from bertforge.tasks.registry import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", default="sst2,mrpc,stsb,conll2003", help="rows of finetune_tasks.RUNS")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()

    print(f"{'run':<11}{'precision':<11}{'metric':<24}{'value':>8}{'vs fp32':>10}{'seconds':>9}{'speed-up':>10}")
    for name in args.runs.split(","):
        run, folder = RUNS[name], Path(args.runs_dir) / name
        model = folder / "bertforge"
        if not (model / "model.safetensors").is_file():
            print(f"{name:<11}(no fine-tuned model in {model}: run `python bench/finetune_tasks.py {name}` first)")
            continue
        dev = DATA / run.test if run.test else Path(data_files(run, folder)["dev"])  # CoNLL: the test file
        metric = get_task(inspect_checkpoint(model).run.task).main_metric
        baseline = None
        for precision in (precision for precision in PRECISIONS if precision != "auto"):  # auto is one of the others
            start = time.perf_counter()
            try:
                metrics = evaluate(model, dev, inference=InferenceOptions(precision=precision))
            except ConfigError as error:  # bf16 without hardware support
                print(f"{name:<11}{precision:<11}({error})")
                continue
            seconds = time.perf_counter() - start
            baseline = baseline or (metrics[metric], seconds)
            print(f"{name:<11}{precision:<11}{metric:<24}{metrics[metric]:>8.4f}{metrics[metric] - baseline[0]:>+10.4f}"
                  f"{seconds:>9.1f}{baseline[1] / seconds:>9.2f}x", flush=True)


if __name__ == "__main__":
    main()
