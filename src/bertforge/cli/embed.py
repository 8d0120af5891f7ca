"""`bertforge embed`: one vector per input line, written as .npy or JSON lines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bertforge.atomic import atomic_path, write_text_atomic
from bertforge.cli.arguments import add_model_argument, load_encoder, positive_int, read_lines
from bertforge.errors import InputError
from bertforge.inference import LAYER_COMBINATIONS, POOLINGS, extract_features

OUTPUT_FORMATS = (".npy", ".jsonl")


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("--pool", choices=list(POOLINGS), default="mean", help="how token vectors become one")
    parser.add_argument("--layers", choices=list(LAYER_COMBINATIONS), default="last", help="which hidden states")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--max-length", type=positive_int, default=None, help="truncate longer texts (tokens)")
    parser.add_argument("--normalize", action="store_true", help="scale each vector to unit length")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", "-i", required=True, help="text file, one text per line")
    parser.add_argument("--output", "-o", required=True, help="FILE.npy (float32 matrix) or FILE.jsonl")
    add_feature_arguments(parser)


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.suffix not in OUTPUT_FORMATS:
        raise InputError(f"unsupported output format; use one of {', '.join(OUTPUT_FORMATS)}", output)
    texts = read_lines(args.input)
    model, tokenizer = load_encoder(args.model)
    vectors = extract_features(model, tokenizer, texts, layers=args.layers, pooling=args.pool,
                               batch_size=args.batch_size, max_length=args.max_length,
                               normalize=args.normalize, progress=len(texts) > 10 * args.batch_size)
    matrix = vectors.float().numpy()
    if output.suffix == ".npy":
        with atomic_path(output) as temporary, open(temporary, "wb") as handle:
            np.save(handle, matrix)
    else:
        write_text_atomic(output, "".join(json.dumps({"text": text, "embedding": vector.tolist()}) + "\n"
                                          for text, vector in zip(texts, matrix)))
    print(f"wrote {matrix.shape[0]} vectors of size {matrix.shape[1]} to {output}")
    return 0
