"""`bertforge serve`: the HTTP inference server (/embed, /predict, /tokenize, /attention, /health, /docs)."""

from __future__ import annotations

import argparse

from bertforge.cli.arguments import add_inference_arguments, add_model_argument, inference_options, positive_int
from bertforge.inference.serve import LONG_TEXT_POLICIES, ServeSettings


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServeSettings()
    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--max-batch-size", type=positive_int, default=defaults.max_batch_size,
                        help="texts per forward pass")
    parser.add_argument("--max-wait-ms", type=non_negative_float, default=defaults.max_wait_ms,
                        help="how long a text may wait for others to share its forward pass")
    parser.add_argument("--max-queue", type=positive_int, default=defaults.max_queue,
                        help="texts waiting at most; requests beyond that get 503")
    parser.add_argument("--max-texts", type=positive_int, default=defaults.max_texts,
                        help="texts (or questions) per request at most (more get 413)")
    parser.add_argument("--max-length", type=positive_int, default=defaults.max_length,
                        help="tokens per text (or pair) at most")
    parser.add_argument("--long-text", choices=LONG_TEXT_POLICIES, default=defaults.long_text,
                        help="a text over --max-length is cut (truncate; a question's context is split into "
                             "windows) or answered with 413 (refuse)")
    add_inference_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.serve import serve

    settings = ServeSettings(max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                             max_queue=args.max_queue, max_texts=args.max_texts, max_length=args.max_length,
                             long_text=args.long_text)
    serve(args.model, host=args.host, port=args.port, settings=settings, inference=inference_options(args))
    return 0
