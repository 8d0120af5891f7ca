"""bertforge.fit: the README's notebook example against the same run on the command line (same predictions,
same metrics), data in memory read as the files' readers read them, and its one-line errors."""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

import bertforge
from bertforge.cli import main as cli_main
from bertforge.errors import ConfigError, InputError
from bertforge.tasks.data import Columns, read_text_examples

README = Path(__file__).resolve().parents[2] / "README.md"


def notebook_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    return next(block for block in blocks if "bertforge.fit(" in block)


def test_readme_example_predicts_as_the_command_line(tmp_path, data_dir, one_thread, monkeypatch, run_readme_block):
    """The example prints what the README shows (tests/test_readme.py leaves this block to this test), and the same
    run on the command line writes the same model, predictions and metrics."""
    pytest.importorskip("pandas")
    monkeypatch.chdir(README.parent)  # the example reads ../shared/data from the repository root
    namespace = run_readme_block(notebook_example())
    model, train, dev = namespace["model"], namespace["train"], namespace["dev"]

    # the same rows as files, the same settings as flags
    train.to_json(tmp_path / "train.jsonl", orient="records", lines=True)
    dev.to_json(tmp_path / "dev.jsonl", orient="records", lines=True)
    cli = tmp_path / "cli-model"
    commands = [
        ["finetune", "--train", tmp_path / "train.jsonl", "--dev", tmp_path / "dev.jsonl", "--output", cli,
         "--epochs", "1", "--batch-size", "8", "--lr", "3e-4", "--max-length", "64", "--no-progress"],
        ["predict", "--model", cli, "--input", tmp_path / "dev.jsonl", "--output", tmp_path / "predictions.jsonl"],
        ["evaluate", "--model", cli, "--data", tmp_path / "dev.jsonl", "--output", tmp_path / "metrics.json"],
    ]
    for command in commands:
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli_main.main([str(arg) for arg in command]) == 0
    assert (cli / "model.safetensors").read_bytes() == (model.directory / "model.safetensors").read_bytes()
    expected = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    answers = model.predict(dev["sentence"])  # a pandas Series of texts
    assert [answer["label"] for answer in answers] == [answer["label"] for answer in expected]
    for answer, reference in zip(answers, expected):
        assert answer["probabilities"] == pytest.approx(reference["probabilities"], abs=1e-6)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert model.evaluate(dev) == pytest.approx({name: metrics[name] for name in model.evaluate(dev)})


ROWS = [{"review": "a joy", "stars": "pos"}, {"review": "a mess", "stars": "neg"}, {"review": "lovely", "stars": "pos"}]


def test_data_in_memory_reads_as_the_file(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    columns = Columns("review", None, "stars")
    expected = [(e.text, e.label) for e in read_text_examples(path, columns, "class")]
    as_columns = {"review": [row["review"] for row in ROWS], "stars": [row["stars"] for row in ROWS]}
    for data in (ROWS, as_columns, pd.DataFrame(ROWS)):
        assert [(e.text, e.label) for e in read_text_examples(data, columns, "class")] == expected
    # a DataFrame's numbers are numpy's: labels 1 and "1" are one label, and a NaN is a missing value
    frame = pd.DataFrame({"review": ["a joy", None], "stars": [1, 0]})
    assert read_text_examples(frame[:1], columns, "class")[0].label == "1"
    with pytest.raises(InputError, match=r"^DataFrame, row 2, field 'review': missing value"):
        read_text_examples(frame, columns, "class")


@pytest.mark.parametrize("data, settings, error, message", [
    ({"review": ["a", "b"], "stars": ["pos"]}, {}, InputError, "columns of different lengths: 'review' has 2, "
                                                                "'stars' has 1"),
    ("not-a-file.csv", {}, InputError, "not-a-file.csv: no such file"),
    (ROWS, {"epoch": 2}, ConfigError, "unknown setting 'epoch'"),
    ([{"review": 3, "stars": "pos"}], {}, InputError, "list, row 1, field 'review': expected a text, got 3"),
    # rows for ner are a sentence's words and tags, each a list
    (ROWS, {"task": "ner"}, InputError, "list, row 1, field 'review': expected a list of words (texts)"),
    ([ROWS[0], "text"], {}, InputError, "list, row 2: expected a dict per row, got str"),
])
def test_errors(tiny_model_dir, tmp_path, data, settings, error, message):
    with pytest.raises(error, match=re.escape(message)):
        bertforge.fit(data, output=tmp_path / "out", model=str(tiny_model_dir), text_column="review",
                      label_column="stars", **settings)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("paths", [{"output": ""}, {"output": "out", "dev": " "}, {"output": "out", "model": ""}])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(tiny_model_dir, tmp_path, monkeypatch, paths):
    monkeypatch.chdir(tmp_path)  # fit(output="") wrote here, or failed with "PosixPath('.') has an empty name"
    with pytest.raises(ConfigError, match="is an empty path"):
        bertforge.fit(ROWS, **{"model": str(tiny_model_dir), **paths}, text_column="review", label_column="stars")
    assert list(tmp_path.iterdir()) == []


def test_fit_from_lists_predicts_and_saves(tiny_model_dir, tmp_path, one_thread):
    texts = ["a joy", "a mess", "lovely", "dreadful"] * 4
    labels = ["pos", "neg", "pos", "neg"] * 4
    model = bertforge.fit({"text": texts, "label": labels}, {"text": texts[:4], "label": labels[:4]},
                          model=str(tiny_model_dir), text_column="text", epochs=1, batch_size=4, max_length=16,
                          progress=False, device="cpu")
    assert model.directory.is_dir() and set(model.id2label.values()) == {"neg", "pos"}
    answers = model.predict(texts[:4])
    assert [set(answer) for answer in answers] == [{"label", "probabilities"}] * 4
    saved = model.save(tmp_path / "copy")
    assert bertforge.FinetunedModel.load(saved).predict(texts[:4]) == answers
    with pytest.raises(ConfigError, match="already holds a model"):
        model.save(saved)
