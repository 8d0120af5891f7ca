"""Fine-tuning from Python (a notebook): data as a dict of columns, a DataFrame, a list of row dicts or a file in,
a FinetunedModel out, which predicts on strings, evaluates and saves. The run is `bertforge finetune`'s (the same
FinetuneConfig, examples, batches and output folder), so the model answers as `bertforge predict` does.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.errors import ConfigError
from bertforge.tasks.finetune import FinetuneConfig, finetune, training_labels
from bertforge.tasks.finetuned_model import FinetunedModel
from bertforge.tasks.registry import get_task

logger = logging.getLogger("bertforge")


def fit(train: Any, dev: Any = None, output: str | Path | None = None, *, config: FinetuneConfig | None = None,
        seeds: Sequence[int] | None = None, overwrite: bool = False, **settings: Any) -> FinetunedModel:
    """Fine-tune on `train` and return the kept model (the best on `dev`, else the last), loaded from `output`.

    `train` and `dev`: a data file, a dict of columns ({"sentence": [...], "label": [...]}), a DataFrame or a list
    of row dicts. `settings` are FinetuneConfig's fields and its training fields, by name: task="regression",
    text_column="review", epochs=2, lr=1e-4, ...; `config` is where they start (e.g. FinetuneConfig.load(path)).
    `seeds` runs once per seed (see tasks/seeds.py) and returns the best. Without `output` the model folder is
    made in a new temporary folder (the returned model's `directory`).
    """
    config = with_settings(config or FinetuneConfig(), settings)
    output = Path(tempfile.mkdtemp(prefix="bertforge-")) / "model" if output is None else output
    task = get_task(config.task)
    train_examples = dev_examples = None
    changes: dict[str, Any] = {"output": str(output)}
    if is_path(train):
        changes["train"] = str(train)
    else:
        train_examples = task.read_examples(train, config.columns, settings=config.settings)
    if is_path(dev):
        changes["dev"] = str(dev)
    elif dev is not None:
        examples = train_examples if train_examples is not None else \
            task.read_examples(train, config.columns, settings=config.settings)
        labels = training_labels(task, examples, train if is_path(train) else None)
        dev_examples = task.read_examples(dev, config.columns, labels, settings=config.settings)
    config = with_settings(config, changes)
    if seeds is not None:
        from bertforge.tasks.seeds import finetune_seeds
        finetune_seeds(config, seeds, train_examples, dev_examples, overwrite=overwrite)
    else:
        finetune(config, train_examples, dev_examples, overwrite=overwrite)
    logger.info("fine-tuned model saved to %s", output)
    return FinetunedModel.load(output)


def is_path(data: Any) -> bool:
    return isinstance(data, (str, os.PathLike))


def with_settings(config: FinetuneConfig, settings: dict[str, Any]) -> FinetuneConfig:
    """`config` with settings replaced by name, each found among its fields or those of its nested sections
    (training: epochs, lr, seed, ...); an unknown name is a ConfigError."""
    data = config.to_dict()
    sections = [name for name, value in data.items() if isinstance(value, dict)]
    for name, value in settings.items():
        if name in data and name not in sections:
            data[name] = value
            continue
        section = next((section for section in sections if name in data[section]), None)
        if section is None:
            raise ConfigError(f"unknown setting {name!r}: not a field of FinetuneConfig or of its "
                              f"{', '.join(sections)} settings")
        data[section][name] = value
    return FinetuneConfig.from_dict(data, "fit() settings")
