"""More of the promise made to users (see test_bad_input.py): run config keys of the wrong JSON type, a --max-length
the model has no positions for, standard input named as such, CoNLL files with a broken line, SQuAD files with a
byte-order mark or no questions, folders given as data files; and a fine-tuning run whose every file is in its
staging folder before the folder is moved into place."""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path

import pytest

from bertforge import ConfigError
from bertforge.cli import main as cli_main
from bertforge.outputs import staging_dir

REVIEWS = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg")] * 4
SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
    "context": "Paris is the capital of France.",
    "qas": [{"id": "q1", "question": "What is the capital of France?",
             "answers": [{"text": "Paris", "answer_start": 0}]}]}]}]}


def assert_one_line_error(code, err, *fragments):
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertforge"), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def standard_input(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    """A tiny encoder (64 positions), a classifier fine-tuned from it and a training file."""
    root, encoder = tmp_path_factory.mktemp("bad_input_config"), tiny_model_dir
    train = root / "train.csv"
    train.write_text("sentence,label\n" + "".join(f'"{text}",{label}\n' for text, label in REVIEWS))
    code = cli_main.main(["--threads", "1", "finetune", "--model", str(encoder), "--train", str(train), "--output",
                          str(root / "classifier"), "--epochs", "1", "--batch-size", "4", "--max-length", "16",
                          "--no-progress", "--device", "cpu"])
    assert code == 0
    return root, encoder, train


@pytest.mark.parametrize("changes, fragments", [
    ({"training": [1]}, ["training: expected an object, got a list"]),
    ({"training": "abc"}, ["training: expected an object, got a string"]),
    ({"training": None}, ["training: expected an object, got null"]),
    ({"output": 123}, ["output: expected a string or null, got an integer (123)"]),
    ({"model": None}, ["model: expected a string, got null"]),
    ({"random_init": "yes"}, ["random_init: expected true or false, got a string (\"yes\")"]),
    ({"training": {"lr": "0.1"}}, ["training: lr: expected a number, got a string"]),
    ({"training": {"bf16": 1}}, ["training: bf16: expected true or false, got an integer (1)"]),
    ({"max_length": True}, ["max_length: expected an integer, got a boolean (true)"]),
], ids=["training-list", "training-string", "training-null", "output-number", "model-null", "random_init-string",
        "nested-number", "nested-bool", "setting-bool"])
def test_run_config_keys_of_the_wrong_type(world, tmp_path, run_cli, changes, fragments):
    """Every key is checked against its dataclass field's type before anything is read: the training file doesn't
    exist, and the error is still the key's (with --epochs written over the file's "training")."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"train": str(tmp_path / "missing.csv"), "output": str(tmp_path / "out")} | changes))
    code, _, err = run_cli("finetune", "--config", config, "--epochs", "1", "--no-progress")
    assert_one_line_error(code, err, str(config), *fragments)
    assert not (tmp_path / "out").exists()


def test_max_length_beyond_the_models_positions(world, tmp_path, run_cli):
    """Refused before any data is read or folder made, naming the flag, the value and the model's positions."""
    _, encoder, train = world
    code, _, err = run_cli("finetune", "--model", encoder, "--train", train, "--output", tmp_path / "out",
                           "--max-length", 100, "--no-progress")
    assert_one_line_error(code, err, "--max-length 100", "max_position_embeddings (64)")
    assert not (tmp_path / "out").exists() and not staging_dir(tmp_path / "out").exists()


def test_predict_max_length_beyond_the_models_positions(world, tmp_path, run_cli):
    root, _, _ = world
    code, _, err = run_cli("predict", "--model", root / "classifier", "--text", "fine", "--max-length", 100)
    assert_one_line_error(code, err, "max_length 100 is more than the model's max_position_embeddings (64)")


@pytest.mark.parametrize("data, fragment", [({"task": [1]}, "task: expected a string, got a list"),
                                            ({"settings": "abc", "max_length": 5}, "settings: expected an object")])
def test_run_configs_from_python_check_types_first(data, fragment):
    from bertforge.tasks.finetune import FinetuneConfig

    with pytest.raises(ConfigError, match=f"run.json: {fragment}"):
        FinetuneConfig.from_dict(data, "run.json")


def test_curves_are_drawn_before_the_move(world, tmp_path, run_cli, monkeypatch):
    """The staging folder holds curves.png (and every other file) when it is moved into place: the move is the
    run's last step, so a Ctrl-C after it interrupts nothing."""
    # the module, not the function of that name that bertforge.tasks exports
    finetune_module = importlib.import_module("bertforge.tasks.finetune")
    _, encoder, train = world
    staged = []
    move = finetune_module.finish_staging

    def recording_move(output):
        staged.extend(sorted(path.name for path in staging_dir(output).iterdir()))
        return move(output)

    monkeypatch.setattr(finetune_module, "finish_staging", recording_move)
    output = tmp_path / "out"
    code, out, err = run_cli("finetune", "--model", encoder, "--train", train, "--output", output,
                             "--max-length", 16, "--batch-size", 4, "--epochs", 1, "--no-progress")
    assert code == 0, err
    assert "curves.png" in staged and "model.safetensors" in staged
    assert f"curves: {output / 'curves.png'}" in out and (output / "curves.png").is_file()


