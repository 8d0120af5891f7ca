"""Which kernel computes attention, per call: the explicit matmul-softmax-matmul (the paper's formula, written out
in model.py's SelfAttention.attend) or torch's fused scaled_dot_product_attention (SDPA). Speed machinery beside
the model: the result is the same either way, to float rounding (tests/test_model.py checks it)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# On a CPU, SDPA's kernel has a large cost per (sequence, head) that dominates short sequences; up to this length
# the explicit matmul-softmax-matmul path is faster (up to 2x at 8-16 tokens), beyond it SDPA is (2-3x at 256+).
EXPLICIT_ATTENTION_MAX_SEQ = 64
# On a GPU, SDPA's first choice for bf16 (cuDNN's kernel, recent torch and GPUs) builds a plan for every new shape:
# ~8 ms a layer on an H200, paid again at each batch length, and batches come in many. The others need no plan.
GPU_ATTENTION_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class ReplayRecording(threading.local):
    """Whether this thread is recording a graph for inference/replay.py, which replays it only for batches on the
    same side of the length branches as the batch it records on: those branches may then be taken as in an eager
    forward (and int8 layers take the kernel a graph can hold: compress/int8_linear.py). Each thread's own: other
    threads' calls on the same model meanwhile take their own kernels (and record their own graphs)."""

    active = False


replay_recording = ReplayRecording()


def recording_graph() -> bool:
    """Whether the forward is being recorded as a graph (torch.compile, torch.export and the ONNX exporter,
    torch.jit.trace), which fixes every branch taken on the data to the recorded input's side: the model then
    computes every position, as transformers' does, and torch.compile(fullgraph=True) has no break to make."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def explicit_attention(q: torch.Tensor, dropout_p: float, need_weights: bool) -> bool:
    """Whether the explicit path computes attention over `q` (batch, heads, seq, head_dim): for the weights
    themselves, and on a CPU for short sequences and for dropout (where SDPA computes the same thing with a
    costlier random mask). A recorded graph takes SDPA for every length: a branch on the length would fix it to one
    side."""
    on_cpu = q.device.type == "cpu" and (replay_recording.active or not recording_graph())
    return need_weights or (on_cpu and (dropout_p > 0.0 or q.shape[2] <= EXPLICIT_ATTENTION_MAX_SEQ))


class GpuKernelChoice:
    """sdpa_kernel(GPU_ATTENTION_KERNELS) held from the first thread's GPU attention in to the last one's out.

    torch keeps the SDPA backends as one setting of the process, and sdpa_kernel puts back on exit what it found on
    entry: with two threads inside, the first one out turned cuDNN's kernel on again under the other, and the last
    one out left it off for the whole process. Counted here, the setting is made once and put back once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inside = 0  # threads in a GPU attention call now
        self.chosen: contextlib.AbstractContextManager | None = None  # the sdpa_kernel block the first one entered

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self.lock:
            if self.inside == 0:
                self.chosen = sdpa_kernel(GPU_ATTENTION_KERNELS)
                self.chosen.__enter__()
            self.inside += 1
        try:
            yield
        finally:
            with self.lock:
                self.inside -= 1
                if self.inside == 0:
                    self.chosen.__exit__(None, None, None)


gpu_kernel_choice = GpuKernelChoice()


def fused_kernels(q: torch.Tensor):
    """The SDPA kernels a call may choose among: on a GPU, those that need no plan per shape. (torch.compile reads
    sdpa_kernel itself, not the count around it.)"""
    if not q.is_cuda:
        return contextlib.nullcontext()
    return sdpa_kernel(GPU_ATTENTION_KERNELS) if torch.compiler.is_compiling() else gpu_kernel_choice()
