"""Metrics against independent truths: confusion counts worked out by hand, scipy/scikit-learn/seqeval when
they happen to be installed, and the official SQuAD v1.1 and v2.0 evaluation scripts' rules."""

import collections
import json
import math
import random
import re
import string

import pytest
import torch

from bertforge import ConfigError
from bertforge.tasks.metrics import (
    METRICS,
    accuracy,
    answer_exact_match,
    answer_f1,
    average_ranks,
    binary_f1,
    class_scores,
    compute_metrics,
    confusion_matrix,
    entities,
    entity_f1,
    entity_precision,
    entity_recall,
    entity_scores,
    exact_match,
    macro_f1,
    matthews_correlation,
    multi_label_scores,
    normalize_answer,
    pearson,
    spearman,
    squad_f1,
    squad_v2_exact_match,
    squad_v2_f1,
    tag_accuracy,
)

# By hand: tp = 3 (positions 0, 1, 9), fn = 2 (2, 3), fp = 1 (6), tn = 4 (4, 5, 7, 8).
LABELS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 1]
PREDICTIONS = [1, 1, 0, 0, 0, 0, 1, 0, 0, 1]


def random_classes(num_classes, size=200, seed=0):
    rng = random.Random(seed)
    labels = [rng.randrange(num_classes) for _ in range(size)]
    # Correct 60% of the time, so the scores sit well away from 0 and 1.
    return [y if rng.random() < 0.6 else rng.randrange(num_classes) for y in labels], labels


def test_classification_on_a_hand_counted_confusion_matrix():
    assert accuracy(PREDICTIONS, LABELS) == pytest.approx(7 / 10)
    # precision 3/4, recall 3/5 -> F1 = 2 * 0.75 * 0.6 / 1.35
    assert binary_f1(PREDICTIONS, LABELS) == pytest.approx(2 / 3)
    # class 0: tp 4, fp 2, fn 1 -> F1 8/11
    assert macro_f1(PREDICTIONS, LABELS) == pytest.approx((2 / 3 + 8 / 11) / 2)
    # (tp tn - fp fn) / sqrt((tp + fp)(tp + fn)(tn + fp)(tn + fn))
    assert matthews_correlation(PREDICTIONS, LABELS) == pytest.approx((3 * 4 - 1 * 2) / math.sqrt(4 * 5 * 5 * 6))


def test_classification_edge_cases():
    assert binary_f1([0, 0, 0], [0, 0, 0]) == 0.0, "no positives anywhere: scikit-learn's zero_division value"
    assert matthews_correlation([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0, "constant predictions: undefined, reported as 0"
    assert matthews_correlation([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)
    assert matthews_correlation([1, 0], [0, 1]) == pytest.approx(-1.0)
    assert binary_f1(["no", "yes"], ["yes", "yes"], positive="yes") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="2 predictions for 3"):
        accuracy([1, 0], [1, 0, 1])


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_classification_matches_scikit_learn(num_classes):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    predictions, labels = random_classes(num_classes, seed=num_classes)
    assert accuracy(predictions, labels) == pytest.approx(sklearn_metrics.accuracy_score(labels, predictions))
    assert macro_f1(predictions, labels) == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions, average="macro"))
    assert matthews_correlation(predictions, labels) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels, predictions))
    if num_classes == 2:
        assert binary_f1(predictions, labels) == pytest.approx(sklearn_metrics.f1_score(labels, predictions))


def test_correlations_by_hand():
    # x - mean = (-1, 0, 1), y - mean = (-4/3, -1/3, 5/3): r = 3 / sqrt(2 * 42/9)
    assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(3 / math.sqrt(2 * 42 / 9))
    assert list(average_ranks([10, 20, 20, 5])) == [2, 3.5, 3.5, 1]
    assert list(average_ranks([7, 7, 7])) == [2, 2, 2]
    # ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): r = 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0), "any increasing relation"
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3])), "undefined for a constant input, as in scipy"
    # 0.1 * 3 / 3 != 0.1 in floats: subtracting the mean leaves noise, which must not become a correlation
    assert math.isnan(pearson([0.1, 0.1, 0.1], [0.3, 0.2, 0.7])) and math.isnan(pearson([1, 2, 3], [0.7] * 3))
    assert math.isnan(spearman([5, 5, 5], [1, 2, 3]))
    assert math.isnan(spearman([0.1, float("nan"), 0.5, 0.7], [1, 2, 3, 4])), "NaN is no rank (scipy: nan)"


