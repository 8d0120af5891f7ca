"""Where results go: output locations checked before any work starts, and model folders written so that nothing
good is lost.

A run (fine-tuning, pre-training, export) writes into a staging folder beside its output, `NAME.incomplete/`, and
moves it into place only when it ends well. A run that is killed or fails leaves the previous model untouched and
its own partial work clearly named (and, for training runs, resumable). A folder that holds a model is replaced
only when the user says so (`overwrite`). A staging folder is locked while its run writes into it, so a second run
into the same output (the command started twice, `--resume` given while the first still runs) is refused instead
of mixed into the first.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bertforge.atomic import write_text_atomic, writes_through
from bertforge.errors import ConfigError, InputError

INCOMPLETE_SUFFIX = ".incomplete"
# Files whose presence makes a folder a model (or a training run): replacing it loses someone's work.
MODEL_MARKERS = ("config.json", "model.safetensors", "pytorch_model.bin", "finetune_config.json",
                 "pretrain_config.json", "checkpoint")
# The other files a run or an export writes beside its model: in a folder that holds no model they would replace
# the user's own files of these names, which is refused unless asked (--overwrite).
RUN_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "metrics.json",
             "train_log.jsonl", "curves.png", "eval_results.json", "seeds.json", "modules.json")
# A command's reports, which it may write again into the model folder it reads (evaluate, pretrain eval and plot).
REPORT_FILES = ("eval_results.json", "curves.png")
# What else makes up a model or corpus folder that commands read: replacing one of these with a report would break it.
FOLDER_FILES = ("log.jsonl", "manifest.json", "compression.json", "adapter_config.json", "sentence_bert_config.json",
                "config_sentence_transformers.json", "added_tokens.json", "distill_config.json", "router_config.json",
                "bert_config.json", "trained_on.json")
TENSOR_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".index.json")
SHARD_PREFIX = "shard-"  # a prepared corpus's token arrays (shard-00000.tokens.npy); other .npy files are embed's


def check_parent(path: Path, what: str) -> None:
    """The nearest existing folder above `path` must be a folder we may write in (it is created later)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():  # a dangling link
            raise InputError(f"can't create the {what}: {parent} is a broken link", path)
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"can't create the {what}: {parent} is a file, not a folder", path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"can't create the {what}: {parent} is not writable", path)
    try:  # what the permission bits don't say: /proc or /sys, which refuse root too
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".bertforge-probe-"))
    except OSError as error:
        raise InputError(f"can't create the {what}: {parent}: {error.strerror or error}", path) from None


def check_output_file(path: str | Path, what: str = "output file") -> Path:
    """Fail before any slow work when the file `path` can't be written: it is a folder, its folder is a file or
    read-only. The file itself is replaced atomically when the work is done."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"is a folder; the {what} must be a file", path)
    if writes_through(path):  # a device, a FIFO: written in place
        return path
    if path.exists() and not os.access(path.resolve().parent, os.W_OK | os.X_OK):
        raise InputError(f"can't replace the {what}: its folder is not writable", path)
    check_parent(path, what)
    return path


def is_within(path: str | Path, folder: str | Path) -> bool:
    """Whether `path` is `folder` or lies inside it (links and relative names resolved)."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def is_part_of(path: str | Path, folder: str | Path) -> bool:
    """Whether the file `path` is, or by its name would be, one of those that make up the model or corpus folder
    `folder` (or a sub-folder's: a checkpoint, a sentence-transformers module): its weights, config, tokenizer,
    logs or shards (a modules.json written there would change how the folder loads), not a report or an export a
    command writes there again."""
    path = Path(path)
    if path.is_dir() or not is_within(path, folder):
        return False
    name = path.name
    if name in REPORT_FILES:
        return False
    return (name in MODEL_MARKERS + RUN_FILES + FOLDER_FILES or name.endswith(TENSOR_SUFFIXES)
            or name.startswith(SHARD_PREFIX) and name.endswith(".npy"))


