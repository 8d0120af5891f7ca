"""Sequence classification and regression on the pooled [CLS] vector (GLUE's SST-2, MRPC, STS-B).

Examples -> features: one text or a pair, truncated to max_length (or cut into overlapping windows whose logits
are averaged). Predictions -> answers: a label with its probabilities, or a score for regression.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.heads import default_labels
from bertforge.tasks.data import EncodeSettings, Features, TextExample
from bertforge.tasks.metrics import LabelScores, class_scores, compute_metrics, confusion_matrix
from bertforge.windows import half_overlap_starts

logger = logging.getLogger("bertforge")

Piece = tuple[list[int], list[int]]  # (input_ids, token_type_ids) of one model input


# --- labels ---------------------------------------------------------------------------------------------------

def class_labels(examples: Sequence[TextExample]) -> dict[int, str]:
    """id2label from the labels of the training examples, sorted (numerically when they are all integers):
    ["pos", "neg", "pos"] -> {0: "neg", 1: "pos"}; ["10", "2"] -> {0: "2", 1: "10"}."""
    names = {example.label for example in examples}
    if len(names) < 2:
        raise InputError(f"classification needs at least two labels in the training data, found {sorted(names)}")
    fractions = sorted(name for name in names if _is_fraction(name))
    if fractions and all(_is_fraction(name) or name.lstrip("-").replace(".", "", 1).isdigit() for name in names):
        # scores (STS-B's 0-5), which run_glue regresses on: as classes, each value its own label
        raise InputError(f"the labels are numbers with fractions ({', '.join(fractions[:3])}, ...): scores to "
                         "regress on? fine-tune with --task regression (or name the classes otherwise)")
    return sorted_labels(names)


def _is_fraction(name: str) -> bool:
    """Whether a label reads as a number that is not whole: "2.615", "-0.5" (not "1", "1.0", "nan" or "1e3")."""
    whole, dot, fraction = name.lstrip("-").partition(".")
    return bool(dot) and whole.isdigit() and fraction.isdigit() and fraction.strip("0") != ""


def sorted_labels(names: set[str]) -> dict[int, str]:
    """id2label of label names, sorted numerically when they are all integers, else as text."""
    is_integer = all(name.lstrip("-").isdigit() for name in names)
    return dict(enumerate(sorted(names, key=int if is_integer else str)))


def regression_labels(examples: Sequence[TextExample]) -> dict[int, str]:
    """One output, the score; named as transformers names it."""
    return default_labels(1)


# --- long texts -----------------------------------------------------------------------------------------------

def truncate(tokenizer, example: TextExample, max_length: int) -> list[Piece]:
    """One input: the tokenizer's longest-first truncation (the longer text of a pair is cut first)."""
    encoded = tokenizer(example.text, example.text_pair, max_length=max_length, truncation="longest_first")
    return [(encoded["input_ids"], encoded["token_type_ids"])]


