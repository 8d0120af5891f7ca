"""`bertforge serve`: the HTTP inference server (/predict, /embed, /v1/embeddings, /rerank, /tokenize, /attention,
/health, /metrics, /docs)."""

from __future__ import annotations

import argparse
import os

from bertforge.cli.arguments import (
    add_inference_arguments,
    add_model_argument,
    finite_float,
    inference_options,
    positive_int,
)
from bertforge.inference.serve.settings import API_KEY_VARIABLE, LONG_TEXT_POLICIES, ServeSettings


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than zero, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServeSettings()
    add_model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=port_number, default=8000, help="TCP port to listen on")
    parser.add_argument("--max-batch-size", type=positive_int, default=defaults.max_batch_size,
                        help="texts per forward pass")
    parser.add_argument("--max-batch-tokens", type=positive_int, default=defaults.max_batch_tokens,
                        help="padded tokens (texts x longest) per forward pass")
    parser.add_argument("--max-wait-ms", type=non_negative_float, default=defaults.max_wait_ms,
                        help="how long a text may wait for others to share its forward pass")
    parser.add_argument("--max-queue", type=positive_int, default=defaults.max_queue,
                        help="texts waiting at most; requests beyond that get 503")
    parser.add_argument("--max-texts", type=positive_int, default=defaults.max_texts,
                        help="texts (or questions) per request at most (more get 413)")
    parser.add_argument("--max-length", type=positive_int, default=defaults.max_length,
                        help="tokens per text for /embed, /tokenize and an encoder's /rerank (a fine-tuned model's "
                             "/predict uses the max_length it was trained with)")
    parser.add_argument("--long-text", choices=LONG_TEXT_POLICIES, default=defaults.long_text,
                        help="a text over the limit is cut (truncate; windows where the model was trained with "
                             "them) or answered with 413 (refuse)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=defaults.max_body_bytes,
                        help="request body size at most (larger gets 413 before it is read)")
    parser.add_argument("--read-timeout", type=positive_float, default=defaults.read_timeout,
                        help="seconds a client has to send a whole request; slower ones are disconnected")
    parser.add_argument("--idle-timeout", type=positive_float, default=defaults.idle_timeout,
                        help="seconds an idle keep-alive connection stays open")
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: the "
                             f"{API_KEY_VARIABLE} environment variable; unset: no key)")
    add_inference_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertforge.inference.serve.app import serve

    settings = ServeSettings(max_batch_size=args.max_batch_size, max_batch_tokens=args.max_batch_tokens,
                             max_wait_ms=args.max_wait_ms, max_queue=args.max_queue, max_texts=args.max_texts,
                             max_length=args.max_length, long_text=args.long_text,
                             max_body_bytes=args.max_body_bytes, read_timeout=args.read_timeout,
                             idle_timeout=args.idle_timeout,
                             api_key=args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE))
    serve(args.model, host=args.host, port=args.port, settings=settings, inference=inference_options(args))
    return 0
