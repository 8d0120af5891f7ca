"""AdamW with BERT's weight-decay exemptions and, optionally, layer-wise learning-rate decay; the learning-rate
schedules (warm-up, then BERT's linear decay, a cosine or a constant)."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR

from bertforge.checkpoint.pretrained import encoders_of
from bertforge.errors import ConfigError, check_choice

# Scale and shift parameters of normalisation layers are never decayed: shrinking them towards zero would
# fight the normalisation itself, not limit the model's capacity.
NORMALIZATION_MODULES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d)
FUSED_ADAMW_DEVICES = ("cpu", "cuda")

# After the warm-up, the learning rate's multiplier at `progress` (0 at the warm-up's end, 1 at the last step), as
# transformers' lr_scheduler_type of the same name with warm-up (constant: its "constant_with_warmup").
LR_SCHEDULES: dict[str, Callable[[float], float]] = {
    "linear": lambda progress: 1.0 - progress,  # BERT's
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),  # half a cosine, from 1 to 0
    "constant": lambda progress: 1.0,
}


def layer_depths(model: nn.Module) -> tuple[dict[int, int], int]:
    """Each parameter's depth in `model`'s BERT encoder, by id: the embeddings 0, encoder layer i i + 1; and the
    depth of everything else (the pooler, the task's head), the number of layers + 1."""
    encoders = encoders_of(model)
    if len(encoders) != 1:
        raise ConfigError(f"layer_lr_decay needs a model with one BERT encoder; {type(model).__name__} has "
                          f"{len(encoders)}")
    encoder = encoders[0]
    owner = next((module for module in model.modules() if getattr(module, "encoder", None) is encoder), None)
    depths = {}
    for depth, part in enumerate([getattr(owner, "embeddings", None), *encoder.layers]):
        for parameter in part.parameters() if part is not None else ():
            depths.setdefault(id(parameter), depth)  # a tied parameter (the MLM decoder's) is the embeddings'
    return depths, len(encoder.layers) + 1


def parameter_groups(model: nn.Module, weight_decay: float, lr: float | None = None,
                     layer_lr_decay: float = 1.0) -> list[dict]:
    """AdamW groups: matrices (linear weights, embeddings) decay; biases and norm parameters don't.

    Decided by what a parameter is (a vector, or a parameter of a normalisation layer), not by its name, so any
    model gets BERT's rule. Frozen parameters are left out; tied parameters are counted once.

    With `layer_lr_decay` below 1 (ELECTRA's and BEiT's recipe for fine-tuning), the learning rate shrinks by that
    factor at each level down the encoder: the head and pooler train at `lr`, the top layer at lr x decay, the
    embeddings at lr x decay ** (layers + 1); one pair of groups per level, each with its `lr`.
    """
    if layer_lr_decay == 1.0:
        depths, top = {}, 0
    elif lr is None:
        raise ConfigError("layer_lr_decay sets each group's rate from the peak lr: give lr too")
    else:
        depths, top = layer_depths(model)
    groups: dict[tuple[int, bool], list[nn.Parameter]] = {}
    seen = set()
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            is_exempt = parameter.ndim < 2 or isinstance(module, NORMALIZATION_MODULES)
            groups.setdefault((depths.get(id(parameter), top), is_exempt), []).append(parameter)
    if layer_lr_decay == 1.0:  # the two groups every run had before layer decay (a checkpoint's optimizer state)
        return [{"params": groups.get((0, False), []), "weight_decay": weight_decay},
                {"params": groups.get((0, True), []), "weight_decay": 0.0}]
    return [{"params": parameters, "weight_decay": 0.0 if is_exempt else weight_decay,
             "lr": lr * layer_lr_decay ** (top - depth)}
            for (depth, is_exempt), parameters in sorted(groups.items())]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
                    eps: float = 1e-8, layer_lr_decay: float = 1.0) -> AdamW:
    """AdamW over `parameter_groups(model, weight_decay, lr, layer_lr_decay)`, with the fused kernel where the
    parameters' device has one: a single pass over each tensor instead of one per elementwise operation of the
    update."""
    groups = parameter_groups(model, weight_decay, lr, layer_lr_decay)
    fused = all(p.device.type in FUSED_ADAMW_DEVICES for group in groups for p in group["params"])
    return AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)


def warmup_schedule(optimizer: Optimizer, warmup_steps: int, total_steps: int, shape: str = "linear") -> LambdaLR:
    """Each group's learning rate rising linearly from 0 to its peak over `warmup_steps`, then following
    LR_SCHEDULES[shape] down to `total_steps` (linear: BERT's, transformers' get_linear_schedule_with_warmup).

    Linear, with warmup_steps=10, total_steps=110: the multiplier is 0 at step 0, 0.5 at 5, 1 at 10, 0.5 at 60 and
    0 at 110; cosine: 0.5 at 60 too, 0.85 at 35.
    """
    check_choice(shape, LR_SCHEDULES, "lr_schedule")
    after_warmup = LR_SCHEDULES[shape]

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        if step >= total_steps:  # the run's end, where the warm-up lasts the whole run too
            return max(0.0, after_warmup(1.0))
        return max(0.0, after_warmup((step - warmup_steps) / max(1, total_steps - warmup_steps)))

    return LambdaLR(optimizer, multiplier)
