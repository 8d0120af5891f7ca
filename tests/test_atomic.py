"""Atomic writes: a save killed half way leaves the old file whole and a temporary file that the next save into
the folder removes, while the temporary file of a save still running (here, or on another host) stays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bertforge.atomic import atomic_path, write_text_atomic

SRC = Path(__file__).resolve().parents[1] / "src"

# A save that writes half its file and is then killed (SIGKILL: no `finally` runs), or that waits to be told to
# finish; the old-style names of a user's own files must survive the cleaning.
KILLED_SAVE = """
import os, signal, sys
from bertforge.atomic import atomic_path
with atomic_path(sys.argv[1]) as temporary:
    temporary.write_bytes(b"half a model")
    os.kill(os.getpid(), signal.SIGKILL)
"""
SLOW_SAVE = """
import sys
from bertforge.atomic import atomic_path
with atomic_path(sys.argv[1]) as temporary:
    temporary.write_text("the new weights")
    print("writing", flush=True)
    sys.stdin.readline()
"""


def python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, "PYTHONPATH": str(SRC)},
                            text=True, **kwargs)


def temporaries(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir() if ".tmp-" in path.name}


def test_the_next_save_removes_what_killed_saves_left_and_keeps_a_live_writers_file(tmp_path):
    model = tmp_path / "model.safetensors"
    model.write_text("the old weights")
    left = set()
    for _ in range(2):  # each killed save starts by removing what the one before it left
        killed = python(KILLED_SAVE, str(model))
        assert killed.wait() == -9
        orphans = temporaries(tmp_path)
        assert len(orphans) == 1 and orphans != left and model.read_text() == "the old weights"
        left = orphans

    live = python(SLOW_SAVE, str(tmp_path / "other.bin"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert live.stdout.readline() == "writing\n"
    live_file = temporaries(tmp_path) - orphans
    assert len(live_file) == 1
    # A save on another machine sharing this folder: its process can't be looked up from here, so it stays.
    elsewhere = f".model.safetensors.tmp-{killed.pid}-another-host-abc123"
    (tmp_path / elsewhere).write_text("someone else's save")
    (tmp_path / ".notes.tmp").write_text("the user's own file")

    write_text_atomic(tmp_path / "config.json", "{}")  # the next save into the folder, of any file
    assert temporaries(tmp_path) == live_file | {elsewhere}
    assert (tmp_path / ".notes.tmp").read_text() == "the user's own file"

    live.communicate("done\n")
    assert live.wait() == 0 and (tmp_path / "other.bin").read_text() == "the new weights"
    assert temporaries(tmp_path) == {elsewhere}


def test_a_failed_save_keeps_the_old_file_and_leaves_nothing(tmp_path):
    target = tmp_path / "config.json"
    target.write_text("old")
    try:
        with atomic_path(target) as temporary:
            temporary.write_text("half")
            raise ValueError("the writer failed")
    except ValueError:
        pass
    assert target.read_text() == "old" and temporaries(tmp_path) == set()
