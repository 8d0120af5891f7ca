"""Overlapping windows over a token sequence longer than a model's input: where each window starts.

Question answering slides over its context, classification over a long text (or the longer text of a pair), and
embedding over a long document; all of them place their windows here.
"""

from __future__ import annotations


def window_starts(length: int, budget: int, stride: int) -> list[int]:
    """First token of each window of `budget` tokens over `length` tokens, consecutive windows sharing `stride`.

    Windows advance by budget - stride and end with the first one that reaches the last token, as transformers'
    `return_overflowing_tokens` does: (length 40, budget 9, stride 3) -> [0, 6, 12, 18, 24, 30, 36].
    """
    step = budget - stride
    starts = [0]
    while starts[-1] + budget < length:
        starts.append(starts[-1] + step)
    return starts


def half_overlap_starts(length: int, budget: int) -> list[int]:
    """Windows advancing by half a window, so that every token is seen with context on both sides in some window:
    (length 10, budget 4) -> [0, 2, 4, 6]; a window of one token advances by one."""
    return window_starts(length, budget, budget - max(budget // 2, 1))
