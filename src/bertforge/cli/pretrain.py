"""`bertforge pretrain ...`: the pre-training life cycle, one nested subcommand per step."""

from __future__ import annotations

import argparse

from bertforge.cli import pretrain_eval, pretrain_plot, pretrain_prepare, pretrain_train

STEPS = {
    "prepare": (pretrain_prepare, "tokenize a text corpus into token-id shards for pre-training"),
    "train": (pretrain_train, "pre-train a model on a prepared corpus (checkpoints, --resume)"),
    "eval": (pretrain_eval, "held-out masked-LM loss, perplexity and accuracy of a pre-trained model"),
    "plot": (pretrain_plot, "draw a run's log.jsonl (losses, accuracies, learning rate, evaluations) as a PNG"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    steps = parser.add_subparsers(dest="step", required=True, metavar="STEP")
    for name, (module, help_text) in STEPS.items():
        step = steps.add_parser(name, help=help_text, description=help_text, formatter_class=parser.formatter_class)
        module.add_arguments(step)
        step.set_defaults(run=module.run)


def run(args: argparse.Namespace) -> int:
    # Each step sets its own `run`, which replaces this one when the step's arguments are parsed.
    return args.run(args)
