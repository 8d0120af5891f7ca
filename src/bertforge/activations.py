"""The encoder's activations: the feed-forward's, which BERT checkpoints name in `hidden_act`, and attention's
softmax."""

from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "gelu": F.gelu,  # exact (erf) GELU, as in the original BERT
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}

# The same activations as oneDNN post-ops (operation, algorithm): applied inside a matmul as its output is written.
ONEDNN_POST_OPS = {
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


class Activation(nn.Module):
    """The activation named `name` in ACTIVATIONS, as a module."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.name](x)

    def extra_repr(self) -> str:
        return self.name


def softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension (attention's rows of keys).

    On a CPU, torch's kernel vectorizes along each row and takes a row shorter than one vector (16 float32 lanes
    with AVX-512, 8 with AVX2) one element at a time: 2-5x slower there than exp and sum over the whole tensor,
    which is what short sentences' attention needs (SQuAD's questions, 14 tokens on average: MiniLM 2% faster in
    float32, 3-6% in int8).
    """
    if (scores.device.type != "cpu" or scores.dtype != torch.float32 or torch.compiler.is_compiling()
            or scores.shape[-1] >= float32_lanes()):
        return scores.softmax(dim=-1)
    exp = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    return exp / exp.sum(dim=-1, keepdim=True)


@cache
def float32_lanes() -> int:
    """float32 numbers in one of the vectors torch's CPU kernels run on here; 0 where not known."""
    return {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 0)
