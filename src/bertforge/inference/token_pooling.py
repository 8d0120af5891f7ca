"""Token pooling for multi-vector (ColBERT) documents: fewer token vectors per document, for a smaller index
(Clavié et al., 2024, as PyLate and sentence-transformers' HierarchicalTokenPooling do it).

A document's token vectors (after the first, [CLS], which is kept) are clustered by Ward's hierarchical
clustering on cosine distance, and each cluster is replaced by the mean of its vectors. The tree is cut where it
leaves len / pool_factor clusters, or max_tokens, or at a distance. The clustering is computed as scipy computes it
(the nearest-neighbour chain, merges sorted by height, clusters numbered left to right), so the pooled vectors come
out as sentence-transformers gives them, in the same order, without scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.errors import ConfigError


def ward_linkage(distances: np.ndarray) -> np.ndarray:
    """Ward's agglomerative clustering of n points given their (n, n) distances: (n - 1, 4) merges of [first,
    second, height, size], clusters numbered as scipy.cluster.hierarchy.linkage(..., "ward") numbers them (the
    points 0..n-1, then merge k makes cluster n + k), in order of height."""
    n = len(distances)
    # between[i, j]: the Ward distance of the clusters held at i and j; from the upper triangle, which is what
    # scipy's condensed distances hold (a float32 product need not be symmetric to the last bit)
    upper = np.triu(np.asarray(distances, dtype=np.float64), 1)
    between = upper + upper.T
    sizes = np.ones(n, dtype=np.int64)  # 0: the cluster held there was merged away
    merges = np.empty((n - 1, 4))
    chain: list[int] = []  # each one's nearest neighbour follows it, until two are each other's
    for step in range(n - 1):
        if not chain:
            chain.append(int(np.flatnonzero(sizes)[0]))
        while True:
            last = chain[-1]
            candidates = np.where(sizes > 0, between[last], np.inf)
            candidates[last] = np.inf
            nearest = int(np.argmin(candidates))  # the first of equals, as scipy's scan finds it
            if len(chain) > 1:
                if not candidates[nearest] < between[last, chain[-2]]:
                    nearest = chain[-2]  # reciprocal nearest neighbours: merge them
                if nearest == chain[-2]:
                    break
            chain.append(nearest)
        first, second = sorted((chain.pop(), chain.pop()))
        height = between[first, second]
        size_first, size_second = sizes[first], sizes[second]
        merges[step] = first, second, height, size_first + size_second
        sizes[first], sizes[second] = 0, size_first + size_second
        # The merged cluster is held at `second`: the Lance-Williams update of its distances, as scipy writes it.
        others = np.flatnonzero(sizes)
        others = others[others != second]
        size_other = sizes[others]
        to_first, to_second = between[others, first], between[others, second]
        share = 1.0 / (size_first + size_second + size_other)
        updated = np.sqrt((size_other + size_first) * share * to_first * to_first
                          + (size_other + size_second) * share * to_second * to_second
                          - size_other * share * height * height)
        between[others, second] = between[second, others] = updated
    merges = merges[np.argsort(merges[:, 2], kind="mergesort")]
    return _numbered(merges, n)


def _numbered(merges: np.ndarray, n: int) -> np.ndarray:
    """Merges found by where their clusters were held, renumbered as clusters: point i is i, merge k is n + k."""
    parent = np.arange(2 * n - 1)
    sizes = np.ones(2 * n - 1, dtype=np.int64)

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for step, (first, second) in enumerate(merges[:, :2].astype(np.int64)):
        first, second = sorted((root(int(first)), root(int(second))))
        parent[first] = parent[second] = n + step
        sizes[n + step] = sizes[first] + sizes[second]
        merges[step, :2], merges[step, 3] = (first, second), sizes[n + step]
    return merges


def subtree_heights(merges: np.ndarray) -> np.ndarray:
    """The highest merge within each merge's subtree (scipy's maxdists): Ward's heights, where rounding leaves them
    unordered."""
    n = len(merges) + 1
    highest = np.empty(n - 1)
    for step, (first, second, height, _) in enumerate(merges):
        highest[step] = max([height, *(highest[int(child) - n] for child in (first, second) if child >= n)])
    return highest


def cosine_linkage(vectors: torch.Tensor) -> np.ndarray:
    """Ward's merges of unit vectors by cosine distance, as token pooling clusters them."""
    vectors = vectors.detach().float().cpu()
    return ward_linkage((1 - vectors @ vectors.T).clamp_(0, 2).numpy())


