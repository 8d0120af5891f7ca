"""Several processes sharing one call's work, as sentence-transformers' multi-process pool: one worker per device
(a list such as ["cuda:0", "cuda:1"], or ["cpu"] * n, which splits this machine's cores between them), each with
its own copy of the model, taking chunks of the inputs from one queue.

SentenceEncoder and CrossEncoder start and stop such pools (`start_multi_process_pool`, `stop_multi_process_pool`),
and their `encode` and `predict` take one as `pool=` (or a list of devices as `device=`: a pool for that call). The
workers compute float32 results; what depends on all of them together (int8 or binary vectors, whose ranges
sentence-transformers finds over the whole call) is done once they are back, so a pool gives what one process gives.
The pool is a dict with sentence-transformers' keys ("input", "output", "processes").
"""

from __future__ import annotations

import io
import math
import os
import pickle
import queue
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

from bertforge.errors import BertforgeError, InputError
from bertforge.runtime import resolve_device
from bertforge.validation import check_counts

# How long the caller waits on the results queue before it checks that every worker is still alive.
POLL_SECONDS = 1.0
# sentence-transformers' number of CPU workers when no device is named and there is no GPU
DEFAULT_CPU_WORKERS = 4


def pool_devices(target_devices: Sequence[str | torch.device] | None) -> list[torch.device]:
    """The devices of a pool: those named, else every GPU, else DEFAULT_CPU_WORKERS times the CPU."""
    if target_devices is None:
        if torch.cuda.is_available():
            return [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        return [torch.device("cpu")] * DEFAULT_CPU_WORKERS
    if isinstance(target_devices, (str, torch.device)) or not isinstance(target_devices, Sequence) \
            or not target_devices:
        raise InputError(f"target_devices must be a non-empty list of devices such as ['cpu', 'cpu'], got "
                         f"{target_devices!r}")
    devices = []
    for device in target_devices:
        try:
            devices.append(torch.device(device))
        except (RuntimeError, TypeError):
            raise InputError(f"target_devices: {device!r} is not a device (such as 'cpu' or 'cuda:0')") from None
    return devices


def start_pool(model: nn.Module, target_devices: Sequence[str | torch.device] | None = None) -> dict[str, Any]:
    """Start a worker per device, each with a copy of `model` (the caller's stays where it is)."""
    devices = pool_devices(target_devices)
    cpu_workers = sum(device.type == "cpu" for device in devices)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // max(1, cpu_workers))
    context = mp.get_context("spawn")  # a forked copy of a process that has run torch's thread pools can hang
    inputs, outputs, models = context.Queue(), context.Queue(), context.Queue()
    device_of_model = next(model.parameters()).device
    model.to("cpu")  # the workers read the weights from shared memory rather than each get a pickled copy
    model.share_memory()
    try:
        # Process.start writes its arguments to the new process and waits until they are read: forever if it
        # dies first, as a script without `if __name__ == "__main__":` makes it (each worker imports the script,
        # which starts pools again). So the arguments are only the shared weights' handles, which fit in the
        # pipe at once, and the rest of the model (its tokenizer: about a megabyte) goes by queue, whose waiting
        # is a thread's; the caller then sees the worker die (next_result).
        weights, skeleton = without_weights(model)
    finally:
        model.to(device_of_model)
    processes = []
    for device in devices:
        process = context.Process(target=work, args=(models, weights, device, threads, inputs, outputs), daemon=True)
        process.start()
        processes.append(process)
        models.put(skeleton)
    return {"input": inputs, "output": outputs, "processes": processes, "models": models}


class WeightsApart(pickle.Pickler):
    """Pickles a model with each of its weights (parameters and buffers) named rather than written."""

    def __init__(self, file, names: dict[int, str]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.names = names  # id of the tensor -> its name

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and id(obj) in self.names:
            return self.names[id(obj)], isinstance(obj, nn.Parameter), obj.requires_grad
        return None


class WeightsBack(pickle.Unpickler):
    """Unpickles what WeightsApart wrote, each named weight taken from `weights` (a tied one is one object)."""

    def __init__(self, file, weights: dict[str, torch.Tensor]):
        super().__init__(file)
        self.weights, self.made = weights, {}

    def persistent_load(self, pid: Any) -> Any:
        name, is_parameter, requires_grad = pid
        if name not in self.made:
            tensor = self.weights[name]
            self.made[name] = nn.Parameter(tensor, requires_grad=requires_grad) if is_parameter else tensor
        return self.made[name]


def without_weights(model: nn.Module) -> tuple[dict[str, torch.Tensor], bytes]:
    """The model's weights by name, and the model pickled without them (with_weights joins the two)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    buffer = io.BytesIO()
    WeightsApart(buffer, {id(tensor): name for name, tensor in tensors}).dump(model)
    return {name: tensor.detach() for name, tensor in tensors}, buffer.getvalue()


def with_weights(skeleton: bytes, weights: dict[str, torch.Tensor]) -> nn.Module:
    return WeightsBack(io.BytesIO(skeleton), weights).load()


def stop_pool(pool: dict[str, Any]) -> None:
    """End the workers of a pool that start_pool made, and close its queues (once: again does nothing)."""
    check_pool(pool, running=False)
    if pool.get("stopped"):
        return
    pool["stopped"] = True
    for process in pool["processes"]:
        process.terminate()
    for process in pool["processes"]:
        process.join()
        process.close()
    # chunks (or copies of the model) a worker never took must not keep this process from exiting
    for name in ("input", "models"):
        if name in pool:
            pool[name].cancel_join_thread()
            pool[name].close()
    pool["output"].close()


def check_pool(pool: Any, running: bool = True) -> None:
    if not isinstance(pool, dict) or not {"input", "output", "processes"} <= pool.keys():
        raise InputError("pool must be what start_multi_process_pool returned (a dict with 'input', 'output' and "
                         f"'processes'), got {type(pool).__name__}")
    if running and pool.get("stopped"):
        raise InputError("the pool is stopped (stop_multi_process_pool, or a worker that ended); start another")


def work(models, weights: dict[str, torch.Tensor], device: torch.device, threads: int, inputs, outputs) -> None:
    """A worker: take a copy of the model (its weights the shared ones), then run `model.<method>(chunk,
    **options)` on each chunk it takes, and send back the result (on the CPU) or the error, until stopped."""
    if device.type == "cpu":
        torch.set_num_threads(threads)
    model = with_weights(models.get(), weights)
    # A GPU worker's model moves off them: emptied (the process's own arguments hold the dict), the host's shared
    # copy is not held for the pool's life.
    weights.clear()
    model.to(device)
    while True:
        chunk_id, method, chunk, options = inputs.get()
        try:
            result = to_cpu(getattr(model, method)(chunk, **options))
        except Exception as error:  # the caller raises it
            result = error if picklable(error) else BertforgeError(f"{type(error).__name__}: {error}")
        outputs.put((chunk_id, result))


def picklable(error: Exception) -> bool:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return False
    return True


def to_cpu(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        return result.cpu()
    if isinstance(result, list):
        return [to_cpu(item) for item in result]
    if isinstance(result, dict):
        return {key: to_cpu(value) for key, value in result.items()}
    return result


def run_in_pool(pool: dict[str, Any], method: str, items: list, options: dict[str, Any],
                chunk_size: int | None = None) -> Any:
    """`method(items, **options)` as the pool's workers compute it, chunk by chunk: the chunks' tensors joined
    (torch.cat), or their lists one after the other. `chunk_size`: items a chunk, by default as sentence-
    transformers chooses it (about ten chunks a worker, at most 5,000 items each)."""
    check_pool(pool)
    if chunk_size is None:
        chunk_size = max(1, min(math.ceil(len(items) / len(pool["processes"]) / 10), 5000))
    check_counts(chunk_size=chunk_size)
    starts = range(0, len(items), chunk_size)
    results: list[Any] = [None] * len(starts)
    # One call at a time: the workers answer every call on one queue, by chunk number, so a call another thread
    # made meanwhile would take this call's results for its own. (setdefault is atomic: one lock per pool.)
    with pool.setdefault("lock", threading.Lock()):
        for chunk_id, start in enumerate(starts):
            pool["input"].put((chunk_id, method, items[start:start + chunk_size], options))
        for _ in starts:
            chunk_id, result = next_result(pool)
            results[chunk_id] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    if isinstance(results[0], torch.Tensor):
        return torch.cat(results)
    return [item for result in results for item in result]


def next_result(pool: dict[str, Any]) -> tuple[int, Any]:
    """The next (chunk id, result) from the pool's workers; an error, rather than a wait forever, once one died."""
    while True:
        try:
            return pool["output"].get(timeout=POLL_SECONDS)
        except queue.Empty:
            pass
        dead = [process for process in pool["processes"] if not process.is_alive()]
        if dead:
            ended = "; ".join(f"pid {process.pid}, exit code {process.exitcode}" for process in dead)
            stop_pool(pool)  # its queues would keep this process from exiting
            raise BertforgeError(f"{len(dead)} worker(s) of the multi-process pool ended ({ended}), and the pool is "
                                 f"stopped; start another. If they ended as they started: a script must start a "
                                 f"pool under `if __name__ == \"__main__\":`, since each worker imports it")


class PoolMethods:
    """sentence-transformers' pool methods, for a model class whose encode-like call sends its work through
    `self.pooled`."""

    def place(self, device: Any) -> list | None:
        """A call's `device`: a list of devices is returned, for a pool of that call; one device moves the model
        there (and None leaves it where it is), once this machine is known to have it: a move to a device it
        lacks fails halfway, and one to "meta" throws the weights away."""
        if isinstance(device, Sequence) and not isinstance(device, str):
            return list(device)
        if device is not None:
            self.to(resolve_device(device))
        return None

    def start_multi_process_pool(self, target_devices: Sequence[str | torch.device] | None = None
                                 ) -> dict[str, Any]:
        return start_pool(self, target_devices)

    @staticmethod
    def stop_multi_process_pool(pool: dict[str, Any]) -> None:
        stop_pool(pool)

    def pooled(self, method: str, items: list, pool: dict[str, Any] | None, devices: Sequence | None,
               chunk_size: int | None, **options: Any) -> Any:
        """run_in_pool in `pool`, or in a pool of `devices` started for this call alone."""
        if pool is not None:
            return run_in_pool(pool, method, items, options, chunk_size)
        if chunk_size is not None:  # before any worker starts (run_in_pool checks a given pool's)
            check_counts(chunk_size=chunk_size)
        started = start_pool(self, devices)
        try:
            return run_in_pool(started, method, items, options, chunk_size)
        finally:
            stop_pool(started)
