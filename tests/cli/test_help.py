"""The command line's parser: every subcommand's --help shows the default of every option that takes a value, old
flag spellings still work, and an empty file or folder argument is refused by name."""

import argparse

import pytest

from bertforge.cli import main as cli_main
from bertforge.cli.arguments import path_text
from bertforge.cli.main import build_parser


def subcommand_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for `bertforge` and each subcommand, nested ones (pretrain train) included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from subcommand_parsers(subparser, (*path, name))


def test_every_option_with_a_value_shows_its_default():
    missing = []
    commands = list(subcommand_parsers(build_parser()))
    assert len(commands) > 15  # every subcommand is walked, pretrain's steps too
    for path, parser in commands:
        assert parser.format_help()  # renders
        formatter = parser._get_formatter()
        for action in parser._actions:
            takes_value = action.option_strings and action.nargs != 0 and not isinstance(
                action, (argparse._HelpAction, argparse._VersionAction))
            if not takes_value or action.required or action.help == argparse.SUPPRESS:
                continue
            shown = formatter._expand_help(action) if action.help else ""
            if "default" not in shown:
                missing.append(f"bertforge {' '.join(path)} {action.option_strings[0]}: {shown!r}")
    assert not missing, "\n".join(missing)


def test_old_flag_spellings_still_work():
    parser = build_parser()
    old = parser.parse_args(["pretrain", "train", "--config", "base", "--seq-len", "64", "--model-or-vocab", "v",
                             "--data", "d", "--output", "o"])
    new = parser.parse_args(["pretrain", "train", "--size", "base", "--max-length", "64", "--vocab", "v",
                             "--data", "d", "--output", "o"])
    assert (old.model, old.seq_len, old.tokenizer) == (new.model, new.seq_len, new.tokenizer) == ("base", 64, "v")
    prepare = parser.parse_args(["pretrain", "prepare", "--corpus", "c", "-o", "o", "--max-seq-length", "64",
                                 "--model-or-vocab", "v"])
    assert (prepare.max_length, prepare.vocab) == (64, "v")
    assert parser.parse_args(["pretrain", "eval", "--model", "m", "--data", "d", "--seq-len", "64"]).max_length == 64


# Where a file or folder argument lands (its dest), in every command; --size is a preset name or a config.json.
PATH_DESTINATIONS = {"model", "output", "input", "data", "train", "dev", "corpus", "teacher", "adapter",
                     "calibration", "config", "vocab", "tokenizer", "init_from", "run_dir"}


def path_actions() -> list[tuple[tuple[str, ...], argparse.Action]]:
    """(command words, action) of every file or folder argument."""
    return [(path, action) for path, parser in subcommand_parsers(build_parser()) for action in parser._actions
            if action.dest in PATH_DESTINATIONS and action.help != argparse.SUPPRESS]


def path_arguments() -> list[tuple[tuple[str, ...], str]]:
    """(command words, option string, or the metavar of a positional) of every file or folder argument."""
    return [(path, action.option_strings[0] if action.option_strings else action.metavar)
            for path, action in path_actions()]


def test_every_file_or_folder_argument_is_a_path():
    # Checked here, not while the cases below are collected: a miss is this test's failure, naming the argument.
    missing = [f"bertforge {' '.join(path)} {action.dest}" for path, action in path_actions()
               if action.type is not path_text]
    assert not missing, missing
    names = {name for _, name in path_arguments()}
    assert {"--model", "--output", "--input", "--data", "--train", "--dev", "--corpus", "--teacher", "--adapter",
            "--calibration", "--config", "--vocab", "--init-from", "RUN_DIR"} <= names


@pytest.mark.parametrize("words, name", path_arguments(),
                         ids=lambda value: "-".join(value) if isinstance(value, tuple) else value)
def test_an_empty_path_is_refused_by_name(tmp_path, monkeypatch, capsys, words, name):
    """What `--output "$OUT"` gives when OUT is unset. Before, some commands wrote to the current folder, printed
    instead of writing, or failed with a traceback."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli_main.main([*words, *([name] if name.startswith("-") else []), ""])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("\n") == 1 and f"argument {name}" in err and "the path is empty" in err, err
    assert not any(tmp_path.iterdir())
