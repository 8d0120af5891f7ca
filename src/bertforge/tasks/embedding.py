"""Fine-tuning a sentence encoder end to end: rows of texts -> a sentence-transformers model folder.

Training rows are (anchor, positive[, negative...]) texts, learnt with in-batch negatives, or (text, text, score)
pairs, learnt so that cosine follows the score (training/embedding_losses.py). The dev set is scored the way
its rows allow: scored pairs by the rank correlation of cosine and score (sentence-transformers'
EmbeddingSimilarityEvaluator), other rows as retrieval, each distinct anchor searching every text of the other
columns for its positives (its InformationRetrievalEvaluator). The starting model is scored first, so a run says
what fine-tuning changed. The output folder is what `SentenceEncoder`, `bertforge embed` and `serve` and
sentence-transformers load, with finetune_embeddings_config.json (how it was made), the log and, with a dev
set, metrics.json.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.atomic import write_text_atomic
from bertforge.batching import LengthGroupedBatches
from bertforge.checkpoint.sentence_transformers import SUPPORTED_POOLING_MODES
from bertforge.checkpoint.train_state import check_same_settings
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.json_config import JsonConfig, check_field_types, read_json_object
from bertforge.outputs import (
    check_not_in_use,
    check_output_dir,
    finish_staging,
    staging_dir,
    start_staging,
    to_json,
)
from bertforge.tasks.data import score_label
from bertforge.tasks.metrics import pearson, spearman
from bertforge.tasks.tables import DATA_FORMATS, Table, read_table, require_columns, text_cell
from bertforge.training.embedding_losses import (
    EMBEDDING_LOSSES,
    InputExample,
    MatryoshkaLoss,
    check_dimension,
    check_scale,
)
from bertforge.training.trainer import CHECKPOINT_DIR, METRICS_FILE, TRAIN_LOG_FILE, TrainConfig, Trainer, read_log
from bertforge.validation import check_number, check_paths

logger = logging.getLogger("bertforge")

RUN_CONFIG_FILE = "finetune_embeddings_config.json"

# The text columns a file's header may hold, in the order read, when the run names none: sentence-transformers'
# datasets' names. Columns after these that start with the last name's stem ("negative_1", ...) are read too.
USUAL_TEXT_COLUMNS = (("anchor", "positive", "negative"), ("query", "positive", "negative"),
                      ("sentence1", "sentence2"), ("question", "answer"), ("text1", "text2"))
USUAL_SCORE_COLUMNS = ("score", "label", "similarity")
RETRIEVAL_DEPTH = 10  # the ranks that mrr@k and recall@k look at
# Run settings a resumed run may change: they don't change what is computed.
RESUMABLE_CHANGES = frozenset({"output", "train", "dev", "eval_batch_size", "training.progress", "training.output_dir",
                               "training.device", "training.save_every", "training.log_every", "training.report_to"})


# sentence-transformers' training defaults, where they differ from TrainConfig's (BERT's fine-tuning recipe)
TRAINING_DEFAULTS = {"lr": 2e-5, "epochs": 1, "warmup_ratio": 0.1}


@dataclass
class EmbeddingFinetuneConfig(JsonConfig):
    """Everything a run of `bertforge finetune-embeddings` needs; its flags and `--config run.json` fill it.
    Training defaults are sentence-transformers' (lr 2e-5, one epoch, a tenth of it warming up)."""

    train: str | None = None  # training rows (.csv, .tsv, .jsonl, Parquet)
    output: str | None = None  # the model folder written
    model: str = "default"  # the starting model: a sentence-transformers folder, any BERT checkpoint, or "default"
    dev: str | None = None  # rows to score after every epoch; the best model on them is kept
    format: str | None = None  # both files' format (a key of DATA_FORMATS); None: each file's extension says
    # The text columns, in order (anchor, positive, negatives...; or the two texts of a scored pair); None: the first
    # of USUAL_TEXT_COLUMNS the file has
    text_columns: tuple[str, ...] | None = None
    score_column: str | None = None  # None: the first of USUAL_SCORE_COLUMNS the file has, if any
    # A key of embedding_losses.EMBEDDING_LOSSES; None: cosent for scored pairs, multiple_negatives_ranking otherwise
    loss: str | None = None
    scale: float = 20.0  # how sharply the ranking losses read cosine (1 / temperature)
    # The loss also on the first N dimensions, for each N here (MatryoshkaLoss), so that encode(truncate_dim=N) gives
    # a usable smaller vector; the dev set is scored at each too. None: the whole vector alone
    matryoshka_dims: tuple[int, ...] | None = None
    pooling: str | None = None  # how token vectors become one (SUPPORTED_POOLING_MODES); None: the model's own
    max_length: int | None = None  # tokens per text; None: the model's max_seq_length
    batch_size: int = 32  # rows per batch: the in-batch negatives of each anchor are the batch's other rows
    eval_batch_size: int = 64
    max_train_examples: int | None = None  # use only the first N training rows
    training: TrainConfig = field(default_factory=lambda: TrainConfig(**TRAINING_DEFAULTS))

    def __post_init__(self):
        # A config built in Python gets the type checks a JSON file gets in from_dict.
        check_field_types(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                          type(self).__name__)
        if isinstance(self.training, dict):  # what it sets, over this run's defaults (not TrainConfig's)
            self.training = TrainConfig.from_dict(TRAINING_DEFAULTS | self.training, "training")
        check_paths(train=self.train, output=self.output, model=self.model, dev=self.dev)
        if self.format is not None:
            check_choice(self.format, DATA_FORMATS, "format")
        if self.text_columns is not None:
            self.text_columns = tuple(self.text_columns)
            if len(self.text_columns) < 2 or len(set(self.text_columns)) != len(self.text_columns):
                raise ConfigError(f"text_columns: two or more different columns, got {list(self.text_columns)}")
        if self.loss is not None:
            check_choice(self.loss, EMBEDDING_LOSSES, "loss")
        if self.matryoshka_dims is not None:
            self.matryoshka_dims = tuple(sorted({check_dimension(dim) for dim in self.matryoshka_dims}, reverse=True))
        if self.pooling is not None:
            check_choice(self.pooling, SUPPORTED_POOLING_MODES, "pooling")
        check_scale(self.scale)
        for name in ("batch_size", "eval_batch_size"):
            check_number(name, getattr(self, name), minimum=1, integer=True)
        check_number("max_length", self.max_length, minimum=3, integer=True, optional=True)
        check_number("max_train_examples", self.max_train_examples, minimum=1, integer=True, optional=True)
        if self.training.label_smoothing or self.training.layer_lr_decay != 1.0:
            raise ConfigError("label_smoothing and layer_lr_decay are fine-tuning options of classifiers; "
                              "finetune-embeddings trains the encoder alone")


