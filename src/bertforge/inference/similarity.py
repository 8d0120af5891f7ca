"""Similarity between texts' sentence vectors: the table of every pair, the texts ranked by how close they are to a
query (semantic search), and the similarity functions a sentence-transformers checkpoint may name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.errors import InputError
from bertforge.inference.features import extract_features


def similarity_table(model, tokenizer, texts: Sequence[str], **features: Any) -> torch.Tensor:
    """(texts, texts) cosine similarities; `features` are extract_features' options (pooling, layers, ...)."""
    vectors = extract_features(model, tokenizer, texts, normalize=True, **features)
    return vectors @ vectors.T


def most_similar(model, tokenizer, query: str, texts: Sequence[str], top_k: int = 10, **features: Any
                 ) -> list[tuple[int, float]]:
    """The `top_k` texts closest to `query`, as (index into texts, cosine similarity), closest first."""
    vectors = extract_features(model, tokenizer, texts, normalize=True, **features)
    features.pop("progress", None)  # one query: no progress bar
    query_vector = extract_features(model, tokenizer, [query], normalize=True, **features)
    return [(hit["corpus_id"], hit["score"]) for hit in semantic_search(query_vector, vectors, top_k, "dot")[0]]


def semantic_search(query_embeddings: Any, corpus_embeddings: Any, top_k: int = 10,
                    score_function: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "cosine",
                    query_chunk_size: int = 100, corpus_chunk_size: int = 500_000) -> list[list[dict[str, Any]]]:
    """Per query vector, the `top_k` closest corpus vectors as [{"corpus_id", "score"}], closest first: what
    sentence-transformers' util.semantic_search gives. `score_function`: a SIMILARITIES name or a function
    (queries, corpus) -> (n, m) scores. The corpus is read in chunks, so the score table never holds all of it."""
    queries, corpus = (torch.as_tensor(e) if not isinstance(e, torch.Tensor) else e
                       for e in (query_embeddings, corpus_embeddings))
    queries = (queries[None] if queries.dim() == 1 else queries).to(corpus.device)
    if isinstance(score_function, str) and score_function not in SIMILARITIES:
        raise InputError(f"unknown score_function {score_function!r}; choose from {', '.join(SIMILARITIES)}")
    score = SIMILARITIES[score_function].table if isinstance(score_function, str) else score_function
    for name, value in (("top_k", top_k), ("query_chunk_size", query_chunk_size),
                        ("corpus_chunk_size", corpus_chunk_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a positive whole number, got {value!r}")
    best_scores = torch.full((len(queries), 0), float("-inf"))
    best_ids = torch.zeros((len(queries), 0), dtype=torch.long)
    for start in range(0, len(corpus), corpus_chunk_size):
        chunk = corpus[start:start + corpus_chunk_size]
        scores = torch.cat([score(queries[i:i + query_chunk_size], chunk).float().cpu()
                            for i in range(0, len(queries), query_chunk_size)])
        top = scores.topk(min(top_k, scores.shape[1]), dim=1)
        # the best so far and this chunk's best, of which the top_k stay
        best_scores, best_ids = torch.cat([best_scores, top.values], 1), torch.cat([best_ids, top.indices + start], 1)
        kept = best_scores.topk(min(top_k, best_scores.shape[1]), dim=1)
        best_scores, best_ids = kept.values, best_ids.gather(1, kept.indices)
    return [[{"corpus_id": i, "score": value} for i, value in zip(ids, values)]
            for ids, values in zip(best_ids.tolist(), best_scores.tolist())]


@dataclass(frozen=True)
class Similarity:
    """One way to compare vectors: higher is closer."""

    table: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (n, d), (m, d) -> (n, m)
    pairwise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (n, d), (n, d) -> (n,)


# sentence-transformers' similarity functions, by the name its config_sentence_transformers.json gives
# (similarity_fn_name): distances are negated so that higher is closer for every one.
SIMILARITIES: dict[str, Similarity] = {
    "cosine": Similarity(lambda a, b: F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T,
                         lambda a, b: (F.normalize(a, dim=-1) * F.normalize(b, dim=-1)).sum(-1)),
    "dot": Similarity(lambda a, b: a @ b.T, lambda a, b: (a * b).sum(-1)),
    "euclidean": Similarity(lambda a, b: -torch.cdist(a, b), lambda a, b: -(a - b).norm(dim=-1)),
    "manhattan": Similarity(lambda a, b: -torch.cdist(a, b, p=1), lambda a, b: -(a - b).abs().sum(-1)),
}
