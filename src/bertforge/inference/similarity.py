"""Cosine similarity between texts' sentence vectors: the table of every pair, and the texts ranked by how close
they are to a query (semantic search)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

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
