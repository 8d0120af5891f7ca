"""Task data: CSV/TSV/JSONL/Parquet files, datasets folders or rows in memory -> examples (errors name the file,
line or row, and column), features -> batches (made by bertforge.batching) and the model's outputs on them.

GLUE's .tsv files are read as they are: tab-separated with no quoting (their texts contain stray quotes); a .tsv
that pandas or datasets wrote, quoting some texts, as they read it back.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.batching import MODEL_INPUTS, LengthGroupedBatches, collate, length_sorted_batches
from bertforge.config import JsonConfig, check_number
from bertforge.data_files import COMPRESSED_NAMES, DAMAGED, content_suffix, decode_text, opened, read_bytes, split_lines
from bertforge.errors import ConfigError, InputError, no_such_file
from bertforge.heads import IGNORE_INDEX
from bertforge.tasks import arrow_files
from bertforge.training.distributed import Shard

PLAIN_TEXT_COLUMN = "text"  # the one column of a .txt file (one text per line)


@dataclass
class Table:
    """The rows of a data file as dicts, each with the line it starts on (1-based, the header is line 1), or with
    its row number (1-based; unit "row") where there are no lines: Parquet, datasets folders, data in memory."""

    path: Path | str  # the file, or what the data in memory is ("DataFrame") for messages
    columns: list[str]
    rows: list[tuple[int, dict[str, Any]]]
    unit: str = "line"
    repeated: frozenset[str] = frozenset()  # header names given to more than one column (CSV, TSV)

    def error(self, message: str, line: int | None = None, field: str | None = None) -> InputError:
        return InputError(message, self.path, line, field, unit=self.unit)

    @property
    def header_line(self) -> int | None:
        """Where a missing column is reported: line 1 of a text file, nowhere in particular otherwise."""
        return 1 if self.unit == "line" else None


def _read_delimited(path: Path, text: str, delimiter: str, quoting: int) -> Table:
    # The csv module refuses fields over 128 KB by default; a long document is a field as long as the file at most.
    csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))
    # newline="": rows end at \n or \r\n only, as the csv module expects (not at U+2028 inside a text).
    # strict: an unclosed quote is an error, not a field that swallows every row after it.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    rows, line = [], 1
    try:
        header = next(reader, None)
        if header is None:
            raise InputError("the file is empty", path)
        line = reader.line_num + 1
        for values in reader:
            if values:  # blank lines carry no example
                if len(values) != len(header):  # e.g. an unquoted comma inside a CSV text
                    raise InputError(f"the row has {len(values)} fields, the header has {len(header)}", path, line)
                rows.append((line, dict(zip(header, values))))
            line = reader.line_num + 1
    except csv.Error as error:
        reason = ("a quote opened in this row is never closed" if "end of data" in str(error)
                  else f"malformed quoting ({error})")
        raise InputError(reason, path, line) from None
    return Table(path, header, rows, repeated=frozenset(name for name in header if header.count(name) > 1))


def _read_delimited_or_quoted(path: Path, text: str) -> Table:
    """A .tsv file: GLUE's have no quoting (their texts hold stray quotes, read as they are); pandas' and datasets'
    to_csv(sep="\\t") quote a text that holds a quote, tab or line break, doubling its quotes. The file is read
    with that quoting where it shows it (a doubled quote, or rows that only quoting makes whole) and reads whole."""
    try:
        unquoted = _read_delimited(path, text, "\t", csv.QUOTE_NONE)
    except InputError as error:
        unquoted, failure = None, error
    if unquoted is not None and '""' not in text:
        return unquoted
    try:
        return _read_delimited(path, text, "\t", csv.QUOTE_MINIMAL)
    except InputError:
        if unquoted is None:
            raise failure from None
        return unquoted


def _read_jsonl(path: Path, text: str) -> Table:
    """JSON lines; also a JSON array of objects, and an object whose "data" holds them (transformers' run_qa and
    datasets' JSON loader read those with field="data")."""
    start = text.lstrip()
    if start.startswith("["):
        return _read_json_array(path, text)
    if start.startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError:
            document = None  # several objects: JSON lines
        records = document.get("data") if isinstance(document, dict) else None
        if isinstance(records, list) and records and all(isinstance(record, dict) for record in records):
            return _json_records(path, records)
        if isinstance(document, dict) and len(start.rstrip().splitlines()) > 1:
            raise InputError("expected JSON lines (an object per line), a JSON array of objects, or an object "
                             "whose \"data\" is one; got one object over several lines", path)
    rows, columns = [], {}
    # Split at \n only: a JSON string may hold U+2028, which str.splitlines would break on.
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as error:
            raise InputError(f"not valid JSON: {error.msg} (column {error.colno})", path, line) from None
        if not isinstance(row, dict):
            raise InputError(f"expected a JSON object per line, got {type(row).__name__}", path, line)
        columns.update(dict.fromkeys(row))
        rows.append((line, row))
    return Table(path, list(columns), rows)


def _read_json_array(path: Path, text: str) -> Table:
    """A JSON array of row objects (what datasets' JSON loader also reads), rows numbered from 1."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"not valid JSON: {error.msg} (column {error.colno})", path, error.lineno) from None
    if not isinstance(records, list):
        raise InputError("expected a JSON array of objects", path)
    return _json_records(path, records)


def _json_records(path: Path, records: list) -> Table:
    for row, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise InputError(f"expected a JSON object per row, got {type(record).__name__}", path, row, unit="row")
    columns = dict.fromkeys(name for record in records for name in record)
    return Table(path, list(columns), list(enumerate(records, start=1)), unit="row")


def _read_plain_text(path: Path, text: str) -> Table:
    """A text a line, blank lines too, so that the n-th prediction is the n-th line's (a file of blank lines
    alone holds no rows)."""
    lines = split_lines(text)
    rows = [(number, {PLAIN_TEXT_COLUMN: line}) for number, line in enumerate(lines, start=1)]
    return Table(path, [PLAIN_TEXT_COLUMN], rows if any(line.strip() for line in lines) else [])


# File suffix -> reader of the file's text.
READERS: dict[str, Callable[[Path, str], Table]] = {
    ".csv": lambda path, text: _read_delimited(path, text, ",", csv.QUOTE_MINIMAL),
    ".tsv": _read_delimited_or_quoted,
    ".jsonl": _read_jsonl,
    ".txt": _read_plain_text,
}


# Data file formats (--format); without one, the file's extension says which (see data_format).
DATA_FORMATS = {
    "csv": "comma-separated, with a header",
    "tsv": "tab-separated, with a header (GLUE's unquoted, or quoted as pandas writes it)",
    "jsonl": "one JSON object per line (or a JSON array of them, or an object whose \"data\" is one)",
    "txt": "one text per line",
    "conll": "a `word ... tag` line per token, a blank line between sentences (ner)", "squad": "SQuAD JSON (qa)",
    "parquet": "Apache Parquet (needs pyarrow: bertforge[arrow])",
    "hf_dataset": "a folder written by Hugging Face datasets' save_to_disk, one split (needs pyarrow)",
}
EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".txt": "txt", ".json": "squad", ".conll": "conll",
              ".parquet": "parquet"}
_IOB_TAG = re.compile(r"O|[BIESLU]-\S+")  # IOB, IOBES, BILOU


def data_format(path: str | Path, given: str | None = None) -> str:
    """The format of a data file: `given` (--format), else its extension's; a .txt or .tsv file (token-per-line NER
    files are often tab-separated), or one of an extension no reader knows, whose lines are mostly `word ...
    IOB-tag` (or -DOCSTART-) is CoNLL, as CoNLL-2003's own files (eng.train, eng.testa) are."""
    if not isinstance(path, (str, os.PathLike)):  # rows in memory reach only the readers of text tasks
        raise InputError(f"this task reads its data from files; got a {type(path).__name__}")
    path = Path(path)
    if given is not None:
        if given not in DATA_FORMATS:
            raise InputError(f"unknown format {given!r}; choose from {', '.join(DATA_FORMATS)}", path)
        return given
    if arrow_files.is_saved_dataset(path):
        return "hf_dataset"
    if path.is_dir():  # whatever its name says (dir.csv), a folder is not a data file
        raise InputError("is a directory, expected a data file", path)
    name = EXTENSIONS.get(content_suffix(path))
    if name == "squad" and holds_json_lines(path):
        return "jsonl"  # transformers' example scripts name JSON lines .json (run_ner's train.json)
    if name is None and looks_like_conll(path):
        return "conll"  # CoNLL-2003's own files: eng.train, eng.testa, eng.testb
    if name is None:
        raise InputError(f"unknown file type {content_suffix(path)!r}; use one of {', '.join(EXTENSIONS)} (or "
                         f"any of them {COMPRESSED_NAMES}) or say which with --format ({', '.join(DATA_FORMATS)})",
                         path)
    return "conll" if name in ("txt", "tsv") and looks_like_conll(path) else name


