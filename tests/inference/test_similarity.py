"""semantic_search against sentence-transformers' util.semantic_search on real questions and paragraphs."""

import pytest
import torch

from bertforge import InputError, SentenceEncoder
from bertforge.inference import semantic_search

st_util = pytest.importorskip("sentence_transformers.util")


@pytest.fixture(scope="module")
def embeddings(data_dir, squad_contexts):
    import json

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    questions = [p["qas"][0]["question"] for article in squad["data"][:3] for p in article["paragraphs"][:4]]
    encoder = SentenceEncoder("default")
    return (encoder.encode(questions, convert_to_tensor=True),
            encoder.encode(squad_contexts[:40], convert_to_tensor=True))


def assert_same_hits(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        assert [hit["corpus_id"] for hit in mine] == [hit["corpus_id"] for hit in reference]
        assert [hit["score"] for hit in mine] == pytest.approx([hit["score"] for hit in reference], abs=1e-5)


@pytest.mark.parametrize("chunks", [{}, {"query_chunk_size": 5, "corpus_chunk_size": 7}])
def test_hits_are_sentence_transformers(embeddings, chunks):
    queries, corpus = embeddings
    for top_k in (1, 5, 100):
        assert_same_hits(semantic_search(queries, corpus, top_k=top_k, **chunks),
                         st_util.semantic_search(queries, corpus, top_k=top_k, **chunks))
    assert_same_hits(semantic_search(queries, corpus, score_function="dot", **chunks),
                     st_util.semantic_search(queries, corpus, score_function=st_util.dot_score, **chunks))
    assert_same_hits(semantic_search(queries[0].numpy(), corpus.numpy(), score_function=st_util.dot_score),
                     st_util.semantic_search(queries[0], corpus, score_function=st_util.dot_score))


def test_bad_arguments_are_one_line_errors(embeddings):
    queries, corpus = embeddings
    with pytest.raises(InputError, match="unknown score_function 'cos'; choose from cosine, dot"):
        semantic_search(queries, corpus, score_function="cos")
    with pytest.raises(InputError, match="top_k must be a positive whole number, got 0"):
        semantic_search(queries, corpus, top_k=0)
    assert semantic_search(queries, torch.empty(0, queries.shape[1])) == [[] for _ in queries]
