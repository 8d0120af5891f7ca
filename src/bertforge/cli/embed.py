"""`bertforge embed`: one vector per input line (or per token/word), written as .npy or JSON lines;
`--similar QUERY` ranks the lines by cosine similarity to a query instead. A SPLADE model (`--pool splade`, or
sentence-transformers' SparseEncoder layout) gives each line its word-piece weights, ranked by dot product; a
ColBERT model (checkpoint/multi_vector.py's layouts) its token vectors, ranked by MaxSim."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch.nn.functional as F

from bertforge.atomic import save_array
from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.sentence_transformers import multi_vector_kind
from bertforge.cli.arguments import (
    STANDARD_STREAM,
    add_inference_arguments,
    add_model_argument,
    check_writable,
    inference_options,
    load_encoder,
    path_text,
    positive_int,
    read_lines,
    report,
    write_output,
)
from bertforge.errors import InputError
from bertforge.inference import LAYER_COMBINATIONS, POOLINGS, TOKEN_LEVELS, extract_features, extract_token_features
from bertforge.inference.features import LONG_TEXT
from bertforge.inference.multi_vector_encoder import MultiVectorEncoder
from bertforge.inference.similarity import most_similar
from bertforge.inference.sparse_encoder import (
    SPLADE,
    SparseEncoder,
    is_splade_checkpoint,
    load_splade_model,
    nonzero_weights,
)

OUTPUT_FORMATS = (".npy", ".jsonl")


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("--pool", choices=[*POOLINGS, SPLADE], default=None,
                        help="how token vectors become one (default: the model's sentence-transformers pooling, "
                             "else mean); splade: a masked-LM model's SPLADE weights, one per word piece of the "
                             "vocabulary (the default for a sentence-transformers SparseEncoder folder)")
    parser.add_argument("--layers", choices=list(LAYER_COMBINATIONS), default="last", help="which hidden states")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="texts per batch")
    parser.add_argument("--max-length", type=positive_int, default=None,
                        help="truncate longer texts (tokens; default: the model's sentence-transformers "
                             "max_seq_length, else its tokenizer's model_max_length)")
    parser.add_argument("--long-text", choices=list(LONG_TEXT), default="truncate",
                        help="texts over --max-length: truncate (default), or windows: overlapping windows of "
                             "--max-length tokens advancing by half a window, one vector per text from their pooled "
                             "vectors averaged with weights their token counts (then normalised)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="scale each vector to unit length (default: as the model's sentence-transformers "
                             "layout says, else not)")
    parser.add_argument("--prompt-name", default=None,
                        help="put the model's sentence-transformers prompt of this name before each text (\"query\" "
                             "of config_sentence_transformers.json; default: its default_prompt_name, if any)")
    parser.add_argument("--prompt", default=None, help="put this text before each text, instead of a named prompt")
    add_inference_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", "-i", type=path_text, required=True,
                        help="text file, one text per line; - for standard input")
    parser.add_argument("--output", "-o", type=path_text,
                        help="FILE.npy (float32 matrix) or FILE.jsonl; - for JSON lines on standard output")
    parser.add_argument("--level", choices=("sentence", *TOKEN_LEVELS), default="sentence",
                        help="one vector per line (sentence), per word piece (token) or per word; "
                             "token and word levels write JSON lines with tokens and character offsets")
    parser.add_argument("--similar", metavar="QUERY", help="print the lines most similar to QUERY instead")
    parser.add_argument("--top-k", type=positive_int, default=10, help="how many lines --similar prints")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (drawn for more than 10 batches of lines)")
    add_feature_arguments(parser)


def shows_progress(args: argparse.Namespace, texts: list[str]) -> bool:
    return not args.no_progress and len(texts) > 10 * args.batch_size


def run(args: argparse.Namespace) -> int:
    if args.similar is None and args.output is None:
        raise InputError("give --output FILE.npy|FILE.jsonl, or --similar QUERY to rank the lines")
    if args.similar is not None and args.output is not None:  # the ranking is printed in place of the vectors
        raise InputError("give --output FILE to write vectors, or --similar QUERY to print the lines ranked by "
                         "similarity, not both")
    if args.similar is not None and args.level != "sentence":
        raise InputError(f"--similar ranks whole lines, one vector each; --level {args.level} makes a vector per "
                         f"{args.level}")
    output = Path(args.output) if args.output else None
    if output is not None and str(output) != STANDARD_STREAM and output.suffix not in OUTPUT_FORMATS:
        raise InputError(f"unsupported output format; use one of {', '.join(OUTPUT_FORMATS)}", output)
    if output is not None and args.level != "sentence" and output.suffix not in (".jsonl", ""):
        raise InputError(f"{args.level}-level vectors vary in number per line: write them to a .jsonl file", output)
    if output is not None:
        check_writable(output, args.input, args.model)
    texts = read_lines(args.input)
    lines = list(range(len(texts)))  # the file's line of each text
    if args.similar is not None:  # a blank line is no match for a query: the lines ranked are those with text
        lines = [line for line, text in enumerate(texts) if text.strip()]
        texts = [texts[line] for line in lines]
        if not texts:
            raise InputError("has no line with text to rank", args.input)
    if uses_splade(args):
        return run_splade(args, texts, output, lines)
    if uses_colbert(args):
        return run_colbert(args, texts, output, lines)
    model, tokenizer = load_encoder(args.model, inference_options(args))
    settings = dict(layers=args.layers, batch_size=args.batch_size, max_length=args.max_length)
    prompts = dict(prompt_name=args.prompt_name, prompt=args.prompt)
    progress = shows_progress(args, texts)
    if args.level != "sentence":
        if args.prompt_name is not None or args.prompt is not None:
            raise InputError(f"--prompt-name and --prompt go before texts embedded as one vector each; --level "
                             f"{args.level} writes the vectors of the text's own tokens")
        if args.long_text != "truncate":
            raise InputError(f"--long-text {args.long_text} makes one vector per line; {args.level}-level vectors "
                             "are of the first --max-length tokens")
        features = extract_token_features(model, tokenizer, texts, level=args.level, progress=progress, **settings)
        write_output(output, "".join(json.dumps({
            "text": text, "tokens": item.tokens, "offsets": item.offsets,
            "embeddings": (F.normalize(item.vectors, dim=-1) if args.normalize else item.vectors).tolist(),
        }, ensure_ascii=False) + "\n" for text, item in zip(texts, features)))
        report(output, f"wrote {sum(len(item.tokens) for item in features)} {args.level} vectors for {len(texts)} "
                       f"lines to {output}")
        return 0
    if args.similar is not None:
        ranked = most_similar(model, tokenizer, args.similar, texts, args.top_k, pooling=args.pool,
                              progress=progress, long_text=args.long_text, **prompts, **settings)
        for rank, (i, score) in enumerate(ranked, 1):
            print(f"{rank:>3}. {score:.3f}  line {lines[i] + 1}: {texts[i]}")
        return 0
    vectors = extract_features(model, tokenizer, texts, pooling=args.pool, normalize=args.normalize,
                               progress=progress, long_text=args.long_text, **prompts, **settings)
    matrix = vectors.float().numpy()
    if output.suffix == ".npy":
        save_array(output, matrix)
    else:
        write_output(output, "".join(json.dumps({"text": text, "embedding": vector.tolist()}) + "\n"
                                     for text, vector in zip(texts, matrix)))
    report(output, f"wrote {matrix.shape[0]} vectors of size {matrix.shape[1]} to {output}")
    return 0


def uses_splade(args: argparse.Namespace) -> bool:
    """Whether the command reads a SPLADE model: --pool splade, or no --pool and a SparseEncoder folder."""
    return args.pool == SPLADE or args.pool is None and is_splade_checkpoint(args.model)


def uses_colbert(args: argparse.Namespace) -> bool:
    """Whether --model is a ColBERT checkpoint, and no --pool asks for its encoder's vectors pooled instead."""
    return args.pool is None and multi_vector_kind(resolve_model_dir(args.model)) is not None


