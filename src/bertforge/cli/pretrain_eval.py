"""`bertforge pretrain eval`: a model's held-out masked-LM loss, perplexity and accuracy on a prepared corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.cli.arguments import (
    check_writable,
    held_out_size,
    path_text,
    positive_int,
    report,
    seed_number,
    write_output,
)
from bertforge.outputs import check_not_trainer_metrics, to_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", type=path_text, required=True,
                        help="a checkpoint directory with a masked-LM head (the output of `pretrain train`)")
    parser.add_argument("--data", type=path_text, required=True, help="the corpus folder the model was trained on")
    parser.add_argument("--holdout", type=held_out_size, default=None,
                        help="the held-out split's size as in training (default: the training run's, in the "
                             "model's pretrain_config.json, else 0.01)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="sequences per batch (default: the training run's, else 32)")
    parser.add_argument("--max-batches", type=positive_int, default=None, help="default: the whole held-out split")
    parser.add_argument("--max-length", type=positive_int, default=None,
                        help="tokens per sequence (default: the training run's, else 128)")
    parser.add_argument("--seq-len", dest="max_length", type=positive_int, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    from bertforge.pretraining.masking import MASKING_STRATEGIES
    parser.add_argument("--masking", choices=list(MASKING_STRATEGIES), default=None,
                        help="masking strategy of the evaluation (default: the training run's, else token)")
    parser.add_argument("--seed", type=seed_number, default=None,
                        help="seed of the evaluation's masks (default: the training run's, else 0)")
    parser.add_argument("--output", "-o", type=path_text, default=None, metavar="FILE",
                        help="where to write the metrics as JSON (default: MODEL/eval_results.json)")


def run(args: argparse.Namespace) -> int:
    from bertforge.pretraining.run import evaluate_pretrained

    output = check_writable(args.output or check_not_trainer_metrics(Path(args.model) / "eval_results.json"),
                            args.model, args.data)
    metrics = evaluate_pretrained(args.model, args.data, args.holdout, batch_size=args.batch_size,
                                  max_batches=args.max_batches, seq_len=args.max_length, masking=args.masking,
                                  seed=args.seed)
    write_output(output, to_json(metrics, indent=2) + "\n")
    report(output, f"held-out masked LM: loss {metrics['loss']:.4f}, perplexity {metrics['perplexity']:.2f}, "
                   f"accuracy {metrics['accuracy']:.4f} ({metrics['masked_tokens']:,} masked tokens; always "
                   f"guessing the most frequent one: {metrics['frequency_baseline_accuracy']:.4f})")
    report(output, f"wrote {output}")
    return 0
