"""Hard negatives for contrastive training (sentence-transformers' mine_hard_negatives): for each (anchor, positive)
pair, the corpus texts an embedding model finds closest to the anchor that are not its positives. Training on them
teaches a model the distinctions that random in-batch negatives never ask for.

Candidates are ranked by the model (or rescored by a cross-encoder); a candidate is dropped when it is the anchor
itself, one of its positives, within a margin of its weakest positive (absolute or relative: likely a false
negative), above max_score or below min_score. Of what remains, ranks range_min to range_max are kept, and
num_negatives taken from them: the top ones, or a random sample. The result is one of four layouts that
sentence-transformers' losses read.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.validation import check_number

logger = logging.getLogger("bertforge")
SAMPLING_STRATEGIES = ("top", "random")
NEGATIVE = float("-inf")  # a candidate that can't be a negative


def _columns(dataset: Any) -> dict[str, list]:
    """A dataset's columns in order: a datasets.Dataset, a pandas DataFrame, a dict of columns or a list of rows."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "to_dict"):  # datasets.Dataset
        return {name: list(dataset[name]) for name in dataset.column_names}
    if hasattr(dataset, "columns") and hasattr(dataset, "to_dict"):  # pandas
        return {str(name): dataset[name].tolist() for name in dataset.columns}
    if isinstance(dataset, dict):
        return {str(name): list(values) for name, values in dataset.items()}
    if isinstance(dataset, Sequence) and dataset and all(isinstance(row, dict) for row in dataset):
        return {str(name): [row.get(name) for row in dataset] for name in dataset[0]}
    raise InputError("mine_hard_negatives takes a datasets.Dataset, a pandas DataFrame, a dict of columns or a list "
                     "of row dicts")


def _like(dataset: Any, columns: dict[str, list]) -> Any:
    """The mined columns in the kind of table the dataset came as (a dict of columns for a dict or a list)."""
    if hasattr(dataset, "column_names") and hasattr(dataset, "to_dict"):
        return type(dataset).from_dict(columns)
    if hasattr(dataset, "columns") and hasattr(dataset, "to_dict"):
        return type(dataset)(columns)
    return columns


