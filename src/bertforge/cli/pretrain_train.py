"""`bertforge pretrain train`: pre-train a model on a prepared corpus, with checkpoints and exact resumption;
under torchrun, one process per device with DDP."""

from __future__ import annotations

import argparse

from bertforge.cli.arguments import finite_float, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertforge.config import PRESETS
    from bertforge.pretraining.masking import MASKING_STRATEGIES
    from bertforge.pretraining.objectives import OBJECTIVES

    parser.add_argument("--config", default=None, metavar="SIZE|FILE",
                        help=f"model size ({', '.join(PRESETS)}) or a config.json; vocab_size comes from the "
                             "tokenizer (default: tiny)")
    parser.add_argument("--init-from", default=None, metavar="DIR",
                        help="start from this model directory's weights and architecture instead of a random "
                             "initialisation (continued pre-training, e.g. a second phase at longer sequences)")
    parser.add_argument("--dropout", type=finite_float, default=None,
                        help="dropout on hidden states and attention weights (default: the model's, 0.1 for the "
                             "presets); 0 trains faster and suits short runs")
    parser.add_argument("--data", required=True, help="a corpus folder written by `bertforge pretrain prepare`")
    parser.add_argument("--output", "-o", required=True, help="folder for the model, log.jsonl and checkpoint/")
    parser.add_argument("--vocab", "--model-or-vocab", default="default", metavar="M",
                        help="the tokenizer the corpus was prepared with: a model directory, 'default', or a "
                             "vocab.txt (checked against the corpus manifest)")
    parser.add_argument("--cased", action="store_true", help="with a vocab.txt: keep case and accents")
    parser.add_argument("--objective", choices=list(OBJECTIVES), default="mlm+nsp")
    parser.add_argument("--masking", choices=list(MASKING_STRATEGIES), default="token")
    parser.add_argument("--steps", type=positive_int, default=1000, help="optimizer steps")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="sequences per forward pass in each process; the global batch of an optimizer step is "
                             "batch-size x processes (torchrun's world size) x grad-accum")
    parser.add_argument("--grad-accum", type=positive_int, default=1, help="forward passes per optimizer step")
    parser.add_argument("--lr", type=finite_float, default=1e-4)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: 1%% of --steps")
    parser.add_argument("--seq-len", type=positive_int, default=128)
    parser.add_argument("--holdout", type=finite_float, default=0.01,
                        help="documents held out for evaluation: a fraction below 1, or a count")
    parser.add_argument("--save-every", type=positive_int, default=1000, help="steps between checkpoints")
    parser.add_argument("--log-every", type=positive_int, default=10, help="steps between log lines")
    parser.add_argument("--eval-every", type=positive_int, default=None,
                        help="steps between held-out evaluations (default: at the end only)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast where the hardware supports it")
    parser.add_argument("--fp16", action="store_true",
                        help="fp16 autocast with dynamic loss scaling, for CUDA GPUs without bf16 (an error on CPU)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (needs a C++ compiler on CPU; the first steps are slow)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-gflops", type=finite_float, default=552.0,
                        help="one device's peak GFLOP/s, for model FLOPs utilisation (default: 552)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model or run already in --output (otherwise that is an error)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from bertforge.errors import ConfigError
    from bertforge.pretraining.run import PretrainConfig, pretrain
    from bertforge.training.distributed import read_environment

    launch = read_environment()  # rank 0 of 1 unless started by torchrun
    if args.init_from is not None and args.config is not None:
        raise ConfigError("--config and --init-from both set the architecture; give one of them")
    config = PretrainConfig(**{
        "model": args.config or "tiny", "init_from": args.init_from, "dropout": args.dropout, "data": args.data,
        "output": args.output, "tokenizer": args.vocab,
        "do_lower_case": not args.cased, "objective": args.objective, "masking": args.masking, "steps": args.steps,
        "batch_size": args.batch_size, "grad_accumulation": args.grad_accum, "lr": args.lr,
        "warmup_steps": args.warmup_steps, "seq_len": args.seq_len,
        "holdout": int(args.holdout) if args.holdout >= 1 else args.holdout, "save_every": args.save_every,
        "log_every": args.log_every, "eval_every": args.eval_every, "bf16": args.bf16, "fp16": args.fp16,
        "compile": args.compile, "seed": args.seed, "peak_gflops": args.peak_gflops, "progress": not args.no_progress,
        "rank": launch.rank, "world_size": launch.world_size,
    })
    result = pretrain(config, resume=args.resume, overwrite=args.overwrite)
    if launch.rank != 0:
        return 0  # rank 0 reports for the run
    print(f"trained {result.steps} steps; model written to {result.output}")
    evaluations = [record for record in result.history if record.get("event") == "eval"]
    if evaluations:
        last = evaluations[-1]
        print(f"held-out masked LM: loss {last['loss']:.4f}, perplexity {last['perplexity']:.2f}, "
              f"accuracy {last['accuracy']:.4f}")
    return 0

