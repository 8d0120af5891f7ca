"""Similarity between texts' sentence vectors: the table of every pair, the texts ranked by how close they are to a
query (semantic search), the closest pairs of a collection (paraphrase mining), groups of close texts (community
detection), and the similarity functions a sentence-transformers checkpoint may name."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.errors import InputError
from bertforge.inference.features import extract_features
from bertforge.validation import check_counts

ScoreFunction = str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # a SIMILARITIES name, or the function


def similarity_table(model, tokenizer, texts: Sequence[str], **features: Any) -> torch.Tensor:
    """(texts, texts) cosine similarities; `features` are extract_features' options (pooling, layers, ...)."""
    vectors = extract_features(model, tokenizer, texts, normalize=True, **features)
    return vectors @ vectors.T


def most_similar(model, tokenizer, query: str, texts: Sequence[str], top_k: int = 10, **features: Any
                 ) -> list[tuple[int, float]]:
    """The `top_k` texts closest to `query`, as (index into texts, cosine similarity), closest first."""
    check_counts(top_k=top_k)
    vectors = extract_features(model, tokenizer, texts, normalize=True, **features)
    features.pop("progress", None)  # one query: no progress bar
    query_vector = extract_features(model, tokenizer, [query], normalize=True, **features)
    hits = semantic_search(query_vector, vectors, top_k=top_k, score_function="dot")[0]
    return [(hit["corpus_id"], hit["score"]) for hit in hits]


def semantic_search(query_embeddings: Any, corpus_embeddings: Any, query_chunk_size: int = 100,
                    corpus_chunk_size: int = 500_000, top_k: int = 10, score_function: ScoreFunction = "cosine"
                    ) -> list[list[dict[str, Any]]]:
    """Per query vector, the `top_k` closest corpus vectors as [{"corpus_id", "score"}], closest first: what
    sentence-transformers' util.semantic_search gives (the same arguments, in its order). The embeddings: tensors
    (dense or sparse), arrays, or lists of vectors. `score_function`: a SIMILARITIES name or a function
    (queries, corpus) -> (n, m) scores. The corpus is read in chunks, so the score table never holds all of it."""
    queries, corpus = as_matrices(query_embeddings, corpus_embeddings, ("query_embeddings", "corpus_embeddings"))
    queries = queries.to(corpus.device)
    if isinstance(score_function, str) and score_function not in SIMILARITIES:
        raise InputError(f"unknown score_function {score_function!r}; choose from {', '.join(SIMILARITIES)}")
    check_counts(query_chunk_size=query_chunk_size, corpus_chunk_size=corpus_chunk_size)
    check_not_negative(top_k=top_k)
    score = SIMILARITIES[score_function].table if isinstance(score_function, str) else score_function
    # cosine: a corpus chunk normalized once, not once per query chunk (and never a normalized copy of it all)
    prepare = unit_rows if score_function == "cosine" else (lambda matrix: matrix)
    score = SIMILARITIES["dot"].table if score_function == "cosine" else score
    best_scores = best_ids = None
    for start in range(0, len(corpus) if top_k and len(queries) else 0, corpus_chunk_size):
        chunk = prepare(rows(corpus, start, start + corpus_chunk_size))
        scores = torch.cat([score(prepare(rows(queries, i, i + query_chunk_size)), chunk).detach().cpu()
                            for i in range(0, len(queries), query_chunk_size)])
        top = scores.topk(min(top_k, scores.shape[1]), dim=1)
        if best_scores is None:
            best_scores, best_ids = top.values, top.indices + start
            continue
        # the best so far and this chunk's best, of which the top_k stay
        best_scores, best_ids = torch.cat([best_scores, top.values], 1), torch.cat([best_ids, top.indices + start], 1)
        kept = best_scores.topk(min(top_k, best_scores.shape[1]), dim=1)
        best_scores, best_ids = kept.values, best_ids.gather(1, kept.indices)
    if best_scores is None:
        return [[] for _ in queries]
    return [[{"corpus_id": i, "score": value} for i, value in zip(ids, values)]
            for ids, values in zip(best_ids.tolist(), best_scores.tolist())]


def paraphrase_mining(model: Any, sentences: Sequence[str], show_progress_bar: bool = False, batch_size: int = 32,
                      query_chunk_size: int = 5000, corpus_chunk_size: int = 100_000, max_pairs: int = 500_000,
                      top_k: int = 100, score_function: ScoreFunction = "cosine", truncate_dim: int | None = None,
                      prompt_name: str | None = None, prompt: str | None = None) -> list[list[float | int]]:
    """The closest pairs of `sentences` as [score, i, j] (i < j), closest first: sentence-transformers'
    util.paraphrase_mining (the same arguments, in its order); `model`: a SentenceEncoder (or anything with its
    encode)."""
    embeddings = model.encode(list(sentences), batch_size=batch_size, show_progress_bar=show_progress_bar,
                              convert_to_tensor=True, truncate_dim=truncate_dim, prompt_name=prompt_name, prompt=prompt)
    return paraphrase_mining_embeddings(embeddings, query_chunk_size=query_chunk_size,
                                        corpus_chunk_size=corpus_chunk_size, max_pairs=max_pairs, top_k=top_k,
                                        score_function=score_function)


