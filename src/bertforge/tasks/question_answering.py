"""Extractive question answering (SQuAD v1.1 / v2.0): examples -> windowed features, span logits -> answers.

A long context is cut into overlapping windows of tokens, each encoded as [CLS] question [SEP] window [SEP]
(the BERT paper's "doc stride" recipe); answers are read back from the original context by character offsets.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.data_files import decode_text, read_bytes
from bertforge.errors import ConfigError, InputError, no_such_file
from bertforge.tasks.data import EncodeSettings, Features, listed
from bertforge.tasks.metrics import compute_metrics
from bertforge.tasks.tables import ROW_FORMATS, find_column, read_table, task_format, text_cell
from bertforge.validation import check_number
from bertforge.windows import window_starts

logger = logging.getLogger("bertforge")

Span = tuple[int, int]  # (start, end) character offsets, end exclusive


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]]  # (text, start character in context); empty when impossible or unknown
    is_impossible: bool = False


@dataclass
class SpanFeatures:
    """One window: [CLS] question [SEP] context window [SEP], with the answer's token positions."""

    input_ids: list[int]
    token_type_ids: list[int]
    example: int  # index of the example in the list that was encoded
    offsets: list[Span | None]  # character span in the context of each token; None outside the context
    start_position: int = 0  # answer's first and last token; 0 ([CLS]) when it isn't wholly in this window
    end_position: int = 0


@dataclass
class Answer:
    text: str
    start: int  # character span in the context ("" and 0, 0 for the null answer)
    end: int
    score: float  # start logit + end logit


# --- reading ------------------------------------------------------------------------------------------------

def read_squad(path: str | Path, version_2: bool = False, labelled: bool = True) -> list[QAExample]:
    """The questions of a SQuAD JSON file, in file order; `version_2` allows unanswerable questions.

    Every answer is checked against its context: context[answer_start:answer_start + len(text)] == text.
    `labelled=False` (to predict) reads the questions and contexts alone: answers may be absent.
    """
    path = Path(path)
    try:
        squad = json.loads(decode_text(read_bytes(path), path))  # as the other readers, a byte-order mark is dropped
    except FileNotFoundError:
        raise no_such_file(path) from None
    except json.JSONDecodeError as error:
        raise InputError(f"not valid JSON ({error})", path, error.lineno) from None
    except RecursionError:  # json.loads recurses per level of nesting
        raise InputError("a JSON value nested too deeply to read", path) from None
    except OSError as error:
        raise InputError(f"can't read the file ({error})", path) from None

    examples = []
    for a, article in enumerate(_field(squad, "data", list, path, "the file")):
        title = article.get("title", a) if isinstance(article, dict) else a
        for p, paragraph in enumerate(_field(article, "paragraphs", list, path, f"article {title!r}")):
            where = f"article {title!r}, paragraph {p}"
            context = _field(paragraph, "context", str, path, where)
            for question in _field(paragraph, "qas", list, path, where):
                qid = _field(question, "id", str, path, where)
                asked = f"question {qid} ({where})"
                examples.append(_example(question, qid, context, version_2, path, asked) if labelled else
                                QAExample(qid, _field(question, "question", str, path, asked), context, []))
    warn_of_shared_ids(examples, path)
    return examples


def warn_of_shared_ids(examples: Sequence[QAExample], path: Path) -> None:
    """Questions that share an id are read and answered each on its own, but the official SQuAD script (and any
    tool that keys predictions by id) would mix up their answers: worth a warning, not a refusal."""
    seen, repeated = set(), []
    for example in examples:
        if example.id in seen:
            repeated.append(example.id)
        seen.add(example.id)
    if repeated:
        logger.warning("%s: %d question(s) share an id with an earlier one (first: %r); each is answered, but the "
                       "official SQuAD script keys answers by id", path, len(repeated), repeated[0])


