"""The command as shells, scripts and containers run it: a locale that isn't UTF-8, streams closed or cut short,
"-" for standard input and output, inputs nested too deeply to read. Real processes, as an operator starts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest


def bertforge(*argv: str, **options) -> subprocess.CompletedProcess:
    options = {"capture_output": True, **options} if "stdout" not in options else options
    return subprocess.run([sys.executable, "-m", "bertforge", *argv], timeout=300, **options)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_locale_that_is_not_utf8_still_gets_the_text(encoding):
    """PYTHONIOENCODING=ascii (or a C locale without Python's UTF-8 mode) ended in UnicodeEncodeError's traceback at
    the first accent or CJK character printed: the output is UTF-8 whatever the locale."""
    result = bertforge("tokenize", "--json", "café 東京",
                       env={**os.environ, "PYTHONIOENCODING": encoding})
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout.decode("utf-8"))
    assert [row["token"] for row in rows] == ["[CLS]", "cafe", "東", "京", "[SEP]"]


def test_closed_streams_are_one_line_errors():
    """`>&-` and `<&-`: Python's sys.stdout or sys.stdin is None, and the command ended in AttributeError's
    traceback; as for any Unix tool, using a closed stream is an error that names it."""
    closed_out = bertforge("tokenize", "hello", preexec_fn=lambda: os.close(1))
    assert closed_out.returncode == 1
    assert closed_out.stderr.decode().strip() == ("bertforge: error: standard output: closed (the command started "
                                                  "with it closed: >&- or <&-)")
    closed_in = bertforge("tokenize", "-", preexec_fn=lambda: os.close(0))
    assert closed_in.returncode == 1 and closed_in.stderr.decode().count("\n") == 1
    assert "standard input: closed" in closed_in.stderr.decode()


def test_a_reader_that_leaves_early_ends_the_command_with_141(tmp_path, sst2_dev):
    """`bertforge embed --output - | head -c 10`: the one large write came back short without an error, the rest
    was dropped, and the command said it wrote every vector, exit status 0."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(text for text, _ in sst2_dev[:200]) + "\n", encoding="utf-8")
    process = subprocess.Popen([sys.executable, "-m", "bertforge", "embed", "--input", str(texts), "--output", "-"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.read(10) == b'{"text": "'
    process.stdout.close()
    _, errors = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGPIPE and b"wrote" not in errors


def test_a_dash_reads_the_text_from_standard_input(tmp_path, tiny_model_dir):
    """explain --text -, attention -: the README's "-" for standard input, where they explained or drew the text
    "-"; explain --output - prints the JSON."""
    explained = bertforge("explain", "--text", "-", "--pair", "a great movie", "--output", "-",
                          input=b"a gripping film\n")
    assert explained.returncode == 0, explained.stderr
    written = json.loads(explained.stdout)
    assert written["texts"] == ["a gripping film", "a great movie"] and written["faithfulness"] is not None
    page = tmp_path / "attention.html"
    drawn = bertforge("attention", "-", "--model", str(tiny_model_dir), "--output", str(page),
                      input=b"the cat sat\n")
    assert drawn.returncode == 0 and "over 5 tokens" in drawn.stdout.decode()  # [CLS] the cat sat [SEP]
    both = bertforge("explain", "--text", "-", "--pair", "-", input=b"x\n")
    assert both.returncode == 1 and "only one text can be read from standard input" in both.stderr.decode()


def test_json_nested_too_deeply_is_named_not_a_traceback(tmp_path, run_cli, tiny_model_dir):
    """json.loads recurses per level: a value nested 100,000 levels deep in a data file or a model's config ended in
    RecursionError's traceback."""
    nested = "[" * 100_000 + "]" * 100_000
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "fine", "label": 0}\n{"text": ' + nested + ', "label": 1}\n', encoding="utf-8")
    code, _, errors = run_cli("finetune", "--model", tiny_model_dir, "--train", data, "--output", tmp_path / "out")
    assert code == 1 and errors.strip() == f"bertforge: error: {data}, line 2: a JSON value nested too deeply to read"
    model = tmp_path / "model"
    model.mkdir()
    for name in os.listdir(tiny_model_dir):
        (model / name).symlink_to(tiny_model_dir / name)
    (model / "tokenizer_config.json").unlink()
    (model / "tokenizer_config.json").write_text('{"x": ' + nested + "}", encoding="utf-8")
    code, _, errors = run_cli("tokenize", "--model", model, "hello")
    assert code == 1 and errors.count("\n") == 1 and "nested too deeply" in errors, errors


def test_a_model_of_few_positions_embeds_a_long_line(tmp_path, run_cli, tiny_model_dir):
    """A model of 64 positions with a tokenizer that says 512: `embed` failed on the first long line ("sequence
    length 302 exceeds max_position_embeddings"), where the Python API and the server cut it at the model's
    positions."""
    line = tmp_path / "long.txt"
    line.write_text(" ".join(["word"] * 300) + "\n", encoding="utf-8")
    code, _, errors = run_cli("embed", "--model", tiny_model_dir, "--input", line, "--output", tmp_path / "out.npy")
    assert code == 0, errors
    code, _, errors = run_cli("embed", "--model", tiny_model_dir, "--input", line, "--level", "token",
                              "--output", tmp_path / "tokens.jsonl")
    assert code == 0, errors
    assert len(json.loads((tmp_path / "tokens.jsonl").read_text())["tokens"]) == 64 - 2


def test_help_and_version_written_to_a_full_disk_fail():
    """argparse drops a failed write of its --help and --version: exit status 0 and nothing printed, where any Unix
    tool says so."""
    for flags in (["--help"], ["--version"], ["embed", "--help"]):
        with open("/dev/full", "w") as full:
            result = bertforge(*flags, stdout=full, stderr=subprocess.PIPE)
        assert result.returncode == 1, flags
        assert result.stderr.decode() == "bertforge: error: standard output: No space left on device\n"


@pytest.mark.parametrize("argv", [["tokenize", "hello"], ["tokenize", "word " * 5000],
                                  ["embed", "--input", "-", "--output", "-"]])
def test_output_to_a_full_disk_names_standard_output(argv):
    """A command's own output to a full disk said 'No space left on device', naming nothing, where a write to a file
    it opened names the file; small outputs (flushed at the end) and large ones (flushed as they are printed)."""
    with open("/dev/full", "w") as full:
        result = bertforge(*argv, input=b"A sentence to embed.\n", stdout=full, stderr=subprocess.PIPE)
    assert result.returncode == 1, argv
    assert result.stderr.decode() == "bertforge: error: standard output: No space left on device\n"


@pytest.mark.parametrize("listed", ["'prepare', 'train', 'eval'", "prepare, train, eval"])
def test_a_mistyped_choice_gets_the_nearest_in_either_of_pythons_wordings(listed, capsys):
    """Python 3.11 quotes argparse's choices in its message, later versions may not: either way the nearest one."""
    from bertforge.cli.main import OneLineParser

    with pytest.raises(SystemExit):
        OneLineParser(prog="bertforge pretrain").error(f"argument STEP: invalid choice: 'trian' (choose from {listed})")
    assert "did you mean train?" in capsys.readouterr().err
