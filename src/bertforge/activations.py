"""The feed-forward activations BERT checkpoints name in `hidden_act`."""

from functools import partial

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
