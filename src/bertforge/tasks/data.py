"""Task data: a file's or a table's rows (tasks/tables.py) -> examples (errors name the file, line or row, and
column), features -> batches (made by bertforge.batching) and the model's outputs on them."""

from __future__ import annotations

import ast
import io
import json
import math
import numbers
import os
import tokenize
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.batching import MODEL_INPUTS, LengthGroupedBatches, collate, length_sorted_batches
from bertforge.errors import ConfigError, InputError
from bertforge.heads import IGNORE_INDEX
from bertforge.json_config import JsonConfig
from bertforge.tasks.tables import (
    PLAIN_TEXT_COLUMN,
    cell,
    data_format,
    read_table,
    require_columns,
    stored_label_names,
    text_cell,
)
from bertforge.training.distributed import Shard
from bertforge.validation import check_number


@dataclass
class Columns:
    """Which columns of a data file hold the text, the optional second text, and the label; and, for multi-label
    data, what separates the labels in a text cell ("sports|politics"); a JSON list is read without one."""

    text: str = "sentence"
    text_pair: str | None = None
    label: str = "label"
    label_separator: str | None = None

    def __post_init__(self):
        check_label_separator(self.label_separator)


def check_label_separator(separator: str | None) -> None:
    """A label separator is visible text (or None: none given); blank, it would split every label apart."""
    if separator is not None and not separator.strip():
        raise ConfigError("label_separator must be a visible character or text, e.g. \"|\" or \";\"")


# The shortest input that holds any text: [CLS], one token, [SEP].
MIN_LENGTH = 3


@dataclass
class EncodeSettings(JsonConfig):
    """How examples become model inputs: the token budget every task has. Each task's settings extend it with its
    own options (classification.ClassificationSettings, ...); a fine-tuning run holds its task's, validated here."""

    max_length: int = 128  # tokens per input

    def __post_init__(self):
        check_number("max_length", self.max_length, minimum=1, integer=True)
        if self.max_length < MIN_LENGTH:  # a model that reads no text would still train and predict
            raise ConfigError(f"max_length={self.max_length} leaves no room for text between [CLS] and [SEP]")


@dataclass
class TextExample:
    text: str
    text_pair: str | None = None
    # A class name, a regression target, the labels of a multi-label example (none: an empty tuple), or None when
    # unlabelled.
    label: str | float | tuple[str, ...] | None = None
    line: int = 0  # where the example came from, for messages
    # The names the data's ClassLabel feature gives its label numbers, in their order (a datasets folder's, a
    # Parquet file's): a model trained on it numbers its labels so. None: the data names no label numbers.
    label_names: tuple[str, ...] | None = field(default=None, compare=False, repr=False)


def class_label(value: Any, separator: str | None = None) -> str:
    """A class label as the string id2label holds: 1 and 1.0 (JSON numbers) and "1" (a CSV cell) are the same label
    (true is "True", as pandas writes it in a CSV file)."""
    if isinstance(value, (list, dict)):
        several = " (several labels per example: --task multi_label)" if isinstance(value, list) else ""
        raise ValueError(f"expected one label, got {json.dumps(value)[:40]}{several}")
    if isinstance(value, float) and math.isnan(value):  # JSON's NaN, as Python's json writes a missing value
        raise ValueError("the label is NaN (a missing label?)")
    if isinstance(value, float) and value.is_integer():  # 1.0 (pandas' float column, as JSON) is the label 1
        value = int(value)
    label = str(value).strip()
    if not label:
        raise ValueError("empty label")
    if label == "-":  # SNLI's and MultiNLI's gold_label where the annotators did not agree
        raise ValueError("label '-' marks a pair without a gold label (SNLI, MultiNLI): leave those rows out")
    return label


def as_known(label: Any, known: set[str]) -> Any:
    """A class label as a model's labels spell it: "1" is "1.0" for a model whose labels were read as 1.0 (a JSON
    number with no fraction, before such numbers read as integers), and "LABEL_1" for one of transformers' default
    names (a Trainer's checkpoint of unnamed labels)."""
    if isinstance(label, str) and label not in known and label.lstrip("-").isdigit():
        if f"{label}.0" in known:
            return f"{label}.0"
        if f"LABEL_{label}" in known and all(name.startswith("LABEL_") for name in known):
            return f"LABEL_{label}"  # transformers' names when none were given: LABEL_k is class k
    return label


