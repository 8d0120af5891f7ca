"""A GLUE-style table: bertforge fine-tuned on the tasks in ../shared/data beside published BERT-base and MiniLM
figures, each with its source.

    python bench/glue.py [--tasks sst2,mrpc,stsb,conll2003,squad] [--seeds 1,2,3] [--max-train-examples N]
                         [--epochs E] [--threads 1] [--runs-dir runs/glue] [--finished-only]

Each task is its row of bench/finetune_tasks.py (the README's recipe: data, flags, metric) run with `bertforge
finetune --seeds ... --resume` into RUNS_DIR/TASK, so a row shows the mean ± sample sd over the seeds and seeds
that already finished there are read back, not trained again. --max-train-examples and --epochs cut the budget
for a small machine; the table states the budget it ran with. --finished-only trains nothing: it tabulates the
seeds that have finished in RUNS_DIR (a table of a run cut short, with its seed count).

The published figures are not the same experiment: BERT-base is 110M parameters against the default model's 22M
(all-MiniLM-L6-v2, six layers of MiniLM-L12-H384 further trained for sentence embeddings), GLUE's test sets are
not public (ours score the dev sets), and the SQuAD row trains on 40 articles of the v1.1 dev set only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench_serve import machine  # bench/ is the script's folder, so on sys.path
from finetune_tasks import DATA, RUNS, data_files, finetune_arguments, show


@dataclass(frozen=True)
class Published:
    figure: float  # in percent, as the paper prints it
    source: str


BERT_PAPER = "Devlin et al. 2019 (arXiv:1810.04805)"
MINILM_CARD = "Wang et al. 2020 (arXiv:2002.10957), dev, as the microsoft/MiniLM-L12-H384-uncased model card lists it"

# task -> (metric key in our metrics, what it is, BERT-base, MiniLM-L12xH384)
ROWS: dict[str, tuple[str, str, Published | None, Published | None]] = {
    "sst2": ("accuracy", "accuracy", Published(93.5, f"{BERT_PAPER} Table 1, GLUE test"),
             Published(93.0, MINILM_CARD)),
    "mrpc": ("f1", "F1", Published(88.9, f"{BERT_PAPER} Table 1, GLUE test"),
             Published(89.5, MINILM_CARD + " (one MRPC figure; BERT-Base 87.3 in the same table)")),
    "stsb": ("spearman", "Spearman", Published(85.8, f"{BERT_PAPER} Table 1, GLUE test"), None),
    "conll2003": ("test_f1", "entity F1 (test)", Published(92.4, f"{BERT_PAPER} Table 7, test (dev 96.4)"), None),
    "squad": ("f1", "F1", Published(88.5, f"{BERT_PAPER} Table 2, SQuAD v1.1 dev (EM 80.8)"), None),
}


def budget_flags(args: argparse.Namespace) -> dict[str, str]:
    flags = {}
    if args.max_train_examples is not None:
        flags["--max-train-examples"] = str(args.max_train_examples)
    if args.epochs is not None:
        flags["--epochs"] = str(args.epochs)
    return flags


def run_task(name: str, folder: Path, seeds: list[int], threads: int, budget: dict[str, str]) -> float:
    """Fine-tune every seed (finished ones are read back) and score each on the test file when the row has one;
    the wall-clock seconds of it all."""
    run = RUNS[name]
    run = dataclasses.replace(run, flags=run.flags | budget)
    start = time.perf_counter()
    data = data_files(run, folder)
    commands = [finetune_arguments(run, folder, data) + ["--seeds", ",".join(map(str, seeds)), "--resume"]]
    if run.test:
        commands += [["evaluate", "--model", str(folder / f"seed-{seed}"), "--data", str(DATA / run.test),
                      "--output", str(folder / f"seed-{seed}" / "test_results.json")] for seed in seeds]
    for arguments in commands:
        print(f"$ {show(arguments)}", flush=True)
        subprocess.run([sys.executable, "-m", "bertforge", "--threads", str(threads), *arguments], check=True)
    return time.perf_counter() - start


def finished_seeds(folder: Path) -> dict[int, dict[str, float]]:
    """Each finished seed's kept metrics (metrics.json "best", with test_* from test_results.json)."""
    results = {}
    for directory in sorted(folder.glob("seed-*")):
        if directory.suffix or not (directory / "metrics.json").is_file():  # seed-N.incomplete: still running
            continue
        metrics = json.loads((directory / "metrics.json").read_text())["best"]
        if (directory / "test_results.json").is_file():
            test = json.loads((directory / "test_results.json").read_text())
            metrics |= {f"test_{key}": value for key, value in test.items() if isinstance(value, float)}
        results[int(directory.name.split("-", 1)[1])] = metrics
    return results


def cell(values: list[float]) -> str:
    if not values:
        return "not run"
    mean = 100 * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.1f} (1 seed)"
    return f"{mean:.1f} ± {100 * statistics.stdev(values):.1f} ({len(values)} seeds)"


def published(figure: Published | None) -> str:
    return "—" if figure is None else f"{figure.figure:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(ROWS), help="comma-separated rows of bench/finetune_tasks.py")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--max-train-examples", type=int, default=None, help="budget: training examples per task")
    parser.add_argument("--epochs", type=int, default=None, help="budget: epochs (default: each row's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs-dir", default="runs/glue", help="outputs go to RUNS_DIR/TASK/seed-N")
    parser.add_argument("--finished-only", action="store_true", help="train nothing; tabulate the finished seeds")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    unknown = [task for task in tasks if task not in ROWS]
    if unknown:
        parser.error(f"unknown task {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    budget = budget_flags(args)

    seconds = {}
    for task in tasks:
        folder = Path(args.runs_dir) / task
        if not args.finished_only:
            seconds[task] = run_task(task, folder, seeds, args.threads, budget)

    load = os.getloadavg()
    print(f"\nmachine: {machine()}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"{args.threads} torch thread(s) per run; budget: {budget or 'each row of bench/finetune_tasks.py'}")
    print("| task | metric | bertforge, all-MiniLM-L6-v2 (dev) | BERT-base, published | MiniLM-L12xH384, published |")
    print("|---|---|---|---|---|")
    record = {"machine": machine(), "load": load, "threads": args.threads, "budget": budget, "tasks": {}}
    for task in tasks:
        metric, label, bert, minilm = ROWS[task]
        results = finished_seeds(Path(args.runs_dir) / task)
        values = [metrics[metric] for metrics in results.values()
                  if metric in metrics and math.isfinite(metrics[metric])]
        print(f"| {task} | {label} | {cell(values)} | {published(bert)} | {published(minilm)} |")
        record["tasks"][task] = {"metric": metric, "seeds": results, "seconds": seconds.get(task),
                                 "bert_base": dataclasses.asdict(bert) if bert else None,
                                 "minilm": dataclasses.asdict(minilm) if minilm else None}
    print("\nsources: " + "; ".join(sorted({figure.source for _, _, bert, minilm in ROWS.values()
                                             for figure in (bert, minilm) if figure is not None})))
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.runs_dir) / "glue.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
