"""`bertforge pretrain train`: pre-train a model on a prepared corpus, with checkpoints and exact resumption;
under torchrun, one process per device with DDP. Its flags are one table over PretrainConfig's fields, whose
defaults they show."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from bertforge.cli.arguments import (
    REPORT_TO_HELP,
    add_flag_table,
    below_one,
    fraction,
    held_out_size,
    non_negative_int,
    path_text,
    positive_float,
    positive_int,
    probability,
    reporter_names,
    seed_number,
)

# flag -> (PretrainConfig field, kind, help); kind as in cli/finetune.py's FLAGS (a type, a table of choices, or
# bool for a switch). Old spellings of a flag are hidden aliases (ALIASES).
FLAGS: dict[str, tuple[str, Any, str]] = {
    "--data": ("data", path_text, "a corpus folder written by `bertforge pretrain prepare`"),
    "--output": ("output", path_text, "folder for the model, log.jsonl and checkpoint/"),
    "--size": ("model", path_text, "model size ({presets}), or a config.json; vocab_size comes from the tokenizer"),
    "--init-from": ("init_from", path_text, "start from this model directory's weights and architecture instead of a "
                                      "random initialisation (continued pre-training, e.g. a second phase at longer "
                                      "sequences) (default: none)"),
    "--dropout": ("dropout", below_one, "dropout on hidden states and attention weights (default: the model's, "
                                           "0.1 for the presets); 0 trains faster and suits short runs"),
    "--vocab": ("tokenizer", path_text, "the tokenizer: a model directory, 'default', or a vocab.txt, checked against "
                                        "the corpus (default: the one the corpus was prepared with)"),
    "--cased": ("do_lower_case", bool, "with a vocab.txt: keep case and accents"),
    "--objective": ("objective", "objectives", "what the model learns"),
    "--masking": ("masking", "masking", "which tokens are masked together"),
    "--mask-probability": ("mask_probability", probability, "the share of tokens chosen for the masked LM "
                                                            "(run_mlm's --mlm_probability)"),
    "--steps": ("steps", positive_int, "optimizer steps"),
    "--batch-size": ("batch_size", positive_int, "sequences per forward pass in each process; the global batch of "
                                                 "an optimizer step is batch-size x processes (torchrun's world "
                                                 "size) x grad-accum"),
    "--grad-accum": ("grad_accumulation", positive_int, "forward passes per optimizer step"),
    "--lr": ("lr", positive_float, "peak learning rate"),
    "--warmup-steps": ("warmup_steps", non_negative_int, "linear warm-up steps (default: 1%% of --steps)"),
    "--lr-schedule": ("lr_schedule", "lr_schedules", "the learning rate after the warm-up: falling linearly to 0 "
                                                   "(BERT's), as half a cosine to 0, or constant"),
    "--max-length": ("seq_len", positive_int, "tokens per training sequence"),
    "--short-seq-prob": ("short_seq_prob", fraction, "the share of sequences given a shorter random length, so "
                                                     "that the model sees short inputs too (BERT's 0.1; run_mlm "
                                                     "has none: 0)"),
    "--holdout": ("holdout", held_out_size, "documents held out for evaluation: a fraction below 1, or a count"),
    "--save-every": ("save_every", positive_int, "steps between checkpoints"),
    "--log-every": ("log_every", positive_int, "steps between log lines"),
    "--eval-every": ("eval_every", positive_int, "steps between held-out evaluations (default: at the end only)"),
    "--eval-batches": ("eval_batches", positive_int, "batches of the held-out split each evaluation scores"),
    "--bf16": ("bf16", bool, "bf16 autocast where the hardware supports it"),
    "--fp16": ("fp16", bool, "fp16 autocast with dynamic loss scaling, for CUDA GPUs without bf16 (an error on CPU)"),
    "--compile": ("compile", bool, "torch.compile the model (needs a C++ compiler on CPU; the first steps are slow)"),
    "--gradient-checkpointing": ("gradient_checkpointing", bool,
                                 "recompute each layer's activations in the backward pass: less memory for long "
                                 "sequences and large models, about a third more compute"),
    "--seed": ("seed", seed_number, "random seed"),
    "--peak-gflops": ("peak_gflops", positive_float, "one device's peak GFLOP/s, for model FLOPs utilisation"),
    "--no-progress": ("progress", bool, "no progress bar"),
    "--report-to": ("report_to", reporter_names, REPORT_TO_HELP),
}
ALIASES = {"--config": "--size", "--seq-len": "--max-length", "--model-or-vocab": "--vocab",
           "--mlm-probability": "--mask-probability"}
SHORT = {"--output": "-o"}
REQUIRED = {"--data", "--output"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertforge.config import PRESETS
    from bertforge.pretraining.masking import MASKING_STRATEGIES
    from bertforge.pretraining.objectives import OBJECTIVES
    from bertforge.pretraining.run import PretrainConfig
    from bertforge.training.optim import LR_SCHEDULES

    # imported only when the parser is built
    tables = {"objectives": OBJECTIVES, "masking": MASKING_STRATEGIES, "lr_schedules": LR_SCHEDULES}
    defaults = {field.name: field.default for field in dataclasses.fields(PretrainConfig)}
    rows = {flag: (field, tables.get(kind, kind), help_text.format(presets=", ".join(PRESETS)))
            for flag, (field, kind, help_text) in FLAGS.items()}
    add_flag_table(parser, rows, defaults.get, aliases=ALIASES, short=SHORT, required=REQUIRED)
    parser.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model or run already in --output (otherwise that is an error)")


def run(args: argparse.Namespace) -> int:
    from bertforge.errors import ConfigError
    from bertforge.pretraining.run import PretrainConfig, pretrain
    from bertforge.training.distributed import read_environment

    launch = read_environment()  # rank 0 of 1 unless started by torchrun
    given = {field: getattr(args, field) for field, _, _ in FLAGS.values() if getattr(args, field) is not None}
    if "init_from" in given and "model" in given:
        raise ConfigError("--size and --init-from both set the architecture; give one of them")
    config = PretrainConfig(**given, rank=launch.rank, world_size=launch.world_size)
    result = pretrain(config, resume=args.resume, overwrite=args.overwrite)
    if launch.rank != 0:
        return 0  # rank 0 reports for the run
    print(f"trained {result.steps} steps; model written to {result.output}")
    evaluations = [record for record in result.history if record.get("event") == "eval"]
    if evaluations:
        last = evaluations[-1]
        print(f"held-out masked LM: loss {last['loss']:.4f}, perplexity {last['perplexity']:.2f}, "
              f"accuracy {last['accuracy']:.4f}")
    return 0