def score_label(value: Any, separator: str | None = None) -> float:
    """A regression target: a finite number, from a JSON number or a text cell."""
    if isinstance(value, (list, dict)):
        raise ValueError(f"regression target {json.dumps(value)[:40]} is not a number")
    if str(value).strip() == "":
        raise ValueError("empty label")
    try:
        score = float(value)
    except ValueError:
        raise ValueError(f"regression target {value!r} is not a number") from None
    if not math.isfinite(score) or isinstance(value, bool):
        raise ValueError(f"regression target {value!r} is not a number")
    return score


def label_set(value: Any, separator: str | None = None) -> tuple[str, ...]:
    """The labels of a multi-label example, each once, in the order given: a JSON list (a JSONL value, or a cell
    holding one), a list, tuple or set as Python or numpy writes one in a CSV cell, or a text cell split at
    `separator`; without a separator a text cell is one label.

    ["sports", "politics"] and '["sports", "politics"]' and "['sports' 'politics']" and "sports|politics" (separator
    "|") -> ("sports", "politics"); [] -> () (no label applies). Numbers that repeat ([0, 1, 0, 1]) are a multi-hot
    row, not labels: refused.
    """
    value = listed(value)  # a DataFrame's cell: a numpy array
    if isinstance(value, tuple | set | frozenset):
        value = list(value) if isinstance(value, tuple) else sorted(value, key=str)
    if isinstance(value, str):
        written = _written_collection(value)
        value = value if written is None else written
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty label; write [] for an example with no labels")
        value = value.split(separator) if separator else [value]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of labels, got {json.dumps(value, default=str)[:40]}")
    check_not_multi_hot(value)
    labels = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, str | numbers.Integral):
            raise ValueError(f"expected each label to be a text, got {json.dumps(item, default=str)[:40]}")
        label = str(item).strip()
        if not label:
            raise ValueError("an empty label in the list")
        labels.append(label)
    return tuple(dict.fromkeys(labels))


def _written_collection(text: str) -> list | None:
    """The items a text cell writes as a list, tuple or set (JSON's list, or Python's or numpy's written form); None
    where it writes no collection: a label, or labels at the separator ("(c) Reuters" only starts with a bracket)."""
    stripped = text.strip()
    if stripped in ("()", "set()"):  # Python's empty tuple and set (pandas' to_csv too)
        return []
    if stripped.startswith("["):
        try:
            return json.loads(text)  # (its error's column counts in the cell as written)
        except json.JSONDecodeError as error:
            written = _python_list(stripped)  # a list as pandas writes one in a CSV cell: ['grain', 'trade']
            if written is None:
                raise ValueError(f"not a JSON list of labels: {error.msg} (column {error.colno})") from None
            return written
    if stripped[:1] in ("(", "{"):  # a tuple or set of texts as Python writes one: ('LOC', 'PER')
        written = _python_list(stripped)
        return written if written and all(isinstance(item, str) for item in written) else None
    return None


def check_not_multi_hot(value: Any) -> None:
    """Label numbers that repeat are a row of 0s and 1s, one per label (multi-hot), which names no label."""
    if not isinstance(value, list):
        return
    numbers_given = [item for item in value if isinstance(item, numbers.Integral) and not isinstance(item, bool)]
    if len(set(numbers_given)) < len(numbers_given):
        raise ValueError(f"the labels {json.dumps(value, default=str)[:40]} repeat a number: a row of 0s and 1s "
                         "(multi-hot) names no label; write the names of the labels that apply")


def _python_list(text: str) -> list | None:
    """A list of texts and whole numbers written as Python writes one (pandas' to_csv of a list: ['grain', 'trade'],
    of a tuple or set too), or as numpy writes an array (['grain' 'trade']: literal_eval would join the two texts),
    read item by item; else None."""
    try:
        tokens = [token for token in tokenize.generate_tokens(io.StringIO(text).readline)
                  if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER)]
    except (tokenize.TokenError, SyntaxError):
        return None
    brackets = {"[": "]", "(": ")", "{": "}"}
    if len(tokens) < 2 or brackets.get(tokens[0].string) != tokens[-1].string:
        return None
    inner = tokens[1:-1]
    commas = [token.string == "," for token in inner]
    # Python's form: item, item, ... (a trailing comma allowed); numpy's: item item ... (no comma at all)
    if any(commas) and (any(commas[0::2]) or not all(commas[1::2])):
        return None
    items = []
    for token in inner:
        if token.type == tokenize.STRING or token.type == tokenize.NUMBER and token.string.isdigit():
            try:
                items.append(ast.literal_eval(token.string))
            except (ValueError, SyntaxError):
                return None
        elif token.string in ("True", "False", "None"):
            items.append(ast.literal_eval(token.string))  # no label: said so by the item check, naming it
        elif token.string != ",":
            return None
    return items


