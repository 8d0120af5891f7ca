"""Similarity between texts' sentence vectors: the table of every pair, the texts ranked by how close they are to a
query (semantic search), the closest pairs of a collection (paraphrase mining), groups of close texts (community
detection), and the similarity functions a sentence-transformers checkpoint may name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.errors import InputError
from bertforge.inference.features import extract_features
from bertforge.validation import check_counts


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
    check_counts(top_k=top_k, query_chunk_size=query_chunk_size, corpus_chunk_size=corpus_chunk_size)
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


def paraphrase_mining(encoder: Any, sentences: Sequence[str], batch_size: int = 32, top_k: int = 100,
                      max_pairs: int = 500_000,
                      score_function: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "cosine",
                      truncate_dim: int | None = None, prompt_name: str | None = None, prompt: str | None = None,
                      show_progress_bar: bool = False, query_chunk_size: int = 5000,
                      corpus_chunk_size: int = 100_000) -> list[list[float | int]]:
    """The closest pairs of `sentences` as [score, i, j] (i < j), closest first: sentence-transformers'
    util.paraphrase_mining, with a SentenceEncoder (or anything with its encode)."""
    embeddings = encoder.encode(list(sentences), batch_size=batch_size, show_progress_bar=show_progress_bar,
                                convert_to_tensor=True, truncate_dim=truncate_dim, prompt_name=prompt_name,
                                prompt=prompt)
    return paraphrase_mining_embeddings(embeddings, top_k, max_pairs, score_function, query_chunk_size,
                                        corpus_chunk_size)


def paraphrase_mining_embeddings(embeddings: Any, top_k: int = 100, max_pairs: int = 500_000,
                                 score_function: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "cosine",
                                 query_chunk_size: int = 5000, corpus_chunk_size: int = 100_000
                                 ) -> list[list[float | int]]:
    """Pairs of close vectors as [score, i, j] (i < j), closest first, at most `max_pairs`: each vector's `top_k`
    nearest others (semantic_search of the collection against itself) are the candidates, each pair once."""
    check_counts(max_pairs=max_pairs, top_k=top_k)
    hits = semantic_search(embeddings, embeddings, top_k + 1, score_function, query_chunk_size, corpus_chunk_size)
    pairs: dict[tuple[int, int], float] = {}
    for i, row in enumerate(hits):
        for hit in [hit for hit in row if hit["corpus_id"] != i][:top_k]:
            pairs.setdefault((min(i, hit["corpus_id"]), max(i, hit["corpus_id"])), hit["score"])
    ranked = sorted(pairs.items(), key=lambda item: item[1], reverse=True)[:max_pairs]
    return [[score, i, j] for (i, j), score in ranked]


def community_detection(embeddings: Any, threshold: float = 0.75, min_community_size: int = 10,
                        batch_size: int = 1024, show_progress_bar: bool = False) -> list[list[int]]:
    """Groups of vectors within `threshold` cosine similarity of a central one, largest first, no vector in two:
    sentence-transformers' util.community_detection. Every vector with at least `min_community_size` others this
    close (itself included) proposes its neighbourhood (closest first); the largest proposals take their members
    first, and a proposal keeps what is left of it if that is still `min_community_size` strong."""
    vectors = F.normalize(as_matrix(embeddings), dim=-1)
    check_counts(min_community_size=min_community_size)
    proposals = []
    for start in range(0, len(vectors), batch_size):
        for offset, row in enumerate(vectors[start:start + batch_size] @ vectors.T):
            close = (row >= threshold).nonzero().squeeze(-1)
            if len(close) >= min_community_size:
                proposals.append((start + offset, close[row[close].argsort(descending=True, stable=True)].tolist()))
    proposals.sort(key=lambda proposal: len(proposal[1]), reverse=True)
    taken: set[int] = set()
    communities = []
    for center, members in proposals:
        left = [member for member in members if member not in taken]
        if center not in taken and len(left) >= min_community_size:
            communities.append([center] + [member for member in left if member != center])
            taken.update(communities[-1])
    return sorted(communities, key=len, reverse=True)


def as_matrix(embeddings: Any) -> torch.Tensor:
    """(n, d) float32 of an array, a tensor, a list of vectors, or one vector."""
    if isinstance(embeddings, list | tuple) and embeddings and isinstance(embeddings[0], torch.Tensor):
        embeddings = torch.stack(list(embeddings))
    matrix = embeddings if isinstance(embeddings, torch.Tensor) else torch.as_tensor(np.asarray(embeddings))
    matrix = matrix.float()
    return matrix[None] if matrix.dim() == 1 else matrix


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