def paraphrase_mining_embeddings(embeddings: Any, query_chunk_size: int = 5000, corpus_chunk_size: int = 100_000,
                                 max_pairs: int = 500_000, top_k: int = 100, score_function: ScoreFunction = "cosine"
                                 ) -> list[list[float | int]]:
    """Pairs of close vectors as [score, i, j] (i < j), closest first, at most `max_pairs`: each vector's `top_k`
    nearest others (semantic_search of the collection against itself) are the candidates, each pair once.
    sentence-transformers' util.paraphrase_mining_embeddings, its arguments in its order."""
    check_not_negative(max_pairs=max_pairs, top_k=top_k)
    if not max_pairs or not top_k:
        return []
    hits = semantic_search(embeddings, embeddings, query_chunk_size=query_chunk_size,
                           corpus_chunk_size=corpus_chunk_size, top_k=top_k + 1, score_function=score_function)
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
    matrix = as_matrix(embeddings)
    vectors = F.normalize(matrix.to_dense() if matrix.is_sparse else matrix, dim=-1)
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


def as_matrix(embeddings: Any, name: str = "embeddings") -> torch.Tensor:
    """(n, d) tensor of a tensor (dense or sparse), an array, a list of vectors (tensors, arrays or lists), or one
    vector; in scoring_dtype. An empty vector or list is (0, 0): no vectors. Anything else (None, text, a 3D
    tensor) is refused, naming `name`."""
    if embeddings is None or isinstance(embeddings, str | bytes):
        raise InputError(f"{name} must be vectors (a tensor, an array or a list of vectors), got "
                         f"{type(embeddings).__name__}")
    if isinstance(embeddings, list | tuple) and embeddings and all(isinstance(e, torch.Tensor) for e in embeddings):
        matrix = torch.stack([e.coalesce() if e.is_sparse else e for e in embeddings])
    elif isinstance(embeddings, list | tuple) and embeddings and all(isinstance(e, np.ndarray) for e in embeddings):
        matrix = torch.as_tensor(np.stack(embeddings))
    elif isinstance(embeddings, torch.Tensor):
        matrix = embeddings
    elif isinstance(embeddings, list | tuple):
        matrix = torch.tensor(embeddings)  # Python floats: float32, as sentence-transformers reads them
    else:
        matrix = torch.as_tensor(np.asarray(embeddings))
    if matrix.dim() > 2:
        raise InputError(f"{name} must be one vector or a (vectors, dimensions) matrix, got shape "
                         f"{tuple(matrix.shape)}")
    matrix = matrix.to(scoring_dtype(matrix))
    if matrix.dim() == 1:
        return matrix.unsqueeze(0) if len(matrix) else matrix.reshape(0, 0)
    return matrix


