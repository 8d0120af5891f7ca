"""The README's fine-tuning results, one command each, and the same runs with transformers beside them.

    python bench/finetune_tasks.py RUN [--engine bertforge|transformers|both] [--runs-dir runs] [--threads 2]
    python bench/finetune_tasks.py RUN --device cuda   # bertforge's run on a GPU (bench/compress_check.sh)

RUN is a row of RUNS (sst2, mrpc, stsb, conll2003, squad): real data from ../shared/data, the default model
(all-MiniLM-L6-v2) and the hyper-parameters of the row. `bertforge` runs the `bertforge finetune` command the
row spells out (printed first, so it can be run by hand), then `bertforge evaluate` on the test file when the row
has one, timed end to end as a user would run them. `transformers` trains transformers' own model class of the
same name (BertForSequenceClassification, ...) with transformers' linear warm-up schedule and a plain PyTorch
loop (the recipe of transformers' `run_*_no_trainer.py` examples), with the same configuration object: same
examples, same token ids (bertforge's tokenizer, which is token-identical to BertTokenizerFast, see
tests/tokenizer), same evaluation cadence, and the best model by the same metric; it is timed end to end
in-process (reading, tokenizing, training, evaluating). Its batches are bertforge's (the same length-grouped
batches in the same order: an engine comparison), or with `--transformers-batches own` the recipe's own
(shuffled every epoch, each padded to its longest, as its DataLoader with DataCollatorWithPadding makes them).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertforge.runtime import tune_cpu_allocator

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
COMMON = {"--model": "default", "--lr": "1e-4", "--warmup-ratio": "0.1", "--batch-size": "32", "--no-progress": None}


def split_squad(folder: Path, train_articles: int = 40) -> dict[str, str]:
    """SQuAD v1.1 dev has 48 articles: the first 40 train, the other 8 evaluate (no question crosses over)."""
    articles = json.loads((DATA / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"train": articles["data"][:train_articles], "dev": articles["data"][train_articles:]}
    for name, data in parts.items():
        (folder / f"{name}.json").write_text(json.dumps({"version": articles["version"], "data": data}))
    return {name: str(folder / f"{name}.json") for name in parts}


def entity_type_sets(folder: Path) -> dict[str, str]:
    """CoNLL-2003 as multi-label data: each sentence (its words joined by spaces) labelled with the set of entity
    types its gold IOB2 tags mention (PER, LOC, ORG, MISC; [] for a sentence without one), as JSONL
    {"text", "types"}: train from eng.train, dev from eng.testa, test from eng.testb. Real annotations, several
    labels per sentence (39% of the training sentences with an entity have two to four types)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, source in (("train", "eng.train"), ("dev", "eng.testa"), ("test", "eng.testb")):
        rows, words, types = [], [], set()
        for line in [*(DATA / "conll2003" / source).read_text(encoding="utf-8").splitlines(), ""]:
            if line.strip():
                columns = line.split()
                words.append(columns[0])
                if columns[-1] != "O":
                    types.add(columns[-1][2:])
            elif words:
                rows.append(json.dumps({"text": " ".join(words), "types": sorted(types)}) + "\n")
                words, types = [], set()
        files[name] = str(folder / f"{name}.jsonl")
        Path(files[name]).write_text("".join(rows), encoding="utf-8")
    return files


@dataclass(frozen=True)
class Run:
    task: str
    train: str  # paths under ../shared/data
    dev: str
    test: str | None = None  # scored once, with the best model on dev
    flags: dict[str, str | None] = field(default_factory=dict)  # bertforge finetune flags besides COMMON
    prepare: Callable[[Path], dict[str, str]] | None = None  # writes derived data files: {train, dev[, test]}


RUNS: dict[str, Run] = {
    "sst2": Run("classification", "sst2/train.tsv", "sst2/dev.tsv",
                flags={"--epochs": "1", "--eval-every": "300"}),
    "mrpc": Run("classification", "mrpc/train.tsv", "mrpc/dev.tsv",
                flags={"--text-column": "#1 String", "--text-pair-column": "#2 String", "--label-column": "Quality",
                       "--epochs": "3"}),
    "stsb": Run("regression", "stsb/train.tsv", "stsb/dev.tsv",
                flags={"--text-column": "sentence1", "--text-pair-column": "sentence2", "--label-column": "score",
                       "--epochs": "3"}),
    "conll2003": Run("ner", "conll2003/eng.train", "conll2003/eng.testa", test="conll2003/eng.testb",
                     flags={"--epochs": "3", "--context": "document", "--decoding": "viterbi", "--bf16": None}),
    # Multi-label: the entity types each CoNLL-2003 sentence mentions (entity_type_sets); the threshold is chosen on
    # dev. A budget for a shared 2-core machine: the first 8000 of the 14041 training sentences, 2 epochs.
    "conll2003_types": Run("multi_label", "conll2003/eng.train", "conll2003/eng.testa", test="conll2003/eng.testb",
                           prepare=entity_type_sets,
                           flags={"--text-column": "text", "--label-column": "types", "--epochs": "2",
                                  "--max-train-examples": "8000"}),
    "squad": Run("qa", "squad/train.json", "squad/dev.json", prepare=split_squad,
                 flags={"--epochs": "1", "--max-length": "256", "--doc-stride": "128", "--bf16": None}),
}


