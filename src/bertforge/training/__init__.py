from bertforge.runtime import bf16_supported, seed_everything
from bertforge.training.distributed import ProcessInfo, is_main_process, read_environment
from bertforge.training.optim import build_optimizer, linear_warmup_decay, parameter_groups
from bertforge.training.trainer import TrainConfig, Trainer, TrainResult

__all__ = [
    "ProcessInfo", "TrainConfig", "TrainResult", "Trainer", "bf16_supported", "build_optimizer", "is_main_process",
    "linear_warmup_decay", "parameter_groups", "read_environment", "seed_everything",
]
