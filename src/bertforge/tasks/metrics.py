"""Evaluation metrics of the BERT fine-tuning tasks (GLUE, multi-label, CoNLL-2003 NER, SQuAD v1.1 and v2.0,
reranking), in plain Python/numpy.

Every metric is `metric(predictions, references) -> float` in [0, 1] (correlations in [-1, 1]); METRICS groups
them by task kind. The per-label scores (`class_scores`, `multi_label_scores`, `entity_scores`) say where a task's
metric was won or lost, as classification_report does. Definitions follow the references users compare with:
scikit-learn for classification, scipy for correlations, seqeval's default mode (conlleval rules) for entities,
the official SQuAD scripts, sentence-transformers' CrossEncoderRerankingEvaluator for rankings.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from bertforge.errors import check_choice

# --- classification -----------------------------------------------------------------------------------------

def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """Fraction of predictions equal to the label: [1, 0, 1], [1, 1, 1] -> 2/3."""
    predictions, labels = _per_example(predictions, labels)
    return float(np.mean(predictions == labels))


def _f1(predictions: np.ndarray, labels: np.ndarray, positive) -> float:
    # 2tp / (2tp + fp + fn) is the harmonic mean of precision and recall, and 0 (scikit-learn's value) when
    # the class appears in neither predictions nor labels.
    true_positives = np.sum((predictions == positive) & (labels == positive))
    errors = np.sum((predictions == positive) != (labels == positive))  # false positives + false negatives
    denominator = 2 * true_positives + errors
    return float(2 * true_positives / denominator) if denominator else 0.0


def binary_f1(predictions: Sequence, labels: Sequence, positive=1) -> float:
    """F1 of the positive class (label 1), as GLUE reports for MRPC and QQP. Labels written as numbers ("0", "1")
    count as those numbers, as GLUE casts them; the positive label must be of the labels' kind."""
    predictions, labels = _per_example(predictions, labels)
    if len(classes := np.union1d(predictions, labels)) > 2:
        # scikit-learn refuses too: the F1 of one class would read as the whole task's
        raise ValueError(f"f1 is the positive class's F1 of a two-class task; these labels hold {len(classes)} "
                         "classes: use macro_f1")
    if isinstance(positive, (int, float)) and not isinstance(positive, bool):
        predictions, labels = _as_numbers(predictions), _as_numbers(labels)
        if predictions.dtype.kind in "US" or labels.dtype.kind in "US":
            # scikit-learn refuses such a pos_label too; 0.0 here would read as a model that never finds it
            raise ValueError(f"f1: the positive label {positive!r} is not among labels such as "
                             f"{str(labels[0])!r}; give binary_f1 the positive label, or class ids")
    return _f1(predictions, labels, positive)


def _as_numbers(values: np.ndarray) -> np.ndarray:
    """Labels written as numbers ("1", "0") as numbers; any others as they are."""
    if values.dtype.kind not in "US":
        return values
    try:
        return values.astype(np.float64)
    except ValueError:
        return values


def macro_f1(predictions: Sequence, labels: Sequence) -> float:
    """Unweighted mean of per-class F1 over every class that occurs in the labels or the predictions."""
    predictions, labels = _per_example(predictions, labels)
    classes = np.union1d(predictions, labels)
    return float(np.mean([_f1(predictions, labels, c) for c in classes]))


def matthews_correlation(predictions: Sequence, labels: Sequence) -> float:
    """Matthews correlation coefficient (GLUE's CoLA metric), multi-class form; 0 when undefined.

    From the confusion counts: (correct * total - sum_k predicted_k * true_k) divided by
    sqrt((total^2 - sum_k predicted_k^2) * (total^2 - sum_k true_k^2)); for two classes this is
    (tp * tn - fp * fn) / sqrt((tp + fp)(tp + fn)(tn + fp)(tn + fn)).
    """
    predictions, labels = _per_example(predictions, labels)
    classes = np.union1d(predictions, labels)
    predicted = np.array([np.sum(predictions == c) for c in classes], dtype=np.float64)
    true = np.array([np.sum(labels == c) for c in classes], dtype=np.float64)
    total, correct = float(len(labels)), float(np.sum(predictions == labels))
    denominator = np.sqrt((total ** 2 - predicted @ predicted) * (total ** 2 - true @ true))
    return float((correct * total - predicted @ true) / denominator) if denominator else 0.0