def test_binary_f1_reads_labels_written_as_numbers_and_refuses_a_positive_label_of_another_kind():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    predictions, labels = random_classes(2, seed=3)
    expected = sklearn_metrics.f1_score(labels, predictions)
    assert binary_f1([str(p) for p in predictions], [str(y) for y in labels]) == pytest.approx(expected)
    assert binary_f1(predictions, [f"{y}.0" for y in labels]) == pytest.approx(expected)
    assert compute_metrics("classification", [str(p) for p in predictions], [str(y) for y in labels],
                           names=["f1"]) == {"f1": pytest.approx(expected)}
    with pytest.raises(ValueError, match="positive label 1 is not among labels such as 'no'"):
        binary_f1(["no", "yes"], ["no", "no"])


def test_pearson_at_any_scale_and_never_past_one():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    labels = [rng.uniform(0, 5) for _ in range(50)]
    predictions = [y + rng.gauss(0, 1) for y in labels]
    expected = stats.pearsonr(predictions, labels)[0]
    for scale in (1e-200, 1e-160, 1.0, 1e160):  # the sums of squares under- or overflow unscaled
        assert pearson([p * scale for p in predictions], labels) == pytest.approx(expected, rel=1e-12)
    for _ in range(200):  # exactly linear: 1 or -1, which rounding carried past 1 in about a fifth of these
        x = [rng.uniform(-10, 10) for _ in range(rng.randint(2, 30))]
        slope = rng.choice([-1, 1]) * rng.uniform(0.1, 10)
        r = pearson(x, [slope * value + 3 for value in x])
        assert -1.0 <= r <= 1.0 and abs(r) == pytest.approx(1.0)


def test_correlations_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    labels = [round(rng.uniform(0, 5), 1) for _ in range(300)]  # STS-B-like scores, many ties
    predictions = [round(y + rng.gauss(0, 1.5)) for y in labels]  # integers, heavily tied
    assert pearson(predictions, labels) == pytest.approx(stats.pearsonr(predictions, labels)[0])
    assert spearman(predictions, labels) == pytest.approx(stats.spearmanr(predictions, labels)[0])


@pytest.mark.parametrize("tags, expected", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    # IOB1: I- opens a chunk; B- only separates two adjacent chunks of one type.
    (["I-PER", "I-PER", "B-PER", "O", "I-LOC"], [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]),
    (["B-PER", "I-PER", "B-PER", "O", "B-LOC"], [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]),
    (["O", "I-MISC", "I-MISC"], [("MISC", 1, 2)]),  # I- after O starts a chunk (invalid IOB2, still decoded)
    (["B-PER", "I-LOC", "I-LOC", "O"], [("PER", 0, 0), ("LOC", 1, 2)]),  # a type change splits
    (["I-ORG", "I-PER"], [("ORG", 0, 0), ("PER", 1, 1)]),
    (["B-ORG", "B-ORG", "I-ORG"], [("ORG", 0, 0), ("ORG", 1, 2)]),
    (["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC"], [("PER", 0, 0), ("LOC", 1, 3), ("LOC", 4, 4)]),  # IOBES
    (["O", "O"], []),
    (["B-PER", "I-PER"], [("PER", 0, 1)]),  # a chunk running to the end is closed
])
def test_entity_chunks(tags, expected):
    assert entities(tags) == expected


