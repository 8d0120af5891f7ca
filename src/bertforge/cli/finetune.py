"""`bertforge finetune`: fine-tune a model on a CSV/TSV/JSONL file (a CoNLL file for ner, SQuAD JSON for qa);
flags and `--config run.json` fill one FinetuneConfig (flags win over the file, the file over the defaults)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import shlex
from collections import Counter
from collections.abc import Collection
from typing import Any

from bertforge.cli.arguments import (
    REPORT_TO_HELP,
    above_zero_up_to_one,
    add_flag_table,
    add_format_argument,
    add_inference_arguments,
    below_one,
    finite_float,
    flags_over_config,
    format_help,
    fraction,
    non_negative_float,
    non_negative_int,
    path_text,
    positive_float,
    positive_int,
    reporter_names,
    seed_number,
)
from bertforge.config import BertConfig
from bertforge.errors import BertforgeError, ConfigError
from bertforge.tasks.classification import LONG_TEXT
from bertforge.tasks.finetune import CLASS_WEIGHTS
from bertforge.tasks.registry import TASKS
from bertforge.tasks.tables import DATA_FORMATS
from bertforge.tasks.token_classification import CONTEXTS, DECODINGS
from bertforge.training.optim import LR_SCHEDULES
from bertforge.validation import check_within_positions

DECODING_HELP = ("ner: each word's most probable tag (argmax) or the most probable valid IOB2 sequence (viterbi)")

# flag -> (place in FinetuneConfig's JSON, kind, help). The kind is a type, a table whose keys are the choices, or
# bool for a switch. Every default is None, so an absent flag leaves the run config's value (or the dataclass
# default) in place; the help shows the dataclass default (see default_text). A task setting is a top-level key
# (FinetuneConfig.from_dict moves it into the task's settings).
FLAGS: dict[str, tuple[tuple[str, ...], Any, str]] = {
    "--task": (("task",), TASKS, "what to learn: " + "; ".join(f"{name}: {row.description}"
                                                               for name, row in TASKS.items())),
    "--train": (("train",), path_text, "training data (.csv, .tsv, .jsonl; CoNLL for ner; SQuAD .json for qa)"),
    "--dev": (("dev",), path_text, "evaluation data; the best model on it is kept (default: none, the last model is "
                                   "kept)"),
    "--format": (("format",), DATA_FORMATS, format_help("the data files'", "each file's extension's")),
    "--output": (("output",), path_text, "output model directory"),
    "--model": (("model",), path_text, "pre-trained model directory, or 'default' (all-MiniLM-L6-v2)"),
    "--max-length": (("max_length",), positive_int, "tokens per input"),
    "--long-text": (("long_text",), LONG_TEXT, "texts over --max-length: truncate, or average overlapping windows"),
    "--context": (("context",), CONTEXTS, "ner: what fills the rest of each window: nothing (sentence) or the "
                                          "sentences around it in its document (-DOCSTART- blocks), as BERT's "
                                          "CoNLL-2003 result"),
    "--decoding": (("decoding",), DECODINGS, DECODING_HELP),
    "--doc-stride": (("doc_stride",), non_negative_int, "overlap of windows over long inputs: qa tokens, ner words"),
    "--max-query-length": (("max_query_length",), positive_int, "qa: question tokens kept"),
    "--version-2": (("version_2",), bool, "qa: SQuAD v2 data, where questions may have no answer"),
    "--n-best": (("n_best",), positive_int, "qa: answers kept per question"),
    "--max-answer-length": (("max_answer_length",), positive_int, "qa: longest answer in tokens"),
    "--null-score-threshold": (("null_score_threshold",), finite_float,
                               "qa with --version-2: margin by which no answer must beat the best span"),
    "--threshold": (("threshold",), below_one,
                    "multi_label: predict a label when its probability is over this (default: chosen on --dev, "
                    "else 0.5)"),
    "--random-init": (("random_init",), bool, "the --model architecture with fresh weights (a from-scratch baseline)"),
    "--dropout": (("dropout",), below_one,
                  "dropout on hidden states and attention weights (default: the model's)"),
    "--batch-size": (("batch_size",), positive_int,
                     "examples per batch; under torchrun the global batch, split between the processes"),
    "--eval-batch-size": (("eval_batch_size",), positive_int, "examples per evaluation batch"),
    "--max-train-examples": (("max_train_examples",), positive_int,
                             "use only the first N training examples (default: all)"),
    "--metric-for-best-model": (("metric_for_best_model",), str,
                                "dev metric that picks the kept model: one the task reports (classification: "
                                "accuracy, f1, ...) or loss; lower is better for loss, higher for the others "
                                "(default: the task's main metric)"),
    "--freeze-layers": (("freeze_layers",), non_negative_int,
                        "keep the embeddings and the lowest N encoder layers as pre-trained (all of them: only the "
                        "pooler and the head learn, a linear probe); faster, and steadier on little data"),
    "--class-weights": (("class_weights",), CLASS_WEIGHTS,
                        "classification and ner: weigh each class's terms of the loss; balanced: by the inverse of "
                        "its share of the training rows (scikit-learn's class_weight), for data where some labels "
                        "are rare (default: all alike)"),
    "--epochs": (("training", "epochs"), positive_int, "passes over the training data"),
    "--max-steps": (("training", "max_steps"), positive_int,
                    "stop after N optimizer steps (default: none; overrides --epochs)"),
    "--lr": (("training", "lr"), positive_float, "peak learning rate"),
    "--weight-decay": (("training", "weight_decay"), non_negative_float, "AdamW weight decay"),
    "--warmup-ratio": (("training", "warmup_ratio"), fraction, "fraction of steps warming up"),
    "--warmup-steps": (("training", "warmup_steps"), non_negative_int,
                       "optimizer steps warming up (default: none; overrides --warmup-ratio)"),
    "--lr-schedule": (("training", "lr_schedule"), LR_SCHEDULES,
                      "the learning rate after the warm-up: falling linearly to 0 (BERT's), as half a cosine to 0, "
                      "or constant"),
    "--layer-lr-decay": (("training", "layer_lr_decay"), above_zero_up_to_one,
                         "below 1, each layer down the encoder learns at this factor of the rate of the layer above "
                         "(the head at --lr, the top layer at lr x this, the embeddings lowest; ELECTRA used 0.8)"),
    "--label-smoothing": (("training", "label_smoothing"), below_one,
                          "classification and ner: train against labels smoothed towards uniform by this much"),
    "--max-grad-norm": (("training", "max_grad_norm"), non_negative_float,
                        "clip the gradients' norm to this before each step; 0: no clipping"),
    "--grad-accum": (("training", "grad_accumulation"), positive_int, "batches per optimizer step"),
    "--eval-every": (("training", "eval_every"), positive_int, "evaluate every N steps (default: every epoch)"),
    "--seed": (("training", "seed"), seed_number, "random seed"),
    "--early-stopping": (("training", "early_stopping_patience"), positive_int,
                         "stop after N evaluations without improvement (default: none, never stop early)"),
    "--save-every": (("training", "save_every"), positive_int,
                     "optimizer steps between resumable checkpoints (default: at every evaluation)"),
    "--device": (("training", "device"), str, "cpu, cuda, ... (default: cuda when available)"),
    "--bf16": (("training", "bf16"), bool, "bf16 autocast where the hardware supports it"),
    "--gradient-checkpointing": (("training", "gradient_checkpointing"), bool,
                                 "recompute each layer's activations in the backward pass: less memory for long "
                                 "inputs and large models, about a third more compute"),
    "--no-progress": (("training", "progress"), bool, "no progress bar"),
    "--report-to": (("training", "report_to"), reporter_names, REPORT_TO_HELP),
}
COLUMN_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "--text-column": (("text_column",), "column of the text (ner rows: of the words, else 'tokens'; qa rows: of "
                                        "the question, else 'question'; rerank: of the query, else 'query', "
                                        "'anchor', ...)"),
    "--text-pair-column": (("text_pair_column",), "column of the second text, for pair tasks (qa rows: of the "
                                                  "context, else 'context'; rerank: of the document, else "
                                                  "'document', 'passage', ...)"),
    "--label-column": (("label_column",), "column of the label or score (ner rows: of the tags, else 'ner_tags'; "
                                          "qa rows: of the answers, else 'answers')"),
    "--label-separator": (("label_separator",), "multi_label: what separates the labels in a text cell, e.g. '|' "
                                                "(a JSON list such as [\"a\", \"b\"] needs none)"),
}


def default_of(place: tuple[str, ...]) -> Any:
    """The dataclass default of a FinetuneConfig key: 32; a task setting's, per task where they differ:
    "128; qa: 384"."""
    from bertforge.tasks.finetune import SETTING_DEFAULTS, FinetuneConfig
    from bertforge.training.trainer import TrainConfig

    kind, name = (TrainConfig, place[1]) if place[0] == "training" else (FinetuneConfig, place[0])
    fields = {field.name: field for field in dataclasses.fields(kind)}
    if name in fields:
        return fields[name].default
    by_task = SETTING_DEFAULTS[name]
    values = list(dict.fromkeys(by_task.values()))
    if len(values) == 1:
        return values[0]
    usual = Counter(by_task.values()).most_common(1)[0][0]
    return "; ".join([str(usual)] + [f"{task}: {value}" for task, value in by_task.items() if value != usual])


def add_trained_model_arguments(parser: argparse.ArgumentParser) -> None:
    """How evaluate and predict read data and run a fine-tuned model; each setting defaults to the training run's."""
    add_format_argument(parser)
    for flag, (_, help_text) in COLUMN_FLAGS.items():
        parser.add_argument(flag, default=None, help=f"{help_text} (default: the training run's)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="examples per batch")
    parser.add_argument("--max-length", type=positive_int, default=None,
                        help="tokens per input (default: the training run's)")
    parser.add_argument("--decoding", choices=list(DECODINGS), default=None,
                        help=f"{DECODING_HELP} (default: the training run's)")
    parser.add_argument("--version-2", action=argparse.BooleanOptionalAction, default=None,
                        help="qa: read and answer as SQuAD v2.0, where questions may have no answer and the model may "
                             "abstain; --no-version-2 as v1.1 (default: the training run's)")
    add_inference_arguments(parser)


def add_run_arguments(parser: argparse.ArgumentParser, leave_out: Collection[str] = (),
                      defaults_from: str | None = None, required: Collection[str] = ()) -> None:
    """--config and a flag per setting of the run: what `distill` shares, leaving out the flags it sets itself and
    requiring `required`; `defaults_from` names where the settings not given come from, when not FinetuneConfig's
    defaults (distill: the teacher's run), except the data files' --format, which their extensions say."""
    parser.add_argument("--config", type=path_text, metavar="FILE", default=None,
                        help=f"run config JSON (FinetuneConfig fields; flags override it) "
                             f"(default: {defaults_from or 'none'})")
    flags = FLAGS | {flag: (place, str, help_text) for flag, (place, help_text) in COLUMN_FLAGS.items()}
    flags = {flag: row for flag, row in flags.items() if flag not in leave_out}
    if defaults_from is not None:
        flags = {flag: (place, kind, help_text if flag == "--format" or flag in required else
                        re.sub(r" \(default[^)]*\)", "", help_text) + f" (default: {defaults_from})")
                 for flag, (place, kind, help_text) in flags.items()}
    add_flag_table(parser, flags, default_of, short={"--model": "-m", "--output": "-o"}, required=required)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model already in --output (otherwise that is an error)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the killed run into --output from its last checkpoint, with the same settings")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds, e.g. 1,2,3: the run once per seed into OUTPUT/seed-N, the mean "
                             "and standard deviation of every dev metric (OUTPUT/seeds.json), the best seed's model "
                             "kept in OUTPUT; with --resume, finished seeds are read back (default: one run, --seed)")


