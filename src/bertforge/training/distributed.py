"""torchrun's environment -> this process's rank, device and process group; DDP wrapping and rank-0 helpers.

torchrun starts one process per device and tells each through environment variables who it is (RANK, WORLD_SIZE,
LOCAL_RANK) and where the processes meet (MASTER_ADDR, MASTER_PORT). A process started without torchrun is rank 0
of 1, and every helper here then does nothing: the single-process path stays exactly as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bertforge.errors import ConfigError
from bertforge.runtime import parse_device

# device type -> the collective backend that runs on it
BACKENDS = {"cuda": "nccl", "cpu": "gloo"}


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process sits in a launch: global rank, number of processes, rank on this machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _environment_int(environ: Mapping[str, str], name: str, default: int, minimum: int = 0,
                     maximum: int | None = None, why: str = "") -> int:
    """The integer the variable `name` holds, within [minimum, maximum]; `default` when it is not set.
    `why` says where the maximum comes from ("WORLD_SIZE=4")."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"the environment variable {name} must be an integer, got {text!r}") from None
    if value < minimum or maximum is not None and value > maximum:
        allowed = f"at least {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ConfigError(f"the environment variable {name} must be {allowed}{why}, got {value}")
    return value


def read_environment(environ: Mapping[str, str] | None = None) -> ProcessInfo:
    """The ProcessInfo torchrun's variables describe; rank 0 of 1 when they are absent.

    {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    -> ProcessInfo(rank=3, world_size=4, local_rank=1)
    """
    environ = os.environ if environ is None else environ
    world_size = _environment_int(environ, "WORLD_SIZE", 1, minimum=1)
    of_world = f" (WORLD_SIZE={world_size})"
    rank = _environment_int(environ, "RANK", 0, maximum=world_size - 1, why=of_world)
    local_rank = _environment_int(environ, "LOCAL_RANK", 0, maximum=world_size - 1, why=of_world)
    if world_size > 1:
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(name)]
        if missing:
            raise ConfigError(f"WORLD_SIZE={world_size} but {missing[0]} is not set: start multi-process runs "
                              "with torchrun")
        # checked here, not left to the rendezvous, which fails with a bare int() traceback
        _environment_int(environ, "MASTER_PORT", 0, minimum=1, maximum=65535, why=" (a TCP port)")
    return ProcessInfo(rank, world_size, local_rank)


def launch_or_single() -> ProcessInfo:
    """read_environment's answer, or rank 0 of 1 where the variables describe no valid launch (a stray WORLD_SIZE):
    for code that only asks where it sits; the commands that launch processes report such variables."""
    try:
        return read_environment()
    except ConfigError:
        return ProcessInfo()


def select_device(requested: str | None, info: ProcessInfo) -> torch.device:
    """The device asked for (None: CUDA when available, else CPU); under torchrun, a bare "cuda" means this
    process's own GPU, cuda:LOCAL_RANK. Whether the machine has it is checked where the run starts."""
    device = parse_device(requested)
    if info.is_distributed and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", info.local_rank)
    return device


def backend_for(device: torch.device) -> str:
    if device.type not in BACKENDS:
        raise ConfigError(f"multi-process training runs on {' or '.join(BACKENDS)}, not {device.type}")
    return BACKENDS[device.type]


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_main_process() -> bool:
    """True on global rank 0, and in a process that is not part of a process group: the one that writes files."""
    return not is_initialized() or dist.get_rank() == 0


@contextmanager
def process_group(info: ProcessInfo, device: torch.device) -> Iterator[None]:
    """Join the launch's process group for the block, then leave it; nothing for a single process, or when the
    caller has already joined one (then it is the caller's to leave)."""
    if not info.is_distributed or is_initialized():
        yield
        return
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and the object collectives use the current device
    # MASTER_ADDR and MASTER_PORT, checked by read_environment, tell the default env:// rendezvous where to meet.
    dist.init_process_group(backend, rank=info.rank, world_size=info.world_size,
                            device_id=device if device.type == "cuda" else None)
    try:
        yield
        dist.barrier()  # no process returns before the main one has finished writing
    finally:
        dist.destroy_process_group()


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` in DistributedDataParallel when a process group is running (which copies rank 0's weights to every
    rank), else `model` itself."""
    if not is_initialized():
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def no_sync(model: nn.Module, skip: bool) -> AbstractContextManager:
    """DDP's no_sync when `skip`: gradient-accumulation micro-batches that don't step keep their gradients
    local, and only the last one pays for the all-reduce."""
    return model.no_sync() if skip and isinstance(model, DistributedDataParallel) else nullcontext()


def rank_seed(seed: int, rank: int) -> int:
    """A seed for one rank's own random draws (dropout, masks): `seed` itself on rank 0, so that a single process
    draws what it always did, and a different, independent one on every other rank."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def all_reduce_sums(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each value summed over all processes; `values` unchanged without a process group."""
    if not is_initialized():
        return values
    names = sorted(values)  # the same order on every rank
    # float64 keeps counts exact up to 2**53; NCCL reduces tensors on the GPU only
    totals = torch.tensor([float(values[name]) for name in names], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return dict(zip(names, totals.tolist()))


def barrier() -> None:
    """Wait until every process gets here; nothing without a process group."""
    if is_initialized():
        dist.barrier()


def broadcast_from_main(obj: Any) -> Any:
    """The main process's `obj` (picklable) on every process; `obj` itself without a process group."""
    if not is_initialized():
        return obj
    carrier = [obj]
    dist.broadcast_object_list(carrier, src=0)
    return carrier[0]


@dataclass(frozen=True)
class Shard:
    """This process's rows of a global batch, with its share of the loss terms the batch's mean loss averages
    (rows, or labelled tokens): the global batch's mean loss is the sum over processes of share x the shard's own
    mean loss, whatever the shards' sizes. A process with no rows of a small last batch gets one row and share 0."""

    batch: Any
    share: float


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every process's `obj` (picklable), as a list by rank on the main process and None on the others;
    [obj] without a process group."""
    if not is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered
