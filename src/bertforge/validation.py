"""Checks of the numbers a user gives (flags, run configs, config.json): type, finite, range, and whether a model
of the asked size fits in memory. One place, so that every entry point says the same thing about the same mistake.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterable, Mapping
from typing import Any

from bertforge.errors import BertforgeError, ConfigError, InputError

BYTES_PER_PARAMETER = 4  # float32 weights, as every model is built
MAX_SEED = 2**32 - 1  # numpy's global generator (seeded with torch's and Python's) takes 32 bits


def check_number(name: str, value: Any, minimum: float | None = None, integer: bool = False,
                 exclusive: bool = False, optional: bool = False, maximum: float | None = None) -> None:
    """Raise ConfigError unless `value` is a finite number (an int if `integer`) at or above `minimum` (above it
    with `exclusive`) and at most `maximum`; None passes when `optional`."""
    if value is None and optional:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ConfigError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if exclusive else value < minimum):
        raise ConfigError(f"{name} must be {'above' if exclusive else 'at least'} {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value!r}")


def check_paths(**paths: Any) -> None:
    """ConfigError for a path given as empty text, which Path("") would read as the current folder; None (not
    given) passes."""
    for name, value in paths.items():
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"{name} is an empty path")


def check_counts(error: type[BertforgeError] = InputError, /, **counts: Any) -> None:
    """`error` (InputError unless told) unless each value is a positive whole number: the counts and sizes an API
    call is given (top_k, batch_size, truncate_dim, vocab_size), named in the message."""
    for name, value in counts.items():
        count_of(name, value, error)


def count_of(name: str, value: Any, error: type[BertforgeError] = InputError) -> int:
    """`value` as an int if it is a positive whole number, else `error` naming it. A numpy integer is one, as
    transformers and sentence-transformers take it (and is given back as an int, which JSON can write); True is
    none."""
    try:
        whole = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        whole = None
    if whole is None or whole < 1:
        raise error(f"{name} must be a positive whole number, got {value!r}")
    return whole


def listed_inputs(value: Any, name: str) -> list:
    """A batch of inputs as a list: a list, a tuple, a numpy array, a pandas Series or an iterator (a generator,
    read once). A text alone is the caller's to take; bytes (text not yet decoded), a dict or a set (whose keys or
    order would be read), None and a number are an InputError naming `name`: the tokenizer and the encoders say the
    same."""
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | bytearray | Mapping | set | frozenset):
        return list(value)
    kind = "bytes: decode them first" if isinstance(value, bytes | bytearray) else type(value).__name__
    raise InputError(f"{name} must be a string or a list of strings, got {kind}")


def check_within_positions(max_length: int | None, positions: int, name: str = "max_length") -> None:
    """Refuse a token budget longer than the model has positions for, naming where it came from (`name`: a flag,
    a config file's key), before any work: else the first long input fails deep in the model."""
    if max_length is not None and max_length > positions:
        raise ConfigError(f"{name} {max_length} is more than the model's max_position_embeddings ({positions})")


def readable_length(model, tokenizer) -> int:
    """The most tokens `model` reads of a text: its tokenizer's model_max_length, within its positions."""
    return min(tokenizer.model_max_length, model.config.max_position_embeddings)


def encoder_parameters(config) -> int:
    """Parameters of a BertModel of `config`'s sizes (embeddings, layers, pooler), counted without building it."""
    hidden, inner = config.hidden_size, config.intermediate_size
    embeddings = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size + 2) * hidden
    layer = 4 * (hidden + 1) * hidden + 2 * hidden * inner + inner + hidden + 4 * hidden
    return embeddings + config.num_hidden_layers * layer + (hidden + 1) * hidden


def physical_memory() -> int | None:
    """Bytes of RAM on this machine; None where the system doesn't say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gigabytes(size: float) -> str:
    return f"{size / 1e9:.3g} GB"


def check_fits_in_memory(parameters: int, what: str) -> None:
    """Refuse a model whose float32 weights alone exceed this machine's memory, before anything is allocated:
    building it would swap for minutes or be killed."""
    available = physical_memory()
    needed = parameters * BYTES_PER_PARAMETER
    if available is not None and needed > available:
        raise ConfigError(f"{what} has {parameters:,} parameters, which need {gigabytes(needed)} of memory; "
                          f"this machine has {gigabytes(available)}")
