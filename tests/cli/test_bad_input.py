"""The promise made to users, one row per mistake: the real `bertforge` command (main(argv)) ends with exit status
1 (2 for a malformed command line), one line on stderr naming the flag, key, file or line at fault, and every
output written earlier (a fine-tuned model, an embedding file) byte for byte as it was."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import pickle
import shutil
import signal
from pathlib import Path

import pytest
import torch

from bertforge.cli import main as cli_main

REVIEWS = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg"), ("warm , witty and wise", "pos"),
           ("an utter mess", "neg")] * 3


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = cli_main.main([str(arg) for arg in argv])
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` and its SHA-256: what "nothing earlier changed" is checked against."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer, save_tiny_encoder):
    """A tiny encoder, a model fine-tuned from it, an earlier embedding file and data files of every kind."""
    root = tmp_path_factory.mktemp("bad_input")
    encoder = save_tiny_encoder(root / "encoder")
    data = root / "data"
    data.mkdir()
    (data / "train.csv").write_text("review,sentiment\n" + "".join(f'"{t}",{label}\n' for t, label in REVIEWS))
    (data / "lines.txt").write_text("first line\nsecond line\n")
    earlier = root / "earlier"  # everything in here must survive every bad command unchanged
    earlier.mkdir()
    code = cli_main.main(["--threads", "1", "finetune", "--model", str(encoder), "--train", str(data / "train.csv"),
                          "--text-column", "review", "--label-column", "sentiment", "--output",
                          str(earlier / "model"), "--epochs", "1", "--batch-size", "4", "--max-length", "16",
                          "--no-progress", "--device", "cpu"])
    assert code == 0
    (earlier / "vectors.npy").write_bytes(b"earlier output")
    (earlier / "a_file").write_text("a regular file")
    return root, encoder, data, earlier


def assert_one_line_error(code, out, err, expected_code, *fragments):
    assert code == expected_code, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertforge"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def bad_model(root: Path, encoder: Path, name: str, config_changes=None, tokenizer_changes=None) -> Path:
    """A copy of the tiny encoder with config.json or tokenizer_config.json keys changed."""
    directory = root / name
    if directory.exists():
        shutil.rmtree(directory)
    shutil.copytree(encoder, directory)
    for file, changes in (("config.json", config_changes), ("tokenizer_config.json", tokenizer_changes)):
        if changes:
            data = json.loads((directory / file).read_text())
            (directory / file).write_text(json.dumps(data | changes))
    return directory


# (id, argv after `bertforge` with {E} encoder, {M} fine-tuned model, {D} data folder, {O} earlier outputs,
#  {T} this test's folder, exit status, fragments the one line must hold)
FLAG_AND_OUTPUT_CASES = [
    ("threads-0", ["--threads", "0", "tokenize", "hi"], 2, ["--threads", "at least 1"]),
    ("finetune-lr-nan", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--lr", "nan"], 2,
     ["--lr", "finite"]),
    ("finetune-lr-inf", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--lr", "inf"], 2,
     ["--lr", "finite"]),
    ("finetune-weight-decay-nan", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out",
                                   "--weight-decay", "nan"], 2, ["--weight-decay", "finite"]),
    ("finetune-lr-negative", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--lr", "-1"], 2,
     ["--lr", "must be more than zero, got -1"]),
    ("finetune-batch-size-0", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--batch-size", "0"],
     2, ["--batch-size", "must be at least 1, got 0"]),
    ("finetune-seed-negative", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--seed", "-1"], 2,
     ["--seed", "from 0 to 4294967295"]),
    ("finetune-seed-2**32", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--seed",
                             "4294967296"], 2, ["--seed", "from 0 to 4294967295"]),
    ("finetune-seeds-2**32", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--seeds",
                              "1,4294967296"], 1, ["--seeds", "from 0 to 4294967295"]),
    # a flag's bad value is the flag's, not the run config's it is written over
    ("finetune-flag-over-config", ["finetune", "--config", "{M}/finetune_config.json", "--output", "{T}/out",
                                   "--warmup-ratio", "2"], 2, ["--warmup-ratio", "from 0 to 1, got 2"]),
    ("finetune-dropout-1", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--dropout", "1"], 2,
     ["--dropout", "at least 0 and below 1"]),
    ("finetune-device-banana", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--device",
                                "banana"], 1, ["'banana'", "not a device"]),
    ("finetune-device-cuda-9", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--device",
                                "cuda:9"], 1, ["'cuda:9'"]),
    ("serve-max-wait-ms-1e308", ["serve", "--model", "{E}", "--max-wait-ms", "1e308"], 2,
     ["--max-wait-ms", "from 0 to 60000"]),
    ("pretrain-lr-nan", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{T}/out", "--lr", "nan"], 2,
     ["--lr"]),
    # pre-training's flags carry their ranges too: the config's check named its field ("lr must be above 0.0")
    ("pretrain-lr-negative", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{T}/out", "--lr", "-1"], 2,
     ["--lr", "must be more than zero, got -1"]),
    ("pretrain-dropout-1", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{T}/out", "--dropout", "1"],
     2, ["--dropout", "at least 0 and below 1"]),
    ("pretrain-peak-gflops-0", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{T}/out",
                                "--peak-gflops", "0"], 2, ["--peak-gflops", "more than zero"]),
    # 1.5 documents held out: trained, holding out int(1.5) = 1
    ("pretrain-holdout-1.5", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{T}/out", "--holdout",
                              "1.5"], 2, ["--holdout", "a fraction from 0 to below 1, or a whole number", "1.5"]),
    ("pretrain-holdout-negative", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{T}/out",
                                   "--holdout", "-0.1"], 2, ["--holdout", "got -0.1"]),
    ("pretrain-eval-holdout-1.5", ["pretrain", "eval", "--model", "{E}", "--data", "{T}/corpus", "--holdout", "1.5"],
     2, ["--holdout", "whole number of documents"]),
    ("finetune-output-under-file", ["finetune", "--model", "{E}", "--train", "{D}/train.csv", "--output",
                                    "{O}/a_file/model"], 1, ["a_file is a file, not a folder"]),
    ("finetune-output-is-file", ["finetune", "--model", "{E}", "--train", "{D}/train.csv", "--output",
                                 "{O}/a_file"], 1, ["exists and is not a folder"]),
    ("finetune-output-holds-model", ["finetune", "--model", "{E}", "--train", "{D}/train.csv", "--output",
                                     "{M}"], 1, ["already holds a model", "--overwrite"]),
    ("finetune-resume-nothing", ["finetune", "--model", "{E}", "--train", "{D}/train.csv", "--output", "{T}/new",
                                 "--resume"], 1, ["no killed run to resume"]),
    ("pretrain-output-holds-model", ["pretrain", "train", "--data", "{T}/corpus", "--output", "{M}"], 1,
     ["already holds a model"]),
    ("embed-output-under-file", ["embed", "--model", "{E}", "--input", "{D}/lines.txt", "--output",
                                 "{O}/a_file/v.npy"], 1, ["a_file is a file, not a folder"]),
    ("embed-output-is-folder", ["embed", "--model", "{E}", "--input", "{D}/lines.txt", "--output", "{T}/dir.npy"],
     1, ["is a folder"]),
    ("predict-output-is-folder", ["predict", "--model", "{M}", "--input", "{D}/lines.txt", "--output",
                                  "{T}/dir.npy"], 1, ["is a folder"]),
    ("predict-pair-without-text", ["predict", "--model", "{M}", "--input", "{D}/lines.txt", "--output",
                                   "{T}/out.jsonl", "--text-pair", "a second text"], 1,
     ["--text-pair goes with --text"]),  # it was ignored, every line predicted alone
    ("predict-empty-text", ["predict", "--model", "{M}", "--text", " "], 1, ["--text is empty"]),  # was predicted
    ("mistyped-command", ["embedd"], 2, ["invalid choice: 'embedd'", "did you mean embed?"]),
    ("mistyped-step", ["pretrain", "trian"], 2, ["did you mean train?"]),
    ("mistyped-choice", ["explain", "--text", "x", "--method", "occlusio"], 2, ["did you mean occlusion?"]),
    ("embedding-task", ["finetune", "--task", "sentence-embeddings", "--train", "x.csv"], 2,
     ["invalid choice: 'sentence-embeddings'", "fine-tuned by `bertforge finetune-embeddings`"]),
    ("cross-encoder-task", ["finetune", "--task", "cross-encoder", "--train", "x.csv"], 2,
     ["invalid choice: 'cross-encoder'", "(query, document) pairs is --task rerank"]),
    ("attention-output-under-file", ["attention", "hello", "--model", "{E}", "--output", "{O}/a_file/a.html"], 1,
     ["a_file is a file, not a folder"]),
    ("evaluate-output-is-folder", ["evaluate", "--model", "{M}", "--data", "{D}/train.csv", "--output",
                                   "{T}/dir.npy"], 1, ["is a folder"]),
    ("export-onnx-output-under-file", ["export", "onnx", "--model", "{E}", "--output", "{O}/a_file/m.onnx"], 1,
     ["a_file is a file, not a folder"]),
    ("export-hf-output-holds-model", ["export", "hf", "--model", "{E}", "--output", "{M}"], 1,
     ["already holds a model"]),
    ("vocab-output-under-file", ["vocab", "--corpus", "{D}/lines.txt", "--output", "{O}/a_file/vocab.txt"], 1,
     ["a_file is a file, not a folder"]),
    ("quantize-max-drop-nan", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output", "{T}/out",
                               "--max-drop", "nan"], 2, ["--max-drop", "finite"]),
    ("quantize-max-drop-abc", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output", "{T}/out",
                               "--max-drop", "abc"], 2, ["--max-drop: must be a number, got abc"]),
    ("finetune-batch-size-1.5", ["finetune", "--train", "{D}/train.csv", "--output", "{T}/out", "--batch-size",
                                 "1.5"], 2, ["--batch-size: must be a whole number, got 1.5"]),
    ("quantize-outlier-channels-all", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output",
                                       "{T}/out", "--outlier-channels", "5000"], 1, ["outlier_channels", "fewer than"]),
    ("quantize-device-banana", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output", "{T}/out",
                                "--device", "banana"], 1, ["'banana'"]),
    ("quantize-output-is-file", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output", "{O}/a_file"],
     1, ["a_file", "exists and is a file"]),
    # refused before the models are measured, not after (the gate's own output checks)
    ("quantize-output-under-a-file", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output",
                                      "{O}/a_file/int8"], 1, ["a_file/int8: can't create the output folder",
                                                              "a_file is a file, not a folder"]),
    ("distill-output-under-a-file", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output",
                                     "{O}/a_file/student"], 1, ["a_file/student: can't create the output folder",
                                                                "a_file is a file, not a folder"]),
    ("distill-max-drop-inf", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                              "--max-drop", "inf"], 2, ["--max-drop", "finite"]),
    ("quantize-outlier-channels-negative", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output",
                                            "{T}/out", "--outlier-channels", "-1"], 2,
     ["--outlier-channels", "zero or more"]),
    ("quantize-smoothing-above-1", ["quantize", "--model", "{M}", "--dev", "{D}/train.csv", "--output", "{T}/out",
                                    "--smoothing", "1.5"], 2, ["--smoothing", "from 0 to 1"]),
    ("distill-temperature-0", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                               "--temperature", "0"], 2, ["--temperature", "from 0.01 to 100"]),
    ("distill-temperature-1e308", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                                   "--temperature", "1e308"], 2, ["--temperature", "from 0.01 to 100"]),
    ("distill-max-steps-0", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                             "--max-steps", "0"], 2, ["--max-steps", "at least 1"]),
    # finetune's flags that distill sets itself (the student is cut from --teacher into a new --output, one run)
    ("distill-model", ["distill", "--teacher", "{M}", "--model", "{E}", "--train", "{D}/train.csv", "--output",
                       "{T}/out"], 2, ["unrecognized arguments: --model"]),
    ("distill-seeds", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out", "--seeds",
                       "1,2"], 2, ["unrecognized arguments: --seeds"]),
    ("distill-resume", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                        "--resume"], 2, ["unrecognized arguments: --resume"]),
    ("distill-soft-weight-2", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                               "--soft-weight", "2"], 2, ["--soft-weight", "from 0 to 1"]),
    ("distill-hidden-weight-nan", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                                   "--hidden-weight", "nan"], 2, ["--hidden-weight", "finite"]),
    ("distill-student-as-deep", ["distill", "--teacher", "{M}", "--train", "{D}/train.csv", "--output", "{T}/out",
                                 "--student-layers", "9"], 1, ["has more than its teacher"]),
    # an output among the files of the model or data the command reads would replace them
    ("predict-output-is-model-config", ["predict", "--model", "{M}", "--input", "{D}/lines.txt", "--output",
                                        "{M}/config.json"], 1, ["config.json: is part of", "which this command reads"]),
    ("evaluate-output-is-model-weights", ["evaluate", "--model", "{M}", "--data", "{D}/train.csv", "--output",
                                          "{M}/model.safetensors"], 1, ["model.safetensors: is part of"]),
    ("explain-output-is-tokenizer", ["explain", "--model", "{M}", "--text", "fine", "--output",
                                     "{M}/tokenizer_config.json"], 1, ["tokenizer_config.json: is part of"]),
    ("finetune-output-holds-its-data", ["finetune", "--model", "{E}", "--train", "{D}/train.csv", "--text-column",
                                        "review", "--label-column", "sentiment", "--output", "{D}"], 1,
     ["train.csv, which this run reads", "choose another output folder"]),
    ("finetune-output-is-root", ["finetune", "--model", "{E}", "--train", "{D}/train.csv", "--text-column", "review",
                                 "--label-column", "sentiment", "--output", "/"], 1, ["file system's root"]),
    ("predict-output-would-be-a-layout-file", ["predict", "--model", "{M}", "--input", "{D}/lines.txt", "--output",
                                               "{M}/modules.json"], 1, ["modules.json: is part of"]),
    ("finetune-output-holds-its-model", ["finetune", "--model", "{O}/model", "--train", "{D}/train.csv",
                                         "--text-column", "review", "--label-column", "sentiment", "--output", "{O}",
                                         "--overwrite"], 1, ["model, which this run reads"]),
    # options that would be ignored
    ("predict-decoding-of-a-classifier", ["predict", "--model", "{M}", "--text", "fine", "--decoding", "viterbi"], 1,
     ["decoding 'viterbi' is a setting of ner"]),
    ("predict-pair-to-a-single-text-model", ["predict", "--model", "{M}", "--text", "fine", "--text-pair", "two"], 1,
     ["--text-pair", "fine-tuned on single texts (column 'review')"]),
    ("finetune-early-stopping-without-dev", ["finetune", "--model", "{E}", "--train", "{D}/train.csv",
                                             "--text-column", "review", "--label-column", "sentiment",
                                             "--early-stopping", "2", "--output", "{T}/out"], 1,
     ["--early-stopping 2", "give --dev too"]),
    ("finetune-label-separator-of-classification", ["finetune", "--model", "{E}", "--train", "{D}/train.csv",
                                                    "--text-column", "review", "--label-column", "sentiment",
                                                    "--label-separator", "|", "--output", "{T}/out"], 1,
     ["label_separator", "multi_label"]),
    ("evaluate-data-from-standard-input", ["evaluate", "--model", "{M}", "--data", "-", "--format", "csv"], 1,
     ["-: standard input is read by predict, embed, similarity and tokenize"]),
    ("vocab-corpus-from-standard-input", ["vocab", "--corpus", "-", "--output", "{T}/vocab.txt"], 1,
     ["-: standard input is read by", "corpus file must be a file"]),
]


@pytest.mark.parametrize("argv, code, fragments", [case[1:] for case in FLAG_AND_OUTPUT_CASES],
                         ids=[case[0] for case in FLAG_AND_OUTPUT_CASES])
def test_flags_and_output_locations(world, tmp_path, capsys, argv, code, fragments):
    root, encoder, data, earlier = world
    if "cuda" in " ".join(argv) and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "dir.npy").mkdir()
    places = {"{E}": str(encoder), "{M}": str(earlier / "model"), "{D}": str(data), "{O}": str(earlier),
              "{T}": str(tmp_path)}
    for key, value in places.items():
        argv = [arg.replace(key, value) for arg in argv]
    before = digest(earlier)
    assert_one_line_error(*run_cli(capsys, "--threads", "1", *argv), code, *fragments)
    assert digest(earlier) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only folders")
def test_read_only_output_folder(world, tmp_path, capsys):
    root, encoder, data, earlier = world
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = run_cli(capsys, "embed", "--model", encoder, "--input", data / "lines.txt", "--output",
                         locked / "v.npy")
        assert_one_line_error(*result, 1, "not writable")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("command", ["predict", "embed", "quantize", "pretrain prepare"])
def test_a_one_process_command_under_torchrun(world, tmp_path, capsys, monkeypatch, command):
    """Under torchrun every process would do the whole job and write the same output: refused, nothing written."""
    root, encoder, data, earlier = world
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "localhost"),
                        ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    argv = {"predict": ["--model", earlier / "model", "--input", data / "lines.txt", "--output",
                        tmp_path / "out.jsonl"],
            "embed": ["--model", encoder, "--input", data / "lines.txt", "--output", tmp_path / "out.npy"],
            "quantize": ["--model", earlier / "model", "--dev", data / "train.csv", "--output", tmp_path / "out"],
            "pretrain prepare": ["--corpus", data / "lines.txt", "--vocab", encoder, "--output",
                                 tmp_path / "out"]}
    before = digest(earlier)
    assert_one_line_error(*run_cli(capsys, *command.split(), *argv[command]), 1,
                          f"`bertforge {command}` runs in one process", "without torchrun")
    assert digest(earlier) == before and sorted(tmp_path.iterdir()) == []


def test_stray_launch_variables_leave_a_one_process_command_alone(world, tmp_path, capsys, monkeypatch):
    """WORLD_SIZE without torchrun's other variables is no launch: embed runs as it would without it."""
    root, encoder, data, earlier = world
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, out, err = run_cli(capsys, "embed", "--model", encoder, "--input", data / "lines.txt", "--output",
                             tmp_path / "v.npy")
    assert code == 0, err
    assert (tmp_path / "v.npy").is_file()


