"""`bertforge tokenize`: how a text (or pair) becomes tokens, ids, segments and offsets."""

from __future__ import annotations

import argparse
import json

from bertforge.cli import columns
from bertforge.cli.arguments import add_model_argument, positive_int, texts_or_standard_input


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="the text to tokenize; - reads it from standard input")
    parser.add_argument("--pair", help="a second text (segment B)")
    add_model_argument(parser)
    parser.add_argument("--max-length", type=positive_int, default=None, help="truncate to this many tokens")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from bertforge import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(args.model)
    args.text, args.pair = texts_or_standard_input(args.text, args.pair)
    encoding = tokenizer(args.text, text_pair=args.pair, max_length=args.max_length, truncation=True,
                         return_offsets_mapping=True, return_word_ids=True)
    rows = [
        {"token": token, "id": token_id, "segment": segment, "start": start, "end": end, "word": word}
        for token, token_id, segment, (start, end), word in zip(
            tokenizer.convert_ids_to_tokens(encoding["input_ids"]), encoding["input_ids"],
            encoding["token_type_ids"], encoding["offset_mapping"], encoding["word_ids"])
    ]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False))
        return 0
    texts = {0: args.text, 1: args.pair}
    print(f"{'#':>4}  {'token':<20}{'id':>7}  {'segment':>7}  {'offsets':<11}{'word':>5}  text")
    for index, row in enumerate(rows):
        offsets = f"{row['start']}-{row['end']}"
        source = texts[row["segment"]][row["start"]:row["end"]] if row["end"] > row["start"] else ""
        word = "" if row["word"] is None else row["word"]
        print(f"{index:>4}  {columns.left(columns.printable(row['token']), 20)}{row['id']:>7}  {row['segment']:>7}  "
              f"{offsets:<11}{word:>5}  {columns.printable(source)}")
    return 0
