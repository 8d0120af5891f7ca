"""CPU fast paths, swapped into a model of plain modules for training or inference and out again.

`accelerate(model)` replaces each nn.Linear by a PrepackedLinear (oneDNN on a weight laid out once), fuses each
FeedForward's activation into its up-projection, and replaces each nn.Dropout by a Dropout with a cheaper random
mask; `make_plain(model)` reverses it. Parameters are shared, never copied, so state dicts, optimizers and outputs
are unchanged (up to the kernels' rounding). Whatever traces or rewrites modules (ONNX export, int8 quantisation)
sees the plain model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.activations import ACTIVATIONS, ONEDNN_POST_OPS, Activation
from bertforge.model import FeedForward


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, with a cheaper random mask on a CPU.

    torch draws a float per element there (about a tenth of a CPU fine-tuning step); here each element reads 16
    bits of a 64-bit random word, a quarter of the draws, and is kept with probability 1 - p to within 2^-16.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    words = torch.randint(-2**63, 2**63 - 1, ((x.numel() + 3) // 4,), dtype=torch.int64)
    keep = words.view(torch.int16)[:x.numel()].view(x.shape) >= round(p * 65536) - 32768
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """nn.Dropout on `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def prepacking_pays() -> bool:
    """Whether inference on this CPU should take PrepackedLinear's oneDNN kernels: with AVX-512 they beat torch's
    own product (below). With AVX2 alone they measured level with it (a 2-core AVX2 EPYC, MiniLM, SST-2 sentences:
    25-30 ms a batch of up to 8 against 29, 64-82 ms against 63 for up to 32), and oneDNN keeps a compiled kernel for
    every row count it meets (two caches of up to 1,024 each): a server's packed batches, a new row count almost
    every time, grew its memory by 0.5 GB in 2,400 requests (352 MB to 888 MB), where torch's product stays level."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


class PrepackedLinear(nn.Linear):
    """nn.Linear, optionally followed by an activation, whose float32 inference on a CPU multiplies by a copy of the
    weight laid out for oneDNN and applies the activation as the product is written (one pass fewer over memory).

    oneDNN's kernels on a weight reordered once beat MKL's sgemm, which repacks the weight on every call, on
    BERT's shapes: 1.1-1.3x on an AVX-512 AMD CPU, and no slower with oneDNN held to AVX2. The copy serves eval
    mode without gradients only, and is made again after anything that may have changed the weight: a switch
    between train and eval mode, a forward pass with gradients (an optimizer step may follow), or an in-place
    update that moves the weight's version counter (a checkpoint load; fused AdamW's step does not move it).
    Training, autocast, other devices and dtypes, and graph capture (torch.compile, export, the tracer of
    inference/replay.py) take nn.Linear's own path: oneDNN's op has no gradient, no ONNX form, and a reordered
    weight the tracer can't hold.
    """

    packed: tuple[tuple[int, int], torch.Tensor] | None = None  # ((data pointer, version) of weight, its copy)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 activation: str | None = None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation  # a name in ACTIVATIONS, or None

    @classmethod
    def sharing(cls, linear: nn.Linear, activation: str | None = None) -> PrepackedLinear:
        """A PrepackedLinear on `linear`'s own parameters (not copies)."""
        return share_parameters(linear, cls(linear.in_features, linear.out_features, linear.bias is not None,
                                            device="meta", activation=activation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.training or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32
                or self.weight.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
                or torch.compiler.is_compiling() or torch.jit.is_tracing() or not torch.backends.mkldnn.is_available()):
            self.packed = None
            x = super().forward(x)
            return x if self.activation is None else ACTIVATIONS[self.activation](x)
        operation, algorithm = ONEDNN_POST_OPS.get(self.activation, ("none", ""))
        y = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(), self.bias, operation, [], algorithm)
        # an activation oneDNN has no post-op for runs after the product
        return y if self.activation is None or self.activation in ONEDNN_POST_OPS else ACTIVATIONS[self.activation](y)

    def packed_weight(self) -> torch.Tensor:
        if self.weight.is_inference():  # made under inference_mode: no version counter to tell a change by
            return torch.ops.mkldnn._reorder_linear_weight(self.weight, None)
        key = (self.weight.data_ptr(), self.weight._version)
        # Read once: another thread's call on the shared model may drop self.packed (its eval(), a call with
        # gradients) between this thread's check and its use.
        packed = self.packed
        if packed is None or packed[0] != key:
            packed = self.packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None))
        return packed[1]

    def train(self, mode: bool = True) -> PrepackedLinear:
        if mode != self.training:  # a switch; the eval() that inference calls make on an eval model keeps the copy
            self.packed = None
        return super().train(mode)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "packed": None}  # oneDNN's layout can't be copied or pickled; it is made on use

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


def share_parameters(source: nn.Linear, target: nn.Linear) -> nn.Linear:
    """`target` (built on the meta device) holding `source`'s parameters, in `source`'s train or eval mode."""
    target.weight, target.bias = source.weight, source.bias
    return target.train(source.training)


def replace_children(model: nn.Module, replacement: Callable[[nn.Module], nn.Module | None]) -> None:
    """Every submodule `child` of `model` for which `replacement(child)` is a module is replaced by it."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = replacement(child)
            if new is not None:
                setattr(parent, name, new)


def fast_module(module: nn.Module) -> nn.Module | None:
    if type(module) is nn.Linear:  # exact types only: subclasses (e.g. the task heads) have their own forward
        return PrepackedLinear.sharing(module)
    if type(module) is nn.Dropout:
        return Dropout(module.p).train(module.training)
    return None


def plain_module(module: nn.Module) -> nn.Module | None:
    if type(module) is PrepackedLinear:
        linear = nn.Linear(module.in_features, module.out_features, module.bias is not None, device="meta")
        return share_parameters(module, linear)
    if type(module) is Dropout:
        return nn.Dropout(module.p).train(module.training)
    return None


def accelerate(model: nn.Module) -> nn.Module:
    """`model` (changed in place, and returned) with the CPU fast paths; see the module docstring."""
    for feed_forward in model.modules():
        if isinstance(feed_forward, FeedForward) and isinstance(feed_forward.activation, Activation):
            name = feed_forward.activation.name
            if type(feed_forward.up) is nn.Linear and name in ONEDNN_POST_OPS:
                feed_forward.up = PrepackedLinear.sharing(feed_forward.up, activation=name)
                feed_forward.activation = nn.Identity()
    replace_children(model, fast_module)
    return model


def make_plain(model: nn.Module) -> nn.Module:
    """`model` (changed in place, and returned) with plain torch modules again: the inverse of `accelerate`."""
    for feed_forward in model.modules():
        if isinstance(feed_forward, FeedForward) and getattr(feed_forward.up, "activation", None) is not None:
            feed_forward.activation = Activation(feed_forward.up.activation).train(feed_forward.training)
            feed_forward.up.activation = None
    replace_children(model, plain_module)
    return model


@contextmanager
def accelerated(model: nn.Module) -> Iterator[nn.Module]:
    """`model` with the CPU fast paths for the duration of the block (a training run), plain again after it."""
    accelerate(model)
    try:
        yield model
    finally:
        make_plain(model)
