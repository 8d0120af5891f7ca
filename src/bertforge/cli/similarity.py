"""`bertforge similarity`: embed a few sentences and print their cosine similarity table (a SPLADE model's: of
its word-piece weights; a ColBERT model's: MaxSim, each row's sentence as the query)."""

from __future__ import annotations

import argparse

import torch.nn.functional as F

from bertforge.cli import columns
from bertforge.cli.arguments import inference_options, load_encoder, path_text, read_lines
from bertforge.cli.embed import add_feature_arguments, colbert_encoder, splade_encoder, uses_colbert, uses_splade
from bertforge.errors import InputError
from bertforge.inference.similarity import similarity_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", help="sentences to compare")
    parser.add_argument("--input", "-i", type=path_text, help="or a text file with one sentence per line")
    add_feature_arguments(parser)


def run(args: argparse.Namespace) -> int:
    texts = list(args.texts) + ([line for line in read_lines(args.input) if line.strip()] if args.input else [])
    if len(texts) < 2:
        raise InputError("give at least two sentences to compare (as arguments or with --input)")
    if uses_splade(args):
        vectors = F.normalize(splade_encoder(args).encode(texts, prompt_name=args.prompt_name, prompt=args.prompt,
                                                          batch_size=args.batch_size, convert_to_sparse_tensor=False))
        print(format_table(texts, (vectors @ vectors.T).tolist()))
        return 0
    if uses_colbert(args):  # late interaction: not symmetric, so the table says which side is the query
        encoder = colbert_encoder(args)
        options = dict(prompt_name=args.prompt_name, prompt=args.prompt, batch_size=args.batch_size)
        table = encoder.similarity(encoder.encode_query(texts, **options), encoder.encode_document(texts, **options))
        print(f"{encoder.similarity_fn_name} of each row's sentence as the query with each column's as the document")
        print(format_table(texts, table.tolist()))
        return 0
    model, tokenizer = load_encoder(args.model, inference_options(args))
    table = similarity_table(model, tokenizer, texts, layers=args.layers, pooling=args.pool,
                             batch_size=args.batch_size, max_length=args.max_length, long_text=args.long_text,
                             prompt_name=args.prompt_name, prompt=args.prompt)
    print(format_table(texts, table.tolist()))
    return 0


def format_table(texts: list[str], similarity: list[list[float]], width: int = 48) -> str:
    """Sentences as numbered rows, similarities as columns; each row's best match is starred."""
    labels = [f"{i + 1:>2}. {columns.fit(text, width)}" for i, text in enumerate(texts)]
    header = " " * (width + 4) + "".join(f"{i + 1:>7}" for i in range(len(texts)))
    rows = [header]
    for i, (label, scores) in enumerate(zip(labels, similarity)):
        best = max((j for j in range(len(texts)) if j != i), key=lambda j: scores[j])
        cells = "".join(f"{score:>6.2f}{'*' if j == best else ' '}" for j, score in enumerate(scores))
        rows.append(columns.left(label, width + 4) + cells)
    return "\n".join(rows)