# Label kind -> parser of one raw label value (and the separator of several labels in a text cell).
LABEL_KINDS: dict[str, Callable[[Any, str | None], str | float | tuple[str, ...]]] = {
    "class": class_label, "score": score_label, "classes": label_set}


def read_text_examples(path: str | Path, columns: Columns, label_kind: str | None,
                       label_names: Sequence[str] | None = None, format: str | None = None) -> list[TextExample]:
    """Text (and pair) examples, labelled when `label_kind` is a LABEL_KINDS key ("class", "score", "classes"),
    unlabelled when None.

    `label_names` (a fine-tuned model's labels) makes any other label an error, so a typo in an evaluation file
    stops before a single batch runs.
    """
    table = read_table(path, format)
    # numbers that the data's ClassLabel feature names (Hugging Face datasets' labels) are read as those names
    names = stored_label_names(path, format).get(columns.label) if label_kind in ("class", "classes") else None
    # (the file is looked at again only when the table is what a plain-text file gives)
    if label_kind is not None and table.columns == [PLAIN_TEXT_COLUMN] and isinstance(path, (str, os.PathLike)) \
            and data_format(path, format) == "txt":
        raise InputError("plain text (one text a line) has no labels: labelled data is a .csv, .tsv or .jsonl file "
                         "(or Parquet) with a label column; a .txt file of tab-separated columns reads with --format "
                         "tsv", path)
    require_columns(table, {"--text-column": columns.text, "--text-pair-column": columns.text_pair,
                            "--label-column": columns.label if label_kind else None})
    known = set(label_names) if label_names is not None else None
    declared = tuple(names) if names else None
    examples = []
    for line, row in table.rows:
        text = text_cell(table, line, row, columns.text)
        pair = text_cell(table, line, row, columns.text_pair) if columns.text_pair else None
        label = None
        if label_kind is not None:
            raw = listed(cell(table, line, row, columns.label))  # a DataFrame cell may be a numpy array
            try:
                if label_kind == "classes":
                    check_not_multi_hot(raw)  # before a ClassLabel names the numbers
                raw = named(raw, names) if names else raw
                label = LABEL_KINDS[label_kind](raw, columns.label_separator)
            except ValueError as error:
                raise table.error(str(error), line, field=columns.label) from None
            if known is not None:
                label = tuple(as_known(name, known) for name in label) if isinstance(label, tuple) else \
                    as_known(label, known)
            unknown = [name for name in (label if isinstance(label, tuple) else [label])
                       if known is not None and name not in known]
            if unknown:
                numbered = any(isinstance(value, int) and not isinstance(value, bool)
                               for value in (raw if isinstance(raw, list) else [raw]))
                raise table.error(f"label {unknown[0]!r} is not one of the model's labels ({', '.join(sorted(known))})"
                                  + ("; a label number is read as a name only where the data's ClassLabel feature "
                                     "names it (a datasets folder or Parquet file)" if numbered else ""),
                                  line, field=columns.label)
        examples.append(TextExample(text, pair, label, line, declared))
    scores = {example.label for example in examples} if label_kind == "score" else set()
    if len(scores) == 1 and len(examples) > 1:  # the Hub's STS-B test split: -1 everywhere
        raise table.error(f"every score is {scores.pop():g}: a split without labels? correlations need scores that "
                          "vary (predict reads the file without them)", field=columns.label)
    return examples


def listed(value: Any) -> Any:
    """A list cell as a list: a DataFrame's cells hold numpy arrays where a file's rows hold lists."""
    return value.tolist() if hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1 else value


