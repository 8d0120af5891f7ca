from bertforge.training.optim import build_optimizer, linear_warmup_decay, parameter_groups
from bertforge.training.trainer import TrainConfig, Trainer, TrainResult, bf16_supported, seed_everything

__all__ = [
    "TrainConfig", "TrainResult", "Trainer", "bf16_supported", "build_optimizer", "linear_warmup_decay",
    "parameter_groups", "seed_everything",
]
