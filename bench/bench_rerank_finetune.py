"""Fine-tuning a reranker: bertforge's `finetune --task rerank` vs sentence-transformers' CrossEncoderTrainer, one run.

    python bench/bench_rerank_finetune.py [--train-paragraphs 100] [--dev-paragraphs 100] [--threads 2]

The data is answer-sentence selection made from SQuAD v1.1 dev (as GLUE's QNLI is made from SQuAD): each
paragraph's questions, each with every sentence of its passage, the sentence where the answer starts relevant (1),
the others not (0). Training takes the paragraphs from the top of the file, the dev set the same number of
paragraphs from the middle (none shared). Both trainers start from the default model's folder (all-MiniLM-L6-v2) with
a new one-output head, and train with binary cross-entropy, batch 32, lr 1e-4 warmed up over a tenth of the steps
then decayed linearly, AdamW with weight decay 0.01, gradients clipped at norm 1, 2 epochs of shuffled batches,
inputs cut at 128 tokens, fp32 on the CPU, no evaluation while training. Seconds are the whole call (loading,
training, saving).

Both folders are then scored by sentence-transformers' CrossEncoderRerankingEvaluator (MAP, MRR@10, NDCG@10) on
the dev queries, beside two rankings that need no model: the sentences in random order (its expected MRR) and by
how many words each shares with the question.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

BATCH_SIZE, LR, WARMUP_RATIO, WEIGHT_DECAY, EPOCHS, SEED, MAX_LENGTH = 32, 1e-4, 0.1, 0.01, 2, 42, 128
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


def train_bertforge(train_file: Path, output: Path) -> float:
    start = time.perf_counter()
    finetune(FinetuneConfig(
        task="rerank", train=str(train_file), output=str(output), model=str(default_model_dir()),
        batch_size=BATCH_SIZE,  # inputs cut at the task's default max_length, 128 (MAX_LENGTH)
        training=TrainConfig(lr=LR, warmup_ratio=WARMUP_RATIO, weight_decay=WEIGHT_DECAY, epochs=EPOCHS, seed=SEED,
                             lr_schedule="linear", max_grad_norm=1.0, progress=False, device="cpu")))
    return time.perf_counter() - start


def train_sentence_transformers(rows: list[dict], output: Path) -> float:
    import datasets
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    dataset = datasets.Dataset.from_dict({"query": [row["query"] for row in rows],
                                          "document": [row["document"] for row in rows],
                                          "label": [float(row["label"]) for row in rows]})
    arguments = CrossEncoderTrainingArguments(
        output_dir=str(output / "trainer"), per_device_train_batch_size=BATCH_SIZE, num_train_epochs=EPOCHS,
        learning_rate=LR, warmup_steps=WARMUP_RATIO, lr_scheduler_type="linear", weight_decay=WEIGHT_DECAY,
        max_grad_norm=1.0, seed=SEED, data_seed=SEED, use_cpu=True, fp16=False, bf16=False, report_to="none",
        save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True)
    start = time.perf_counter()
    model = CrossEncoder(str(default_model_dir()), num_labels=1, max_length=MAX_LENGTH, device="cpu")
    trainer = CrossEncoderTrainer(model=model, args=arguments, train_dataset=dataset,
                                  loss=BinaryCrossEntropyLoss(model))
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.train()
    model.save(str(output / "model"), create_model_card=False)
    return time.perf_counter() - start


def without_a_model(samples: dict[str, dict], seed: int = SEED) -> dict[str, dict[str, float]]:
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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data folder (holding squad/)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tune_cpu_allocator()
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
          f"queries; binary cross-entropy, batch {BATCH_SIZE}, lr {LR:g}, {EPOCHS} epochs, seed {SEED}")

    evaluator = CrossEncoderRerankingEvaluator(list(dev.values()), at_k=10, batch_size=64)
    results, seconds = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        train_file = scratch / "train.jsonl"
        train_file.write_text("".join(json.dumps(row) + "\n" for row in train), encoding="utf-8")
        for name, run, folder in (("bertforge", lambda: train_bertforge(train_file, scratch / "bertforge"),
                                   scratch / "bertforge"),
                                  ("sentence-transformers", lambda: train_sentence_transformers(
                                      train, scratch / "sentence-transformers"), scratch / "sentence-transformers"
                                   / "model")):
            load = os.getloadavg()[0]
            seconds[name] = run()
            print(f"  {name}: {seconds[name]:.1f} s (1-minute load average before it: {load:.1f})")
            results[name] = evaluator(CrossEncoder(str(folder), device="cpu"))
    results.update(without_a_model(dev))

    reference = "sentence-transformers"
    print(f"{'ranking':<24}{'MAP':>8}{'MRR@10':>8}{'NDCG@10':>9}{'seconds':>9}{'NDCG':>8}{'speed':>7}")
    for name, metrics in results.items():
        line = f"{name:<24}{metrics['map']:>8.4f}{metrics['mrr@10']:>8.4f}{metrics['ndcg@10']:>9.4f}"
        if name in seconds:
            line += (f"{seconds[name]:>9.1f}{metrics['ndcg@10'] / results[reference]['ndcg@10']:>7.3f}x"
                     f"{seconds[reference] / seconds[name]:>6.2f}x")
        print(line)


if __name__ == "__main__":
    main()
