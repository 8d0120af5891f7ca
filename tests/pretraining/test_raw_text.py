"""Corpora in the layouts they come in (C4's and OpenWebText's JSON lines, WikiExtractor's output, Parquet, datasets
folders, old Mac line ends) prepare into exactly the shards of the same documents written in BERT's own layout
(a sentence a line, a blank line between documents), and vocab learns from their text alone. Refusals are one
line naming the file and what to do."""

import gzip
import json
import re

import numpy as np
import pytest

from bertforge import BertTokenizer, InputError
from bertforge.cli.main import main
from bertforge.pretraining.corpus import SHARD_ARRAYS, prepare_corpus, shard_path

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def documents(data_dir):
    """12 real documents of pretrain_en's inaugural addresses, each a list of its lines."""
    text = (data_dir / "pretrain_en" / "inaugural.txt").read_text(encoding="utf-8")
    found = [[line.strip() for line in block.splitlines() if line.strip()] for block in text.split("\n\n")]
    return [lines[:6] for lines in found if lines][:12]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained("default")


def bert_layout(documents):
    return "\n\n".join("\n".join(lines) for lines in documents) + "\n"


def shards(folder):
    return [np.load(shard_path(folder, 0, name)).tolist() for name in SHARD_ARRAYS]


@pytest.fixture(scope="module")
def reference(documents, tokenizer, tmp_path_factory):
    """The shards of the documents in BERT's layout."""
    folder = tmp_path_factory.mktemp("bert_layout")
    (folder / "corpus.txt").write_text(bert_layout(documents), encoding="utf-8")
    summary = prepare_corpus([folder / "corpus.txt"], tokenizer, folder / "prepared", progress=False)
    assert (summary.documents, summary.sentences) == (len(documents), sum(map(len, documents)))
    return shards(folder / "prepared")


def records(documents, key="text"):
    """C4's rows: a document per record, its lines joined by "\n", with the other fields C4 has."""
    return [{key: "\n".join(lines), "timestamp": "2019-04-25T12:57:54Z", "url": f"https://example.com/{index}"}
            for index, lines in enumerate(documents)]


def test_json_lines_are_a_document_per_record(documents, tokenizer, reference, tmp_path):
    """C4's json.gz, OpenWebText's .jsonl (paragraphs apart by blank lines, escapes), WikiExtractor --json's
    extension-less files: the record's text alone, none of its keys, and no document merged with the next."""
    c4 = tmp_path / "c4-train.00000-of-01024.json.gz"
    c4.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in records(documents)).encode()))
    webtext = tmp_path / "owt.jsonl"
    webtext.write_text("".join(json.dumps({"text": "\n\n".join(lines)}, ensure_ascii=True) + "\n"
                               for lines in documents), encoding="utf-8")
    wiki = tmp_path / "AA" / "wiki_00"
    wiki.parent.mkdir()
    wiki.write_text("".join(json.dumps({"id": str(index), "title": "t", "text": "\n".join(lines)}) + "\n"
                            for index, lines in enumerate(documents)), encoding="utf-8")
    for source in (c4, webtext, wiki):
        prepare_corpus([source], tokenizer, tmp_path / f"{source.name}.prepared", progress=False)
        assert shards(tmp_path / f"{source.name}.prepared") == reference, source.name


def test_another_text_field_and_its_refusal(documents, tokenizer, reference, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in records(documents, key="content")), encoding="utf-8")
    with pytest.raises(InputError, match=r"rows\.jsonl, line 1: no field 'text' \(the record has 'content', "
                                         r"'timestamp', 'url'\); name the text's field with --text-field$"):
        prepare_corpus([rows], tokenizer, tmp_path / "refused", progress=False)
    assert main(["pretrain", "prepare", "--corpus", str(rows), "--text-field", "content", "-o",
                 str(tmp_path / "prepared"), "--no-progress"]) == 0
    assert shards(tmp_path / "prepared") == reference


def test_wikiextractor_articles_and_folders(documents, tokenizer, reference, tmp_path):
    """WikiExtractor's <doc> lines bound its articles and are not text; a blank line after the title separates
    paragraphs, not documents. A folder stands for its files (AA/wiki_00, AB/wiki_00), in name order."""
    def article(index, lines):
        return f'<doc id="{index}" url="https://en.wikipedia.org/wiki?curid={index}" title="{lines[0]}">\n' \
               f"{lines[0]}\n\n" + "\n".join(lines[1:]) + "\n</doc>\n"

    for part, chunk in (("AA", documents[:7]), ("AB", documents[7:])):
        (tmp_path / "text" / part).mkdir(parents=True)
        (tmp_path / "text" / part / "wiki_00").write_text(
            "".join(article(index, lines) for index, lines in enumerate(chunk)), encoding="utf-8")
    prepare_corpus([tmp_path / "text"], tokenizer, tmp_path / "prepared", progress=False)
    assert shards(tmp_path / "prepared") == reference