# config.json and tokenizer_config.json keys: (id, file changes, fragments)
MODEL_FILE_CASES = [
    ("layer_norm_eps-string", {"layer_norm_eps": "1e-12"}, None, ["config.json", "layer_norm_eps", "a number"]),
    ("layer_norm_eps-nan", {"layer_norm_eps": math.nan}, None, ["layer_norm_eps", "finite"]),
    ("layer_norm_eps-negative", {"layer_norm_eps": -1}, None, ["layer_norm_eps", "above 0"]),
    ("initializer_range-string", {"initializer_range": "0.02"}, None, ["initializer_range", "a number"]),
    ("hidden_size-1e7", {"hidden_size": 10_000_000, "num_attention_heads": 1}, None,
     ["parameters", "GB of memory", "this machine has"]),
    ("vocab_size-1e9", {"vocab_size": 1_000_000_000}, None, ["parameters", "GB of memory"]),
    ("num_hidden_layers-1e6", {"num_hidden_layers": 1_000_000}, None, ["parameters", "GB of memory"]),
    ("hidden_size-float", {"hidden_size": 1e7}, None, ["hidden_size", "integer"]),
    ("model_max_length-string", None, {"model_max_length": "512"}, ["tokenizer_config.json", "model_max_length"]),
    ("do_lower_case-no", None, {"do_lower_case": "no"}, ["tokenizer_config.json", "do_lower_case",
                                                          "true or false"]),
]


