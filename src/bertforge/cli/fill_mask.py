"""`bertforge fill-mask`: the most likely tokens for each [MASK] of a text, from a masked-LM checkpoint."""

from __future__ import annotations

import argparse
import json

from bertforge.cli.arguments import add_model_argument, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help='a text with one or more [MASK] tokens, e.g. "Paris is the [MASK] of France."')
    add_model_argument(parser)
    parser.add_argument("--top-k", type=positive_int, default=5, help="predictions per [MASK]")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.fill_mask import fill_mask, load_masked_lm

    model, tokenizer = load_masked_lm(args.model)
    predictions = fill_mask(model, tokenizer, args.text, args.top_k)
    if args.json:
        print(json.dumps([[{"token": token, "score": score} for token, score in mask] for mask in predictions],
                         ensure_ascii=False))
        return 0
    for number, mask in enumerate(predictions, 1):
        if len(predictions) > 1:
            print(f"[MASK] {number}:")
        for rank, (token, score) in enumerate(mask, 1):
            print(f"{rank:>3}. {token:<20} {score:7.2%}")
    return 0
