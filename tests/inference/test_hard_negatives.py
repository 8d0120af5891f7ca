"""mine_hard_negatives against sentence-transformers' on real data: SQuAD questions (anchors, two per paragraph,
one asked twice) and their paragraphs (positives), MiniLM as the embedding model, every output layout and filter;
the same rows, and the same scores."""

import json
import random

import pytest
import torch

from bertforge import ConfigError, CrossEncoder, InputError, SentenceEncoder
from bertforge.inference import mine_hard_negatives

datasets = pytest.importorskip("datasets")
reference = pytest.importorskip("sentence_transformers.util").mine_hard_negatives


@pytest.fixture(scope="module")
def squad_rows(data_dir) -> dict[str, list[str]]:
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    rows = [(qa["question"], paragraph["context"]) for article in squad["data"][:2]
            for paragraph in article["paragraphs"][:10] for qa in paragraph["qas"][:2]]
    rows.append((rows[0][0], rows[5][1]))  # one question with a second positive
    extra = [paragraph["context"] for paragraph in squad["data"][3]["paragraphs"][:15]]
    return {"question": [q for q, _ in rows], "paragraph": [c for _, c in rows], "extra": extra}


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder("default")


def assert_same_table(mine, theirs):
    assert list(mine) == list(theirs)
    for name in theirs:
        if name in ("scores", "score"):
            assert torch.allclose(torch.tensor(mine[name]), torch.tensor(theirs[name]), atol=1e-5), name
        else:
            assert mine[name] == theirs[name], name


CASES = {
    "triplet": {},
    "n-tuple with scores": {"num_negatives": 2, "output_format": "n-tuple", "output_scores": True},
    "labeled-pair": {"output_format": "labeled-pair"},
    "labeled-pair scores": {"output_format": "labeled-pair", "output_scores": True},
    "labeled-list, ranks 2 to 8": {"output_format": "labeled-list", "range_min": 2, "range_max": 8},
    "labeled-list scores": {"output_format": "labeled-list", "output_scores": True, "num_negatives": 4},
    "absolute margin, max score": {"absolute_margin": 0.05, "max_score": 0.7, "num_negatives": 2,
                                   "output_format": "n-tuple"},
    "relative margin, min score": {"relative_margin": 0.1, "min_score": 0.3, "output_scores": True},
    "include positives": {"include_positives": True, "num_negatives": 2},
    "random sampling": {"sampling_strategy": "random", "range_max": 12, "num_negatives": 3},
    "prompts": {"query_prompt": "query: ", "corpus_prompt": "passage: ", "num_negatives": 1},
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_sentence_transformers(squad_rows, encoder, case):
    dataset = datasets.Dataset.from_dict({"question": squad_rows["question"], "paragraph": squad_rows["paragraph"]})
    options = dict(CASES[case], verbose=False)
    random.seed(0)
    theirs = reference(dataset, encoder, **options)
    random.seed(0)
    mine = mine_hard_negatives(dataset, encoder, **options)
    assert isinstance(mine, datasets.Dataset) and len(mine) > 0
    assert_same_table(mine.to_dict(), theirs.to_dict())


def test_corpus_and_cross_encoder(squad_rows, encoder):
    """A corpus of other paragraphs beside the positives, and candidates rescored by a cross-encoder."""
    torch.manual_seed(0)
    reranker = CrossEncoder("default")  # MiniLM with a new one-output head: scores of its own, the same both ways
    rows = {"question": squad_rows["question"][:12], "paragraph": squad_rows["paragraph"][:12]}
    dataset = datasets.Dataset.from_dict(rows)
    for options in ({"corpus": squad_rows["extra"]}, {"cross_encoder": reranker, "output_scores": True}):
        theirs = reference(dataset, encoder, verbose=False, **options)
        assert_same_table(mine_hard_negatives(dataset, encoder, verbose=False, **options).to_dict(),
                          theirs.to_dict())
    # a dict of columns, or rows, in: a dict of columns out, the same
    as_dict = mine_hard_negatives(rows, encoder, verbose=False)
    as_rows = mine_hard_negatives([{"question": q, "paragraph": c} for q, c in zip(*rows.values())], encoder,
                                  verbose=False)
    assert as_dict == as_rows == reference(dataset, encoder, verbose=False).to_dict()


def test_refusals(squad_rows, encoder):
    rows = {"question": squad_rows["question"][:6], "paragraph": squad_rows["paragraph"][:6]}
    with pytest.raises(ConfigError, match="num_negatives=5"):
        mine_hard_negatives(rows, encoder, num_negatives=5, range_min=2, range_max=4, verbose=False)
    with pytest.raises(ConfigError, match="output_format"):
        mine_hard_negatives(rows, encoder, output_format="pairs", verbose=False)
    with pytest.raises(ConfigError, match="use_faiss"):
        mine_hard_negatives(rows, encoder, use_faiss=True, verbose=False)
    with pytest.raises(InputError, match="empty"):
        mine_hard_negatives({"question": [], "paragraph": []}, encoder, verbose=False)


DEPRECATED_CASES = {
    "margin": {"margin": 0.05, "num_negatives": 2},
    "n-tuple-scores": {"output_format": "n-tuple-scores", "num_negatives": 2},
    "as_triplets=False": {"as_triplets": False, "num_negatives": 2},
    "as_triplets=True": {"as_triplets": True, "output_format": "labeled-pair"},
    "include_positives over n-tuple-scores": {"include_positives": True, "output_format": "n-tuple-scores"},
}


@pytest.mark.parametrize("case", list(DEPRECATED_CASES))
def test_deprecated_options_as_sentence_transformers_reads_them(squad_rows, encoder, case, caplog):
    """margin is absolute_margin, "n-tuple-scores" is "n-tuple" with scores, as_triplets picks triplet or n-tuple;
    each with a warning."""
    rows = {"question": squad_rows["question"][:12], "paragraph": squad_rows["paragraph"][:12]}
    options = dict(DEPRECATED_CASES[case], verbose=False)
    with caplog.at_level("WARNING", logger="bertforge"):
        mine = mine_hard_negatives(rows, encoder, **options)
    assert any(record.name == "bertforge" for record in caplog.records)
    theirs = reference(datasets.Dataset.from_dict(rows), encoder, **options).to_dict()
    assert len(next(iter(mine.values()))) > 0
    assert_same_table(mine, theirs)
    if "margin" in options:  # the same as absolute_margin
        assert mine == mine_hard_negatives(rows, encoder, absolute_margin=0.05, num_negatives=2, verbose=False)


def test_include_positives_warns_that_filters_may_drop_them(squad_rows, encoder, caplog):
    rows = {"question": squad_rows["question"][:12], "paragraph": squad_rows["paragraph"][:12]}
    for options, warned in (({"max_score": 0.9}, True), ({"range_min": 1}, True), ({"absolute_margin": 0.1}, True),
                            ({"sampling_strategy": "random"}, True), ({}, False)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            mine = mine_hard_negatives(rows, encoder, include_positives=True, verbose=False, **options)
            theirs = reference(datasets.Dataset.from_dict(rows), encoder, include_positives=True, verbose=False,
                               **options).to_dict()
        assert list(mine) == list(theirs)
        messages = {record.name: record.getMessage() for record in caplog.records if "discard" in record.getMessage()}
        assert ("bertforge" in messages) is warned and ("bertforge" in messages) == (len(messages) == 2), options