@pytest.mark.parametrize("config_changes, tokenizer_changes, fragments", [case[1:] for case in MODEL_FILE_CASES],
                         ids=[case[0] for case in MODEL_FILE_CASES])
def test_config_and_tokenizer_keys(world, tmp_path, capsys, config_changes, tokenizer_changes, fragments):
    root, encoder, data, earlier = world
    model = bad_model(tmp_path, encoder, "model", config_changes, tokenizer_changes)
    before = digest(earlier)
    result = run_cli(capsys, "embed", "--model", model, "--input", data / "lines.txt", "--output",
                     earlier / "vectors.npy")
    assert_one_line_error(*result, 1, *fragments)
    assert digest(earlier) == before


def test_checkpoint_files(world, tmp_path, capsys):
    root, encoder, data, earlier = world
    before = digest(earlier)
    truncated = bad_model(tmp_path, encoder, "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_one_line_error(*run_cli(capsys, "embed", "--model", truncated, "--input", data / "lines.txt",
                                   "--output", earlier / "vectors.npy"), 1, "model.safetensors")
    # a pickle that torch's weights_only loader refuses (it would run code): one line, not torch's advice
    pickled = bad_model(tmp_path, encoder, "pickled")
    (pickled / "model.safetensors").unlink()
    with open(pickled / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"weight": Path("not a tensor")}, handle)
    assert_one_line_error(*run_cli(capsys, "embed", "--model", pickled, "--input", data / "lines.txt",
                                   "--output", earlier / "vectors.npy"), 1, "pytorch_model.bin")
    missing = tmp_path / "nowhere"
    assert_one_line_error(*run_cli(capsys, "tokenize", "hi", "--model", missing), 1, "no such model directory")
    assert digest(earlier) == before


