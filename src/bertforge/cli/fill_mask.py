"""`bertforge fill-mask`: the most likely tokens for each [MASK] of a text, from a masked-LM checkpoint, as the
fill-mask pipeline (inference/pipelines.py) answers them."""

from __future__ import annotations

import argparse
import json

from bertforge.cli import columns
from bertforge.cli.arguments import add_model_argument, positive_int, texts_or_standard_input


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help='a text with one or more [MASK] tokens, e.g. "Paris is the [MASK] of France."; '
                                     "'-' reads it from standard input")
    add_model_argument(parser)
    parser.add_argument("--top-k", type=positive_int, default=5, help="predictions per [MASK]")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table: per [MASK], transformers' "
                                                            "fill-mask answers {score, token, token_str, sequence}")


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.pipelines import pipeline

    # transformers' fill-mask pipeline answers: per [MASK], its top_k {score, token (the id), token_str, sequence}
    [text] = texts_or_standard_input(args.text)
    answer = pipeline("fill-mask", model=args.model, device="cpu")(text, top_k=args.top_k)
    masks = answer if answer and isinstance(answer[0], list) else [answer]
    if args.json:
        print(json.dumps(masks, ensure_ascii=False))
        return 0
    for number, mask in enumerate(masks, 1):
        if len(masks) > 1:
            print(f"[MASK] {number}:")
        for rank, row in enumerate(mask, 1):
            print(f"{rank:>3}. {columns.left(columns.printable(row['token_str']), 20)} {row['score']:7.2%}")
    return 0
