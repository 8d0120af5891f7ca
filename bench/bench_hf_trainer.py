"""transformers' Trainer fine-tuning bertforge's model beside transformers' own, on the same weights and data.

    python bench/bench_hf_trainer.py [--sentences 640] [--batch-size 32] [--repeats 2]

MiniLM with a new 2-label head, the first SST-2 training sentences (1 epoch) and Trainer.predict over the same
sentences; the same Trainer arguments, seed, tokenized examples (bertforge's tokenizer, which gives transformers'
ids) and collator for both models. The two alternate, and each figure is the median of the repeats.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time

import torch
import transformers
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import DATA

from bertforge import BertForSequenceClassification, BertTokenizer
from bertforge.checkpoint.default_model import default_model_dir


def sst2_examples(tokenizer, count: int) -> list[dict]:
    with open(DATA / "sst2" / "train.tsv", encoding="utf-8") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [{**tokenizer(row["sentence"], truncation=True, max_length=128), "labels": int(row["label"])}
                for row, _ in zip(rows, range(count))]


def timed_run(model, examples, tokenizer, batch_size: int) -> tuple[float, float, float]:
    """Seconds to train one epoch and to predict, and the training loss."""
    arguments = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=batch_size,
                                               per_device_eval_batch_size=2 * batch_size, num_train_epochs=1,
                                               learning_rate=5e-5, report_to=[], use_cpu=True, save_strategy="no",
                                               logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=examples,
                                   processing_class=tokenizer,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    trainer.remove_callback(transformers.PrinterCallback)  # its per-run metrics lines; the table says it all
    start = time.perf_counter()
    loss = trainer.train().training_loss
    trained = time.perf_counter() - start
    start = time.perf_counter()
    trainer.predict(examples)
    return trained, time.perf_counter() - start, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    print(f"{machine()}; torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} threads")
    tokenizer = BertTokenizer.from_pretrained("default")
    examples = sst2_examples(tokenizer, args.sentences)
    makers = {
        "bertforge": lambda: BertForSequenceClassification.from_pretrained("default", num_labels=2),
        "transformers": lambda: transformers.BertForSequenceClassification.from_pretrained(default_model_dir(),
                                                                                             num_labels=2),
    }
    times = {name: [] for name in makers}
    for repeat in range(args.repeats):
        for name in list(makers) if repeat % 2 == 0 else list(makers)[::-1]:
            torch.manual_seed(0)
            times[name].append(timed_run(makers[name](), examples, tokenizer, args.batch_size))
    print(f"SST-2 train, first {args.sentences} sentences, batch {args.batch_size}, 1 epoch; median of "
          f"{args.repeats}")
    print(f"{'model':<14}{'train s':>9}{'predict s':>11}{'loss':>8}{'train vs tf':>13}{'predict vs tf':>15}")
    reference = [statistics.median(run[i] for run in times["transformers"]) for i in range(2)]
    for name, runs in times.items():
        train, predict = (statistics.median(run[i] for run in runs) for i in range(2))
        loss = statistics.median(run[2] for run in runs)
        print(f"{name:<14}{train:>9.2f}{predict:>11.2f}{loss:>8.4f}{reference[0] / train:>12.2f}x"
              f"{reference[1] / predict:>14.2f}x")


if __name__ == "__main__":
    main()
