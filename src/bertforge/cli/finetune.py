"""`bertforge finetune`: fine-tune a model on a CSV/TSV/JSONL file (a CoNLL file for ner, SQuAD JSON for qa);
flags and `--config run.json` fill one FinetuneConfig (flags win over the file, the file over the defaults)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from bertforge.cli.arguments import finite_float
from bertforge.config import read_json_object
from bertforge.tasks.classification import LONG_TEXT
from bertforge.tasks.registry import TASKS
from bertforge.tasks.token_classification import CONTEXTS, DECODINGS

# flag -> (place in FinetuneConfig's JSON, type, help); every default is None, so an absent flag leaves the
# run config's value (or the dataclass default) in place.
FLAGS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "--train": (("train",), str, "training data (.csv, .tsv, .jsonl; CoNLL for ner; SQuAD .json for qa)"),
    "--dev": (("dev",), str, "evaluation data; the best model on it is kept"),
    "--output": (("output",), str, "output model directory"),
    "--model": (("model",), str, "pre-trained model directory, or 'default' (all-MiniLM-L6-v2)"),
    "--max-length": (("max_length",), int, "tokens per input (default 128; qa 384)"),
    "--doc-stride": (("doc_stride",), int, "overlap of windows over long inputs: qa tokens (128), ner words (16)"),
    "--max-query-length": (("max_query_length",), int, "qa: question tokens kept (default 64)"),
    "--n-best": (("n_best",), int, "qa: answers kept per question (default 20)"),
    "--max-answer-length": (("max_answer_length",), int, "qa: longest answer in tokens (default 30)"),
    "--null-score-threshold": (("null_score_threshold",), finite_float,
                               "qa with --version-2: margin by which no answer must beat the best span (default 0)"),
    "--threshold": (("threshold",), finite_float,
                    "multi_label: predict a label when its probability is over this (default: chosen on --dev, "
                    "else 0.5)"),
    "--dropout": (("dropout",), finite_float,
                  "dropout on hidden states and attention weights (default: the model's)"),
    "--batch-size": (("batch_size",), int, "examples per batch (default 32)"),
    "--eval-batch-size": (("eval_batch_size",), int, "examples per evaluation batch (default 64)"),
    "--max-train-examples": (("max_train_examples",), int, "use only the first N training examples"),
    "--epochs": (("training", "epochs"), int, "passes over the training data (default 3)"),
    "--max-steps": (("training", "max_steps"), int, "stop after N optimizer steps (overrides --epochs)"),
    "--lr": (("training", "lr"), finite_float, "peak learning rate (default 5e-5)"),
    "--weight-decay": (("training", "weight_decay"), finite_float, "AdamW weight decay (default 0.01)"),
    "--warmup-ratio": (("training", "warmup_ratio"), finite_float, "fraction of steps warming up (default 0)"),
    "--grad-accum": (("training", "grad_accumulation"), int, "batches per optimizer step (default 1)"),
    "--eval-every": (("training", "eval_every"), int, "evaluate every N steps (default: every epoch)"),
    "--seed": (("training", "seed"), int, "random seed (default 42)"),
    "--early-stopping": (("training", "early_stopping_patience"), int,
                         "stop after N evaluations without improvement"),
    "--save-every": (("training", "save_every"), int,
                     "optimizer steps between resumable checkpoints (default: at every evaluation)"),
    "--device": (("training", "device"), str, "cpu, cuda, ... (default: cuda when available)"),
}
COLUMN_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "--text-column": (("text_column",), "column of the text (default 'sentence')"),
    "--text-pair-column": (("text_pair_column",), "column of the second text, for pair tasks"),
    "--label-column": (("label_column",), "column of the label or score (default 'label')"),
    "--label-separator": (("label_separator",), "multi_label: what separates the labels in a text cell, e.g. '|' "
                                                "(a JSON list such as [\"a\", \"b\"] needs none)"),
}


def add_column_arguments(parser: argparse.ArgumentParser) -> None:
    """Column choices, shared by finetune, evaluate and predict (which default to the training run's)."""
    for flag, (_, help_text) in COLUMN_FLAGS.items():
        parser.add_argument(flag, default=None, help=help_text)


def add_decoding_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """--decoding, shared by finetune, evaluate and predict (which default to the training run's)."""
    parser.add_argument("--decoding", choices=list(DECODINGS), default=None,
                        help=f"ner: each word's most probable tag (argmax) or the most probable valid IOB2 sequence "
                             f"(viterbi); default: {default}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="run config JSON (FinetuneConfig fields; flags override it)")
    parser.add_argument("--task", choices=list(TASKS), default=None, help="default: classification")
    for flag, (_, kind, help_text) in FLAGS.items():
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    add_column_arguments(parser)
    parser.add_argument("--long-text", choices=list(LONG_TEXT), default=None,
                        help="texts over --max-length: truncate (default) or average overlapping windows")
    parser.add_argument("--context", choices=list(CONTEXTS), default=None,
                        help="ner: what fills the rest of each window: nothing (sentence, the default) or the "
                             "sentences around it in its document (-DOCSTART- blocks), as BERT's CoNLL-2003 result")
    add_decoding_argument(parser, "argmax")
    parser.add_argument("--version-2", action="store_const", const=True, default=None,
                        help="qa: SQuAD v2 data, where questions may have no answer")
    parser.add_argument("--random-init", action="store_const", const=True, default=None,
                        help="the --model architecture with fresh weights (a from-scratch baseline)")
    parser.add_argument("--bf16", action="store_const", const=True, default=None,
                        help="bf16 autocast where the hardware supports it")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False, default=None,
                        help="no progress bar")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model already in --output (otherwise that is an error)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the killed run into --output from its last checkpoint, with the same settings")


def config_from_args(args: argparse.Namespace):
    """The run config JSON (if any) with every given flag written over it, as a FinetuneConfig."""
    from bertforge.tasks.finetune import FinetuneConfig

    data, source = {}, "command line"
    if args.config:
        path = Path(args.config)
        data = read_json_object(path, "run config")
        source = str(path)
    places = {flag: place for flag, (place, _, _) in FLAGS.items()}
    places |= {flag: place for flag, (place, _) in COLUMN_FLAGS.items()}
    places |= {"--task": ("task",), "--long-text": ("long_text",), "--context": ("context",),
               "--decoding": ("decoding",),
               "--version-2": ("version_2",), "--random-init": ("random_init",),
               "--bf16": ("training", "bf16"), "--no-progress": ("training", "progress")}
    for flag, place in places.items():
        dest = "progress" if flag == "--no-progress" else flag.lstrip("-").replace("-", "_")
        value = getattr(args, dest)
        if value is not None:
            section = data
            for key in place[:-1]:
                section = section.setdefault(key, {})
            section[place[-1]] = value
    return FinetuneConfig.from_dict(data, source)


def run(args: argparse.Namespace) -> int:
    from bertforge.tasks.finetune import finetune
    from bertforge.training.plot import plot_trainer_run

    result = finetune(config_from_args(args), overwrite=args.overwrite, resume=args.resume)
    for note in result.notes:
        print(note)
    if result.best is not None:
        metrics = ", ".join(f"{name}={value:.4f}" for name, value in result.best.items()
                            if name not in ("step", "epoch"))
        print(f"best model (step {result.best['step']} of {result.steps}): {metrics}")
    if result.stopped_early:
        print("stopped early: no improvement")
    print(f"saved to {result.output_dir}")
    if importlib.util.find_spec("matplotlib") is None:
        print('no curves drawn: that needs matplotlib (pip install "bertforge[plot]")')
    else:
        print(f"curves: {plot_trainer_run(result.output_dir, title=f'fine-tuning: {result.output_dir}')}")
    return 0
