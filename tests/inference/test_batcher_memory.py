"""A quiet server gives back the memory its batches freed: glibc keeps it (tune_cpu_allocator asks it to, for
speed under load), the batcher's worker hands it back once idle."""

from __future__ import annotations

import time

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.inference.serve import batcher as batcher_module
from bertforge.inference.serve.batcher import Job, MicroBatcher
from bertforge.inference.serve.settings import ServeSettings
from bertforge.runtime import release_freed_memory, tune_cpu_allocator


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def lengths(model, jobs):
    return [job.length for job in jobs]


def test_the_worker_gives_memory_back_once_after_its_batches_when_idle(monkeypatch):
    released = []
    monkeypatch.setattr(batcher_module, "release_freed_memory", lambda: released.append(time.monotonic()))
    worker = MicroBatcher(torch.nn.Identity(), max_wait_ms=0, release_memory_after=0.05)
    try:
        time.sleep(0.3)
        assert released == []  # no batch ran: nothing freed to give back
        for round_ in (1, 2):
            futures = worker.submit([Job(lengths, {"input_ids": [0] * n}) for n in (3, 5)])
            assert sorted(future.result(10) for future in futures) == [3, 5]
            finished = time.monotonic()
            time.sleep(0.4)
            assert len(released) == round_  # once per quiet spell, not every 0.05 s
            assert released[-1] >= finished + 0.04
    finally:
        worker.stop()


def test_a_worker_told_never_keeps_the_memory(monkeypatch):
    released = []
    monkeypatch.setattr(batcher_module, "release_freed_memory", lambda: released.append(time.monotonic()))
    worker = MicroBatcher(torch.nn.Identity(), max_wait_ms=0, release_memory_after=0)
    try:
        (future,) = worker.submit([Job(lengths, {"input_ids": [0] * 4})])
        assert future.result(10) == 4
        time.sleep(0.3)
        assert released == []
    finally:
        worker.stop()


def test_the_server_setting_reaches_the_worker_and_is_checked(run_cli, tiny_model_dir):
    from bertforge.inference.serve.app import load_app

    assert ServeSettings().release_memory_after == batcher_module.RELEASE_MEMORY_AFTER
    app = load_app(tiny_model_dir, ServeSettings(release_memory_after=0.5))
    try:
        assert app.state.served.batcher.release_memory_after == 0.5
    finally:
        app.state.served.batcher.stop()
    for bad in (-1, float("inf"), 1e308):
        with pytest.raises(BertforgeError, match="release_memory_after"):
            ServeSettings(release_memory_after=bad)
    code, _, err = run_cli("serve", "--model", str(tiny_model_dir), "--release-memory-after", "-2")
    assert code == 2 and "--release-memory-after" in err and "Traceback" not in err


def test_release_gives_freed_heap_memory_back_to_the_system():
    if not tune_cpu_allocator():
        pytest.skip("not glibc")
    # Blocks under the mmap threshold come from the heap, which tune_cpu_allocator keeps after they are freed.
    blocks = [torch.ones(4 * 1024 * 1024) for _ in range(24)]  # 24 x 16 MB
    held = resident_mb()
    del blocks
    kept = resident_mb()
    assert release_freed_memory()
    assert kept - resident_mb() > 0.5 * 24 * 16, (held, kept, resident_mb())