def check_not_trainer_metrics(path: str | Path) -> Path:
    """`path`, a report that a command writes into a model folder unless told where, refused where it holds the
    metrics transformers' Trainer saved under that name (save_metrics' "eval_"-prefixed keys, beside which run_mlm
    puts its perplexity, as the example scripts leave them beside the model; bertforge's reports have none): the
    report would replace them without a word."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no file, or none that holds anyone's metrics
        return path
    if isinstance(record, dict) and any(key.startswith("eval_") for key in record):
        raise InputError("holds the metrics transformers' Trainer saved (its eval_* keys), which this report would "
                         "replace: choose another file with --output", path)
    return path


def check_not_holding(output: Path, inputs: tuple[str | Path | None, ...], what: str,
                      models: tuple[str | Path | None, ...] = ()) -> None:
    """Refuse an output folder that is, or holds, one of the files or folders the run reads (or holds one of its
    `models`: a model may be its own output, replaced by the run with --overwrite): the folder is replaced whole when
    a model in it is overwritten (by this run or a later one), which would delete them."""
    inside = [model for model in models if model is not None and Path(model).exists()
              and Path(model).resolve() != Path(output).resolve()]
    for given in (*inputs, *inside):
        if given is not None and str(given) != "-" and Path(given).exists() and is_within(given, output):
            held = "is what this run reads" if is_within(output, given) else f"holds {given}, which this run reads"
            raise InputError(f"{held}: replacing the {what} (by this run or a later one given --overwrite) would "
                             f"delete it; choose another {what}", output)


def holds_model(directory: Path) -> bool:
    return directory.is_dir() and any((directory / name).exists() for name in MODEL_MARKERS)


def check_output_dir(path: str | Path, overwrite: bool = False, what: str = "output folder",
                     inputs: tuple[str | Path | None, ...] = (), models: tuple[str | Path | None, ...] = ()) -> Path:
    """Fail before any slow work when the model folder `path` can't be written, holds a model (or a training
    run) and `overwrite` is not set, or holds one of the run's `inputs` (data files, a corpus) or, inside it, one
    of its `models` (see check_not_holding)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"exists and is not a folder; the {what} is a model folder", path)
    check_not_holding(path, inputs, what, models)
    if overwrite and holds_model(path) and is_within(os.getcwd(), path):
        raise InputError(f"is the current folder (or holds it): replacing the model in it would pull the folder "
                         f"from under this shell; run from elsewhere, or choose another {what}", path)
    if (path / "checkpoint").is_dir() and not overwrite:
        raise ConfigError(f"{path}: already holds a training run; pass --resume to continue it, --overwrite to "
                          "start again, or choose another output folder")
    if holds_model(path) and not overwrite:
        raise ConfigError(f"{path}: already holds a model; choose another {what}, or pass --overwrite to replace it")
    taken = [name for name in RUN_FILES if (path / name).exists()] if path.is_dir() and not overwrite else []
    if taken:
        raise ConfigError(f"{path}: holds {', '.join(taken)}, which the model's files would replace; choose another "
                          f"{what}, or pass --overwrite to replace {'it' if len(taken) == 1 else 'them'}")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"the {what} is not writable", path)
    check_parent(path, what)
    staging = staging_dir(path)
    if staging.exists() and not staging.is_dir():
        raise InputError("exists and is not a folder; it is where this run stages its output", staging)
    if staging.parent.is_dir() and not os.access(staging.parent, os.W_OK | os.X_OK):
        raise InputError(f"is not writable, and this run stages its output beside the {what}, in {staging.name}",
                         staging.parent)
    check_not_in_use(path)
    return path


def staging_dir(output: str | Path) -> Path:
    """Where a run into `output` writes until it ends: beside it, so that the final move is a rename."""
    output = Path(output)
    if output.name in ("", ".."):  # "." (whose name is empty) and ".." have no name of their own to suffix
        output = Path(os.path.abspath(output))
    if not output.name:
        raise InputError("is the file system's root; a model needs a folder of its own", output)
    return output.with_name(output.name + INCOMPLETE_SUFFIX)


# The staging folders this process writes into, each held open under the kernel's lock (flock). The lock ends with
# the process: a killed run leaves none, and its folder can be resumed at once.
_held: dict[str, int] = {}


