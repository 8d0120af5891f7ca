"""Progress bars, one way for every long step: tqdm on standard error, redrawn ten times a second on a terminal;
into a log file or a pipe, where every redraw is kept (`nohup bertforge finetune ... &`, a job scheduler's log), once
every LOG_SECONDS."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

LOG_SECONDS = 30.0


def progress_bar(iterable: Iterable | None = None, *, enabled: bool = True, **options: Any):
    """tqdm(iterable, **options), drawn where `enabled`, at a pace for where standard error goes."""
    from tqdm import tqdm  # on first use: a command that draws no bar doesn't import it

    on_terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return tqdm(iterable, disable=not enabled, mininterval=0.1 if on_terminal else LOG_SECONDS, **options)