def finetune_arguments(run: Run, output: Path, data: dict[str, str]) -> list[str]:
    arguments = ["finetune", "--task", run.task, "--train", data["train"], "--dev", data["dev"],
                 "--output", str(output)]
    for flag, value in (COMMON | run.flags).items():
        arguments += [flag] if value is None else [flag, value]
    return arguments


def data_files(run: Run, folder: Path) -> dict[str, str]:
    """{train, dev[, test]}: the row's files under ../shared/data, or those its `prepare` writes from them."""
    if run.prepare is not None:
        return run.prepare(folder / "data")
    return {"train": str(DATA / run.train), "dev": str(DATA / run.dev)} | ({"test": str(DATA / run.test)}
                                                                           if run.test else {})


def show(arguments: list[str]) -> str:
    return " ".join(a if a and " " not in a and "#" not in a else repr(a) for a in ["bertforge", *arguments])


def run_bertforge(run: Run, folder: Path, threads: int, device: str | None = None) -> dict:
    start = time.perf_counter()
    data = data_files(run, folder)
    output = folder / "bertforge"
    commands = [finetune_arguments(run, output, data)]
    if run.test:
        commands.append(["evaluate", "--model", str(output), "--data", data["test"]])
    if device is not None:
        commands = [[*arguments, "--device", device] for arguments in commands]
    for arguments in commands:
        print(f"$ {show(arguments)}", flush=True)
        subprocess.run([sys.executable, "-m", "bertforge", "--threads", str(threads), *arguments], check=True)
    seconds = time.perf_counter() - start
    metrics = json.loads((output / "metrics.json").read_text())["best"]
    if run.test:
        metrics = {**metrics, **{f"test_{k}": v for k, v in
                                 json.loads((output / "eval_results.json").read_text()).items()
                                 if isinstance(v, float)}}
    return {"seconds": seconds, "metrics": metrics, "commands": [show(c) for c in commands]}


