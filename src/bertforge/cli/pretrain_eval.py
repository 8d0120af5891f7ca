"""`bertforge pretrain eval`: a model's held-out masked-LM loss, perplexity and accuracy on a prepared corpus."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertforge.cli.arguments import check_writable, finite_float, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", required=True,
                        help="a checkpoint directory with a masked-LM head (the output of `pretrain train`)")
    parser.add_argument("--data", required=True, help="the corpus folder the model was trained on")
    parser.add_argument("--holdout", type=finite_float, default=None,
                        help="the held-out split's size as in training (default: the model's pretrain_config.json, "
                             "else 0.01)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="sequences per batch (default: %(default)s)")
    parser.add_argument("--max-batches", type=positive_int, default=None, help="default: the whole held-out split")
    parser.add_argument("--max-length", type=positive_int, default=128,
                        help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--seq-len", dest="max_length", type=positive_int, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    parser.add_argument("--masking", default="token", help="masking strategy of the evaluation (default: token)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation's masks")
    parser.add_argument("--output", "-o", default=None, metavar="FILE",
                        help="where to write the metrics as JSON (default: MODEL/eval_results.json)")


def run(args: argparse.Namespace) -> int:
    from bertforge.atomic import write_text_atomic
    from bertforge.inference.optimize import AS_TRAINED
    from bertforge.pretraining.corpus import CorpusReader
    from bertforge.pretraining.evaluation import evaluate_mlm
    from bertforge.pretraining.heads import BertForMaskedLM
    from bertforge.pretraining.masking import Masker
    from bertforge.pretraining.run import RUN_CONFIG_FILE, PretrainConfig, check_tokenizer
    from bertforge.tokenizer import BertTokenizer

    output = check_writable(args.output or Path(args.model) / "eval_results.json")
    holdout = args.holdout
    if holdout is None:
        run_config = Path(args.model) / RUN_CONFIG_FILE
        holdout = PretrainConfig.load(run_config).holdout if run_config.is_file() else 0.01
    elif holdout >= 1:
        holdout = int(holdout)
    reader = CorpusReader(args.data, split="eval", holdout=holdout)
    tokenizer = BertTokenizer.from_pretrained(args.model)
    check_tokenizer(tokenizer, reader, args.model)
    model = AS_TRAINED.apply(BertForMaskedLM.from_pretrained(args.model, require_heads=True))
    metrics = evaluate_mlm(model, reader, Masker(tokenizer.vocab, args.masking), tokenizer.vocab.pad_token_id,
                           batch_size=args.batch_size, seq_len=args.max_length, max_batches=args.max_batches,
                           seed=args.seed)
    write_text_atomic(output, json.dumps(metrics, indent=2) + "\n")
    print(f"held-out masked LM: loss {metrics['loss']:.4f}, perplexity {metrics['perplexity']:.2f}, "
          f"accuracy {metrics['accuracy']:.4f} ({metrics['masked_tokens']:,} masked tokens; always guessing the "
          f"most frequent one: {metrics['frequency_baseline_accuracy']:.4f})")
    print(f"wrote {output}")
    return 0
