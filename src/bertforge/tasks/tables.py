"""Data files as tables: CSV/TSV/JSONL/JSON/Parquet files, datasets folders or rows in memory -> a Table of rows by
column name, each row with the line (or row) it came from, so that every error names the file, the line and the
column; which format a file is in (its extension, else a look at its first lines); the cells a task reads.

GLUE's .tsv files are read as they are: tab-separated with no quoting (their texts contain stray quotes); a .tsv
that pandas or datasets wrote, quoting some texts, as they read it back.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge import arrow_files
from bertforge.data_files import COMPRESSED_NAMES, DAMAGED, content_suffix, decode_text, opened, read_bytes, split_lines
from bertforge.errors import InputError, no_such_file

PLAIN_TEXT_COLUMN = "text"  # the one column of a .txt file (one text per line)

# json.loads recurses per level: a value nested thousands deep exhausts the stack (RecursionError).
TOO_DEEP = "a JSON value nested too deeply to read"


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


# What an error about columns adds where the first line, read as the column names, holds a number.
HEADERLESS = " (its first line, read as the column names, looks like data: add a header line)"


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
                    raise InputError(f"the row has {len(values)} fields, the header has {len(header)}"
                                     f"{HEADERLESS if _looks_like_data(header) else ''}", path, line)
                rows.append((line, dict(zip(header, values))))
            line = reader.line_num + 1
    except csv.Error as error:
        reason = ("a quote opened in this row is never closed" if "end of data" in str(error)
                  else f"malformed quoting ({error})")
        raise InputError(reason, path, line) from None
    return Table(path, header, rows, repeated=frozenset(name for name in header if header.count(name) > 1))


def _csv_delimiter(text: str) -> str:
    """"," or, for a header line with semicolons and no comma, ";": Excel's CSV where the decimal mark is a comma
    (and pandas' to_csv(sep=";"))."""
    header = text.lstrip("\ufeff").split("\n", 1)[0]
    return ";" if ";" in header and "," not in header else ","


def _read_delimited_or_quoted(path: Path, text: str) -> Table:
    """A .tsv file: GLUE's have no quoting (their texts hold stray quotes, read as they are); pandas' and datasets'
    to_csv(sep="\\t") quote a text that holds a quote, tab or line break, doubling its quotes. The file is read
    with that quoting only where it is what such a writer writes: quoted, its rows written back give the file."""
    try:
        unquoted = _read_delimited(path, text, "\t", csv.QUOTE_NONE)
    except InputError as error:
        unquoted, failure = None, error
    if unquoted is not None and '"' not in text:
        return unquoted
    try:
        quoted = _read_delimited(path, text, "\t", csv.QUOTE_MINIMAL)
    except InputError:
        if unquoted is None:
            raise failure from None
        return unquoted
    if unquoted is None or (quoted.rows != unquoted.rows and _written_so(text)):
        return quoted
    return unquoted


def _written_so(text: str) -> bool:
    """Whether a csv writer gives back `text` from its own quoted reading, quoting as pandas' to_csv may: the fields
    that need it (its default), every field, or every field but numbers. A GLUE text's stray quote ('"a gripping
    tale' opening a row, 'he said ""art""') reads otherwise and is written back otherwise."""
    def lines(value: str) -> str:
        return value.replace("\r\n", "\n").removesuffix("\n")

    rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_MINIMAL))
    for quoting, field in ((csv.QUOTE_MINIMAL, str), (csv.QUOTE_ALL, str),
                           (csv.QUOTE_NONNUMERIC, lambda value: _Written(value) if _is_number(value) else value)):
        written = io.StringIO()
        csv.writer(written, delimiter="\t", quoting=quoting, lineterminator="\n").writerows(
            [[field(value) for value in row] for row in rows])
        if lines(written.getvalue()) == lines(text):
            return True
    return False


