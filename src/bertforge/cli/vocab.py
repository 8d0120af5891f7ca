"""`bertforge vocab`: learn a WordPiece vocabulary (vocab.txt) from text files."""

from __future__ import annotations

import argparse
import logging

from bertforge.cli.arguments import add_corpus_arguments, check_writable, path_text, positive_int, report, write_output
from bertforge.progress import progress_bar

logger = logging.getLogger("bertforge")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_corpus_arguments(parser)
    parser.add_argument("--vocab-size", type=positive_int, default=30522, help="tokens in the vocabulary")
    parser.add_argument("--output", "-o", type=path_text, required=True, help="where to write vocab.txt")
    parser.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    parser.add_argument("--min-pair-count", type=positive_int, default=2,
                        help="stop merging when the most frequent pair occurs fewer times")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from bertforge.pretraining.raw_text import corpus_files, corpus_texts
    from bertforge.tokenizer import BertTokenizer
    from bertforge.tokenizer.learn_vocab import learn_vocab

    output = check_writable(args.output, *args.corpus)
    corpus_files(args.corpus)  # before the progress bar is drawn: each is there
    with progress_bar(total=args.vocab_size, desc="learning vocabulary", unit="token",
                      enabled=not args.no_progress) as bar:
        vocab = learn_vocab(args.corpus, args.vocab_size, lowercase=not args.cased, min_pair_count=args.min_pair_count,
                            progress=lambda size: bar.update(size - bar.n), text_field=args.text_field)
    write_output(output, vocab.to_text())
    note = "" if len(vocab) >= args.vocab_size else \
        f" (no pair occurs {args.min_pair_count} or more times any more)"
    report(output, f"wrote {len(vocab)} tokens to {output}{note}")
    report(output, summarise(BertTokenizer(vocab, do_lower_case=not args.cased),
                                    corpus_texts(args.corpus, args.text_field)))
    if args.cased:
        report(output, "load it with BertTokenizer(path, do_lower_case=False)")
    return 0


def summarise(tokenizer, lines, max_lines: int = 1000) -> str:
    """How the vocabulary splits the corpus's first lines: a quick check of its quality."""
    words = pieces = unknown = count = 0
    for count, line in enumerate(lines, 1):
        tokens = tokenizer.tokenize(line)
        words += len(tokenizer.basic.split(line))
        pieces += len(tokens)
        unknown += tokens.count(tokenizer.vocab.special_tokens["unk_token"])
        if count == max_lines:
            break
    return f"on the first {count} lines: {pieces / max(1, words):.2f} pieces per word, " \
           f"{unknown / max(1, pieces):.2%} [UNK]"
