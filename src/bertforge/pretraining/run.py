"""A pre-training run from a prepared corpus: `pretrain(PretrainConfig)` trains, logs, checkpoints and resumes,
scoring held-out documents with `evaluation.evaluate_mlm`.

Step-based over an endless instance stream, so it has its own small loop rather than the epoch-based Trainer;
it shares the Trainer's optimiser, schedule, seeding and bf16 helpers. Under torchrun every process trains on its
own part of the corpus with DistributedDataParallel, and only rank 0 writes. The run writes into
OUTPUT.incomplete/ (where `resume` finds it) and moves it to OUTPUT when it ends, so a killed or failed run leaves a
model already in OUTPUT as it was. Output folder:

    config.json, model.safetensors    the trained model, an ordinary checkpoint (ELECTRA: its discriminator)
    vocab.txt, tokenizer_config.json  the tokenizer the corpus was prepared with
    pretrain_config.json              this run's PretrainConfig
    trained_on.json                   the corpus it trained on (folder, content hash, documents, held out)
    log.jsonl                         one JSON line per logged step or evaluation
    runs/                             with report_to ["tensorboard"]: the log's records as TensorBoard scalars
    checkpoint/train_state.pt         the latest resumable state, replaced atomically every save_every steps
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge import fast_cpu
from bertforge.atomic import write_text_atomic
from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import CONFIG_FILE, config_path, read_state_dict
from bertforge.checkpoint.pretrained import load_hf_state_dict, set_gradient_checkpointing
from bertforge.checkpoint.train_state import (
    TRAIN_STATE_FILE,
    check_same_settings,
    load_train_state,
    read_train_state,
    restore_rng_states,
    rng_states,
    save_train_state,
)
from bertforge.config import PRESETS, BertConfig, dropout_overrides
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.json_config import JsonConfig
from bertforge.outputs import (
    check_not_in_use,
    check_output_dir,
    finish_staging,
    staging_dir,
    start_staging,
    to_json,
)
from bertforge.pretraining.collate import PretrainingCollator, batches
from bertforge.pretraining.corpus import TOKENIZER_DIR, CorpusReader, tokenizer_identity
from bertforge.pretraining.evaluation import batch_counts, evaluate_mlm, summarise
from bertforge.pretraining.heads import ElectraForPreTraining
from bertforge.pretraining.instances import SHORT_SEQ_PROB, InstanceStream
from bertforge.pretraining.masking import MASK_PROBABILITY, Masker, strategy_function
from bertforge.pretraining.objectives import get_objective
from bertforge.progress import progress_bar
from bertforge.runtime import bf16_supported, resolve_device, seed_everything, to_device
from bertforge.tokenizer.tokenizer import BertTokenizer
from bertforge.tokenizer.vocab import Vocab
from bertforge.training import distributed
from bertforge.training.optim import LR_SCHEDULES, build_optimizer, warmup_schedule
from bertforge.training.reporting import Reporters, report_to_names
from bertforge.training.stopping import Stopped, stop_on_sigterm
from bertforge.training.trainer import CHECKPOINT_DIR, keep_log_until, read_log
from bertforge.validation import MAX_SEED, check_number, check_paths

logger = logging.getLogger("bertforge")
progress = logging.getLogger("bertforge.progress")  # shown by the CLI without -v: held-out metrics as they come

RUN_CONFIG_FILE = "pretrain_config.json"
TRAINED_ON_FILE = "trained_on.json"
HELD_OUT_WARNING = 0.1  # a held-out share of the corpus's tokens worth a warning
LOG_FILE = "log.jsonl"
# Peak dense throughput of the 2-core development CPU (AVX-512 FMA), the denominator of model FLOPs utilisation.
DEFAULT_PEAK_GFLOPS = 552.0
# Fields that may change between a run and its resumption: they don't affect what is computed.
RESUMABLE_CHANGES = frozenset({"output", "save_every", "log_every", "eval_every", "eval_batches", "progress",
                               "peak_gflops", "data", "tokenizer", "report_to"})
# Fields that differ between the processes of one run: not settings of the run.
PER_PROCESS = frozenset({"rank"})


@dataclass
class PretrainConfig(JsonConfig):
    """A pre-training run. Defaults follow BERT (AdamW 1e-4, decay 0.01, eps 1e-6, linear warm-up and decay)."""

    data: str  # a folder written by prepare_corpus
    output: str
    model: str = "tiny"  # a BertConfig preset name, or a config.json path (vocab_size comes from the tokenizer)
    # A model directory (or "default") whose weights start the run instead of a random initialisation, its
    # config.json giving the architecture (then `model` is not used): continued pre-training, such as BERT's second
    # phase at longer sequences, or more pre-training of a released model on the user's own text.
    init_from: str | None = None
    dropout: float | None = None  # replaces the model's dropout (hidden and attention); None keeps it (BERT: 0.1)
    # A model directory, 'default', or a vocab.txt: must be the corpus's tokenizer; None: the corpus's own (which
    # `pretrain prepare` keeps in its folder).
    tokenizer: str | None = None
    do_lower_case: bool = True  # for a bare vocab.txt; a model directory's tokenizer_config.json decides
    objective: str = "mlm+nsp"
    masking: str = "token"
    mask_probability: float = MASK_PROBABILITY
    steps: int = 1000  # optimizer steps
    batch_size: int = 32  # sequences per forward pass, in each process
    grad_accumulation: int = 1  # forward passes per optimizer step (global batch: batch x world_size x this)
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    warmup_steps: int | None = None  # None: 1% of the steps (BERT: 10k of 1M)
    lr_schedule: str = "linear"  # after the warm-up (a key of optim.LR_SCHEDULES): linear (BERT's), cosine, constant
    max_grad_norm: float | None = 1.0
    seq_len: int = 128
    short_seq_prob: float = SHORT_SEQ_PROB
    holdout: int | float = 0.01  # documents kept out of training for evaluation: a count or a fraction
    save_every: int | None = 1000  # steps between checkpoints; the end of the run always saves one
    log_every: int = 10
    eval_every: int | None = None  # steps between held-out evaluations; None: only at the end
    eval_batches: int = 20
    bf16: bool = False  # bf16 autocast where the hardware has it, else float32 with a warning
    fp16: bool = False  # fp16 autocast with a dynamic loss scale (GradScaler), for GPUs without bf16; CUDA only
    compile: bool = False  # torch.compile the model for training (evaluation runs it eagerly)
    # Recompute each encoder layer's activations in the backward pass: less memory, about a third more compute.
    gradient_checkpointing: bool = False
    seed: int = 0
    peak_gflops: float = DEFAULT_PEAK_GFLOPS
    device: str | None = None  # None: CUDA when available, else CPU
    progress: bool = True
    # Dashboards that get the log's records too, in OUTPUT/runs (keys of reporting.REPORTERS: "tensorboard"); one name
    # alone is read as a tuple of it, as transformers' report_to="tensorboard"
    report_to: tuple[str, ...] | str | None = None
    # This process's place in a torchrun launch (the CLI reads it from torchrun's environment): rank `rank` of
    # `world_size` trains on every world_size-th document with DDP. They must match that environment.
    rank: int = 0
    world_size: int = 1

    def __post_init__(self):
        self.betas = tuple(self.betas)
        self.report_to = report_to_names(self.report_to)
        get_objective(self.objective)
        strategy_function(self.masking)
        for name in ("steps", "batch_size", "grad_accumulation", "seq_len", "log_every", "eval_batches"):
            check_number(name, getattr(self, name), minimum=1, integer=True)
        for name in ("save_every", "eval_every"):
            check_number(name, getattr(self, name), minimum=1, integer=True, optional=True)
        check_number("warmup_steps", self.warmup_steps, minimum=0, integer=True, optional=True)
        check_choice(self.lr_schedule, LR_SCHEDULES, "lr_schedule")
        check_number("lr", self.lr, minimum=0.0, exclusive=True)
        check_number("weight_decay", self.weight_decay, minimum=0.0)
        check_number("eps", self.eps, minimum=0.0, exclusive=True)
        check_number("max_grad_norm", self.max_grad_norm, minimum=0.0, exclusive=True, optional=True)
        check_number("peak_gflops", self.peak_gflops, minimum=0.0, exclusive=True)
        check_number("seed", self.seed, minimum=0, maximum=MAX_SEED, integer=True)
        check_paths(data=self.data, output=self.output, model=self.model, init_from=self.init_from,
                    tokenizer=self.tokenizer)
        dropout_overrides(self.dropout)  # validates it
        if self.init_from is not None and self.objective == "electra":
            raise ConfigError("init_from starts the BERT objectives (mlm, mlm+nsp, mlm+sop) from a model; ELECTRA "
                              "trains a generator and a discriminator from scratch")
        if not 0.0 < self.mask_probability < 1.0:
            raise ConfigError(f"mask_probability must be in (0, 1), got {self.mask_probability!r}")
        check_number("world_size", self.world_size, minimum=1, integer=True)
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank must be in 0..{self.world_size - 1}, got {self.rank}")
        if self.bf16 and self.fp16:
            raise ConfigError("bf16 and fp16 exclude each other: choose one autocast precision")

    @property
    def total_warmup_steps(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else round(0.01 * self.steps)


@dataclass
class PretrainResult:
    steps: int
    history: list[dict[str, Any]]  # every record written to log.jsonl by this process
    output: Path


# ---------------------------------------------------------------- building the pieces


def masker_of(run: PretrainConfig, vocab: Vocab, masking: str | None = None) -> Masker:
    """The run's masking: its strategy (or `masking`), its probability, and what its objective makes of a chosen
    token (BERT's 80/10/10, ELECTRA's 85/15), for training and for every evaluation of it."""
    return Masker(vocab, masking or run.masking, run.mask_probability, get_objective(run.objective).replacement)


def load_tokenizer(name_or_path: str, do_lower_case: bool = True) -> BertTokenizer:
    if Path(name_or_path).is_file():
        return BertTokenizer(name_or_path, do_lower_case=do_lower_case)
    return BertTokenizer.from_pretrained(name_or_path)


def corpus_tokenizer(reader: CorpusReader) -> BertTokenizer:
    """The tokenizer a corpus was prepared with, kept in its folder."""
    if not (reader.directory / TOKENIZER_DIR).is_dir():
        raise ConfigError(f"{reader.directory} was prepared without keeping its tokenizer (an older bertforge); "
                          "pass the --vocab it was prepared with, or prepare it again")
    return BertTokenizer.from_pretrained(reader.directory / TOKENIZER_DIR)


def check_tokenizer(tokenizer: BertTokenizer, reader: CorpusReader, source: str) -> None:
    """The corpus stores ids: training with another vocabulary or other settings would learn nonsense."""
    prepared = reader.manifest["tokenizer"]
    current = json.loads(json.dumps(tokenizer_identity(tokenizer)))  # the same JSON types as the manifest
    different = [key for key in prepared if prepared[key] != current.get(key)]
    if different:
        raise ConfigError(f"the tokenizer {source!r} is not the one {reader.directory} was prepared with "
                          f"({different[0]} differs): its ids would mean other tokens (pretrain train uses the "
                          "corpus's own tokenizer unless --vocab names one)")


def model_config(name_or_path: str, tokenizer: BertTokenizer, seq_len: int, dropout: float | None = None,
                 init_from: str | None = None) -> BertConfig:
    """A preset name or config.json, with the tokenizer's vocabulary size and padding id (and `dropout`); with
    `init_from`, that model directory's config.json, whose vocabulary must be the tokenizer's."""
    overrides = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.vocab.pad_token_id,
                 **dropout_overrides(dropout)}
    if init_from is not None:
        from bertforge.compress.quantize import check_not_quantized  # compress builds on the models

        path = config_path(resolve_model_dir(init_from))
        config = BertConfig.load(path)  # a ConfigError naming the file if there is none
        check_not_quantized(path.parent, "pre-train from", init_from)
        if config.vocab_size != len(tokenizer):
            raise ConfigError(f"{path}: vocab_size {config.vocab_size} differs from the corpus tokenizer's "
                              f"{len(tokenizer)}; prepare the corpus with that model's vocabulary")
        config = dataclasses.replace(config, **overrides)
    elif name_or_path in PRESETS:
        config = BertConfig.preset(name_or_path, **overrides)
    elif name_or_path.endswith(".json") or Path(name_or_path).is_file():
        config = dataclasses.replace(BertConfig.load(name_or_path), **overrides)
    else:
        raise ConfigError(f"unknown model size {name_or_path!r}; choose from {', '.join(PRESETS)} or a config.json")
    if config.max_position_embeddings < seq_len:
        raise ConfigError(f"seq_len={seq_len} exceeds the model's max_position_embeddings "
                          f"({config.max_position_embeddings})")
    return config


def initialise_from(model: nn.Module, directory: str, report: bool = True) -> None:
    """Copy a checkpoint's weights into a fresh pre-training model; heads it lacks (say, the NSP head of an
    MLM-only model) keep their initialisation."""
    state, source = read_state_dict(resolve_model_dir(directory))
    loaded = load_hf_state_dict(model, state, source, initialisable=model.initialisable)
    if report:
        loaded.log(source)


# ---------------------------------------------------------------- the run


def _check_resumable(saved: dict[str, Any], config: PretrainConfig, path: Path) -> None:
    saved = PretrainConfig.from_dict(saved, str(path)).to_dict()  # a field added since: its default
    check_same_settings(saved, config.to_dict(), RESUMABLE_CHANGES | PER_PROCESS, path)


def _check_launch(config: PretrainConfig) -> distributed.ProcessInfo:
    """This process's place in the launch, which must be the config's: a torchrun process that believes it is
    alone would write the output folder at the same time as its peers."""
    info = distributed.read_environment()
    if (info.rank, info.world_size) != (config.rank, config.world_size):
        raise ConfigError(f"the run config says rank {config.rank} of {config.world_size}, but this process was "
                          f"started as rank {info.rank} of {info.world_size}; start multi-process runs with torchrun "
                          "and take rank and world_size from its environment (distributed.read_environment)")
    return info


def save_final_model(model: nn.Module, tokenizer: BertTokenizer, directory: Path) -> None:
    """An ordinary checkpoint directory: what BertModel / BertFor*.from_pretrained and transformers read."""
    keep = model.discriminator if isinstance(model, ElectraForPreTraining) else model
    keep.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def pretrain(config: PretrainConfig, resume: bool = False, overwrite: bool = False) -> PretrainResult:
    """Pre-train a model as `config` says, writing to config.output (see the module docstring); `resume`
    continues a killed run from OUTPUT.incomplete/checkpoint exactly: the same batches, masks, dropout and losses as
    without a stop (a finished run is not run or evaluated again). A folder that holds a model is replaced only with
    `overwrite`, and only when the run ends.

    Under torchrun (config.rank and world_size from its environment) each process trains on its part of the
    corpus and DDP averages the gradients; rank 0 alone writes the log, checkpoints (holding every rank's data
    position and random state) and the model, and scores the held-out split, so evaluations are those of a
    single process. The process group is joined here (unless the caller already has one) and left on return,
    once rank 0 has finished writing.
    """
    info = _check_launch(config)
    resolve_device(config.device)  # this machine has the device asked for, before any work
    device = distributed.select_device(config.device, info)
    work = staging_dir(config.output)
    if resume:
        check_not_in_use(config.output)  # a killed run's folder, not a running one's
    if resume and work.is_dir() and not (work / CHECKPOINT_DIR / TRAIN_STATE_FILE).is_file():
        # Killed before its first checkpoint: nothing to continue, so the run starts again (with the settings it
        # started with, where it saved them), as a first start would: into a folder that may be replaced.
        if (work / RUN_CONFIG_FILE).is_file():
            _check_resumable(json.loads((work / RUN_CONFIG_FILE).read_text()), config, work / RUN_CONFIG_FILE)
        if config.rank == 0:
            logger.warning("%s: the run was killed before its first checkpoint; it starts again", work)
        resume = False
    if not resume:
        check_output_dir(config.output, overwrite or config.rank > 0, inputs=(config.data,), models=(config.init_from,))
    if config.fp16 and device.type != "cuda":
        raise ConfigError(f"fp16 training needs a CUDA device (this run is on {device.type}); "
                          "use bf16, or neither for float32")
    # A missing tensorboard is an error now, before any work; the reporters are closed however the run ends.
    with Reporters(config.report_to) as reporters, distributed.process_group(info, device):
        return _train(config, resume, device, overwrite, reporters)


def _finished_run(config: PretrainConfig, work: Path, is_main: bool) -> PretrainResult | None:
    """The result of a run that already ended (in place, or in its staging folder when it was killed while moving
    there), which is not run or evaluated again; None when there is a killed run to resume."""
    saved = read_train_state(work / CHECKPOINT_DIR)
    _check_resumable(saved["extra"].get("config", {}), config, work / CHECKPOINT_DIR / TRAIN_STATE_FILE)
    if saved["step"] < config.steps or not (work / CONFIG_FILE).is_file():
        return None
    logger.warning("the run in %s had already finished (%d steps); nothing to resume", config.output, saved["step"])
    if is_main and work != Path(config.output):
        finish_staging(config.output)
    history = [record for record in read_log(Path(config.output) / LOG_FILE) if is_main]
    return PretrainResult(steps=saved["step"], history=history, output=Path(config.output))


def _train(config: PretrainConfig, resume: bool, device: torch.device, overwrite: bool = False,
           reporters: Reporters | None = None) -> PretrainResult:
    is_main = config.rank == 0
    output = Path(config.output)
    work = staging_dir(output)  # where the run writes until it ends
    checkpoint_dir = work / CHECKPOINT_DIR
    if resume:
        # A finished run is in OUTPUT; a killed one in its staging folder (read_train_state names what is missing).
        finished = _finished_run(config, output if not work.exists() else work, is_main)
        if finished is not None:
            return finished
    elif (checkpoint_dir / TRAIN_STATE_FILE).exists() and not overwrite:
        raise ConfigError(f"{work} holds a killed run into {output}; pass --resume to continue it, --overwrite to "
                          "start again, or choose another output folder")

    reader = CorpusReader(config.data, split="train", holdout=config.holdout, rank=config.rank,
                          world_size=config.world_size)
    if not config.do_lower_case and (config.tokenizer is None or not Path(config.tokenizer).is_file()):
        # A tokenizer folder (the corpus's, a model's) records its own casing; only a bare vocab.txt needs telling.
        source = config.tokenizer or "the corpus's tokenizer"
        raise ConfigError(f"--cased applies to a vocab.txt given with --vocab; {source} keeps its own casing")
    tokenizer = corpus_tokenizer(reader) if config.tokenizer is None else load_tokenizer(config.tokenizer,
                                                                                          config.do_lower_case)
    check_tokenizer(tokenizer, reader, config.tokenizer or str(reader.directory / TOKENIZER_DIR))
    objective = get_objective(config.objective)
    bert_config = model_config(config.model, tokenizer, config.seq_len, config.dropout, config.init_from)
    masker = masker_of(config, tokenizer.vocab)

    use_bf16 = config.bf16 and bf16_supported(device.type)
    if config.bf16 and not use_bf16 and is_main:
        logger.warning("bf16 was asked for but %s has no native bf16 support; training in float32", device.type)
    autocast_dtype = torch.bfloat16 if use_bf16 else torch.float16 if config.fp16 else None
    own_seed = distributed.rank_seed(config.seed, config.rank)  # config.seed on rank 0
    seed_everything(config.seed)
    model = objective.build_model(bert_config)  # the same initial weights in every process
    if config.init_from is not None and not resume:
        initialise_from(model, config.init_from, is_main)
    model = model.to(device)
    set_gradient_checkpointing(model, config.gradient_checkpointing)
    if config.rank > 0:
        # Dropout masks of its own for each process; rank 0 keeps the generator as initialisation left it, so a
        # single process draws exactly what it always did.
        seed_everything(own_seed)
    optimizer = build_optimizer(model, config.lr, config.weight_decay, config.betas, config.eps)
    scheduler = warmup_schedule(optimizer, config.total_warmup_steps, config.steps, config.lr_schedule)
    # fp16 only: scales the loss up so that small gradients survive half precision; otherwise it does nothing.
    scaler = torch.amp.GradScaler(device.type, enabled=config.fp16)
    stream = InstanceStream(reader, config.seq_len, objective.sentence_pairs, config.short_seq_prob, seed=config.seed)
    collator = PretrainingCollator(masker, tokenizer.vocab.pad_token_id, seed=own_seed)
    sampler = torch.Generator(device).manual_seed(own_seed)  # ELECTRA's generator samples
    eval_reader = CorpusReader(config.data, split="eval", holdout=config.holdout) if config.holdout else None
    if eval_reader is not None and is_main:
        _report_held_out(eval_reader)

    step = 0
    if resume:
        state = load_train_state(checkpoint_dir, model, optimizer, scheduler, scaler)
        position = state.data
        if config.world_size > 1:
            position = state.data["ranks"][config.rank]
            restore_rng_states(position["rng"])  # this process's own; load_train_state restored rank 0's
        stream.load_state_dict(position["stream"])
        collator.load_state_dict(position["collator"])
        sampler.set_state(position["sampler"])
        step = state.step
        if is_main:
            start_staging(output, keep=True)  # the killed run's folder, locked for this one
            keep_log_until(work / LOG_FILE, step)
            logger.info("resuming from step %d", step)
    elif is_main:
        start_staging(output)
        (work / LOG_FILE).write_text("")
    resumed_from = step
    reporters = reporters or Reporters(None)
    if is_main:
        if reporters.names:  # the log is read again only for them
            reporters.start(work, step if resume else None, read_log(work / LOG_FILE))
        config.save(work / RUN_CONFIG_FILE)
        tokenizer.save_pretrained(work)
        # what pretrain eval checks the corpus against: prepared again, its held-out split would be other documents
        write_text_atomic(work / TRAINED_ON_FILE, json.dumps({
            "corpus": str(Path(config.data).resolve()), "content_sha256": reader.manifest.get("content_sha256"),
            "documents": reader.manifest["documents"], "holdout": config.holdout}, indent=1) + "\n")
    # DDP averages the gradients over processes; compile wraps DDP (not the reverse) so that DDP's communication
    # hooks stay outside the compiled graphs. `model` itself is what is saved and evaluated.
    fast_cpu.accelerate(model)  # the model lives only for this run; its parameters (all that is saved) are shared
    synced = distributed.wrap_ddp(model, device)
    train_model = torch.compile(synced) if config.compile else synced

    def autocast():
        return torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)

    def save_checkpoint() -> None:
        data = {"stream": stream.state_dict(), "collator": collator.state_dict(), "sampler": sampler.get_state(),
                # the sums of the steps since the last log line, which a resumed run's next line includes
                "log_window": dict(window), "log_seconds": window_seconds}
        if config.world_size > 1:
            data = {"ranks": distributed.gather_to_main({**data, "rng": rng_states()})}
        if is_main:
            save_train_state(checkpoint_dir, model, optimizer, scheduler, step, data, {"config": config.to_dict()},
                             scaler)

    history: list[dict[str, Any]] = []

    def log(record: dict[str, Any]) -> None:
        if not is_main:
            return
        history.append(record)
        with open(work / LOG_FILE, "a", encoding="utf-8") as handle:
            handle.write(to_json(record) + "\n")
        reporters.report(record)

    def evaluate() -> None:
        # Rank 0 scores the whole held-out split alone, so that the numbers are a single process's; the others
        # wait for it at their next collective.
        if eval_reader is None or not is_main:
            return
        with autocast():
            metrics = evaluate_mlm(model, eval_reader, masker, tokenizer.vocab.pad_token_id, config.batch_size,
                                   config.seq_len, config.eval_batches, config.seed, device)
        progress.info("step %d, held-out masked LM: loss %.4f, perplexity %.2f, accuracy %.4f", step,
                      metrics["loss"], metrics["perplexity"], metrics["accuracy"])
        log({"event": "eval", "step": step, **metrics})

    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    data = batches(stream, collator, config.batch_size)
    model.train()
    bar = progress_bar(total=config.steps, initial=step, desc="pre-training", unit="step",
                       enabled=config.progress and is_main)
    window, window_seconds = {}, 0.0
    if resume:
        window, window_seconds = dict(position.get("log_window", {})), position.get("log_seconds", 0.0)
    with stop_on_sigterm(device) as stop_requested:
        while step < config.steps:
            started = time.perf_counter()
            for micro_batch in range(config.grad_accumulation):
                batch = to_device(next(data), device)
                with distributed.no_sync(synced, skip=micro_batch < config.grad_accumulation - 1):
                    with autocast():
                        result = objective.loss(train_model, batch, sampler)
                    scaler.scale(result.loss / config.grad_accumulation).backward()
                counts = {"loss": result.loss.item(), "micro_batches": 1, **batch_counts(result, batch)}
                for key, value in counts.items():
                    window[key] = window.get(key, 0) + value
            if config.max_grad_norm is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
                nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            scaler.step(optimizer)  # with fp16, skipped when the gradients overflowed
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_seconds += time.perf_counter() - started
            bar.update(1)
            if step % config.log_every == 0 or step == config.steps:
                window = distributed.all_reduce_sums(window, device)  # the global batch: every process's sums
                # MFU: the tokens of all processes over the peak of all their devices
                record = summarise(window, window_seconds, parameters, config.peak_gflops * config.world_size)
                bar.set_postfix(loss=f"{record['loss']:.4f}", mlm_acc=f"{record['mlm_accuracy']:.3f}",
                                mfu=f"{record['mfu']:.1%}")
                log({"event": "train", "step": step, "lr": scheduler.get_last_lr()[0], **record})
                window, window_seconds = {}, 0.0
            if config.eval_every and step % config.eval_every == 0:
                evaluate()
            saved = bool(config.save_every and step % config.save_every == 0 and step < config.steps)
            if saved:
                save_checkpoint()
            if step < config.steps and stop_requested():  # SIGTERM: the scheduler is about to kill the job
                if not saved:
                    save_checkpoint()
                raise Stopped(step, checkpoint_dir, stop_requested.signum)
    bar.close()
    # A run resumed at its last step was checkpointed after its final evaluation (killed while it saved the model).
    if not (config.eval_every and step % config.eval_every == 0) and resumed_from < config.steps:
        evaluate()
    save_checkpoint()
    if is_main:
        save_final_model(model, tokenizer, work)
        reporters.close()  # its files complete before the folder moves into place
        finish_staging(output)
    return PretrainResult(steps=step, history=history, output=output)


def _report_held_out(eval_reader: CorpusReader) -> None:
    """How much of the corpus evaluation keeps from training: whole documents, so a few long ones can be much more
    than the fraction asked for."""
    documents, tokens = eval_reader.manifest["documents"], eval_reader.manifest["tokens"]
    share = int(eval_reader.document_tokens().sum()) / tokens
    progress.info("held out %d of %d documents for evaluation (%.1f%% of the tokens)", len(eval_reader), documents,
                  100 * share)
    if share > HELD_OUT_WARNING:
        logger.warning("the held-out documents are %.0f%% of the corpus's tokens: hold out fewer (--holdout), or "
                       "prepare the text with blank lines between more, shorter documents", 100 * share)


def check_same_corpus(trained_on: Path, reader: CorpusReader) -> None:
    """The corpus folder a model trained on, prepared again since (other text, or more of it), holds out other
    documents: some of them trained on. Refused; another folder is another corpus, scored as asked."""
    if not trained_on.is_file():
        return  # a model trained before this record, or elsewhere
    record = json.loads(trained_on.read_text(encoding="utf-8"))
    if record.get("corpus") == str(reader.directory.resolve()) and \
            record.get("content_sha256") != reader.manifest.get("content_sha256"):
        raise InputError(f"was prepared again after {trained_on.parent} trained on it ({record.get('documents')} "
                         f"documents then, {reader.manifest['documents']} now): its held-out documents are no longer "
                         "those training left out; evaluate on the corpus as it was, or on another one",
                         reader.directory)


def evaluate_pretrained(model: str | Path, data: str | Path, holdout: int | float | None = None,
                        batch_size: int | None = None, max_batches: int | None = None, seq_len: int | None = None,
                        masking: str | None = None, seed: int | None = None) -> dict[str, float]:
    """Held-out masked-LM metrics (evaluate_mlm) of a pre-trained model directory on the corpus it was trained on;
    the tokenizer must be the corpus's. Each setting left None is the training run's (its pretrain_config.json),
    so that the figures are those its log shows at the end (over the whole split, where training scores
    `eval_batches` of it); a model without one gets PretrainConfig's defaults."""
    from bertforge.inference.fill_mask import load_masked_lm

    run_config = Path(model) / RUN_CONFIG_FILE
    trained = PretrainConfig.load(run_config) if run_config.is_file() else PretrainConfig(str(data), str(model))
    holdout = trained.holdout if holdout is None else holdout
    batch_size = trained.batch_size if batch_size is None else batch_size
    seq_len = trained.seq_len if seq_len is None else seq_len
    masking = trained.masking if masking is None else masking
    seed = trained.seed if seed is None else seed
    reader = CorpusReader(data, split="eval", holdout=holdout)
    check_same_corpus(Path(model) / TRAINED_ON_FILE, reader)
    masked_lm, tokenizer = load_masked_lm(str(model))
    check_tokenizer(tokenizer, reader, str(model))
    return evaluate_mlm(masked_lm, reader, masker_of(trained, tokenizer.vocab, masking),
                        tokenizer.vocab.pad_token_id,
                        batch_size=batch_size, seq_len=seq_len, max_batches=max_batches, seed=seed)
