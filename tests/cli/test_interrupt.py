"""Ctrl-C at any moment of the `bertforge` command ends with one line and exit status 130, including while torch
is still loading (the command's entry point imports the package inside the guard)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

COMMAND = Path(sys.executable).with_name("bertforge")


@pytest.mark.skipif(not COMMAND.is_file(), reason="the bertforge command is not installed beside this Python")
@pytest.mark.parametrize("delay", [0.2, 0.8, 4.0])
def test_ctrl_c_ends_with_one_line(tmp_path, data_dir, delay):
    """0.2 and 0.8 s land while the package (and torch) are being imported (the interpreter itself has its
    handler by then), 4 s in the work itself."""
    lines = (data_dir / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:20001]
    (tmp_path / "texts.txt").write_text("\n".join(line.split("\t")[0] for line in lines) + "\n", encoding="utf-8")
    process = subprocess.Popen([str(COMMAND), "--threads", "1", "embed", "--model", "default", "-i",
                                str(tmp_path / "texts.txt"), "-o", str(tmp_path / "vectors.npy")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err.decode()
    # The progress bar may have started (stderr); what ends it is the one line, and no traceback.
    assert err.decode().splitlines()[-1] == "bertforge: interrupted" and "Traceback" not in err.decode()
    assert not (tmp_path / "vectors.npy").exists()


def test_ctrl_c_while_the_command_line_is_read_ends_with_one_line(monkeypatch, capsys):
    """Reading the command line imports what the commands' defaults come from (seconds on a loaded machine): a
    Ctrl-C there, the 4 s case above on a busy machine, ended in a traceback."""
    from bertforge.cli import main as cli_main

    def building(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", building)
    assert cli_main.main(["tokenize", "a text"]) == 130
    assert capsys.readouterr().err == "bertforge: interrupted\n"