def _lock(folder: Path) -> int | None:
    """An open descriptor of `folder` that holds its lock; None when another process holds it. Where the file system
    has no locks (some network mounts), the run goes on unprotected rather than not at all."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except OSError:
        pass
    return descriptor


def in_use(output: Path) -> InputError:
    return InputError("another run is writing into it (its staging folder is in use); wait for that run to end, or "
                      "choose another output", output)


def check_not_in_use(output: str | Path) -> None:
    """Refuse, before any work, an output whose staging folder another running process holds.

    Under torchrun the main process (rank 0) alone writes the folder, takes its lock and looks at it here: the
    others' looks, each a brief lock of its own, would collide with its lock and with one another."""
    staging = staging_dir(output)
    from bertforge.training.distributed import launch_or_single  # training imports this module

    if os.path.abspath(staging) in _held or not staging.is_dir() or launch_or_single().rank != 0:
        return
    descriptor = _lock(staging)
    if descriptor is None:
        raise in_use(Path(output))
    os.close(descriptor)


def start_staging(output: str | Path, keep: bool = False) -> Path:
    """A fresh staging folder for a run into `output` (or, with `keep`, the one a killed run left, to resume),
    locked for this process until `finish_staging`."""
    staging = staging_dir(output)
    release_staging(output)  # this process's own earlier run into it (a library caller trying again)
    if staging.is_dir() and not keep:
        check_not_in_use(output)
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    held = _lock(staging)
    if held is None:  # another run holds the folder kept, or made it in the same instant
        raise in_use(Path(output))
    _held[os.path.abspath(staging)] = held
    return staging


def release_staging(output: str | Path) -> None:
    """Give up the lock on `output`'s staging folder, if this process holds it."""
    descriptor = _held.pop(os.path.abspath(staging_dir(output)), None)
    if descriptor is not None:
        os.close(descriptor)


def finish_staging(output: str | Path) -> Path:
    """Move the staging folder into place. A model folder being replaced (the run was told to overwrite it) is
    set aside, the new one renamed in, then the old one removed: a crash in between leaves one of the two whole
    under a clear name. Into an existing folder that holds no model, the new files are moved one by one, so that
    the user's other files stay (and the folder, which may be the current one, stays where it is)."""
    output = Path(output)
    staging = staging_dir(output)
    if output.is_dir() and not holds_model(output):
        _move_into(staging, output)
        staging.rmdir()
        release_staging(output)
        return output
    previous = output.with_name(output.name + ".previous")
    if previous.exists():
        shutil.rmtree(previous)
    if output.exists():
        os.replace(output, previous)
    os.replace(staging, output)
    release_staging(output)
    if previous.exists():
        shutil.rmtree(previous)
    return output


def _move_into(source: Path, target: Path) -> None:
    """Move every entry of `source` into the folder `target`; a subfolder into the subfolder of its name there,
    file by file, so that the user's files in it stay (an onnx/ folder that holds their own int8 graph)."""
    for entry in source.iterdir():
        destination = target / entry.name
        if entry.is_dir() and destination.is_dir() and not destination.is_symlink():
            _move_into(entry, destination)
            entry.rmdir()
            continue
        if destination.is_dir() and not destination.is_symlink():
            shutil.rmtree(destination)
        os.replace(entry, destination)


def finite(value: Any) -> Any:
    """The value with every NaN or infinite float as None: JSON has no NaN, and strict readers (jq, browsers,
    other languages) refuse the bare NaN Python's json writes."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def to_json(value: Any, **options: Any) -> str:
    """json.dumps for the files and lines bertforge writes: standard JSON, a NaN metric or loss as null."""
    return json.dumps(finite(value), allow_nan=False, **options)


STANDARD_STREAM = "-"  # a file argument that means standard input (to read) or standard output (to write)


def write_output(path: str | Path, text: str) -> None:
    """`text` into the file `path` (atomically), or onto standard output for "-" (STANDARD_STREAM)."""
    if str(path) == STANDARD_STREAM:
        write_standard_output(text)
    else:
        write_text_atomic(path, text)


def write_standard_output(text: str) -> None:
    """All of `text` on standard output. One large write into a pipe whose reader left (`| head -1`) could come
    back short, without an error, and the rest was dropped in silence: each rest is written again, until the
    pipe's error (BrokenPipeError: exit status 141) or the end."""
    stream = sys.stdout
    if not hasattr(stream, "buffer"):  # a caller's text stream (a notebook's, a test's)
        stream.write(text)
        return
    stream.flush()
    data = memoryview(text.encode(stream.encoding or "utf-8", errors="backslashreplace"))
    while data:
        written = stream.buffer.write(data)
        if not written:
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
        data = data[written:]
    stream.buffer.flush()
