"""Each subcommand end to end on small inputs, and the one-line errors a user can cause."""

import errno
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from bertforge.cli.main import main
from bertforge.inference import extract_features


def test_tokenize_table(run_cli):
    code, out, _ = run_cli("tokenize", "Unaffable café!", "--pair", "Yes.")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["0", "[CLS]", "101", "0"]
    assert any(line.split()[1] == "cafe" and line.split()[-1] == "café" for line in lines)
    assert lines[-1].split()[1:4] == ["[SEP]", "102", "1"]


def test_tokenize_json_matches_the_tokenizer(run_cli, tokenizer):
    code, out, _ = run_cli("tokenize", "Paris is in France.", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [row["id"] for row in rows] == tokenizer("Paris is in France.")["input_ids"]
    assert rows[1] == {"token": "paris", "id": rows[1]["id"], "segment": 0, "start": 0, "end": 5, "word": 0}


@pytest.fixture
def lines_file(tmp_path, sst2_dev):
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(text for text, _ in sst2_dev[:7]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("pool", ["cls", "mean", "max"])
def test_embed_npy_matches_the_library(run_cli, tmp_path, lines_file, minilm, tokenizer, sst2_dev, pool):
    output = tmp_path / "vectors.npy"
    code, out, _ = run_cli("embed", "--input", str(lines_file), "--output", str(output), "--pool", pool,
                           "--batch-size", "3")
    assert code == 0 and "wrote 7 vectors of size 384" in out
    vectors = np.load(output)
    expected = extract_features(minilm, tokenizer, [text for text, _ in sst2_dev[:7]], pooling=pool)
    assert vectors.shape == (7, 384)
    assert np.abs(vectors - expected.numpy()).max() < 1e-5


def test_embed_jsonl(run_cli, tmp_path, lines_file):
    output = tmp_path / "vectors.jsonl"
    assert run_cli("embed", "-i", str(lines_file), "-o", str(output), "--normalize")[0] == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 7 and len(records[0]["embedding"]) == 384
    assert abs(np.linalg.norm(records[0]["embedding"]) - 1) < 1e-5


def test_similarity_table(run_cli):
    code, out, _ = run_cli("similarity", "A man plays guitar.", "Someone plays music.", "Stocks fell.")
    assert code == 0
    cells = [re.findall(r"-?\d\.\d\d\*?", row) for row in out.splitlines()[1:]]
    assert len(cells) == 3 and all(len(row) == 3 for row in cells)
    assert cells[0][1].endswith("*") and cells[1][0].endswith("*")  # the guitar sentences match each other


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "bertforge", "tokenize", "hello world", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and json.loads(result.stdout)[1]["token"] == "hello"


def test_a_command_that_cannot_start_says_why_in_one_line(monkeypatch, capsys):
    """A full disk can stop the command before it starts: a library torch imports (dill) asks for a temporary
    folder at import, and Python finds none it can write. Here the import fails as it did then."""
    import bertforge_command

    class FullDisk:
        def find_spec(self, name, path=None, target=None):
            if name == "bertforge.cli.main":
                raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp', '/var/tmp']")

    monkeypatch.delitem(sys.modules, "bertforge.cli.main")
    monkeypatch.setattr(sys, "meta_path", [FullDisk(), *sys.meta_path])
    assert bertforge_command.main() == 1
    assert capsys.readouterr().err == ("bertforge: error: can't start: No usable temporary directory found in "
                                       "['/tmp', '/var/tmp']\n")


def broken_model(tmp_path, tiny_config, problem):
    from bertforge import BertModel
    directory = tmp_path / "model"
    BertModel(tiny_config).save_pretrained(directory)
    if problem == "config key":
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "is_decoder": True}))
    if problem == "checkpoint":
        (directory / "model.safetensors").write_bytes(b"garbage")
    return directory


@pytest.mark.parametrize("argv, message", [
    (["embed", "--input", "{tmp}/missing.txt", "--output", "{tmp}/v.npy"], r"missing.txt: no such file"),
    (["embed", "--input", "{tmp}/empty.txt", "--output", "{tmp}/v.npy"], r"empty.txt: the input is empty"),
    (["embed", "--input", "{tmp}/latin1.txt", "--output", "{tmp}/v.npy"], r"latin1.txt, line 2: not valid UTF-8"),
    (["embed", "--input", "{tmp}/empty.txt", "--output", "{tmp}/v.csv"], r"v.csv: unsupported output format"),
    (["embed", "--model", "{tmp}/nowhere", "--input", "{tmp}/ok.txt", "--output", "{tmp}/v.npy"],
     r"nowhere: no such model directory"),
    (["embed", "--model", "{tmp}/model", "--input", "{tmp}/ok.txt", "--output", "{tmp}/v.npy"],
     r"config.json: is_decoder=True is not supported"),
    (["tokenize", "--model", "{tmp}/model", "hi"], r"vocab"),
    (["similarity", "only one"], r"at least two sentences"),
])
def test_user_errors_are_one_line(run_cli, tmp_path, tiny_config, argv, message):
    (tmp_path / "empty.txt").write_text("\n \n")
    (tmp_path / "ok.txt").write_text("fine\n")
    (tmp_path / "latin1.txt").write_bytes(b"fine\ncaf\xe9\n")
    broken_model(tmp_path, tiny_config, "config key")
    code, out, err = run_cli(*[arg.format(tmp=tmp_path) for arg in argv])
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("bertforge: error: "), err
    assert re.search(message, err), err


