"""Reranking: how relevant a document is to a query, as one sigmoid output over the pair (a cross-encoder, as the
MS MARCO rerankers), learned with binary cross-entropy on 0/1 labels (or soft ones in [0, 1]).

Data -> examples: a row per (query, document, label), as mine_hard_negatives' "labeled-pair" output writes them; a
row of a query with lists of documents and of their labels (its "labeled-list"); or a row of a query, its positive
and negatives (its "triplet" and "n-tuple" outputs, finetune-embeddings' rows), read as the labeled pairs they
make: the positive relevant (1), each negative not (0). Answers -> metrics: each query's
documents ranked by score, scored as sentence-transformers' CrossEncoderRerankingEvaluator scores them (MAP, MRR@10,
NDCG@10) over the queries that have a relevant document (label 0.5 or more).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import InputError
from bertforge.tasks import classification
from bertforge.tasks.data import Features, TextExample, listed, score_label
from bertforge.tasks.metrics import compute_metrics
from bertforge.tasks.tables import Table, cell, find_column, read_table, text_cell

# The columns of a row when the column flags name none the data has: mine_hard_negatives' labeled pairs and lists
# (the dataset's own names, most often query or anchor and answer, passage or positive), sentence-transformers'
# listwise rows (query, docs, labels), and the pair columns of GLUE-like files.
QUERY_COLUMNS = ("query", "anchor", "question", "sentence1", "text1", "text")
DOCUMENT_COLUMNS = ("document", "passage", "positive", "answer", "docs", "documents", "passages", "context",
                    "sentence2", "text2", "text_pair")
LABEL_COLUMNS = ("label", "labels", "score", "scores", "relevance")

RELEVANT = 0.5  # a document whose label is at least this counts as relevant to its query in the metrics


def read_examples(path: str | Path | Any, columns=None, id2label=None, labelled: bool = True, settings=None,
                  format: str | None = None) -> list[TextExample]:
    """(query, document) examples, labelled with their relevance in [0, 1] when `labelled`. A row holds one
    document and its label, a list of documents and a list of as many labels, or a positive and negatives (one
    example each)."""
    table = read_table(path, format)
    query_column = find_column(table, columns and columns.text, QUERY_COLUMNS, "the queries")
    document_column = find_column(table, columns and columns.text_pair, DOCUMENT_COLUMNS, "the documents")
    negative_columns = _negative_columns(table, columns and columns.label, document_column)
    label_column = None
    if labelled and not negative_columns:
        label_column = find_column(table, columns and columns.label, LABEL_COLUMNS, "the relevance labels")
    examples = []
    for line, row in table.rows:
        query = text_cell(table, line, row, query_column)
        documents = _texts(table, line, row, document_column)
        if negative_columns:
            negatives = [text for name in negative_columns for text in _texts(table, line, row, name)]
            labels = [1.0] * len(documents) + [0.0] * len(negatives) if labelled else \
                [None] * (len(documents) + len(negatives))
            documents += negatives
        else:
            labels = _labels(table, line, row, label_column, len(documents)) if labelled else \
                [None] * len(documents)
        examples += [TextExample(query, document, label, line) for document, label in zip(documents, labels)]
    if not examples:
        raise table.error("no documents to rank (every list of documents is empty)")
    return examples


def _negative_columns(table: Table, given_label: str | None, document_column: str) -> list[str]:
    """The columns of irrelevant documents in rows of a query, its positive and negatives (negative, negatives,
    negative_1, ...: sentence-transformers' and mine_hard_negatives' names); none where the label column is there.
    Their "scores" (mine_hard_negatives' output_scores: the embedder's similarities, not relevance) are not read."""
    if given_label in table.columns:
        return []
    return [name for name in table.columns if name != document_column and
            (name in ("negative", "negatives") or name.startswith("negative_"))]


def _texts(table: Table, line: int, row: dict[str, Any], column: str) -> list[str]:
    """A row's documents: its text, or its list of texts."""
    value = listed(row.get(column))
    if not isinstance(value, list):
        return [text_cell(table, line, row, column)]
    if not all(isinstance(text, str) for text in value):
        raise table.error("expected a text or a list of texts", line, field=column)
    return value


