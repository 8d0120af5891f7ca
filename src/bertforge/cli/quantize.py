"""`bertforge quantize`: a fine-tuned model in int8 or bf16, measured beside fp32 on the user's dev set and written
only when its metric drops by no more than --max-drop points."""

from __future__ import annotations

import argparse

from bertforge.cli.arguments import (
    add_format_argument,
    finite_float,
    fraction,
    non_negative_int,
    path_text,
    positive_int,
)
from bertforge.compress.gate import DEFAULT_MAX_DROP


def add_max_drop_argument(parser: argparse.ArgumentParser) -> None:
    """--max-drop, the gate shared by quantize and distill."""
    parser.add_argument("--max-drop", type=finite_float, default=DEFAULT_MAX_DROP,
                        help="most points (100 x the task's main metric) the smaller model may lose on --dev; "
                             "more, and nothing is written; a negative value is a gain it must make (default 0.5)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertforge.compress.quantize import ACTIVATION_RANGES, METHODS, OUTLIER_FOLDING
    parser.add_argument("--model", "-m", type=path_text, required=True, help="fine-tuned model directory")
    parser.add_argument("--dev", "-d", type=path_text, required=True,
                        help="labelled dev data in the training run's format")
    parser.add_argument("--output", "-o", type=path_text, required=True,
                        help="directory for the smaller model (must be new)")
    add_format_argument(parser)
    parser.add_argument("--precision", choices=[*METHODS, "auto"], default="int8",
                        help="int8 (CPU: int8 weights, outlier input channels kept apart), bf16, or auto "
                             "(bf16 where --device runs it natively, else int8); default int8")
    add_max_drop_argument(parser)
    parser.add_argument("--calibration", type=path_text, default=None,
                        help="int8: text the model will see, whose first examples find each layer's outlier "
                             "channels and input ranges; no labels needed (a .txt file is one text a line; "
                             "default: --dev)")
    parser.add_argument("--calibration-examples", type=positive_int, default=256,
                        help="int8: how many examples of the calibration data are run")
    parser.add_argument("--outlier-channels", type=non_negative_int, default=8,
                        help="int8: input channels per layer kept apart (default 8)")
    parser.add_argument("--outlier-folding", choices=OUTLIER_FOLDING, default="activation",
                        help="int8: which layers fold their outlier channels into their int8 weights rather than "
                             "multiply them in float32: those followed by an activation (which then runs inside the "
                             "int8 kernel), all, or none (default activation)")
    parser.add_argument("--smoothing", type=fraction, default=None,
                        help="int8: SmoothQuant's alpha in [0, 1] (default: off)")
    parser.add_argument("--activations", choices=ACTIVATION_RANGES, default="static",
                        help="int8: each layer's input range from calibration (static: no pass over each input to "
                             "find it) or from each batch (dynamic)")
    parser.add_argument("--float-layers", type=non_negative_int, default=0,
                        help="int8: keep this many linear layers in float32, those whose int8 product alone "
                             "changes the model's output most on the calibration data (default 0)")
    parser.add_argument("--fallback", action=argparse.BooleanOptionalAction, default=True,
                        help="int8: if the recipe asked for loses more than --max-drop, try more careful ones in "
                             "turn (outliers in float32 rather than folded, then each batch's own input range) and "
                             "write the first within it (default on)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="examples per batch")
    parser.add_argument("--device", default="cpu",
                        help="where both models run and are timed: cpu (default), cuda, cuda:N, mps; int8 is CPU only")


def run(args: argparse.Namespace) -> int:
    from bertforge.compress.quantize import quantize_finetuned

    report = quantize_finetuned(args.model, args.dev, args.output, args.precision, args.max_drop, args.calibration,
                                args.calibration_examples, args.outlier_channels, args.smoothing, args.batch_size,
                                args.activations, args.outlier_folding, args.device, args.format,
                                args.fallback, float_layers=args.float_layers)
    print(report.table())
    print(report.verdict() + (f"; wrote {args.output}" if report.accepted else ""))
    return 0 if report.accepted else 1
