from bertforge.runtime import bf16_supported, seed_everything
from bertforge.training.distributed import ProcessInfo, is_main_process, read_environment
from bertforge.training.embedding_losses import (
    EMBEDDING_LOSSES,
    CoSENTLoss,
    CosineSimilarityLoss,
    InputExample,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)
from bertforge.training.optim import LR_SCHEDULES, build_optimizer, parameter_groups, warmup_schedule
from bertforge.training.trainer import TrainConfig, Trainer, TrainResult

__all__ = [
    "EMBEDDING_LOSSES", "CoSENTLoss", "CosineSimilarityLoss", "InputExample", "MatryoshkaLoss",
    "MultipleNegativesRankingLoss",
    "LR_SCHEDULES", "ProcessInfo", "TrainConfig", "TrainResult", "Trainer", "bf16_supported", "build_optimizer",
    "is_main_process",
    "parameter_groups", "read_environment", "seed_everything", "warmup_schedule",
]
