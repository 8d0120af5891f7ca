"""semantic_search against sentence-transformers' util.semantic_search on real questions and paragraphs."""

import pytest
import torch

from bertforge import InputError, SentenceEncoder
from bertforge.inference import paraphrase_mining_embeddings, semantic_search

st_util = pytest.importorskip("sentence_transformers.util")


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder("default")


@pytest.fixture
def scoring_encoder(encoder):
    """The encoder, its similarity_fn_name back to cosine after the test."""
    yield encoder
    encoder.similarity_fn_name = "cosine"


@pytest.fixture(scope="module")
def embeddings(data_dir, squad_contexts, encoder):
    import json

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    questions = [p["qas"][0]["question"] for article in squad["data"][:3] for p in article["paragraphs"][:4]]
    return (encoder.encode(questions, convert_to_tensor=True),
            encoder.encode(squad_contexts[:40], convert_to_tensor=True))


def assert_same_hits(ours, theirs, rel=None):
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        assert [hit["corpus_id"] for hit in mine] == [hit["corpus_id"] for hit in reference]
        assert [hit["score"] for hit in mine] == pytest.approx([hit["score"] for hit in reference], abs=1e-5, rel=rel)


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
    with pytest.raises(InputError, match="top_k must be a whole number, 0 or more, got -1"):
        semantic_search(queries, corpus, top_k=-1)
    assert semantic_search(queries, torch.empty(0, queries.shape[1])) == [[] for _ in queries]


def test_every_input_form_is_read_as_sentence_transformers_reads_it(embeddings):
    """Tensors, arrays, lists of tensors, lists of arrays, lists of lists, one vector; queries and corpus alike."""
    queries, corpus = embeddings[0][:4], embeddings[1][:12]
    forms = {"tensor": lambda e: e, "array": lambda e: e.numpy(), "list of tensors": list,
             "list of arrays": lambda e: list(e.numpy()), "list of lists": lambda e: e.tolist()}
    for query_form, as_queries in {**forms, "one vector": lambda e: e[0], "one array": lambda e: e[0].numpy()}.items():
        for corpus_form, as_corpus in forms.items():
            assert_same_hits(semantic_search(as_queries(queries), as_corpus(corpus), top_k=3),
                             st_util.semantic_search(as_queries(queries), as_corpus(corpus), top_k=3)), (
                query_form, corpus_form)


def sparse_like(vectors: torch.Tensor) -> torch.Tensor:
    """Real vectors with their small weights dropped, as a sparse COO tensor (what a sparse encoder gives)."""
    return (vectors * (vectors.abs() > 0.06)).to_sparse()


ST_SIMILARITIES = {"cosine": ("cos_sim", "pairwise_cos_sim"), "dot": ("dot_score", "pairwise_dot_score"),
                   "euclidean": ("euclidean_sim", "pairwise_euclidean_sim"),
                   "manhattan": ("manhattan_sim", "pairwise_manhattan_sim")}


def test_sparse_vectors_score_as_in_sentence_transformers(embeddings, scoring_encoder):
    """Sparse queries, corpus or both, in chunks, by every similarity; and SentenceEncoder.similarity(_pairwise)."""
    queries, corpus = embeddings[0][:6], embeddings[1][:30]
    sparse_queries, sparse_corpus, sparse_documents = sparse_like(queries), sparse_like(corpus), sparse_like(corpus[:6])
    assert sparse_corpus.is_sparse and 0 < sparse_corpus._nnz() < corpus.numel() / 2
    for name, (table_name, pairwise_name) in ST_SIMILARITIES.items():
        table = getattr(st_util, table_name)
        for mine, theirs in ((sparse_queries, sparse_corpus), (queries, sparse_corpus), (sparse_queries, corpus)):
            for chunks in ({}, {"query_chunk_size": 4, "corpus_chunk_size": 7}):
                # distances of ~15 (manhattan) agree to float32's last digits
                assert_same_hits(semantic_search(mine, theirs, top_k=5, score_function=name, **chunks),
                                 st_util.semantic_search(mine, theirs, top_k=5, score_function=table, **chunks),
                                 rel=1e-6)
        scoring_encoder.similarity_fn_name = name
        for first, second in ((sparse_queries, sparse_documents), (queries, sparse_documents),
                              (list(sparse_queries), list(sparse_documents))):
            ours, reference = scoring_encoder.similarity(first, second), table(first, second)
            assert not ours.is_sparse and ours.dtype == reference.dtype
            assert torch.allclose(ours, reference, atol=1e-4), name
        for first, second in ((sparse_queries, sparse_documents), (queries, sparse_documents),
                              (list(sparse_queries), list(sparse_documents))):
            ours = scoring_encoder.similarity_pairwise(first, second)
            reference = getattr(st_util, pairwise_name)(first, second)
            assert not ours.is_sparse and ours.shape == reference.shape
            assert torch.allclose(ours, reference, atol=1e-4), name


