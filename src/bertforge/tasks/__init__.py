from bertforge.tasks.embedding import EmbeddingFinetuneConfig, EmbeddingFinetuneResult, finetune_embeddings
from bertforge.tasks.finetune import FinetuneConfig, FinetuneResult, finetune
from bertforge.tasks.finetuned_model import FinetunedModel, evaluate, predict
from bertforge.tasks.metrics import (
    METRICS,
    accuracy,
    answer_exact_match,
    answer_f1,
    average_ranks,
    binary_f1,
    class_scores,
    compute_metrics,
    confusion_matrix,
    entities,
    entity_f1,
    entity_precision,
    entity_recall,
    entity_scores,
    exact_match,
    macro_f1,
    matthews_correlation,
    multi_label_macro_f1,
    multi_label_micro_f1,
    multi_label_scores,
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
    "predict", "EmbeddingFinetuneConfig", "EmbeddingFinetuneResult", "finetune_embeddings",
    "METRICS", "accuracy", "answer_exact_match", "answer_f1", "average_ranks", "binary_f1", "class_scores",
    "compute_metrics", "confusion_matrix", "entities", "entity_f1", "entity_precision", "entity_recall",
    "entity_scores", "exact_match",
    "macro_f1", "matthews_correlation", "multi_label_macro_f1", "multi_label_micro_f1", "multi_label_scores",
    "normalize_answer", "pearson", "spearman",
    "squad_f1", "squad_v2_exact_match", "squad_v2_f1", "subset_accuracy", "tag_accuracy",
]
