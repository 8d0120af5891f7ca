"""Raw text -> token-id shards on disk (prepare_corpus), and documents read back from them (CorpusReader).

Input layout (BERT's create_pretraining_data): one sentence or paragraph per line, a blank line between documents;
the end of a file ends a document too; or JSON lines, Parquet or a datasets folder, a document per record
(raw_text). Output folder:

    shard-00000.tokens.npy     (tokens,) uint16/uint32: every sentence's ids back to back, no special tokens
    shard-00000.sentences.npy  (sentences + 1,) int64: sentence k is tokens[sentences[k]:sentences[k + 1]]
    shard-00000.documents.npy  (documents + 1,) int64: document d is sentences documents[d] to documents[d + 1]
    ...
    tokenizer/                 the tokenizer that made the ids (vocab.txt, tokenizer_config.json): training reads it
    manifest.json              counts, dtype, sources, tokenizer identity; written last, so a folder without it
                               holds an unfinished preparation

A shard ends at the first document boundary after `shard_tokens` tokens, so documents never straddle shards and
memory holds at most one shard (plus one document) however large the corpus.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.atomic import save_array, write_text_atomic
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.pretraining.raw_text import DOCUMENT_END, TEXT_FIELD, corpus_files, corpus_lines, source_bytes
from bertforge.progress import progress_bar
from bertforge.tokenizer.tokenizer import BertTokenizer
from bertforge.tokenizer.vocab import SPECIAL_TOKENS
from bertforge.validation import check_number

logger = logging.getLogger("bertforge")

MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"  # the corpus's own tokenizer, so that training needs no --vocab
STAGING_DIR = ".incomplete"  # where a preparation writes, inside the corpus folder, until the corpus is complete
FORMAT = "bertforge-pretraining-corpus"
VERSION = 1
DEFAULT_SHARD_TOKENS = 1 << 26  # 64M tokens: 128 MiB of uint16 per shard
# The three arrays of a shard, by the suffix of their file name.
SHARD_ARRAYS = ("tokens", "sentences", "documents")
UINT16_VOCAB_LIMIT = 1 << 16


@dataclass(frozen=True)
class CorpusSummary:
    documents: int
    sentences: int
    tokens: int
    shards: int
    unknown: int = 0  # [UNK] tokens: characters (or a case) the vocabulary lacks

    def __str__(self) -> str:
        return (f"{self.documents:,} documents, {self.sentences:,} sentences, {self.tokens:,} tokens "
                f"in {self.shards} shard{'s' if self.shards != 1 else ''}")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocabularies up to 65,536 tokens), else uint32: half the disk and page cache."""
    return np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB_LIMIT else np.uint32)


def shard_path(directory: Path, index: int, array_name: str) -> Path:
    return directory / f"shard-{index:05d}.{array_name}.npy"


def tokenizer_identity(tokenizer: BertTokenizer) -> dict[str, Any]:
    """What decides the ids: the settings plus a hash of the vocabulary (two vocab.txt files can share a size)."""
    vocab_hash = hashlib.sha256("\n".join(tokenizer.vocab.id_to_token).encode("utf-8")).hexdigest()
    return {
        "vocab_size": len(tokenizer),
        "vocab_sha256": vocab_hash,
        "do_lower_case": tokenizer.do_lower_case,
        "strip_accents": tokenizer.strip_accents,
        "tokenize_chinese_chars": tokenizer.tokenize_chinese_chars,
        "special_token_ids": {role: tokenizer.vocab.special_id(role) for role in SPECIAL_TOKENS},
    }


# ---------------------------------------------------------------- writing shards


