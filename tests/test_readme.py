"""The README's examples run as written: Python blocks print what the README shows, CLI lines succeed."""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def expected_output(code: str) -> list[str]:
    """The `# ...` comment lines that directly follow a print(...) call (possibly several lines long)."""
    lines, expected, after_print = code.splitlines(), [], False
    for line in lines:
        if line.startswith("print("):
            after_print = True
        elif after_print and line.startswith("# "):
            expected.append(line[2:])
        elif not line.startswith(" "):
            after_print = False
    return expected


@pytest.mark.parametrize("code", blocks("python"), ids=lambda code: code.splitlines()[1][:40])
def test_python_example(code, tmp_path):
    code = code.replace("/tmp/", f"{tmp_path}/")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {})
    assert printed.getvalue().splitlines() == expected_output(code)


def cli_lines() -> list[str]:
    return [line.split("  #")[0].strip() for block in blocks("bash") for line in block.splitlines()
            if line.startswith("bertforge ")]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One folder for all CLI lines, run in README order: later lines read what earlier ones wrote."""
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("line", cli_lines())
def test_cli_example(line, scratch, run_cli, monkeypatch):
    """Through the entry point in this process (a new process per line would import torch 28 times; the console
    script itself is tested in tests/cli/test_cli.py)."""
    monkeypatch.chdir(README.parent)
    code, printed, error = run_cli(*shlex.split(line.replace("/tmp/", f"{scratch}/"))[1:])
    assert code == 0, error
    assert printed.strip()