def as_matrices(first: Any, second: Any, names: tuple[str, str] = ("embeddings1", "embeddings2")
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sets of vectors to compare, each as_matrix's (n, d), refused unless their vectors are of one width."""
    matrices = as_matrix(first, names[0]), as_matrix(second, names[1])
    widths = [matrix.shape[-1] for matrix in matrices]
    if all(len(matrix) for matrix in matrices) and widths[0] != widths[1]:
        raise InputError(f"{names[0]} has vectors of {widths[0]} dimensions, {names[1]} of {widths[1]}: they "
                         f"compare only at one width")
    return matrices


def scoring_dtype(matrix: torch.Tensor) -> torch.dtype:
    """float64 stays; anything else is scored in float32, as sentence-transformers does: half-precision products
    round nearby scores into ties, and its sparse vectors are float32."""
    return torch.float64 if matrix.dtype == torch.float64 and not matrix.is_sparse else torch.float32


def check_not_negative(**counts: Any) -> None:
    """InputError unless each value is a whole number, 0 or more (0: sentence-transformers answers with nothing)."""
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{name} must be a whole number, 0 or more, got {value!r}")


def rows(matrix: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows start to stop of a dense or sparse matrix (a sparse one can't be sliced)."""
    if not matrix.is_sparse:
        return matrix[start:stop]
    if start == 0 and stop >= len(matrix):
        return matrix
    return matrix.index_select(0, torch.arange(start, min(stop, len(matrix)), device=matrix.device))


def unit_rows(matrix: torch.Tensor) -> torch.Tensor:
    """Each row scaled to length 1 (a zero row stays zero); a sparse matrix stays sparse."""
    if not matrix.is_sparse:
        return F.normalize(matrix, dim=-1)
    matrix = matrix.coalesce()
    row_of = matrix.indices()[0]
    lengths = squared_lengths(matrix).sqrt().clamp_min(1e-12)
    return torch.sparse_coo_tensor(matrix.indices(), matrix.values() / lengths[row_of], matrix.shape,
                                   is_coalesced=True, check_invariants=False)  # the indices of a coalesced tensor


def squared_lengths(matrix: torch.Tensor) -> torch.Tensor:
    """(n,) each row's squared length, dense."""
    if not matrix.is_sparse:
        return (matrix * matrix).sum(-1)
    matrix = matrix.coalesce()
    return matrix.values().new_zeros(len(matrix)).index_add_(0, matrix.indices()[0], matrix.values() ** 2)


def dot_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, m) dense dot products of (n, d) and (m, d), either or both sparse (sparse products stay sparse until
    the end, so a large vocabulary is never made dense)."""
    if a.is_sparse and b.is_sparse:
        return torch.sparse.mm(a, b.t()).to_dense()
    if b.is_sparse:
        return (b @ a.T).T
    return a @ b.T


DENSE_BLOCK_ELEMENTS = 1 << 24  # how much of a sparse matrix is made dense at a time, where it has to be


def dense_blocks(matrix: torch.Tensor) -> Iterator[torch.Tensor]:
    """A sparse matrix as dense blocks of rows, made one at a time, each at most DENSE_BLOCK_ELEMENTS values; a
    dense one whole."""
    if not matrix.is_sparse or not len(matrix):
        yield matrix.to_dense()
        return
    size = max(1, DENSE_BLOCK_ELEMENTS // max(1, matrix.shape[-1]))
    for start in range(0, len(matrix), size):
        yield rows(matrix, start, start + size).to_dense()


def euclidean_table(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not (a.is_sparse or b.is_sparse):
        return -torch.cdist(a, b)
    # |a - b|² from the lengths and the dot products, as sentence-transformers does for sparse vectors
    squared = squared_lengths(a)[:, None] - 2 * dot_products(a, b) + squared_lengths(b)[None]
    return -squared.clamp_min(0).sqrt()


def manhattan_table(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # no sparse form of |a - b|: sparse vectors are compared a dense block at a time
    return torch.cat([torch.cat([-torch.cdist(block_a, block_b, p=1) for block_b in dense_blocks(b)], 1)
                      for block_a in dense_blocks(a)])


def pairwise_by_blocks(pairwise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                       ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`pairwise` on sparse rows a dense block at a time (its i-th row of a with the i-th of b)."""
    def blockwise(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not (a.is_sparse or b.is_sparse):
            return pairwise(a, b)
        size = max(1, DENSE_BLOCK_ELEMENTS // max(1, a.shape[-1]))
        return torch.cat([pairwise(rows(a, start, start + size).to_dense(), rows(b, start, start + size).to_dense())
                          for start in range(0, len(a), size)] or [a.new_zeros(0)])
    return blockwise


def scored_in(function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
              ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`function` on its two inputs in their scoring_dtype (float64 when both are, else float32)."""
    def scored(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(scoring_dtype(a), scoring_dtype(b))
        return function(a.to(dtype), b.to(dtype))
    return scored


@dataclass(frozen=True)
class Similarity:
    """One way to compare vectors (dense or sparse, any float dtype): higher is closer."""

    table: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (n, d), (m, d) -> (n, m)
    pairwise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (n, d), (n, d) -> (n,)

    def __post_init__(self):  # every input in its scoring dtype, and sparse pairs compared a block at a time
        object.__setattr__(self, "table", scored_in(self.table))
        object.__setattr__(self, "pairwise", scored_in(pairwise_by_blocks(self.pairwise)))


# sentence-transformers' similarity functions, by the name its config_sentence_transformers.json gives
# (similarity_fn_name): distances are negated so that higher is closer for every one.
SIMILARITIES: dict[str, Similarity] = {
    "cosine": Similarity(lambda a, b: dot_products(unit_rows(a), unit_rows(b)),
                         lambda a, b: (F.normalize(a, dim=-1) * F.normalize(b, dim=-1)).sum(-1)),
    "dot": Similarity(dot_products, lambda a, b: (a * b).sum(-1)),
    "euclidean": Similarity(euclidean_table, lambda a, b: -(a - b).norm(dim=-1)),
    "manhattan": Similarity(manhattan_table, lambda a, b: -(a - b).abs().sum(-1)),
}