# --- regression -----------------------------------------------------------------------------------------------

def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Pearson correlation (GLUE's STS-B metric); NaN when either side is constant, as in scipy."""
    x, y = (np.asarray(values, dtype=np.float64) for values in _per_example(predictions, labels))
    if np.ptp(x) == 0 or np.ptp(y) == 0:  # x - mean would leave rounding noise, not zeros, and a ~1e-16 "correlation"
        return float("nan")
    # Each side centred and scaled to at most 1 first, so that the sums of squares neither overflow nor underflow
    # at any scale the floats hold; rounding may still carry a perfect correlation just past 1.
    x, y = ((values - values.mean()) for values in (x, y))
    x, y = x / np.abs(x).max(), y / np.abs(y).max()
    correlation = (x @ y) / np.sqrt((x @ x) * (y @ y))  # each sum of squares is in [1, len]
    return float(np.clip(correlation, -1.0, 1.0))


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks: [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_run = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    run_starts = np.flatnonzero(starts_run)
    run_ends = np.append(run_starts[1:], len(values))
    # A run of ties at sorted positions [start, end) holds ranks start+1 .. end; their mean:
    run_ranks = (run_starts + 1 + run_ends) / 2
    ranks = np.empty(len(values))
    ranks[order] = run_ranks[np.cumsum(starts_run) - 1]
    return ranks


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Spearman rank correlation: the Pearson correlation of the average ranks; NaN where a value is NaN (a rank
    would place it), as scipy and `pearson` give."""
    predictions, labels = _per_example(predictions, labels)
    if np.isnan(predictions.astype(float)).any() or np.isnan(labels.astype(float)).any():
        return float("nan")
    return pearson(average_ranks(predictions), average_ranks(labels))


# --- entities (sequence labelling) ----------------------------------------------------------------------------

# Tag pairs (previous, current) across which a chunk ends, or a new one starts, in conlleval's rules, which
# read IOB1, IOB2 and IOBES alike. A change of entity type also ends and starts chunks (see `entities`).
_ENDS_AFTER = {"E", "S"}
_ENDS_BETWEEN = {("B", "B"), ("B", "S"), ("B", "O"), ("I", "B"), ("I", "S"), ("I", "O")}
_STARTS_AT = {"B", "S"}
_STARTS_BETWEEN = {("E", "E"), ("E", "I"), ("S", "E"), ("S", "I"), ("O", "E"), ("O", "I")}
_OUTSIDE = {"O", "."}  # conlleval treats "." like O


def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'I-MISC-X' -> ('I', 'MISC-X'); a bare 'I' or 'O' has type '_'."""
    return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one tag sequence as (type, first, last) token indices, with seqeval's default rules.

    An I- after O or after another type starts a chunk, so IOB1 and IOB2 both decode:
    ["B-PER", "I-PER", "O", "I-LOC", "B-LOC"] -> [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4)].
    """
    chunks = []
    previous_prefix, previous_type, start = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the final O closes a chunk that runs to the end
        prefix, type_ = _split_tag(tag)
        type_changed = previous_type != type_
        if (previous_prefix in _ENDS_AFTER or (previous_prefix, prefix) in _ENDS_BETWEEN
                or (previous_prefix not in _OUTSIDE and type_changed)):
            chunks.append((previous_type, start, i - 1))
        if (prefix in _STARTS_AT or (previous_prefix, prefix) in _STARTS_BETWEEN
                or (prefix not in _OUTSIDE and type_changed)):
            start = i
        previous_prefix, previous_type = prefix, type_
    return chunks


def _entity_sets(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]):
    """The predicted and the true chunks of every sentence, as sets of (type, sentence, first, last)."""
    predictions, references = _sentences(predictions), _sentences(references)
    _paired_lengths(predictions, references)
    predicted, true = set(), set()
    for sentence, (predicted_tags, true_tags) in enumerate(zip(predictions, references)):
        _paired_lengths(predicted_tags, true_tags)
        predicted.update((type_, sentence, first, last) for type_, first, last in entities(predicted_tags))
        true.update((type_, sentence, first, last) for type_, first, last in entities(true_tags))
    return predicted, true


def _entity_counts(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]):
    predicted, true = _entity_sets(predictions, references)
    return len(predicted & true), len(predicted), len(true)


def _sentences(tags: Sequence) -> Sequence[Sequence[str]]:
    """One tag list a sentence; a flat list of tags is one sentence (its tags' letters would read as tags)."""
    tags = list(tags)  # a pandas Series by position, not by its index
    return [tags] if tags and isinstance(tags[0], str) else tags


def entity_precision(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Fraction of predicted entities (type and exact span) that are in the reference; one tag list a sentence."""
    correct, predicted, _ = _entity_counts(predictions, references)
    return correct / predicted if predicted else 0.0


def entity_recall(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Fraction of reference entities that were predicted with the right type and exact span."""
    correct, _, true = _entity_counts(predictions, references)
    return correct / true if true else 0.0


def tag_accuracy(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Fraction of words whose tag is right, over every sentence (seqeval's accuracy_score, which transformers'
    run_ner reports beside the entity scores); "O" words count, so it reads high on CoNLL-2003."""
    predictions, references = _sentences(predictions), _sentences(references)
    _paired_lengths(predictions, references)
    right = total = 0
    for predicted_tags, true_tags in zip(predictions, references):
        _paired_lengths(predicted_tags, true_tags)
        right += sum(map(str.__eq__, predicted_tags, true_tags))
        total += len(true_tags)
    return right / total if total else 0.0


def entity_f1(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Micro-averaged entity F1 over all types (CoNLL-2003's metric, seqeval's `f1_score`)."""
    correct, predicted, true = _entity_counts(predictions, references)
    return 2 * correct / (predicted + true) if predicted + true else 0.0


# --- extractive question answering ----------------------------------------------------------------------------

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 normalisation: lower-case, drop punctuation, then articles, then extra spaces.

    "The  Denver Broncos!" -> "denver broncos".
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_exact_match(prediction: str, answers: Sequence[str], version_2: bool = False) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0. With `version_2`, gold
    answers are first read as the official v2.0 script reads them (`v2_gold_answers`)."""
    answers = v2_gold_answers(answers) if version_2 else answer_texts(answers)
    return float(any(normalize_answer(prediction) == normalize_answer(answer) for answer in answers))


def answer_texts(answers: Sequence[str] | str | Mapping) -> list[str]:
    """A question's gold answers as texts: a list of them, one text alone, the Hugging Face datasets' answers cell
    ({"text": [...], "answer_start": [...]}, whose keys would otherwise be read as answers), or a SQuAD file's list
    of answers ([{"text": ..., "answer_start": ...}])."""
    if isinstance(answers, str):
        return [answers]
    if isinstance(answers, Mapping):
        if "text" not in answers:
            raise ValueError(f"gold answers as a mapping hold their texts under 'text' (the datasets' answers column); "
                             f"got the keys {', '.join(map(str, answers))}")
        return answer_texts(answers["text"])
    texts = [answer["text"] if isinstance(answer, Mapping) and "text" in answer else answer for answer in answers]
    if not all(isinstance(text, str) for text in texts):
        raise ValueError(f"gold answers must be texts, got {texts!r:.80}")
    return texts


def v2_gold_answers(answers: Sequence[str]) -> list[str]:
    """The gold answers the official SQuAD v2.0 script scores against: those that normalise to something (not
    "the", not "."), or [""] (unanswerable) if none does."""
    return [answer for answer in answer_texts(answers) if normalize_answer(answer)] or [""]


def answer_f1(prediction: str, answers: Sequence[str], version_2: bool = False) -> float:
    """Best F1 over the gold answers of the bags of normalised words.

    "Denver Broncos won" vs "the Denver Broncos": 2 shared words, precision 2/3, recall 1 -> F1 0.8.
    With `version_2`, the gold answers of `v2_gold_answers`, and an empty side (no answer) scores 1 against
    another empty side and 0 otherwise, as the official v2.0 script does (v1.1's scores 0 whenever a side is empty).
    """
    predicted = normalize_answer(prediction).split()
    answers = v2_gold_answers(answers) if version_2 else answer_texts(answers)
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        if version_2 and (not gold or not predicted):
            best = max(best, float(gold == predicted))
            continue
        shared = sum((Counter(predicted) & Counter(gold)).values())
        if shared:
            best = max(best, 2 * shared / (len(predicted) + len(gold)))
    return best


def exact_match(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """SQuAD exact match averaged over questions; `references` holds each question's gold answers."""
    _paired_lengths(predictions, references)
    return float(np.mean([answer_exact_match(p, answers) for p, answers in zip(predictions, references)]))


def squad_f1(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """SQuAD F1 averaged over questions (the official script reports these times 100)."""
    _paired_lengths(predictions, references)
    return float(np.mean([answer_f1(p, answers) for p, answers in zip(predictions, references)]))


def squad_v2_exact_match(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """SQuAD v2.0 exact match: an unanswerable question's reference is [] or [""], and the empty prediction
    matches it."""
    _paired_lengths(predictions, references)
    return float(np.mean([answer_exact_match(p, answers, version_2=True)
                          for p, answers in zip(predictions, references)]))


def squad_v2_f1(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """SQuAD v2.0 F1: an unanswerable question's reference is [] or [""], and the empty prediction scores 1 on
    it."""
    _paired_lengths(predictions, references)
    return float(np.mean([answer_f1(p, answers, version_2=True) for p, answers in zip(predictions, references)]))


# --- multi-label classification ------------------------------------------------------------------------------

def _indicators(predictions: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(examples, labels) 0/1 rows -> two boolean matrices of one shape."""
    predictions, labels = (np.asarray(rows, dtype=bool) for rows in _paired(predictions, labels))
    if predictions.shape != labels.shape or predictions.ndim != 2:
        raise ValueError(f"predictions {predictions.shape} and labels {labels.shape} must be (examples, labels) "
                         "indicator matrices of one shape")
    return predictions, labels


def multi_label_micro_f1(predictions: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]) -> float:
    """F1 over every (example, label) decision at once: 2tp / (2tp + fp + fn), counted over the whole matrix.

    [[1, 0], [1, 1]] against [[1, 1], [0, 1]]: tp 2, fp 1, fn 1 -> 4/6.
    """
    predictions, labels = _indicators(predictions, labels)
    return _f1(predictions.ravel(), labels.ravel(), True)


def multi_label_macro_f1(predictions: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]) -> float:
    """Unweighted mean of each label's F1 (a column of the matrix); a label neither true nor predicted anywhere
    scores 0, as in scikit-learn."""
    predictions, labels = _indicators(predictions, labels)
    return float(np.mean([_f1(predictions[:, j], labels[:, j], True) for j in range(labels.shape[1])]))


def subset_accuracy(predictions: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]) -> float:
    """Fraction of examples whose predicted label set is exactly the true one (exact match)."""
    predictions, labels = _indicators(predictions, labels)
    return float(np.mean(np.all(predictions == labels, axis=1)))


# --- per-label scores: where a task's metric was won or lost ----------------------------------------------------

LabelScores = dict[str, float | int]


def label_scores(correct: int, predicted: int, true: int) -> LabelScores:
    """One label's precision, recall, F1 and support (its true count); 0 where there is nothing to divide by, as
    scikit-learn's and seqeval's zero_division=0."""
    return {"precision": correct / predicted if predicted else 0.0, "recall": correct / true if true else 0.0,
            "f1": 2 * correct / (predicted + true) if predicted + true else 0.0, "support": true}


def class_scores(predictions: Sequence[int], labels: Sequence[int], names: Sequence[str]) -> dict[str, LabelScores]:
    """Each class's scores by its name, class i being names[i], every class listed (scikit-learn's
    classification_report with labels=range(len(names)))."""
    predictions, labels = _paired(predictions, labels)
    return {name: label_scores(int(np.sum((predictions == i) & (labels == i))), int(np.sum(predictions == i)),
                               int(np.sum(labels == i))) for i, name in enumerate(names)}


def confusion_matrix(predictions: Sequence[int], labels: Sequence[int], num_classes: int) -> list[list[int]]:
    """How many examples of each true class (a row) were predicted as each class (a column), classes 0 to
    num_classes - 1 (scikit-learn's confusion_matrix with labels=range(num_classes))."""
    predictions, labels = _paired(predictions, labels)
    for name, values in (("prediction", predictions), ("label", labels)):
        outside = values[(values < 0) | (values >= num_classes)]
        if outside.size:
            raise ValueError(f"{name} {outside[0]} is no class of {num_classes}")
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix.tolist()


def multi_label_scores(predictions: Sequence[Sequence[int]], labels: Sequence[Sequence[int]],
                       names: Sequence[str]) -> dict[str, LabelScores]:
    """Each label's scores by its name (column i is names[i]) over the examples' 0/1 rows: classification_report
    of the indicator matrices."""
    predictions, labels = _indicators(predictions, labels)
    if labels.shape[1] != len(names):
        raise ValueError(f"{len(names)} label names for {labels.shape[1]} columns")
    return {name: label_scores(int(np.sum(predictions[:, i] & labels[:, i])), int(np.sum(predictions[:, i])),
                               int(np.sum(labels[:, i]))) for i, name in enumerate(names)}


def entity_scores(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]
                  ) -> dict[str, LabelScores]:
    """Each entity type's scores, types in name order, those predicted or true anywhere (seqeval's
    classification_report); one tag list a sentence."""
    predicted, true = _entity_sets(predictions, references)
    types = sorted({chunk[0] for chunk in predicted | true})
    right = Counter(chunk[0] for chunk in predicted & true)
    predicted_count, true_count = Counter(chunk[0] for chunk in predicted), Counter(chunk[0] for chunk in true)
    return {type_: label_scores(right[type_], predicted_count[type_], true_count[type_]) for type_ in types}


# --- ranking --------------------------------------------------------------------------------------------------
# Each query's documents ranked by the model's scores (ties: the earlier document first), scored against their 0/1
# relevance as sentence-transformers' CrossEncoderRerankingEvaluator scores them; one list of scores and one of
# relevance per query, the metric averaged over the queries (one without a relevant document scores 0).

RANK_CUTOFF = 10  # MRR and NDCG look at the first 10 documents of a ranking


def _rankings(predictions: Sequence[Sequence[float]], references: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Each query's relevance, best-scored document first."""
    _paired_lengths(predictions, references)
    if len(references) == 0:
        raise ValueError("no queries to score")
    rankings = []
    for scores, relevance in zip(predictions, references):
        scores, relevance = np.asarray(scores, dtype=np.float64), np.asarray(relevance)
        if scores.shape != relevance.shape or scores.ndim != 1:
            raise ValueError(f"a query has {scores.size} scores for {relevance.size} documents")
        rankings.append((relevance[np.argsort(-scores, kind="stable")] > 0).astype(np.float64))
    return rankings


def mrr_at_10(predictions: Sequence[Sequence[float]], references: Sequence[Sequence[int]]) -> float:
    """Mean reciprocal rank of each query's first relevant document, 0 past rank 10: [[.9, .8]], [[0, 1]] -> 0.5."""
    reciprocal = []
    for ranked in _rankings(predictions, references):
        hits = np.flatnonzero(ranked[:RANK_CUTOFF])
        reciprocal.append(1 / (hits[0] + 1) if hits.size else 0.0)
    return float(np.mean(reciprocal))


def ndcg_at_10(predictions: Sequence[Sequence[float]], references: Sequence[Sequence[int]]) -> float:
    """Normalised discounted cumulative gain of the first 10 documents: each relevant one adds 1 / log2(rank + 1),
    divided by the sum that ranking every relevant document first would give."""
    discounts = 1 / np.log2(np.arange(2, RANK_CUTOFF + 2))  # ranks 1..10
    gains = []
    for ranked in _rankings(predictions, references):
        top = ranked[:RANK_CUTOFF]
        ideal = discounts[:min(int(ranked.sum()), RANK_CUTOFF)].sum()
        gains.append(float(top @ discounts[:len(top)]) / ideal if ideal else 0.0)
    return float(np.mean(gains))


def mean_average_precision(predictions: Sequence[Sequence[float]], references: Sequence[Sequence[int]]) -> float:
    """Mean over queries of the precision at each relevant document's rank, averaged over its relevant documents
    (scikit-learn's average_precision_score per query)."""
    precisions = []
    for ranked in _rankings(predictions, references):
        hits = np.cumsum(ranked)
        precisions.append(float(np.sum(ranked * hits / np.arange(1, len(ranked) + 1)) / hits[-1]) if hits[-1] else 0.0)
    return float(np.mean(precisions))


# --- the table the CLI reads ----------------------------------------------------------------------------------

Metric = Callable[[Sequence, Sequence], float]

METRICS: dict[str, dict[str, Metric]] = {
    "classification": {"accuracy": accuracy, "f1": binary_f1, "macro_f1": macro_f1,
                       "matthews_correlation": matthews_correlation},
    "regression": {"pearson": pearson, "spearman": spearman},
    "multi_label": {"micro_f1": multi_label_micro_f1, "macro_f1": multi_label_macro_f1,
                    "subset_accuracy": subset_accuracy},
    "token_classification": {"precision": entity_precision, "recall": entity_recall, "f1": entity_f1,
                             "accuracy": tag_accuracy},
    "question_answering": {"exact_match": exact_match, "f1": squad_f1},
    "question_answering_v2": {"exact_match": squad_v2_exact_match, "f1": squad_v2_f1},
    "reranking": {"map": mean_average_precision, f"mrr@{RANK_CUTOFF}": mrr_at_10, f"ndcg@{RANK_CUTOFF}": ndcg_at_10},
}


# Metrics where a smaller value is the better model; every other metric is better higher.
LOWER_IS_BETTER = frozenset({"loss"})


def greater_is_better(metric: str) -> bool:
    """Which way a metric improves, from its name: accuracy up, loss down."""
    return metric not in LOWER_IS_BETTER


def compute_metrics(kind: str, predictions: Sequence, references: Sequence,
                    names: Sequence[str] | None = None) -> dict[str, float]:
    """Every metric of a task kind (or the named ones): compute_metrics("regression", p, y) -> {"pearson": ...}."""
    check_choice(kind, METRICS, "task kind")
    table = METRICS[kind]
    for name in names or ():
        check_choice(name, table, f"{kind} metric")
    if names is None and kind == "classification" and len(np.union1d(*_per_example(predictions, references))) > 2:
        names = [name for name in table if name != "f1"]  # one class's F1 is no score of a many-class task
    return {name: table[name](predictions, references) for name in names or table}


def _paired_lengths(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")


def _paired(predictions: Sequence, labels: Sequence) -> tuple[np.ndarray, np.ndarray]:
    _paired_lengths(predictions, labels)
    if len(labels) == 0:
        raise ValueError("no predictions to score")
    return np.asarray(predictions), np.asarray(labels)


def _per_example(predictions: Sequence, labels: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Both sides as 1-D arrays of one kind: (n, 1) columns flattened (as run_glue squeezes them), labels written
    as numbers ("0", "1") as numbers where the other side holds numbers; scores per class (logits) refused."""
    sides = []
    for name, values in zip(("predictions", "labels"), _paired(predictions, labels)):
        if values.ndim > 1 and values.size == len(values):
            values = values.reshape(-1)
        elif values.ndim != 1:
            raise ValueError(f"{name} must hold one label or score per example, got an array of shape "
                             f"{values.shape}: take the argmax of scores per class (logits) first")
        if values.dtype == object and all(isinstance(value, str) for value in values):
            values = values.astype(str)  # a pandas column of texts
        sides.append(values)
    if len({side.dtype.kind in "US" for side in sides}) == 2:  # texts beside numbers would never be equal
        sides = [_as_numbers(side) for side in sides]
        if any(side.dtype.kind in "US" for side in sides):
            raise ValueError(f"predictions and labels are of different kinds (such as {sides[0][0]!r} and "
                             f"{sides[1][0]!r}): give both as label names or both as class ids")
    return sides[0], sides[1]
