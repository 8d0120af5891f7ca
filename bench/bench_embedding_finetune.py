"""Fine-tuning sentence embeddings: bertforge's finetune_embeddings vs sentence-transformers' own trainer, one run.

    python bench/bench_embedding_finetune.py [--rows 1024] [--threads 2] [--repeats 2] [--data ../shared/data]

Both start from the default model's folder (all-MiniLM-L6-v2) and train on the same rows, the first --rows STS-B
training pairs (sentence1, sentence2, score), with CoSENT (scale 20), batch 16, lr 2e-5, a linear schedule after
warming up over a tenth of the steps, AdamW with weight decay 0.01 (not on biases and LayerNorm), gradients clipped
at norm 1, one epoch of shuffled batches, seed 42, fp32 on the CPU, no evaluation while training. bertforge runs
`finetune_embeddings` (what `bertforge finetune-embeddings` runs); sentence-transformers its
SentenceTransformerTrainer with its CoSENTLoss. Two figures of seconds: the whole call (loading the model, training,
saving the folder; under a second of it is not training), and the trainer's train() alone (bertforge's includes the
resumable checkpoint its loop writes at the end of the epoch, and writing the model). Each trains --repeats times
(2), the two taking turns going first, and the figures are medians; each run prints the load average before it,
since a shared machine's other work lands on one trainer or the other.

Then the starting model and the two fine-tuned folders are loaded by sentence-transformers and scored with its
EmbeddingSimilarityEvaluator (Spearman's correlation of cosine with the score) on STS-B's test split, or its dev
split where the test file has no scores (GLUE's test.tsv has none). The process-wide allocator setting that the
`bertforge` command applies at start-up (runtime.tune_cpu_allocator) is applied first, so both trainers run with it,
and torch._dynamo, which the first optimizer built in a process imports (about 3 s), is imported before either is timed.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import DATA
from tqdm import tqdm

from bertforge.checkpoint import default_model_dir
from bertforge.runtime import tune_cpu_allocator
from bertforge.tasks import embedding
from bertforge.tasks.embedding import EmbeddingFinetuneConfig, finetune_embeddings
from bertforge.training.trainer import TrainConfig, Trainer

BATCH_SIZE, LR, WARMUP_RATIO, WEIGHT_DECAY, SEED, SCALE = 16, 2e-5, 0.1, 0.01, 42, 20.0


def read_pairs(path: Path, count: int | None = None) -> tuple[list[str], list[str], list[float]] | None:
    """The first `count` (sentence1, sentence2, score) rows of an STS-B file; None if it has no scores."""
    with open(path, encoding="utf-8") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        if "score" not in (reader.fieldnames or []):
            return None
        rows = [row for row, _ in zip(reader, range(count if count is not None else 10**9))]
    return [row["sentence1"] for row in rows], [row["sentence2"] for row in rows], [float(row["score"]) for row in rows]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class TimedTrainer(Trainer):
    """bertforge's Trainer, its train() call timed (finetune_embeddings builds it from embedding.Trainer)."""

    seconds: list[float] = []

    def train(self, resume: bool = False):
        start = time.perf_counter()
        try:
            return super().train(resume)
        finally:
            TimedTrainer.seconds.append(time.perf_counter() - start)


def train_bertforge(train_file: Path, rows: int, output: Path) -> tuple[float, float]:
    """Seconds of the trainer's train() and of the whole finetune_embeddings call."""
    config = EmbeddingFinetuneConfig(
        train=str(train_file), output=str(output), model=str(default_model_dir()),
        text_columns=("sentence1", "sentence2"), score_column="score", loss="cosent", scale=SCALE,
        batch_size=BATCH_SIZE, max_train_examples=rows,
        training=TrainConfig(lr=LR, warmup_ratio=WARMUP_RATIO, weight_decay=WEIGHT_DECAY, epochs=1, seed=SEED,
                             lr_schedule="linear", max_grad_norm=1.0, progress=False, device="cpu"))
    seed_all(SEED)
    embedding.Trainer = TimedTrainer
    try:
        start = time.perf_counter()
        finetune_embeddings(config)
        whole = time.perf_counter() - start
    finally:
        embedding.Trainer = Trainer
    return TimedTrainer.seconds[-1], whole


