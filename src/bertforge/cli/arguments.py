"""Arguments and input helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from bertforge.data_files import decode_text, read_bytes, split_lines
from bertforge.errors import ConfigError, InputError
from bertforge.json_config import check_field_types, read_json_object
from bertforge.outputs import STANDARD_STREAM, check_output_file, is_part_of, write_output  # noqa: F401 (commands')
from bertforge.validation import MAX_SEED


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", type=path_text, default="default",
                        help="model directory (config.json, model.safetensors, vocab.txt) or 'default'")


def number_type(name: str, convert: Callable[[str], Any], allowed: Callable[[Any], bool], rule: str
                ) -> Callable[[str], Any]:
    """An argparse type: `convert` the text, then refuse it with "must be RULE, got TEXT" unless allowed(value)
    (and text that is no number with "must be a number"); `name` is the type's name in argparse's own messages."""
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:  # not a number at all (argparse would say "invalid finite_float value")
            raise argparse.ArgumentTypeError(f"must be {'a whole number' if convert is int else 'a number'}, "
                                             f"got {text}") from None
        if not allowed(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value
    parse.__name__ = name
    return parse


def number_range(name: str, convert: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    """An argparse type for a number from `low` to `high`, both included; the message says the range."""
    def shown(bound: float) -> str:
        return f"{bound:g}" if isinstance(bound, float) else str(bound)
    return number_type(name, convert, lambda value: low <= value <= high, f"from {shown(low)} to {shown(high)}")


positive_int = number_type("positive_int", int, lambda value: value >= 1, "at least 1")
# nan and inf parse as floats but would train a model into NaN
finite_float = number_type("finite_float", float, math.isfinite, "a finite number")
non_negative_float = number_type("non_negative_float", finite_float, lambda value: value >= 0, "zero or more")
positive_float = number_type("positive_float", finite_float, lambda value: value > 0, "more than zero")
fraction = number_range("fraction", finite_float, 0, 1)
below_one = number_type("below_one", finite_float, lambda value: 0 <= value < 1, "at least 0 and below 1")
probability = number_type("probability", finite_float, lambda value: 0 < value < 1, "above 0 and below 1")
above_zero_up_to_one = number_type("above_zero_up_to_one", finite_float, lambda value: 0 < value <= 1,
                                  "above 0 and at most 1")
non_negative_int = number_type("non_negative_int", int, lambda value: value >= 0, "zero or more")
seed_number = number_range("seed_number", int, 0, MAX_SEED)
port_number = number_type("port_number", int, lambda value: 0 <= value <= 65535, "a port number from 0 to 65535")


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """--corpus and --text-field, as `pretrain prepare` and `vocab` read a corpus (bertforge.pretraining.raw_text)."""
    parser.add_argument("--corpus", type=path_text, nargs="+", required=True, metavar="FILE",
                        help="UTF-8 text files (one sentence or paragraph per line, a blank line between documents; "
                             "WikiExtractor's output too), JSON lines (a document per record), Parquet files or "
                             "datasets folders (a document per row), plain or .gz/.bz2/.xz, and folders of them")
    parser.add_argument("--text-field", default="text",
                        help="the text's field in JSON lines, or its column in Parquet and datasets folders "
                             "(default: %(default)s)")


def held_out_size(text: str) -> int | float:
    """An argparse type for the documents a pre-training run holds out: a fraction below 1, or a whole count (1.5
    documents is neither)."""
    value = finite_float(text)
    if 0 <= value < 1:
        return value
    if value >= 1 and value.is_integer():
        return int(value)
    raise argparse.ArgumentTypeError(f"must be a fraction from 0 to below 1, or a whole number of documents, "
                                     f"got {text}")


REPORT_TO_HELP = ("dashboards that get the training curves too, in OUTPUT/runs with transformers' tag names "
                  "(train/loss, eval/accuracy): tensorboard (`tensorboard --logdir OUTPUT/runs`), comma-separated "
                  "names, or none")


def reporter_names(text: str) -> tuple[str, ...]:
    """An argparse type for --report-to: comma-separated names of reporting.REPORTERS ("tensorboard"), or "none"
    (transformers' spelling) for no dashboard, which a run config's report_to gives way to."""
    from bertforge.training.reporting import check_reporter_names

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if names == ("none",):
        return ()
    try:
        check_reporter_names(names or (text,))
    except ConfigError as problem:
        raise argparse.ArgumentTypeError(f"{problem}, or none") from None
    return names


def flags_over_config(args: argparse.Namespace, config_class: type, places: Iterable[tuple[str, ...]]
                      ) -> tuple[dict[str, Any], str, list[tuple[str, ...]]]:
    """A training command's run config as JSON: `--config`'s file (if any), with every flag given written at its
    place ({"training": {"lr": ...}}); the source to name in messages; and the places the flags filled. A flag's
    argparse destination is its place's last key, and None where it was not given."""
    data, source = {}, "command line"
    if args.config:
        data = read_json_object(Path(args.config), "run config")
        source = args.config
        # Before the flags are written in: a "training" that isn't an object has no place for --epochs.
        check_field_types(config_class, data, source)
    given = []
    for place in places:
        value = getattr(args, place[-1], None)
        if value is not None:
            section = data
            for key in place[:-1]:
                section = section.setdefault(key, {})
            section[place[-1]] = value
            given.append(place)
    return data, source, given


def path_text(text: str) -> str:
    """An argparse type for a file or folder: an empty one (what `--output "$OUT"` gives when OUT is unset) is
    refused, not read as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty (an unset shell variable?)")
    return text


STANDARD_INPUT_NAME = "<stdin>"  # what messages call standard input


def read_standard_input() -> str:
    """Standard input as text, checked as a file is (whatever encoding and error handler Python gave sys.stdin)."""
    return decode_text(sys.stdin.buffer.read(), STANDARD_INPUT_NAME)


def texts_or_standard_input(*texts: str | None) -> list[str | None]:
    """Texts given on the command line, "-" standing for standard input (its last line end dropped), at most once."""
    if sum(text == STANDARD_STREAM for text in texts) > 1:
        raise InputError("only one text can be read from standard input ('-')")
    return [read_standard_input().removesuffix("\n").removesuffix("\r") if text == STANDARD_STREAM else text
            for text in texts]


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (plain or compressed: bertforge.data_files) or of standard input ("-"), one
    text per line; an empty input is an error."""
    if str(path) == STANDARD_STREAM:
        lines = split_lines(read_standard_input())
        if not any(line.strip() for line in lines):
            raise InputError("the input is empty: expected one text per line", STANDARD_INPUT_NAME)
        return lines
    path = Path(path)
    try:
        text = decode_text(read_bytes(path), path)
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a text file", path) from None
    lines = split_lines(text)
    if not any(line.strip() for line in lines):
        raise InputError("the input is empty: expected one text per line", path)
    return lines


def report(path: str | Path, message: str) -> None:
    """What a command wrote: on standard output, unless the output itself went there (then on standard error)."""
    print(message, file=sys.stderr if str(path) == STANDARD_STREAM else sys.stdout)


# Formats whose files are not text: standard input in them is passed on as bytes.
BINARY_FORMATS = ("parquet", "hf_dataset")


@contextlib.contextmanager
def input_file(path: str | Path, format: str | None) -> Iterator[Path]:
    """The data file `path`; for "-", standard input saved to a temporary file named for its format (--format,
    default one text per line), so that every reader takes it. Errors about that file name standard input."""
    if str(path) != STANDARD_STREAM:
        yield Path(path)
        return
    with tempfile.TemporaryDirectory() as directory:
        saved = Path(directory) / f"stdin.{format or 'txt'}"
        raw = sys.stdin.buffer.read()
        if format not in BINARY_FORMATS:
            decode_text(raw, STANDARD_INPUT_NAME)  # here, where the line of a bad byte can be named for stdin
        saved.write_bytes(raw)
        try:
            yield saved
        except InputError as error:
            # The temporary file means nothing to the user; what they gave is standard input.
            named = InputError(str(error).replace(str(saved), STANDARD_INPUT_NAME))
            named.path, named.line, named.field = STANDARD_INPUT_NAME, error.line, error.field
            raise named from None


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    """--precision, --compile and --device, for every command that runs a model for its outputs."""
    from bertforge.inference.optimize import PRECISIONS
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (default, as trained); bf16 (GPUs, CPUs with AVX-512 BF16 or AMX); auto: bf16 "
                             "where the device runs it natively, else fp32; int8: int8 linear layers with per-channel "
                             "scales and float32 outlier channels (CPU; check the cost with `bertforge evaluate`)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (needs a C++ compiler on CPU; the first batches are slow)")
    parser.add_argument("--device", default="cpu", help="where the model runs: cpu (default), cuda, cuda:N or mps")


