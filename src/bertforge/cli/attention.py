"""`bertforge attention`: write the attention viewer (every layer and head) for a text or pair as one HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.atomic import write_text_atomic
from bertforge.cli.arguments import (
    add_model_argument,
    check_writable,
    load_encoder,
    path_text,
    positive_int,
    texts_or_standard_input,
)
from bertforge.errors import InputError
from bertforge.inference.attention_view import DEFAULT_MAX_TOKENS, compute_attention, render_attention_map


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="the text whose attention to show ('-': standard input)")
    parser.add_argument("--pair", help="a second text (segment B)")
    parser.add_argument("--output", "-o", type=path_text, required=True, help="the HTML file to write")
    add_model_argument(parser)
    parser.add_argument("--max-length", type=positive_int,
                        help=f"truncate to this many tokens (default {DEFAULT_MAX_TOKENS}, or the model's positions "
                             f"when fewer; the page grows with its square)")


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.suffix.lower() not in (".html", ".htm"):
        raise InputError("the output must be an .html file", output)
    check_writable(output, args.model)
    args.text, args.pair = texts_or_standard_input(args.text, args.pair)
    if not args.text.strip():
        raise InputError("the text is empty")
    model, tokenizer = load_encoder(args.model)  # a task checkpoint's encoder loads too; heads are skipped
    attention = compute_attention(model, tokenizer, args.text, args.pair, max_length=args.max_length)
    layers, heads, seq, _ = attention.attentions.shape
    write_text_atomic(output, render_attention_map(attention, title=f"Attention: {args.text[:80]}"))
    print(f"wrote the attention of {layers} layers x {heads} heads over {seq} tokens to {output}")
    return 0
