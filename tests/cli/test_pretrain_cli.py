"""`bertforge pretrain train` and `pretrain eval` end to end on a small real corpus slice; one-line errors."""

import json

import pytest
import torch

from bertforge.cli.main import main


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a shared 2-core machine, spinning OpenMP threads make tiny steps 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(data_dir, tmp_path_factory):
    lines = (data_dir / "pretrain_en" / "inaugural.txt").read_text(encoding="utf-8").splitlines()[:600]
    folder = tmp_path_factory.mktemp("cli_corpus")
    (folder / "slice.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["pretrain", "prepare", "--corpus", str(folder / "slice.txt"), "-o", str(folder / "data"),
                 "--no-progress"]) == 0
    return folder / "data"


def train_args(corpus, output, *extra):
    return ["pretrain", "train", "--config", "tiny", "--data", str(corpus), "--output", str(output), "--steps", "4",
            "--batch-size", "4", "--seq-len", "32", "--log-every", "2", "--save-every", "2", "--holdout", "0.1",
            "--no-progress", *extra]


def test_train_then_eval(corpus, tmp_path, capsys):
    assert main(train_args(corpus, tmp_path / "model", "--objective", "mlm", "--masking", "whole_word")) == 0
    out = capsys.readouterr().out
    assert "trained 4 steps" in out and "perplexity" in out
    assert (tmp_path / "model" / "checkpoint" / "train_state.pt").is_file()
    assert main(["pretrain", "train", *train_args(corpus, tmp_path / "model")[2:], "--objective", "mlm",
                 "--masking", "whole_word", "--resume"]) == 0  # already finished: resumes at the end

    assert main(["pretrain", "eval", "--model", str(tmp_path / "model"), "--data", str(corpus),
                 "--batch-size", "4", "--max-batches", "2", "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    assert "loss" in out and "perplexity" in out and "accuracy" in out
    metrics = json.loads((tmp_path / "model" / "eval_results.json").read_text())
    assert set(metrics) >= {"loss", "perplexity", "accuracy"} and metrics["batches"] == 2


@pytest.mark.parametrize("change, message", [
    (["--data", "MISSING"], "no such folder"),
    (["--config", "huge"], "unknown model size 'huge'"),
    (["--vocab", "VOCAB"], "not the one"),
])
def test_errors_are_one_line(corpus, tmp_path, capsys, change, message):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    args = train_args(corpus, tmp_path / "out")
    flag, value = change
    value = {"MISSING": str(tmp_path / "missing"), "VOCAB": str(tmp_path / "vocab.txt")}.get(value, value)
    args = args + [flag, value] if flag not in args else \
        [value if i == args.index(flag) + 1 else arg for i, arg in enumerate(args)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge: error:") and message in err and "\n" not in err


def test_eval_of_an_encoder_without_masked_lm_head_is_one_line(corpus, tmp_path, capsys, minilm_dir):
    assert main(["pretrain", "eval", "--model", str(minilm_dir), "--data", str(corpus), "--max-batches", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge: error:") and "\n" not in err