def format_help(files: str = "the data file's", default: str = "its extension's") -> str:
    """--format's help: whose format it names and the default, then every format."""
    from bertforge.tasks.tables import DATA_FORMATS
    return (f"{files} format (default: {default}; a .txt or .tsv file of `word ... tag` lines is CoNLL): "
            + "; ".join(f"{name}: {text}" for name, text in DATA_FORMATS.items()))


def add_format_argument(parser: argparse.ArgumentParser) -> None:
    """--format, shared by evaluate, predict and quantize so that each reads a file the same way."""
    from bertforge.tasks.tables import DATA_FORMATS
    parser.add_argument("--format", choices=list(DATA_FORMATS), default=None, help=format_help())


def inference_options(args: argparse.Namespace):
    from bertforge.inference.optimize import InferenceOptions, check_device
    check_device(args.device)  # before any model loads
    return InferenceOptions(precision=args.precision, compile=args.compile, device=args.device)


def load_encoder(name_or_path: str, inference=None):
    """The encoder and tokenizer of a model directory (or 'default'), ready for inference (`inference`: an
    InferenceOptions; imported lazily, like torch, so that `bertforge --help` stays fast)."""
    from bertforge import BertModel, BertTokenizer
    from bertforge.inference.optimize import AS_TRAINED
    model = BertModel.from_pretrained(name_or_path)  # first: a bad config.json is the error to report
    tokenizer = BertTokenizer.from_pretrained(name_or_path)
    return (inference or AS_TRAINED).apply(model, tokenizer), tokenizer