SQUAD_CONTEXT = "Denver won the game."


def squad_file(path: Path, answers) -> Path:
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": SQUAD_CONTEXT, "qas": [
        {"id": "q1", "question": "Who won?", "answers": answers}]}]}]}))
    return path


# Data files of each format, read by finetune before any model is loaded: (id, file name, content, fragments)
DATA_CASES = [
    ("csv-unclosed-quote", "bad.csv", 'review,sentiment\n"fine",pos\n"never closed,neg\nmore,pos\n',
     ["bad.csv, line 3", "never closed"]),
    ("csv-fields", "bad.csv", "review,sentiment\nfine,pos\na, b,neg\n", ["line 3", "3 fields"]),
    ("csv-not-utf8", "bad.csv", b"review,sentiment\n\xff\xfe,pos\n", ["UTF-8", "line 2"]),
    ("jsonl-number-text", "bad.jsonl", '{"review": "fine", "sentiment": "pos"}\n{"review": 42, "sentiment": "neg"}\n',
     ["bad.jsonl, line 2", "'review'", "expected a text, got 42"]),
    ("jsonl-object-text", "bad.jsonl", '{"review": {"a": 1}, "sentiment": "neg"}\n', ["line 1", "expected a text"]),
    ("jsonl-broken", "bad.jsonl", '{"review": "fine", "sentiment": "pos"}\n{"review": \n', ["line 2", "JSON"]),
    ("jsonl-missing-column", "bad.jsonl", '{"text": "fine", "sentiment": "pos"}\n', ["no column 'review'"]),
    ("tsv-empty", "bad.tsv", "", ["the file is empty"]),
    ("unknown-suffix", "bad.xlsx", "x", ["unsupported file type", "say which with --format (csv, tsv"]),
    ("txt-has-no-labels", "reviews.txt", "fine\tpos\nbad\tneg\n",
     ["reviews.txt: plain text (one text a line) has no labels", "reads with --format tsv"]),
    # Parquet and datasets folders, written by pandas/pyarrow and datasets: rows are numbered from 1
    ("parquet-missing-column", "bad.parquet", lambda path: parquet(path, {"text": ["fine"], "sentiment": ["pos"]}),
     ["bad.parquet", "no column 'review' (--text-column names it); the file has 'text', 'sentiment'"]),
    ("parquet-number-text", "bad.parquet",
     lambda path: parquet(path, {"review": [42, 7], "sentiment": ["pos", "neg"]}),
     ["bad.parquet, row 1, field 'review'", "expected a text, got 42"]),
    ("parquet-missing-label", "bad.parquet",
     lambda path: parquet(path, {"review": ["fine", "bad"], "sentiment": ["pos", None]}),
     ["bad.parquet, row 2, field 'sentiment'", "missing value"]),
    ("parquet-corrupt", "bad.parquet", b"PAR1 not a parquet file at all PAR1",
     ["bad.parquet", "not a readable Parquet"]),
    ("dataset-corrupt-arrow", "bad_dataset", lambda path: saved_dataset(path, damage=True),
     ["data-00000-of-00001.arrow", "not a readable Arrow stream"]),
    ("dataset-number-text", "bad_dataset", lambda path: saved_dataset(path, {"review": [1.5], "sentiment": ["pos"]}),
     ["bad_dataset, row 1, field 'review'", "expected a text, got 1.5"]),
    ("datasetdict-folder", "bad_dataset", lambda path: saved_dataset(path, splits=True),
     ["holds the splits train, test", "bad_dataset/train"]),
]


