"""Atomic file writes: a file is either its old self or completely new, never half written.

A save writes `.NAME.tmp-PID-HOST-XXXXXXXX` beside NAME and renames it over NAME when complete. A process killed
mid-save leaves that file behind (a base-size model: ~0.4 GB each time); the next save into the same folder
removes the ones whose writer, named by PID and host, is no longer running.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
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
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
