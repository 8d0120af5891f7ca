"""`bertforge pretrain plot`: draw a pre-training run's log.jsonl as a PNG (bertforge.pretraining.plot)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.cli.arguments import STANDARD_STREAM, check_writable, path_text
from bertforge.errors import InputError

DEFAULT_IMAGE = "curves.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=path_text, metavar="RUN_DIR",
                        help="the --output folder of `pretrain train` (or its log.jsonl)")
    parser.add_argument("--output", "-o", type=path_text, default=None, metavar="FILE.png",
                        help=f"where to write the image, its format from the suffix: .png, .svg, .pdf, .jpg, ... "
                             f"(default: RUN_DIR/{DEFAULT_IMAGE})")


def run(args: argparse.Namespace) -> int:
    from bertforge.pretraining.plot import plot_log, read_log
    from bertforge.pretraining.run import LOG_FILE

    run_dir = Path(args.run_dir)
    log_path = run_dir if run_dir.is_file() else run_dir / LOG_FILE
    if args.output == STANDARD_STREAM:  # a PNG is no text to print: name a file
        raise InputError("the plot is an image; give a file name (e.g. curves.png)", "--output -")
    output = check_writable(args.output or log_path.parent / DEFAULT_IMAGE, log_path, log_path.parent)
    plot_log(read_log(log_path), output, title=str(log_path.parent))
    print(f"wrote {output}")
    return 0