def windows(tokenizer, example: TextExample, max_length: int) -> list[Piece]:
    """Overlapping windows over the text, each [CLS] piece [SEP], advancing by half a window, so every token is
    seen with context on both sides in some window; the logits of the windows are averaged.

    A pair windows its longer text and keeps the other one whole beside every window (cut to half the budget if
    it is longer), as question answering keeps the question beside each window of the context:
    [CLS] window [SEP] second text [SEP], segment ids 0 then 1 as usual.
    """
    texts = [tokenizer(text, truncation=False)["input_ids"][1:-1]  # without [CLS] and [SEP]
             for text in (example.text, example.text_pair) if text is not None]
    budget = max_length - len(texts) - 1  # one [CLS], one [SEP] per text
    windowed = max(range(len(texts)), key=lambda i: len(texts[i]))
    texts = [ids if i == windowed else ids[:budget // 2] for i, ids in enumerate(texts)]
    size = budget - sum(len(ids) for i, ids in enumerate(texts) if i != windowed)
    if size < 2:
        raise ConfigError(f"max_length={max_length} is too small for windows")
    pieces = []
    for start in half_overlap_starts(len(texts[windowed]), size):
        input_ids, segments = [tokenizer.cls_token_id], [0]
        for segment, ids in enumerate(texts):
            part = ids[start:start + size] if segment == windowed else ids
            input_ids += [*part, tokenizer.sep_token_id]
            segments += [segment] * (len(part) + 1)
        pieces.append((input_ids, segments))
    return pieces


# What happens to an example longer than max_length: name -> (tokenizer, example, max_length) -> inputs.
LONG_TEXT: dict[str, Callable[[Any, TextExample, int], list[Piece]]] = {"truncate": truncate, "windows": windows}


# What turns a sequence classifier's logits into the scores it answers with, by transformers' `function_to_apply`
# names (its text-classification pipeline, text-embeddings-inference's /predict, vLLM's /classify).
SCORE_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "softmax": lambda logits: logits.softmax(-1),
    "sigmoid": torch.sigmoid,
    "none": lambda logits: logits,
}


# Each sequence-classification task's own function: the one its decode applies, and so bertforge's pipelines' (one
# answer for every entry point: a one-output model's score as predict gives it, where transformers' pipeline applies
# a sigmoid unless config.json says regression; function_to_apply="sigmoid" gives that).
TASK_SCORES = {"classification": "softmax", "multi_label": "sigmoid", "regression": "none", "rerank": "sigmoid"}


def score_function(config: Any) -> str:
    """The SCORE_FUNCTIONS name the server's /predict (text-embeddings-inference's "inputs") and /classify
    (vLLM's) apply to a sequence classifier (its BertConfig) unless a request asks for another: a sigmoid per label
    for a multi-label model, and for a single output (a cross-encoder's relevance) unless config.json says
    regression, as transformers' pipeline reads config.json (text-embeddings-inference applies it to any single
    output; a regression model fine-tuned here keeps its score); else a softmax."""
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def ranked_scores(scores: torch.Tensor, id2label: dict[int, str], top_k: int | None) -> list[dict[str, Any]]:
    """One input's (labels,) scores as the pipelines and text-embeddings-inference answer them: {score, label},
    highest first, the first `top_k`."""
    order = scores.argsort(descending=True, stable=True).tolist()[:top_k]
    return [{"score": float(scores[i]), "label": id2label[i]} for i in order]


@dataclass
class ClassificationSettings(EncodeSettings):
    """Classification's and regression's inputs: the token budget and what a longer text becomes."""

    long_text: str = "truncate"  # a key of LONG_TEXT

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.long_text, LONG_TEXT, "long_text")


def class_target(label: str | float, label2id: dict[str, int] | None) -> int | float:
    """A row's training target: the label's id, or the score itself for regression (no label2id). A file's labels
    were checked as it was read, naming the line; examples made in memory are checked here."""
    if label2id is None:
        try:
            return float(label)
        except (TypeError, ValueError):
            raise InputError(f"a regression target must be a number, got {label!r}") from None
    if label not in label2id:
        raise InputError(f"label {label!r} is not one of the model's labels ({', '.join(label2id)})")
    return label2id[label]


def encode(tokenizer, examples: Sequence[TextExample], settings: ClassificationSettings, id2label: dict[int, str],
           targets: Callable[[Any, dict[str, int] | None], Any] = class_target) -> Features:
    """Examples -> one row per model input ({input_ids, token_type_ids[, labels]}), each label made a target by
    `targets` (class ids, regression scores; multi_label.multi_hot for label sets). Unlabelled examples give rows
    without labels."""
    texts = [example.text for example in examples]
    pairs = [example.text_pair for example in examples]
    if all(pair is None for pair in pairs):
        pairs = None
    elif any(pair is None for pair in pairs):
        raise InputError("some examples have a second text and some don't; a task takes single texts or pairs")
    encoded = tokenizer(texts, pairs, truncation=False)  # full lengths first, so truncation can be counted
    label2id = label2id_for(id2label)
    rows, example_index, too_long = [], [], 0
    for index, (example, ids, segments) in enumerate(zip(examples, encoded["input_ids"],
                                                         encoded["token_type_ids"])):
        pieces = [(ids, segments)]
        if len(ids) > settings.max_length:
            too_long += 1
            pieces = LONG_TEXT[settings.long_text](tokenizer, example, settings.max_length)
        for piece_ids, piece_segments in pieces:
            row = {"input_ids": piece_ids, "token_type_ids": piece_segments}
            if example.label is not None:
                row["labels"] = targets(example.label, label2id)
            rows.append(row)
            example_index.append(index)
    notes = []
    if too_long:
        action = "truncated to" if settings.long_text == "truncate" else "split into windows of"
        notes.append(f"{too_long} of {len(examples)} examples were {action} max_length={settings.max_length}")
        logger.warning(notes[-1])
    return Features(rows, example_index, truncated=too_long, notes=notes, settings=settings)