def flat_clusters(merges: np.ndarray, max_clusters: int | None = None, threshold: float | None = None
                  ) -> np.ndarray:
    """Each point's flat cluster, numbered from 0 left to right in the tree: the tree cut at `threshold`, or at the
    lowest merge height that leaves at most `max_clusters` (searched as scipy's fcluster maxclust searches)."""
    n = len(merges) + 1
    highest = subtree_heights(merges)
    if threshold is None:
        if max_clusters >= n:  # nothing to merge: every point alone, numbered in order (as scipy does)
            return np.arange(n)
        lower, upper = -1, n - 1  # the lowest height at which cutting leaves at most max_clusters
        while upper - lower > 1:
            middle = (lower + upper) // 2
            if n - np.count_nonzero(highest <= highest[middle]) > max_clusters:
                lower = middle
            else:
                upper = middle
        threshold = highest[upper] if upper < n - 1 else math.inf
    # Numbered as scipy numbers them: depth first, the first child's subtree before the second's; a subtree under
    # the threshold is one cluster, numbered when reached; a point standing alone, when its parent is left.
    labels = np.empty(n, dtype=np.int64)
    count, leader = 0, None
    path, entered = [2 * n - 2], set()
    while path:
        node = path[-1]
        children = [int(child) for child in merges[node - n, :2]]
        if leader is None and highest[node - n] <= threshold:
            leader, count = node, count + 1
        below = next((child for child in children if child >= n and child not in entered), None)
        if below is not None:
            entered.add(below)
            path.append(below)
            continue
        for child in children:
            if child < n:
                if leader is None:
                    count += 1
                labels[child] = count - 1
        if leader == node:
            leader = None
        path.pop()
    return labels


