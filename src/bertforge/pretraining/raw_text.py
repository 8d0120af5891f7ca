"""A pre-training corpus as lines of text and document ends, in the layouts corpora come in:

- plain text (BERT's create_pretraining_data): one sentence or paragraph a line, a blank line between documents;
  or WikiExtractor's articles, each between a `<doc id=... title=...>` and a `</doc>` line (not text), where blank
  lines separate paragraphs;
- JSON lines (C4, OpenWebText, WikiExtractor --json, datasets' to_json): a record is a document, its "text" field
  (or another, `text_field`) its lines;
- Parquet files and datasets folders (save_to_disk): a row is a document, its "text" column its lines.

Plain and JSON-lines files may be compressed (bertforge.data_files). The end of a file ends a document, and a
folder that is not a datasets folder stands for the files under it (WikiExtractor writes AA/wiki_00, AA/wiki_01...).
`pretrain prepare` and `vocab` read corpora here, so both see the same text.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from bertforge import arrow_files
from bertforge.data_files import CONVERT_HINT, byte_lines, check_not_utf16, content_suffix, split_lines
from bertforge.errors import InputError, no_such_file

DOCUMENT_END = ""  # what corpus_lines yields between documents
TEXT_FIELD = "text"
JSON_LINES_SUFFIXES = (".jsonl", ".json", ".ndjson")
_WIKIEXTRACTOR_TAG = re.compile(r"<doc(\s[^>]*)?>|</doc>")
_FIELD_HINT = "; name the text's field with --text-field"

# What a line gives: (its line or row number, its text without surrounding whitespace or DOCUMENT_END, the stored
# bytes read for it, for progress).
Line = tuple[int, str, int]


def corpus_files(paths: Iterable[str | Path]) -> list[Path]:
    """The sources a corpus is read from: each file given, each datasets folder, and every file under any other
    folder (hidden ones left out), in name order."""
    files = []
    for path in map(Path, paths):
        if not path.exists():
            raise no_such_file(path, "corpus file")
        if path.is_dir() and not arrow_files.is_saved_dataset(path):
            found = sorted(_files_under(path))
            if not found:
                raise InputError("is a folder without files", path)
            files.extend(found)
        elif path.is_dir() or path.is_file():
            files.append(path)
        else:
            raise InputError("is not a file (a pipe or a device): save the text to a file", path)
    return files


def _files_under(folder: Path) -> Iterator[Path]:
    """Every file under a folder, hidden ones left out, linked folders followed (each real folder once)."""
    seen = set()
    for current, folders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            folders[:] = []
            continue
        seen.add(real)
        folders[:] = [name for name in folders if not name.startswith(".")]
        yield from (Path(current, name) for name in names if not name.startswith("."))


def source_bytes(path: Path) -> int:
    """A source's size on disk: a file's, or a datasets folder's files together."""
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) if path.is_dir() else \
        path.stat().st_size


def corpus_layout(path: Path) -> str:
    """"rows" (Parquet, a datasets folder), "json_lines" (by the suffix, or a first line that is a JSON object) or
    "text"."""
    if path.is_dir() or content_suffix(path) == ".parquet":
        return "rows"
    if content_suffix(path) == ".arrow":
        raise InputError("an Arrow file of a datasets folder: give the folder save_to_disk wrote (with state.json)",
                         path)
    if content_suffix(path) in JSON_LINES_SUFFIXES:
        return "json_lines"
    if content_suffix(path):  # a .txt (or any named) file is text, whatever its first line holds
        return "text"
    for _, text, _ in _decoded_lines(path):  # WikiExtractor --json writes wiki_00, with no suffix
        if text:
            return "json_lines" if text.startswith("{") and _json_object(text) is not None else "text"
    return "text"


def corpus_lines(path: Path, text_field: str = TEXT_FIELD) -> Iterator[Line]:
    """A source's lines of text, and DOCUMENT_END after each document (the last included)."""
    readers = {"text": _plain_text_lines, "json_lines": _json_lines, "rows": _row_lines}
    yield from readers[corpus_layout(path)](path, text_field)


def corpus_texts(paths: Iterable[str | Path], text_field: str = TEXT_FIELD) -> Iterator[str]:
    """Every line of text of a corpus, without the document ends (what a vocabulary is learnt from)."""
    for path in corpus_files(paths):
        yield from (text for _, text, _ in corpus_lines(path, text_field) if text)


def _plain_text_lines(path: Path, text_field: str) -> Iterator[Line]:
    in_article = False  # between WikiExtractor's <doc> and </doc>, where a blank line separates paragraphs
    skipped = 0  # bytes of the lines left out, counted with the next one (for progress)
    for number, text, size in _decoded_lines(path):
        if _WIKIEXTRACTOR_TAG.fullmatch(text):
            in_article = text.startswith("<doc")
            yield number, DOCUMENT_END, size + skipped
        elif text or not in_article:
            yield number, text, size + skipped
        else:
            skipped += size
            continue
        skipped = 0
    yield 0, DOCUMENT_END, skipped


def _json_lines(path: Path, text_field: str) -> Iterator[Line]:
    skipped = 0  # bytes of blank lines, counted with the next record (for progress)
    for number, line, size in _decoded_lines(path):
        if not line:
            skipped += size
            continue
        size, skipped = size + skipped, 0
        record = _json_object(line)
        if record is None:
            raise InputError("not a JSON object: JSON lines hold one object (a document) a line (a JSON array is not "
                             "read here)", path, line=number)
        if text_field not in record:
            raise InputError(f"no field {text_field!r} (the record has {', '.join(map(repr, record))}){_FIELD_HINT}",
                             path, line=number)
        yield from _document(record[text_field], number, size, path)


def _row_lines(path: Path, text_field: str) -> Iterator[Line]:
    for number, text in enumerate(arrow_files.column_values(path, text_field, _FIELD_HINT), 1):
        yield from _document(text, number, 0, path)
    yield 0, DOCUMENT_END, source_bytes(path)


def _document(text: object, number: int, size: int, path: Path) -> Iterator[Line]:
    """A record's text as its lines, then DOCUMENT_END; a null text is an empty document."""
    if text is not None and not isinstance(text, str):
        raise InputError(f"the text is a {type(text).__name__}, expected a string", path, line=number)
    for line in split_lines(text or ""):
        if line.strip():
            yield number, line.strip(), size
            size = 0
    yield number, DOCUMENT_END, size


def _json_object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _decoded_lines(path: Path) -> Iterator[Line]:
    """(line number, text without surrounding whitespace, stored bytes read) of each line of a plain or compressed
    text file, one at a time; bad UTF-8 is an error naming its line (and UTF-16, its encoding)."""
    try:
        for number, (raw, size) in enumerate(byte_lines(path), 1):
            if number == 1:
                check_not_utf16(raw, path)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(f"not valid UTF-8 text ({error.reason} at byte {error.start} of the line): "
                                 f"{CONVERT_HINT}", path, line=number) from None
            if number == 1:
                text = text.removeprefix("\ufeff")  # a byte-order mark is not text
            yield number, text.strip(), size
    except FileNotFoundError:
        raise no_such_file(path, "corpus file") from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a text file", path) from None