def config_from_args(args: argparse.Namespace):
    """The run config JSON (if any) with every given flag written over it, as a FinetuneConfig."""
    from bertforge.tasks.finetune import FinetuneConfig

    places = [place for place, _, _ in FLAGS.values()] + [place for place, _ in COLUMN_FLAGS.values()]
    data, source, given = flags_over_config(args, FinetuneConfig, places)
    if isinstance(data.get("chosen_on_dev"), list):  # a setting given now is not the one a run chose
        data["chosen_on_dev"] = [name for name in data["chosen_on_dev"] if (name,) not in given]
    return FinetuneConfig.from_dict(data, source)


def command_line(config) -> str:
    """The `bertforge finetune` command that makes `config` (a FinetuneConfig): a flag for every setting that differs
    from its default. A setting without a flag is an error (such a run needs --config)."""
    from bertforge.tasks.finetune import FinetuneConfig

    given, defaults = flat(config.to_train().to_dict()), flat(FinetuneConfig(task=config.task).to_dict())
    rows = {flag: (place, kind) for flag, (place, kind, _) in FLAGS.items()}
    rows |= {flag: (place, str) for flag, (place, _) in COLUMN_FLAGS.items()}
    words = ["bertforge", "finetune"]
    for flag, (place, kind) in rows.items():
        value = given.pop(place, defaults.get(place))  # another task's setting is neither given nor a default
        if value != defaults.get(place):
            text = (",".join(value) or "none") if isinstance(value, list) else str(value)  # --report-to's names
            words += [flag] if kind is bool else [flag, text]
    unflagged = [".".join(place) for place, value in given.items() if value != defaults[place]]
    if unflagged:
        raise ConfigError(f"{', '.join(unflagged)} has no finetune flag; write the run config to a file for --config")
    return shlex.join(words)