def colbert_encoder(args: argparse.Namespace) -> MultiVectorEncoder:
    """The ColBERT model of --model on the command's device; the flags that don't apply to it are refused."""
    level = getattr(args, "level", "sentence")
    for given, flag in ((level != "sentence", f"--level {level}"), (args.layers != "last", f"--layers {args.layers}"),
                        (args.long_text != "truncate", f"--long-text {args.long_text}"),
                        (getattr(args, "normalize", None) is not None, "--normalize"),
                        (args.max_length is not None, "--max-length"),
                        (args.precision != "fp32", f"--precision {args.precision}"), (args.compile, "--compile")):
        if given:
            raise InputError(f"{flag}: a ColBERT model gives its own unit vector per token, of texts cut at its "
                             f"query and document lengths (--pool POOLING pools its encoder's vectors instead)")
    return MultiVectorEncoder(args.model, device=inference_options(args).device)


def run_colbert(args: argparse.Namespace, texts: list[str], output: Path | None, lines: list[int]) -> int:
    """embed with a ColBERT model: per line its token vectors as a document (JSON lines), or with --similar the
    lines ranked by MaxSim with the query; the flags that don't apply are refused."""
    if output is not None and output.suffix == ".npy":
        raise InputError("a ColBERT model gives each line as many vectors as it has tokens: write them to a .jsonl "
                         "file", output)
    encoder = colbert_encoder(args)
    options = dict(prompt_name=args.prompt_name, prompt=args.prompt, batch_size=args.batch_size)
    documents = encoder.encode_document(texts, **options)
    if args.similar is not None:
        scores = encoder.similarity(encoder.encode_query([args.similar], batch_size=args.batch_size), documents)[0]
        for rank, i in enumerate(scores.argsort(descending=True, stable=True)[:args.top_k].tolist(), 1):
            print(f"{rank:>3}. {scores[i]:.3f}  line {lines[i] + 1}: {texts[i]}")
        return 0
    write_output(output, "".join(json.dumps({"text": text, "embeddings": vectors.tolist()}, ensure_ascii=False)
                                 + "\n" for text, vectors in zip(texts, documents)))
    report(output, f"wrote {sum(len(vectors) for vectors in documents)} ColBERT token vectors of size "
                   f"{encoder.get_embedding_dimension()} for {len(texts)} lines to {output}")
    return 0


