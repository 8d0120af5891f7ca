"""`bertforge evaluate`: a fine-tuned model's metrics on a labelled file, and each label's scores where its answers
are labels (classes, entity types), printed and saved as JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.checkpoint.default_model import DEFAULT_MODEL_NAMES
from bertforge.cli import columns
from bertforge.cli.arguments import (
    STANDARD_STREAM,
    check_writable,
    inference_options,
    load_encoder,
    path_text,
    report,
)
from bertforge.cli.finetune import add_trained_model_arguments
from bertforge.errors import CheckpointError, ConfigError
from bertforge.outputs import check_not_trainer_metrics
from bertforge.tasks.finetuned_model import CONFUSION_MATRIX, EVAL_RESULTS_FILE, PER_LABEL
from bertforge.tasks.registry import TASKS

EMBEDDING = "embedding"  # --task: the sentence vectors of an encoder, as finetune-embeddings scores them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", type=path_text, required=True, help="fine-tuned model directory")
    parser.add_argument("--data", "-d", type=path_text, required=True,
                        help="labelled data (.csv, .tsv, .jsonl; CoNLL for ner; SQuAD .json for qa)")
    parser.add_argument("--task", choices=[*TASKS, EMBEDDING], default=None,
                        help=f"default: the model's own; {EMBEDDING} (the default for an encoder without a task "
                             f"head): its sentence vectors on rows of two texts, by the Spearman correlation of "
                             f"cosine and score for scored pairs, else as retrieval (accuracy@1, mrr@10, recall@10)")
    parser.add_argument("--output", "-o", type=path_text, default=None,
                        help=f"metrics JSON file, or - for standard output (default: {EVAL_RESULTS_FILE} in the model "
                             "directory; none for 'default' or a cached model's name)")
    add_trained_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint
    from bertforge.tasks.embedding import NoTextColumns
    from bertforge.tasks.finetuned_model import evaluate

    inference = inference_options(args)  # checks --device first
    checkpoint = inspect_checkpoint(args.model)
    # an encoder without a task head is scored on its sentence vectors
    embeddings = args.task == EMBEDDING or (args.task is None and checkpoint.task is None
                                            and checkpoint.head == "encoder")
    if not embeddings:  # a model without a trained head, or a --task it wasn't trained for: refused before any work
        checkpoint.task_for(args.task)
    output = args.output or default_output(args.model)
    if output is not None:
        check_writable(output, args.data, args.model)
    if embeddings:
        try:
            return evaluate_embeddings(args, inference, output)
        except NoTextColumns:
            if args.task == EMBEDDING:
                raise
            try:  # not rows of two texts: the file is for a task the model has no head for, and that is the error
                checkpoint.task_for(None)
            except CheckpointError as no_head:
                raise CheckpointError(f"{no_head}; its sentence vectors are scored on rows of two texts (columns "
                                      "sentence1 and sentence2, anchor and positive, ..., or named by --text-column "
                                      "and --text-pair-column)") from None
            raise
    metrics = evaluate(args.model, args.data, args.text_column, args.text_pair_column, args.label_column,
                       task=args.task, batch_size=args.batch_size, max_length=args.max_length, output=output,
                       inference=inference, decoding=args.decoding, format=args.format,
                       label_separator=args.label_separator, per_label=True,
                       version_2=args.version_2)
    per_label, confusion = metrics.pop(PER_LABEL, None), metrics.pop(CONFUSION_MATRIX, None)
    binary = confusion["labels"] if confusion and len(confusion["labels"]) == 2 else None
    for name, value in metrics.items():  # on standard error when the JSON record went to standard output
        # a two-class F1 is label 1's (GLUE's, scikit-learn's pos_label=1): named where the names don't say so
        of = f"  (of {binary[1]!r}, label 1)" if name == "f1" and binary and binary != ["0", "1"] else ""
        report(str(output), f"{name}: {value:.4f}{of}")
    if per_label:
        report(str(output), label_table(per_label))
    if confusion:
        report(str(output), confusion_table(confusion["labels"], confusion["matrix"]))
    if output is not None and str(output) != STANDARD_STREAM:
        print(f"saved to {output}")
    return 0


def evaluate_embeddings(args: argparse.Namespace, inference, output: str | Path | None) -> int:
    """An encoder's sentence vectors on rows of texts, scored as finetune-embeddings scores its dev set: scored
    pairs by the correlations of cosine and score, other rows as retrieval."""
    from bertforge.inference.sentence_encoder import SentenceEncoder
    from bertforge.outputs import to_json, write_output
    from bertforge.tasks.embedding import read_rows, score_rows

    named = [name for name in (args.text_column, args.text_pair_column) if name is not None]
    if len(named) == 1:
        raise ConfigError("an encoder is scored on rows of two texts: give --text-column and --text-pair-column "
                          "together (or neither, for the usual names: sentence1/sentence2, anchor/positive, ...)")
    rows = read_rows(args.data, named or None, args.label_column, args.format,
                     flags=("--text-column and --text-pair-column", "--label-column"))
    encoder = SentenceEncoder(*load_encoder(args.model, inference))
    if args.max_length is not None:
        encoder.max_seq_length = args.max_length
    metrics = score_rows(encoder, rows, args.batch_size)
    for name, value in metrics.items():
        report(str(output), f"{name}: {value:.4f}")
    if output is not None:
        write_output(output, to_json(metrics, indent=2) + "\n")
        if str(output) != STANDARD_STREAM:
            print(f"saved to {output}")
    return 0


def label_table(per_label: dict[str, dict[str, float]]) -> str:
    """Each label's scores as a table, then their macro (unweighted) and weighted (by support) averages, as
    scikit-learn's and seqeval's classification_report print them."""
    total = sum(s["support"] for s in per_label.values())
    averages = {name: {"support": total} | {
        score: sum(s[score] * weight(s) for s in per_label.values()) / max(sum(map(weight, per_label.values())), 1)
        for score in ("precision", "recall", "f1")}
        for name, weight in (("macro avg", lambda s: 1), ("weighted avg", lambda s: s["support"]))}
    width = max(len("weighted avg"), *map(columns.cells, per_label))
    rows = [f"{'label':<{width}}  precision  recall      f1  support"]
    rows += [columns.left(label, width) + f"  {s['precision']:9.4f}  {s['recall']:6.4f}  {s['f1']:6.4f}  "
             f"{s['support']:7d}" for label, s in (per_label | averages).items()]
    return "\n".join(rows)


def confusion_table(labels: list[str], matrix: list[list[int]]) -> str:
    """The confusion matrix as a table: a row per true label, a column per predicted one."""
    width = max(len("true"), *map(columns.cells, labels))
    widths = [max(columns.cells(label), *(len(str(row[j])) for row in matrix)) for j, label in enumerate(labels)]
    rows = ["confusion matrix (rows: true label, columns: predicted)",
            f"{'true':<{width}}" + "".join(f"  {columns.right(label, w)}" for label, w in zip(labels, widths))]
    rows += [columns.left(label, width) + "".join(f"  {count:>{w}}" for count, w in zip(row, widths))
             for label, row in zip(labels, matrix)]
    return "\n".join(rows)


def default_output(model: str) -> Path | None:
    """The model folder's eval_results.json (unless transformers' Trainer left its own there); a named model
    ('default', or one of the Hugging Face cache) is no folder of the user's to write in."""
    if model in DEFAULT_MODEL_NAMES or not Path(model).is_dir():
        return None
    return check_not_trainer_metrics(Path(model) / EVAL_RESULTS_FILE)