def _field(record, name: str, kind: type, path: Path, where: str):
    """record[name], which must be a `kind`; the error names what's missing and where."""
    if not isinstance(record, dict) or name not in record:
        raise InputError(f"{where} has no {name!r}", path, field=name)
    if not isinstance(record[name], kind) or isinstance(record[name], bool) and kind is not bool:
        raise InputError(f"{where}: expected {kind.__name__}, got {type(record[name]).__name__}", path, field=name)
    return record[name]


def _example(question: dict, qid: str, context: str, version_2: bool, path: Path | str, where: str) -> QAExample:
    is_impossible = question.get("is_impossible", False) if isinstance(question, dict) else False
    if not isinstance(is_impossible, bool):  # "false", a string, would read as true
        raise InputError(f"{where}: is_impossible must be true or false, got {is_impossible!r:.40}", path,
                         field="is_impossible")
    if is_impossible and not version_2:
        raise InputError(f"{where} is unanswerable: SQuAD v2.0 data, which a model fine-tuned with --version-2 "
                         f"(version_2=True) reads, and evaluate --version-2 scores any model on", path,
                         field="is_impossible")
    answers = []
    for i, answer in enumerate(_field(question, "answers", list, path, where)):
        text = _field(answer, "text", str, path, f"{where}, answer {i}")
        start = _field(answer, "answer_start", int, path, f"{where}, answer {i}")
        if len(text) > len(context):
            raise InputError(f"{where}, answer {i}: the answer's {len(text)} characters are more than the context's "
                             f"{len(context)}", path, field="text")
        if not 0 <= start <= len(context) - len(text):
            raise InputError(f"{where}, answer {i}: answer_start {start} is outside the context (0 to "
                             f"{len(context) - len(text)} for an answer of {len(text)} characters)", path,
                             field="answer_start")
        if context[start:start + len(text)] != text:
            raise InputError(f"{where}, answer {i}: answer_start {start} points at "
                             f"{context[start:start + len(text)]!r}, not {text!r}", path, field="answer_start")
        answers.append((text, start))
    if not answers and not is_impossible:
        raise InputError(f"{where} has no answers" + ("" if version_2 else " (unanswerable questions are SQuAD "
                         "v2.0's, which a model fine-tuned with --version-2 reads)"), path, field="answers")
    if answers and is_impossible:
        raise InputError(f"{where} is marked unanswerable but has answers", path, field="answers")
    _field(question, "question", str, path, where)
    return QAExample(qid, question["question"], context, answers, is_impossible)


# --- features -----------------------------------------------------------------------------------------------

def _tokens(tokenizer, text: str) -> tuple[list[int], list[Span]]:
    """Ids and character offsets of a text's tokens, without [CLS] and [SEP]."""
    encoded = tokenizer(text, truncation=False, return_offsets_mapping=True)
    return encoded["input_ids"][1:-1], [tuple(span) for span in encoded["offset_mapping"][1:-1]]