def _labels(table: Table, line: int, row: dict[str, Any], column: str, documents: int) -> list[float]:
    """A row's relevance labels, one per document, each a number in [0, 1]."""
    value = listed(cell(table, line, row, column))
    values = value if isinstance(value, list) else [value]
    if len(values) != documents:
        raise table.error(f"{len(values)} labels for {documents} documents: each document needs its label", line,
                          field=column)
    labels = []
    for raw in values:
        try:
            label = score_label(raw)
        except ValueError:
            raise table.error(f"relevance label {json.dumps(raw, default=repr)[:40]} is not a number", line,
                              field=column) from None
        if not 0 <= label <= 1:
            raise table.error(f"relevance label {label:g} is outside [0, 1]: a reranker learns 0 (not relevant) to 1 "
                              "(relevant) with binary cross-entropy; scale graded labels into it first (STS-B's 0-5: "
                              "divide by 5)", line, field=column)
        labels.append(label)
    return labels


def output_labels(examples: Sequence[TextExample]) -> dict[int, str]:
    """The one output, named as transformers names it; training data of relevant documents alone (or irrelevant
    ones alone) is refused: the model learns to tell them apart."""
    relevant = {float(example.label) >= RELEVANT for example in examples}
    if len(relevant) == 1:
        kind, labels = ("relevant", "at least") if relevant.pop() else ("irrelevant", "under")
        raise InputError(f"every document of the training data is {kind} (labels {labels} {RELEVANT:g}): a reranker "
                         "learns from both kinds; add other documents for each query (bertforge.inference."
                         "mine_hard_negatives(..., output_format=\"labeled-pair\") finds hard ones)")
    return classification.regression_labels(examples)


def relevance_target(label: float, label2id: dict[str, int] | None) -> tuple[float]:
    """A row's training target: its label as the one output's (a tuple: collate stacks it as (batch, 1))."""
    try:
        return (float(label),)
    except (TypeError, ValueError):
        raise InputError(f"a relevance label must be a number in [0, 1], got {label!r}") from None


def encode(tokenizer, examples: Sequence[TextExample], settings: classification.ClassificationSettings,
           id2label: dict[int, str]) -> Features:
    """Each (query, document) pair as one input, the longer text cut first, as classification encodes pairs."""
    return classification.encode(tokenizer, examples, settings, id2label, targets=relevance_target)


def decode(features: Features, examples: Sequence[TextExample], outputs: Sequence[tuple[torch.Tensor, ...]],
           config) -> list[dict[str, Any]]:
    """One answer per pair: {"score"}, the sigmoid of the output (sentence-transformers' CrossEncoder.predict)."""
    logits = classification.example_logits(features, outputs, len(examples))
    return [{"score": score} for score in torch.sigmoid(logits[:, 0]).tolist()]


def by_query(scores: Sequence[float], examples: Sequence[TextExample]) -> tuple[list[list[float]], list[list[int]]]:
    """The queries that have a relevant document, in the order they first appear: each one's scores and 0/1
    relevance, its documents in file order (a query with none relevant ranks nothing worth scoring)."""
    queries: dict[str, tuple[list[float], list[int]]] = {}
    for score, example in zip(scores, examples, strict=True):
        query_scores, relevance = queries.setdefault(example.text, ([], []))
        query_scores.append(score)
        relevance.append(int(float(example.label) >= RELEVANT))
    kept = [query for query in queries.values() if any(query[1])]
    if not kept:
        raise InputError(f"no query of the {len(queries)} has a relevant document (a label of {RELEVANT:g} or more): "
                         "the ranking metrics score where the relevant documents are ranked")
    return [query[0] for query in kept], [query[1] for query in kept]


def score(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
          id2label: dict[int, str]) -> dict[str, float]:
    """MAP, MRR@10 and NDCG@10 over the queries that have a relevant document."""
    scores, relevance = by_query([prediction["score"] for prediction in predictions], examples)
    return compute_metrics("reranking", scores, relevance)
