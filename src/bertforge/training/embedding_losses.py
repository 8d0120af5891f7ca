"""The losses that train a sentence encoder (SentenceEncoder): texts become vectors, and their similarities learn.

Each is a module built on the encoder and called as sentence-transformers calls its losses, with one tokenized
batch per text column and the labels, `loss(features, labels)`, so `SentenceEncoder.fit` trains with them as with
sentence-transformers' own (which need not be installed), and `bertforge finetune-embeddings` picks one by name.

- multiple_negatives_ranking: (anchor, positive[, negative...]) rows; each anchor's positive against every other
  row's positive and negatives in the batch, a softmax over scale x cosine (van den Oord et al. 2018's InfoNCE,
  Henderson et al. 2017's in-batch negatives).
- cosent: (text, text, score) rows; every pair of rows whose scores differ, the one scored higher should be more
  similar (Su 2022): log(1 + sum exp(scale x (cos(lower) - cos(higher)))).
- cosine_similarity: (text, text, score) rows; the mean squared error between cosine and score (in [-1, 1]).

MatryoshkaLoss wraps any of them to train the leading dimensions as a smaller vector too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import InputError


@dataclass
class InputExample:
    """One training row as the losses read it (sentence-transformers' InputExample): its texts, anchor first, and
    its score (0 where the loss reads none)."""

    texts: Sequence[str]
    label: float = 0.0


def embed_columns(encoder: nn.Module, columns: Iterable[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """One (rows, dim) tensor of sentence vectors per text column, with gradients."""
    return [encoder(features)["sentence_embedding"] for features in columns]


def cosine_table(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """(len(first), len(second)) cosine similarities."""
    return F.normalize(first, dim=-1) @ F.normalize(second, dim=-1).T


class EmbeddingLoss(nn.Module):
    """A loss on the vectors of a batch's text columns; `columns` is how many a row has (None: two or more)."""

    columns: int | None = 2
    scored = True  # whether rows need a similarity score (the label)

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        vectors = embed_columns(self.model, sentence_features)
        self.check_columns(len(vectors))
        return self.compute_loss_from_embeddings(vectors, labels)

    def check_columns(self, count: int) -> None:
        if count < 2 or self.columns is not None and count != self.columns:
            wanted = "two or more" if self.columns is None else str(self.columns)
            raise InputError(f"{type(self).__name__} takes {wanted} texts per row, got {count}")

    def compute_loss_from_embeddings(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class MultipleNegativesRankingLoss(EmbeddingLoss):
    """Cross-entropy of each anchor's similarities to all the batch's candidates, its own positive the class."""

    columns = None
    scored = False

    def __init__(self, model: nn.Module, scale: float = 20.0):
        super().__init__(model)
        self.scale = check_scale(scale)

    def compute_loss_from_embeddings(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        anchors, candidates = vectors[0], torch.cat(vectors[1:])  # positives first: row i's is candidate i
        logits = cosine_table(anchors, candidates).float() * self.scale
        return F.cross_entropy(logits, torch.arange(len(anchors), device=logits.device))


class CoSENTLoss(EmbeddingLoss):
    """A ranking of the batch's pairs by cosine that should follow their scores; only the scores' order counts."""

    def __init__(self, model: nn.Module, scale: float = 20.0):
        super().__init__(model)
        self.scale = check_scale(scale)

    def compute_loss_from_embeddings(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        cosines = F.cosine_similarity(vectors[0], vectors[1], dim=-1).float() * self.scale
        labels = labels.reshape(-1).to(cosines.device)
        # Entry (i, j): cos(j) - cos(i), kept where pair i is scored above pair j (it should be the more similar).
        differences = cosines[None, :] - cosines[:, None]
        above = labels[:, None] > labels[None, :]
        terms = differences[above]
        return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


class CosineSimilarityLoss(EmbeddingLoss):
    """Mean squared error of each pair's cosine against its score."""

    def compute_loss_from_embeddings(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        cosines = F.cosine_similarity(vectors[0], vectors[1], dim=-1).float()
        return F.mse_loss(cosines, labels.reshape(-1).to(cosines))


class MatryoshkaLoss(nn.Module):
    """Another loss applied to the first `matryoshka_dims` dimensions of the vectors too, each cut renormalised,
    the weighted sum of them (Kusupati et al. 2022): the leading dimensions alone then make a usable smaller vector
    (encode(..., truncate_dim=64)). The texts are encoded once for every cut."""

    def __init__(self, model: nn.Module, loss: EmbeddingLoss, matryoshka_dims: Sequence[int],
                 matryoshka_weights: Sequence[float] | None = None, n_dims_per_step: int = -1):
        super().__init__()
        if not isinstance(loss, EmbeddingLoss):
            raise InputError(f"MatryoshkaLoss wraps one of bertforge's losses ({', '.join(EMBEDDING_LOSSES)}), got "
                             f"{type(loss).__name__}")
        dims = [check_dimension(dim) for dim in matryoshka_dims]
        if not dims:
            raise InputError("matryoshka_dims: give at least one dimension")
        weights = [1.0] * len(dims) if matryoshka_weights is None else list(matryoshka_weights)
        if len(weights) != len(dims):
            raise InputError(f"matryoshka_weights: one per dimension ({len(dims)}), got {len(weights)}")
        if n_dims_per_step != -1:
            raise InputError("n_dims_per_step is not supported here: every dimension is trained at every step")
        self.model, self.loss = model, loss
        self.matryoshka_dims, self.matryoshka_weights = zip(*sorted(zip(dims, weights), reverse=True))

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        vectors = embed_columns(self.model, sentence_features)
        self.loss.check_columns(len(vectors))
        width = vectors[0].shape[-1]
        if self.matryoshka_dims[0] > width:
            raise InputError(f"matryoshka_dims: {self.matryoshka_dims[0]} is more than the model's {width} dimensions")
        return sum(weight * self.loss.compute_loss_from_embeddings(
            [F.normalize(column[..., :dim].float(), dim=-1) for column in vectors], labels)
            for dim, weight in zip(self.matryoshka_dims, self.matryoshka_weights))


def check_dimension(dim: int) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise InputError(f"matryoshka_dims: each is a whole number above 0, got {dim!r}")
    return dim


def check_scale(scale: float) -> float:
    if not isinstance(scale, int | float) or isinstance(scale, bool) or not 0 < scale < math.inf:
        raise InputError(f"scale must be a finite number above 0, got {scale!r}")
    return float(scale)


# The losses by the name finetune-embeddings takes; sentence-transformers' classes have the same names.
EMBEDDING_LOSSES: dict[str, type[EmbeddingLoss]] = {
    "multiple_negatives_ranking": MultipleNegativesRankingLoss,
    "cosent": CoSENTLoss,
    "cosine_similarity": CosineSimilarityLoss,
}
