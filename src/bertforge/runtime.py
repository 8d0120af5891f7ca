"""The process and its devices: seeding, native bf16, moving batches to a device, CPU settings for fast
inference (applied only when asked: the CLI and benchmarks ask), and the process's warning filters, which
bertforge's threads change in turn.

Large activations (a 32 x 128 batch of MiniLM's feed-forward is 25 MB) are allocated and freed in every layer.
glibc returns such blocks to the kernel at once, so each new one is paged in again on first touch; on a virtual
machine that costs more than the matrix multiply that fills it. Keeping freed memory in the process fixes that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import random
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from bertforge.errors import ConfigError

logger = logging.getLogger("bertforge")

# mallopt parameters from glibc's malloc.h
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling on 64-bit systems
# A fixed ceiling, not one tied to this machine's cores: several times the cores of the largest servers (so never
# in the way), far below the counts at which torch crashes instead of refusing.
MAX_THREADS = 4096


@functools.cache
def c_library() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def tune_cpu_allocator(keep_free_bytes: int = 1 << 30) -> bool:
    """Ask glibc to serve large tensors from the heap and keep freed memory; False where that isn't glibc."""
    mallopt = getattr(c_library(), "mallopt", None)
    if mallopt is None:
        return False
    applied = (mallopt(M_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD) == 1
               and mallopt(M_TRIM_THRESHOLD, keep_free_bytes) == 1
               and mallopt(M_TOP_PAD, 256 * 1024 * 1024) == 1)
    if not applied:
        logger.info("could not tune the C allocator; inference will be slower on large batches")
    return applied


def release_freed_memory() -> bool:
    """Give the memory glibc keeps after frees back to the system (malloc_trim), as a server does once idle: what
    tune_cpu_allocator keeps for speed, and what the heap's scattered holes hold; False where that isn't glibc."""
    malloc_trim = getattr(c_library(), "malloc_trim", None)
    return malloc_trim is not None and malloc_trim(0) == 1


def set_threads(num_threads: int | None) -> None:
    """Intra-op threads for torch (the CLI's --threads); None keeps torch's default (one per physical core)."""
    if num_threads is not None:
        if num_threads > MAX_THREADS:  # torch's thread pool crashes the process (SIGSEGV) from about 32768
            raise ConfigError(f"--threads must be at most {MAX_THREADS}, got {num_threads}")
        torch.set_num_threads(num_threads)


# warnings.catch_warnings saves the process's warning filters on entry and puts them back on exit: two threads'
# blocks interleaved (one in, the other in, the first out, the second out) put back each other's, and left every
# warning of the process silenced. bertforge's own blocks take turns; re-entrant, as a graph that replay.py records
# runs the int8 layers' blocks inside its own.
WARNINGS_TURN = threading.RLock()


@contextmanager
def warnings_silenced() -> Iterator[None]:
    """Within: no warning is shown (torch's notes that say nothing to the user). Python's filters are the
    process's, so no other thread's either, meanwhile."""
    with WARNINGS_TURN, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield

DEVICES_HINT = "use cpu, cuda, cuda:N or mps"


def parse_device(requested: str | None, named: str = "device") -> torch.device:
    """A device name as torch reads it (None: CUDA when available, else the CPU); a name that is not one of the
    kinds bertforge runs on is an error, which calls the setting `named` (a flag: --device). Whether this machine
    has it is resolve_device's question."""
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{named} {requested!r} is not a device; {DEVICES_HINT}") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{named} {requested!r} is not supported; {DEVICES_HINT}")
    return device


def resolve_device(requested: str | None, named: str = "device") -> torch.device:
    """The device a run asked for, checked before any work to exist on this machine: the one check of a device
    for every entry point (the Python API's `device`, the commands' --device)."""
    device = parse_device(requested, named)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{named} {requested!r}: this machine has no CUDA GPU that torch can use (use cpu)")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{named} {requested!r}: this machine has {count} CUDA GPU(s), numbered from 0")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"{named} {requested!r}: MPS (an Apple GPU) is not available on this machine (use cpu)")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (all devices): dropout masks and initialisation repeat exactly."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a failed allocation: Python's MemoryError, or torch's, which is a RuntimeError
    (OutOfMemoryError on a GPU; on a CPU a plain one naming the allocator)."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or \
        isinstance(error, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(error)


def bf16_supported(device_type: str) -> bool:
    """Whether bf16 autocast runs natively: on CPU that needs oneDNN's bf16 kernels (AVX-512 BF16 or AMX)."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return False


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