def parquet(path: Path, columns: dict) -> None:
    pd = pytest.importorskip("pandas")
    pd.DataFrame(columns).to_parquet(path)


def saved_dataset(path: Path, columns: dict | None = None, damage: bool = False, splits: bool = False) -> None:
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict(columns or {"review": ["fine", "bad"], "sentiment": ["pos", "neg"]})
    if splits:
        dataset = datasets.DatasetDict({"train": dataset, "test": dataset})
    dataset.save_to_disk(str(path))
    if damage:
        arrow = next(path.glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:40])


@pytest.mark.parametrize("name, content, fragments", [case[1:] for case in DATA_CASES],
                         ids=[case[0] for case in DATA_CASES])
def test_data_files(world, tmp_path, capsys, name, content, fragments):
    root, encoder, data, earlier = world
    path = tmp_path / name
    if callable(content):
        content(path)
        capsys.readouterr()  # datasets' progress bar while saving
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = digest(earlier)
    result = run_cli(capsys, "finetune", "--model", encoder, "--train", path, "--text-column", "review",
                     "--label-column", "sentiment", "--output", tmp_path / "out")
    assert_one_line_error(*result, 1, *fragments)
    assert digest(earlier) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("format_, fragments", [
    ("hf_dataset", ["reviews.csv: is a file, expected a folder written by datasets' save_to_disk"]),
    ("parquet", ["reviews.csv: not a readable Parquet file"]),
    ("squad", ["reviews.csv: unsupported format 'squad' here; use one of csv, tsv"]),
])
def test_a_format_the_file_is_not(world, tmp_path, capsys, format_, fragments):
    root, encoder, data, earlier = world
    path = tmp_path / "reviews.csv"
    path.write_text("review,sentiment\nfine,pos\n")
    before = digest(earlier)
    result = run_cli(capsys, "finetune", "--model", encoder, "--train", path, "--text-column", "review",
                     "--label-column", "sentiment", "--format", format_, "--output", tmp_path / "out")
    assert_one_line_error(*result, 1, *fragments)
    assert digest(earlier) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("answers, fragments", [
    ([{"text": "Denver", "answer_start": -20}], ["answer_start -20 is outside the context"]),
    ([{"text": "game", "answer_start": 18}], ["answer_start 18 is outside the context"]),
    ([{"text": "", "answer_start": 99}], ["answer_start 99 is outside the context"]),
    ([{"text": "Denver", "answer_start": 1}], ["points at 'enver '"]),
    ([{"text": "Denver", "answer_start": "0"}], ["expected int, got str"]),
    ([{"text": "Denver", "answer_start": True}], ["expected int, got bool"]),
    ([{"text": SQUAD_CONTEXT + " and more", "answer_start": 0}],
     ["answer's", "characters are more than the context's"]),
], ids=["negative", "beyond", "empty-beyond", "elsewhere", "string", "boolean", "longer-than-the-context"])
def test_squad_offsets(world, tmp_path, capsys, answers, fragments):
    root, encoder, data, earlier = world
    path = squad_file(tmp_path / "squad.json", answers)
    result = run_cli(capsys, "finetune", "--task", "qa", "--model", encoder, "--train", path, "--output",
                     tmp_path / "out")
    assert_one_line_error(*result, 1, "squad.json", *fragments)


