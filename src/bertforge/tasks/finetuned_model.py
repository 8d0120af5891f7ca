"""A fine-tuned model used: loaded with its tokenizer, task and training settings, it predicts, evaluates and saves
as `bertforge predict` and `bertforge evaluate` do (tasks/finetune.py makes it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.errors import ConfigError, InputError
from bertforge.inference.optimize import AS_TRAINED, InferenceOptions
from bertforge.outputs import check_output_dir, finish_staging, start_staging, to_json, write_output
from bertforge.tasks.checkpoint_contents import RUN_CONFIG_FILE, inspect_checkpoint
from bertforge.tasks.data import Columns, EncodeSettings
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.tasks.question_answering import QAExample
from bertforge.tasks.registry import Task
from bertforge.tasks.tables import PLAIN_TEXT_COLUMN, data_format
from bertforge.tokenizer import BertTokenizer
from bertforge.validation import check_counts, check_paths, check_within_positions

EVAL_RESULTS_FILE = "eval_results.json"
# The key of each label's scores among an evaluation's metrics (FinetunedModel.evaluate(per_label=True)).
PER_LABEL = "per_label"
# ... and the confusion matrix of a task with one label per example (with per_label=True too).
CONFUSION_MATRIX = "confusion_matrix"


@dataclass
class FinetunedModel:
    """A fine-tuned model directory, loaded: the model, its tokenizer and task, and how it was trained.

    >>> model = FinetunedModel.load("sst2-model")
    >>> model.predict(["a gripping film"])  # [{"label": "1", "probabilities": {"0": 0.02, "1": 0.98}}]
    """

    model: nn.Module
    tokenizer: BertTokenizer
    task: Task
    run: FinetuneConfig  # the training run's config (or the task's defaults for a checkpoint without one)
    directory: Path | None = None  # where it was loaded from

    @classmethod
    def load(cls, name_or_path: str | Path, task: str | None = None, inference: InferenceOptions = AS_TRAINED
             ) -> FinetunedModel:
        """The task is, in order: `task`, the one it was fine-tuned for, the one its head does (config.json's
        architectures, as transformers writes them), or regression for a one-output classifier.
        The training run's settings (max_length, doc_stride, version_2, ...) stay; without them, the task's.
        `inference` prepares the model (precision, compile); by default it is left as trained."""
        checkpoint = inspect_checkpoint(name_or_path)
        definition = checkpoint.task_for(task)
        tokenizer = BertTokenizer.from_pretrained(checkpoint.directory)
        model = inference.apply(definition.model_class.from_pretrained(checkpoint.directory), tokenizer)
        return cls(model, tokenizer, definition, checkpoint.settings(definition.name), checkpoint.directory)

    @property
    def settings(self) -> EncodeSettings:
        """The task settings inputs are read and answers decoded with: the training run's."""
        return self.run.settings

    def with_settings(self, **changes: Any) -> FinetunedModel:
        """This model reading and decoding with some of its task's settings changed, e.g. a SQuAD v1.1 model on
        v2.0 data: model.with_settings(version_2=True).evaluate("dev-v2.0.json")."""
        own = {f.name for f in dataclasses.fields(self.settings)}
        for name in changes:
            if name not in own:
                raise ConfigError(f"{name} is no setting of task {self.task.name}: its settings are "
                                  f"{', '.join(sorted(own))}")
        settings = dataclasses.replace(self.settings, **changes)
        chosen = tuple(name for name in self.run.chosen_on_dev if name not in changes)  # what is set is given now
        return dataclasses.replace(self, run=dataclasses.replace(self.run, settings=settings, chosen_on_dev=chosen))

    @property
    def id2label(self) -> dict[int, str]:
        return self.model.config.id2label

    def columns(self, text: str | None = None, text_pair: str | None = None, label: str | None = None,
                path: str | Path | None = None, format: str | None = None,
                label_separator: str | None = None) -> Columns:
        """The training run's columns, each replaced when given (None: not given; an empty name is a name, which
        the file's header then lacks, as in fine-tuning); a text file has only a text column."""
        saved = self.run.columns

        def given_or_saved(value: str | None, kept: str | None) -> str | None:
            return kept if value is None else value

        separator = given_or_saved(label_separator, saved.label_separator)
        label = given_or_saved(label, saved.label)
        if path is not None and data_format(path, format) == "txt":
            return Columns(PLAIN_TEXT_COLUMN, None, label, separator)
        return Columns(given_or_saved(text, saved.text), given_or_saved(text_pair, saved.text_pair), label, separator)

    def read(self, path: str | Path, columns: Columns, labelled: bool, format: str | None = None) -> list:
        """The examples of a data file, in `format` (a key of DATA_FORMATS) or the one data_format finds."""
        return self.task.read_examples(path, columns, self.id2label, labelled=labelled,
                                       settings=self.settings, format=format)

    def examples(self, data: Any, labelled: bool) -> list:
        """Examples from texts (a list of strings, or of (text, text_pair) tuples: for qa (question, context)),
        examples, or data as the training run read it: a file, a dict of columns, a DataFrame, rows as dicts."""
        if isinstance(data, str) and not os.path.exists(data):  # a text meant as a list of one, or a typo
            raise InputError(f"{data[:80]!r} is no file: texts go in a list ([text]), a data file by its path")
        if isinstance(data, (str, os.PathLike)):
            return self.read(data, self.columns(path=data), labelled)
        if isinstance(data, Mapping) or hasattr(data, "columns") or hasattr(data, "column_names"):
            return self.read(data, self.columns(), labelled)
        if not isinstance(data, Iterable) or isinstance(data, (bytes, bytearray)):
            raise InputError(f"expected texts (a list), a data file or a table, got {data!r:.80}")
        items = list(data)  # a list, or any iterable of texts (a pandas Series)
        if items and isinstance(items[0], Mapping):
            return self.read(items, self.columns(), labelled)
        for number, item in enumerate(items):
            if not (isinstance(item, str) or is_text_pair(item) or dataclasses.is_dataclass(item)):
                raise InputError(f"item {number}: expected a text or a (text, text_pair) tuple, got {item!r:.80}")
        made = [self.task.example(item, None) if isinstance(item, str) else
                self.task.example(*item) if isinstance(item, tuple) else item for item in items]
        # Questions made here are numbered by their place (1, 2, ...), as those of a file and the server's are.
        return [dataclasses.replace(example, id=str(number))
                if isinstance(example, QAExample) and not isinstance(item, QAExample) else example
                for number, (item, example) in enumerate(zip(items, made), 1)]

    def predict(self, examples: Any, batch_size: int = 64, max_length: int | None = None,
                decoding: str | None = None) -> list[dict[str, Any]]:
        """Answers for texts or examples (see `examples`), one per input, as `bertforge predict` gives them;
        `max_length` and `decoding` (ner) replace the training run's when given."""
        check_counts(batch_size=batch_size)
        examples = self.examples(examples, labelled=False)
        if not examples:
            return []
        check_within_positions(max_length, self.model.config.max_position_embeddings)
        settings = dataclasses.replace(self.settings, **decoding_setting(self.settings, decoding),
                                       max_length=self.settings.max_length if max_length is None else max_length)
        features = self.task.encode(self.tokenizer, examples, settings, self.id2label)
        return self.task.predict(self.model, features, examples, batch_size)

    def evaluate(self, examples: Any, batch_size: int = 64, max_length: int | None = None,
                 decoding: str | None = None, per_label: bool = False) -> dict[str, Any]:
        """The task's metrics (those of `bertforge evaluate`) on labelled examples or data (see `examples`); with
        `per_label`, also each label's (class's, entity type's) precision, recall, F1 and support under
        "per_label", for a task whose answers are labels, and for classification the confusion matrix under
        "confusion_matrix" ({"labels": [...], "matrix": a row per true label, a column per predicted one})."""
        examples = self.examples(examples, labelled=True)
        answers = self.predict(examples, batch_size, max_length, decoding)
        metrics = self.task.score(answers, examples, self.id2label)
        if per_label and self.task.per_label is not None:
            metrics[PER_LABEL] = self.task.per_label(answers, examples, self.id2label)
        if per_label and self.task.confusion is not None:
            metrics[CONFUSION_MATRIX] = self.task.confusion(answers, examples, self.id2label)
        return metrics

    def save(self, directory: str | Path, overwrite: bool = False) -> Path:
        """Write the model folder (weights, config, tokenizer, finetune_config.json) that FinetunedModel.load,
        the CLI and transformers read; a folder holding a model is replaced only with `overwrite`."""
        check_paths(directory=directory)
        output = check_output_dir(directory, overwrite)
        staging = start_staging(output)
        self.model.save_pretrained(staging)
        self.tokenizer.save_pretrained(staging, model_max_length=self.run.max_length)
        self.run.save(staging / RUN_CONFIG_FILE)
        return finish_staging(output)


