"""Fine-tuning speed and result: bertforge's `finetune` vs a plain PyTorch loop on transformers'
BertForSequenceClassification, same model (all-MiniLM-L6-v2), data, hyper-parameters and batch order.

    python bench/bench_finetune.py [--train-examples 2000] [--threads 2] [--lr 1e-4]

Work: the first N SST-2 training sentences, one epoch, batch 32, max_length 64, AdamW with linear warm-up (10%)
and decay, gradient clipping at 1; then accuracy on the 872 dev sentences. Both sides tokenize with their own
tokenizer (they agree token for token), train on the same batches in the same order (bertforge's length-grouped
sampler, seeded alike), and are timed end to end: reading, tokenizing, training, evaluating.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import torch

from bertforge.checkpoint import default_model_dir
from bertforge.runtime import tune_cpu_allocator
from bertforge.tasks.data import FeatureBatches, Features, LengthGroupedBatches, inference_batches
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.training import TrainConfig

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def read_sst2(name: str, limit: int | None = None) -> list[tuple[str, int]]:
    with open(DATA / "sst2" / name, encoding="utf-8") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["sentence"], int(row["label"])) for row in rows][:limit]


def run_bertforge(args, train_file: Path, dev_file: Path, output: Path) -> dict:
    start = time.perf_counter()
    config = FinetuneConfig(train=str(train_file), dev=str(dev_file), output=str(output), max_length=args.max_length,
                            batch_size=args.batch_size, eval_batch_size=64,
                            training=TrainConfig(epochs=1, lr=args.lr, warmup_ratio=0.1, seed=args.seed,
                                                 progress=False, device="cpu", log_every=10**6))
    result = finetune(config)
    seconds = time.perf_counter() - start
    log = [json.loads(line) for line in (output / "train_log.jsonl").read_text().splitlines()]
    train_speed = [r for r in log if r["event"] == "train"][-1]["examples_per_s"]
    return {"seconds": seconds, "train_examples_per_s": train_speed, "accuracy": result.best["accuracy"]}


def run_transformers(args, train: list[tuple[str, int]], dev: list[tuple[str, int]]) -> dict:
    import transformers

    start = time.perf_counter()
    directory = default_model_dir()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(directory)
    torch.manual_seed(args.seed)
    model = transformers.BertForSequenceClassification.from_pretrained(directory, num_labels=2)

    def features(rows):
        encoded = tokenizer([text for text, _ in rows], truncation=True, max_length=args.max_length)
        return Features([{"input_ids": ids, "token_type_ids": segments, "labels": label} for ids, segments, label
                         in zip(encoded["input_ids"], encoded["token_type_ids"], [label for _, label in rows])],
                        list(range(len(rows))))

    train_features, dev_features = features(train), features(dev)
    batches = FeatureBatches(train_features, LengthGroupedBatches(train_features.lengths(), args.batch_size,
                                                                  args.seed), tokenizer.pad_token_id)
    # transformers' own recipe: no decay on biases and LayerNorm weights, chosen by name
    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
               "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, eps=1e-8)
    total = len(batches)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, round(0.1 * total), total)
    torch.manual_seed(args.seed)
    model.train()
    train_start, examples = time.perf_counter(), 0
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        examples += len(batch["input_ids"])
    train_speed = examples / (time.perf_counter() - train_start)

    model.eval()
    correct = 0
    with torch.inference_mode():
        for indices, batch in inference_batches(dev_features, 64, tokenizer.pad_token_id):
            predicted = model(**batch).logits.argmax(-1)
            correct += sum(int(p) == dev[i][1] for p, i in zip(predicted.tolist(), indices))
    return {"seconds": time.perf_counter() - start, "train_examples_per_s": train_speed,
            "accuracy": correct / len(dev)}


def write_tsv(path: Path, rows: list[tuple[str, int]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # process-wide, so the reference gains from it too

    train, dev = read_sst2("train.tsv", args.train_examples), read_sst2("dev.tsv")
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        write_tsv(folder / "train.tsv", train)
        write_tsv(folder / "dev.tsv", dev)
        ours = run_bertforge(args, folder / "train.tsv", folder / "dev.tsv", folder / "model")
    reference = run_transformers(args, train, dev)

    print(f"SST-2: {len(train)} training sentences, 1 epoch, batch {args.batch_size}, max_length {args.max_length}, "
          f"lr {args.lr}; dev accuracy on {len(dev)}; {args.threads} threads")
    print(f"{'':<14}{'wall-clock s':>14}{'train ex/s':>12}{'dev accuracy':>14}")
    for name, figures in (("bertforge", ours), ("transformers", reference)):
        print(f"{name:<14}{figures['seconds']:>14.1f}{figures['train_examples_per_s']:>12.1f}"
              f"{figures['accuracy']:>14.3f}")
    print(f"speed ratio (bertforge / transformers, training examples/s): "
          f"{ours['train_examples_per_s'] / reference['train_examples_per_s']:.2f}x; "
          f"wall-clock ratio (transformers / bertforge): {reference['seconds'] / ours['seconds']:.2f}x")


if __name__ == "__main__":
    main()