@dataclass
class TextRows:
    """Rows of two or more texts each (an anchor first), with a score per row where the data has one."""

    texts: list[tuple[str, ...]]
    scores: list[float] | None
    columns: tuple[str, ...]
    path: str

    def __len__(self) -> int:
        return len(self.texts)


class NoTextColumns(InputError):
    """A file whose header names none of the usual text columns, and no columns were given."""


# The flags that name a file's columns, as messages name them: finetune-embeddings' (evaluate has its own).
COLUMN_FLAGS = ("--text-columns", "--score-column")


def text_columns_of(table: Table, given: Sequence[str] | None, flags: tuple[str, str] = COLUMN_FLAGS
                    ) -> tuple[str, ...]:
    """The columns a run reads texts from: those given (each must exist), else the first usual set the header has,
    with the negatives numbered after it (negative_1, negative_2, ...)."""
    if given is not None:
        for name in given:
            require_columns(table, {flags[0]: name})
        return tuple(given)
    for usual in USUAL_TEXT_COLUMNS:
        present = [name for name in usual if name in table.columns]
        if present[:2] == list(usual[:2]):
            stem = usual[-1]
            numbered = [name for name in table.columns if name.startswith(f"{stem}_") and name not in present]
            return tuple(present + numbered)
    usual = "; ".join(", ".join(names) for names in USUAL_TEXT_COLUMNS)
    raise NoTextColumns(f"no text columns named as usual ({usual}); name them with {flags[0]} (the file has "
                        f"{', '.join(map(repr, table.columns))})", table.path, table.header_line, unit=table.unit)


