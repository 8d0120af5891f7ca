"""The encoder's activations: the feed-forward's, which BERT checkpoints name in `hidden_act`, and attention's
softmax."""

import math
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import nn

exact_gelu = F.gelu  # the erf GELU, as in the original BERT
tanh_gelu = partial(F.gelu, approximate="tanh")  # the tanh approximation (Hendrycks and Gimpel), as in GPT-2


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(1.702 x): the sigmoid approximation of GELU."""
    return x * torch.sigmoid(1.702 * x)


def clipped_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU clipped to [-10, 10], which keeps int8-quantized outputs in range."""
    return exact_gelu(x).clamp(-10.0, 10.0)


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def laplace(x: torch.Tensor, mu: float = 0.707107, sigma: float = 0.282095) -> torch.Tensor:
    """The Laplace CDF-shaped activation of MEGA: 0.5 (1 + erf((x - mu) / (sigma sqrt 2)))."""
    return 0.5 * (1.0 + torch.erf((x - mu) / (sigma * math.sqrt(2.0))))


def sqrt_softplus(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x).sqrt()


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


# The names transformers' checkpoints use in `hidden_act` (its ACT2FN), all but the two with learnt parameters (prelu,
# xielu). Several names are one function: transformers computes some in Python, bertforge with torch's kernel.
ACTIVATIONS = {
    "gelu": exact_gelu,
    "gelu_python": exact_gelu,
    "gelu_new": tanh_gelu,
    "gelu_pytorch_tanh": tanh_gelu,
    "gelu_python_tanh": tanh_gelu,
    "gelu_fast": tanh_gelu,
    "gelu_accurate": tanh_gelu,
    "gelu_10": clipped_gelu,
    "quick_gelu": quick_gelu,
    "relu": F.relu,
    "relu2": squared_relu,
    "relu6": F.relu6,
    "leaky_relu": F.leaky_relu,  # slope 0.01, torch's default and transformers'
    "silu": F.silu,
    "swish": F.silu,
    "hardswish": F.hardswish,
    "mish": F.mish,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "laplace": laplace,
    "sqrtsoftplus": sqrt_softplus,
    "linear": identity,
}

# Those oneDNN applies inside a matmul as its output is written, as post-ops (operation, algorithm); the others run
# after the product.
ONEDNN_POST_OPS = {
    "gelu": ("gelu", "none"),
    "gelu_python": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu_python_tanh": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "gelu_accurate": ("gelu", "tanh"),
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
