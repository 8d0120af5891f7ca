"""`bertforge distill`: a smaller student of a fine-tuned teacher (every k-th layer), trained on the teacher's soft
labels beside the true ones, and written only when its dev metric stays within --max-drop points of the teacher's.
Takes `bertforge finetune`'s flags for data, columns and optimisation; their defaults are the teacher's run."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from bertforge.cli import finetune as finetune_cli
from bertforge.cli.arguments import finite_float, fraction, non_negative_float, number_range, path_text, positive_int
from bertforge.cli.quantize import add_max_drop_argument
from bertforge.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--teacher", type=path_text, required=True, help="fine-tuned model directory to learn from")
    parser.add_argument("--student-layers", type=positive_int, default=3,
                        help="layers of the student, taken from every k-th teacher layer (default 3)")
    from bertforge.compress.distill import MAX_TEMPERATURE, MIN_TEMPERATURE
    parser.add_argument("--temperature", type=number_range("temperature", finite_float, MIN_TEMPERATURE,
                                                            MAX_TEMPERATURE), default=2.0,
                        help=f"softens the teacher's labels, from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g} "
                             "(default 2)")
    parser.add_argument("--soft-weight", type=fraction, default=0.5,
                        help="weight of the teacher's soft labels; the true labels get the rest (default 0.5)")
    parser.add_argument("--hidden-weight", type=non_negative_float, default=0.0,
                        help="weight of the hidden-state loss to the teacher's layers, TinyBERT's (default 0: off)")
    parser.add_argument("--without-teacher", action="store_true",
                        help="the control: the same student trained on the true labels only")
    add_max_drop_argument(parser)
    # The student is cut from --teacher (not --model or a fresh --random-init) into a new --output, in one run.
    # (--config, when given, is the run whose settings fill what the flags leave, in the teacher's run's place)
    finetune_cli.add_run_arguments(parser, leave_out=("--model", "--random-init"), defaults_from="the teacher's run",
                                   required=("--output",))  # the student's own folder, never the teacher's


def run(args: argparse.Namespace) -> int:
    from bertforge.compress.distill import DistillConfig, distill
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint
    from bertforge.tasks.finetune import RUN_CONFIG_FILE
    from bertforge.training.distributed import read_environment

    if not args.without_teacher and (args.label_smoothing is not None or args.class_weights is not None):
        raise ConfigError("--label-smoothing and --class-weights shape the true labels' loss, which distillation "
                          "replaces with the teacher's; give them with --without-teacher")
    teacher = inspect_checkpoint(args.teacher)
    if args.task is not None and teacher.task is not None and args.task != teacher.task:
        # the student is cut from the teacher with its head: it can only learn what the teacher does
        raise ConfigError(f"--task {args.task}: the teacher {args.teacher} was fine-tuned for {teacher.task}, and "
                          "its student learns the same task (leave --task out)")
    if args.config is None and teacher.run is not None:
        args.config = str(Path(args.teacher) / RUN_CONFIG_FILE)  # the teacher's run fills what the flags leave
    args.model = args.teacher
    config = finetune_cli.config_from_args(args)
    # --format describes the files given here, which need not be the teacher's: without it, their extensions say
    config = dataclasses.replace(config, format=args.format)
    distillation = DistillConfig(args.student_layers, args.temperature, args.soft_weight, args.hidden_weight,
                                 use_teacher=not args.without_teacher)
    launch = read_environment()  # rank 0 of 1 unless started by torchrun
    result = distill(config, distillation, args.max_drop, launch)
    if launch.rank != 0:
        return 0  # rank 0 measures, writes and reports for the run
    for note in result.training.notes:
        print(note)
    if result.report is not None:
        print(result.report.table())
        print(result.report.verdict() + (f"; wrote {config.output}" if result.written else ""))
    else:
        print(f"no --dev set to measure against the teacher: saved to {config.output}")
    return 0 if result.written else 1
