"""Atomic file writes: a file is either its old self or completely new, never half written.

A save writes `.NAME.tmp-PID-HOST-XXXXXXXX` beside NAME and renames it over NAME when complete. A process killed
mid-save leaves that file behind (a base-size model: ~0.4 GB each time); the next save into the same folder
removes the ones whose writer, named by PID and host, is no longer running.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

logger = logging.getLogger("bertforge")

# mkstemp's random part is drawn from [a-z0-9_]; the host name may hold dashes, the random part never does.
TEMPORARY_NAME = re.compile(r"^\..+\.tmp-(?P<pid>\d+)-(?P<host>.+)-[a-z0-9_]+$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 checks that the process exists without touching it
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete the temporary files of saves into `directory` whose process died (killed mid-save); a live writer's,
    and those written from another host (a shared file system: its processes can't be seen from here), stay."""
    removed = []
    host = _host()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = TEMPORARY_NAME.match(entry.name)
        if match is None or match["host"] != host or not entry.is_file(follow_symlinks=False):
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _is_running(pid):
            continue
        try:
            os.unlink(entry.path)
        except OSError:  # another save removing it at the same moment, or not ours to remove
            continue
        removed.append(Path(entry.path))
    if removed:
        logger.info("removed %d temporary file(s) left in %s by interrupted saves", len(removed), directory)
    return removed


# Names of a process's streams: /dev/stdout is a link to a file when stdout is one, which replacing would unlink
# from the stream. Other paths under /dev (/dev/shm's files) are files like any other.
STREAM_PATHS = ("/dev/fd/", "/dev/stdout", "/dev/stderr", "/proc/")


def writes_through(path: str | Path) -> bool:
    """Whether `path` is written in place rather than replaced: a device (/dev/null), a FIFO, a socket, a process
    substitution's /dev/fd/N, /dev/stdout. Renaming a file over one of those would put a plain file in its place
    (as root, /dev/null itself) and leave its reader waiting."""
    path = Path(path)
    if str(path.absolute()).startswith(STREAM_PATHS):
        return True
    try:
        return not stat.S_ISREG(path.stat().st_mode)  # links followed: a link to a file is that file
    except OSError:  # not there yet (or a folder of it missing): a new file
        return False


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds. A link is followed (its
    target is replaced, the link kept); a device or FIFO is written in place (see writes_through)."""
    path = Path(path)
    if writes_through(path):
        yield path
        return
    if path.is_symlink():
        try:
            target = path.resolve()
        except RuntimeError:  # Python 3.11 and 3.12's "Symlink loop"
            target = path
        # A loop: Python 3.13 gives it back unresolved, and os.replace would put the file where the link was.
        if target.is_symlink():
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
        path = target
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-{_host()}-")
    os.close(handle)
    try:
        yield Path(temporary)
        # mkstemp makes the file private, and writers may replace it with one of their own (safetensors does):
        # the result gets the permissions of any new file, those the user's umask gives.
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except OSError as error:
        if error.filename not in (None, temporary):
            raise
        raise naming(error, path) from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def naming(error: OSError, path: str | Path) -> OSError:
    """`error` naming `path`. A write that fails (a full disk, a file size limit) names no file, and a temporary
    name means nothing to the user: the file they asked for is the one to name. An OSError a library made up
    has no errno, only a message (numpy's "96000 requested and 992 written")."""
    if error.errno is None:
        return OSError(None, f"can't write all of it ({error})", str(path))
    return OSError(error.errno, error.strerror or os.strerror(error.errno), str(path))


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")


def save_array(path: str | Path, array: np.ndarray) -> None:
    """np.save to `path`, atomically."""
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        np.save(PythonWrites(handle), array)


class PythonWrites:
    """An open file's writes, made through Python's file object, which raises the OS's error when one fails (a full
    disk). Given a real file, numpy writes through C's stdio, which drops a failure of its last flush: np.save
    reported success over a truncated file. torch.save replaces the error with an assertion of its own ("unexpected
    pos 576 vs 534"); `error` keeps the OS's, the one that says what happened."""

    def __init__(self, handle: BinaryIO):
        self.handle, self.error = handle, None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.handle.flush()