def _answer_tokens(offsets: Sequence[Span], start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last context token of a character span, or None if no token overlaps it."""
    inside = [i for i, (start, end) in enumerate(offsets) if start < end_char and end > start_char]
    return (inside[0], inside[-1]) if inside else None


def span_features(examples: Sequence[QAExample], tokenizer, max_length: int = 384, stride: int = 128,
                  max_query_length: int = 64) -> list[SpanFeatures]:
    """Windows of every example (in order), labelled with its first answer's token positions.

    `stride` is the overlap in tokens between consecutive windows (transformers' `stride`, which its
    run_qa.py calls doc_stride): windows advance by (max_length - 3 - question tokens) - stride. Questions
    longer than `max_query_length` tokens are cut first. A window that doesn't hold the whole answer, and every
    window of an unanswerable question, is labelled 0/0, the [CLS] token.
    """
    if max_length - 3 - max_query_length <= stride:
        raise ConfigError(f"max_length={max_length} with max_query_length={max_query_length} leaves windows "
                          f"no longer than stride={stride}; lower the stride (--doc-stride when fine-tuning) or "
                          f"raise max_length (--max-length)")
    if stride < 0:
        raise ConfigError(f"stride must be at least 0 tokens, got {stride}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for index, example in enumerate(examples):
        question_ids = _tokens(tokenizer, example.question)[0][:max_query_length]
        context_ids, context_offsets = _tokens(tokenizer, example.context)
        answer = None
        if example.answers:
            text, start_char = example.answers[0]
            answer = _answer_tokens(context_offsets, start_char, start_char + len(text))

        budget = max_length - 3 - len(question_ids)
        head = [cls, *question_ids, sep]
        for first in window_starts(len(context_ids), budget, stride):
            stop = min(first + budget, len(context_ids))
            feature = SpanFeatures(
                input_ids=head + context_ids[first:stop] + [sep],
                token_type_ids=[0] * len(head) + [1] * (stop - first + 1),
                example=index,
                offsets=[None] * len(head) + context_offsets[first:stop] + [None],
            )
            if answer is not None and first <= answer[0] and answer[1] < stop:
                feature.start_position = len(head) + answer[0] - first
                feature.end_position = len(head) + answer[1] - first
            features.append(feature)
    return features


# --- decoding -----------------------------------------------------------------------------------------------

def _top(scores: Sequence[float], positions: Sequence[int], n: int) -> list[int]:
    return sorted(positions, key=scores.__getitem__, reverse=True)[:n]


def predict_answers(examples: Sequence[QAExample], features: Sequence[SpanFeatures],
                    start_logits: Sequence, end_logits: Sequence, n_best: int = 20, max_answer_length: int = 30,
                    null_threshold: float | None = None) -> list[list[Answer]]:
    """The n best answers of every example, best first, from each feature's start and end logits.

    Candidates pair one of a window's n_best context tokens by start logit with one of its n_best context
    tokens by end logit (the BERT scripts rank all tokens, then drop those outside the context), with
    start <= end and at most max_answer_length tokens; score = start logit + end logit, ranked over all
    windows of the example, each character span once. SQuAD v2 (`null_threshold` set): the empty answer,
    scored by the lowest [CLS] start + end over the windows (as in the BERT scripts), is put first when it
    beats the best span by more than the threshold, and left out otherwise.
    """
    candidates: list[list[Answer]] = [[] for _ in examples]
    null_scores: list[float] = [float("inf")] * len(examples)
    for feature, starts, ends in zip(features, start_logits, end_logits, strict=True):
        starts, ends = _as_list(starts), _as_list(ends)
        context = examples[feature.example].context
        # Positions past the offsets are batch padding.
        in_context = [i for i, span in enumerate(feature.offsets) if span is not None]
        null_scores[feature.example] = min(null_scores[feature.example], starts[0] + ends[0])
        for start in _top(starts, in_context, n_best):
            for end in _top(ends, in_context, n_best):
                if end < start or end - start + 1 > max_answer_length:
                    continue
                span = (feature.offsets[start][0], feature.offsets[end][1])
                candidates[feature.example].append(Answer(context[span[0]:span[1]], *span, starts[start] + ends[end]))

    ranked = []
    for answers, null_score in zip(candidates, null_scores):
        answers = _unique(sorted(answers, key=lambda answer: answer.score, reverse=True))[:n_best]
        if null_threshold is not None and null_score != float("inf"):
            if not answers or null_score > answers[0].score + null_threshold:
                answers = [Answer("", 0, 0, null_score), *answers][:n_best]
        ranked.append(answers or [Answer("", 0, 0, float("-inf"))])
    return ranked


def _as_list(logits) -> list[float]:
    return logits.float().tolist() if isinstance(logits, torch.Tensor) else list(logits)


def _unique(answers: list[Answer]) -> list[Answer]:
    """The first (best) answer of every character span: overlapping windows propose the same span twice."""
    seen: set[Span] = set()
    kept = []
    for answer in answers:
        if (answer.start, answer.end) not in seen:
            seen.add((answer.start, answer.end))
            kept.append(answer)
    return kept


def best_answers(ranked: Sequence[Sequence[Answer]]) -> list[str]:
    """The top answer text of each example, the predictions that exact_match and squad_f1 score."""
    return [answers[0].text for answers in ranked]


def gold_answers(examples: Sequence[QAExample]) -> list[list[str]]:
    """Each example's gold answer texts, the references of the SQuAD metrics; [""] if unanswerable."""
    return [[text for text, _ in example.answers] or [""] for example in examples]


# --- the "qa" task (registry row): files -> examples -> Features -> answers -> metrics -------------------------

@dataclass
class QASettings(EncodeSettings):
    """Question answering's windows over long contexts, and how answers are read from the span logits."""

    max_length: int = 384
    doc_stride: int = 128  # tokens shared by consecutive windows of a long context
    max_query_length: int = 64  # question tokens kept
    version_2: bool = False  # SQuAD v2: questions may have no answer
    n_best: int = 20  # answers kept per question
    max_answer_length: int = 30  # tokens
    null_score_threshold: float = 0.0  # SQuAD v2: margin by which "no answer" must beat the best span

    def __post_init__(self):
        super().__post_init__()
        check_number("doc_stride", self.doc_stride, minimum=0, integer=True)
        for name in ("max_query_length", "n_best", "max_answer_length"):
            check_number(name, getattr(self, name), minimum=1, integer=True)
        check_number("null_score_threshold", self.null_score_threshold)


def example_from_text(question: str, context: str | None = None) -> QAExample:
    if context is None:
        raise InputError("question answering needs a question and a context")
    return QAExample("0", question, context, [])


def read_examples(path: str | Path | Any, columns=None, id2label=None, labelled: bool = True,
                  settings=None, format: str | None = None) -> list[QAExample]:
    """Questions of a SQuAD JSON file, or of rows of question, context and answers (JSON lines, Parquet, a datasets
    folder or such rows in memory, as the Hub's squad has them: see read_question_rows); to predict, rows of
    question and context alone. In rows, `columns` may name other columns for them: text (the question),
    text_pair (the context) and label (the answers)."""
    version_2 = bool(settings and settings.version_2)
    kind = task_format(path, format, labelled, "question answering", ("squad", "SQuAD JSON"),
                       ("jsonl", "JSONL of question and context"), rows="questions, contexts and answers")
    if kind is None or kind in ROW_FORMATS:
        return read_question_rows(path, labelled, version_2, kind, columns)
    examples = read_squad(path, version_2=version_2, labelled=labelled)
    if not examples:
        raise InputError("no questions", path)
    return examples


def read_question_rows(data: Any, labelled: bool = True, version_2: bool = False,
                       format: str | None = None, columns=None) -> list[QAExample]:
    """Questions from rows of "question", "context" and, labelled, "answers": {"text": [...], "answer_start": [...]}
    (the Hub's squad and squad_v2, transformers' run_qa) or SQuAD's list of {"text", "answer_start"}; no answers
    is an unanswerable question (SQuAD v2). An "id" column names each question (default: its row). `columns`
    (data.Columns) may name others: text for the question, text_pair for the context, label for the answers, as
    run_qa's question, context and answer column names do."""
    table = read_table(data, format)
    question_column = find_column(table, columns and columns.text, ("question",), "the questions")
    context_column = find_column(table, columns and columns.text_pair, ("context",), "the passages")
    answers_column = find_column(table, columns and columns.label, ("answers",), "the answers") if labelled else None
    examples = []
    for line, row in table.rows:
        qid = str(row.get("id") if row.get("id") is not None else line)
        question = text_cell(table, line, row, question_column)
        context = text_cell(table, line, row, context_column)
        if not labelled:
            examples.append(QAExample(qid, question, context, []))
            continue
        answers = listed(row.get(answers_column))
        if isinstance(answers, dict):  # the Hub's columns of answers: {"text": [...], "answer_start": [...]}
            texts, starts = listed(answers.get("text")), listed(answers.get("answer_start"))
            if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
                raise table.error("expected answers as {\"text\": [...], \"answer_start\": [...]}, lists of one "
                                  "length", line, field=answers_column)
            answers = [{"text": text, "answer_start": start} for text, start in zip(texts, starts)]
        if not isinstance(answers, list):
            raise table.error("expected answers as {\"text\": [...], \"answer_start\": [...]} or a list of "
                              "{\"text\", \"answer_start\"}", line, field=answers_column)
        where = f"question {qid} ({table.unit} {line})"
        record = {"question": question, "answers": answers, "is_impossible": version_2 and not answers}
        examples.append(_example(record, qid, context, version_2, table.path, where))
    if not examples:
        raise table.error("no questions")
    return examples


def no_labels(examples: Sequence[QAExample]) -> dict[int, str]:
    """A span model has no label names: its two outputs are the start and end scores."""
    return {}


def encode(tokenizer, examples: Sequence[QAExample], settings: QASettings, id2label=None) -> Features:
    """One row per window ({input_ids, token_type_ids[, start_positions, end_positions]}), SpanFeatures as extras."""
    windows = span_features(examples, tokenizer, settings.max_length, settings.doc_stride, settings.max_query_length)
    rows = []
    for window in windows:
        row = {"input_ids": window.input_ids, "token_type_ids": window.token_type_ids}
        example = examples[window.example]
        if example.answers or example.is_impossible:
            row |= {"start_positions": window.start_position, "end_positions": window.end_position}
        rows.append(row)
    index = [window.example for window in windows]
    split = len(set(i for i, following in zip(index, index[1:]) if i == following))
    notes = [f"{split} of {len(examples)} contexts were split into windows of max_length={settings.max_length}"
             ] if split else []
    return Features(rows, index, truncated=split, notes=notes, extras=windows, settings=settings)


def outputs(output) -> tuple[torch.Tensor, ...]:
    """(batch, seq) start and end logits."""
    return (output.start_logits, output.end_logits)


def decode(features: Features, examples: Sequence[QAExample], outputs: Sequence[tuple[torch.Tensor, ...]],
           config=None) -> list[dict]:
    """One answer per question from each window's start and end logits, over all windows of its context:
    {"answer", "start", "end", "score", "n_best": [{text, start, end, score}]}."""
    settings = features.settings or QASettings()
    null_threshold = settings.null_score_threshold if settings.version_2 else None
    ranked = predict_answers(examples, features.extras, [row[0] for row in outputs], [row[1] for row in outputs],
                             settings.n_best, settings.max_answer_length, null_threshold)
    results = []
    for answers in ranked:
        n_best = [{"text": a.text, "start": a.start, "end": a.end,
                   "score": a.score if math.isfinite(a.score) else None} for a in answers]  # JSON has no -inf
        results.append({"answer": n_best[0]["text"], "start": n_best[0]["start"], "end": n_best[0]["end"],
                        "score": n_best[0]["score"], "n_best": n_best})
    return results


def score(answers: Sequence[dict], examples: Sequence[QAExample], id2label=None) -> dict[str, float]:
    """SQuAD exact match and F1 of the best answers against every gold answer. When some questions are
    unanswerable, or the model abstains (an empty answer, which only a v2.0 model gives), SQuAD v2.0's rules and its
    official script's breakdown: the same scores over the questions that have an answer (has_answer_exact_match,
    has_answer_f1) and over those that have none (no_answer_*: the share of abstentions), each only when the data
    has such questions."""
    predictions, references = [a["answer"] for a in answers], gold_answers(examples)
    if not any(example.is_impossible for example in examples) and all(predictions):
        return compute_metrics("question_answering", predictions, references)
    scores = compute_metrics("question_answering_v2", predictions, references)
    for part, unanswerable in (("has_answer", False), ("no_answer", True)):
        chosen = [i for i, example in enumerate(examples) if example.is_impossible == unanswerable]
        if chosen:
            scores |= {f"{part}_{name}": value for name, value in compute_metrics(
                "question_answering_v2", [predictions[i] for i in chosen], [references[i] for i in chosen]).items()}
    return scores


def inputs(example: QAExample) -> dict:
    return {"id": example.id, "question": example.question, "context": example.context}
