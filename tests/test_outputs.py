"""A run's staging folder is locked while the run writes into it: a second run into the same output, in another
process (the command started twice, or `--resume` given while the first still runs), is refused in one line
instead of deleting the first one's files or writing into them. The lock is the kernel's, so it ends with its
process: a killed run's folder resumes at once."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.errors import InputError
from bertforge.outputs import (
    check_not_in_use,
    check_output_dir,
    finish_staging,
    release_staging,
    staging_dir,
    start_staging,
)

SRC = Path(__file__).resolve().parents[1] / "src"

# A run that stages into argv[1], writes a file there, says so, then waits to be told to finish (or is killed).
RUN = """
import sys
from bertforge.outputs import finish_staging, start_staging
staging = start_staging(sys.argv[1])
(staging / "weights").write_text("the first run's")
print("writing", flush=True)
sys.stdin.readline()
finish_staging(sys.argv[1])
"""


def start_run(output: Path) -> subprocess.Popen:
    run = subprocess.Popen([sys.executable, "-c", RUN, str(output)], env={**os.environ, "PYTHONPATH": str(SRC)},
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert run.stdout.readline() == "writing\n"
    return run


def test_a_second_run_is_refused_while_the_first_writes_and_starts_once_it_ended(tmp_path):
    output = tmp_path / "model"
    first = start_run(output)
    for attempt in (lambda: check_output_dir(output), lambda: check_output_dir(output, overwrite=True),
                    lambda: start_staging(output), lambda: start_staging(output, keep=True)):
        with pytest.raises(InputError, match=f"^{output}: another run is writing into it"):
            attempt()
    assert (staging_dir(output) / "weights").read_text() == "the first run's"

    first.communicate("finish\n")
    assert first.wait() == 0 and (output / "weights").read_text() == "the first run's"
    check_output_dir(output, overwrite=True)
    staging = start_staging(output)
    (staging / "weights").write_text("the second run's")
    finish_staging(output)
    assert (output / "weights").read_text() == "the second run's" and not staging.exists()


def test_a_killed_runs_folder_is_free_to_resume(tmp_path):
    output = tmp_path / "model"
    first = start_run(output)
    first.send_signal(signal.SIGKILL)
    first.wait()
    staging = start_staging(output, keep=True)  # --resume: the killed run's files stay
    assert (staging / "weights").read_text() == "the first run's"
    release_staging(output)


def test_this_process_may_stage_into_an_output_again(tmp_path):
    """A library caller whose run failed tries again in the same process: its own lock is no obstacle."""
    output = tmp_path / "model"
    start_staging(output)
    check_output_dir(output)
    (start_staging(output) / "weights").write_text("the second try's")
    assert (start_staging(output, keep=True) / "weights").read_text() == "the second try's"
    finish_staging(output)
    assert (output / "weights").read_text() == "the second try's"


def test_under_torchrun_the_main_process_alone_looks_at_the_lock(tmp_path, monkeypatch):
    """Rank 0 writes the staging folder and holds its lock; another rank looking at the lock (a brief lock of its
    own) found it held, or collided with rank 0's own look, and a resumed two-process run failed now and then
    with "another run is writing into it". A stray WORLD_SIZE is no launch: the process looks, as a single one."""
    output = tmp_path / "model"
    staging = staging_dir(output)
    staging.mkdir(parents=True)
    held = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # rank 0's lock, or its look at that instant
    try:
        with pytest.raises(InputError, match="another run is writing into it"):
            check_not_in_use(output)
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(InputError, match="another run is writing into it"):
            check_output_dir(output)
        for name, value in {"RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
            monkeypatch.setenv(name, value)
        check_not_in_use(output)
        check_output_dir(output)
    finally:
        os.close(held)


def test_the_commands_refuse_an_output_another_run_writes(tiny_model_dir, inaugural_corpus, tmp_path, capsys):
    """`finetune` and `pretrain train` started twice into one output: the second deleted the first's staging folder,
    or, with `--resume` (which the first's checkpoint made it suggest) or `--overwrite`, trained into it beside the
    first: one log with every line twice, one model of two runs."""
    from bertforge.cli.main import main

    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a joy,pos\ndull,neg\n" * 4)
    output = tmp_path / "model"
    first = start_run(output)
    commands = [["finetune", "--model", tiny_model_dir, "--train", train, "--max-steps", "1", "--no-progress"],
                ["pretrain", "train", "--data", inaugural_corpus(50) / "data", "--steps", "1", "--no-progress"]]
    for command in commands:
        for extra in ([], ["--resume"], ["--overwrite"]):
            code = main([str(arg) for arg in [*command, "--output", output, *extra]])
            assert (code, capsys.readouterr().err) == (1, f"bertforge: error: {output}: another run is writing into "
                                                          "it (its staging folder is in use); wait for that run to "
                                                          "end, or choose another output\n")
    assert [path.name for path in staging_dir(output).iterdir()] == ["weights"]
    first.communicate("finish\n")
    assert first.wait() == 0
