"""`bertforge pretrain prepare`: tokenize a text corpus into token-id shards for pre-training."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.cli.arguments import add_corpus_arguments, check_writable, path_text, positive_int

UNKNOWN_WARNING = 0.01  # a share of [UNK] above which the vocabulary is said not to fit the text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument("--vocab", type=path_text, default="default", metavar="M",
                        help="the tokenizer: a model directory or 'default' (its tokenizer is used), or a vocab.txt "
                             "file; kept with the corpus for `pretrain train` (default: default)")
    parser.add_argument("--model-or-vocab", type=path_text, dest="vocab", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    parser.add_argument("--cased", action="store_true",
                        help="with a vocab.txt: keep case and accents (a model directory's tokenizer settings decide)")
    parser.add_argument("--output", "-o", type=path_text, required=True, metavar="DIR",
                        help="folder for the shards and manifest")
    parser.add_argument("--max-length", type=positive_int, default=128,
                        help="the training sequence length, for the estimate of sequences per epoch (the shards "
                             "themselves serve any length) (default: %(default)s)")
    parser.add_argument("--max-seq-length", dest="max_length", type=positive_int, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    parser.add_argument("--shard-tokens", type=positive_int, default=None,
                        help="tokens per shard file (default: 64M)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from bertforge.errors import ConfigError
    from bertforge.pretraining.corpus import DEFAULT_SHARD_TOKENS, prepare_corpus
    from bertforge.tokenizer import BertTokenizer

    check_writable(Path(args.output) / "manifest.json")
    if Path(args.vocab).is_file():
        tokenizer = BertTokenizer(args.vocab, do_lower_case=not args.cased)
    elif args.cased:
        raise ConfigError("--cased applies to a bare vocab.txt; a model's tokenizer_config.json decides its casing")
    else:
        tokenizer = BertTokenizer.from_pretrained(args.vocab)
    summary = prepare_corpus(args.corpus, tokenizer, args.output,
                             shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS, progress=not args.no_progress,
                             text_field=args.text_field)
    # A pair sequence holds max_length - 3 tokens of text; short_seq_prob and truncation make it a bit more, and
    # a document's last sequence is its own (no sequence spans two documents).
    sequences = max(summary.tokens // max(1, args.max_length - 3), summary.documents)
    print(f"wrote {summary} to {args.output}")
    share = summary.unknown / summary.tokens
    print(f"[UNK]: {share:.2%} of the tokens" + (
        "; the vocabulary lacks many of this text's characters" + ("" if args.cased or Path(args.vocab).is_dir() else
                                                                   " (a cased vocab.txt needs --cased)")
        if share > UNKNOWN_WARNING else ""))
    print(f"up to about {sequences:,} training sequences of {args.max_length} tokens per epoch (mlm; the sentence-pair "
          "objectives make fewer of long lines)")
    return 0
