"""Errors a user can cause. The CLI prints them as one line and exits non-zero; anything else is a bug."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class BertforgeError(ValueError):
    """Base class: a problem with the user's input, files or settings, described in one line. A ValueError, as
    transformers and sentence-transformers raise for the same problems, so that code catching theirs catches it."""


class ConfigError(BertforgeError):
    """A configuration value or key that bertforge can't honour."""


class CheckpointError(BertforgeError):
    """A checkpoint directory or file that is missing, unreadable or doesn't match the model."""


class InputError(BertforgeError):
    """Bad user data: names the file, and the line and field when known (`unit` "row" for tables that have rows,
    not lines: Parquet, datasets folders, data given in memory)."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None, unit: str = "line"):
        where = ""
        if path is not None:
            where = str(path) + (f", {unit} {line}" if line is not None else "")
            where += (f", field {field!r}" if field is not None else "") + ": "
        super().__init__(where + message)
        self.path, self.line, self.field = path, line, field


def no_such_file(path: str | Path, what: str = "file") -> InputError:
    """The error for a data file that isn't there; "-" is named as what it would be elsewhere (standard input),
    which the commands that read a file more than once, or keep its name, don't take."""
    if str(path) == "-":
        return InputError(f"standard input is read by predict, embed, similarity and tokenize; this {what} must be "
                          "a file: save the data to one and name it", path)
    return InputError(f"no such {what}", path)


def check_choice(name: object, choices: Iterable[str], what: str, error: type[BertforgeError] = ConfigError) -> None:
    """Raise `error` unless `name` is one of `choices`, naming them: "unknown pooling 'avg'; choose from cls, mean,
    max". The one spelling of that message for every table of named variants."""
    if not isinstance(name, str) or name not in choices:  # a list or dict from JSON can't be looked up in a table
        raise error(f"unknown {what} {name!r}; choose from {', '.join(choices)}")
