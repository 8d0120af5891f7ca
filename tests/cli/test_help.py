"""Every subcommand's --help shows the default of every option that takes a value."""

import argparse

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
