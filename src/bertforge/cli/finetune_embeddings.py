"""`bertforge finetune-embeddings`: fine-tune a sentence encoder's vectors on rows of texts (anchor and positive,
with negatives, or scored pairs); flags and `--config run.json` fill one EmbeddingFinetuneConfig (flags win over
the file, the file over the defaults)."""

from __future__ import annotations

import argparse
from typing import Any

from bertforge.checkpoint.sentence_transformers import SUPPORTED_POOLING_MODES
from bertforge.cli import finetune as finetune_cli
from bertforge.cli.arguments import add_flag_table, flags_over_config, path_text, positive_float, positive_int
from bertforge.training.embedding_losses import EMBEDDING_LOSSES

# The flags finetune has, with its help: the data files, the model folders, the batches and the optimisation.
SHARED_FLAGS = ("--train", "--dev", "--format", "--output", "--model", "--batch-size", "--eval-batch-size",
                "--max-train-examples", "--epochs", "--max-steps", "--lr", "--weight-decay", "--warmup-ratio",
                "--warmup-steps", "--lr-schedule", "--max-grad-norm", "--grad-accum", "--eval-every", "--seed",
                "--early-stopping", "--save-every", "--device", "--bf16", "--gradient-checkpointing",
                "--no-progress", "--report-to")


def column_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    if len(names) < 2 or not all(names):
        raise argparse.ArgumentTypeError(f"two or more column names separated by commas, got {text!r}")
    return names


def dimension_list(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"whole numbers separated by commas, e.g. 384,256,128,64, got "
                                         f"{text!r}") from None
    if not all(dim > 0 for dim in dims):
        raise argparse.ArgumentTypeError(f"dimensions above 0, got {text!r}")
    return dims


FLAGS: dict[str, tuple[tuple[str, ...], Any, str]] = {
    **{flag: finetune_cli.FLAGS[flag] for flag in SHARED_FLAGS},
    "--train": (("train",), path_text, "training rows (.csv, .tsv, .jsonl, Parquet): an anchor and its positive "
                                       "(and negatives), or two texts and their similarity score"),
    "--dev": (("dev",), path_text, "rows to score after every epoch, scored pairs (Spearman's correlation) or "
                                   "anchors and positives (retrieval: mrr@10); the best model on them is kept "
                                   "(default: none, the last model is kept)"),
    "--model": (("model",), path_text, "starting model: a sentence-transformers folder, another BERT checkpoint, "
                                       "or 'default' (all-MiniLM-L6-v2)"),
    "--batch-size": (("batch_size",), positive_int, "rows per batch; with multiple_negatives_ranking each anchor's "
                                                    "negatives are the batch's other rows, so more is harder"),
    "--text-columns": (("text_columns",), column_names,
                       "the columns of the texts in order, e.g. anchor,positive,negative or sentence1,sentence2 "
                       "(default: the first of anchor/positive[/negative...], query/positive, sentence1/sentence2, "
                       "question/answer, text1/text2 the file has)"),
    "--score-column": (("score_column",), str, "column of the pairs' similarity scores (default: score, label or "
                                               "similarity, where the file has one)"),
    "--loss": (("loss",), EMBEDDING_LOSSES,
               "multiple_negatives_ranking: each anchor's positive against the batch's other texts (and the row's "
               "negatives); cosent: pairs ranked by cosine as by score; cosine_similarity: cosine fitted to each "
               "score in [-1, 1] (default: cosent for scored pairs, else multiple_negatives_ranking)"),
    "--scale": (("scale",), positive_float, "how sharply the ranking losses read cosine: 1 / temperature"),
    "--matryoshka-dims": (("matryoshka_dims",), dimension_list,
                          "train the first N dimensions as a vector too, for each N, e.g. 384,256,128,64 "
                          "(sentence-transformers' MatryoshkaLoss): encode(truncate_dim=N) then gives a smaller "
                          "vector that keeps most of the quality; the dev set is scored at each N"),
    "--pooling": (("pooling",), SUPPORTED_POOLING_MODES,
                  "how token vectors become the text's: the model's own unless given (mean for a plain BERT "
                  "checkpoint)"),
    "--max-length": (("max_length",), positive_int, "tokens per text (default: the model's max_seq_length)"),
}


def default_of(place: tuple[str, ...]) -> Any:
    from bertforge.tasks.embedding import EmbeddingFinetuneConfig

    value: Any = EmbeddingFinetuneConfig()
    for key in place:
        value = getattr(value, key)
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=path_text, metavar="FILE", default=None,
                        help="run config JSON (EmbeddingFinetuneConfig fields; flags override it) (default: none)")
    add_flag_table(parser, FLAGS, default_of, short={"--model": "-m", "--output": "-o"})
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model already in --output (otherwise that is an error)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the killed run into --output from its last checkpoint, with the same settings")


def config_from_args(args: argparse.Namespace):
    """The run config JSON (if any) with every given flag written over it."""
    from bertforge.tasks.embedding import EmbeddingFinetuneConfig

    data, source, _ = flags_over_config(args, EmbeddingFinetuneConfig, [place for place, _, _ in FLAGS.values()])
    return EmbeddingFinetuneConfig.from_dict(data, source)


def run(args: argparse.Namespace) -> int:
    from bertforge.tasks.embedding import finetune_embeddings, format_metrics

    config = config_from_args(args)
    result = finetune_embeddings(config, overwrite=args.overwrite, resume=args.resume)
    if result.finished:
        print(f"the run in {result.output_dir} had already finished")
    print(f"loss: {result.loss}")
    if result.before is not None:
        print(f"starting model: {format_metrics(result.before)}")
    if result.best is not None:
        print(f"best model (step {result.best['step']} of {result.steps}): {format_metrics(result.best)}")
    print(f"saved to {result.output_dir}")
    return 0
