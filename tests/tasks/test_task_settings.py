"""Each task's settings in a dataclass of its own, held by FinetuneConfig; older runs' flat configs still load."""

import json

import pytest

from bertforge.errors import ConfigError
from bertforge.tasks.classification import ClassificationSettings
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.tasks.question_answering import QASettings
from bertforge.tasks.token_classification import NerSettings

# finetune_config.json as runs before the per-task settings wrote it: every task's keys, flat, doc_stride null.
OLD_QA_RUN = {
    "train": "train.json", "output": "out", "task": "qa", "model": "default", "random_init": False, "dropout": None,
    "dev": None, "text_column": "sentence", "text_pair_column": None, "label_column": "label", "max_length": 192,
    "long_text": "truncate", "context": "sentence", "decoding": "argmax", "doc_stride": None, "max_query_length": 32,
    "version_2": True, "n_best": 20, "max_answer_length": 30, "null_score_threshold": 0.0, "batch_size": 16,
    "eval_batch_size": 64, "max_train_examples": None, "training": {"epochs": 2},
}


def test_an_older_flat_run_config_loads(tmp_path):
    (tmp_path / "finetune_config.json").write_text(json.dumps(OLD_QA_RUN))
    config = FinetuneConfig.load(tmp_path / "finetune_config.json")
    assert config.settings == QASettings(max_length=192, doc_stride=128, max_query_length=32, version_2=True)
    assert config.training.epochs == 2 and config.batch_size == 16


def test_the_file_holds_only_the_tasks_own_settings(tmp_path):
    config = FinetuneConfig(task="ner", settings=NerSettings(max_length=64, decoding="viterbi"))
    config.save(tmp_path / "run.json")
    saved = json.loads((tmp_path / "run.json").read_text())
    assert (saved["max_length"], saved["decoding"], saved["doc_stride"]) == (64, "viterbi", 16)
    assert "n_best" not in saved and "long_text" not in saved
    assert FinetuneConfig.load(tmp_path / "run.json") == config


def test_settings_are_checked_where_they_are_defined():
    with pytest.raises(ConfigError, match="unknown long_text 'cut'; choose from truncate, windows"):
        ClassificationSettings(long_text="cut")
    with pytest.raises(ConfigError, match="max_length"):
        FinetuneConfig.from_dict({"task": "ner", "settings": {"max_length": 0}})
    with pytest.raises(ConfigError, match="task 'qa' takes QASettings, got NerSettings"):
        FinetuneConfig(task="qa", settings=NerSettings())
    with pytest.raises(ConfigError, match="run.json: n_best is a setting of task qa, not of classification"):
        FinetuneConfig.from_dict({"n_best": 5}, "run.json")
    # A nested "settings" object is read too; a top-level key (a flag) wins over it.
    config = FinetuneConfig.from_dict({"task": "qa", "settings": {"n_best": 3, "max_length": 256}, "n_best": 4})
    assert (config.settings.n_best, config.max_length) == (4, 256)