def test_unreadable_checkpoint_is_one_line(run_cli, tmp_path, tiny_config):
    directory = broken_model(tmp_path, tiny_config, "checkpoint")
    (tmp_path / "ok.txt").write_text("fine\n")
    from bertforge.tokenizer import BertTokenizer
    BertTokenizer.from_pretrained("default").save_pretrained(directory)
    code, _, err = run_cli("embed", "--model", str(directory), "-i", str(tmp_path / "ok.txt"),
                           "-o", str(tmp_path / "v.npy"))
    assert code == 1 and "model.safetensors: unreadable safetensors file" in err and err.count("\n") == 1


def test_errors_from_a_subprocess_have_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bertforge", "embed", "-i", str(tmp_path / "nope.txt"),
                             "-o", str(tmp_path / "v.npy")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"bertforge: error: {tmp_path / 'nope.txt'}: no such file"


def test_embed_similar_ranks_lines_by_similarity(run_cli, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("The stock market fell.\nA man plays the guitar.\nA kitten sleeps.\n", encoding="utf-8")
    code, out, _ = run_cli("embed", "-i", str(lines), "--similar", "someone making music", "--top-k", "2")
    assert code == 0
    ranked = out.splitlines()
    assert len(ranked) == 2 and "line 2: A man plays the guitar." in ranked[0]
    # blank lines are no match for a query, and the lines ranked keep the file's numbers
    lines.write_text("The stock market fell.\n\n   \nA man plays the guitar.\nA kitten sleeps.\n", encoding="utf-8")
    code, out, _ = run_cli("embed", "-i", str(lines), "--similar", "someone making music")
    ranked = out.splitlines()
    assert code == 0 and len(ranked) == 3 and "line 4: A man plays the guitar." in ranked[0]
    assert {line.split("line ")[1].split(":")[0] for line in ranked} == {"1", "4", "5"}


def test_embed_word_level_jsonl(run_cli, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("Unaffable café owners!\n", encoding="utf-8")
    output = tmp_path / "words.jsonl"
    assert run_cli("embed", "-i", str(lines), "-o", str(output), "--level", "word")[0] == 0
    record = json.loads(output.read_text(encoding="utf-8"))
    assert record["tokens"] == ["Unaffable", "café", "owners", "!"]
    assert record["offsets"][1] == [10, 14] and len(record["embeddings"]) == 4


@pytest.mark.parametrize("argv, message", [
    (["embed", "-i", "{tmp}/ok.txt"], r"give --output FILE.npy\|FILE.jsonl, or --similar QUERY"),
    (["embed", "-i", "{tmp}/ok.txt", "--level", "token", "-o", "{tmp}/t.npy"], r"t.npy: token-level vectors vary"),
])
def test_embed_mode_errors(run_cli, tmp_path, argv, message):
    (tmp_path / "ok.txt").write_text("fine\n")
    code, _, err = run_cli(*[arg.format(tmp=tmp_path) for arg in argv])
    assert code == 1 and re.search(message, err) and err.count("\n") == 1


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and re.fullmatch(r"bertforge \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


def test_embed_progress_in_a_log_and_without(run_cli, tmp_path, sst2_dev):
    """A progress bar written into a log file (standard error not a terminal) was redrawn ten times a second, each
    redraw kept; there it is drawn at its start and end (and every 30 s between), and --no-progress draws none."""
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(sentence for sentence, _ in sst2_dev[:60]) + "\n", encoding="utf-8")
    code, _, log = run_cli("embed", "--input", lines, "--output", tmp_path / "out.npy", "--batch-size", "2")
    assert code == 0 and "embedding: 100%" in log and "30/30" in log
    assert log.count("embedding:") <= 3, log  # the first drawing, the last, and its end
    code, _, log = run_cli("embed", "--input", lines, "--output", tmp_path / "out.npy", "--batch-size", "2",
                           "--no-progress")
    assert code == 0 and log == ""
