"""Similarity between texts' sentence vectors: the table of every pair, the texts ranked by how close they are to a
query (semantic search), and the similarity functions a sentence-transformers checkpoint may name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

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
    query_vector = extract_features(model, tokenizer, [query], normalize=True, **features)[0]
    scores = (vectors @ query_vector).tolist()
    ranked = sorted(range(len(texts)), key=lambda i: scores[i], reverse=True)[:top_k]
    return [(i, scores[i]) for i in ranked]


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