def given(**settings: Any) -> dict[str, Any]:
    """The settings given a value (None: not given, the training run's stays)."""
    return {name: value for name, value in settings.items() if value is not None}


def is_text_pair(item: Any) -> bool:
    """(text, text_pair), or (question, context) for qa; a pair of None is a text alone."""
    return (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            and (item[1] is None or isinstance(item[1], str)))


def decoding_setting(settings: EncodeSettings, decoding: str | None) -> dict[str, str]:
    """{"decoding": `decoding`, else the saved one} for a task that decodes one way or another (ner), else {}."""
    saved = getattr(settings, "decoding", None)
    if decoding is not None and saved is None:
        raise ConfigError(f"decoding {decoding!r} is a setting of ner (how a sentence's tags are chosen); this "
                          "model's task has one way to decode its answers")
    return {"decoding": decoding or saved} if saved is not None else {}


def evaluate(model: str | Path, data: str | Path, text_column: str | None = None,
             text_pair_column: str | None = None, label_column: str | None = None, task: str | None = None,
             batch_size: int = 64, max_length: int | None = None, output: str | Path | None = None,
             inference: InferenceOptions = AS_TRAINED, decoding: str | None = None,
             format: str | None = None, label_separator: str | None = None,
             per_label: bool = False, version_2: bool | None = None) -> dict[str, Any]:
    """Metrics of a fine-tuned model on a labelled file, also written to `output` (a JSON file, "-" for standard
    output) when given; `inference` (e.g. InferenceOptions(precision="int8")) measures what a speed option costs
    on the task's metric. `label_separator` (multi_label) replaces the training run's. `per_label` adds each
    label's scores (see FinetunedModel.evaluate). `version_2` (qa) reads and scores as SQuAD v2.0 (True) or v1.1
    (False) whatever the model was trained on."""
    finetuned = FinetunedModel.load(model, task, inference).with_settings(**given(version_2=version_2))
    columns = finetuned.columns(text_column, text_pair_column, label_column, path=data, format=format,
                                label_separator=label_separator)
    examples = finetuned.read(data, columns, labelled=True, format=format)
    metrics = finetuned.evaluate(examples, batch_size, max_length, decoding, per_label)
    if output is not None:
        # The inference options under their own key: a metric may share a name with one (NER's "precision").
        quantization = getattr(finetuned.model, "quantization", None)  # a folder `bertforge quantize` wrote
        record = {"model": str(model), "data": str(data), "examples": len(examples),
                  "inference": dataclasses.asdict(inference),
                  **({} if quantization is None else {"quantization": quantization.precision}),
                  **decoding_setting(finetuned.settings, decoding),
                  **({} if version_2 is None else {"version_2": version_2}), **metrics}
        text = to_json(record, indent=2) + "\n"
        write_output(output, text)  # "-": standard output, as the command line names it
    return metrics


