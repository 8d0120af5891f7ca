"""Fine-tuning a reranker: bertforge's `finetune --task rerank` vs sentence-transformers' CrossEncoderTrainer, one run.

    python bench/bench_rerank_finetune.py [--train-paragraphs 100] [--dev-paragraphs 100] [--seeds 42] [--threads 2]

The data is answer-sentence selection made from SQuAD v1.1 dev (as GLUE's QNLI is made from SQuAD): each
paragraph's questions, each with every sentence of its passage, the sentence where the answer starts relevant (1),
the others not (0). Training takes the paragraphs from the top of the file, the dev set the same number of
paragraphs from the middle (none shared). Both trainers start from the default model's folder (all-MiniLM-L6-v2) with
a new one-output head, and train with binary cross-entropy, batch 32, lr 1e-4 warmed up over a tenth of the steps
then decayed linearly, AdamW with weight decay 0.01, gradients clipped at norm 1, 2 epochs of shuffled batches,
inputs cut at 128 tokens, fp32 on the CPU, no evaluation while training, once per seed (--seeds), the two taking
turns going first. Seconds are the whole call (loading, training, saving).

Both folders are then scored by sentence-transformers' CrossEncoderRerankingEvaluator (MAP, MRR@10, NDCG@10) on
the dev queries, beside two rankings that need no model: the sentences in random order (its expected MRR) and by
how many words each shares with the question.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import DATA

from bertforge.checkpoint import default_model_dir
from bertforge.runtime import tune_cpu_allocator
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.training.trainer import TrainConfig

BATCH_SIZE, LR, WARMUP_RATIO, WEIGHT_DECAY, EPOCHS, MAX_LENGTH = 32, 1e-4, 0.1, 0.01, 2, 128
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
WORD = re.compile(r"\w+")


def answer_sentences(paragraphs: list[dict]) -> list[dict]:
    """(question, sentence, label) rows: every question of each paragraph with every sentence of its passage."""
    rows = []
    for paragraph in paragraphs:
        context, spans, start = paragraph["context"], [], 0
        for sentence in SENTENCE_END.split(context):
            start = context.index(sentence, start)
            spans.append((sentence, start, start + len(sentence)))
            start += len(sentence)
        for question in paragraph["qas"]:
            answer = question["answers"][0]["answer_start"]
            rows += [{"query": question["question"], "document": sentence, "label": int(first <= answer < last)}
                     for sentence, first, last in spans]
    return rows


def by_query(rows: list[dict]) -> dict[str, dict]:
    """sentence-transformers' reranking samples: each query with its relevant and other documents."""
    samples: dict[str, dict] = {}
    for row in rows:
        sample = samples.setdefault(row["query"], {"query": row["query"], "positive": [], "negative": []})
        sample["positive" if row["label"] else "negative"].append(row["document"])
    return samples


def train_bertforge(train_file: Path, output: Path, seed: int) -> float:
    start = time.perf_counter()
    finetune(FinetuneConfig(
        task="rerank", train=str(train_file), output=str(output), model=str(default_model_dir()),
        batch_size=BATCH_SIZE,  # inputs cut at the task's default max_length, 128 (MAX_LENGTH)
        training=TrainConfig(lr=LR, warmup_ratio=WARMUP_RATIO, weight_decay=WEIGHT_DECAY, epochs=EPOCHS, seed=seed,
                             lr_schedule="linear", max_grad_norm=1.0, progress=False, device="cpu")))
    return time.perf_counter() - start


def train_sentence_transformers(rows: list[dict], output: Path, seed: int) -> float:
    import datasets
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    dataset = datasets.Dataset.from_dict({"query": [row["query"] for row in rows],
                                          "document": [row["document"] for row in rows],
                                          "label": [float(row["label"]) for row in rows]})
    arguments = CrossEncoderTrainingArguments(
        output_dir=str(output / "trainer"), per_device_train_batch_size=BATCH_SIZE, num_train_epochs=EPOCHS,
        learning_rate=LR, warmup_steps=WARMUP_RATIO, lr_scheduler_type="linear", weight_decay=WEIGHT_DECAY,
        max_grad_norm=1.0, seed=seed, data_seed=seed, use_cpu=True, fp16=False, bf16=False, report_to="none",
        save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True)
    start = time.perf_counter()
    model = CrossEncoder(str(default_model_dir()), num_labels=1, max_length=MAX_LENGTH, device="cpu")
    trainer = CrossEncoderTrainer(model=model, args=arguments, train_dataset=dataset,
                                  loss=BinaryCrossEntropyLoss(model))
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.train()
    model.save(str(output / "model"), create_model_card=False)
    return time.perf_counter() - start


