"""Data files compressed with gzip, bzip2 or xz read as the plain files do, through every reader (tables, CoNLL,
SQuAD, pre-training corpora, vocabulary learning, the command line's text inputs), on slices of the real data; a
damaged or mislabelled compressed file is a one-line error naming it."""

import bz2
import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli.arguments import read_lines
from bertforge.errors import InputError
from bertforge.pretraining.corpus import CorpusReader, prepare_corpus
from bertforge.tasks.question_answering import read_squad
from bertforge.tasks.tables import data_format, read_table
from bertforge.tasks.token_classification import read_conll
from bertforge.tokenizer.learn_vocab import learn_vocab

COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def compressed_copy(path: Path, suffix: str, folder: Path, name: str | None = None) -> Path:
    copy = folder / ((name or path.name) + suffix)
    copy.write_bytes(COMPRESSORS[suffix](path.read_bytes()))
    return copy


def head(source: Path, lines: int, target: Path) -> Path:
    with open(source, encoding="utf-8") as handle:
        target.write_text("".join(line for _, line in zip(range(lines), handle)), encoding="utf-8")
    return target


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_tables_read_the_same_compressed(suffix, data_dir, tmp_path):
    tsv = head(data_dir / "sst2" / "dev.tsv", 60, tmp_path / "dev.tsv")
    rows = read_table(tsv).rows
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for _, row in rows), encoding="utf-8")
    array = tmp_path / "dev.json"  # a JSON array of rows, told from SQuAD inside the compressed file
    array.write_text(json.dumps([row for _, row in rows]), encoding="utf-8")
    text = tmp_path / "dev.txt"
    text.write_text("".join(row["sentence"] + "\n" for _, row in rows), encoding="utf-8")
    for plain in (tsv, jsonl, array, text):
        packed = compressed_copy(plain, suffix, tmp_path)
        assert data_format(packed) == data_format(plain)
        table = read_table(packed)
        assert (table.columns, table.rows) == (read_table(plain).columns, read_table(plain).rows)
    assert read_lines(compressed_copy(text, suffix, tmp_path)) == text.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_conll_and_squad_read_the_same_compressed(suffix, data_dir, tmp_path):
    conll = head(data_dir / "conll2003" / "eng.testa", 400, tmp_path / "eng.testa")
    packed = compressed_copy(conll, suffix, tmp_path)
    assert data_format(packed) == "conll"  # CoNLL-2003's own name, told by its lines
    assert [(s.words, s.tags) for s in read_conll(packed)] == [(s.words, s.tags) for s in read_conll(conll)]
    squad = data_dir / "squad" / "dev-v1.1.json"
    packed = compressed_copy(squad, suffix, tmp_path)
    assert data_format(packed) == "squad"
    assert read_squad(packed) == read_squad(squad)


def test_corpora_and_vocabularies_come_out_the_same_compressed(data_dir, tokenizer, tmp_path):
    corpus = head(data_dir / "pretrain_en" / "state_union.txt", 2000, tmp_path / "state_union.txt")
    packed = compressed_copy(corpus, ".gz", tmp_path)
    plain_summary = prepare_corpus([corpus], tokenizer, tmp_path / "plain", shard_tokens=20_000, progress=False)
    packed_summary = prepare_corpus([packed], tokenizer, tmp_path / "packed", shard_tokens=20_000, progress=False)
    assert plain_summary.tokens == packed_summary.tokens and plain_summary.shards > 1
    for plain_document, packed_document in zip(CorpusReader(tmp_path / "plain"), CorpusReader(tmp_path / "packed"),
                                               strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(plain_document.sentences, packed_document.sentences,
                                                          strict=True))
    vocabulary = learn_vocab([compressed_copy(corpus, ".bz2", tmp_path)], vocab_size=1200)
    assert vocabulary.id_to_token == learn_vocab([corpus], vocab_size=1200).id_to_token


@pytest.mark.parametrize("suffix, name", [(".gz", "gzip"), (".bz2", "bzip2"), (".xz", "xz")])
def test_damaged_compressed_files_are_one_line_errors(suffix, name, data_dir, tokenizer, tmp_path):
    tsv = head(data_dir / "sst2" / "dev.tsv", 60, tmp_path / "dev.tsv")
    mislabelled = tmp_path / f"plain.tsv{suffix}"
    mislabelled.write_bytes(tsv.read_bytes())
    cut = compressed_copy(tsv, suffix, tmp_path, "cut.tsv")
    cut.write_bytes(cut.read_bytes()[:len(cut.read_bytes()) // 2])
    for path in (mislabelled, cut):
        for read in (read_table, read_conll, read_squad, read_lines,
                     lambda path: prepare_corpus([path], tokenizer, tmp_path / "out", progress=False)):
            with pytest.raises(InputError) as caught:
                read(path)
            message = str(caught.value)
            assert message.startswith(f"{path}: can't read the {name} data (") and "\n" not in message


def test_utf16_and_other_encodings_are_named_with_the_fix(tmp_path):
    """Excel's "Unicode text" is UTF-16 (with a byte-order mark; other tools write none); a cp1252 file holds
    bytes UTF-8 doesn't: each reader says which and how to convert, where it said only 'not valid UTF-8'."""
    from bertforge.tasks.data import Columns, read_text_examples

    rows = "sentence\tlabel\nit 's a charming and often affecting journey .\t1\n"
    for name, raw in (("excel.tsv", rows.encode("utf-16")), ("bare.tsv", rows.encode("utf-16-le"))):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(InputError, match=rf"{name}: is UTF-16 text, expected UTF-8: convert it to UTF-8 first "
                                             r"\(e\.g\. iconv -f utf-16"):
            read_text_examples(tmp_path / name, Columns(), "class")
    (tmp_path / "cp1252.tsv").write_bytes((rows + "caf\xe9 au lait\t1\n").encode("cp1252"))
    with pytest.raises(InputError, match=r"cp1252.tsv, line 3: not valid UTF-8 text: convert it to UTF-8 first "
                                         r"\(e\.g\. iconv -f cp1252"):
        read_text_examples(tmp_path / "cp1252.tsv", Columns(), "class")