def test_is_impossible_is_true_or_false(world, tmp_path, capsys):
    """The string "false" would read as true (and then as "unanswerable but has answers")."""
    root, encoder, data, earlier = world
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": SQUAD_CONTEXT, "qas": [
        {"id": "q1", "question": "Who won?", "is_impossible": "false",
         "answers": [{"text": "Denver", "answer_start": 0}]}]}]}]}))
    result = run_cli(capsys, "finetune", "--task", "qa", "--version-2", "--model", encoder, "--train", path,
                     "--output", tmp_path / "out")
    assert_one_line_error(*result, 1, "squad.json", "is_impossible must be true or false, got 'false'")


def test_outputs_may_go_into_the_model_folder_and_be_written_again(world, tmp_path, capsys):
    """Only the model's own files are refused as outputs: predictions, vectors and the evaluation report may be
    written beside them, and written again."""
    root, encoder, data, earlier = world
    model = shutil.copytree(earlier / "model", tmp_path / "model")
    model_files = digest(model)
    for _ in range(2):
        for argv in (["predict", "--model", model, "--input", data / "lines.txt", "--output", model / "preds.jsonl"],
                     ["embed", "--model", model, "--input", data / "lines.txt", "--output", model / "vectors.npy"],
                     ["evaluate", "--model", model, "--data", data / "train.csv", "--output",
                      model / "eval_results.json"]):
            code, out, err = run_cli(capsys, *argv)
            assert code == 0, err
    assert {name: value for name, value in digest(model).items()
            if name not in ("preds.jsonl", "vectors.npy", "eval_results.json")} == model_files


def test_evaluate_keeps_the_metrics_transformers_trainer_saved_beside_the_model(world, tmp_path, capsys):
    """A Trainer's output folder (run_glue's) holds its eval_results.json beside the model: evaluate's report, which
    goes there unless told where, is refused rather than replacing it, and written where --output says."""
    from types import SimpleNamespace

    trainer_utils = pytest.importorskip("transformers.trainer_pt_utils")
    root, encoder, data, earlier = world
    model = shutil.copytree(earlier / "model", tmp_path / "model")
    trainer = SimpleNamespace(args=SimpleNamespace(output_dir=str(model)), is_world_process_zero=lambda: True)
    trainer_utils.save_metrics(trainer, "eval", {"epoch": 3.0, "eval_accuracy": 0.91, "eval_loss": 0.27,
                                                 "eval_runtime": 1.5, "eval_samples": 872})
    saved = digest(model)
    argv = ["evaluate", "--model", model, "--data", data / "train.csv"]
    assert_one_line_error(*run_cli(capsys, *argv), 1, "eval_results.json: holds the metrics transformers' Trainer "
                                                      "saved", "--output")
    assert digest(model) == saved
    code, out, err = run_cli(capsys, *argv, "--output", tmp_path / "report.json")
    assert code == 0, err
    assert digest(model) == saved and "accuracy" in json.loads((tmp_path / "report.json").read_text())


