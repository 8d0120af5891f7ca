"""Atomic writes: a save killed half way leaves the old file whole and a temporary file that the next save into
the folder removes, while the temporary file of a save still running (here, or on another host) stays."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertforge.atomic import atomic_path, save_array, write_text_atomic

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


def test_a_full_disk_names_the_file_asked_for_and_keeps_the_old_one(tmp_path, file_size_limit):
    """A write that fails for want of room names no file (the OS's error comes from write(), not open()), and the
    temporary file's name means nothing to the user: the error names the file they asked for."""
    target = tmp_path / "predictions.jsonl"
    target.write_text("the old predictions")
    with file_size_limit(4096), pytest.raises(OSError) as failure:
        write_text_atomic(target, "x" * 10_000)
    assert (failure.value.errno, failure.value.filename) == (errno.EFBIG, str(target))
    assert target.read_text() == "the old predictions" and temporaries(tmp_path) == set()


def test_an_array_cut_short_by_a_full_disk_is_an_error(tmp_path, file_size_limit):
    """numpy writes a real file through C's stdio, and a failure of its last flush went unreported: np.save
    returned over a file a few rows short. save_array's writes go through Python's file, which raises."""
    target = tmp_path / "vectors.npy"
    np.save(target, np.zeros(3))
    rows = np.arange(300 * 128, dtype=np.float32).reshape(300, 128)
    size = 128 + rows.nbytes  # np.save's header, then the rows
    for limit in (4096, size // 2, size - 1000):  # the last fails in the final flush of the file
        with file_size_limit(limit), pytest.raises(OSError) as failure:
            save_array(target, rows)
        assert (failure.value.errno, failure.value.filename) == (errno.EFBIG, str(target))
        assert np.array_equal(np.load(target), np.zeros(3)) and temporaries(tmp_path) == set()
    with file_size_limit(size):
        save_array(target, rows)
    assert np.array_equal(np.load(target), rows)


def test_an_error_a_library_made_up_says_the_write_stopped_short(tmp_path):
    target = tmp_path / "vectors.npy"
    with pytest.raises(OSError) as failure, atomic_path(target):
        raise OSError("96000 requested and 992 written")  # numpy's, without an error number
    assert failure.value.filename == str(target)
    assert failure.value.strerror == "can't write all of it (96000 requested and 992 written)"


def test_a_fifo_a_device_and_a_link_are_written_through_not_replaced(tmp_path, run_cli):
    """Renaming a finished file over the output put a plain file in place of a FIFO (its reader got nothing) or a
    device (as root, `--output /dev/null` would have replaced /dev/null); a link lost its link. Each is now written
    as `>` writes it: a FIFO's reader gets the file, a device stays a device, a link keeps pointing at its target,
    which gets the new file."""
    import stat
    import threading

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog sat on the log\n", encoding="utf-8")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    assert run_cli("vocab", "--corpus", str(corpus), "--vocab-size", "120", "--output", str(fifo))[0] == 0
    reader.join(30)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and received[0].startswith(b"[PAD]\n[UNK]\n")
    (tmp_path / "target.txt").write_text("old", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to("target.txt")
    assert run_cli("vocab", "--corpus", str(corpus), "--vocab-size", "120", "--output",
                   str(tmp_path / "link.txt"))[0] == 0
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "target.txt").read_text().startswith("[PAD]")
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's device, here
    except PermissionError:
        pytest.skip("making a device node needs root")
    for write in (lambda path: write_text_atomic(path, "text"), lambda path: save_array(path, np.zeros(3))):
        write(tmp_path / "null")
        assert stat.S_ISCHR((tmp_path / "null").stat().st_mode)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.txt", "fifo", "link.txt", "null",
                                                                "target.txt"]


def test_files_under_dev_shm_are_still_replaced_whole_and_a_link_loop_is_named(tmp_path):
    """Only a process's stream names (/dev/fd/N, /dev/stdout, /proc/...) and what isn't a regular file are written
    in place: a file on /dev/shm (a tmpfs for fast scratch) is replaced whole, as anywhere else. A link to itself
    is an OSError naming it (it was a RuntimeError's traceback)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    path = shm / f"bertforge-test-{os.getpid()}.txt"
    path.write_text("old", encoding="utf-8")
    try:
        with pytest.raises(RuntimeError, match="stopped"):
            with atomic_path(path) as temporary:
                temporary.write_text("half-writ", encoding="utf-8")
                raise RuntimeError("stopped")
        assert path.read_text(encoding="utf-8") == "old"
    finally:
        path.unlink()
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    with pytest.raises(OSError) as raised:
        write_text_atomic(loop, "{}")
    assert raised.value.errno == errno.ELOOP and raised.value.filename == str(loop)
