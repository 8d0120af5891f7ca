from bertforge.tasks.finetune import FinetuneConfig, FinetunedModel, FinetuneResult, evaluate, finetune, predict
from bertforge.tasks.metrics import (
    METRICS,
    accuracy,
    answer_exact_match,
    answer_f1,
    average_ranks,
    binary_f1,
    compute_metrics,
    entities,
    entity_f1,
    entity_precision,
    entity_recall,
    exact_match,
    macro_f1,
    matthews_correlation,
    multi_label_macro_f1,
    multi_label_micro_f1,
    normalize_answer,
    pearson,
    spearman,
    squad_f1,
    squad_v2_exact_match,
    squad_v2_f1,
    subset_accuracy,
    tag_accuracy,
)
from bertforge.tasks.registry import TASKS, Task, get_task

__all__ = [
    "TASKS", "FinetuneConfig", "FinetuneResult", "FinetunedModel", "Task", "evaluate", "finetune", "get_task",
    "predict",
    "METRICS", "accuracy", "answer_exact_match", "answer_f1", "average_ranks", "binary_f1", "compute_metrics",
    "entities", "entity_f1", "entity_precision", "entity_recall", "exact_match", "macro_f1",
    "matthews_correlation", "multi_label_macro_f1", "multi_label_micro_f1", "normalize_answer", "pearson", "spearman",
    "squad_f1", "squad_v2_exact_match", "squad_v2_f1", "subset_accuracy", "tag_accuracy",
]
