"""Bad settings from outside the command line (environment variables, damaged prepared files, extreme flags): the
real `bertforge` command ends with one line naming the variable, flag or file at fault, never a traceback or a
crash; and `serve` says the address it really listens at."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from bertforge.inference.serve.app import server_url
from bertforge.pretraining.corpus import prepare_corpus, shard_path
from bertforge.training.distributed import read_environment

NO_SUCH_USER = "~bertforge-no-such-user"


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("bertforge: error: "), err
    for fragment in fragments:
        assert fragment in err


def run_module(*argv: str, **env: str) -> subprocess.CompletedProcess:
    """`python -m bertforge *argv` in its own process: a crash there fails the test instead of ending pytest."""
    return subprocess.run([sys.executable, "-m", "bertforge", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


@pytest.mark.parametrize("keep", [90, -2], ids=["cut-in-header", "cut-in-data"])
def test_a_truncated_corpus_shard_names_the_file(run_cli, tokenizer, tmp_path, keep):
    raw = tmp_path / "raw.txt"
    raw.write_text("One sentence here.\nAnother one.\n\nA second document.\nWith more text.\n", encoding="utf-8")
    prepare_corpus([raw], tokenizer, tmp_path / "data", progress=False)
    shard = shard_path(tmp_path / "data", 0, "tokens")
    shard.write_bytes(shard.read_bytes()[:keep])  # what a partial copy of the corpus leaves
    code, _, err = run_cli("--threads", "1", "pretrain", "train", "--data", tmp_path / "data", "--output",
                           tmp_path / "out", "--objective", "mlm", "--holdout", "0", "--steps", "1", "--batch-size",
                           "2", "--max-length", "16", "--no-progress")
    assert_one_line_error(code, err, f"{shard}: damaged shard (", "prepare the corpus again")


def test_too_many_threads_is_refused_before_torch_crashes():
    result = run_module("--threads", "32768", "tokenize", "hi")
    assert_one_line_error(result.returncode, result.stderr, "--threads must be at most 4096, got 32768")


@pytest.mark.parametrize("variable, value, message", [
    ("MASTER_PORT", "abc", "MASTER_PORT must be an integer, got 'abc'"),
    ("MASTER_PORT", "0", "MASTER_PORT must be in 1..65535 (a TCP port), got 0"),
    ("MASTER_PORT", "65536", "MASTER_PORT must be in 1..65535 (a TCP port), got 65536"),
    ("RANK", "2", "RANK must be in 0..1 (WORLD_SIZE=2), got 2"),
    ("RANK", "-1", "RANK must be in 0..1 (WORLD_SIZE=2), got -1"),
    ("LOCAL_RANK", "-1", "LOCAL_RANK must be in 0..1 (WORLD_SIZE=2), got -1"),
    ("WORLD_SIZE", "0", "WORLD_SIZE must be at least 1, got 0"),
    ("WORLD_SIZE", "two", "WORLD_SIZE must be an integer, got 'two'"),
])
def test_torchrun_variables_are_checked_one_by_one(variable, value, message):
    launch = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
              variable: value}
    with pytest.raises(ValueError) as error:
        read_environment(launch)
    assert str(error.value) == f"the environment variable {message}"


def test_a_master_port_that_is_no_number_stops_finetune(run_cli, tiny_model_dir, tmp_path, monkeypatch):
    train = tmp_path / "train.csv"
    train.write_text("text,label\na joy,pos\ndull,neg\n")
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "abc"}.items():
        monkeypatch.setenv(name, value)
    code, _, err = run_cli("--threads", "1", "finetune", "--model", tiny_model_dir, "--train", train, "--output",
                           tmp_path / "model", "--max-steps", "1", "--no-progress")
    assert_one_line_error(code, err, "the environment variable MASTER_PORT must be an integer, got 'abc'")
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"])
def test_a_hub_cache_under_an_unknown_users_home(run_cli, monkeypatch, variable):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, f"{NO_SUCH_USER}/cache")
    code, _, err = run_cli("tokenize", "hi", "--model", "org/name")
    assert_one_line_error(code, err, f"the environment variable {variable} is '{NO_SUCH_USER}/cache'",
                          f"{NO_SUCH_USER} is no known user's home folder")


@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
def test_an_empty_api_key_variable_is_named(run_cli, tiny_model_dir, monkeypatch, value):
    """Refused, not read as "no key": serving without one by accident is worse than not starting."""
    monkeypatch.setenv("BERTFORGE_API_KEY", value)
    code, _, err = run_cli("serve", "--model", tiny_model_dir, "--port", "0")
    assert_one_line_error(code, err, "the environment variable BERTFORGE_API_KEY is empty",
                          "unset it to serve without one")
    monkeypatch.delenv("BERTFORGE_API_KEY")
    code, _, err = run_cli("serve", "--model", tiny_model_dir, "--port", "0", "--api-key", value)
    assert_one_line_error(code, err, "--api-key is empty", "leave the flag out to serve without one")


def test_serve_on_port_zero_says_the_port_it_got(tiny_model_dir):
    process = subprocess.Popen(
        [sys.executable, "-m", "bertforge", "--threads", "1", "serve", "--model", str(tiny_model_dir), "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        said, url = "", None
        for line in iter(process.stderr.readline, ""):  # up to the line saying where it serves, or the end
            said += line
            if url := re.search(r"serving .* on (http://\S+)", line):
                break
        assert url and not url.group(1).endswith(":0"), said
        assert "WARNING" not in said  # a start is no warning (a log watched for them would alert at each)
        deadline = time.monotonic() + 60
        while True:  # uvicorn starts answering just after that line
            try:
                with urllib.request.urlopen(f"{url.group(1)}/health", timeout=2) as response:
                    assert json.load(response)["device"] == "cpu"
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)


def test_server_urls_bracket_ipv6_hosts():
    assert server_url("::1", 18561) == "http://[::1]:18561"
    assert server_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert server_url("localhost", 8000) == "http://localhost:8000"


@pytest.mark.parametrize("variable, message", [
    ("BERTFORGE_CACHE", "names {file}, which is a file, not a folder"),
    ("XDG_CACHE_HOME", "names {file}/bertforge, where no folder can be made (Not a directory)"),
])
def test_a_demo_cache_that_is_a_file_names_the_variable(run_cli, tmp_path, monkeypatch, variable, message):
    file = tmp_path / "afile"
    file.write_text("not a folder\n")
    monkeypatch.delenv("BERTFORGE_CACHE", raising=False)
    monkeypatch.setenv(variable, str(file))
    code, _, err = run_cli("demo")
    assert_one_line_error(code, err, f"the environment variable {variable} " + message.format(file=file))