def test_a_text_file_is_text_whatever_its_first_line_and_linked_folders_are_read(documents, tokenizer, reference,
                                                                                   tmp_path):
    """A .txt corpus opening on a JSON object is still text (only a file without a suffix, as WikiExtractor's
    wiki_00, is told by its first line); a folder linked into the corpus folder is read, once, and an output inside
    the corpus folder, whose shards would be read as text next time, is refused."""
    opening = tmp_path / "opening.txt"
    opening.write_text('{"title": "Inaugural addresses", "id": 1}\n\n' + bert_layout(documents), encoding="utf-8")
    summary = prepare_corpus([opening], tokenizer, tmp_path / "opening.prepared", progress=False)
    assert (summary.documents, summary.sentences) == (len(documents) + 1, sum(map(len, documents)) + 1)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "second.txt").write_text(bert_layout(documents[6:]), encoding="utf-8")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "first.txt").write_text(bert_layout(documents[:6]), encoding="utf-8")
    (tmp_path / "corpus" / "linked").symlink_to(tmp_path / "real")
    (tmp_path / "corpus" / "loop").symlink_to(tmp_path / "corpus")  # a link back up is not followed twice
    prepare_corpus([tmp_path / "corpus"], tokenizer, tmp_path / "linked.prepared", progress=False)
    assert shards(tmp_path / "linked.prepared") == reference
    with pytest.raises(InputError, match=r"prepared: is inside the corpus folder .*corpus, whose files are all read"):
        prepare_corpus([tmp_path / "corpus"], tokenizer, tmp_path / "corpus" / "prepared", progress=False)


def test_old_mac_line_ends_parquet_and_datasets_folders(documents, tokenizer, reference, tmp_path):
    datasets = pytest.importorskip("datasets")
    mac = tmp_path / "mac.txt"
    mac.write_bytes(bert_layout(documents).replace("\n", "\r").encode())
    table = datasets.Dataset.from_list(records(documents))
    table.to_parquet(str(tmp_path / "train-00000-of-00001.parquet"))
    table.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    for source in (mac, tmp_path / "train-00000-of-00001.parquet", tmp_path / "saved"):
        prepare_corpus([source], tokenizer, tmp_path / f"{source.name}.prepared", progress=False)
        assert shards(tmp_path / f"{source.name}.prepared") == reference, source.name


def test_vocab_learns_the_text_not_the_keys(documents, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in records(documents)), encoding="utf-8")
    plain = tmp_path / "plain.txt"
    plain.write_text(bert_layout(documents), encoding="utf-8")
    for source in (rows, plain):
        assert main(["vocab", "--corpus", str(source), "--vocab-size", "400", "-o", str(tmp_path / f"{source.stem}"),
                     "--no-progress"]) == 0
    assert (tmp_path / "rows").read_text() == (tmp_path / "plain").read_text()
    assert "timestamp" not in (tmp_path / "rows").read_text().split()


@pytest.mark.parametrize("name, content, message", [
    ("utf16.txt", "Fellow citizens\n".encode("utf-16"), r"utf16\.txt: is UTF-16 text, expected UTF-8: convert it"),
    ("utf16le.txt", "Fellow citizens\n".encode("utf-16-le"), r"utf16le\.txt: is UTF-16 text, expected UTF-8"),
    ("cp1252.txt", "Fellow citizens\ncaf\xe9\n".encode("cp1252"),
     r"cp1252\.txt, line 2: not valid UTF-8 text .*: convert it to UTF-8 first \(e\.g\. iconv -f cp1252"),
    ("corpus.txt.zst", b"\x28\xb5\x2f\xfd", r"not \.zst: unpack it first \(zstd -d corpus\.txt\.zst\)"),
    ("rows.jsonl", b'{"text": "a"}\n[1, 2]\n', r"rows\.jsonl, line 2: not a JSON object"),
    ("data-00000-of-00001.arrow", b"", r"an Arrow file of a datasets folder: give the folder"),
])
def test_what_is_not_read_is_one_line_naming_the_fix(tokenizer, tmp_path, capsys, name, content, message):
    (tmp_path / name).write_bytes(content)
    assert main(["pretrain", "prepare", "--corpus", str(tmp_path / name), "-o", str(tmp_path / "out"),
                 "--no-progress"]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith("bertforge: error: ")
    assert re.search(message, error), error