# Formats whose rows may hold lists (a sentence's words and tags), unlike CSV's and TSV's text cells.
ROW_FORMATS = ("jsonl", "parquet", "hf_dataset")


def task_format(path: str | Path | Any, given: str | None, labelled: bool, task: str, trained: tuple[str, str],
                predicted: tuple[str, str], rows: str | None = None) -> str | None:
    """The format of a task's data file (as data_format finds it), refused unless it is the task's: `trained`
    (format, its description), to predict also `predicted` ("CoNLL", or "text with one sentence per line"), and
    with `rows` (what each row holds) the ROW_FORMATS too, and rows given in memory (None: no file)."""
    if rows and not isinstance(path, (str, os.PathLike)):
        return None
    kind = data_format(path, given)
    accepted = (trained[0], *(ROW_FORMATS if rows else ()), *(() if labelled else (predicted[0],)))
    if kind not in accepted:
        formats = f"{trained[1]}" + (f" or rows of {rows} (JSON lines, Parquet, a datasets folder)" if rows else "")
        expected = formats if labelled else f"{formats}, or {predicted[1]}"
        extension = next((suffix for suffix, name in EXTENSIONS.items() if name == trained[0]), None)
        hint = f" (a {trained[1]} file: give it the extension {extension})" if given is None and extension else ""
        raise InputError(f"{task} reads {expected}, not {kind}{hint}", Path(path))
    return kind