def named(value: Any, names: Sequence[str]) -> Any:
    """A label number (or a list of them) as the name a ClassLabel gives it; other values as they are."""
    if isinstance(value, list):
        return [named(item, names) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        if value == -1:  # datasets' ClassLabel for "no label": the Hub's test splits, SNLI's pairs without a gold label
            raise ValueError("label -1 is the data's 'no label' (as in the Hub's test splits): leave those rows out "
                             "(dataset.filter(lambda row: row['label'] != -1)), or give the file to predict")
        if not 0 <= value < len(names):
            raise ValueError(f"label {value} is not one of the data's label numbers (0 to {len(names) - 1})")
        return names[value]
    return value


# --- features and batches -------------------------------------------------------------------------------------

@dataclass
class Features:
    """Model inputs, one dict per row (input_ids, token_type_ids, labels, ...), and the example of each row
    (several rows share an example when a long text is split into windows)."""

    rows: list[dict[str, Any]]
    example_index: list[int]
    truncated: int = 0  # examples cut to max_length
    notes: list[str] = field(default_factory=list)
    extras: list[Any] = field(default_factory=list)  # per row, what decoding needs (word positions, offsets)
    settings: EncodeSettings | None = None  # how they were made; decoding reads its options (version_2) here

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return [len(row["input_ids"]) for row in self.rows]


def loss_terms(rows: Sequence[dict[str, Any]]) -> int:
    """How many terms the model's mean loss over `rows` averages: labelled tokens for per-token labels (ignored
    positions are not terms), else rows."""
    if rows and isinstance(rows[0].get("labels"), list):
        return sum(label != IGNORE_INDEX for row in rows for label in row["labels"])
    return len(rows)


class FeatureBatches:
    """Collated batches of `features` in the order of an index sampler; re-iterable (one pass per epoch).

    Rank `rank` of `world_size` processes (torchrun) yields a Shard of every global batch: its rows rank,
    rank + world_size, ... (every process draws the same global order from the same seed), so that the global
    batch, and so each optimizer step, is the one a single process takes."""

    def __init__(self, features: Features, sampler, pad_token_id: int, rank: int = 0, world_size: int = 1):
        self.features, self.sampler, self.pad_token_id = features, sampler, pad_token_id
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor] | Shard]:
        for indices in self.sampler:
            rows = [self.features.rows[i] for i in indices]
            if self.world_size == 1:
                yield collate(rows, self.pad_token_id)
                continue
            own = rows[self.rank::self.world_size]
            terms = loss_terms(own)
            if terms == 0:  # nothing to learn from (a small last batch): it steps with the others on a row that
                own = next(([row] for row in rows if loss_terms([row])), rows[:1])  # counts for nothing
            yield Shard(collate(own, self.pad_token_id), terms / max(loss_terms(rows), 1))


def training_batches(features: Features, batch_size: int, pad_token_id: int, seed: int, rank: int = 0,
                     world_size: int = 1) -> FeatureBatches:
    """Length-grouped batches of `batch_size` rows in a seeded order; under torchrun each process's shard of them."""
    return FeatureBatches(features, LengthGroupedBatches(features.lengths(), batch_size, seed), pad_token_id,
                          rank, world_size)


def inference_batches(features: Features, batch_size: int, pad_token_id: int, keys: Sequence[str] = MODEL_INPUTS,
                      ) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """(row indices, batch of the model inputs `keys`) in length-sorted order, for evaluation and prediction."""
    for indices in length_sorted_batches(features.lengths(), batch_size):
        rows = [{key: features.rows[i][key] for key in keys if key in features.rows[i]} for i in indices]
        yield indices, collate(rows, pad_token_id)


@torch.inference_mode()
def forward_rows(model: nn.Module, rows: Sequence[dict[str, Any]], read: Callable[[Any], tuple[torch.Tensor, ...]]
                 ) -> list[tuple[torch.Tensor, ...]]:
    """The model on `rows` as one padded batch; per row, the per-token outputs `read(model output)` picks, float32
    (a float64 model's float64) on the CPU and cut to the row's length: read=lambda output: (output.logits,) gives
    each row's (seq, labels) logits. Evaluation, prediction and the server's batcher all run rows through here."""
    device = next(model.parameters()).device
    batch = collate([{key: row[key] for key in MODEL_INPUTS if key in row} for row in rows], model.config.pad_token_id)
    tensors = [(tensor if tensor.dtype == torch.float64 else tensor.float()).cpu()  # a float64 model's kept
               for tensor in read(model(**{k: v.to(device) for k, v in batch.items()}))]
    return [tuple(tensor[slot, :len(row["input_ids"])] for tensor in tensors) for slot, row in enumerate(rows)]


def row_outputs(model: nn.Module, features: Features, batch_size: int,
                read: Callable[[Any], tuple[torch.Tensor, ...]]) -> list[tuple[torch.Tensor, ...]]:
    """forward_rows over every row of `features`, in length-sorted batches of `batch_size`, in eval mode."""
    was_training = model.training
    model.eval()
    outputs: list[tuple[torch.Tensor, ...]] = [()] * len(features)
    for indices in length_sorted_batches(features.lengths(), batch_size):
        for row, output in zip(indices, forward_rows(model, [features.rows[i] for i in indices], read)):
            outputs[row] = output
    model.train(was_training)
    return outputs
