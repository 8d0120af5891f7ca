"""Corpus preparation: shards decode back to the tokenizer's ids of every line, document by document; the shard
size changes nothing; rank and held-out splits partition the documents; one-line errors; a real corpus slice;
the `pretrain prepare` subcommand."""

import argparse
import itertools
import json

import numpy as np
import pytest

from bertforge import ConfigError
from bertforge.cli import pretrain_prepare
from bertforge.errors import InputError
from bertforge.pretraining.corpus import (
    MANIFEST,
    CorpusReader,
    held_out_mask,
    prepare_corpus,
    token_dtype,
)

DOCUMENTS = [
    ["The quick brown fox jumps over the lazy dog.", "Unaffable café owners!", "It rained."],
    ["A one-line document about Paris."],
    ["Whole-word masking keeps \"un ##aff ##able\" together.", "Short.", "Another sentence, with commas, here.",
     "And a final one?"],
    ["Second file, first document.", "Naïve résumé."],
    ["Second file, last document without a trailing blank line."],
]


@pytest.fixture
def corpus_files(tmp_path):
    """Two files in the raw layout, with the irregularities real files have: blank lines in a row, a leading
    blank line, trailing spaces, a whitespace-only line (a separator), a line of control characters only (no
    tokens, skipped)."""
    first = tmp_path / "first.txt"
    first.write_text("\n" + "\n".join(DOCUMENTS[0]) + "  \n\n\n" + DOCUMENTS[1][0] + "\n \t \n"
                     + "\n".join(DOCUMENTS[2][:2]) + "\n\x00\x01\n" + "\n".join(DOCUMENTS[2][2:]) + "\n\n",
                     encoding="utf-8")
    second = tmp_path / "second.txt"
    second.write_text("\n".join(DOCUMENTS[3]) + "\n\n" + DOCUMENTS[4][0], encoding="utf-8")
    return [first, second]


def expected_ids(tokenizer):
    """Each document's sentences as the tokenizer's public __call__ encodes them, [CLS]/[SEP] stripped."""
    return [[tokenizer(line)["input_ids"][1:-1] for line in document] for document in DOCUMENTS]


def read_back(directory, **split):
    return [[sentence.tolist() for sentence in document.sentences] for document in CorpusReader(directory, **split)]


def test_round_trip(corpus_files, tokenizer, tmp_path):
    summary = prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    expected = expected_ids(tokenizer)
    assert read_back(tmp_path / "out") == expected
    assert (summary.documents, summary.sentences, summary.shards) == (5, 11, 1)
    assert summary.tokens == sum(len(sentence) for document in expected for sentence in document)


def test_special_tokens_written_in_raw_text_are_text(tokenizer, tmp_path):
    """A "[SEP]" or "[MASK]" in the raw corpus is read as text (BERT's own preparation does the same): a special id
    there would pass for the structure that masking and sentence pairs build."""
    line = "The [SEP] token and a [MASK] here, [CLS] too."
    (tmp_path / "raw.txt").write_text(line + "\n", encoding="utf-8")
    prepare_corpus([tmp_path / "raw.txt"], tokenizer, tmp_path / "out", progress=False)
    [[ids]] = read_back(tmp_path / "out")
    assert ids == tokenizer(line, split_special_tokens=True)["input_ids"][1:-1]
    special = {tokenizer.sep_token_id, tokenizer.mask_token_id, tokenizer.cls_token_id}
    assert not special & set(ids) and special <= set(tokenizer(line)["input_ids"])
    assert tokenizer.convert_ids_to_tokens(ids[1:4]) == ["[", "sep", "]"]


def test_many_small_shards_read_the_same(corpus_files, tokenizer, tmp_path):
    one = prepare_corpus(corpus_files, tokenizer, tmp_path / "one", progress=False)
    many = prepare_corpus(corpus_files, tokenizer, tmp_path / "many", shard_tokens=7, progress=False)
    assert many.shards > 2 and one.shards == 1
    assert (many.documents, many.sentences, many.tokens) == (one.documents, one.sentences, one.tokens)
    assert read_back(tmp_path / "many") == read_back(tmp_path / "one")
    # document_tokens comes from the index arrays alone; it must agree with the documents themselves
    reader = CorpusReader(tmp_path / "many")
    assert reader.document_tokens().tolist() == [len(document.tokens) for document in reader]


def test_manifest_and_dtype(corpus_files, tokenizer, tmp_path):
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["dtype"] == "uint16" and manifest["vocab_size"] == tokenizer.vocab_size
    assert [source["path"] for source in manifest["sources"]] == [str(path.resolve()) for path in corpus_files]
    assert manifest["tokenizer"]["do_lower_case"] is True
    assert manifest["tokenizer"]["special_token_ids"]["cls_token"] == tokenizer.cls_token_id
    assert CorpusReader(tmp_path / "out")[0].tokens.dtype == np.uint16
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_preparing_again_replaces_the_same_corpus(corpus_files, tokenizer, tmp_path):
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", shard_tokens=7, progress=False)
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    assert len(list((tmp_path / "out").glob("shard-*"))) == 3  # the earlier, smaller shards are gone
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([*(path.name for path in corpus_files), "out"])
    assert read_back(tmp_path / "out") == expected_ids(tokenizer)