def read_rows(path: str | Path, text_columns: Sequence[str] | None = None, score_column: str | None = None,
              format: str | None = None, flags: tuple[str, str] = COLUMN_FLAGS) -> TextRows:
    """The rows of a data file: their texts, and their scores where the file has a score column (named, or one of
    USUAL_SCORE_COLUMNS). A missing or empty cell is an error naming its line and column; `flags` are how messages
    name the options that choose the columns."""
    table = read_table(path, format)
    columns = text_columns_of(table, text_columns, flags)
    require_columns(table, {flags[1]: score_column})
    score_column = score_column or next((name for name in USUAL_SCORE_COLUMNS if name in table.columns), None)
    if score_column in columns:
        raise table.error(f"column {score_column!r} is both a text and the score: name another with {flags[1]} or "
                          f"{flags[0]}", table.header_line, field=score_column)
    texts, scores = [], []
    for line, row in table.rows:
        texts.append(tuple(text_cell(table, line, row, name) for name in columns))
        for name, text in zip(columns, texts[-1]):
            if not text.strip():  # CSV reads an empty cell as "": a row with no text would train on nothing
                raise table.error("empty text", line, field=name)
        if score_column is not None:
            try:
                scores.append(score_label(row.get(score_column)))
            except ValueError as error:
                raise table.error(str(error), line, field=score_column) from None
    if not texts:
        raise InputError("holds no rows", path)
    return TextRows(texts, scores if score_column is not None else None, columns, str(path))


def choose_loss(name: str | None, rows: TextRows) -> str:
    """The run's loss: the one named, checked against the rows it trains on; else the usual one for them."""
    name = name or ("cosent" if rows.scores is not None else "multiple_negatives_ranking")
    kind = EMBEDDING_LOSSES[name]
    if kind.scored and rows.scores is None:
        raise InputError(f"--loss {name} learns from scored pairs, and the rows have no score column (score, label, "
                         f"similarity; or --score-column); rows of an anchor and its positive learn with "
                         f"multiple_negatives_ranking", rows.path)
    if not kind.scored and rows.scores is not None:
        raise InputError(f"--loss {name} reads each row as an anchor and its positive, and these rows are scored "
                         f"pairs (some may be unrelated): keep only the related pairs and drop the score column, or "
                         f"learn the scores with cosent", rows.path)
    if kind.columns is not None and len(rows.columns) != kind.columns:
        raise InputError(f"--loss {name} takes {kind.columns} texts per row; the rows have {len(rows.columns)} "
                         f"({', '.join(rows.columns)}): name two with --text-columns", rows.path)
    if name == "cosine_similarity":
        outside = next((score for score in rows.scores if not -1 <= score <= 1), None)
        if outside is not None:
            raise InputError(f"--loss cosine_similarity fits cosine to each score, and a score of {outside:g} is "
                             f"beyond cosine's -1 to 1: scale the scores (STS-B's 0-5 by 1/5), or use cosent, which "
                             f"reads only their order", rows.path)
    return name


class RowBatches:
    """Batches of training rows in a fresh random order each epoch (seeded by epoch, so a resumed run continues
    the same order), each collated into one tokenized batch per text column and the scores. With `distinct`, no
    text occurs twice in a batch where that can be helped (see batches_without_repeats)."""

    def __init__(self, rows: TextRows, batch_size: int, seed: int, collate, distinct: bool = False):
        self.rows, self.batch_size, self.collate, self.distinct = rows, batch_size, collate, distinct
        # pools of one batch: a plain shuffle, where rows of any length share a batch (and so their negatives)
        self.sampler = LengthGroupedBatches([0] * len(rows), batch_size, seed, pool_batches=1)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        scores = self.rows.scores
        batches = list(self.sampler)
        if self.distinct:
            batches = batches_without_repeats([i for batch in batches for i in batch], self.rows.texts,
                                              self.batch_size)
        for indices in batches:
            yield self.collate([InputExample(self.rows.texts[i], scores[i] if scores else 0.0) for i in indices])


