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
    normalize_answer,
    pearson,
    spearman,
    squad_f1,
)

__all__ = [
    "METRICS", "accuracy", "answer_exact_match", "answer_f1", "average_ranks", "binary_f1", "compute_metrics",
    "entities", "entity_f1", "entity_precision", "entity_recall", "exact_match", "macro_f1",
    "matthews_correlation", "normalize_answer", "pearson", "spearman", "squad_f1",
]