def test_a_pair_model_given_one_text_is_refused(world, tmp_path, capsys):
    """A model fine-tuned on text pairs would read a text alone as no training example was, and answer anyway."""
    root, encoder, data, earlier = world
    (tmp_path / "pairs.csv").write_text("first,second,label\n" + "".join(f'"{text}","{text} indeed",{label}\n'
                                                                       for text, label in REVIEWS))
    assert run_cli(capsys, "finetune", "--model", encoder, "--train", tmp_path / "pairs.csv", "--text-column",
                   "first", "--text-pair-column", "second", "--max-steps", "1", "--output", tmp_path / "model",
                   "--no-progress")[0] == 0
    assert_one_line_error(*run_cli(capsys, "predict", "--model", tmp_path / "model", "--text", "fine"), 1,
                          "fine-tuned on text pairs (columns 'first' and 'second'): give --text-pair too")
    code, out, err = run_cli(capsys, "predict", "--model", tmp_path / "model", "--text", "fine", "--text-pair", "yes")
    assert code == 0 and out.split()[0] in ("pos", "neg"), err
    # a plain-text file's lines are single texts: MRPC's own tab-separated .txt would be read a whole line a text
    (tmp_path / "pairs.txt").write_text("first\tsecond\nfine\tfine indeed\n")
    assert_one_line_error(*run_cli(capsys, "predict", "--model", tmp_path / "model", "--input", tmp_path / "pairs.txt",
                                   "--output", tmp_path / "preds.jsonl"), 1,
                          "pairs.txt, plain text (one text a line), holds single texts, and")
    assert not (tmp_path / "preds.jsonl").exists()
    code, out, err = run_cli(capsys, "predict", "--model", tmp_path / "model", "--input", tmp_path / "pairs.txt",
                             "--format", "tsv", "--output", tmp_path / "preds.jsonl")
    assert code == 0 and len((tmp_path / "preds.jsonl").read_text().splitlines()) == 1, err


def test_an_output_of_the_current_folder(world, tmp_path, capsys, monkeypatch):
    """`--output .` writes into the folder it names (its staging folder beside it), and the folder stays itself."""
    root, encoder, data, earlier = world
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("the user's own file")
    code, out, err = run_cli(capsys, "export", "hf", "--model", encoder, "--output", ".")
    assert code == 0, err
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "notes.md").read_text() == "the user's own file"
    assert not (tmp_path.parent / (tmp_path.name + ".incomplete")).exists()
    assert_one_line_error(*run_cli(capsys, "export", "hf", "--model", encoder, "--output", "."), 1,
                          "already holds a model")
    # replacing it would pull the current folder from under the shell (and `.` has no name to set it aside by)
    assert_one_line_error(*run_cli(capsys, "export", "hf", "--model", encoder, "--output", ".", "--overwrite"), 1,
                          "is the current folder (or holds it)")
    assert (tmp_path / "model.safetensors").is_file()


def test_predictions_of_a_text_file_are_one_per_line(world, tmp_path, capsys):
    """Blank lines are texts too, so the n-th prediction is the n-th line's (as embed's vectors are); a form feed or
    U+2028 inside a line breaks no line."""
    root, encoder, data, earlier = world
    lines = ["a joy from start to finish", "", "dull and lifeless", "   ", "witty\u2028and\x0cwise"]
    for ending in ("\r\n", "\n", "\r"):  # Windows, Unix and old Mac files
        path = tmp_path / "texts.txt"
        path.write_text(ending.join(lines) + ending, encoding="utf-8", newline="")
        for command in (["predict", "--model", earlier / "model"], ["embed", "--model", encoder]):
            code, out, err = run_cli(capsys, *command, "--input", path, "--output", "-")
            assert code == 0, err
            assert [json.loads(row)["text"] for row in out.split("\n")[:-1]] == lines  # JSON lines end at "\n"


def test_a_long_csv_field_is_read_like_the_same_text_in_jsonl(world, tmp_path, capsys):
    root, encoder, data, earlier = world
    text = "a very long review " * 10_000  # 190 KB: over the csv module's default field limit of 128 KB
    (tmp_path / "long.csv").write_text(f'sentence\n"{text}"\nshort\n')
    (tmp_path / "long.jsonl").write_text(json.dumps({"sentence": text}) + "\n" + json.dumps({"sentence": "short"}))
    answers = []
    for name in ("long.csv", "long.jsonl"):
        code, out, err = run_cli(capsys, "predict", "--model", earlier / "model", "--input", tmp_path / name,
                                 "--text-column", "sentence", "--output", tmp_path / f"{name}.out.jsonl")
        assert code == 0, err
        answers.append([json.loads(line)["label"] for line in (tmp_path / f"{name}.out.jsonl").read_text().split(
            "\n") if line])
    assert answers[0] == answers[1] and len(answers[0]) == 2


def test_evaluate_of_a_named_model_writes_nothing_in_the_working_directory(world, tmp_path, capsys, monkeypatch):
    root, encoder, data, earlier = world
    monkeypatch.chdir(tmp_path)
    run_cli(capsys, "evaluate", "--model", "default", "--data", data / "train.csv", "--text-column", "review",
            "--label-column", "sentiment")
    assert not (tmp_path / "default").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, advice", [
    (["embed", "--model", "{E}", "--input", "{D}/lines.txt", "--output", "{T}/out.npy"],
     "--batch-size or --max-length"),
    (["explain", "--model", "{M}", "--text", "a joy"], "--max-length"),
])
def test_running_out_of_memory_names_what_to_lower(world, tmp_path, capsys, monkeypatch, command, advice):
    """torch reports a failed allocation as a RuntimeError, not Python's MemoryError: a real one here (40 TB asked
    in the encoder, as too large a batch would), which ended in a traceback."""
    from bertforge import model as model_module

    root, encoder, data, earlier = world

    def forward(*args, **kwargs):
        return torch.empty(10**13)

    monkeypatch.setattr(model_module.BertModel, "forward", forward)
    places = {"{E}": str(encoder), "{M}": str(earlier / "model"), "{D}": str(data), "{T}": str(tmp_path)}
    argv = command
    for key, value in places.items():
        argv = [arg.replace(key, value) for arg in argv]
    before = digest(earlier)
    assert_one_line_error(*run_cli(capsys, "--threads", "1", *argv), 1, f"out of memory; try a smaller {advice}")
    assert digest(earlier) == before and list(tmp_path.iterdir()) == []