class ShardWriter:
    """Collects sentences and document ends; writes a shard each time one fills, at a document boundary."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards: list[dict[str, int]] = []
        self.content = hashlib.sha256()  # of every array written: two corpora can share their counts
        self._start_shard()

    def _start_shard(self) -> None:
        # array.array grows in C and stores 2 or 4 bytes per id, where a list of ints costs 28+8 bytes each.
        self.tokens = array("H" if self.dtype == np.uint16 else "I")
        self.sentence_ends = array("q")  # token count after each sentence of the shard
        self.document_ends = array("q")  # sentence count after each document of the shard
        self.open_sentences = 0  # sentences of the document being read

    def add_sentence(self, ids: Sequence[int]) -> None:
        self.tokens.extend(ids)
        self.sentence_ends.append(len(self.tokens))
        self.open_sentences += 1

    def end_document(self) -> None:
        if self.open_sentences == 0:  # blank lines in a row, or a document of lines without tokens
            return
        self.document_ends.append(len(self.sentence_ends))
        self.open_sentences = 0
        if len(self.tokens) >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        """Write the finished documents as the next shard (nothing when there are none)."""
        if not self.document_ends:
            return
        index = len(self.shards)
        arrays = {
            "tokens": np.frombuffer(self.tokens, dtype=self.dtype),
            "sentences": np.concatenate([[0], np.frombuffer(self.sentence_ends, dtype=np.int64)]),
            "documents": np.concatenate([[0], np.frombuffer(self.document_ends, dtype=np.int64)]),
        }
        for name, values in arrays.items():
            save_array(shard_path(self.directory, index, name), values)
            self.content.update(values.tobytes())
        self.shards.append({"documents": len(self.document_ends), "sentences": len(self.sentence_ends),
                            "tokens": len(self.tokens)})
        self._start_shard()


def prepare_corpus(paths: Sequence[str | Path], tokenizer: BertTokenizer, output_dir: str | Path,
                   shard_tokens: int = DEFAULT_SHARD_TOKENS, progress: bool = True,
                   text_field: str = TEXT_FIELD) -> CorpusSummary:
    """Tokenize a corpus into shards of token ids in `output_dir` (see the module docstring for the layout): text
    files, JSON lines, Parquet files or datasets folders (raw_text; `text_field` names a record's text), and
    folders of them.

    Lines are read and tokenized one at a time and shards written as they fill, so the corpus never has to fit
    in memory. Re-preparing into a folder that holds the same corpus (same files, same tokenizer) replaces it
    once the new one is complete (it is written into `output_dir/.incomplete/` first, so a failure or an
    interruption leaves the old one as it was); a folder holding a different one is refused.
    """
    if shard_tokens < 1:
        raise ConfigError(f"shard_tokens must be at least 1, got {shard_tokens}")
    if not paths:
        raise InputError("no corpus files given")
    output_dir = Path(output_dir)
    for folder in (Path(path) for path in paths if Path(path).is_dir()):
        if output_dir.resolve().is_relative_to(folder.resolve()):
            raise InputError(f"is inside the corpus folder {folder}, whose files are all read: the shards would be "
                             "read as text next time; choose an output folder outside it", output_dir)
    paths = corpus_files(paths)
    sources = [{"path": str(path.resolve()), "bytes": source_bytes(path)} for path in paths]
    identity = tokenizer_identity(tokenizer)
    _check_output_dir(output_dir, sources, identity)
    # Inside the folder, so that the final moves are renames on one file system (the folder may be a link to a data
    # disk, or a mount point), hidden from the user's listing.
    staging = output_dir / STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)  # a killed preparation's
    staging.mkdir(parents=True)
    try:
        summary = _write_corpus(paths, tokenizer, staging, shard_tokens, sources, identity, progress, text_field)
        _replace_corpus(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("prepared %s into %s", summary, output_dir)
    return summary


def _write_corpus(paths: list[Path], tokenizer: BertTokenizer, output_dir: Path, shard_tokens: int,
                  sources: list[dict[str, Any]], identity: dict[str, Any], progress: bool,
                  text_field: str) -> CorpusSummary:
    dtype = token_dtype(len(tokenizer))
    writer = ShardWriter(output_dir, dtype, shard_tokens)
    # The tokenizer's id-only path (no special tokens, offsets or dicts): ~2x faster than __call__ on a batch.
    # A "[SEP]" or "[MASK]" written in the raw text is text, as in BERT's own data preparation: a special id there
    # would pass for the structure masking and sentence pairs build.
    encode: Callable[[str], list[int]] = functools.partial(tokenizer._encode_ids, split_special_tokens=True)
    unknown_id, unknown = tokenizer.unk_token_id, 0
    with progress_bar(total=sum(source["bytes"] for source in sources), unit="B", unit_scale=True,
                      desc="tokenizing corpus", enabled=progress) as bar:
        for path in paths:
            read = 0
            for _, text, size in corpus_lines(path, text_field):  # the last is a DOCUMENT_END
                if text == DOCUMENT_END:
                    writer.end_document()
                else:
                    ids = encode(text)
                    if ids:  # a line of only control or zero-width characters holds no tokens
                        writer.add_sentence(ids)
                        unknown += ids.count(unknown_id)
                read += size
                if read >= 1 << 20:
                    bar.update(read)
                    read = 0
            bar.update(read)
    writer.flush()

    summary = CorpusSummary(documents=sum(shard["documents"] for shard in writer.shards),
                            sentences=sum(shard["sentences"] for shard in writer.shards),
                            tokens=sum(shard["tokens"] for shard in writer.shards), shards=len(writer.shards),
                            unknown=unknown)
    if summary.tokens == 0:
        raise InputError("the corpus is empty: no line produced any token "
                         "(expected one sentence per line, blank lines between documents)",
                         paths[0] if len(paths) == 1 else None)
    tokenizer.save_pretrained(output_dir / TOKENIZER_DIR)
    manifest = {"format": FORMAT, "version": VERSION, "vocab_size": len(tokenizer), "dtype": dtype.name,
                "documents": summary.documents, "sentences": summary.sentences, "tokens": summary.tokens,
                "shards": writer.shards, "content_sha256": writer.content.hexdigest(), "sources": sources,
                "tokenizer": identity}
    write_text_atomic(output_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return summary


def _check_output_dir(directory: Path, sources: list[dict[str, Any]], identity: dict[str, Any]) -> None:
    """Refuse a folder holding another corpus (the user's other files may stay beside this one)."""
    if directory.exists() and not directory.is_dir():
        raise InputError("exists and is not a folder; the output is the corpus folder", directory)
    manifest_path = directory / MANIFEST
    if manifest_path.exists():
        manifest = _read_manifest(manifest_path)
        same_sources = [source["path"] for source in manifest.get("sources", [])] == \
            [source["path"] for source in sources]
        if not (same_sources and manifest.get("tokenizer") == identity):
            raise InputError("the output folder already holds a corpus prepared from other files (a corpus folder's "
                             "files, as they were then) or with another tokenizer; choose another output folder or "
                             "delete it", manifest_path)


def _replace_corpus(staging: Path, directory: Path) -> None:
    """Move a complete corpus from `staging` (inside `directory`) into `directory`, in place of the one it may hold;
    the user's other files there stay, in tokenizer/ too. The manifest goes first and comes last, so that an
    interruption in between leaves a folder recognisably unfinished (no manifest), never a manifest over the wrong
    shards."""
    (directory / MANIFEST).unlink(missing_ok=True)
    new = {entry.name for entry in staging.glob("shard-*.npy")}
    for name in sorted(new):
        os.replace(staging / name, directory / name)
    for stale in directory.glob("shard-*.npy"):
        if stale.name not in new:
            stale.unlink()
    (directory / TOKENIZER_DIR).mkdir(exist_ok=True)
    for entry in (staging / TOKENIZER_DIR).iterdir():
        os.replace(entry, directory / TOKENIZER_DIR / entry.name)
    os.replace(staging / MANIFEST, directory / MANIFEST)


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError("not a bertforge corpus manifest (invalid JSON)", path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError("not a bertforge corpus manifest", path)
    if manifest.get("version") != VERSION:
        raise InputError(f"corpus format version {manifest.get('version')} is not supported (expected {VERSION}); "
                         "prepare the corpus again", path)
    _check_manifest_fields(manifest, path)
    return manifest


def _check_manifest_fields(manifest: dict[str, Any], path: Path) -> None:
    """The fields readers use, of the kinds prepare_corpus writes: a damaged or hand-edited manifest is a one-line
    error naming the field, not a TypeError or an out-of-range read in the middle of training."""
    def require(field: str, value: Any, holds: bool, expected: str) -> None:
        if not holds:
            raise InputError(f"{field}: expected {expected}, got {value!r:.60}; prepare the corpus again", path)

    def count(field: str, value: Any, minimum: int = 0) -> None:
        try:
            check_number(field, value, minimum=minimum, integer=True)
        except ConfigError as error:
            raise InputError(f"{error}; prepare the corpus again", path) from None

    def record(field: str, value: Any) -> dict[str, Any]:
        require(field, value, isinstance(value, dict), "an object")
        return value

    dtype = manifest.get("dtype")
    require("dtype", dtype, dtype in ("uint16", "uint32"), "uint16 or uint32")
    count("vocab_size", manifest.get("vocab_size"), minimum=1)
    shards = manifest.get("shards")
    require("shards", shards, isinstance(shards, list), "a list")
    for index, shard in enumerate(shards):
        for name in ("documents", "sentences", "tokens"):
            count(f"shards[{index}].{name}", record(f"shards[{index}]", shard).get(name))
    tokenizer = record("tokenizer", manifest.get("tokenizer"))
    special = record("tokenizer.special_token_ids", tokenizer.get("special_token_ids"))
    for name, token_id in special.items():
        count(f"tokenizer.special_token_ids.{name}", token_id)
    sources = manifest.get("sources", [])
    require("sources", sources, isinstance(sources, list), "a list")
    for index, source in enumerate(sources):
        require(f"sources[{index}].path", source, isinstance(record(f"sources[{index}]", source).get("path"), str),
                "a file's path")


# ---------------------------------------------------------------- reading shards


@dataclass(frozen=True)
class Document:
    """One document as stored: its sentences' ids back to back, and where each sentence starts.

    tokens: (tokens,) ids (views into the memory-mapped shard); offsets: (sentences + 1,) with offsets[0] == 0,
    sentence k is tokens[offsets[k]:offsets[k + 1]].
    """

    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def sentences(self) -> list[np.ndarray]:
        return np.split(self.tokens, self.offsets[1:-1])


def held_out_mask(documents: int, held_out: int) -> np.ndarray:
    """(documents,) bool: `held_out` of them, spread evenly over the corpus (so every source file contributes).

    Document i is held out when floor((i + 1) k / n) > floor(i k / n): exactly k, one per n/k. (10, 3) ->
    positions 3, 6, 9.
    """
    index = np.arange(documents, dtype=np.int64)
    return (index + 1) * held_out // documents > index * held_out // documents


# split name -> which documents it keeps, given the held-out mask.
SPLITS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "all": lambda held_out: np.ones_like(held_out),
    "train": lambda held_out: ~held_out,
    "eval": lambda held_out: held_out,
}


class CorpusReader:
    """Documents of a prepared corpus, memory-mapped: reader[i] -> Document, loading nothing else.

    split: "train" (documents not held out), "eval" (the held-out ones) or "all". holdout: how many documents
    the evaluation split gets: a count (int) or a fraction of the corpus (float below 1), spread evenly.
    rank, world_size: each rank reads every world_size-th document of its split, so the ranks' parts are
    disjoint and together cover the split (modulo rather than ranges, so each rank sees every source file).
    """

    def __init__(self, directory: str | Path, split: str = "all", holdout: int | float = 0, rank: int = 0,
                 world_size: int = 1):
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST
        if not manifest_path.is_file():
            reason = "no such folder" if not self.directory.is_dir() else \
                "no manifest.json: not a prepared corpus, or its preparation did not finish"
            raise InputError(reason, self.directory)
        self.manifest = _read_manifest(manifest_path)
        check_choice(split, SPLITS, "corpus split")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in 0..{world_size - 1}, got {rank}")
        self.split, self.rank, self.world_size = split, rank, world_size
        self.dtype = np.dtype(self.manifest["dtype"])
        self.special_token_ids: dict[str, int] = self.manifest["tokenizer"]["special_token_ids"]

        shard_documents = np.array([shard["documents"] for shard in self.manifest["shards"]], dtype=np.int64)
        self._shard_starts = np.concatenate([[0], np.cumsum(shard_documents)])  # first global document per shard
        total = int(self._shard_starts[-1])
        held_out = held_out_mask(total, _held_out_count(holdout, total, split))
        chosen = np.flatnonzero(SPLITS[split](held_out))
        self.document_ids = chosen[rank::world_size]  # global indices of this reader's documents
        if len(self.document_ids) == 0:
            raise ConfigError(f"rank {rank} of {world_size} gets no documents: the {split!r} split of "
                              f"{self.directory} has {len(chosen)}")
        self._shards: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    def __len__(self) -> int:
        return len(self.document_ids)

    def __getitem__(self, index: int) -> Document:
        shard, local = self._locate(int(self.document_ids[index]))
        tokens, sentences, documents = self._shard(shard)
        offsets = np.asarray(sentences[documents[local]:documents[local + 1] + 1])
        return Document(tokens[offsets[0]:offsets[-1]], offsets - offsets[0])

    def __iter__(self) -> Iterator[Document]:
        return (self[index] for index in range(len(self)))

    def document_tokens(self) -> np.ndarray:
        """(documents,) int64: the number of tokens of each of this reader's documents, from the index arrays."""
        lengths = np.empty(len(self), dtype=np.int64)
        shards = np.searchsorted(self._shard_starts, self.document_ids, side="right") - 1
        for shard in np.unique(shards):
            _, sentences, documents = self._shard(int(shard))
            mine = shards == shard
            local = self.document_ids[mine] - self._shard_starts[shard]
            lengths[mine] = sentences[documents[local + 1]] - sentences[documents[local]]
        return lengths

    def __getstate__(self) -> dict:
        # DataLoader workers started by pickling (spawn) reopen the shards instead of copying memory maps' data.
        return {**self.__dict__, "_shards": {}}

    def _locate(self, document: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self._shard_starts, document, side="right")) - 1
        return shard, document - int(self._shard_starts[shard])

    def _shard(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if index not in self._shards:
            arrays = []
            for name in SHARD_ARRAYS:
                path = shard_path(self.directory, index, name)
                if not path.is_file():
                    raise InputError("shard file missing: prepare the corpus again", path)
                try:
                    arrays.append(np.load(path, mmap_mode="r"))
                except (ValueError, OSError) as error:  # a partial copy: cut-off header or data, or not an .npy file
                    raise InputError(f"damaged shard ({error}): prepare the corpus again", path) from None
            tokens, sentences, documents = arrays
            counts = self.manifest["shards"][index]
            if (len(tokens), len(sentences), len(documents)) != \
                    (counts["tokens"], counts["sentences"] + 1, counts["documents"] + 1):
                raise InputError(f"shard {index} does not hold what manifest.json counts ({counts['documents']} "
                                 f"documents, {counts['sentences']} sentences, {counts['tokens']} tokens): "
                                 "prepare the corpus again", self.directory)
            self._shards[index] = tuple(arrays)
        return self._shards[index]


def _held_out_count(holdout: int | float, documents: int, split: str) -> int:
    if isinstance(holdout, float) and not isinstance(holdout, bool):
        if not 0.0 <= holdout < 1.0:
            raise ConfigError(f"a held-out fraction must be in [0, 1), got {holdout}")
        count = round(holdout * documents)
        if holdout > 0 and count == 0:
            count = 1  # a positive fraction of a small corpus still holds out something to evaluate on
    else:
        count = int(holdout)
    if not 0 <= count < documents:
        raise ConfigError(f"can't hold out {count} of {documents} document{'s' if documents != 1 else ''} (--holdout) "
                          "and train on the rest" + (
                              ": a text file's documents are separated by blank lines, and this corpus has one; "
                              "prepare it with blank lines between documents, or pass --holdout 0"
                              if documents == 1 else ""))
    if split == "eval" and count == 0:
        raise ConfigError("the 'eval' split is empty: hold out some documents (--holdout N, or a fraction)")
    return count