def check_writable(path: str | Path, *inputs: str | Path | None) -> Path:
    """Fail before any slow work when the file `path` can't be written (see outputs.check_output_file), is one of
    the command's input files, or is part of an input folder (a model's weights or config, a corpus's manifest),
    which writing it would replace; standard output ("-") always can be written."""
    if str(path) == STANDARD_STREAM:
        return Path(path)
    for given in inputs:
        if given is None or str(given) == STANDARD_STREAM:
            continue
        if _same_file(path, given):
            raise InputError("is the input file too: writing the output there would replace what it holds; choose "
                             "another output file", Path(path))
        if Path(given).is_dir() and is_part_of(path, given):
            raise InputError(f"is part of {given}, which this command reads: writing the output there would "
                             "replace it; choose another output file", Path(path))
    return check_output_file(path)


def _same_file(path: str | Path, other: str | Path) -> bool:
    """Whether two names are one file (a link, a relative and an absolute name alike); False if either is absent."""
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def add_flag_table(parser: argparse.ArgumentParser, flags: dict[str, tuple[Any, Any, str]],
                   default_of: Callable[[Any], Any], aliases: dict[str, str] | None = None,
                   short: dict[str, str] | None = None, required: Collection[str] = ()) -> None:
    """One option per row of a command's flag table, flag -> (place in its config, kind, help).

    The kind is a type, a table whose keys are the choices, or bool for a switch (which sets the opposite of its
    default). Every argparse default is None, so that only the flags given are set and the config dataclass fills
    in the rest: its default, `default_of(place)`, is what the help shows (unless the help says what it means
    itself). `aliases` maps old spellings to a flag: they still work and are not shown.
    """
    aliases, short = aliases or {}, short or {}
    for flag, (place, kind, help_text) in flags.items():
        dest = place if isinstance(place, str) else place[-1]
        default = default_of(place)
        options: dict[str, Any] = {"dest": dest, "default": None}
        if kind is bool:
            options |= {"action": "store_const", "const": not default if isinstance(default, bool) else True}
        elif callable(kind):
            options |= {"type": kind, "metavar": flag[2:].upper().replace("-", "_")}
        else:
            options["choices"] = list(kind)
        if flag in required:
            options["required"] = True
        elif kind is not bool and "default:" not in help_text and "(default" not in help_text:
            help_text = f"{help_text} (default: {'none' if default is None else default})"
        parser.add_argument(flag, *([short[flag]] if flag in short else []), help=help_text, **options)
        for alias in (old for old, new in aliases.items() if new == flag):
            parser.add_argument(alias, **(options | {"default": argparse.SUPPRESS, "required": False}),
                                help=argparse.SUPPRESS)