def test_a_failed_preparation_leaves_the_corpus_it_would_replace(corpus_files, tokenizer, tmp_path):
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    before = {path.name: path.read_bytes() for path in (tmp_path / "out").rglob("*") if path.is_file()}
    (tmp_path / "out" / "notes.md").write_text("the user's own file")
    with corpus_files[1].open("ab") as handle:
        handle.write(b"\ncaf\xe9\n")  # bad UTF-8 late in the last file: found after every shard of the first
    with pytest.raises(InputError, match="not valid UTF-8"):
        prepare_corpus(corpus_files, tokenizer, tmp_path / "out", shard_tokens=7, progress=False)
    after = {path.name: path.read_bytes() for path in (tmp_path / "out").rglob("*") if path.is_file()}
    assert after == before | {"notes.md": b"the user's own file"}
    assert not (tmp_path / "out.incomplete").exists()
    assert read_back(tmp_path / "out") == expected_ids(tokenizer)


def test_a_corpus_folder_that_is_a_link_is_prepared_again_in_place(corpus_files, tokenizer, tmp_path):
    """A link to a data disk: the new corpus is staged inside the folder (one file system), the link stays."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "corpus").symlink_to(tmp_path / "disk")
    prepare_corpus(corpus_files, tokenizer, tmp_path / "corpus", shard_tokens=7, progress=False)
    prepare_corpus(corpus_files, tokenizer, tmp_path / "corpus", progress=False)
    assert (tmp_path / "corpus").is_symlink() and len(list((tmp_path / "disk").glob("shard-*"))) == 3
    assert read_back(tmp_path / "corpus") == expected_ids(tokenizer)
    assert sorted(path.name for path in (tmp_path / "disk").iterdir()) == [
        "manifest.json", *(f"shard-00000.{name}.npy" for name in ("documents", "sentences", "tokens")), "tokenizer"]


def test_held_out_mask_is_exact_and_spread():
    assert np.flatnonzero(held_out_mask(10, 3)).tolist() == [3, 6, 9]
    for documents, held_out in itertools.product([1, 7, 100, 101], [0, 1, 3, 50]):
        if held_out <= documents:
            mask = held_out_mask(documents, held_out)
            assert mask.sum() == held_out
            gaps = np.diff(np.flatnonzero(mask))
            assert len(gaps) == 0 or gaps.max() - gaps.min() <= 1


def test_ranks_and_splits_partition_the_documents(tokenizer, tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(f"document number {i}.\nits second line." for i in range(23)), encoding="utf-8")
    prepare_corpus([path], tokenizer, tmp_path / "out", shard_tokens=20, progress=False)
    everything = [tuple(document.tokens) for document in CorpusReader(tmp_path / "out")]
    assert len(set(everything)) == 23

    def documents(**options):
        return [tuple(document.tokens) for document in CorpusReader(tmp_path / "out", **options)]

    for holdout, held in ((0.2, 5), (4, 4)):
        train = [documents(split="train", holdout=holdout, rank=rank, world_size=3) for rank in range(3)]
        evaluation = [documents(split="eval", holdout=holdout, rank=rank, world_size=2) for rank in range(2)]
        flat = [document for part in train + evaluation for document in part]
        assert sorted(flat) == sorted(everything)  # every document exactly once
        assert sum(map(len, evaluation)) == held
        assert max(map(len, train)) - min(map(len, train)) <= 1


def test_split_errors(corpus_files, tokenizer, tmp_path):
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    for options in ({"split": "eval"}, {"split": "test"}, {"holdout": 5}, {"holdout": 1.5},
                    {"rank": 3, "world_size": 3}, {"rank": 5, "world_size": 6}):
        with pytest.raises(ConfigError) as error:
            CorpusReader(tmp_path / "out", **options)
        assert "\n" not in str(error.value)


def one_line_error(call) -> str:
    with pytest.raises(InputError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    return message


def test_input_errors(corpus_files, tokenizer, tmp_path):
    missing = tmp_path / "missing.txt"
    assert "missing.txt" in one_line_error(lambda: prepare_corpus([missing], tokenizer, tmp_path / "a", progress=False))

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("fine\nalso fine\n\ncaf\xe9 au lait\n".encode("latin-1"))
    message = one_line_error(lambda: prepare_corpus([latin1], tokenizer, tmp_path / "b", progress=False))
    assert "latin1.txt, line 4" in message and "UTF-8" in message

    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n\x00\n", encoding="utf-8")
    assert "empty" in one_line_error(lambda: prepare_corpus([blank], tokenizer, tmp_path / "c", progress=False))

    prepare_corpus(corpus_files[:1], tokenizer, tmp_path / "d", progress=False)
    message = one_line_error(lambda: prepare_corpus(corpus_files, tokenizer, tmp_path / "d", progress=False))
    assert "already holds a corpus" in message
    assert read_back(tmp_path / "d") == expected_ids(tokenizer)[:3]  # the refused run touched nothing


def test_unfinished_preparation_is_detected(corpus_files, tokenizer, tmp_path):
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    (tmp_path / "out" / MANIFEST).unlink()  # as if interrupted before the manifest was written
    assert "did not finish" in one_line_error(lambda: CorpusReader(tmp_path / "out"))
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)  # and it can simply be redone
    assert read_back(tmp_path / "out") == expected_ids(tokenizer)


@pytest.mark.parametrize("field, value, message", [
    (["dtype"], "float16", "dtype: expected uint16 or uint32, got 'float16'"),
    (["vocab_size"], "30522", "vocab_size must be an integer, got '30522'"),
    (["shards"], {}, "shards: expected a list, got {}"),
    (["shards", 0], None, "shards[0]: expected an object, got None"),
    (["shards", 0, "documents"], 2.5, "shards[0].documents must be an integer, got 2.5"),
    (["shards", 0, "tokens"], True, "shards[0].tokens must be an integer, got True"),
    (["tokenizer"], [], "tokenizer: expected an object, got []"),
    (["tokenizer", "special_token_ids", "mask_token"], "103",
     "tokenizer.special_token_ids.mask_token must be an integer, got '103'"),
    (["sources", 0, "path"], 7, "sources[0].path: expected a file's path, got"),
    (["shards", 0, "documents"], 10**6, "shard 0 does not hold what manifest.json counts (1000000 documents"),
], ids=lambda value: None if isinstance(value, str) and " " in value else str(value))
def test_a_damaged_manifest_is_a_one_line_error_naming_the_field(corpus_files, tokenizer, tmp_path, field, value,
                                                                  message):
    prepare_corpus(corpus_files, tokenizer, tmp_path / "out", progress=False)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    holder = manifest
    for key in field[:-1]:
        holder = holder[key]
    holder[field[-1]] = value
    (tmp_path / "out" / MANIFEST).write_text(json.dumps(manifest))
    assert message in one_line_error(lambda: read_back(tmp_path / "out"))


def test_real_corpus_slice(data_dir, tokenizer, tmp_path):
    with open(data_dir / "pretrain_en" / "state_union.txt", encoding="utf-8") as handle:
        lines = [line for _, line in zip(range(2000), handle)]
    path = tmp_path / "slice.txt"
    path.write_text("".join(lines), encoding="utf-8")
    summary = prepare_corpus([path], tokenizer, tmp_path / "out", shard_tokens=20_000, progress=False)
    texts = [line.strip() for line in lines]
    assert summary.sentences == sum(map(bool, texts))
    assert summary.documents == sum(1 for i, text in enumerate(texts) if text and (i == 0 or not texts[i - 1]))
    assert summary.shards > 1
    reader = CorpusReader(tmp_path / "out")
    first_document = texts[:texts.index("")]
    assert [s.tolist() for s in reader[0].sentences] == [tokenizer(t)["input_ids"][1:-1] for t in first_document]


def run_subcommand(*argv):
    parser = argparse.ArgumentParser()
    pretrain_prepare.add_arguments(parser)
    return pretrain_prepare.run(parser.parse_args(list(argv)))


def test_cli_with_a_model_and_with_a_bare_vocab(corpus_files, tokenizer, minilm_dir, tmp_path, capsys):
    assert run_subcommand("--corpus", *map(str, corpus_files), "--output", str(tmp_path / "model"),
                          "--no-progress") == 0
    out = capsys.readouterr().out
    assert "5 documents, 11 sentences" in out and "training sequences of 128 tokens" in out
    assert "[UNK]: 0.00% of the tokens\n" in out
    assert read_back(tmp_path / "model") == expected_ids(tokenizer)

    assert run_subcommand("--corpus", str(corpus_files[1]), "--vocab", str(minilm_dir / "vocab.txt"),
                          "--cased", "--output", str(tmp_path / "cased"), "--no-progress") == 0
    manifest = json.loads((tmp_path / "cased" / MANIFEST).read_text())
    assert manifest["tokenizer"]["do_lower_case"] is False
    # MiniLM's vocabulary is uncased: read with case kept, capitals are [UNK] ("Second", "Naïve")
    ids = [token for line in DOCUMENTS[3] + DOCUMENTS[4] for token in
           type(tokenizer)(str(minilm_dir / "vocab.txt"), do_lower_case=False)(line)["input_ids"][1:-1]]
    share = ids.count(tokenizer.unk_token_id) / len(ids)
    assert share > 0.01 and f"[UNK]: {share:.2%} of the tokens; the vocabulary lacks many of this text's " \
        "characters\n" in capsys.readouterr().out
    (tmp_path / "small.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    assert run_subcommand("--corpus", str(corpus_files[1]), "--vocab", str(tmp_path / "small.txt"), "--output",
                          str(tmp_path / "small"), "--no-progress") == 0
    assert "(a cased vocab.txt needs --cased)" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        run_subcommand("--corpus", str(corpus_files[1]), "--cased", "--output", str(tmp_path / "x"))
