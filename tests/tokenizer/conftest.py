"""Fixtures for the tokenizer tests: a tiny hand-written vocabulary, the MiniLM tokenizer in bertforge and in
transformers (the reference), and the real texts of ../shared/data."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bertforge.tokenizer import BertTokenizer, Vocab

TINY_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "want", "##ed", "runn",
               "##ing", ",", ".", "!", "cafe", "中", "a", "b", "##b", "##c"]


@pytest.fixture
def tiny_tokens() -> list[str]:
    return list(TINY_TOKENS)


@pytest.fixture
def tiny_vocab() -> Vocab:
    return Vocab(TINY_TOKENS)


@pytest.fixture(scope="session")
def ours(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="session")
def ours_cased(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(minilm_dir, do_lower_case=False)


def make_reference(minilm_dir: Path, lowercase: bool):
    """transformers' BertTokenizerFast built from vocab.txt + tokenizer_config.json, not tokenizer.json
    (whose stored padding/truncation to 128 would leak into every call)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.tokenization_bert import load_vocab

    config = json.loads((minilm_dir / "tokenizer_config.json").read_text())
    reference = transformers.BertTokenizerFast(
        vocab=load_vocab(str(minilm_dir / "vocab.txt")), do_lower_case=lowercase,
        strip_accents=config["strip_accents"], tokenize_chinese_chars=config["tokenize_chinese_chars"],
        model_max_length=config["model_max_length"])
    # Check by inspection that the settings reached the Rust normalizer and nothing pads or truncates.
    backend = json.loads(reference.backend_tokenizer.to_str())
    assert backend["normalizer"] == {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                     "strip_accents": None, "lowercase": lowercase}
    assert backend["truncation"] is None and backend["padding"] is None
    assert len(reference) == 30522
    return reference


@pytest.fixture(scope="session")
def reference(minilm_dir):
    return make_reference(minilm_dir, lowercase=True)


@pytest.fixture
def fresh_reference(minilm_dir):
    """A reference of a test's own, which it may change (padding side, added tokens)."""
    return make_reference(minilm_dir, lowercase=True)


@pytest.fixture(scope="session")
def reference_cased(minilm_dir):
    return make_reference(minilm_dir, lowercase=False)


def read_tsv(path: Path, encoding: str = "utf-8") -> list[list[str]]:
    # These GLUE files contain bare quotes: plain tab splitting, never CSV quoting.
    with open(path, encoding=encoding, newline="") as handle:
        return [row for row in csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


def sst2_sentences(data_dir: Path) -> list[str]:
    sentences = []
    for split in ("train", "dev", "test"):
        rows = read_tsv(data_dir / "sst2" / f"{split}.tsv")
        column = rows[0].index("sentence")
        sentences += [row[column] for row in rows[1:]]
    return sentences


def conll_sentences(data_dir: Path) -> list[str]:
    sentences, words = [], []
    for split in ("train", "testa", "testb"):
        for line in (data_dir / "conll2003" / f"eng.{split}").read_text(encoding="utf-8").splitlines():
            if line.strip():
                words.append(line.split(" ")[0])
            elif words:
                sentences.append(" ".join(words))
                words = []
    if words:
        sentences.append(" ".join(words))
    return sentences


def squad(data_dir: Path) -> list[tuple[str, str]]:
    """(question, context) for every SQuAD dev question."""
    articles = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    return [(qa["question"], paragraph["context"])
            for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


def wikitext_lines(data_dir: Path) -> list[str]:
    lines = []
    for split in ("valid", "test"):
        lines += (data_dir / "wikitext2" / f"wiki.{split}.tokens").read_text(encoding="utf-8").split("\n")
    return lines


def pretrain_lines(data_dir: Path, per_file: int = 2000) -> list[str]:
    lines = []
    for path in sorted((data_dir / "pretrain_en").glob("*.txt")):
        lines += path.read_text(encoding="utf-8").split("\n")[:per_file]
    return lines


def sentence_pairs(data_dir: Path) -> list[tuple[str, str]]:
    """MRPC (train + dev) and STS-B (train + dev) sentence pairs."""
    pairs = []
    for split in ("train", "dev"):
        rows = read_tsv(data_dir / "mrpc" / f"{split}.tsv", encoding="utf-8-sig")
        pairs += [(row[3], row[4]) for row in rows[1:]]
        rows = read_tsv(data_dir / "stsb" / f"{split}.tsv")
        first, second = rows[0].index("sentence1"), rows[0].index("sentence2")
        pairs += [(row[first], row[second]) for row in rows[1:]]
    return pairs


@pytest.fixture(scope="session")
def corpora(data_dir) -> dict[str, list[str]]:
    """Every line of the real single-text corpora, by name."""
    questions_and_contexts = squad(data_dir)
    return {
        "sst2": sst2_sentences(data_dir),
        "conll2003": conll_sentences(data_dir),
        "squad_questions": [question for question, _ in questions_and_contexts],
        "squad_contexts": sorted({context for _, context in questions_and_contexts}),
        "wikitext2": wikitext_lines(data_dir),
        "pretrain_en": pretrain_lines(data_dir),
    }


@pytest.fixture(scope="session")
def squad_pairs(data_dir) -> list[tuple[str, str]]:
    return squad(data_dir)


@pytest.fixture(scope="session")
def glue_pairs(data_dir) -> list[tuple[str, str]]:
    return sentence_pairs(data_dir)