def train_sentence_transformers(pairs: tuple[list[str], list[str], list[float]], output: Path) -> tuple[float, float]:
    """Seconds of SentenceTransformerTrainer.train() and of loading, building the trainer, training and saving."""
    import datasets
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base import model_card
    from sentence_transformers.sentence_transformer.losses import CoSENTLoss

    model_card.tqdm = functools.partial(tqdm, disable=True)  # its "Computing widget examples" bar, on stderr

    dataset = datasets.Dataset.from_dict({"sentence1": pairs[0], "sentence2": pairs[1], "score": pairs[2]})
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(output / "trainer"), per_device_train_batch_size=BATCH_SIZE, num_train_epochs=1,
        learning_rate=LR, warmup_steps=WARMUP_RATIO, lr_scheduler_type="linear", weight_decay=WEIGHT_DECAY,
        max_grad_norm=1.0, seed=SEED, data_seed=SEED, use_cpu=True, fp16=False, bf16=False, report_to="none",
        save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True)
    seed_all(SEED)
    start = time.perf_counter()
    model = SentenceTransformer(str(default_model_dir()), device="cpu")
    trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=dataset,
                                         loss=CoSENTLoss(model, scale=SCALE))
    trainer.remove_callback(transformers.PrinterCallback)
    train_start = time.perf_counter()
    trainer.train()
    trained = time.perf_counter() - train_start
    model.save(str(output / "model"), create_model_card=False)  # its card encodes example texts
    return trained, time.perf_counter() - start


def spearman_of(folder: str, pairs: tuple[list[str], list[str], list[float]]) -> float:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator, SimilarityFunction

    model = SentenceTransformer(folder, device="cpu")
    evaluator = EmbeddingSimilarityEvaluator(*pairs, main_similarity=SimilarityFunction.COSINE, name="stsb",
                                             batch_size=64, show_progress_bar=False)
    return evaluator(model)["stsb_spearman_cosine"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024, help="STS-B training pairs, from the top of the file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="training runs of each (seconds: the median)")
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data folder (holding stsb/)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Loading weights", "Writing model shards"
    tune_cpu_allocator()
    # torch.optim's optimizers import torch._dynamo when the first one is built (about 3 s on 2 cores): a cost of
    # the first optimizer in a process, whichever library builds it, so paid here before either trainer is timed
    importlib.import_module("torch._dynamo")
    import sentence_transformers

    print(f"{machine()}; torch {torch.__version__}, transformers {transformers.__version__}, sentence-transformers "
          f"{sentence_transformers.__version__}, {args.threads} threads")
    train_file = args.data / "stsb" / "train.tsv"
    train = read_pairs(train_file, args.rows)
    test, split = read_pairs(args.data / "stsb" / "test.tsv"), "test"
    if test is None:
        test, split = read_pairs(args.data / "stsb" / "dev.tsv"), "dev"
        print("stsb/test.tsv has no scores (GLUE keeps them back): the models are scored on stsb/dev.tsv")
    rows = len(train[0])
    steps = math.ceil(rows / BATCH_SIZE)
    print(f"STS-B train, first {rows} pairs, cosent, batch {BATCH_SIZE}, lr {LR:g}, {steps} steps (warm-up: "
          f"bertforge {round(WARMUP_RATIO * steps)}, sentence-transformers {math.ceil(WARMUP_RATIO * steps)}), "
          f"1 epoch, seed {SEED}; scored on STS-B {split} ({len(test[0])} pairs)")

    trainers = {"bertforge": lambda output: train_bertforge(train_file, args.rows, output),
                "sentence-transformers": lambda output: train_sentence_transformers(train, output)}
    runs = {name: [] for name in trainers}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for repeat in range(args.repeats):  # the two take turns going first
            for name in list(trainers) if repeat % 2 == 0 else list(trainers)[::-1]:
                load = os.getloadavg()[0]
                runs[name].append(trainers[name](scratch / f"{name}-{repeat}"))
                print(f"  {name}: train() {runs[name][-1][0]:.2f} s, whole call {runs[name][-1][1]:.2f} s "
                      f"(1-minute load average before it: {load:.1f})")
        last = args.repeats - 1  # the same seed each time: the last run's models are scored
        folders = {"starting model": str(default_model_dir()), "bertforge": str(scratch / f"bertforge-{last}"),
                   "sentence-transformers": str(scratch / f"sentence-transformers-{last}" / "model")}
        scores = {name: spearman_of(folder, test) for name, folder in folders.items()}
    seconds = {name: tuple(statistics.median(run[i] for run in times) for i in range(2))
               for name, times in runs.items()}

    reference = "sentence-transformers"
    print(f"{'model':<24}{split + ' Spearman':>14}{'train s':>9}{'rows/s':>8}{'whole s':>9}{'Spearman':>10}"
          f"{'speed':>7}{'whole':>7}")
    for name, score in scores.items():
        line = f"{name:<24}{score:>14.4f}"
        if name in seconds:
            (trained, whole), (trained_ref, whole_ref) = seconds[name], seconds[reference]
            line += (f"{trained:>9.2f}{rows / trained:>8.1f}{whole:>9.2f}{score / scores[reference]:>9.3f}x"
                     f"{trained_ref / trained:>6.2f}x{whole_ref / whole:>6.2f}x")
        print(line)
    print("(ratios: bertforge / sentence-transformers; speed: rows/s of train(); whole: the whole call, loading, "
          "training and saving)")


if __name__ == "__main__":
    main()