class HierarchicalTokenPooling:
    """sentence-transformers' HierarchicalTokenPooling: pass it as MultiVectorEncoder's token_pooling (or to its
    encode) to pool documents' token vectors.

    pool_factor keeps about 1 / pool_factor of each document's tokens; max_tokens caps them instead, and
    distance_threshold cuts every document's tree at one height (only one of the three). The first
    num_protected_tokens are kept as they are; normalize_embeddings makes the pooled vectors unit length; tasks:
    the roles pooled (documents, and texts of no role).
    """

    def __init__(self, pool_factor: float = 1.0, *, max_tokens: int | None = None,
                 distance_threshold: float | None = None, num_protected_tokens: int = 1,
                 normalize_embeddings: bool = True, tasks: str | Sequence[str] | None = None):
        if not math.isfinite(pool_factor) or pool_factor < 1:
            raise ConfigError(f"pool_factor must be at least 1, got {pool_factor}")
        if not isinstance(num_protected_tokens, int) or num_protected_tokens < 0:
            raise ConfigError(f"num_protected_tokens must be a whole number >= 0, got {num_protected_tokens}")
        chosen = [name for name, value in (("pool_factor", pool_factor != 1), ("max_tokens", max_tokens is not None),
                                           ("distance_threshold", distance_threshold is not None)) if value]
        if len(chosen) > 1:
            raise ConfigError(f"{' and '.join(chosen)}: give one of pool_factor, max_tokens, distance_threshold")
        if distance_threshold is not None and not (math.isfinite(distance_threshold) and distance_threshold >= 0):
            raise ConfigError(f"distance_threshold must be a finite number >= 0, got {distance_threshold}")
        if max_tokens is not None and max_tokens <= num_protected_tokens:
            raise ConfigError(f"max_tokens {max_tokens} leaves no room beyond the {num_protected_tokens} "
                              f"protected tokens")
        self.pool_factor, self.max_tokens, self.distance_threshold = pool_factor, max_tokens, distance_threshold
        self.num_protected_tokens, self.normalize_embeddings = num_protected_tokens, normalize_embeddings
        self.tasks = [tasks] if isinstance(tasks, str) else list(tasks or ["document"])

    @staticmethod
    def calibrate_distance_threshold(embeddings: Sequence[torch.Tensor], *, target_tokens: float,
                                     num_protected_tokens: int = 1) -> float | None:
        """A distance_threshold that leaves these documents (unit token vectors, as the index will hold them) at
        most `target_tokens` vectors each on average, protected ones included; None: they are within it already.
        As sentence-transformers' HierarchicalTokenPooling.calibrate_distance_threshold chooses it: the height of
        the merge that brings the total down to the budget, among all the documents' merges."""
        if not (math.isfinite(target_tokens) and target_tokens > 0):
            raise ConfigError(f"target_tokens must be a finite number > 0, got {target_tokens}")
        if num_protected_tokens < 0:
            raise ConfigError(f"num_protected_tokens must be >= 0, got {num_protected_tokens}")
        heights, count, total, least = [], 0, 0, 0
        for vectors in embeddings:
            if not isinstance(vectors, torch.Tensor) or vectors.ndim != 2:
                raise ConfigError("calibration documents must be (tokens, dim) tensors")
            protected = min(num_protected_tokens, len(vectors))
            rest = vectors[protected:]
            count, total, least = count + 1, total + len(vectors), least + protected + min(len(rest), 1)
            if len(rest) > 1:
                heights.append(subtree_heights(cosine_linkage(rest)))
        if count == 0:
            raise ConfigError("give at least one calibration document")
        if target_tokens * count < least:
            raise ConfigError(f"target_tokens must be at least {least / count:g} for these protected tokens")
        merges = math.ceil(total - target_tokens * count)
        if merges <= 0:
            return None
        return float(np.partition(np.concatenate(heights), merges - 1)[merges - 1])

    def applies_to(self, task: str | None) -> bool:
        return (task or "document") in self.tasks

    def pool(self, embeddings: Sequence[torch.Tensor], task: str | None = None) -> list[torch.Tensor]:
        """Each document's (tokens, dim) vectors pooled (other roles' as they are)."""
        if not self.applies_to(task):
            return list(embeddings)
        pooled = [self._pool_one(vectors, max((len(other) for other in embeddings), default=0))
                  for vectors in embeddings]
        return [F.normalize(vectors.float(), dim=-1).to(vectors.dtype) for vectors in pooled] \
            if self.normalize_embeddings else pooled

    def _pool_one(self, vectors: torch.Tensor, longest: int) -> torch.Tensor:
        """One document; `longest`, the longest of those pooled with it, decides whether any is clustered (as
        sentence-transformers decides it per batch)."""
        protected = min(self.num_protected_tokens, longest)
        batch_targets = max(int((longest - protected) // self.pool_factor), 1) if self.max_tokens is None else \
            min(self.max_tokens - protected, longest - protected)
        if longest - protected <= 1 or (self.distance_threshold is None and batch_targets >= longest - protected):
            return vectors
        kept, rest = vectors[:protected], vectors[protected:]
        values = rest.float() if rest.dtype in (torch.float16, torch.bfloat16) else rest
        if not len(rest):
            return kept
        if batch_targets == 1:
            sums = values.sum(0, keepdim=True)
            return torch.cat((kept, _through(sums / len(rest), sums).to(vectors.dtype)))
        target = self.max_tokens - protected if self.max_tokens is not None else int(len(rest) // self.pool_factor)
        target = min(max(target, 1), len(rest))
        if len(rest) <= 1 or (self.distance_threshold is None and target >= len(rest)):
            labels = torch.arange(len(rest))
        else:
            labels = torch.from_numpy(flat_clusters(cosine_linkage(values), max_clusters=target,
                                                    threshold=self.distance_threshold))
        labels = labels.to(values.device)
        count = int(labels.max()) + 1
        sums = values.new_zeros(count, values.shape[1]).scatter_add_(0, labels[:, None].expand_as(values), values)
        sizes = values.new_zeros(count).scatter_add_(0, labels, values.new_ones(len(values)))
        return torch.cat((kept, _through(sums / sizes[:, None], sums).to(vectors.dtype)))


def _through(means: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """The cluster means, whose gradient reaches each member whole (a straight-through estimator, as
    sentence-transformers trains through its pooling), not divided by the cluster's size."""
    return means.detach() + (sums - sums.detach()) if sums.requires_grad else means