def test_half_precision_is_scored_in_float32(embeddings, scoring_encoder):
    """float16 and bfloat16 vectors score as their float32 values do (half-precision products would round
    nearby scores together), as in sentence-transformers; float64 stays float64."""
    queries, corpus = embeddings
    for dtype in (torch.float16, torch.bfloat16):
        exact_queries, exact_corpus = queries.to(dtype).float(), corpus.to(dtype).float()
        ours = semantic_search(queries.to(dtype), corpus.to(dtype), top_k=8)
        assert_same_hits(ours, st_util.semantic_search(queries.to(dtype), corpus.to(dtype), top_k=8))
        assert_same_hits(ours, semantic_search(exact_queries, exact_corpus, top_k=8))
        assert_same_pairs(paraphrase_mining_embeddings(corpus.to(dtype), top_k=3, max_pairs=40),
                          st_util.paraphrase_mining_embeddings(corpus.to(dtype), top_k=3, max_pairs=40))
        for name, (table_name, pairwise_name) in ST_SIMILARITIES.items():
            scoring_encoder.similarity_fn_name = name
            ours = scoring_encoder.similarity(queries.to(dtype), corpus.to(dtype))
            assert ours.dtype == torch.float32
            assert torch.equal(ours, getattr(st_util, table_name)(queries.to(dtype), corpus.to(dtype))), name
            ours = scoring_encoder.similarity_pairwise(queries.to(dtype), corpus[:len(queries)].to(dtype))
            reference = getattr(st_util, pairwise_name)(queries.to(dtype), corpus[:len(queries)].to(dtype))
            assert ours.dtype == torch.float32 and torch.allclose(ours, reference, atol=1e-6), name
    for name, (table_name, pairwise_name) in ST_SIMILARITIES.items():
        scoring_encoder.similarity_fn_name = name
        first, second = queries.double(), corpus[:len(queries)].double()
        ours, reference = scoring_encoder.similarity(first, second), getattr(st_util, table_name)(first, second)
        assert ours.dtype == torch.float64 and torch.allclose(ours, reference, atol=1e-12), name
        ours = scoring_encoder.similarity_pairwise(first, second)
        reference = getattr(st_util, pairwise_name)(first, second)
        assert ours.dtype == torch.float64 and torch.allclose(ours, reference, atol=1e-12), name
        assert scoring_encoder.similarity(first.numpy(), second.numpy()).dtype == torch.float64


def test_positional_arguments_are_in_sentence_transformers_order(embeddings, encoder, stsb_sentences):
    import inspect

    from bertforge.inference import paraphrase_mining, paraphrase_mining_embeddings

    for ours, theirs in ((semantic_search, st_util.semantic_search), (paraphrase_mining, st_util.paraphrase_mining),
                         (paraphrase_mining_embeddings, st_util.paraphrase_mining_embeddings)):
        mine, reference = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        assert list(mine) == list(reference), ours.__name__
        assert [p.default for p in mine.values() if p.name != "score_function"] == \
            [p.default for p in reference.values() if p.name != "score_function"], ours.__name__
    queries, corpus = embeddings
    assert_same_hits(semantic_search(queries, corpus, 5, 7, 3), st_util.semantic_search(queries, corpus, 5, 7, 3))
    assert_same_pairs(paraphrase_mining_embeddings(corpus, 15, 25, 20, 2),
                      st_util.paraphrase_mining_embeddings(corpus, 15, 25, 20, 2))
    # sentence-transformers' paraphrase_mining runs on a SentenceEncoder too (its encode)
    ours = paraphrase_mining(encoder, stsb_sentences[:30], False, 16, 20, 25, 25, 2)
    assert len(ours) == 25
    assert_same_pairs(ours, st_util.paraphrase_mining(encoder, stsb_sentences[:30], False, 16, 20, 25, 25, 2))


def test_zero_counts_and_no_queries_answer_nothing(embeddings):
    """top_k=0, max_pairs=0 and (0, d) queries: empty answers, as sentence-transformers gives them."""
    queries, corpus = embeddings
    for ours, theirs in ((semantic_search(queries, corpus, top_k=0), st_util.semantic_search(queries, corpus, top_k=0)),
                         (semantic_search(queries[:0], corpus), st_util.semantic_search(queries[:0], corpus)),
                         (paraphrase_mining_embeddings(corpus, max_pairs=0),
                          st_util.paraphrase_mining_embeddings(corpus, max_pairs=0)),
                         (paraphrase_mining_embeddings(corpus, top_k=0),
                          st_util.paraphrase_mining_embeddings(corpus, top_k=0))):
        assert ours == theirs
    assert semantic_search(queries, corpus, top_k=0) == [[] for _ in queries]
    assert semantic_search(queries[:0], corpus) == [] and paraphrase_mining_embeddings(corpus, top_k=0) == []
    with pytest.raises(InputError, match="max_pairs must be a whole number, 0 or more, got -1"):
        paraphrase_mining_embeddings(corpus, max_pairs=-1)


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
    from bertforge.inference import paraphrase_mining

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
    with pytest.raises(InputError, match="top_k must be a whole number, 0 or more"):
        paraphrase_mining_embeddings(vectors, top_k=-2)


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