def test_invalid_utf8_on_standard_input_names_stdin_and_its_line(world, tmp_path, run_cli, monkeypatch):
    """predict, embed and tokenize read standard input as they read a file: a bad byte is an error naming
    <stdin> and the line it is on."""
    root, encoder, _ = world
    standard_input(monkeypatch, b"fine\nba\xffd\n")
    code, _, err = run_cli("predict", "--model", root / "classifier", "--input", "-", "--output", "-")
    assert_one_line_error(code, err, "<stdin>, line 2: not valid UTF-8 text")
    assert "tmp" not in err
    standard_input(monkeypatch, b"ba\xffd\n")
    code, _, err = run_cli("embed", "--model", encoder, "--input", "-", "--output", "-")
    assert_one_line_error(code, err, "<stdin>, line 1: not valid UTF-8 text")
    standard_input(monkeypatch, b"ba\xffd\n")
    code, _, err = run_cli("tokenize", "--model", encoder, "-")
    assert_one_line_error(code, err, "<stdin>, line 1: not valid UTF-8 text")


def test_conll_with_a_broken_line_and_unknown_dev_tag_name_the_line(world, tmp_path, run_cli):
    """A .txt file of mostly CoNLL lines is CoNLL, so its broken line is the error; a dev tag the training data
    never had is named at its line in the file."""
    _, encoder, _ = world
    broken = tmp_path / "n.txt"
    broken.write_text("EU B-ORG\nrejects\n\nPeter B-PER\n")
    code, _, err = run_cli("finetune", "--task", "ner", "--model", encoder, "--train", broken,
                           "--output", tmp_path / "out")
    assert_one_line_error(code, err, f"{broken}, line 2: expected a word and its tag")
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("Peter B-PER\nlives O\n\nAnna B-PER\n")
    dev.write_text("Peter B-PER\n\nWest B-MISC\nIndian I-MISC\n")
    code, _, err = run_cli("finetune", "--task", "ner", "--model", encoder, "--train", train, "--dev", dev,
                           "--output", tmp_path / "out")
    assert_one_line_error(code, err, f"{dev}, line 3: tag 'B-MISC' is not one of the model's labels")


def test_squad_with_a_byte_order_mark_is_read_and_an_empty_one_is_named(world, tmp_path, run_cli):
    _, encoder, _ = world
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"version": "1.1", "data": []}))
    code, _, err = run_cli("finetune", "--task", "qa", "--model", encoder, "--train", empty,
                           "--output", tmp_path / "out")
    assert_one_line_error(code, err, f"{empty}: no questions")
    marked = tmp_path / "bom.json"
    marked.write_bytes(b"\xef\xbb\xbf" + json.dumps(SQUAD).encode())
    code, _, err = run_cli("finetune", "--task", "qa", "--model", encoder, "--train", marked, "--output",
                           tmp_path / "qa", "--max-length", 48, "--max-query-length", 16, "--doc-stride", 8,
                           "--max-steps", 1, "--no-progress")
    assert code == 0, err
    assert (tmp_path / "qa" / "model.safetensors").is_file()


@pytest.mark.parametrize("task", ["classification", "ner", "qa"])
@pytest.mark.parametrize("name", ["somedir", "dir.csv"])
def test_a_folder_given_as_data_is_named_a_directory(world, tmp_path, run_cli, task, name):
    _, encoder, _ = world
    (tmp_path / name).mkdir()
    code, _, err = run_cli("finetune", "--task", task, "--model", encoder, "--train", tmp_path / name,
                           "--output", tmp_path / "out")
    assert_one_line_error(code, err, f"{tmp_path / name}: is a directory")


def test_embed_drops_the_byte_order_mark_of_a_text_file(world, tmp_path, run_cli):
    _, encoder, _ = world
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"\xef\xbb\xbfA cat sits.\nA dog runs.\n")
    code, _, err = run_cli("embed", "--model", encoder, "--input", lines, "--output", tmp_path / "v.jsonl")
    assert code == 0, err
    texts = [json.loads(line)["text"] for line in Path(tmp_path / "v.jsonl").read_text().splitlines()]
    assert texts == ["A cat sits.", "A dog runs."]


def test_predicting_no_texts_gives_no_answers(world):
    from bertforge import FinetunedModel

    root, _, _ = world
    assert FinetunedModel.load(root / "classifier").predict([]) == []


def test_a_folder_of_parquet_shards_names_them(world, tmp_path, run_cli):
    """The Hub's data/ folder holds a split's shards (train-00000-of-00002.parquet, ...): named, with what to do."""
    pandas = pytest.importorskip("pandas")
    _, encoder, _ = world
    (tmp_path / "data").mkdir()
    for shard in range(2):
        pandas.DataFrame({"sentence": ["fine", "dull"], "label": [1, 0]}).to_parquet(
            tmp_path / "data" / f"train-0000{shard}-of-00002.parquet")
    code, _, err = run_cli("finetune", "--model", encoder, "--train", tmp_path / "data", "--output", tmp_path / "out")
    assert_one_line_error(code, err, f"{tmp_path / 'data'}: is a directory, expected a data file (it holds "
                                     "train-00000-of-00002.parquet, train-00001-of-00002.parquet: give one, or join "
                                     "the shards of a split into one file first)")
