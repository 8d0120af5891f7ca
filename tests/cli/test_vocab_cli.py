"""`bertforge vocab` end to end: a learnt vocab.txt that BertTokenizer loads, a summary, one-line errors."""

import argparse
import sys

import pytest

from bertforge import BertforgeError, BertTokenizer
from bertforge.cli import main as cli_main
from bertforge.cli import vocab as vocab_command


def run_cli(capsys, *argv):
    """Through `bertforge vocab` once main.py registers it; until then through the module, as main would."""
    if "vocab" in cli_main.SUBCOMMANDS:
        code = cli_main.main(["vocab", *argv])
    else:
        parser = argparse.ArgumentParser(prog="bertforge vocab")
        vocab_command.add_arguments(parser)
        try:
            code = vocab_command.run(parser.parse_args(list(argv)))
        except BertforgeError as error:
            print(f"bertforge: error: {error}", file=sys.stderr)
            code = 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def corpus(tmp_path, data_dir):
    with open(data_dir / "pretrain_en" / "inaugural.txt", encoding="utf-8") as handle:
        lines = [line for _, line in zip(range(400), handle)]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_vocab_end_to_end(capsys, tmp_path, corpus):
    output = tmp_path / "out" / "vocab.txt"
    code, out, _ = run_cli(capsys, "--corpus", str(corpus), "--vocab-size", "1200", "--output", str(output),
                           "--no-progress")
    assert code == 0
    assert f"wrote 1200 tokens to {output}" in out and "pieces per word" in out and "0.00% [UNK]" in out
    tokenizer = BertTokenizer(output)
    assert len(tokenizer.vocab) == 1200
    assert tokenizer.tokenize("The Constitution of the United States") == \
        ["the", "constitution", "of", "the", "united", "states"]


def test_vocab_errors_are_one_line(capsys, tmp_path, corpus):
    code, _, err = run_cli(capsys, "--corpus", str(tmp_path / "nope.txt"), "--vocab-size", "500",
                           "--output", str(tmp_path / "vocab.txt"), "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "nope.txt: no such corpus file" in err
    code, _, err = run_cli(capsys, "--corpus", str(corpus), "--vocab-size", "20", "--output",
                           str(tmp_path / "vocab.txt"), "--no-progress")
    assert code == 1 and err.count("\n") == 1 and "vocab_size 20 is too small" in err
    assert not (tmp_path / "vocab.txt").exists()