def predict(model: str | Path, path: str | Path | None = None, texts: Sequence[str] | None = None,
            text_pairs: Sequence[str] | None = None, text_column: str | None = None,
            text_pair_column: str | None = None, batch_size: int = 64, max_length: int | None = None,
            inference: InferenceOptions = AS_TRAINED, decoding: str | None = None,
            format: str | None = None, version_2: bool | None = None) -> list[dict[str, Any]]:
    """Answers for the examples of a file (or given `texts`, and `text_pairs`: for qa the questions and their
    contexts), each with its input: {"text", "label", ...}, {"text", "entities", "tags"}, {"question", "answer"...}.
    `version_2` (qa): True lets the model abstain (answer ""), as a SQuAD v2.0 model does."""
    finetuned = FinetunedModel.load(model, inference=inference).with_settings(**given(version_2=version_2))
    if path is not None:
        columns = finetuned.columns(text_column, text_pair_column, path=path, format=format)
        examples = finetuned.read(path, columns, labelled=False, format=format)
    else:
        pairs = text_pairs if text_pairs is not None else [None] * len(texts)
        examples = finetuned.examples(list(zip(texts, pairs)), labelled=False)
    answers = finetuned.predict(examples, batch_size, max_length, decoding)
    return [{**finetuned.task.inputs(example), **answer} for example, answer in zip(examples, answers)]
