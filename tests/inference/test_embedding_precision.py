"""quantize_embeddings against sentence-transformers' on real sentence and token vectors (MiniLM, SST-2 reviews):
the same arrays, with ranges from the embeddings, from calibration embeddings, or given; multi-vector lists with one
set of ranges."""

import json

import numpy as np
import pytest
import torch

from bertforge import InputError, SentenceEncoder
from bertforge.inference import quantize_embeddings

quantization = pytest.importorskip("sentence_transformers.quantization")
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


@pytest.fixture(scope="module")
def vectors(sst2_dev):
    encoder = SentenceEncoder("default")
    texts = [text for text, _ in sst2_dev[:48]]
    return {"queries": encoder.encode(texts[:8]), "corpus": encoder.encode(texts[8:]),
            "tokens": encoder.encode(texts[:5], output_value="token_embeddings")}


def assert_same(mine, theirs):
    assert type(mine) is type(theirs)
    if isinstance(theirs, list):
        assert len(mine) == len(theirs)
        for one, other in zip(mine, theirs):
            assert_same(one, other)
        return
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
    assert np.array_equal(mine, theirs)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_matches_sentence_transformers(vectors, precision):
    queries, corpus = vectors["queries"], vectors["corpus"]
    assert_same(quantize_embeddings(corpus, precision), quantization.quantize_embeddings(corpus, precision))
    assert_same(quantize_embeddings(torch.from_numpy(queries), precision, calibration_embeddings=corpus),
                quantization.quantize_embeddings(torch.from_numpy(queries), precision,
                                                 calibration_embeddings=corpus))
    ranges = np.vstack([corpus.min(0), corpus.max(0)])
    assert_same(quantize_embeddings(queries[:1], precision, ranges=ranges),
                quantization.quantize_embeddings(queries[:1], precision, ranges=ranges))
    assert_same(quantize_embeddings(list(queries), precision), quantization.quantize_embeddings(list(queries),
                                                                                                 precision))
    tokens = [torch.as_tensor(matrix) for matrix in vectors["tokens"]]  # one set of ranges for every token
    assert_same(quantize_embeddings(tokens, precision), quantization.quantize_embeddings(tokens, precision))


def test_quantized_retrieval_finds_what_float32_finds(data_dir):
    """What the precisions are for: each of 60 SQuAD questions looks for its paragraph among the 60; int8 dot
    products and binary Hamming distances find about as many as float32 cosine does."""
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    pairs = [(paragraph["qas"][0]["question"], paragraph["context"]) for article in squad["data"]
             for paragraph in article["paragraphs"]][:60]
    encoder = SentenceEncoder("default")
    queries, corpus = encoder.encode([q for q, _ in pairs]), encoder.encode([c for _, c in pairs])
    gold = np.arange(len(pairs))
    found = ((queries @ corpus.T).argmax(1) == gold).mean()
    int8_corpus = quantize_embeddings(corpus, "int8").astype(np.int32)
    int8_queries = quantize_embeddings(queries, "int8", calibration_embeddings=corpus).astype(np.int32)
    found_int8 = ((int8_queries @ int8_corpus.T).argmax(1) == gold).mean()
    bits = np.unpackbits(quantize_embeddings(corpus, "ubinary"), axis=1)
    query_bits = np.unpackbits(quantize_embeddings(queries, "ubinary"), axis=1)
    found_binary = ((query_bits[:, None, :] != bits[None]).sum(-1).argmin(1) == gold).mean()
    assert found >= 0.5 and found_int8 >= found - 0.05 and found_binary >= found - 0.1, (found, found_int8,
                                                                                        found_binary)


def test_refusals(vectors):
    with pytest.raises(InputError, match="more than one"):
        quantize_embeddings(vectors["queries"][:1], "int8")
    with pytest.raises(InputError, match="must be floats"):
        quantize_embeddings(quantize_embeddings(vectors["queries"], "int8"), "binary")
    with pytest.raises(InputError, match="precision"):
        quantize_embeddings(vectors["queries"], "int4")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_empty_matrices_as_sentence_transformers_gives_them(vectors, precision):
    """A (0, dim) matrix (a multi-vector document with every token masked) has nothing to calibrate: each precision
    gives its empty array, alone, in a list of its own, or beside real token matrices."""
    dim = vectors["queries"].shape[1]
    empty = np.zeros((0, dim), dtype=np.float32)
    tokens = [torch.as_tensor(vectors["tokens"][0]), torch.from_numpy(empty), torch.as_tensor(vectors["tokens"][1])]
    for embeddings in (empty, [empty], [empty, empty], tokens, torch.from_numpy(empty)):
        mine, theirs = quantize_embeddings(embeddings, precision), quantization.quantize_embeddings(embeddings,
                                                                                                    precision)
        assert_same(mine, theirs)
    assert quantize_embeddings(empty, precision).shape == (0, dim if precision in ("float32", "int8", "uint8")
                                                           else dim // 8)
    ranges = np.vstack([vectors["corpus"].min(0), vectors["corpus"].max(0)])
    assert_same(quantize_embeddings([empty], precision, ranges=ranges),
                quantization.quantize_embeddings([empty], precision, ranges=ranges))