def test_entity_scores_by_hand():
    references = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "I-ORG"], ["B-MISC"]]
    predictions = [["B-PER", "I-PER", "O", "B-ORG"],  # PER right, LOC typed wrong
                   ["O", "B-ORG", "I-ORG", "O"],  # ORG span too short: wrong
                   ["I-MISC"]]  # IOB1 spelling of the same MISC chunk: right
    # 2 correct of 4 predicted and 4 true
    assert entity_precision(predictions, references) == pytest.approx(2 / 4)
    assert entity_recall(predictions, references) == pytest.approx(2 / 4)
    assert entity_f1(predictions, references) == pytest.approx(0.5)
    # Sentences are scored separately: a chunk never continues into the next sentence.
    assert entity_f1([["B-PER"], ["I-PER"]], [["B-PER"], ["B-PER"]]) == pytest.approx(1.0)
    assert entity_f1([["O"]], [["O"]]) == 0.0
    assert entity_precision([["O", "B-PER"]], [["O", "O"]]) == 0.0 and entity_recall([["O"]], [["O"]]) == 0.0


def test_entity_scores_match_seqeval():
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    tags = ["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-ORG", "S-MISC", "E-MISC"]
    references = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(100)]
    predictions = [[tag if rng.random() < 0.7 else rng.choice(tags) for tag in sentence] for sentence in references]
    assert entity_precision(predictions, references) == pytest.approx(seqeval.precision_score(references, predictions))
    assert entity_recall(predictions, references) == pytest.approx(seqeval.recall_score(references, predictions))
    assert entity_f1(predictions, references) == pytest.approx(seqeval.f1_score(references, predictions))
    assert compute_metrics("token_classification", predictions, references)["accuracy"] == pytest.approx(
        seqeval.accuracy_score(references, predictions))


def as_report(scores):
    """Our per-label scores as classification_report's rows flattened: {(label, "f1-score"): value, ...}."""
    spelling = {"precision": "precision", "recall": "recall", "f1": "f1-score", "support": "support"}
    return {(label, spelling[key]): value for label, row in scores.items() for key, value in row.items()}


def report_rows(report, labels):
    return {(label, key): float(value) for label in labels for key, value in report[label].items()}


