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


@pytest.fixture(scope="module")
def stsb_sentences(data_dir):
    """STS-B dev sentences: pairs that say nearly the same thing, and many that don't; each sentence once (the
    set repeats some, whose equal scores would rank in any order)."""
    import csv

    with open(data_dir / "stsb" / "dev.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:150]
    return list(dict.fromkeys([row["sentence1"] for row in rows] + [row["sentence2"] for row in rows]))


def assert_same_pairs(ours, theirs):
    """The same pairs with the same scores, closest first (pairs whose scores differ in the last float digits may
    come in either order)."""
    mine, reference = {(i, j): score for score, i, j in ours}, {(i, j): score for score, i, j in theirs}
    assert len(mine) == len(ours) and mine.keys() == reference.keys()
    assert [mine[pair] for pair in reference] == pytest.approx(list(reference.values()), abs=1e-5)
    assert [score for score, _, _ in ours] == sorted((score for score, _, _ in ours), reverse=True)


def test_paraphrase_mining_is_sentence_transformers(stsb_sentences, minilm_dir):
    from bertforge.inference import paraphrase_mining, paraphrase_mining_embeddings

    encoder = SentenceEncoder(minilm_dir)
    reference = pytest.importorskip("sentence_transformers").SentenceTransformer(str(minilm_dir), device="cpu")
    ours, theirs = paraphrase_mining(encoder, stsb_sentences), st_util.paraphrase_mining(reference, stsb_sentences)
    assert len(ours) > 1000 and ours[0][0] > 0.9  # STS-B's near-paraphrases come first
    assert_same_pairs(ours, theirs)
    vectors = encoder.encode(stsb_sentences, convert_to_tensor=True)
    for options in ({"top_k": 3, "max_pairs": 50}, {"top_k": 10, "query_chunk_size": 40, "corpus_chunk_size": 70}):
        assert_same_pairs(paraphrase_mining_embeddings(vectors, **options),
                          st_util.paraphrase_mining_embeddings(vectors, **options))
    assert_same_pairs(paraphrase_mining_embeddings(vectors, top_k=5, score_function="dot"),
                      st_util.paraphrase_mining_embeddings(vectors, top_k=5, score_function=st_util.dot_score))
    with pytest.raises(InputError, match="max_pairs must be a positive whole number"):
        paraphrase_mining_embeddings(vectors, max_pairs=0)


def test_community_detection_is_sentence_transformers(stsb_sentences):
    from bertforge.inference import community_detection

    vectors = SentenceEncoder("default").encode(stsb_sentences, convert_to_tensor=True)
    for threshold, size, batch_size in ((0.6, 2, 1024), (0.45, 3, 64), (0.35, 8, 100)):
        ours = community_detection(vectors, threshold=threshold, min_community_size=size, batch_size=batch_size)
        theirs = st_util.community_detection(vectors, threshold=threshold, min_community_size=size,
                                             batch_size=batch_size)
        assert ours, (threshold, size)
        assert ours == theirs, (threshold, size)
    assert community_detection(vectors[:3], min_community_size=10) == []
