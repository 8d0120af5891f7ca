"""`bertforge serve` (a real server process on loopback) and `bertforge attention`, end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from bertforge.cli.main import main
from bertforge.inference.serve.settings import ServeSettings


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_answers_http_and_stops_on_interrupt(tiny_model_dir):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bertforge", "--threads", "1", "serve", "--model", str(tiny_model_dir),
         "--port", str(port), "--max-texts", "3", "--long-text", "refuse", "--max-wait-ms", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, health = time.monotonic() + 60, None
        while health is None:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    health = json.load(response)
            except OSError:
                time.sleep(0.1)
        assert health["limits"] == {"max_texts": 3, "max_length": 64, "long_text": "refuse", "max_queue": 256,
                                    "max_batch_size": 32, "max_batch_tokens": 16384, "max_body_bytes": 1_000_000,
                                    "max_concurrent_requests": 512}
        assert health["device"] == "cpu"
        request = urllib.request.Request(f"http://127.0.0.1:{port}/embed", data=b'{"texts": ["hello there"]}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert len(json.load(response)["embeddings"][0]) == 32
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode in (0, 130, -signal.SIGINT), err
    assert "Traceback" not in err
    assert f"http://127.0.0.1:{port}" in err  # the one line saying where it serves


def test_serve_argument_errors(run_cli, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--long-text", "ignore"])
    assert exit_info.value.code == 2 and "invalid choice: 'ignore'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--port", "70000"])
    assert "port number" in capsys.readouterr().err
    code, _, err = run_cli("serve", "--model", str(tmp_path / "missing"), "--port", "0")
    assert code == 1 and err.count("\n") == 1 and "no such model directory" in err
    with socket.socket() as taken:  # a port in use: one line, before the model loads or "serving" is said
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_cli("serve", "--model", str(tmp_path / "missing"), "--port", str(port))
    assert code == 1 and err.count("\n") == 1 and f"--port {port}: can't listen there" in err
    code, _, err = run_cli("serve", "--model", str(tmp_path / "missing"), "--cors-allow-origin",
                           "https://a.example,app.example")
    assert code == 1 and err.count("\n") == 1 and "CORS origin 'app.example' must be scheme://host" in err


def test_attention_writes_the_viewer_page(run_cli, tmp_path, tiny_model_dir):
    output = tmp_path / "views" / "view.html"
    code, out, _ = run_cli("attention", "--model", str(tiny_model_dir), "The cat sat.", "--pair",
                           "It slept.", "--output", str(output))
    assert code == 0 and "2 layers x 4 heads over 10 tokens" in out
    page = output.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    data = json.loads(page.split('id="attention-data">')[1].split("</script>")[0])
    assert data["tokens"][:3] == ["[CLS]", "the", "cat"] and data["segment_b_start"] == 6
    assert [p.name for p in output.parent.iterdir()] == ["view.html"]  # no temporary file left behind


def test_attention_truncates_to_max_length(run_cli, tmp_path, tiny_model_dir):
    output = tmp_path / "view.html"
    code, out, _ = run_cli("attention", "-m", str(tiny_model_dir), "word " * 50, "-o", str(output),
                           "--max-length", "12")
    assert code == 0 and "over 12 tokens" in out


@pytest.mark.parametrize("argv, message", [
    (["hello", "--output", "view.txt"], "must be an .html file"),
    (["  ", "--output", "view.html"], "the text is empty"),
    (["hello", "--pair", " ", "--output", "view.html"], "the pair is empty"),
    (["hello", "--output", "view.html", "--model", "/nonexistent/model"], "no such model directory"),
])
def test_attention_errors_are_one_line(run_cli, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("attention", *argv)
    assert code == 1 and err.count("\n") == 1 and message in err and err.startswith("bertforge: error:")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["embed", "similarity", "predict", "evaluate", "serve"])
@pytest.mark.parametrize("device, message", [
    ("banana", "--device 'banana' is not a device; use cpu, cuda, cuda:N or mps"),
    ("cuda:7", "--device 'cuda:7': this machine has "),  # no CUDA GPU, or fewer than 8
    ("mps", "--device 'mps': MPS (an Apple GPU) is not available on this machine (use cpu)")])
def test_device_is_checked_with_one_line(run_cli, tmp_path, command, device, message):
    available = torch.cuda.device_count() > 7 if device.startswith("cuda") else torch.backends.mps.is_available()
    if device != "banana" and available:
        pytest.skip("this machine has that device")
    (tmp_path / "texts.txt").write_text("a cat\na dog\n")
    inputs = {"embed": ["--input", str(tmp_path / "texts.txt"), "--output", str(tmp_path / "v.npy")],
              "similarity": ["a cat", "a dog"], "predict": ["--text", "a cat"],
              "evaluate": ["--data", str(tmp_path / "texts.txt")], "serve": ["--port", "0"]}[command]
    code, _, err = run_cli(command, "--model", "default", *inputs, "--device", device)
    assert code == 1 and err.count("\n") == 1 and f"--device {device}" in err.replace("'", "") and message in err


def test_every_server_setting_has_its_flag():
    """ServeSettings is the source of truth for `bertforge serve`'s flags: each field is a flag (the API key and CORS
    origins have their own, which read the environment or split commas)."""
    from bertforge.cli.serve import FLAGS

    own_flags = {"api_key", "cors_allow_origins"}
    fields = {field.name for field in dataclasses.fields(ServeSettings)}
    assert {field for field, _, _ in FLAGS.values()} == fields - own_flags


def test_json_output_writes_every_log_line_as_json(tiny_model_dir):
    """--json-output (text-embeddings-inference's flag): the start line, uvicorn's own warnings (a request that is
    not HTTP) and everything else on stderr are JSON objects, one a line."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bertforge", "--threads", "1", "serve", "--model", str(tiny_model_dir),
         "--port", str(port), "--json-output"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            connection.recv(1024)
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    records = [json.loads(line) for line in err.splitlines()]
    assert all({"timestamp", "level", "target", "message"} <= record.keys() for record in records)
    assert any(record["target"] == "bertforge.progress" and record["message"].startswith("serving ")
               and f"http://127.0.0.1:{port}" in record["message"] for record in records)
    assert any(record["target"].startswith("uvicorn") and record["level"] == "WARNING" for record in records)
    assert records[-1]["message"] == "interrupted" and records[-1]["level"] == "WARNING"
    # A user's error, before the model loads: one JSON line too.
    failed = subprocess.run([sys.executable, "-m", "bertforge", "serve", "--model", str(tiny_model_dir / "missing"),
                             "--port", "0", "--json-output"], capture_output=True, text=True, timeout=120)
    (record,) = [json.loads(line) for line in failed.stderr.splitlines()]
    assert failed.returncode == 1 and record["level"] == "ERROR" and "no such model directory" in record["message"]
    failed = subprocess.run([sys.executable, "-m", "bertforge", "serve", "--model", str(tiny_model_dir), "--port",
                             "0", "--json-output", "--default-prompt", "a", "--default-prompt-name", "b"],
                            capture_output=True, text=True, timeout=120)
    (record,) = [json.loads(line) for line in failed.stderr.splitlines()]
    assert failed.returncode == 1 and "give one default prompt" in record["message"]


def test_a_failures_traceback_is_one_json_line():
    import logging

    from bertforge.cli.json_log import JsonLines

    try:
        raise ValueError("the model's head\nsaid no")
    except ValueError:
        record = logging.LogRecord("bertforge", logging.ERROR, __file__, 1, "POST %s failed", ("/embed",),
                                   sys.exc_info())
    line = JsonLines().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "ERROR" and parsed["message"] == "POST /embed failed" and parsed["target"] == "bertforge"
    assert parsed["error"].startswith("Traceback") and "ValueError: the model's head\nsaid no" in parsed["error"]
    assert parsed["timestamp"].endswith("+00:00")


def test_text_embeddings_inferences_command_line_is_understood():
    """A TEI container's arguments start this server too: its spellings set the same settings (and stay out of the
    help, which shows bertforge's)."""
    from bertforge.cli.main import build_parser

    tei = build_parser().parse_args(
        ["serve", "--model-id", "/models/bge", "--hostname", "0.0.0.0", "--port", "8080", "--max-client-batch-size",
         "16", "--max-batch-requests", "8", "--max-batch-tokens", "4096", "--payload-limit", "2000000",
         "--auto-truncate", "--pooling", "cls", "--served-model-name", "bge", "--json-output",
         "--max-concurrent-requests", "64"])
    ours = build_parser().parse_args(
        ["serve", "--model", "/models/bge", "--host", "0.0.0.0", "--port", "8080", "--max-texts", "16",
         "--max-batch-size", "8", "--max-batch-tokens", "4096", "--max-body-bytes", "2000000", "--long-text",
         "truncate", "--pooling", "cls", "--served-model-name", "bge", "--json-output",
         "--max-concurrent-requests", "64"])
    assert vars(tei) == vars(ours)
    assert (tei.model, tei.host, tei.max_texts, tei.max_batch_size, tei.long_text) == (
        "/models/bge", "0.0.0.0", 16, 8, "truncate")
    shown = build_parser().parse_args(["serve"])  # without them, the defaults
    assert (shown.model, shown.host, shown.long_text) == ("default", "127.0.0.1", None)


# text-embeddings-inference's environment variables (clap's `env` of each flag), bertforge's own key and DTYPE
TEI_ENVIRONMENT = ("MODEL_ID", "PORT", "HOSTNAME", "SERVED_MODEL_NAME", "POOLING", "MAX_CONCURRENT_REQUESTS",
                   "MAX_BATCH_TOKENS", "MAX_BATCH_REQUESTS", "MAX_CLIENT_BATCH_SIZE", "AUTO_TRUNCATE",
                   "DEFAULT_PROMPT_NAME", "DEFAULT_PROMPT", "PAYLOAD_LIMIT", "API_KEY", "BERTFORGE_API_KEY",
                   "JSON_OUTPUT", "CORS_ALLOW_ORIGIN", "DTYPE")


@pytest.fixture
def served(monkeypatch):
    """What `bertforge serve` would serve, recorded instead of loading a model, in an environment without TEI's
    variables (the test sets those it means); JSON logging is recorded, not switched on for the whole run."""
    for variable in TEI_ENVIRONMENT:
        monkeypatch.delenv(variable, raising=False)
    calls = []
    monkeypatch.setattr("bertforge.inference.serve.app.serve",
                        lambda model, **options: calls.append({"model": model, **options}))
    monkeypatch.setattr("bertforge.cli.serve.log_as_json", lambda: calls.append("json"))
    return calls


def test_text_embeddings_inferences_environment_variables_set_the_flags(run_cli, served, monkeypatch, caplog):
    """A TEI deployment's variables (`docker run -e`, a Kubernetes manifest) set what its flags would; HOSTNAME, which
    every shell sets to the machine's name, is not read."""
    environment = {"MODEL_ID": "/models/bge", "PORT": "8080", "HOSTNAME": "build-box-7", "SERVED_MODEL_NAME": "bge",
                   "POOLING": "cls", "MAX_CONCURRENT_REQUESTS": "7", "MAX_BATCH_TOKENS": "4096",
                   "MAX_BATCH_REQUESTS": "8", "MAX_CLIENT_BATCH_SIZE": "16", "AUTO_TRUNCATE": "false",
                   "DEFAULT_PROMPT": "query: ", "PAYLOAD_LIMIT": "2000000", "API_KEY": "s3cret", "JSON_OUTPUT": "true",
                   "CORS_ALLOW_ORIGIN": "https://a.example,https://b.example"}
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    with caplog.at_level("INFO", logger="bertforge.progress"):
        code, _, err = run_cli("serve")
    assert code == 0, err
    json_output, call = served
    settings = call["settings"]
    assert json_output == "json" and call["json_logs"] is True
    assert (call["model"], call["host"], call["port"]) == ("/models/bge", "127.0.0.1", 8080)
    assert (settings.served_model_name, settings.pooling, settings.max_concurrent_requests, settings.max_batch_tokens,
            settings.max_batch_size, settings.max_texts, settings.long_text, settings.default_prompt,
            settings.max_body_bytes, settings.api_key, settings.cors_allow_origins) == (
        "bge", "cls", 7, 4096, 8, 16, "refuse", "query: ", 2_000_000, "s3cret", ("https://a.example", "https://b.example"))
    read = next(record.getMessage() for record in caplog.records if "environment variables" in record.getMessage())
    assert "MODEL_ID" in read and "API_KEY" in read and "HOSTNAME" not in read and "s3cret" not in read
    monkeypatch.setenv("AUTO_TRUNCATE", "true")
    served.clear()
    assert run_cli("serve")[0] == 0 and served[1]["settings"].long_text == "truncate"


def test_the_command_line_wins_over_the_environment(run_cli, served, monkeypatch):
    for variable, value in {"MODEL_ID": "/models/bge", "PORT": "8080", "MAX_CLIENT_BATCH_SIZE": "16",
                            "AUTO_TRUNCATE": "true", "DEFAULT_PROMPT": "query: ", "API_KEY": "theirs",
                            "BERTFORGE_API_KEY": "ours", "MAX_CONCURRENT_REQUESTS": "7"}.items():
        monkeypatch.setenv(variable, value)
    code, _, err = run_cli("serve", "--model", "default", "--port", "0", "--max-client-batch-size", "3",
                           "--long-text", "refuse", "--default-prompt-name", "passage",
                           "--max-concurrent-requests", "2")
    assert code == 0, err
    (call,) = served
    settings = call["settings"]
    assert (call["model"], call["port"], settings.max_texts, settings.long_text) == ("default", 0, 3, "refuse")
    # the command line's prompt, by name, leaves DEFAULT_PROMPT unread rather than in conflict with it
    assert (settings.default_prompt_name, settings.default_prompt) == ("passage", None)
    assert settings.max_concurrent_requests == 2
    assert settings.api_key == "ours"  # bertforge's own variable before TEI's


@pytest.mark.parametrize("variable, value, message", [
    ("MAX_CLIENT_BATCH_SIZE", "abc", "the environment variable MAX_CLIENT_BATCH_SIZE (--max-texts) must be a whole "
                                     "number, got abc"),
    ("MAX_CONCURRENT_REQUESTS", "0", "MAX_CONCURRENT_REQUESTS (--max-concurrent-requests) must be at least 1, got 0"),
    ("PORT", "70000", "the environment variable PORT (--port) must be a port number from 0 to 65535, got 70000"),
    ("AUTO_TRUNCATE", "maybe", "the environment variable AUTO_TRUNCATE (--auto-truncate) must be true or false, "
                               "got maybe"),
    ("POOLING", "median", "the environment variable POOLING (--pooling) must be one of cls, mean, max"),
    ("MAX_BATCH_TOKENS", "", "the environment variable MAX_BATCH_TOKENS (--max-batch-tokens) is empty"),
    ("API_KEY", " ", "the environment variable API_KEY is empty"),
])
def test_a_bad_environment_variable_is_one_line_naming_it(run_cli, served, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    code, _, err = run_cli("serve")
    assert code == 1 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not served  # refused before the model loads


def test_tei_variables_bertforge_has_no_use_for_are_ignored_but_dtype(run_cli, served, monkeypatch, caplog):
    for variable, value in {"REVISION": "refs/pr/2", "TOKENIZATION_WORKERS": "x", "HF_TOKEN": "hf_x",
                            "UDS_PATH": "/tmp/x", "PROMETHEUS_PORT": "none", "OTLP_ENDPOINT": "http://x:4317"}.items():
        monkeypatch.setenv(variable, value)
    assert run_cli("serve")[0] == 0 and served[0]["settings"] == ServeSettings()
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
    monkeypatch.setenv("DTYPE", "float16")  # a GPU deployment's memory and speed: bertforge has no float16
    assert run_cli("serve")[0] == 0
    (warning,) = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert "DTYPE=float16" in warning and "--precision fp32" in warning