_SQUAD_ARTICLE = re.compile(rb'"paragraphs"\s*:')
_ROWS_UNDER_DATA = re.compile(rb'"data"\s*:\s*\[\s*\{')


def holds_json_lines(path: Path) -> bool:
    """Whether a .json file holds rows: JSON lines (its first line one whole object, and not SQuAD's, which has
    "data"), a JSON array of objects, or an object whose "data" holds them, as datasets' JSON loader reads them;
    SQuAD's articles have "paragraphs"."""
    try:
        with opened(path) as (handle, _):
            first = b""
            while not first.strip():
                first = handle.readline(1 << 20)
                if not first:
                    return False  # an empty file: SQuAD's reader reports it
        first = first.removeprefix(b"\xef\xbb\xbf").strip()
        if first.startswith(b"["):
            return True
        try:
            row = json.loads(first)
        except ValueError:
            row = None  # not one line: a document over several lines
        if isinstance(row, dict) and "data" not in row:
            return True
        if not first.startswith(b"{"):
            return False
        document = read_bytes(path)
        return bool(_ROWS_UNDER_DATA.search(document)) and not _SQUAD_ARTICLE.search(document)
    except (*DAMAGED, OSError):
        return False  # SQuAD's reader reports it


def looks_like_conll(path: Path, lines: int = 100) -> bool:
    """Whether most of the first non-blank lines of a text file are CoNLL token lines: most, not all, so that a
    CoNLL file with a broken line is read as CoNLL and the reader names that line."""
    try:
        with opened(path) as (handle, _):
            text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="replace")
            head = [line.split() for line, _ in zip(text, range(10 * lines)) if line.strip()][:lines]
    except DAMAGED:
        return False  # the reader reports it
    token_lines = sum(columns[0] == "-DOCSTART-" or (len(columns) >= 2 and bool(_IOB_TAG.fullmatch(columns[-1])))
                      for columns in head)
    return token_lines * 2 > len(head)