def _ranked_candidates(query_vectors: np.ndarray, corpus_vectors: np.ndarray, similarity: Callable, count: int,
                       chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's `count` most similar corpus entries (scores and indices), padded with -inf and -1 where the
    corpus is smaller; `chunk` queries at a time, so no (queries, corpus) matrix is made whole."""
    corpus = torch.as_tensor(corpus_vectors)
    take = min(count, len(corpus))
    scores, indices = [], []
    for start in range(0, len(query_vectors), chunk):
        top = torch.topk(similarity(query_vectors[start:start + chunk], corpus).cpu(), k=take, dim=1)
        scores.append(top.values)
        indices.append(top.indices)
    scores, indices = torch.cat(scores), torch.cat(indices)
    if take < count:
        scores = torch.cat([scores, scores.new_full((len(scores), count - take), NEGATIVE)], dim=1)
        indices = torch.cat([indices, indices.new_full((len(indices), count - take), -1)], dim=1)
    return scores, indices


def mine_hard_negatives(dataset: Any, model: Any, anchor_column_name: str | None = None,
                        positive_column_name: str | None = None, corpus: Sequence[str] | None = None,
                        cross_encoder: Any = None, range_min: int = 0, range_max: int | None = None,
                        max_score: float | None = None, min_score: float | None = None,
                        absolute_margin: float | None = None, relative_margin: float | None = None,
                        num_negatives: int = 3, sampling_strategy: str = "top",
                        query_prompt_name: str | None = None, query_prompt: str | None = None,
                        corpus_prompt_name: str | None = None, corpus_prompt: str | None = None,
                        include_positives: bool = False, output_format: str = "triplet",
                        output_scores: bool = False, batch_size: int = 32, faiss_batch_size: int = 16384,
                        use_faiss: bool = False, use_multi_process: bool | list[str] = False, verbose: bool = True,
                        cache_folder: str | None = None, as_triplets: bool | None = None, margin: float | None = None,
                        **unused: Any) -> Any:
    """(anchor, positive) pairs with hard negatives added, as sentence-transformers' mine_hard_negatives gives
    them (its options by the same names; see the module's docstring). `model`: a SentenceEncoder (or any encoder
    with encode_query, encode_document, similarity and similarity_pairwise); the anchor and positive columns are the
    first two unless named. output_format: "triplet" (a row per negative), "n-tuple" (negative_1..n columns; rows
    without enough negatives dropped), "labeled-pair" (a row per document, label 1 or 0) or "labeled-list" (the
    documents of an anchor in one list, and their labels); output_scores puts the scores in place of the labels (or
    beside the texts). `random` sampling draws from Python's random module (random.seed makes it repeatable).
    sentence-transformers' deprecated options are read as it reads them: as_triplets (True: "triplet", False:
    "n-tuple"), output_format="n-tuple-scores" ("n-tuple" with output_scores) and margin (absolute_margin)."""
    unused.update(use_faiss=use_faiss, cache_folder=cache_folder)
    refused = sorted(name for name, value in unused.items() if value not in (None, False))
    if refused:
        raise ConfigError(f"mine_hard_negatives: {refused[0]} is not supported here (no FAISS index, no cache)")
    columns = _columns(dataset)
    if not columns or not next(iter(columns.values())):
        raise InputError("mine_hard_negatives: the dataset is empty")
    names = list(columns)
    anchor_name = anchor_column_name if anchor_column_name in columns else names[0]
    if positive_column_name not in columns:
        if len(names) < 2:
            raise InputError("mine_hard_negatives: the dataset needs an anchor and a positive column")
        positive_column_name = names[1]
    output_format, output_scores, absolute_margin = _read_deprecated_options(
        output_format, output_scores, absolute_margin, as_triplets, margin, include_positives,
        range_min != 0 or range_max is not None or sampling_strategy != "top" or
        any(value is not None for value in (max_score, min_score, absolute_margin, relative_margin, margin)))
    check_choice(output_format, LAYOUTS, "output_format")
    check_choice(sampling_strategy, SAMPLING_STRATEGIES, "sampling_strategy")
    check_number("num_negatives", num_negatives, minimum=1, integer=True)
    check_number("range_min", range_min, minimum=0, integer=True)
    check_number("faiss_batch_size", faiss_batch_size, minimum=1, integer=True)
    anchors, positives = [str(text) for text in columns[anchor_name]], \
        [str(text) for text in columns[positive_column_name]]

    # One entry per distinct anchor, with its distinct positives in the order they came
    queries = list(dict.fromkeys(anchors))
    query_index = {query: i for i, query in enumerate(queries)}
    most_positives = max(np.unique(anchors, return_counts=True)[1])
    if range_max is None:  # room for the positives and the anchor, and for candidates the filters may drop
        filtered = any(value is not None for value in (absolute_margin, relative_margin, max_score)) or (
            cross_encoder is not None and min_score is not None)
        range_max = range_min + num_negatives * (10 if filtered else 1) + int(most_positives)
    check_number("range_max", range_max, minimum=range_min + 1, integer=True)
    if num_negatives > range_max - range_min:
        raise ConfigError(f"mine_hard_negatives: num_negatives={num_negatives} can't come from ranks {range_min} to "
                          f"{range_max}; lower num_negatives or range_min, or raise range_max")
    documents = list(dict.fromkeys([*map(str, corpus or positives), *positives]))
    document_index = {text: i for i, text in enumerate(documents)}
    own_document = [document_index.get(query, -1) for query in queries]  # an anchor is never its own negative
    positive_documents: list[list[int]] = [[] for _ in queries]
    for anchor, positive in zip(anchors, positives):
        row = positive_documents[query_index[anchor]]
        if document_index[positive] not in row:
            row.append(document_index[positive])
        if include_positives and anchor == positive:
            own_document[query_index[anchor]] = -1

    pool = None
    if use_multi_process:
        pool = model.start_multi_process_pool(None if use_multi_process is True else use_multi_process)
    try:
        options = {"batch_size": batch_size, "normalize_embeddings": True, "convert_to_numpy": True, "pool": pool}
        corpus_vectors = model.encode_document(documents, prompt_name=corpus_prompt_name, prompt=corpus_prompt,
                                               **options)
        query_vectors = model.encode_query(queries, prompt_name=query_prompt_name, prompt=query_prompt, **options)
    finally:
        if pool is not None:
            model.stop_multi_process_pool(pool)
    scores, indices = _ranked_candidates(query_vectors, corpus_vectors, model.similarity,
                                         range_max + int(most_positives) + 1, faiss_batch_size)

    counts = [len(row) for row in positive_documents]
    pair_query = [i for i, count in enumerate(counts) for _ in range(count)]
    pair_document = [j for row in positive_documents for j in row]
    pair_anchors = [queries[i] for i in pair_query]
    pair_positives = [documents[j] for j in pair_document]
    positive_scores = torch.as_tensor(model.similarity_pairwise(query_vectors[pair_query],
                                                                corpus_vectors[pair_document])).cpu()
    if cross_encoder is not None:  # the cross-encoder's scores in place of the embedding model's
        for i, row in enumerate(indices.tolist()):
            scores[i] = torch.as_tensor(cross_encoder.predict([(queries[i], documents[j]) for j in row],
                                                              batch_size=batch_size, convert_to_tensor=True)).cpu()
        positive_scores = torch.as_tensor(cross_encoder.predict(list(zip(pair_anchors, pair_positives)),
                                                                batch_size=batch_size, convert_to_tensor=True)).cpu()

    scores[indices == -1] = NEGATIVE
    scores[indices == torch.tensor(own_document)[:, None]] = NEGATIVE
    if not include_positives:
        positive_sets = [set(row) for row in positive_documents]
        is_positive = torch.tensor([[j in positive_sets[i] for j in row] for i, row in enumerate(indices.tolist())])
        scores[is_positive] = NEGATIVE
    if absolute_margin is not None or relative_margin is not None:
        # near the weakest positive of its anchor: likely an unlabelled positive
        weakest = torch.stack([chunk.min() for chunk in positive_scores.split(counts)])[:, None]
        if absolute_margin is not None:
            scores[scores + absolute_margin > weakest] = NEGATIVE
        if relative_margin is not None:
            scores[scores > weakest - weakest.abs() * relative_margin] = NEGATIVE
    if max_score is not None:
        scores[scores > max_score] = NEGATIVE
    if min_score is not None:
        scores[(scores < min_score) & (scores != NEGATIVE)] = NEGATIVE

    negative_scores, order = torch.topk(scores, k=range_max, dim=1)
    rows = torch.arange(len(queries))[:, None]
    negatives = indices[rows, order][:, range_min:]
    negative_scores = negative_scores[:, range_min:]
    if sampling_strategy == "top":
        negatives, negative_scores = negatives[:, :num_negatives], negative_scores[:, :num_negatives]
    else:
        usable = (negatives.shape[1] - negative_scores.isinf().sum(1)).clamp(min=num_negatives)
        picked = torch.tensor([random.sample(range(int(count)), k=num_negatives) for count in usable])
        negatives, negative_scores = negatives[rows, picked], negative_scores[rows, picked]
        negative_scores, order = negative_scores.sort(dim=1, descending=True)
        negatives = negatives[rows, order]

    repeat = torch.tensor(counts)
    mined = Mined(queries, positive_documents, documents, pair_anchors, pair_positives, positive_scores,
                  negatives, negative_scores, negatives.repeat_interleave(repeat, dim=0),
                  negative_scores.repeat_interleave(repeat, dim=0))
    table = LAYOUTS[output_format](mined, anchor_name, positive_column_name, output_scores)
    if verbose:
        print(f"mine_hard_negatives: {len(queries)} anchors, {int(mined.found.sum())} negatives found (ranks "
              f"{range_min} to {range_max}, {sampling_strategy}); {len(table[anchor_name])} {output_format} rows")
    return _like(dataset, table)


def _read_deprecated_options(output_format: str, output_scores: bool, absolute_margin: float | None,
                             as_triplets: bool | None, margin: float | None, include_positives: bool,
                             filtered: bool) -> tuple[str, bool, float | None]:
    """output_format, output_scores and absolute_margin once sentence-transformers' deprecated options and
    include_positives are applied, in its order (so include_positives overrules "n-tuple-scores"), each change
    logged as it logs it. `filtered`: options other than their defaults that may drop a positive."""
    if as_triplets is not None:
        output_format = "triplet" if as_triplets else "n-tuple"
        logger.warning(f"mine_hard_negatives: as_triplets is deprecated, use output_format; output_format is now "
                       f"{output_format!r}")
    if include_positives:
        if filtered:
            logger.warning("mine_hard_negatives: with include_positives=True, range_min, range_max, max_score, "
                           "min_score, absolute_margin, relative_margin or sampling_strategy other than their "
                           "defaults may still discard the positive values")
        if output_format != "n-tuple":  # the positive then stays in its ranked place among the negatives
            logger.warning(f"mine_hard_negatives: include_positives=True makes output_format 'n-tuple' (not "
                           f"{output_format!r}), to keep the positives' ranked places")
            output_format = "n-tuple"
    if output_format == "n-tuple-scores":
        logger.warning('mine_hard_negatives: output_format="n-tuple-scores" is deprecated, use "n-tuple" with '
                       "output_scores=True")
        output_format, output_scores = "n-tuple", True
    if margin is not None:
        logger.warning(f"mine_hard_negatives: margin is deprecated, use absolute_margin or relative_margin; "
                       f"absolute_margin is now {margin}")
        absolute_margin = margin
    return output_format, output_scores, absolute_margin


@dataclass
class Mined:
    """What was mined, per distinct anchor (query) and per (anchor, positive) pair; -inf scores: nothing found."""

    queries: list[str]
    positive_documents: list[list[int]]  # per query, its positives' corpus indices
    documents: list[str]  # the corpus, deduplicated
    pair_anchors: list[str]
    pair_positives: list[str]
    positive_scores: torch.Tensor  # (pairs,)
    negatives: torch.Tensor  # (queries, num_negatives) corpus indices
    negative_scores: torch.Tensor
    pair_negatives: torch.Tensor  # (pairs, num_negatives): each pair's anchor's
    pair_negative_scores: torch.Tensor

    @property
    def found(self) -> torch.Tensor:
        return self.pair_negative_scores != NEGATIVE


def _triplets(mined: Mined, anchor_name: str, positive_name: str, output_scores: bool) -> dict[str, list]:
    """A row per (anchor, positive, negative) found."""
    found = mined.found
    pairs = found.nonzero(as_tuple=True)[0].tolist()
    table = {anchor_name: [mined.pair_anchors[i] for i in pairs],
             positive_name: [mined.pair_positives[i] for i in pairs],
             "negative": [mined.documents[j] for j in mined.pair_negatives[found].tolist()]}
    if output_scores:
        table["scores"] = [[mined.positive_scores[i].item(), score]
                           for i, score in zip(pairs, mined.pair_negative_scores[found].tolist())]
    return table


def _tuples(mined: Mined, anchor_name: str, positive_name: str, output_scores: bool) -> dict[str, list]:
    """A row per (anchor, positive) with every one of its negatives found; the others are left out."""
    complete = mined.found.all(dim=1)
    kept = complete.nonzero(as_tuple=True)[0].tolist()
    table = {anchor_name: [mined.pair_anchors[i] for i in kept], positive_name: [mined.pair_positives[i] for i in kept]}
    for column, indices in enumerate(mined.pair_negatives[complete].T.tolist(), start=1):
        table[f"negative_{column}"] = [mined.documents[j] for j in indices]
    if output_scores:
        table["scores"] = torch.cat([mined.positive_scores[complete][:, None],
                                     mined.pair_negative_scores[complete]], dim=1).tolist()
    return table


def _labeled_pairs(mined: Mined, anchor_name: str, positive_name: str, output_scores: bool) -> dict[str, list]:
    """Per anchor: its positives (label 1), then its negatives found (label 0); or their scores."""
    anchors, texts, values = [], [], []
    pair = 0
    for i, query in enumerate(mined.queries):
        for j in mined.positive_documents[i]:
            anchors.append(query)
            texts.append(mined.documents[j])
            values.append(mined.positive_scores[pair].item() if output_scores else 1)
            pair += 1
        for j, score in zip(mined.negatives[i].tolist(), mined.negative_scores[i].tolist()):
            if score != NEGATIVE:
                anchors.append(query)
                texts.append(mined.documents[j])
                values.append(score if output_scores else 0)
    return {anchor_name: anchors, positive_name: texts, "score" if output_scores else "label": values}


def _labeled_lists(mined: Mined, anchor_name: str, positive_name: str, output_scores: bool) -> dict[str, list]:
    """A row per (anchor, positive) with a negative found: the positive and its negatives in one list."""
    found = mined.found
    kept = found.any(dim=1).nonzero(as_tuple=True)[0].tolist()
    table = {anchor_name: [mined.pair_anchors[i] for i in kept],
             positive_name: [[mined.pair_positives[i]] + [mined.documents[j] for j in
                                                          mined.pair_negatives[i][found[i]].tolist()] for i in kept]}
    if output_scores:
        table["scores"] = [[mined.positive_scores[i].item()] + mined.pair_negative_scores[i][found[i]].tolist()
                           for i in kept]
    else:
        table["labels"] = [[1] + [0] * int(found[i].sum()) for i in kept]
    return table


# output_format -> the table it makes
LAYOUTS: dict[str, Callable[[Mined, str, str, bool], dict[str, list]]] = {
    "triplet": _triplets, "n-tuple": _tuples, "labeled-pair": _labeled_pairs, "labeled-list": _labeled_lists}