def splade_encoder(args: argparse.Namespace) -> SparseEncoder:
    """The SPLADE model of --model with the command's inference options and --max-length; the flags that don't
    apply to it are refused."""
    for given, flag in ((getattr(args, "level", "sentence") != "sentence", f"--level {getattr(args, 'level', '')}"),
                        (args.layers != "last", f"--layers {args.layers}"),
                        (args.long_text != "truncate", f"--long-text {args.long_text}"),
                        (args.normalize, "--normalize")):
        if given:
            raise InputError(f"{flag}: a SPLADE model gives one weight per word piece of each text, from its "
                             f"masked-LM head's last layer, cut at --max-length and never normalized")
    from bertforge import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(args.model)
    encoder = SparseEncoder(inference_options(args).apply(load_splade_model(args.model), tokenizer), tokenizer)
    if args.max_length is not None:
        encoder.max_seq_length = args.max_length
    return encoder


def run_splade(args: argparse.Namespace, texts: list[str], output: Path | None, lines: list[int]) -> int:
    """embed with a SPLADE model: per line its nonzero weights (.jsonl: ids, word pieces, weights; .npy: the
    vocabulary-wide matrix), or with --similar the lines ranked by dot product with the query's weights."""
    encoder = splade_encoder(args)
    options = dict(prompt_name=args.prompt_name, prompt=args.prompt, batch_size=args.batch_size,
                   convert_to_sparse_tensor=False)
    vectors = encoder.encode(texts, show_progress_bar=shows_progress(args, texts), **options)
    if args.similar is not None:
        scores = vectors @ encoder.encode_query(args.similar, **options)
        for rank, i in enumerate(scores.argsort(descending=True, stable=True)[:args.top_k].tolist(), 1):
            print(f"{rank:>3}. {scores[i]:.3f}  line {lines[i] + 1}: {texts[i]}")
        return 0
    if output.suffix == ".npy":
        save_array(output, vectors.float().cpu().numpy())
    else:
        lines = []
        for text, vector in zip(texts, vectors):
            ids, weights = nonzero_weights(vector)
            lines.append(json.dumps({"text": text, "indices": ids, "tokens": encoder.tokenizer.convert_ids_to_tokens(
                ids), "values": weights}, ensure_ascii=False) + "\n")
        write_output(output, "".join(lines))
    active = int((vectors != 0).sum())
    report(output, f"wrote {len(texts)} SPLADE vectors ({active / len(texts):.1f} nonzero weights of "
                   f"{vectors.shape[1]} each, on average) to {output}")
    return 0