def without_a_model(samples: dict[str, dict], seed: int = 0) -> dict[str, dict[str, float]]:
    """MRR@10, NDCG@10 and MAP of ranking by words shared with the question, and of a random order (its mean over
    100 shuffles)."""
    from bertforge.tasks.metrics import compute_metrics

    documents = [sample["positive"] + sample["negative"] for sample in samples.values()]
    relevance = [[1] * len(sample["positive"]) + [0] * len(sample["negative"]) for sample in samples.values()]
    overlap = [[len(set(WORD.findall(query.lower())) & set(WORD.findall(document.lower()))) for document in texts]
               for query, texts in zip(samples, documents)]
    random = np.random.default_rng(seed)
    shuffles = [compute_metrics("reranking", [random.permutation(len(texts)).tolist() for texts in documents],
                                relevance) for _ in range(100)]
    return {"shared words": compute_metrics("reranking", overlap, relevance),
            "random order": {name: float(np.mean([shuffle[name] for shuffle in shuffles])) for name in shuffles[0]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-paragraphs", type=int, default=100, help="SQuAD dev paragraphs to train on")
    parser.add_argument("--dev-paragraphs", type=int, default=100, help="paragraphs to score on, from the middle")
    parser.add_argument("--seeds", type=lambda text: [int(seed) for seed in text.split(",")], default=[42],
                        help="a training of each per seed, e.g. 1,2,3 (the figures: means)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data folder (holding squad/)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tune_cpu_allocator()
    # the first optimizer built in a process imports torch._dynamo (about 3 s on 2 cores): paid before either is timed
    importlib.import_module("torch._dynamo")
    import sentence_transformers
    from sentence_transformers.cross_encoder import CrossEncoder
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    print(f"{machine()}; torch {torch.__version__}, transformers {transformers.__version__}, sentence-transformers "
          f"{sentence_transformers.__version__}, {args.threads} threads")
    squad = json.loads((args.data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [paragraph for article in squad["data"] for paragraph in article["paragraphs"]]
    middle = len(paragraphs) // 2
    if args.train_paragraphs > middle or middle + args.dev_paragraphs > len(paragraphs):
        parser.error(f"SQuAD dev has {len(paragraphs)} paragraphs: at most {middle} to train on, and as many to score")
    train = answer_sentences(paragraphs[:args.train_paragraphs])
    dev = by_query(answer_sentences(paragraphs[middle:middle + args.dev_paragraphs]))
    print(f"SQuAD answer sentences: {len(train)} training pairs ({args.train_paragraphs} paragraphs), {len(dev)} dev "
          f"queries; binary cross-entropy, batch {BATCH_SIZE}, lr {LR:g}, {EPOCHS} epochs")

    evaluator = CrossEncoderRerankingEvaluator(list(dev.values()), at_k=10, batch_size=64)
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {"bertforge": [], "sentence-transformers": []}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        train_file = scratch / "train.jsonl"
        train_file.write_text("".join(json.dumps(row) + "\n" for row in train), encoding="utf-8")
        trainers = {"bertforge": lambda seed, out: (train_bertforge(train_file, out, seed), out),
                    "sentence-transformers": lambda seed, out: (train_sentence_transformers(train, out, seed),
                                                                out / "model")}
        for turn, seed in enumerate(args.seeds):  # the two take turns going first
            for name in list(trainers) if turn % 2 == 0 else list(trainers)[::-1]:
                load = os.getloadavg()[0]
                seconds, folder = trainers[name](seed, scratch / f"{name}-{seed}")
                metrics = evaluator(CrossEncoder(str(folder), device="cpu"))
                runs[name].append((seconds, metrics))
                print(f"  seed {seed}, {name}: {seconds:.1f} s, NDCG@10 {metrics['ndcg@10']:.4f}, MRR@10 "
                      f"{metrics['mrr@10']:.4f} (1-minute load average before it: {load:.1f})")

    def spread(values: list[float]) -> str:
        return f"{statistics.mean(values):.4f}" + (f"±{statistics.stdev(values):.3f}" if len(values) > 1 else "")

    reference = runs["sentence-transformers"]
    print(f"means over seeds {', '.join(map(str, args.seeds))} (± sample standard deviation); seconds: medians")
    print(f"{'ranking':<24}{'MAP':>14}{'MRR@10':>14}{'NDCG@10':>14}{'seconds':>9}{'NDCG':>8}{'speed':>7}")
    for name, trained in runs.items():
        columns = {metric: [metrics[metric] for _, metrics in trained] for metric in ("map", "mrr@10", "ndcg@10")}
        seconds = statistics.median(time for time, _ in trained)
        ratio = statistics.mean(columns["ndcg@10"]) / statistics.mean(metrics["ndcg@10"] for _, metrics in reference)
        print(f"{name:<24}{spread(columns['map']):>14}{spread(columns['mrr@10']):>14}{spread(columns['ndcg@10']):>14}"
              f"{seconds:>9.1f}{ratio:>7.3f}x{statistics.median(time for time, _ in reference) / seconds:>6.2f}x")
    for name, metrics in without_a_model(dev).items():
        print(f"{name:<24}{metrics['map']:>14.4f}{metrics['mrr@10']:>14.4f}{metrics['ndcg@10']:>14.4f}")


if __name__ == "__main__":
    main()