def test_a_closed_pipe_ends_quietly(world, tmp_path):
    """`bertforge tokenize --json ... | head`: no BrokenPipeError traceback, the exit status of a closed pipe. The
    reader here (`true`) is gone before bertforge writes, so the pipe is closed whatever the output's size."""
    import subprocess
    import sys

    command = (f"{sys.executable} -m bertforge tokenize --json --model {world[1]} 'a text' | true; "
               "exit ${PIPESTATUS[0]}")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert result.stderr == "" and result.returncode == 141


def test_a_full_disk_is_one_line_naming_the_file_and_loses_nothing(world, tmp_path, capsys, file_size_limit):
    """A write that fails for want of room (a full disk, a quota; here a file size limit, which fails a write the
    same way): one line naming what could not be written, every earlier output as it was, and nothing half-written
    left behind but a training run's resumable staging folder."""
    root, encoder, data, earlier = world
    before = digest(earlier)
    (tmp_path / "lines.txt").write_text("".join(f"line {i} of a longer input\n" for i in range(300)))
    vectors = 128 + 300 * 128 * 4  # np.save's header, then 300 rows of the tiny encoder's 128 floats
    model = earlier / "model"
    cases = [
        # numpy wrote through C's stdio and dropped a failure of its last flush: exit 0 over a file cut short
        (vectors - 1000, ["embed", "--model", encoder, "--input", tmp_path / "lines.txt", "--output",
                          earlier / "vectors.npy"], f"{earlier / 'vectors.npy'}: File too large"),
        # torch.save's assertion of its own ("unexpected pos ..."), a traceback
        (1 << 20, ["finetune", "--model", encoder, "--train", data / "train.csv", "--text-column", "review",
                   "--label-column", "sentiment", "--output", tmp_path / "run", "--max-steps", "2", "--save-every",
                   "1", "--batch-size", "4", "--max-length", "16", "--no-progress", "--device", "cpu"],
         f"{tmp_path / 'run.incomplete' / 'checkpoint' / 'train_state.pt'}: File too large"),
        # safetensors' own error, a traceback; then the temporary folder's name
        (4096, ["quantize", "--model", model, "--dev", data / "train.csv", "--output", tmp_path / "int8",
                "--max-drop", "100"], f"{tmp_path / 'int8'}: can't write the model: File too large"),
        # the student's temporary training folders, named and then left behind
        (4096, ["distill", "--teacher", model, "--train", data / "train.csv", "--output", tmp_path / "student",
                "--student-layers", "1", "--max-steps", "1", "--max-drop", "100", "--no-progress"],
         f"{tmp_path / 'student'}: can't write the student: File too large"),
        # half an export was left in model.incomplete
        (4096, ["export", "hf", "--model", model, "--output", model, "--overwrite"],
         f"{model}: can't write the model: File too large"),
    ]
    for limit, argv, message in cases:
        with file_size_limit(limit):
            code, out, err = run_cli(capsys, "--threads", "1", *argv)
        assert_one_line_error(code, out, err, 1, message)
        assert err == f"bertforge: error: {message}\n"
    assert digest(earlier) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lines.txt", "run.incomplete"]


def test_a_write_to_a_file_already_open_names_the_output():
    """A log appended to, a stream written line by line: the OS's error then names no file. A full disk is the
    output's problem; any other error without a file stays as it is."""
    assert cli_main.describe_os_error(OSError(errno.ENOSPC, "No space left on device"), "runs/mlm") == \
        "runs/mlm: No space left on device"
    assert cli_main.describe_os_error(OSError(errno.EIO, "Input/output error"), "runs/mlm") == "Input/output error"
    assert cli_main.describe_os_error(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"


def test_distill_stopped_by_sigterm_says_it_does_not_resume(world, tmp_path, capsys, monkeypatch):
    """Fine-tuning and pre-training stop on SIGTERM with a checkpoint to resume (tests/cli/test_kill_resume.py);
    a distillation's checkpoint is in its temporary folder, removed with it: it must not say --resume."""
    from bertforge.training import trainer

    root, encoder, data, earlier = world
    to_device = trainer.to_device

    def sigterm_in_the_first_step(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return to_device(*args)

    monkeypatch.setattr(trainer, "to_device", sigterm_in_the_first_step)
    code, out, err = run_cli(capsys, "--threads", "1", "distill", "--teacher", earlier / "model", "--train",
                             data / "train.csv", "--output", tmp_path / "student", "--student-layers", "1",
                             "--max-steps", "5", "--no-progress")
    assert_one_line_error(code, out, err, 1, "stopped by SIGTERM after step 1; distillation does not resume, and "
                                             f"nothing was written to {tmp_path / 'student'}")
    assert list(tmp_path.iterdir()) == []
