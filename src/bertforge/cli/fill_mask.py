"""`bertforge fill-mask`: the most likely tokens for each [MASK] of a text, from a masked-LM checkpoint."""

from __future__ import annotations

import argparse
import json

import torch

from bertforge.cli.arguments import add_model_argument, positive_int
from bertforge.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help='a text with one or more [MASK] tokens, e.g. "Paris is the [MASK] of France."')
    add_model_argument(parser)
    parser.add_argument("--top-k", type=positive_int, default=5, help="predictions per [MASK]")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def fill_mask(model, tokenizer, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each [MASK] of `text`, in order, the `top_k` likeliest tokens and their probabilities.

    Each mask is predicted on its own (the others stay masked), as transformers' fill-mask pipeline does.
    """
    encoding = tokenizer(text, return_tensors="pt")
    input_ids = encoding["input_ids"]
    is_mask = input_ids[0] == tokenizer.mask_token_id
    if not is_mask.any():
        raise InputError(f"the text has no {tokenizer.vocab.special_tokens['mask_token']} token to fill in")
    with torch.inference_mode():
        logits = model(input_ids, encoding["attention_mask"], encoding["token_type_ids"]).logits
    probs = logits[0, is_mask].float().softmax(-1)  # (masks, vocab)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[(tokenizer.convert_ids_to_tokens(i), p) for i, p in zip(ids.tolist(), values.tolist())]
            for ids, values in zip(top.indices, top.values)]


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.optimize import AS_TRAINED
    from bertforge.pretraining import BertForMaskedLM
    from bertforge.tokenizer import BertTokenizer

    # require_heads: a checkpoint without a masked-LM head (a sentence encoder such as the default
    # all-MiniLM-L6-v2) is an error, not a randomly initialised head that predicts noise.
    model = AS_TRAINED.apply(BertForMaskedLM.from_pretrained(args.model, require_heads=True))
    tokenizer = BertTokenizer.from_pretrained(args.model)
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
