"""The `bertforge` command: one subcommand per module, each with add_arguments(parser) and run(args) -> int."""

from __future__ import annotations

import argparse
import codecs
import difflib
import errno
import importlib.metadata
import io
import logging
import os
import re
import signal
import sys

from bertforge.cli import (
    attention,
    demo,
    distill,
    embed,
    evaluate,
    explain,
    export,
    fill_mask,
    finetune,
    finetune_embeddings,
    predict,
    pretrain,
    quantize,
    serve,
    similarity,
    tokenizer,
    vocab,
)
from bertforge.cli.arguments import positive_int
from bertforge.cli.json_log import logging_json
from bertforge.errors import BertforgeError, ConfigError
from bertforge.outputs import staging_dir
from bertforge.runtime import is_out_of_memory, set_threads, tune_cpu_allocator
from bertforge.training.distributed import launch_or_single
from bertforge.training.stopping import Stopped
from bertforge.training.trainer import CHECKPOINT_DIR

SUBCOMMANDS = {
    "demo": (demo, "fine-tune the default model on movie reviews and classify a few sentences"),
    "finetune": (finetune, "fine-tune for classification, regression, NER (CoNLL) or question answering (SQuAD)"),
    "finetune-embeddings": (finetune_embeddings, "fine-tune a sentence encoder's vectors on text pairs (anchors and "
                                                 "positives, or scored pairs); writes a sentence-transformers folder"),
    "evaluate": (evaluate, "a fine-tuned model's metrics on a labelled file"),
    "predict": (predict, "labels with probabilities, scores, entities or answers from a fine-tuned model"),
    "tokenize": (tokenizer, "show how a text is split into WordPiece tokens"),
    "embed": (embed, "one vector per input line, saved as .npy or .jsonl"),
    "similarity": (similarity, "cosine similarity table between sentences"),
    "vocab": (vocab, "learn a WordPiece vocabulary (vocab.txt) from text files"),
    "pretrain": (pretrain, "pre-train an encoder from raw text: prepare, train, eval, plot"),
    "fill-mask": (fill_mask, "most likely tokens for each [MASK] of a text (needs a masked-LM checkpoint)"),
    "attention": (attention, "write an HTML page showing the attention of every layer and head"),
    "explain": (explain, "why a model predicted what it did: attributions to the words of the text, as JSON or a page"),
    "export": (export, "write the model as ONNX (checked against PyTorch) or as a transformers checkpoint directory"),
    "serve": (serve, "HTTP inference server: /predict, /embed, /v1/embeddings, /rerank, /explain, /metrics, /health"),
    "quantize": (quantize, "a fine-tuned model in int8 or bf16, written only if its dev metric holds (--max-drop)"),
    "distill": (distill, "a fine-tuned model with fewer layers, trained on its soft labels (gated like quantize)"),
}
# Commands whose processes share the work under torchrun; every other one would do it (and write it) once a process.
MULTI_PROCESS_COMMANDS = ("finetune", "distill", "pretrain train")
# What a write that fails for want of room says: no space, a file size limit, a quota.
WRITE_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


# transformers' TrainingArguments and example scripts' flags (run_glue, run_ner, run_qa, run_mlm) -> bertforge's: what
# a hint names for them, where the command has it (a spelling's nearest flag can mean something else).
TRANSFORMERS_FLAGS = {
    "--model_name_or_path": "--model", "--output_dir": "--output", "--train_file": "--train",
    "--validation_file": "--dev", "--test_file": "--input", "--per_device_train_batch_size": "--batch-size",
    "--per_device_eval_batch_size": "--eval-batch-size", "--learning_rate": "--lr", "--num_train_epochs": "--epochs",
    "--max_seq_length": "--max-length", "--gradient_accumulation_steps": "--grad-accum", "--save_steps": "--save-every",
    "--eval_steps": "--eval-every", "--eval_strategy": "--eval-every", "--evaluation_strategy": "--eval-every",
    "--logging_steps": "--log-every", "--max_train_samples": "--max-train-examples",
    "--overwrite_output_dir": "--overwrite", "--resume_from_checkpoint": "--resume",
    "--version_2_with_negative": "--version-2", "--n_best_size": "--n-best",
    "--null_score_diff_threshold": "--null-score-threshold", "--mlm_probability": "--mask-probability",
    "--text_column_name": "--text-column", "--text_column_names": "--text-column",
    "--label_column_name": "--label-column", "--validation_split_percentage": "--holdout",
    "--lr_scheduler_type": "--lr-schedule", "--label_smoothing_factor": "--label-smoothing",
}
STEPS_FLAGS = ("--do_train", "--do_eval", "--do_predict")  # one command does each of these
# What users call training sentence vectors, given as a --task (transformers' and the Hub's names among them):
# `finetune-embeddings` does that, not a task of `finetune`.
EMBEDDING_TASK_NAMES = ("embedding", "embeddings", "sentence_embedding", "sentence_embeddings", "sentence_similarity",
                        "feature_extraction", "retrieval", "contrastive")