def batches_without_repeats(order: Sequence[int], texts: Sequence[tuple[str, ...]], batch_size: int
                            ) -> list[list[int]]:
    """`order` cut into batches of `batch_size` where a row that repeats a text of the batch waits for a later one
    (sentence-transformers' NoDuplicatesBatchSampler): otherwise an anchor asked twice, or a positive given twice,
    would meet its own positive as another row's negative. As many batches as a plain cut: a batch takes a
    repeating row only when every row left repeats one of its texts."""
    batches: list[list[int]] = []
    upcoming, waiting = iter(order), []
    while len(batches) * batch_size < len(order):
        batch, seen, still_waiting = [], set(), []
        for row in waiting:  # the rows earlier batches put off come first
            if not joined(batch, seen, row, texts[row], batch_size):
                still_waiting.append(row)
        while len(batch) < batch_size and (row := next(upcoming, None)) is not None:
            if not joined(batch, seen, row, texts[row], batch_size):
                still_waiting.append(row)
        while len(batch) < batch_size and still_waiting:  # every row left repeats a text of this batch
            batch.append(still_waiting.pop(0))
        batches.append(batch)
        waiting = still_waiting
    return batches


def joined(batch: list[int], seen: set[str], row: int, texts: tuple[str, ...], batch_size: int) -> bool:
    """Put `row` in `batch` if there is room and none of its texts is in it yet."""
    if len(batch) == batch_size or not seen.isdisjoint(texts):
        return False
    batch.append(row)
    seen.update(texts)
    return True


# --- scoring ----------------------------------------------------------------------------------------------------