def read_table(path: str | Path | Any, format: str | None = None) -> Table:
    """Read a .csv, .tsv, .jsonl (or JSON lines named .json), .txt or .parquet file or a datasets folder (or the one
    `format` names), or take rows given in memory (see table_from_data); a UTF-8 byte-order mark (as in GLUE's
    MRPC) is dropped."""
    if not isinstance(path, (str, os.PathLike)):
        return _nonempty(table_from_data(path))
    path = Path(path)
    if format is None and content_suffix(path) == ".json" and holds_json_lines(path):
        format = "jsonl"
    binary = format or _saved_format(path)
    if binary in arrow_files.READERS:
        columns, records = arrow_files.READERS[binary](path)
        return _nonempty(Table(path, columns, list(enumerate(records, start=1)), unit="row"))
    kind = "." + format if format is not None else content_suffix(path)
    if path.is_dir():  # a folder named like no data file would otherwise be an unsupported file type ''
        raise InputError("is a directory, expected a data file", path)
    if kind not in READERS:
        formats = [*(kind.lstrip(".") for kind in READERS), *arrow_files.READERS]
        if format is not None:
            raise InputError(f"unsupported format {format!r} here; use one of {', '.join(formats)}", path)
        if kind == ".json":
            raise InputError("holds no rows this reads: a .json file of data is JSON lines (one object a line, not "
                             "objects spread over several), a JSON array of objects, or an object whose \"data\" is "
                             "one (a SQuAD file is the qa task's)", path)
        raise InputError(f"unsupported file type {content_suffix(path)!r}; use one of {', '.join(READERS)} (or any "
                         f"of them {COMPRESSED_NAMES}), .parquet or a datasets folder, or say which with --format "
                         f"({', '.join(formats)})", path)
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise no_such_file(path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a data file", path) from None
    return _nonempty(READERS[kind](path, decode_text(raw, path)))


def _nonempty(table: Table) -> Table:
    if not table.rows:
        raise table.error("the file has no examples" if isinstance(table.path, Path) else "no examples")
    return table


def table_from_data(data: Any) -> Table:
    """Rows given in memory: a dict of columns (name -> list of values), a DataFrame-like object (pandas, polars,
    datasets.Dataset: `columns` or `column_names`, and `data[name]`), or a list of row dicts. Rows are numbered
    from 1 in messages; a NaN (a DataFrame's missing value) counts as missing."""
    what = type(data).__name__
    names = getattr(data, "columns", None)
    if names is None:
        names = getattr(data, "column_names", None)
    if isinstance(data, Mapping) or names is not None:
        columns = {str(name): data[name] for name in (data if isinstance(data, Mapping) else names)}
        for name, values in columns.items():
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise InputError(f"column {name!r} must be a list of values, got {type(values).__name__}", what)
        lengths = {name: len(values) for name, values in columns.items()}
        if len(set(lengths.values())) > 1:
            raise InputError("columns of different lengths: " + ", ".join(f"{name!r} has {length}"
                                                                          for name, length in lengths.items()), what)
        records = [dict(zip(columns, values)) for values in zip(*columns.values())]
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        records = list(data)
        for row, record in enumerate(records, start=1):
            if not isinstance(record, Mapping):
                raise InputError(f"expected a dict per row, got {type(record).__name__}", what, row, unit="row")
    else:
        raise InputError(f"expected a data file, a dict of columns, a DataFrame or a list of row dicts; got a {what}")
    rows = [(row, {str(name): _plain(value) for name, value in record.items()})
            for row, record in enumerate(records, start=1)]
    return Table(what, list(dict.fromkeys(name for _, record in rows for name in record)), rows, unit="row")


def _plain(value: Any) -> Any:
    """A numpy scalar (what a DataFrame column holds) as the Python value; NaN (pandas' missing value) as None."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def find_column(table: Table, given: str | None, usual: Sequence[str], what: str) -> str:
    """The column a flag names if the data has it, else the first usual one it has (tasks whose rows have their
    own column names: the words and tags of NER, the question, context and answers of QA)."""
    for name in (given, *usual):
        if name is not None and name in table.columns:
            check_not_repeated(table, name)
            return name
    wanted = " or ".join(repr(name) for name in dict.fromkeys((given, *usual)) if name is not None)
    raise table.error(f"no column {wanted} ({what}); {_columns_it_has(table)}", table.header_line)


def require_columns(table: Table, names: Sequence[str | None]) -> None:
    """A missing column is an error that lists the columns the file has (JSONL rows are checked one by one)."""
    for name in names:
        if name is not None and name not in table.columns:
            raise table.error(f"no column {name!r}; {_columns_it_has(table)}", table.header_line, field=name)
        check_not_repeated(table, name)


def _columns_it_has(table: Table) -> str:
    """What a missing-column error lists: "the file has 'text', 'label'" ("the data has" for rows in memory)."""
    where = "file" if isinstance(table.path, Path) else "data"
    return f"the {where} has {', '.join(map(repr, table.columns))}"


def check_not_repeated(table: Table, name: str | None) -> None:
    """A column read by a name the header gives two columns is an error: a reader would silently take one."""
    if name in table.repeated:
        raise table.error(f"the header names {table.columns.count(name)} columns {name!r}; rename all but one",
                          table.header_line, field=name)


def cell(table: Table, line: int, row: dict[str, Any], name: str) -> Any:
    if row.get(name) is None:
        raise table.error(f"missing value (the row has {', '.join(map(repr, row))})", line, field=name)
    return row[name]


def text_cell(table: Table, line: int, row: dict[str, Any], name: str) -> str:
    """A text: a JSON number or object where a text belongs is the user's mistake, not something to str()."""
    value = cell(table, line, row, name)
    if not isinstance(value, str):
        raise table.error(f"expected a text, got {json.dumps(value, default=repr)[:40]}", line, field=name)
    return value


# --- examples of text tasks -----------------------------------------------------------------------------------

@dataclass
class Columns:
    """Which columns of a data file hold the text, the optional second text, and the label; and, for multi-label
    data, what separates the labels in a text cell ("sports|politics"); a JSON list is read without one."""

    text: str = "sentence"
    text_pair: str | None = None
    label: str = "label"
    label_separator: str | None = None

    def __post_init__(self):
        check_label_separator(self.label_separator)


def check_label_separator(separator: str | None) -> None:
    """A label separator is visible text (or None: none given); blank, it would split every label apart."""
    if separator is not None and not separator.strip():
        raise ConfigError("label_separator must be a visible character or text, e.g. \"|\" or \";\"")


# The shortest input that holds any text: [CLS], one token, [SEP].
MIN_LENGTH = 3


@dataclass
class EncodeSettings(JsonConfig):
    """How examples become model inputs: the token budget every task has. Each task's settings extend it with its
    own options (classification.ClassificationSettings, ...); a fine-tuning run holds its task's, validated here."""

    max_length: int = 128  # tokens per input

    def __post_init__(self):
        check_number("max_length", self.max_length, minimum=1, integer=True)
        if self.max_length < MIN_LENGTH:  # a model that reads no text would still train and predict
            raise ConfigError(f"max_length={self.max_length} leaves no room for text between [CLS] and [SEP]")


@dataclass
class TextExample:
    text: str
    text_pair: str | None = None
    # A class name, a regression target, the labels of a multi-label example (none: an empty tuple), or None when
    # unlabelled.
    label: str | float | tuple[str, ...] | None = None
    line: int = 0  # where the example came from, for messages
    # The names the data's ClassLabel feature gives its label numbers, in their order (a datasets folder's, a
    # Parquet file's): a model trained on it numbers its labels so. None: the data names no label numbers.
    label_names: tuple[str, ...] | None = field(default=None, compare=False, repr=False)


def class_label(value: Any, separator: str | None = None) -> str:
    """A class label as the string id2label holds: 1 and 1.0 (JSON numbers) and "1" (a CSV cell) are the same label
    (true is "True", as pandas writes it in a CSV file)."""
    if isinstance(value, (list, dict)):
        several = " (several labels per example: --task multi_label)" if isinstance(value, list) else ""
        raise ValueError(f"expected one label, got {json.dumps(value)[:40]}{several}")
    if isinstance(value, float) and math.isnan(value):  # JSON's NaN, as Python's json writes a missing value
        raise ValueError("the label is NaN (a missing label?)")
    if isinstance(value, float) and value.is_integer():  # 1.0 (pandas' float column, as JSON) is the label 1
        value = int(value)
    label = str(value).strip()
    if not label:
        raise ValueError("empty label")
    return label


def as_known(label: Any, known: set[str]) -> Any:
    """A class label as a model's labels spell it: "1" is "1.0" for a model whose labels were read as 1.0 (a JSON
    number with no fraction, before such numbers read as integers)."""
    if isinstance(label, str) and label not in known and label.lstrip("-").isdigit() and f"{label}.0" in known:
        return f"{label}.0"
    return label


def score_label(value: Any, separator: str | None = None) -> float:
    """A regression target: a finite number, from a JSON number or a text cell."""
    if isinstance(value, (list, dict)):
        raise ValueError(f"regression target {json.dumps(value)[:40]} is not a number")
    if str(value).strip() == "":
        raise ValueError("empty label")
    try:
        score = float(value)
    except ValueError:
        raise ValueError(f"regression target {value!r} is not a number") from None
    if not math.isfinite(score) or isinstance(value, bool):
        raise ValueError(f"regression target {value!r} is not a number")
    return score


def label_set(value: Any, separator: str | None = None) -> tuple[str, ...]:
    """The labels of a multi-label example, each once, in the order given: a JSON list (a JSONL value, or a cell
    holding one), or a text cell split at `separator`; without a separator a text cell is one label.

    ["sports", "politics"] and '["sports", "politics"]' and "sports|politics" (separator "|") -> ("sports",
    "politics"); [] -> () (no label applies).
    """
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            value = _python_list(value)  # a list as pandas writes one in a CSV cell: ['grain', 'trade']
            if value is None:
                raise ValueError(f"not a JSON list of labels: {error.msg} (column {error.colno})") from None
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty label; write [] for an example with no labels")
        value = value.split(separator) if separator else [value]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of labels, got {json.dumps(value)[:40]}")
    labels = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise ValueError(f"expected each label to be a text, got {json.dumps(item)[:40]}")
        label = str(item).strip()
        if not label:
            raise ValueError("an empty label in the list")
        labels.append(label)
    return tuple(dict.fromkeys(labels))


def _python_list(text: str) -> list | None:
    """A list of texts and numbers written as Python writes it (pandas' to_csv of a list), else None."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) else None


# Label kind -> parser of one raw label value (and the separator of several labels in a text cell).
LABEL_KINDS: dict[str, Callable[[Any, str | None], str | float | tuple[str, ...]]] = {
    "class": class_label, "score": score_label, "classes": label_set}


def read_text_examples(path: str | Path, columns: Columns, label_kind: str | None,
                       label_names: Sequence[str] | None = None, format: str | None = None) -> list[TextExample]:
    """Text (and pair) examples, labelled when `label_kind` is a LABEL_KINDS key ("class", "score", "classes"),
    unlabelled when None.

    `label_names` (a fine-tuned model's labels) makes any other label an error, so a typo in an evaluation file
    stops before a single batch runs.
    """
    table = read_table(path, format)
    # numbers that the data's ClassLabel feature names (Hugging Face datasets' labels) are read as those names
    names = stored_label_names(path, format).get(columns.label) if label_kind in ("class", "classes") else None
    # (the file is looked at again only when the table is what a plain-text file gives)
    if label_kind is not None and table.columns == [PLAIN_TEXT_COLUMN] and isinstance(path, (str, os.PathLike)) \
            and data_format(path, format) == "txt":
        raise InputError("plain text (one text a line) has no labels: labelled data is a .csv, .tsv or .jsonl file "
                         "(or Parquet) with a label column; a .txt file of tab-separated columns reads with --format "
                         "tsv", path)
    require_columns(table, [columns.text, columns.text_pair] + ([columns.label] if label_kind else []))
    known = set(label_names) if label_names is not None else None
    declared = tuple(names) if names else None
    examples = []
    for line, row in table.rows:
        text = text_cell(table, line, row, columns.text)
        pair = text_cell(table, line, row, columns.text_pair) if columns.text_pair else None
        label = None
        if label_kind is not None:
            raw = cell(table, line, row, columns.label)
            try:
                raw = named(raw, names) if names else raw
                label = LABEL_KINDS[label_kind](raw, columns.label_separator)
            except ValueError as error:
                raise table.error(str(error), line, field=columns.label) from None
            if known is not None:
                label = tuple(as_known(name, known) for name in label) if isinstance(label, tuple) else \
                    as_known(label, known)
            unknown = [name for name in (label if isinstance(label, tuple) else [label])
                       if known is not None and name not in known]
            if unknown:
                raise table.error(f"label {unknown[0]!r} is not one of the model's labels ({', '.join(sorted(known))})",
                                  line, field=columns.label)
        examples.append(TextExample(text, pair, label, line, declared))
    return examples


def stored_label_names(data: Any, format: str | None = None) -> dict[str, list[str]]:
    """The names a datasets folder, a Parquet file datasets wrote, or a datasets.Dataset keep for its columns'
    label numbers (ClassLabel features), per column; {} for other data."""
    if not isinstance(data, (str, os.PathLike)):
        return arrow_files.class_names(data)
    kind = format or _saved_format(Path(data))
    return arrow_files.class_names(Path(data), kind) if kind in arrow_files.READERS else {}


def _saved_format(path: Path) -> str | None:
    """A datasets folder's format, else the one the file's extension names (None for an extension no reader has)."""
    return "hf_dataset" if arrow_files.is_saved_dataset(path) else EXTENSIONS.get(content_suffix(path))


def listed(value: Any) -> Any:
    """A list cell as a list: a DataFrame's cells hold numpy arrays where a file's rows hold lists."""
    return value.tolist() if hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1 else value


def named(value: Any, names: Sequence[str]) -> Any:
    """A label number (or a list of them) as the name a ClassLabel gives it; other values as they are."""
    if isinstance(value, list):
        return [named(item, names) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(names):
            raise ValueError(f"label {value} is not one of the data's label numbers (0 to {len(names) - 1})")
        return names[value]
    return value


# --- features and batches -------------------------------------------------------------------------------------

@dataclass
class Features:
    """Model inputs, one dict per row (input_ids, token_type_ids, labels, ...), and the example of each row
    (several rows share an example when a long text is split into windows)."""

    rows: list[dict[str, Any]]
    example_index: list[int]
    truncated: int = 0  # examples cut to max_length
    notes: list[str] = field(default_factory=list)
    extras: list[Any] = field(default_factory=list)  # per row, what decoding needs (word positions, offsets)
    settings: EncodeSettings | None = None  # how they were made; decoding reads its options (version_2) here

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return [len(row["input_ids"]) for row in self.rows]


def loss_terms(rows: Sequence[dict[str, Any]]) -> int:
    """How many terms the model's mean loss over `rows` averages: labelled tokens for per-token labels (ignored
    positions are not terms), else rows."""
    if rows and isinstance(rows[0].get("labels"), list):
        return sum(label != IGNORE_INDEX for row in rows for label in row["labels"])
    return len(rows)


class FeatureBatches:
    """Collated batches of `features` in the order of an index sampler; re-iterable (one pass per epoch).

    Rank `rank` of `world_size` processes (torchrun) yields a Shard of every global batch: its rows rank,
    rank + world_size, ... (every process draws the same global order from the same seed), so that the global
    batch, and so each optimizer step, is the one a single process takes."""

    def __init__(self, features: Features, sampler, pad_token_id: int, rank: int = 0, world_size: int = 1):
        self.features, self.sampler, self.pad_token_id = features, sampler, pad_token_id
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor] | Shard]:
        for indices in self.sampler:
            rows = [self.features.rows[i] for i in indices]
            if self.world_size == 1:
                yield collate(rows, self.pad_token_id)
                continue
            own = rows[self.rank::self.world_size]
            terms = loss_terms(own)
            if terms == 0:  # nothing to learn from (a small last batch): it steps with the others on a row that
                own = next(([row] for row in rows if loss_terms([row])), rows[:1])  # counts for nothing
            yield Shard(collate(own, self.pad_token_id), terms / max(loss_terms(rows), 1))


def training_batches(features: Features, batch_size: int, pad_token_id: int, seed: int, rank: int = 0,
                     world_size: int = 1) -> FeatureBatches:
    """Length-grouped batches of `batch_size` rows in a seeded order; under torchrun each process's shard of them."""
    return FeatureBatches(features, LengthGroupedBatches(features.lengths(), batch_size, seed), pad_token_id,
                          rank, world_size)


def inference_batches(features: Features, batch_size: int, pad_token_id: int, keys: Sequence[str] = MODEL_INPUTS,
                      ) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """(row indices, batch of the model inputs `keys`) in length-sorted order, for evaluation and prediction."""
    for indices in length_sorted_batches(features.lengths(), batch_size):
        rows = [{key: features.rows[i][key] for key in keys if key in features.rows[i]} for i in indices]
        yield indices, collate(rows, pad_token_id)


@torch.inference_mode()
def forward_rows(model: nn.Module, rows: Sequence[dict[str, Any]], read: Callable[[Any], tuple[torch.Tensor, ...]]
                 ) -> list[tuple[torch.Tensor, ...]]:
    """The model on `rows` as one padded batch; per row, the per-token outputs `read(model output)` picks, float32
    (a float64 model's float64) on the CPU and cut to the row's length: read=lambda output: (output.logits,) gives
    each row's (seq, labels) logits. Evaluation, prediction and the server's batcher all run rows through here."""
    device = next(model.parameters()).device
    batch = collate([{key: row[key] for key in MODEL_INPUTS if key in row} for row in rows], model.config.pad_token_id)
    tensors = [(tensor if tensor.dtype == torch.float64 else tensor.float()).cpu()  # a float64 model's kept
               for tensor in read(model(**{k: v.to(device) for k, v in batch.items()}))]
    return [tuple(tensor[slot, :len(row["input_ids"])] for tensor in tensors) for slot, row in enumerate(rows)]


def row_outputs(model: nn.Module, features: Features, batch_size: int,
                read: Callable[[Any], tuple[torch.Tensor, ...]]) -> list[tuple[torch.Tensor, ...]]:
    """forward_rows over every row of `features`, in length-sorted batches of `batch_size`, in eval mode."""
    was_training = model.training
    model.eval()
    outputs: list[tuple[torch.Tensor, ...]] = [()] * len(features)
    for indices in length_sorted_batches(features.lengths(), batch_size):
        for row, output in zip(indices, forward_rows(model, [features.rows[i] for i in indices], read)):
            outputs[row] = output
    model.train(was_training)
    return outputs