def flat(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """A run config's JSON as {place: value}: {"training": {"lr": 1e-4}} -> {("training", "lr"): 1e-4}."""
    places = {}
    for key, value in data.items():
        if isinstance(value, dict):
            places |= flat(value, (*prefix, key))
        else:
            places[(*prefix, key)] = value
    return places


def run(args: argparse.Namespace) -> int:
    from bertforge.tasks.finetune import finetune
    from bertforge.training.distributed import read_environment
    from bertforge.training.plot import CURVES_FILE

    if args.seeds is not None:
        return run_seeds(args)
    launch = read_environment()  # rank 0 of 1 unless started by torchrun
    config = config_from_args(args)
    check_model_positions(config, args)
    result = finetune(config, overwrite=args.overwrite, resume=args.resume, launch=launch)
    if launch.rank != 0:
        return 0  # rank 0 reports for the run
    for note in result.notes:
        print(note)
    if result.best is not None:
        metrics = ", ".join(f"{name}={value:.4f}" for name, value in result.best.items()
                            if name not in ("step", "epoch"))
        print(f"best model (step {result.best['step']} of {result.steps}): {metrics}")
    if result.stopped_early:
        print("stopped early: no improvement")
    print(f"saved to {result.output_dir}")
    # The Trainer drew them into the staging folder before it was moved into place.
    curves = result.output_dir / CURVES_FILE
    if importlib.util.find_spec("matplotlib") is None:
        print('no curves drawn: that needs matplotlib (pip install "bertforge[plot]")')
    elif curves.is_file():
        print(f"curves: {curves}")
    return 0


def check_model_positions(config, args: argparse.Namespace) -> None:
    """Refuse a max_length longer than the model has positions for before any data is read: the run would train
    (on truncated data) and save a model_max_length that every longer input then fails at. A model that can't be
    read is left to finetune, which reports it after the output folder, as it always has."""
    from bertforge.checkpoint.default_model import resolve_model_dir
    from bertforge.checkpoint.hf_format import config_path
    from bertforge.tasks.finetune import SETTING_DEFAULTS

    if args.max_length is not None:
        given = "--max-length"
    elif config.max_length != SETTING_DEFAULTS["max_length"][config.task]:
        given = f"{args.config}: max_length"
    else:
        return  # the task's default, not a choice: a small model with fewer positions still reads short texts
    try:
        positions = BertConfig.load(config_path(resolve_model_dir(config.model))).max_position_embeddings
    except BertforgeError:
        return
    check_within_positions(config.max_length, positions, given)


def run_seeds(args: argparse.Namespace) -> int:
    from bertforge.tasks.seeds import SEEDS_FILE, finetune_seeds, format_summary, parse_seeds
    from bertforge.training.distributed import read_environment

    if args.seed is not None:
        raise ConfigError("give --seed or --seeds, not both")
    seeds = parse_seeds(args.seeds)
    launch = read_environment()  # rank 0 of 1 unless started by torchrun
    config = config_from_args(args)
    check_model_positions(config, args)
    result = finetune_seeds(config, seeds, overwrite=args.overwrite, resume=args.resume,
                            launch=launch)
    if launch.rank != 0:
        return 0  # rank 0 reports for the run
    for line in format_summary(result):
        print(line)
    print(f"per-seed and summary metrics: {result.output_dir / SEEDS_FILE}")
    return 0
