"""One fine-tuning run over several seeds: each seed trains into OUTPUT/seed-N, every dev metric gets its mean and
standard deviation over the seeds, and the best seed's model is kept in OUTPUT itself.

BERT fine-tuning moves by points between seeds on small sets (MRPC: sd 6.0 F1 over 100 seeds in NVIDIA's runs), so a
change helps only when it beats the spread. OUTPUT/seeds.json records each seed's best evaluation and the summary.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.atomic import atomic_path, write_text_atomic
from bertforge.errors import ConfigError
from bertforge.outputs import check_output_dir, staging_dir, to_json
from bertforge.tasks.checkpoint_contents import RUN_CONFIG_FILE
from bertforge.tasks.finetune import FinetuneConfig, FinetuneResult, finetune
from bertforge.tasks.metrics import greater_is_better
from bertforge.training import distributed
from bertforge.training.trainer import CHECKPOINT_DIR, is_better
from bertforge.validation import MAX_SEED

SEEDS_FILE = "seeds.json"
RECORD_KEYS = ("step", "epoch")  # in an evaluation record beside the metrics


def seed_dir(output: str | Path, seed: int) -> Path:
    return Path(output) / f"seed-{seed}"


@dataclass
class SeedsResult:
    output_dir: Path  # holds the best seed's model, seeds.json and one folder per seed
    runs: dict[int, FinetuneResult]
    summary: dict[str, dict[str, float]]  # metric -> {"mean", "sd", "min", "max"} over the seeds' kept models
    metric: str  # the one that chose the best seed (and each seed's kept model)
    best_seed: int | None  # None in a torchrun process other than rank 0, which alone compares and writes


def parse_seeds(text: str) -> list[int]:
    """"1,2,3" -> [1, 2, 3]; at least two different non-negative seeds (one seed is --seed)."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds takes comma-separated integers such as 1,2,3; got {text!r}") from None
    if len(seeds) < 2 or len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise ConfigError(f"--seeds needs two or more different seeds from 0 to {MAX_SEED} (one seed is --seed); got "
                          f"{text!r}")
    return seeds


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, sample standard deviation (n - 1), min and max of each metric over the records."""
    names = [name for name in records[0] if name not in RECORD_KEYS]
    summary = {}
    for name in names:
        values = [float(record[name]) for record in records]
        summary[name] = {"mean": statistics.fmean(values), "sd": statistics.stdev(values),
                         "min": min(values), "max": max(values)}
    return summary


def finetune_seeds(config: FinetuneConfig, seeds: Sequence[int], train_examples: Sequence[Any] | None = None,
                   dev_examples: Sequence[Any] | None = None, overwrite: bool = False, resume: bool = False,
                   launch: distributed.ProcessInfo | None = None) -> SeedsResult:
    """The run of `config` once per seed, into OUTPUT/seed-N; the best seed's model (by the run's best-model
    metric) is copied into OUTPUT. With `resume`, a seed that finished is read back (its settings must be these),
    a killed one continues and one never started starts. Under torchrun (`launch`, or torchrun's environment when
    None) the processes train each seed together in one process group, and rank 0 alone compares and writes."""
    if config.output is None:
        raise ConfigError("an output directory is required (--output, or \"output\" in the run config)")
    if config.dev is None and dev_examples is None:
        raise ConfigError("seeds are compared on dev data: give dev data (--dev)")
    if not isinstance(seeds, (list, tuple)) or not all(type(seed) is int for seed in seeds):
        raise ConfigError(f"seeds must be a list of integer seeds, e.g. [1, 2, 3], got {seeds!r}")
    seeds = list(seeds)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds must be two or more different seeds, got {seeds}")
    output = check_output_dir(config.output, overwrite or resume, inputs=(config.train, config.dev),
                              models=(config.model,))
    launch = distributed.read_environment() if launch is None else launch
    runs = {}
    # One process group for all the seeds: the runs inside it join this one rather than meeting again.
    with distributed.process_group(launch, distributed.select_device(config.training.device, launch)):
        for seed in seeds:
            directory = seed_dir(output, seed)
            started = (directory / RUN_CONFIG_FILE).is_file() or (staging_dir(directory) / CHECKPOINT_DIR).is_dir()
            run_config = dataclasses.replace(config, output=str(directory),
                                             training=dataclasses.replace(config.training, seed=seed))
            runs[seed] = finetune(run_config, train_examples, dev_examples, overwrite=overwrite,
                                  resume=resume and started, launch=launch)
            distributed.barrier()  # the seed is in place (rank 0 moved it) before any process looks at the next
    if launch.rank != 0:
        return SeedsResult(output, runs, {}, config.best_model_metric, None)
    metric = config.best_model_metric
    higher = greater_is_better(metric)
    best_seed, best_value = seeds[0], None
    for seed in seeds:
        value = runs[seed].best[metric]
        if best_value is None or is_better(value, best_value, higher):
            best_seed, best_value = seed, value
    summary = summarize([runs[seed].best for seed in seeds])
    keep_model(seed_dir(output, best_seed), output)
    record = {"metric": metric, "greater_is_better": higher, "seeds": seeds, "best_seed": best_seed,
              "runs": {str(seed): runs[seed].best for seed in seeds}, "summary": summary}
    write_text_atomic(output / SEEDS_FILE, to_json(record, indent=2) + "\n")
    return SeedsResult(output, runs, summary, metric, best_seed)


def keep_model(source: Path, output: Path) -> None:
    """Copy the files of a seed's model folder into OUTPUT, each replaced atomically (the seed folders stay)."""
    for file in sorted(source.iterdir()):
        if file.is_file():
            with atomic_path(output / file.name) as temporary:
                shutil.copyfile(file, temporary)


def format_summary(result: SeedsResult) -> list[str]:
    """Lines for a person: each seed's kept metrics, then mean ± sd of each metric."""
    lines = []
    for seed, run in result.runs.items():
        metrics = ", ".join(f"{name}={value:.4f}" for name, value in run.best.items() if name not in RECORD_KEYS)
        lines.append(f"seed {seed} (step {run.best['step']} of {run.steps}): {metrics}")
    spread = ", ".join(f"{name}={values['mean']:.4f} ± {values['sd']:.4f}" for name, values in result.summary.items()
                       if not math.isnan(values["mean"]))
    lines.append(f"mean ± sd over {len(result.runs)} seeds: {spread}")
    lines.append(f"best seed by {result.metric}: {result.best_seed}, its model kept in {result.output_dir}")
    return lines
