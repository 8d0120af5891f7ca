"""`bertforge vocab` end to end: a learnt vocab.txt that BertTokenizer loads, a summary, one-line errors."""


import pytest

from bertforge import BertTokenizer


@pytest.fixture
def corpus(tmp_path, data_dir):
    with open(data_dir / "pretrain_en" / "inaugural.txt", encoding="utf-8") as handle:
        lines = [line for _, line in zip(range(400), handle)]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_vocab_end_to_end(run_cli, tmp_path, corpus):
    output = tmp_path / "out" / "vocab.txt"
    code, out, _ = run_cli("vocab", "--corpus", str(corpus), "--vocab-size", "1200", "--output", str(output),
                           "--no-progress")
    assert code == 0
    assert f"wrote 1200 tokens to {output}" in out and "pieces per word" in out and "0.00% [UNK]" in out
    tokenizer = BertTokenizer(output)
    assert len(tokenizer.vocab) == 1200
    assert tokenizer.tokenize("The Constitution of the United States") == \
        ["the", "constitution", "of", "the", "united", "states"]


def test_vocab_onto_standard_output(run_cli, tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("vocab", "--corpus", str(corpus), "--vocab-size", "1200", "--output", "-",
                             "--no-progress")
    (tmp_path / "from_stdout.txt").write_text(out)
    assert code == 0 and "wrote 1200 tokens to -" in err and "pieces per word" in err
    assert len(BertTokenizer(tmp_path / "from_stdout.txt").vocab) == 1200 and not (tmp_path / "-").exists()


def test_vocab_errors_are_one_line(run_cli, tmp_path, corpus):
    code, _, err = run_cli("vocab", "--corpus", str(tmp_path / "nope.txt"), "--vocab-size", "500",
                           "--output", str(tmp_path / "vocab.txt"), "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "nope.txt: no such corpus file" in err
    code, _, err = run_cli("vocab", "--corpus", str(tmp_path / "nope.txt"), "--vocab-size", "500",
                           "--output", str(tmp_path / "vocab.txt"))  # no progress bar drawn before the error
    assert code == 1 and err.count("\n") == 1 and "nope.txt: no such corpus file" in err
    code, _, err = run_cli("vocab", "--corpus", str(corpus), "--vocab-size", "20", "--output",
                           str(tmp_path / "vocab.txt"), "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "vocab_size 20 is too small" in err
    assert not (tmp_path / "vocab.txt").exists()
