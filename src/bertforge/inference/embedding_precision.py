"""Embeddings in fewer bits (sentence-transformers' quantize_embeddings): int8 and uint8 give each dimension 256
steps between its smallest and largest value over a calibration set (the embeddings themselves when none is given);
binary and ubinary keep the sign bits, eight dimensions to a byte (binary shifted to -128..127, for int8 indexes).
Hamming distance on binary vectors and dot products on int8 ones rank nearly as float32 vectors do, at a fraction
of the memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bertforge.errors import InputError, check_choice


def _steps(vectors: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Each value's step, 0 to 255, in its dimension's range (ranges: (2, dim) of lowest and highest)."""
    low, high = ranges[0].astype(np.float32), ranges[1].astype(np.float32)
    step = (high - low) / 255
    step = np.where(step == 0, 1, step)
    return np.clip(np.floor((vectors - low) / step), 0, 255)


# precision -> ((texts, dim) float32 vectors, (2, dim) ranges or None) -> the quantized array
PRECISIONS: dict[str, Callable[[np.ndarray, np.ndarray | None], np.ndarray]] = {
    "float32": lambda vectors, ranges: vectors.astype(np.float32),
    "int8": lambda vectors, ranges: (_steps(vectors, ranges) - 128).astype(np.int8),
    "uint8": lambda vectors, ranges: _steps(vectors, ranges).astype(np.uint8),
    "binary": lambda vectors, ranges: (np.packbits(vectors > 0, axis=-1).astype(np.int16) - 128).astype(np.int8),
    "ubinary": lambda vectors, ranges: np.packbits(vectors > 0, axis=-1),
}
RANGED = ("int8", "uint8")  # the precisions that need each dimension's range


def quantization_ranges(embeddings: np.ndarray, calibration_embeddings: Any = None) -> np.ndarray:
    """(2, dim): each dimension's lowest and highest value over the calibration embeddings, else over the
    embeddings themselves (more than one: a single vector has no range)."""
    if calibration_embeddings is None:
        if embeddings.ndim == 1 or len(embeddings) < 2:
            raise InputError("int8 and uint8 embeddings take each dimension's range from the texts encoded "
                             "together: give more than one, or ranges, or calibration_embeddings")
        calibration_embeddings = embeddings
    calibration = _as_array(calibration_embeddings)
    return np.vstack((calibration.min(axis=0), calibration.max(axis=0)))


def _as_array(embeddings: Any) -> np.ndarray:
    if isinstance(embeddings, torch.Tensor):
        return embeddings.detach().float().cpu().numpy()
    return np.asarray(embeddings)


def quantize_embeddings(embeddings: Any, precision: str, ranges: Any = None,
                        calibration_embeddings: Any = None) -> np.ndarray | list[np.ndarray]:
    """`embeddings` ((texts, dim) float vectors: a tensor, an array or a list of vectors) in `precision` (float32,
    int8, uint8, binary, ubinary). `ranges` ((2, dim)) or `calibration_embeddings` fix the int8/uint8 steps;
    a list of (tokens, dim) matrices (a multi-vector model's) shares one set of ranges and gives a list."""
    check_choice(precision, PRECISIONS, "precision", error=InputError)
    if isinstance(embeddings, list) and embeddings and _as_array(embeddings[0]).ndim == 2:
        matrices = [_as_array(matrix) for matrix in embeddings]
        every = np.concatenate(matrices)
        calibration = every if calibration_embeddings is None else calibration_embeddings
        if precision in RANGED and ranges is None and len(calibration):  # nothing to calibrate: every matrix empty
            ranges = quantization_ranges(every, calibration_embeddings)
        return [quantize_embeddings(matrix, precision, ranges) for matrix in matrices]
    if isinstance(embeddings, list) and not embeddings:
        return []
    vectors = _as_array([_as_array(vector) for vector in embeddings] if isinstance(embeddings, list) else embeddings)
    if vectors.dtype in (np.int8, np.uint8):
        raise InputError("embeddings to quantize must be floats, not int8 or uint8")
    if precision in RANGED and vectors.ndim == 2 and len(vectors) == 0:  # no vectors: no steps to take
        return np.zeros(vectors.shape, dtype=np.int8 if precision == "int8" else np.uint8)
    if precision in RANGED:
        ranges = quantization_ranges(vectors, calibration_embeddings) if ranges is None else _as_array(ranges)
    return PRECISIONS[precision](vectors, ranges)