def run_transformers(run: Run, folder: Path, threads: int, batching: str = "bertforge") -> dict:
    import transformers
    from torch.utils.data import BatchSampler, RandomSampler

    from bertforge.checkpoint.default_model import resolve_model_dir
    from bertforge.cli import finetune as finetune_cli
    from bertforge.tasks.data import FeatureBatches, training_batches
    from bertforge.tasks.finetune import chosen_settings, score_features
    from bertforge.tasks.registry import get_task
    from bertforge.tokenizer import BertTokenizer
    from bertforge.training import bf16_supported

    torch.set_num_threads(threads)
    start = time.perf_counter()
    data = data_files(run, folder)
    parser = argparse.ArgumentParser()
    finetune_cli.add_arguments(parser)
    config = finetune_cli.config_from_args(parser.parse_args(finetune_arguments(run, folder / "unused", data)[1:]))
    training, task = config.training, get_task(config.task)

    train_examples = task.read_examples(config.train, config.columns, settings=config.settings)
    train_examples = train_examples[:config.max_train_examples]
    id2label = task.labels(train_examples)
    dev_examples = task.read_examples(config.dev, config.columns, id2label, settings=config.settings)
    tokenizer = BertTokenizer.from_pretrained(config.model)
    train_features = task.encode(tokenizer, train_examples, config.settings, id2label)
    dev_features = task.encode(tokenizer, dev_examples, config.settings, id2label)

    torch.manual_seed(training.seed)
    model_class = getattr(transformers, task.model_class.__name__)
    labels = {"num_labels": len(id2label), "id2label": id2label,
              "label2id": {label: i for i, label in id2label.items()}} if id2label else {}
    if task.problem_type is not None:  # multi_label: transformers' BCEWithLogitsLoss over sigmoid outputs
        labels["problem_type"] = task.problem_type
    model = model_class.from_pretrained(resolve_model_dir(config.model), **labels)
    if batching == "own":  # the recipe's DataLoader: reshuffled every epoch, each batch padded to its longest
        generator = torch.Generator().manual_seed(training.seed)
        sampler = BatchSampler(RandomSampler(range(len(train_features)), generator=generator), config.batch_size,
                               drop_last=False)
        batches = FeatureBatches(train_features, sampler, tokenizer.pad_token_id)
    else:
        batches = training_batches(train_features, config.batch_size, tokenizer.pad_token_id, training.seed)
    no_decay = ("bias", "LayerNorm.weight")  # transformers' examples choose these by name
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
               "weight_decay": training.weight_decay},
              {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
               "weight_decay": 0.0}]
    # transformers' Trainer default for torch >= 2.8 is the fused kernel ("adamw_torch_fused"), as bertforge's
    optimizer = torch.optim.AdamW(groups, lr=training.lr, betas=training.betas, eps=training.eps, fused=True)
    total = training.epochs * len(batches)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, round(training.warmup_ratio * total), total)

    # bertforge's --bf16 (autocast for the forward pass and evaluation, where the hardware has native bf16)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=training.bf16 and bf16_supported("cpu"))

    def evaluate(examples, features, calibrate: bool = True) -> dict[str, float]:
        """bertforge's scoring of the model's outputs; on dev it chooses multi-label's threshold as bertforge does."""
        with torch.inference_mode(), autocast:
            metrics = score_features(task, model, features, examples, id2label, config.eval_batch_size, calibrate)
        model.train()
        return metrics

    best, best_state, step = None, None, 0
    torch.manual_seed(training.seed)
    model.train()
    for _ in range(training.epochs):
        for batch in batches:
            with autocast:
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if (training.eval_every and step % training.eval_every == 0) or step == total or (
                    not training.eval_every and step % len(batches) == 0):
                metrics = evaluate(dev_examples, dev_features)
                if best is None or metrics[task.main_metric] > best[task.main_metric]:
                    best, best_state = {"step": step, **metrics}, copy.deepcopy(model.state_dict())
    if run.test:
        model.load_state_dict(best_state)
        test_examples = task.read_examples(data["test"], config.columns, id2label, settings=config.settings)
        settings = dataclasses.replace(config.settings, **chosen_settings(best, config.settings))  # chosen on dev
        test_metrics = evaluate(test_examples, task.encode(tokenizer, test_examples, settings, id2label), False)
        best = {**best, **{f"test_{k}": v for k, v in test_metrics.items()}}
    return {"seconds": time.perf_counter() - start, "metrics": best, "batches": batching}


ENGINES = {"bertforge": run_bertforge, "transformers": run_transformers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", choices=list(RUNS))
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="bertforge")
    parser.add_argument("--runs-dir", default="runs", help="outputs go to RUNS_DIR/RUN/ENGINE")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", help="where bertforge's run trains and evaluates (cpu, cuda, cuda:1)")
    parser.add_argument("--transformers-batches", choices=["bertforge", "own"], default="bertforge",
                        help="bertforge: the same length-grouped batches as bertforge (an engine comparison); own: "
                             "the recipe's shuffled batches, each padded to its longest (DataCollatorWithPadding)")
    args = parser.parse_args()
    if args.device is not None and args.engine != "bertforge":
        parser.error("--device is for the bertforge engine (the transformers recipe here runs on the CPU)")
    tune_cpu_allocator()  # what the bertforge command does at start-up; process-wide, so transformers gains too

    run, folder = RUNS[args.run], Path(args.runs_dir) / args.run
    folder.mkdir(parents=True, exist_ok=True)
    engines = list(ENGINES) if args.engine == "both" else [args.engine]
    results = {}
    for engine in engines:
        options = {"batching": args.transformers_batches} if engine == "transformers" else {"device": args.device}
        results[engine] = ENGINES[engine](run, folder, args.threads, **options)
        record = {"run": args.run, "engine": engine, "threads": args.threads, **results[engine]}
        (folder / f"{engine}.json").write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record), flush=True)

    names = sorted({k for figures in results.values() for k, v in figures["metrics"].items()
                    if isinstance(v, float) and math.isfinite(v)})
    print(f"\n{args.run}: {run.task}, {args.threads} threads")
    print(f"{'':<14}{'wall-clock s':>14}" + "".join(f"{n:>22}" for n in names))
    for engine, figures in results.items():
        print(f"{engine:<14}{figures['seconds']:>14.1f}"
              + "".join(f"{figures['metrics'].get(n, float('nan')):>22.4f}" for n in names))
    if len(results) == 2:
        print(f"wall-clock ratio (transformers / bertforge): "
              f"{results['transformers']['seconds'] / results['bertforge']['seconds']:.2f}x")


if __name__ == "__main__":
    main()
