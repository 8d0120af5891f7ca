"""Parquet files and Hugging Face `datasets` folders (save_to_disk: state.json + Arrow stream files) -> columns and
rows, read with pyarrow (the optional extra bertforge[arrow]); the datasets library is not needed to read them.
The tasks read their rows here, and pre-training its corpora (a column of text, streamed).

Errors name the file (or folder) as the CSV/JSONL readers do; tables.read_table turns the rows into a Table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bertforge.errors import InputError, no_such_file

STATE_FILE = "state.json"  # a Dataset folder: its Arrow files, in order
DATASET_INFO_FILE = "dataset_info.json"
DATASET_DICT_FILE = "dataset_dict.json"  # a DatasetDict folder: one Dataset folder per split

Records = tuple[list[str], list[dict[str, Any]]]  # column names, one dict per row


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a folder written by datasets' save_to_disk (one split, or a DatasetDict of splits)."""
    return path.is_dir() and any((path / name).is_file() for name in (STATE_FILE, DATASET_DICT_FILE))


def _pyarrow(path: Path):
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (a submodule: imported so that pyarrow.parquet is bound)
    except ImportError:
        raise InputError("reading Parquet and datasets folders needs pyarrow: pip install \"bertforge[arrow]\"",
                         path) from None
    return pyarrow


def _records(table) -> Records:
    return list(table.column_names), table.to_pylist()


def read_parquet(path: Path) -> Records:
    pyarrow = _pyarrow(path)
    if path.is_dir():
        raise InputError("is a folder, expected a Parquet file", path)
    if not path.exists():
        raise no_such_file(path)
    try:
        return _records(pyarrow.parquet.read_table(path))
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"not a readable Parquet file ({error})", path) from None


def read_saved_dataset(path: Path) -> Records:
    """The rows of a Dataset folder, its Arrow files read in the order state.json lists them. A DatasetDict folder
    is refused with its splits named, one of which is the folder to give (e.g. data/train)."""
    pyarrow = _pyarrow(path)
    if not path.is_dir():
        raise InputError("no such folder" if not path.exists() else
                         f"is a file, expected a folder written by datasets' save_to_disk (with {STATE_FILE})", path)
    tables = []
    for file in _arrow_files(path):
        with _reading(pyarrow, file, saved=True), pyarrow.memory_map(str(file)) as source:
            tables.append(pyarrow.ipc.open_stream(source).read_all())
    try:
        return _records(pyarrow.concat_tables(tables))
    except pyarrow.ArrowException as error:
        raise InputError(f"its Arrow files have different columns ({error})", path) from None


def _arrow_files(path: Path) -> list[Path]:
    """A Dataset folder's Arrow stream files, in the order its state.json lists them. A DatasetDict folder is
    refused with its splits named, one of which is the folder to give (e.g. data/train)."""
    if (path / DATASET_DICT_FILE).is_file():
        splits = _json(path / DATASET_DICT_FILE).get("splits") or []
        example = f"; give one split's folder, e.g. {path / splits[0]}" if splits else ""
        raise InputError(f"holds the splits {', '.join(map(str, splits))} (a DatasetDict){example}", path)
    files = _json(path / STATE_FILE).get("_data_files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("filename"), str)
                                              for f in files):
        raise InputError("no list of Arrow files (\"_data_files\": [{\"filename\": ...}])", path / STATE_FILE)
    if not files:
        raise InputError("the dataset has no Arrow files", path / STATE_FILE)
    return [path / entry["filename"] for entry in files]


def column_values(path: Path, column: str, hint: str = "") -> Iterator[Any]:
    """One column's values, row by row, of a Parquet file or a datasets folder (one split), read a record batch at
    a time, so that a pre-training corpus need not fit in memory. `hint` ends the error for a missing column."""
    pyarrow = _pyarrow(path)
    saved = is_saved_dataset(path)
    for file in _arrow_files(path) if saved else [path]:
        with _reading(pyarrow, file, saved), pyarrow.memory_map(str(file)) if saved else open(file, "rb") as source:
            batches = pyarrow.ipc.open_stream(source) if saved else pyarrow.parquet.ParquetFile(source)
            names = batches.schema.names if saved else batches.schema_arrow.names
            if column not in names:
                raise InputError(f"no column {column!r} (it has {', '.join(map(repr, names))}){hint}", file)
            for batch in batches if saved else batches.iter_batches(columns=[column]):
                yield from batch.column(column).to_pylist()


@contextmanager
def _reading(pyarrow, file: Path, saved: bool) -> Iterator[None]:
    """Errors while reading a datasets folder's Arrow file (`saved`) or a Parquet file, as one line naming it."""
    try:
        yield
    except FileNotFoundError:
        raise (InputError("no such file (listed in state.json)", file) if saved else no_such_file(file)) from None
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"not a readable {'Arrow stream' if saved else 'Parquet file'} ({error})", file) from None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise no_such_file(path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"unreadable JSON ({error})", path) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", path)
    return data


def class_names(data: Any, kind: str | None = None) -> dict[str, list[str]]:
    """The names datasets gave a column's integer labels (a ClassLabel feature, or a list of them: NER tags), per
    column: from a datasets folder's dataset_info.json, a Parquet file's metadata (as datasets writes it) or a
    datasets.Dataset in memory; {} where none are kept."""
    features = None
    if kind == "hf_dataset" and (Path(data) / DATASET_INFO_FILE).is_file():
        features = _json(Path(data) / DATASET_INFO_FILE).get("features")
    elif kind == "parquet":
        metadata = _pyarrow(Path(data)).parquet.read_schema(data).metadata or {}
        try:
            features = json.loads(metadata.get(b"huggingface", b"{}")).get("info", {}).get("features")
        except (ValueError, AttributeError):
            features = None
    elif kind is None and hasattr(getattr(data, "features", None), "to_dict"):
        features = data.features.to_dict()
    if not isinstance(features, dict):
        return {}
    named = {column: _names(feature) for column, feature in features.items()}
    return {column: names for column, names in named.items() if names}


def _names(feature: Any) -> list[str] | None:
    """A ClassLabel's names, found in it or in the feature it lists ({"feature": {"names": [...]}})."""
    while isinstance(feature, dict):
        names = feature.get("names")
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            return names
        feature = feature.get("feature")
    return None


# Format name (tables.DATA_FORMATS) -> reader of a path.
READERS: dict[str, Callable[[Path], Records]] = {"parquet": read_parquet, "hf_dataset": read_saved_dataset}
