"""Progress bars, one way for every long step: tqdm on standard error, redrawn ten times a second on a terminal or in
a notebook; into a log file or a pipe, where every redraw is kept (`nohup bertforge finetune ... &`, a job
scheduler's log), once every LOG_SECONDS."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

LOG_SECONDS = 30.0


def progress_bar(iterable: Iterable | None = None, *, enabled: bool = True, **options: Any):
    """tqdm(iterable, **options), drawn where `enabled`, at a pace for where standard error goes; an iterable with no
    bar to draw is given back as it is (encode, a request's hot path, makes no bar object)."""
    if not enabled and iterable is not None:
        return iterable
    from tqdm import tqdm  # on first use: a command that draws no bar doesn't import it

    return tqdm(iterable, disable=not enabled, mininterval=0.1 if watched(sys.stderr) else LOG_SECONDS, **options)


def watched(stream) -> bool:
    """Whether a person watches `stream` as it is written: a terminal, or a notebook's cell output (Jupyter's
    ipykernel, which redraws a bar in place as a terminal does)."""
    return bool(getattr(stream, "isatty", lambda: False)()) or type(stream).__module__.startswith("ipykernel.")