class _Written(float):
    """A number as the file wrote it ("3.800", not 3.8), which QUOTE_NONNUMERIC leaves unquoted."""

    def __new__(cls, text: str):
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def _read_jsonl(path: Path, text: str) -> Table:
    """JSON lines; also a JSON array of objects, and an object whose "data" holds them (transformers' run_qa and
    datasets' JSON loader read those with field="data")."""
    start = text.lstrip()
    if start.startswith("["):
        return _read_json_array(path, text)
    if start.startswith("{"):
        try:
            document = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            document = None  # several objects: JSON lines (a line nested too deeply is named below)
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
        except RecursionError:
            raise InputError(TOO_DEEP, path, line) from None
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
    except RecursionError:
        raise InputError(TOO_DEEP, path) from None
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
    ".csv": lambda path, text: _read_delimited(path, text, _csv_delimiter(text), csv.QUOTE_MINIMAL),
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
        raise a_folder(path)
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
        except (ValueError, RecursionError):
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
        raise a_folder(path)
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
        raise a_folder(path) from None
    return _nonempty(READERS[kind](path, decode_text(raw, path)))


def a_folder(path: Path) -> InputError:
    """The error for a folder given as a data file, naming the data files in it (the Hub's data/ folder holds a
    split's Parquet shards, train-00000-of-00002.parquet, ...)."""
    inside = sorted(file.name for file in path.iterdir() if content_suffix(file) in EXTENSIONS)
    held = f" (it holds {', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''}: give one, or join the shards " \
        "of a split into one file first)" if inside else ""
    return InputError(f"is a directory, expected a data file{held}", path)


def _nonempty(table: Table) -> Table:
    if not table.rows:
        raise table.error("the file has no examples" if isinstance(table.path, Path) else "no examples")
    return table


def table_from_data(data: Any) -> Table:
    """Rows given in memory: a dict of columns (name -> list of values), a DataFrame-like object (pandas, polars,
    datasets.Dataset: `columns` or `column_names`, and `data[name]`), or a list of row dicts. Rows are numbered
    from 1 in messages; a NaN (a DataFrame's missing value) counts as missing."""
    what = type(data).__name__
    if isinstance(data, Mapping) and data and all(hasattr(split, "column_names") for split in data.values()):
        splits = list(data)  # a datasets.DatasetDict: splits, not columns
        raise InputError(f"holds the splits {', '.join(map(repr, splits))} (a DatasetDict): give one, "
                         f"e.g. data[{splits[0]!r}]", what)
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


def require_columns(table: Table, names: dict[str, str | None]) -> None:
    """A missing column is an error that lists the columns the file has and the flag that names the column
    (`names`: flag -> column; JSONL rows are checked one by one)."""
    for flag, name in names.items():
        if name is not None and name not in table.columns:
            raise table.error(f"no column {name!r} ({flag} names it); {_columns_it_has(table)}", table.header_line,
                              field=name)
        check_not_repeated(table, name)


def _columns_it_has(table: Table) -> str:
    """What a missing-column error lists: "the file has 'text', 'label'" ("the data has" for rows in memory)."""
    where = "file" if isinstance(table.path, Path) else "data"
    listed = f"the {where} has {', '.join(map(repr, table.columns))}"
    if table.unit == "line" and _looks_like_data(table.columns):
        # CoLA's and STS-B's original .tsv files have no header: their first example became the column names
        listed += HEADERLESS
    return listed


def _looks_like_data(header: Sequence[str]) -> bool:
    """A first line that is an example, not column names: a number beside a sentence (CoLA's 'gj04', '0', '',
    'Our friends will not buy this analysis.'), where a header of years ('name', '2019', '2020') is none."""
    return any(map(_is_number, header)) and any(len(name.split()) >= 4 for name in header)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


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
        # pandas' to_json() writes a column a JSON object, {"0": text, "1": text, ...}
        layout = " (a DataFrame's to_json() of columns? write it with orient=\"records\", lines=True)" \
            if isinstance(value, dict) else ""
        raise table.error(f"expected a text, got {json.dumps(value, default=repr)[:40]}{layout}", line, field=name)
    return value


# --- examples of text tasks -----------------------------------------------------------------------------------


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