# --- predictions ----------------------------------------------------------------------------------------------

def outputs(output) -> tuple[torch.Tensor, ...]:
    """(batch, 1, labels) logits: the [CLS] prediction, as a sequence of one position (rows are cut per token)."""
    return (output.logits[:, None],)


def example_logits(features: Features, outputs: Sequence[tuple[torch.Tensor, ...]], num_examples: int
                   ) -> torch.Tensor:
    """(examples, labels) logits in float32; an example split into windows gets the mean of its windows'."""
    logits = torch.stack([row[0][0] for row in outputs]).float()  # (rows, labels)
    index = torch.tensor(features.example_index, dtype=torch.long)
    sums = torch.zeros(num_examples, logits.shape[-1]).index_add_(0, index, logits)
    counts = torch.zeros(num_examples).index_add_(0, index, torch.ones(len(features)))
    return sums / counts.clamp(min=1)[:, None]


def decode(features: Features, examples: Sequence[TextExample], outputs: Sequence[tuple[torch.Tensor, ...]],
           config) -> list[dict[str, Any]]:
    """One answer per example: {"label", "probabilities": {label: p}} or, for regression, {"score"}."""
    logits = example_logits(features, outputs, len(examples))
    if config.num_labels == 1:
        return [{"score": score} for score in logits[:, 0].tolist()]
    id2label = config.id2label
    answers = []
    for probs in logits.softmax(-1).tolist():
        best = max(range(len(probs)), key=probs.__getitem__)
        answers.append({"label": id2label[best],
                        "probabilities": {id2label[i]: p for i, p in enumerate(probs)}})
    return answers


def score(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
          id2label: dict[int, str]) -> dict[str, float]:
    """Accuracy, F1 (of label id 1 with two labels, macro otherwise) and MCC; Pearson and Spearman for scores."""
    if len(id2label) == 1:
        return compute_metrics("regression", [p["score"] for p in predictions], [e.label for e in examples])
    label2id = {label: i for i, label in id2label.items()}
    predicted = [label2id[p["label"]] for p in predictions]
    true = [label2id[e.label] for e in examples]
    return compute_metrics("classification", predicted, true, metric_names(id2label))


def per_label(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
              id2label: dict[int, str]) -> dict[str, LabelScores]:
    """Each class's precision, recall, F1 and support, every class of the model listed."""
    names, predicted, true = class_places(predictions, examples, id2label)
    return class_scores(predicted, true, names)


def confusion(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
              id2label: dict[int, str]) -> dict[str, list]:
    """Which class each class's examples were given: {"labels": the model's classes, "matrix": a row per true class,
    a column per predicted one}, as scikit-learn's confusion_matrix counts them."""
    names, predicted, true = class_places(predictions, examples, id2label)
    return {"labels": names, "matrix": confusion_matrix(predicted, true, len(names))}


def class_places(predictions: Sequence[dict[str, Any]], examples: Sequence[TextExample],
                 id2label: dict[int, str]) -> tuple[list[str], list[int], list[int]]:
    """The model's classes in its order, and each example's predicted and true class as a place among them."""
    names = list(id2label.values())
    place = {name: i for i, name in enumerate(names)}
    return names, [place[p["label"]] for p in predictions], [place[e.label] for e in examples]


def metric_names(id2label: dict[int, str]) -> list[str]:
    """What `score` gives a model with these labels: F1 of the second label with two, macro F1 with more."""
    if len(id2label) == 1:
        return ["pearson", "spearman"]
    return ["accuracy", "f1" if len(id2label) == 2 else "macro_f1", "matthews_correlation"]


def label2id_for(id2label: dict[int, str]) -> dict[str, int] | None:
    """The encoder's label map: None for regression, whose targets are numbers."""
    return None if len(id2label) == 1 else {label: i for i, label in id2label.items()}