def test_per_label_scores_by_hand():
    # pos (1): predicted 4 times (3 right), true 5; neg (0): predicted 6 (4 right), true 5; neutral (2): never.
    scores = class_scores(PREDICTIONS, LABELS, ["neg", "pos", "neutral"])
    assert scores["pos"] == {"precision": 3 / 4, "recall": 3 / 5, "f1": 6 / 9, "support": 5}
    assert scores["neg"] == {"precision": 4 / 6, "recall": 4 / 5, "f1": 8 / 11, "support": 5}
    assert scores["neutral"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    # The same sentences as test_entity_scores_by_hand: PER right; LOC missed (typed ORG); ORG's span short.
    references = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "I-ORG"], ["B-MISC"]]
    predictions = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "B-ORG", "I-ORG", "O"], ["I-MISC"]]
    assert entity_scores(predictions, references) == {
        "LOC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "MISC": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1},
        "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}}
    assert multi_label_scores([[1, 0], [1, 1]], [[1, 1], [0, 1]], ["a", "b"]) == {
        "a": {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1},
        "b": {"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2}}
    with pytest.raises(ValueError, match="3 label names for 2 columns"):
        multi_label_scores([[1, 0]], [[1, 1]], ["a", "b", "c"])


@pytest.mark.parametrize("num_classes", [2, 5])
def test_class_and_multi_label_scores_match_scikit_learns_report(num_classes):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    predictions, labels = random_classes(num_classes, seed=num_classes)
    names = [f"class {i}" for i in range(num_classes + 1)]  # one class of the model's never seen nor predicted
    expected = sklearn_metrics.classification_report(labels, predictions, labels=range(num_classes + 1),
                                                     target_names=names, output_dict=True, zero_division=0)
    assert as_report(class_scores(predictions, labels, names)) == pytest.approx(report_rows(expected, names))
    rng = random.Random(num_classes)
    true = [[int(rng.random() < 0.3) for _ in range(num_classes)] for _ in range(120)]
    predicted = [[bit if rng.random() < 0.8 else 1 - bit for bit in row] for row in true]
    names = names[:num_classes]
    expected = sklearn_metrics.classification_report(true, predicted, target_names=names, output_dict=True,
                                                     zero_division=0)
    assert as_report(multi_label_scores(predicted, true, names)) == pytest.approx(report_rows(expected, names))
    # the printed table's averages, as the report's rows (a class of the model never seen counted, as labels= does)
    from bertforge.cli.evaluate import label_table
    names = [f"class {i}" for i in range(num_classes + 1)]
    expected = sklearn_metrics.classification_report(labels, predictions, labels=range(num_classes + 1),
                                                     target_names=names, output_dict=True, zero_division=0)
    printed = {line[:12].strip(): [float(value) for value in line[12:].split()]
               for line in label_table(class_scores(predictions, labels, names)).splitlines()[1:]}
    for average in ("macro avg", "weighted avg"):
        row = expected[average]
        assert printed[average] == pytest.approx([row["precision"], row["recall"], row["f1-score"], row["support"]],
                                                 abs=5e-5)


def test_confusion_matrix_by_hand_and_as_scikit_learn_counts():
    # tp 3, fn 2, fp 1, tn 4 (above): rows are the true class, columns the predicted one.
    assert confusion_matrix(PREDICTIONS, LABELS, 2) == [[4, 1], [2, 3]]
    assert confusion_matrix(PREDICTIONS, LABELS, 3) == [[4, 1, 0], [2, 3, 0], [0, 0, 0]]
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    for num_classes in (2, 5):
        predictions, labels = random_classes(num_classes, seed=num_classes)
        expected = sklearn_metrics.confusion_matrix(labels, predictions, labels=range(num_classes + 1))
        assert confusion_matrix(predictions, labels, num_classes + 1) == expected.tolist()
    with pytest.raises(ValueError, match="label 2 is no class of 2"):
        confusion_matrix([0, 1], [0, 2], 2)
    with pytest.raises(ValueError, match="prediction -1 is no class of 2"):
        confusion_matrix([0, -1], [0, 1], 2)


def test_entity_scores_match_seqevals_report_on_real_conll_tags(data_dir):
    """Real CoNLL-2003 tags (IOB1, as the files spell them) against a corrupted copy, type by type."""
    seqeval = pytest.importorskip("seqeval.metrics")
    from bertforge.tasks.token_classification import read_conll
    references = [sentence.tags for sentence in read_conll(data_dir / "conll2003" / "eng.testa")[:600]]
    rng = random.Random(0)
    tags = sorted({tag for sentence in references for tag in sentence})
    predictions = [[tag if rng.random() < 0.85 else rng.choice(tags) for tag in sentence]
                   for sentence in references]
    expected = seqeval.classification_report(references, predictions, output_dict=True, zero_division=0)
    ours = entity_scores(predictions, references)
    assert list(ours) == ["LOC", "MISC", "ORG", "PER"]
    assert as_report(ours) == pytest.approx(report_rows(expected, list(ours)))
    assert sum(row["support"] for row in ours.values()) == sum(map(len, map(entities, references)))


@pytest.mark.parametrize("text, normalised", [
    ("The Denver Broncos", "denver broncos"),
    ("  an apple a   day ", "apple day"),
    ("Theatre of the Absurd", "theatre of absurd"),  # articles are whole words only
    ("U.S.A.", "usa"),
    ("don't-stop", "dontstop"),  # punctuation is deleted, not replaced by a space
    ("the a, an.", ""),  # punctuation goes first, so "a," is an article too
    ("Élan, THE café", "élan café"),
])
def test_squad_normalisation(text, normalised):
    assert normalize_answer(text) == normalised


def test_squad_scores():
    answers = ["Carolina Panthers", "the Denver Broncos."]
    assert answer_exact_match("Denver Broncos", answers) == 1.0, "the best gold answer counts"
    assert answer_exact_match("Broncos", answers) == 0.0
    # "denver broncos won" vs "denver broncos": 2 shared, precision 2/3, recall 1
    assert answer_f1("Denver Broncos won", answers) == pytest.approx(0.8)
    # bags, not sets: "cat cat" vs "cat" shares one word -> precision 1/2, recall 1
    assert answer_f1("the cat cat", ["cat"]) == pytest.approx(2 / 3)
    assert answer_f1("Panthers", answers) == pytest.approx(2 / 3)
    assert answer_f1("", answers) == 0.0 and answer_f1("a", ["the"]) == 0.0, "v1.1: no shared word, F1 0"
    predictions = ["Denver Broncos", "Santa Clara, California", "gold"]
    references = [answers, ["Levi's Stadium", "Santa Clara"], ["golden"]]
    assert exact_match(predictions, references) == pytest.approx(1 / 3)
    assert squad_f1(predictions, references) == pytest.approx((1 + 2 * 2 / (3 + 2) + 0) / 3)


def test_metric_table():
    assert set(METRICS) == {"classification", "regression", "multi_label", "token_classification",
                            "question_answering", "question_answering_v2", "reranking"}
    scores = compute_metrics("classification", PREDICTIONS, LABELS)
    assert scores["accuracy"] == pytest.approx(0.7) and scores["f1"] == pytest.approx(2 / 3)
    assert compute_metrics("regression", [1, 2, 3], [1, 2, 4], names=["spearman"]) == {"spearman": 1.0}
    with pytest.raises(ConfigError, match="choose from classification"):
        compute_metrics("ner", [], [])
    with pytest.raises(ConfigError, match="'mcc'"):
        compute_metrics("classification", PREDICTIONS, LABELS, names=["mcc"])


# --- SQuAD v2.0 against the official evaluation script's rules, reimplemented here from its description --------

def official_v2_evaluation(dataset: list[dict], predictions: dict[str, str]) -> dict[str, float]:
    """What evaluate-v2.0.py prints for a SQuAD v2.0 file's "data" and {question id: answer text} (no no-answer
    probabilities, so its threshold changes nothing): exact and F1 in percent over all questions, then over those
    with answers (HasAns_) and those without (NoAns_), each part only if there are such questions. Gold answers that
    normalise to nothing are dropped; a question left with none has the gold answer ""; an empty answer scores 1
    only against an empty gold answer."""
    def normal(text):
        text = "".join(c for c in text.lower() if c not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())

    def f1(reference, guess):
        reference_tokens, guess_tokens = normal(reference).split(), normal(guess).split()
        if not reference_tokens or not guess_tokens:
            return float(reference_tokens == guess_tokens)
        same = sum((collections.Counter(reference_tokens) & collections.Counter(guess_tokens)).values())
        if same == 0:
            return 0.0
        precision, recall = same / len(guess_tokens), same / len(reference_tokens)
        return 2 * precision * recall / (precision + recall)

    exact, f1s, has_answer = {}, {}, {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for question in paragraph["qas"]:
                qid = question["id"]
                has_answer[qid] = bool(question["answers"])
                references = [a["text"] for a in question["answers"] if normal(a["text"])] or [""]
                exact[qid] = max(float(normal(a) == normal(predictions[qid])) for a in references)
                f1s[qid] = max(f1(a, predictions[qid]) for a in references)

    def totals(qids, prefix=""):
        return {f"{prefix}exact": 100 * sum(exact[q] for q in qids) / len(qids),
                f"{prefix}f1": 100 * sum(f1s[q] for q in qids) / len(qids), f"{prefix}total": len(qids)}

    result = totals(list(exact))
    for prefix, wanted in (("HasAns_", True), ("NoAns_", False)):
        qids = [q for q in exact if has_answer[q] == wanted]
        if qids:
            result |= totals(qids, prefix)
    return result


def as_official(scores: dict[str, float], examples) -> dict[str, float]:
    """bertforge's QA scores (fractions, has_answer_*/no_answer_*) in the official script's names and percent."""
    answerable = sum(not e.is_impossible for e in examples)
    result = {"exact": 100 * scores["exact_match"], "f1": 100 * scores["f1"], "total": len(examples)}
    for prefix, part, count in (("HasAns_", "has_answer_", answerable),
                                ("NoAns_", "no_answer_", len(examples) - answerable)):
        if count:
            result |= {f"{prefix}exact": 100 * scores[f"{part}exact_match"], f"{prefix}f1": 100 * scores[f"{part}f1"],
                       f"{prefix}total": count}
    return result


def as_squad_data(examples) -> list[dict]:
    """Examples as a SQuAD v2.0 file's "data": one paragraph per question."""
    return [{"title": "t", "paragraphs": [{"context": e.context, "qas": [
        {"id": e.id, "question": e.question, "is_impossible": e.is_impossible,
         "answers": [{"text": text, "answer_start": start} for text, start in e.answers]}]} for e in examples]}]


def test_squad_v2_scores_equal_the_official_scripts_on_real_questions_with_abstentions(data_dir):
    """Real SQuAD questions; half made unanswerable by pairing them with another article's paragraph (as SQuAD
    v2.0's are: plausible, but not answered by the passage); answers as a reader gives them: another annotator's
    answer, the answer with neighbouring words, a wrong span of the passage, or an abstention ("")."""
    from bertforge.tasks.question_answering import QAExample, score

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    paragraphs = [p for article in squad["data"][:6] for p in article["paragraphs"][:3]]
    rng = random.Random(0)
    examples, predictions = [], []
    for i, paragraph in enumerate(paragraphs):
        for question in paragraph["qas"][:4]:
            context = paragraph["context"]
            unanswerable = rng.random() < 0.5
            if unanswerable:
                context = paragraphs[(i + 7) % len(paragraphs)]["context"]
                answers = []
            else:
                answers = [(a["text"], a["answer_start"]) for a in question["answers"]]
            words = context.split()
            start = rng.randrange(len(words) - 3)
            wrong_span = " ".join(words[start:start + rng.randint(1, 3)])
            choice = rng.choice(["abstain", "wrong"] if unanswerable else ["other", "wider", "wrong", "abstain"])
            if choice == "other":
                guess = answers[-1][0]
            elif choice == "wider":
                text, at = answers[0]
                guess = context[max(0, at - 12):at + len(text) + 9].strip()
            else:
                guess = "" if choice == "abstain" else wrong_span
            examples.append(QAExample(question["id"], question["question"], context, answers, unanswerable))
            predictions.append(guess)
    assert sum(e.is_impossible for e in examples) > 10 and predictions.count("") > 10

    got = score([{"answer": guess} for guess in predictions], examples)
    expected = official_v2_evaluation(as_squad_data(examples), dict(zip((e.id for e in examples), predictions)))
    assert as_official(got, examples) == pytest.approx(expected, abs=1e-10)
    # The v1.1 rule (an empty answer scores 0) would score every correct abstention as wrong.
    assert squad_f1(predictions, [[t for t, _ in e.answers] or [""] for e in examples]) < got["f1"]


def test_squad_v2_drops_gold_answers_that_normalise_to_nothing_as_the_official_script(data_dir):
    """Real SQuAD questions one of whose annotators answered with a bare "." or article: v2.0's script drops such
    answers, so an abstention is wrong on them (v1.1's keeps them: "" equals "." once normalised)."""
    from bertforge.tasks.question_answering import QAExample, score

    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    questions = [(paragraph["context"], question) for article in squad["data"] for paragraph in article["paragraphs"]
                 for question in paragraph["qas"] if not all(normalize_answer(a["text"]) for a in question["answers"])]
    assert len(questions) >= 3
    examples = [QAExample(q["id"], q["question"], context, [(a["text"], a["answer_start"]) for a in q["answers"]])
                for context, q in questions]
    references = [[text for text, _ in e.answers] for e in examples]
    for guesses in ([""] * len(examples), [answers[0] for answers in references],
                    [answers[-1] for answers in references], ["the"] * len(examples)):
        expected = official_v2_evaluation(as_squad_data(examples), dict(zip((e.id for e in examples), guesses)))
        got = compute_metrics("question_answering_v2", guesses, references)
        assert (100 * got["exact_match"], 100 * got["f1"]) == pytest.approx((expected["exact"], expected["f1"]))
    # A v2.0 model that abstains on data where every question has an answer is scored by v2.0's rules too.
    abstentions = [""] * len(examples)
    got = score([{"answer": guess} for guess in abstentions], examples)
    expected = official_v2_evaluation(as_squad_data(examples), dict(zip((e.id for e in examples), abstentions)))
    assert as_official(got, examples) == pytest.approx(expected) and got["exact_match"] == 0.0


def squad_v2_file(articles: list[dict], path, shift: int):
    """A SQuAD v2.0-style file from v1.1 articles: every other question of each paragraph stays with its paragraph
    (answerable, with its annotators' answers); the rest are asked of a paragraph of ANOTHER article, `shift`
    paragraphs on, which does not answer them (is_impossible, as in v2.0; v2.0's are written by crowdworkers to
    look answerable, these are only off-topic)."""
    paragraphs = [(article["title"], paragraph) for article in articles for paragraph in article["paragraphs"]]
    data = []
    for i, (title, paragraph) in enumerate(paragraphs):
        other = next(p for t, p in paragraphs[i + shift:] + paragraphs if t != title)
        for j, question in enumerate(paragraph["qas"][:2]):
            unanswerable = (i + j) % 2 == 1
            qa = {"id": question["id"], "question": question["question"], "is_impossible": unanswerable,
                  "answers": [] if unanswerable else question["answers"]}
            data.append({"title": title, "paragraphs": [
                {"context": other["context"] if unanswerable else paragraph["context"], "qas": [qa]}]})
    path.write_text(json.dumps({"version": "v2.0", "data": data}), encoding="utf-8")
    return data


@pytest.mark.usefixtures("one_thread")
def test_squad_v2_scores_of_a_real_models_answers_equal_the_official_scripts(data_dir, tmp_path, tokenizer):
    """A v2.0 model's own answers, abstentions included, scored by bertforge and by the official script's rules.
    The model: MiniLM with its span layer trained (the encoder frozen, to stay fast) on 48 questions of three
    articles, half of them made unanswerable; its answers to 24 questions of two other articles are bertforge's
    whole prediction path (windows, null score against the best span, default threshold)."""
    from bertforge import BertForQuestionAnswering
    from bertforge.tasks.data import collate
    from bertforge.tasks.question_answering import QASettings, read_squad
    from bertforge.tasks.registry import TASKS

    qa = TASKS["qa"]
    articles = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    squad_v2_file(articles[1:4], tmp_path / "train.json", shift=5)
    dev_articles = [{**article, "paragraphs": article["paragraphs"][:6]} for article in (articles[0], articles[4])]
    dev = squad_v2_file(dev_articles, tmp_path / "dev.json", shift=3)
    settings = QASettings(max_length=192, doc_stride=64, version_2=True)
    train = read_squad(tmp_path / "train.json", version_2=True)[:48]
    torch.manual_seed(0)
    model = BertForQuestionAnswering.from_pretrained("default").eval()
    batch = collate(qa.encode(tokenizer, train, settings, {}).rows, tokenizer.pad_token_id)
    with torch.no_grad():
        hidden = model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
    optimizer = torch.optim.Adam(model.qa_outputs.parameters(), lr=1e-2)
    for _ in range(30):
        loss = model.qa_outputs.loss(model.qa_outputs(hidden), (batch["start_positions"], batch["end_positions"]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    examples = qa.read_examples(tmp_path / "dev.json", None, settings=settings)
    answers = qa.predict(model, qa.encode(tokenizer, examples, settings, {}), examples, 32)
    predictions = {e.id: answer["answer"] for e, answer in zip(examples, answers)}
    abstained = [e.is_impossible for e, answer in zip(examples, answers) if answer["answer"] == ""]
    answered = [e.is_impossible for e, answer in zip(examples, answers) if answer["answer"] != ""]
    # Every case of the rules: right and wrong abstentions, spans for answerable and for unanswerable questions.
    assert True in abstained and False in abstained and True in answered and False in answered, predictions

    expected = official_v2_evaluation(dev, predictions)
    got = qa.score(answers, examples)
    assert as_official(got, examples) == pytest.approx(expected, abs=1e-10)
    assert expected["total"] == 24 and expected["NoAns_total"] == 12


def test_metrics_read_the_shapes_their_references_read_or_refuse_them(data_dir):
    """The inputs the references take, as they read them: the datasets' SQuAD answers cells (the official script
    reads their "text"), one gold answer alone, one sentence's flat tag list (seqeval's accuracy_score reads it so),
    an (n, 1) column of scores (run_glue squeezes it), labels written as numbers beside class ids; and what
    scikit-learn refuses (one class's F1 of a many-class task, scores per class) refused, not scored."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    seqeval = pytest.importorskip("seqeval.metrics")
    stats = pytest.importorskip("scipy.stats")
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    questions = [q for p in squad["data"][0]["paragraphs"][:4] for q in p["qas"]]
    cells = [{"text": [a["text"] for a in q["answers"]], "answer_start": [a["answer_start"] for a in q["answers"]]}
             for q in questions]
    lists = [cell["text"] for cell in cells]
    rng = random.Random(0)
    guesses = [rng.choice(texts + [texts[0] + " then", "nothing like it"]) for texts in lists]
    for metric in (exact_match, squad_f1, squad_v2_exact_match, squad_v2_f1):
        official = [question["answers"] for question in questions]  # the SQuAD file's own lists of answers
        assert metric(guesses, cells) == metric(guesses, lists) == metric(guesses, official) > 0
    assert exact_match(guesses, [texts[0] for texts in lists]) == exact_match(guesses, [texts[:1] for texts in lists])
    with pytest.raises(ValueError, match="under 'text'"):
        exact_match(guesses[:1], [{"answers": lists[0]}])

    from bertforge.tasks.token_classification import read_conll
    sentence = next(s.tags for s in read_conll(data_dir / "conll2003" / "eng.testa") if len(set(s.tags)) > 2)
    tags = sorted({tag for tag in sentence})
    guessed = [tag if rng.random() < 0.7 else rng.choice(tags) for tag in sentence]
    assert entity_f1(guessed, sentence) == pytest.approx(seqeval.f1_score([sentence], [guessed]))
    assert tag_accuracy(guessed, sentence) == pytest.approx(seqeval.accuracy_score(sentence, guessed))

    predictions, labels = random_classes(3, seed=1)
    assert "f1" not in compute_metrics("classification", predictions, labels)
    assert compute_metrics("classification", predictions, labels)["macro_f1"] == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions, average="macro"))
    with pytest.raises(ValueError, match="these labels hold 3 classes: use macro_f1"):
        binary_f1(predictions, labels)
    two_predictions, two_labels = random_classes(2, seed=2)
    written = [str(label) for label in two_labels]
    assert compute_metrics("classification", two_predictions, written) == pytest.approx(
        {"accuracy": sklearn_metrics.accuracy_score(two_labels, two_predictions),
         "f1": sklearn_metrics.f1_score(two_labels, two_predictions),
         "macro_f1": sklearn_metrics.f1_score(two_labels, two_predictions, average="macro"),
         "matthews_correlation": sklearn_metrics.matthews_corrcoef(two_labels, two_predictions)})
    pd = pytest.importorskip("pandas")  # a column read from a CSV: texts in an object array
    assert accuracy(pd.Series(written, dtype=object), two_labels) == 1.0
    with pytest.raises(ValueError, match=r"shape \(200, 2\)"):  # two columns of texts are no labels
        accuracy(pd.DataFrame({"a": written, "b": written}), two_labels)
    assert compute_metrics("classification", pd.Series(written), two_predictions) == \
        compute_metrics("classification", two_labels, two_predictions)
    tagged = pd.Series([guessed, sentence], index=[7, 9])  # read by position, not by index
    assert entity_f1(tagged[[9]], pd.Series([sentence], index=[3])) == 1.0
    with pytest.raises(ValueError, match="different kinds"):
        accuracy(["negative", "positive"], [0, 1])
    with pytest.raises(ValueError, match=r"shape \(2, 2\): take the argmax"):
        accuracy(torch.tensor([[0.2, 0.8], [0.9, 0.1]]).numpy(), [1, 0])
    scores, gold = [[0.1], [0.5], [0.3], [0.9]], [0.0, 1.0, 0.5, 1.0]
    assert pearson(scores, gold) == pytest.approx(stats.pearsonr([s[0] for s in scores], gold)[0])
    assert spearman(scores, gold) == pytest.approx(stats.spearmanr(scores, gold)[0])
