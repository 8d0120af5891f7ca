"""Data files as users keep them: plain, or compressed with gzip, bzip2 or xz, told by the last suffix (train.csv.gz
holds CSV). Every reader of text, tables, CoNLL, SQuAD and corpora opens files here, so any of them reads a
compressed file as it reads the plain one, and bad compressed data is a one-line error naming the file."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from bertforge.errors import InputError

# suffix -> (the compression's name, a reader of the plain bytes over the stored ones)
COMPRESSIONS: dict[str, tuple[str, Callable[[BinaryIO], BinaryIO]]] = {
    ".gz": ("gzip", lambda stored: gzip.GzipFile(fileobj=stored)),
    ".bz2": ("bzip2", bz2.BZ2File),
    ".xz": ("xz", lzma.LZMAFile),
}
COMPRESSED_NAMES = "compressed as .gz, .bz2 or .xz"  # how messages name what may wrap a data file
# Compressions and archives that the standard library does not read: suffix -> the command that unpacks them.
UNREAD_COMPRESSIONS = {".zst": "zstd -d", ".zstd": "zstd -d", ".lz4": "lz4 -d", ".zip": "unzip", ".7z": "7z x",
                       ".tar": "tar -xf", ".tgz": "tar -xzf"}

LINE_BREAK = re.compile(r"\r\n|\r|\n")

# What a damaged or mislabelled compressed file raises while it is read (gzip's BadGzipFile is an OSError).
DAMAGED = (OSError, EOFError, lzma.LZMAError)


def content_suffix(path: str | Path) -> str:
    """The suffix that says what a file holds, lower-cased: ".csv" for train.csv and for train.csv.gz."""
    path = Path(path)
    suffix = path.suffix.lower()
    return Path(path.stem).suffix.lower() if suffix in COMPRESSIONS else suffix


def is_compressed(path: str | Path) -> bool:
    return Path(path).suffix.lower() in COMPRESSIONS


@contextmanager
def opened(path: str | Path) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """(the file's plain bytes, the file as stored) open for reading; the stored file's tell() is how far reading
    has got, for progress. Opening raises what open() raises (FileNotFoundError, IsADirectoryError); reading
    damaged compressed data raises one of DAMAGED (see `damaged`)."""
    unpack = UNREAD_COMPRESSIONS.get(Path(path).suffix.lower())
    if unpack and Path(path).is_file():
        raise InputError(f"bertforge reads files {COMPRESSED_NAMES}, not {Path(path).suffix}: unpack it first "
                         f"({unpack} {Path(path).name})", Path(path))
    with open(path, "rb") as stored:
        compression = COMPRESSIONS.get(Path(path).suffix.lower())
        if compression is None:
            yield stored, stored
            return
        with compression[1](stored) as plain:
            yield plain, stored


def damaged(path: str | Path, error: BaseException) -> InputError:
    """The one-line error for a file (compressed data, mostly) that could not be read."""
    what = f"{COMPRESSIONS[Path(path).suffix.lower()][0]} data" if is_compressed(path) else "file"
    return InputError(f"can't read the {what} ({error})", Path(path))


def decode_text(raw: bytes, where: str | Path) -> str:
    """UTF-8 bytes as text, without a byte-order mark; invalid bytes are an error naming `where` and their line."""
    check_not_utf16(raw[:4096], where)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(f"not valid UTF-8 text: {CONVERT_HINT}", where,
                         line=raw[:error.start].count(b"\n") + 1) from None


CONVERT_HINT = "convert it to UTF-8 first (e.g. iconv -f cp1252 -t utf-8 FILE > FILE.utf8, or save it as UTF-8)"


def check_not_utf16(start: bytes, where: str | Path) -> None:
    """Refuse UTF-16 (Excel's "Unicode text", Windows tools), told by its byte-order mark, or by the NUL byte beside
    each ASCII character, at the start of a file."""
    if start.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(start) >= 4 and start.count(b"\x00") > len(start) // 4):
        raise InputError(f"is UTF-16 text, expected UTF-8: {CONVERT_HINT.replace('cp1252', 'utf-16')}", where)


def split_lines(text: str) -> list[str]:
    """A one-text-per-line file's lines, blank ones too, as Python's text files and editors read them: split at
    "\n", "\r\n" or "\r" alone (an old Mac file), not at the other breaks str.splitlines knows (a form feed or
    U+2028 inside a line is text)."""
    lines = LINE_BREAK.split(text)
    if lines[-1] == "":
        lines.pop()  # after the last line's newline
    return lines


def read_bytes(path: str | Path) -> bytes:
    """All of a file's plain bytes."""
    try:
        with opened(path) as (plain, _):
            return plain.read()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except DAMAGED as error:
        raise damaged(path, error) from None


def byte_lines(path: str | Path) -> Iterator[tuple[bytes, int]]:
    """Each line of a file's plain bytes, split where split_lines splits text ("\n", "\r\n" or a lone "\r"), and
    how many stored bytes reading it took (0 for most lines of a compressed file, which is read in blocks); one
    line at a time."""
    try:
        with opened(path) as (plain, stored):
            position = 0
            for line in plain:
                now = stored.tell()
                size, position = now - position, now
                for part in _at_lone_returns(line):
                    yield part, size
                    size = 0
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except DAMAGED as error:
        raise damaged(path, error) from None


def _at_lone_returns(line: bytes) -> list[bytes]:
    """A line read up to "\n", cut after each "\r" that no "\n" follows (an old Mac file is one such line)."""
    ending = b"\r\n" if line.endswith(b"\r\n") else b"\n" if line.endswith(b"\n") else b""
    body = line[:len(line) - len(ending)]
    if b"\r" not in body:
        return [line]
    parts = [part + b"\r" for part in body.split(b"\r")]
    parts[-1] = parts[-1][:-1] + ending
    return parts if parts[-1] else parts[:-1]  # a file that ends with its last "\r"
