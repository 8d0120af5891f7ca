"""Do attributions mean something? A deletion check on real data (SST-2 dev sentences).

For each sentence, the classifier's predicted class and its probability; then the k words that integrated
gradients (or another method) credit most for that class are deleted from the sentence, and the same number of
words chosen at random, and the sentence is classified again. Attributions that mean something lower the
probability of the predicted class, and flip the prediction, far more than random deletions do.

    python bench/bench_explain.py [--model DIR] [--sentences 64] [--method integrated_gradients]

Without --model, the classifier is MiniLM with a head trained on 2,048 SST-2 training phrases (the encoder frozen:
a full fine-tune takes too long for a bench on a shared 2-core CPU); --model takes any fine-tuned SST-2 classifier.
"""

from __future__ import annotations

import argparse
import csv
import random
import time
from pathlib import Path

import torch
from machine import machine  # bench/ is the script's folder, so on sys.path

from bertforge import BertForSequenceClassification, BertTokenizer, explain
from bertforge.explain import METHODS

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"
LABELS = {0: "negative", 1: "positive"}


def read_sst2(name: str) -> list[tuple[str, int]]:
    with open(DATA / name, encoding="utf-8") as handle:
        return [(row["sentence"].strip(), int(row["label"]))
                for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


def train_head(tokenizer, phrases: int) -> BertForSequenceClassification:
    """MiniLM with a classification head trained on the encoder's pooled vectors of SST-2 training phrases."""
    rows = [row for row in read_sst2("train.tsv") if len(row[0].split()) >= 5][:phrases]
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained("default", id2label=LABELS).eval()
    texts, labels = zip(*rows)
    with torch.inference_mode():
        pooled = torch.cat([model.bert(**tokenizer(list(texts[i:i + 64]), padding=True, return_tensors="pt"))
                            .pooler_output for i in range(0, len(texts), 64)])
    optimizer = torch.optim.AdamW(model.classifier.parameters(), lr=1e-2)
    for _ in range(300):
        model.classifier.loss(model.classifier(pooled.clone()), torch.tensor(labels)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@torch.inference_mode()
def probabilities(model, tokenizer, texts: list[str]) -> torch.Tensor:
    """(texts, labels); an emptied sentence is classified as the empty string."""
    return model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.softmax(-1)


def without(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with the character spans removed (and the spaces they leave collapsed)."""
    for start, end in sorted(spans, reverse=True):
        text = text[:start] + text[end:]
    return " ".join(text.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a fine-tuned SST-2 classifier directory (default: train a head here)")
    parser.add_argument("--sentences", type=int, default=64, help="SST-2 dev sentences (the first ones)")
    parser.add_argument("--deletions", type=int, default=4, help="delete 1..this many words")
    parser.add_argument("--random-repeats", type=int, default=5, help="random deletions averaged per sentence")
    parser.add_argument("--method", choices=list(METHODS), default="integrated_gradients")
    parser.add_argument("--phrases", type=int, default=2048, help="training phrases for the head (without --model)")
    args = parser.parse_args()
    print(f"{machine()}; torch {torch.__version__}, {torch.get_num_threads()} threads")

    tokenizer = BertTokenizer.from_pretrained(args.model or "default")
    model = (BertForSequenceClassification.from_pretrained(args.model).eval() if args.model
             else train_head(tokenizer, args.phrases))
    sentences = [(text, label) for text, label in read_sst2("dev.tsv")
                 if len(text.split()) > args.deletions][:args.sentences]
    texts = [text for text, _ in sentences]
    before = probabilities(model, tokenizer, texts)
    predicted = before.argmax(-1)
    accuracy = (predicted == torch.tensor([label for _, label in sentences])).float().mean()
    print(f"classifier: {args.model or f'MiniLM + head on {args.phrases} SST-2 phrases'}; "
          f"accuracy on these {len(texts)} dev sentences {accuracy:.3f}; attributions: {args.method}")

    generator = random.Random(0)
    started = time.perf_counter()
    edited = {"top": [[] for _ in range(args.deletions)], "random": [[] for _ in range(args.deletions)]}
    for text, label in zip(texts, predicted.tolist()):
        explanation = explain(model, tokenizer, text, target=LABELS[label], method=args.method)
        ranked = sorted(explanation.words, key=lambda word: -word.attribution)
        for k in range(1, args.deletions + 1):
            edited["top"][k - 1].append(without(text, [(w.start, w.end) for w in ranked[:k]]))
            for _ in range(args.random_repeats):
                chosen = generator.sample(explanation.words, k)
                edited["random"][k - 1].append(without(text, [(w.start, w.end) for w in chosen]))
    seconds = time.perf_counter() - started

    original = before[torch.arange(len(texts)), predicted]
    print(f"{len(texts)} explanations in {seconds:.1f} s; "
          f"mean p(predicted class) before deletion {original.mean():.3f}")
    print(f"{'deleted words':>13}  {'p(class) top':>12}  {'p(class) random':>15}  {'flipped top':>11}  "
          f"{'flipped random':>14}  {'drop ratio':>10}")
    for k in range(1, args.deletions + 1):
        summary = {}
        for kind, repeats in (("top", 1), ("random", args.random_repeats)):
            after = probabilities(model, tokenizer, edited[kind][k - 1])
            classes = predicted.repeat_interleave(repeats)
            kept = after[torch.arange(len(classes)), classes]
            summary[kind] = (kept.mean(), (after.argmax(-1) != classes).float().mean(),
                             (original.repeat_interleave(repeats) - kept).mean())
        ratio = summary["top"][2] / summary["random"][2] if summary["random"][2] > 0 else float("inf")
        print(f"{k:>13}  {summary['top'][0]:>12.3f}  {summary['random'][0]:>15.3f}  {summary['top'][1]:>11.3f}  "
              f"{summary['random'][1]:>14.3f}  {ratio:>9.1f}x")


if __name__ == "__main__":
    main()
