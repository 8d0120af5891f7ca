"""AdamW with BERT's weight-decay exemptions, and the linear warm-up then linear decay schedule."""

from __future__ import annotations

from torch import nn
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR

# Scale and shift parameters of normalisation layers are never decayed: shrinking them towards zero would
# fight the normalisation itself, not limit the model's capacity.
NORMALIZATION_MODULES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d)
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices (linear weights, embeddings) decay; biases and norm parameters don't.

    Decided by what a parameter is (a vector, or a parameter of a normalisation layer), not by its name, so any
    model gets BERT's rule. Frozen parameters are left out; tied parameters are counted once.
    """
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            is_exempt = parameter.ndim < 2 or isinstance(module, NORMALIZATION_MODULES)
            (no_decay if is_exempt else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
                    eps: float = 1e-8) -> AdamW:
    """AdamW over `parameter_groups(model, weight_decay)`, with the fused kernel where the parameters' device has
    one: a single pass over each tensor instead of one per elementwise operation of the update."""
    groups = parameter_groups(model, weight_decay)
    fused = all(p.device.type in FUSED_ADAMW_DEVICES for group in groups for p in group["params"])
    return AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)


def linear_warmup_decay(optimizer: Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """Learning rate rising linearly from 0 to its peak over `warmup_steps`, then falling linearly to 0 at
    `total_steps` (BERT's schedule; transformers' get_linear_schedule_with_warmup).

    With warmup_steps=10, total_steps=110 the multiplier is 0 at step 0, 0.5 at 5, 1 at 10, 0.5 at 60, 0 at 110.
    """
    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, multiplier)