# What users call training a cross-encoder that scores (query, document) pairs: `finetune --task rerank`.
RERANK_TASK_NAMES = ("cross_encoder", "crossencoder", "text_ranking", "ranking", "reranker", "reranking", "rank")


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (exit status 2, argparse's) instead of the usage block."""

    def _print_message(self, message: str, file=None) -> None:
        # argparse drops a failed write of --help or --version (exit status 0, nothing printed): it is an error
        if message:
            (file or sys.stderr).write(message)
            (file or sys.stderr).flush()

    def error(self, message: str):
        # Python 3.11 quotes the choices ('a', 'b'); later versions may not (a, b)
        chosen = re.match(r"argument \S+: invalid choice: '?(.*?)'? \(choose from (.*)\)$", message)
        if chosen:  # a mistyped command (or value): name the nearest one
            choices = [choice.strip().strip("'") for choice in chosen[2].split(",")]
            near = difflib.get_close_matches(chosen[1], choices, n=1)
            message += f"; did you mean {near[0]}?" if near else ""
            task = chosen[1].lower().replace("-", "_") if message.startswith("argument --task") else None
            if task in EMBEDDING_TASK_NAMES:
                message += "; sentence vectors are fine-tuned by `bertforge finetune-embeddings`"
            elif task in RERANK_TASK_NAMES and "rerank" in choices and near != ["rerank"]:
                message += "; a cross-encoder that scores (query, document) pairs is --task rerank"
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and " " in self.prog:  # a command's own parser: its help lists the options it knows
            flags = [flag for action in self._actions for flag in action.option_strings]
            given = [extra.split("=")[0] for extra in extras if extra.startswith("--")]
            near = [flag for flag in (nearest_flag(name, flags) for name in given) if flag]
            hint = f"; did you mean {', '.join(dict.fromkeys(near))}?" if near else ""
            if any(transformers_spelling(name) in STEPS_FLAGS for name in given):
                hint += " (bertforge finetune trains, and scores --dev as it goes; evaluate and predict are commands)"
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed, extras


def transformers_spelling(flag: str) -> str:
    """--learning-rate and --learning_rate as transformers spells them: --learning_rate."""
    return "--" + flag[2:].replace("-", "_")


def nearest_flag(given: str, flags: list[str]) -> str | None:
    """The command's flag a mistyped one means: transformers' name for it (either spelling), else the closest."""
    if transformers_spelling(given) in (*TRANSFORMERS_FLAGS, *STEPS_FLAGS):  # a flag of another meaning is no hint
        mapped = TRANSFORMERS_FLAGS.get(transformers_spelling(given))
        return mapped if mapped in flags else None
    close = difflib.get_close_matches(given, flags, n=1)
    return close[0] if close else None


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option that takes a value shows its default, unless its help already says what it is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        takes_value = action.option_strings and action.nargs != 0 and not action.required
        if not takes_value or says_default(help_text) or action.default is argparse.SUPPRESS:
            return help_text
        return f"{help_text} (default: {'none' if action.default is None else '%(default)s'})".lstrip()


def says_default(help_text: str) -> bool:
    """Whether a help line states its default ("default: 128", "cpu (default)"), not merely the word 'default'."""
    return "default:" in help_text or "(default" in help_text


def installed_version() -> str:
    try:
        return importlib.metadata.version("bertforge")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="bertforge", description="BERT, complete and readable.",
                           formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details (e.g. skipped tensors)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU threads for torch (default: one per core)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text,
                                          formatter_class=DefaultsHelpFormatter)
        module.add_arguments(subparser)
        subparser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Exit status: 0 done, 1 a user's error (one line on stderr), 2 a malformed command
    line, 130 interrupted (Ctrl-C), 141 the reader of the output went away (`bertforge ... | head`), 143 (129) a
    training run stopped by SIGTERM (SIGHUP) after saving a checkpoint."""
    if argv is None:  # the process's own streams (not a caller's)
        prepare_standard_streams()
    try:
        args = build_parser().parse_args(argv)  # which imports what the commands' defaults come from: seconds
    except KeyboardInterrupt:
        return interrupted()
    except BrokenPipeError:  # bertforge --help | head -1
        return reader_went_away()
    except OSError as error:  # --help or --version written to a full disk, a closed stream
        return fail(f"standard output: {error.strerror or error}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="bertforge: %(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("bertforge.progress").setLevel(logging.INFO)  # e.g. dev metrics after each evaluation
    try:
        command = command_name(args)
        if command not in MULTI_PROCESS_COMMANDS and started_beside_other_processes():
            raise ConfigError(f"`bertforge {command}` runs in one process: start it without torchrun (finetune, "
                              "distill and pretrain train share their work between processes)")
        set_threads(args.threads)
        tune_cpu_allocator()
        status = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here for output still buffered
        return status
    except Stopped as stop:  # not an error: the run is whole, and resumes
        print(f"bertforge: {stop}", file=sys.stderr)
        return 128 + stop.signum
    except BertforgeError as error:
        return fail(str(error))
    except BrokenPipeError:
        return reader_went_away()
    except OSError as error:  # a file or folder the user named: missing, unreadable, full disk, ...
        return fail(describe_os_error(error, getattr(args, "output", None)))
    except (MemoryError, RuntimeError) as error:
        if isinstance(error, RecursionError):  # json.loads of a value nested thousands of levels deep
            return fail("an input is nested too deeply to read (a JSON value thousands of levels deep?)")
        if not is_out_of_memory(error):
            raise
        return fail(out_of_memory(args))
    except KeyboardInterrupt:
        return interrupted(args)


class ClosedStream(io.TextIOBase):
    """Standard input or output that the command was started without (`>&-`, `<&-`): using it is an error naming
    it, as a write to a closed descriptor is for any Unix tool."""

    def __init__(self, name: str):
        super().__init__()
        self.stream = name

    def unusable(self, *args):
        raise OSError(errno.EBADF, "closed (the command started with it closed: >&- or <&-)", self.stream)

    write = read = readline = unusable
    buffer = property(unusable)

    def flush(self) -> None:
        pass


class StandardOutputFile(io.FileIO):
    """File descriptor 1, whose failed writes name it ('standard output: No space left on device' for `> /dev/full`),
    as a failed write to a file the command opened names the file."""

    failed = False

    def write(self, data) -> int | None:
        if self.failed:  # reported once (main); what is still buffered, flushed again at exit, is dropped
            return len(data)
        try:
            return super().write(data)
        except BrokenPipeError:  # the reader went away: not an error (main)
            raise
        except OSError as error:
            self.failed = True
            raise OSError(error.errno, error.strerror, "standard output") from None


def prepare_standard_streams() -> None:
    """UTF-8 out whatever the locale (an ASCII or Latin-1 locale failed on the first accent or CJK character to
    print; files are UTF-8 already), and closed streams that fail in one line where they are used."""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.fileno() == 1:
        # surrogateescape: bytes of the command line Python could not decode go back out as they came
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(StandardOutputFile(1, "w", closefd=False)), encoding="utf-8",
                                      errors="surrogateescape", line_buffering=sys.stdout.line_buffering)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, ClosedStream("standard output") if name == "stdout" else open(os.devnull, "w"))
        elif codecs.lookup(stream.encoding or "ascii").name != "utf-8" and hasattr(stream, "reconfigure"):
            # surrogateescape: bytes of the command line Python could not decode go back out as they came
            stream.reconfigure(encoding="utf-8", errors="surrogateescape" if name == "stdout" else "backslashreplace")
    if sys.stdin is None:
        sys.stdin = ClosedStream("standard input")


def command_name(args: argparse.Namespace) -> str:
    """'finetune', 'pretrain train': the command with its step."""
    return f"{args.command} {args.step}" if args.command == "pretrain" else args.command


def reader_went_away() -> int:
    # Whoever read the output has all they wanted; nothing to report. Point stdout at nothing so that the
    # interpreter's own flush at exit doesn't fail again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def interrupted(args: argparse.Namespace | None = None) -> int:
    """Ctrl-C: one line, and for a training run whose last checkpoint is on disk, how to continue from it."""
    training = args is not None and command_name(args) in MULTI_PROCESS_COMMANDS
    output = getattr(args, "output", None) if training else None
    checkpoint = staging_dir(output) / CHECKPOINT_DIR if output else None
    if checkpoint is not None and checkpoint.is_dir():
        say(f"interrupted; the run's last checkpoint is in {checkpoint}: continue it with --resume", logging.WARNING)
    else:
        say("interrupted", logging.WARNING)
    return 130


def out_of_memory(args: argparse.Namespace) -> str:
    """The message, naming what to lower among the flags this command takes."""
    flags = [flag for flag, dest in (("--batch-size", "batch_size"), ("--max-length", "max_length"))
             if hasattr(args, dest)]
    return ("out of memory" + (f"; try a smaller {' or '.join(flags)}" if flags else "")
            + " (or a smaller input: files are read whole)")


def started_beside_other_processes() -> bool:
    """Whether torchrun started this process as one of several (not a stray WORLD_SIZE: launch_or_single)."""
    return launch_or_single().is_distributed


def fail(message: str) -> int:
    say(f"error: {one_line(message)}")
    return 1


def say(line: str, level: int = logging.ERROR) -> None:
    """The command's last word on stderr, "bertforge: " first; a record of the log where it is JSON lines."""
    if logging_json():
        logging.getLogger("bertforge").log(level, line.removeprefix("error: "))
    else:
        print(f"bertforge: {line}", file=sys.stderr)


def one_line(message: str) -> str:
    """Messages from libraries may span lines; the promise is one."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def describe_os_error(error: OSError, output: str | None = None) -> str:
    """'out/model.safetensors: No space left on device': the path first, as in every other message. A write to a
    file already open (a log appended to) names no file: a full disk is then the command's output's problem."""
    reason = error.strerror or str(error)
    if error.filename is None:
        return f"{output}: {reason}" if output and error.errno in WRITE_ERRORS else reason
    return f"{error.filename}: {reason}" + (f" (-> {error.filename2})" if error.filename2 else "")