@dataclass
class TextVectors:
    """The vectors of a set of texts, each distinct text encoded once, as encode gives them."""

    place: dict[str, int]  # text -> its row of `vectors`
    vectors: torch.Tensor  # (distinct texts, dim)

    @classmethod
    def of(cls, encoder: nn.Module, texts: Sequence[str], batch_size: int) -> TextVectors:
        distinct = list(dict.fromkeys(texts))
        vectors = encoder.encode(distinct, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        return cls({text: i for i, text in enumerate(distinct)}, vectors.float().cpu())

    def unit(self, texts: Sequence[str], dims: int | None = None) -> torch.Tensor:
        """The unit vectors of `texts`: of their first `dims` dimensions, renormalised, where dims is given."""
        return F.normalize(self.vectors[[self.place[text] for text in texts], :dims], dim=-1)


def similarity_metrics(rows: TextRows, vectors: TextVectors, dims: int | None = None) -> dict[str, float]:
    """Scored pairs: the Spearman and Pearson correlations of each pair's cosine with its score."""
    first, second = (vectors.unit([row[column] for row in rows.texts], dims) for column in (0, 1))
    cosines = (first * second).sum(dim=1).tolist()
    return {"spearman": spearman(cosines, rows.scores), "pearson": pearson(cosines, rows.scores)}


def retrieval_metrics(rows: TextRows, vectors: TextVectors, dims: int | None = None) -> dict[str, float]:
    """Each distinct anchor searches every distinct text of the other columns: the share whose first hit is one of
    its positives (accuracy@1), the mean reciprocal rank of its first positive within the top RETRIEVAL_DEPTH, and
    the share of its positives found there (recall)."""
    positives: dict[str, set[str]] = {}
    for row in rows.texts:
        positives.setdefault(row[0], set()).add(row[1])
    queries = list(positives)
    corpus = list(dict.fromkeys(text for row in rows.texts for text in row[1:]))
    depth = min(RETRIEVAL_DEPTH, len(corpus))
    hits = (vectors.unit(queries, dims) @ vectors.unit(corpus, dims).T).topk(depth, dim=1).indices.tolist()
    first, reciprocal, recall = [], [], []
    for query, ranked in zip(queries, hits):
        found = [corpus[i] in positives[query] for i in ranked]
        first.append(found[0])
        reciprocal.append(1 / (found.index(True) + 1) if any(found) else 0.0)
        recall.append(sum(found) / len(positives[query]))
    return {"accuracy@1": float(np.mean(first)), f"mrr@{RETRIEVAL_DEPTH}": float(np.mean(reciprocal)),
            f"recall@{RETRIEVAL_DEPTH}": float(np.mean(recall))}


def score_rows(encoder: nn.Module, rows: TextRows, batch_size: int = 64, smaller: Sequence[int] = ()
               ) -> dict[str, float]:
    """The dev metrics of `encoder` on `rows`, by what the rows are (see main_metric), and the main one of the
    first N dimensions alone for each N of `smaller` ("spearman_dim64"), from the same vectors; dropout off."""
    scored = rows.scores is not None
    was_training = encoder.training
    encoder.eval()
    try:
        vectors = TextVectors.of(encoder, [text for row in rows.texts for text in (row[:2] if scored else row)],
                                 batch_size)
    finally:
        encoder.train(was_training)
    score = similarity_metrics if scored else retrieval_metrics
    metrics = score(rows, vectors)
    for dims in smaller:
        metrics[f"{main_metric(rows)}_dim{dims}"] = score(rows, vectors, dims)[main_metric(rows)]
    return metrics


def main_metric(rows: TextRows) -> str:
    """What picks the kept model: Spearman's correlation on scored pairs, else mrr@10."""
    return "spearman" if rows.scores is not None else f"mrr@{RETRIEVAL_DEPTH}"


# --- the run ------------------------------------------------------------------------------------------------------

@dataclass
class EmbeddingFinetuneResult:
    output_dir: Path
    loss: str
    before: dict[str, float] | None  # the starting model's dev metrics
    best: dict[str, Any] | None  # the kept model's (None without a dev set)
    steps: int
    finished: bool = False  # the run had ended before: nothing was trained


def load_encoder(config: EmbeddingFinetuneConfig) -> nn.Module:
    """The starting model as a SentenceEncoder, with the run's pooling and length where it names them."""
    from bertforge.compress.quantize import check_not_quantized
    from bertforge.inference.sentence_encoder import SentenceEncoder

    encoder = SentenceEncoder(config.model, device="cpu")
    check_not_quantized(encoder.model, "fine-tune", config.model)
    if config.pooling is not None:
        encoder._change(pooling=config.pooling)
    if config.max_length is not None:
        encoder.max_seq_length = config.max_length
    return encoder


def finetune_embeddings(config: EmbeddingFinetuneConfig, overwrite: bool = False, resume: bool = False
                        ) -> EmbeddingFinetuneResult:
    """Train `config.model`'s sentence vectors on `config.train` with the run's loss and keep the model that scores
    best on `config.dev` (else the last), in `config.output`. Data errors come before the model is loaded; the run
    writes into OUTPUT.incomplete/ and moves it into place at the end, and `resume` continues a killed run from its
    last checkpoint with the same settings (a run that had ended is not trained again)."""
    if config.output is None:
        raise ConfigError("an output directory is required (--output, or \"output\" in the run config)")
    if config.train is None:
        raise ConfigError("training data is required (--train, or \"train\" in the run config)")
    if config.training.early_stopping_patience is not None and config.dev is None:
        raise ConfigError(f"--early-stopping {config.training.early_stopping_patience} stops when the dev metric "
                          "stops improving: give --dev too")
    output = Path(config.output)
    staging = staging_dir(output)
    finished = resume and not staging.exists() and (output / RUN_CONFIG_FILE).is_file()
    if resume:
        check_not_in_use(output)
        saved = output / RUN_CONFIG_FILE if finished else staging / RUN_CONFIG_FILE
        if not finished and not staging.is_dir():
            raise InputError("no killed run to resume here; start the run without --resume", staging)
        if saved.is_file():  # (a run killed before it saved its settings has nothing to compare)
            check_same_settings(EmbeddingFinetuneConfig.load(saved).to_dict(), config.to_dict(), RESUMABLE_CHANGES,
                                saved)
        if not finished and not (staging / CHECKPOINT_DIR).is_dir():
            logger.warning("%s: the run was killed before its first checkpoint; it starts again", staging)
            resume = False
    else:
        check_output_dir(output, overwrite, inputs=(config.train, config.dev), models=(config.model,))
        if (staging / CHECKPOINT_DIR).exists() and not overwrite:
            raise InputError(f"holds a killed run into {output}; pass --resume to continue it, or --overwrite to "
                             "start again", staging)
    train = read_rows(config.train, config.text_columns, config.score_column, config.format)
    train.texts = train.texts[:config.max_train_examples]
    train.scores = train.scores[:config.max_train_examples] if train.scores is not None else None
    loss_name = choose_loss(config.loss, train)
    if finished:  # killed, at most, as it removed its checkpoint: the model is in place, nothing to train again
        shutil.rmtree(output / CHECKPOINT_DIR, ignore_errors=True)
        return finished_run(output, loss_name)
    dev = read_rows(config.dev, config.text_columns, config.score_column, config.format) if config.dev else None

    encoder = load_encoder(config)
    width = encoder.get_embedding_dimension()
    if config.matryoshka_dims and config.matryoshka_dims[0] > width:
        raise ConfigError(f"--matryoshka-dims {config.matryoshka_dims[0]}: {config.model} gives vectors of {width} "
                          f"dimensions")
    smaller = [dims for dims in config.matryoshka_dims or () if dims < width]  # each scored on the dev set too
    metric = main_metric(dev) if dev is not None else None
    before = score_rows(encoder, dev, config.eval_batch_size, smaller) if dev is not None else None
    if before is not None:
        logger.info("the starting model on the dev set: %s", format_metrics(before))
    staging = start_staging(output, keep=resume)
    if not resume:
        config.save(staging / RUN_CONFIG_FILE)
    loss = EMBEDDING_LOSSES[loss_name](encoder, **({"scale": config.scale} if loss_name != "cosine_similarity"
                                                   else {}))
    if config.matryoshka_dims:
        loss = MatryoshkaLoss(encoder, loss, config.matryoshka_dims)
    training = dataclasses.replace(config.training, output_dir=str(staging))
    batches = RowBatches(train, config.batch_size, training.seed, encoder.smart_batching_collate,
                         distinct=not EMBEDDING_LOSSES[loss_name].scored)  # in-batch negatives: none of its own
    trainer = Trainer(loss, training, batches,
                      evaluate=None if dev is None else (lambda _: score_rows(encoder, dev, config.eval_batch_size,
                                                                               smaller)),
                      main_metric=metric,
                      save=lambda _: encoder.save(staging), loss_fn=loss_on_batch)
    result = trainer.train(resume=resume)
    encoder.eval()
    if before is not None:  # beside every evaluation, the one before training
        summary = read_json_object(staging / METRICS_FILE, "metrics")
        write_text_atomic(staging / METRICS_FILE, to_json({"before": before} | summary, indent=2) + "\n")
    finish_staging(output)
    shutil.rmtree(output / CHECKPOINT_DIR, ignore_errors=True)  # the optimizer's state: the run is over
    if before is not None and result.best is not None and result.best[metric] < before[metric]:
        # the starting model is no candidate for the kept one: a user should know when it was the better
        logger.warning("the kept model's dev %s, %.4f, is below the starting model's, %.4f: the starting model may "
                       "serve these texts better (more rows, another loss or a lower --lr may help)", metric,
                       result.best[metric], before[metric])
    return EmbeddingFinetuneResult(output, loss_name, before, result.best, result.steps)


def finished_run(output: Path, loss_name: str) -> EmbeddingFinetuneResult:
    """The result of a run that already ended, from its folder (it is not trained or evaluated again)."""
    summary = read_json_object(output / METRICS_FILE, "metrics") if (output / METRICS_FILE).is_file() else {}
    steps = max([record.get("step", 0) for record in read_log(output / TRAIN_LOG_FILE)] or [0])
    return EmbeddingFinetuneResult(output, loss_name, summary.get("before"), summary.get("best"), steps,
                                   finished=True)


def loss_on_batch(loss: nn.Module, batch: tuple[list[dict[str, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
    return loss(*batch)


def format_metrics(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value:.4f}" for name, value in metrics.items() if name not in ("step", "epoch"))
