"""The proof that pre-training works: learn a vocabulary and pre-train a small BERT on ../shared/data/pretrain_en,
then fine-tune it on SST-2 slices beside the same architecture trained from random initialisation.

    python bench/pretrain_proof.py [--config tiny] [--short-steps 10000] [--steps 2500] [--lr 2e-3]
                                   [--sst2-examples 8000 2000] [--seeds 3] [--runs-dir runs] [--processes 2]

Every step is a `bertforge` command, printed before it runs (so the whole pipeline can be repeated by hand) and
timed; the summary gives the held-out masked-LM accuracy against the frequency baseline (always predicting the
most frequent masked token) and each arm's SST-2 dev accuracy over the seeds, for each slice.

The recipe is BERT's (15% token masking, AdamW with linear warm-up and decay, most steps on short sequences, then
a second phase at full length with next-sentence prediction), with what a short run on a CPU wants: a tiny model,
a high peak learning rate, a first phase at 32 tokens rather than 128 (the model leaves MLM's unigram plateau,
where it predicts word frequencies without using the context, after ~2,000 steps of 32-token sequences; at 64 or
128 tokens it was still there after 3,000 to 5,000), no dropout while pre-training (a run this short underfits
rather than overfits) and `torchrun` with one single-threaded process per core. Fine-tuning puts BERT's dropout
of 0.1 back, for the pre-trained and the random-init model alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CORPUS = sorted(str(path) for path in (DATA / "pretrain_en").glob("*.txt"))


# The two fine-tuning arms: the same architecture and recipe, with and without the pre-trained weights.
ARMS = {"pretrained": [], "random init": ["--random-init"]}


def finetuned_folder(folder: Path, examples: int, arm: str, seed: int) -> Path:
    return folder / f"sst2-{examples}-{arm.replace(' ', '-')}-{seed}"


def pretrain_phase(corpus: Path, vocab: Path, output: Path, start: list[str], objective: str, steps: int,
                   batch_size: int, seq_len: int, lr: float) -> list[str]:
    """One `pretrain train` command: warm-up over 5% of the steps, four held-out evaluations, no dropout."""
    return ["pretrain", "train", *start, "--data", str(corpus), "--vocab", str(vocab), "--output", str(output),
            "--objective", objective, "--masking", "token", "--dropout", "0", "--steps", str(steps),
            "--batch-size", str(batch_size), "--lr", str(lr), "--warmup-steps", str(steps // 20),
            "--max-length", str(seq_len), "--holdout", "0.01", "--eval-every", str(max(1, steps // 4)),
            "--save-every", str(max(1, steps // 8)), "--log-every", "50", "--no-progress"]


def pipeline(args: argparse.Namespace, folder: Path) -> list[tuple[str, list[str]]]:
    vocab, corpus, model = folder / "vocab.txt", folder / "corpus", folder / "model"
    short_model = folder / "model-short"
    sst2 = ["--task", "classification", "--train", str(DATA / "sst2" / "train.tsv"),
            "--dev", str(DATA / "sst2" / "dev.tsv"), "--epochs", "3", "--batch-size", "32",
            "--lr", str(args.finetune_lr), "--warmup-ratio", "0.1", "--max-length", "64", "--dropout", "0.1",
            "--no-progress"]
    # Each process's batch, so that a step's global batch is the same whatever --processes is.
    per_process = max(1, 128 // args.processes), max(1, 64 // args.processes)
    return [
        ("vocabulary", ["vocab", "--corpus", *CORPUS, "--vocab-size", str(args.vocab_size), "--output", str(vocab)]),
        ("prepare", ["pretrain", "prepare", "--corpus", *CORPUS, "--vocab", str(vocab),
                     "--output", str(corpus), "--max-length", "128"]),
        ("pre-train, 32 tokens", pretrain_phase(corpus, vocab, short_model, ["--size", args.config], "mlm",
                                                args.short_steps, per_process[0], 32, args.lr)),
        ("pre-train, 128 tokens", pretrain_phase(corpus, vocab, model, ["--init-from", str(short_model)],
                                                 "mlm+nsp", args.steps, per_process[1], 128, args.lr / 2)),
        ("held-out MLM", ["pretrain", "eval", "--model", str(model), "--data", str(corpus)]),
        *[(f"SST-2, {examples} sentences, {arm}, seed {seed}",
           ["finetune", "--model", str(model), *flags, "--output", str(finetuned_folder(folder, examples, arm, seed)),
            "--seed", str(seed), "--max-train-examples", str(examples), *sst2])
          for examples in args.sst2_examples for seed in range(args.seeds) for arm, flags in ARMS.items()],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", help="model size preset (default: tiny, 2 layers x 128)")
    parser.add_argument("--short-steps", type=int, default=10000,
                        help="first-phase steps, 128 sequences of 32 tokens each (default: 10,000)")
    parser.add_argument("--steps", type=int, default=2500,
                        help="second-phase steps, 64 sequences of 128 tokens each (default: 2,500)")
    parser.add_argument("--lr", type=float, default=2e-3,
                        help="peak learning rate of the first phase; the second phase peaks at half of it")
    parser.add_argument("--finetune-lr", type=float, default=5e-4, help="SST-2 fine-tuning learning rate")
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning runs per arm (seeds 0..N-1)")
    parser.add_argument("--sst2-examples", type=int, nargs="+", default=[8000, 2000],
                        help="SST-2 slice sizes (the first N training sentences), each fine-tuned by both arms")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--processes", type=int, default=2,
                        help="pre-training processes (torchrun), one thread each; the other steps use as many threads")
    parser.add_argument("--skip", nargs="*", default=[], help="steps already done (by name), e.g. vocabulary")
    args = parser.parse_args()

    folder = Path(args.runs_dir) / "pretrain_proof"
    folder.mkdir(parents=True, exist_ok=True)
    summary_file = folder / "summary.json"
    # Timings of the steps skipped this time come from the run that did them.
    seconds = json.loads(summary_file.read_text())["seconds"] if args.skip and summary_file.is_file() else {}
    for name, arguments in pipeline(args, folder):
        if name in args.skip:
            continue
        distributed = name.startswith("pre-train") and args.processes > 1
        threads = 1 if distributed else args.processes
        # `torchrun` is `python -m torch.distributed.run`: this interpreter's, wherever its bin/ is
        launcher = ["torch.distributed.run", "--nproc_per_node", str(args.processes), "-m"] if distributed else []
        arguments = ["bertforge", "--threads", str(threads), *arguments]
        shown = ["torchrun", *launcher[1:]] if distributed else []
        print("$ " + " ".join([*shown, *arguments]), flush=True)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", *launcher, *arguments], check=True,
                       env=os.environ | {"OMP_NUM_THREADS": str(threads)})
        seconds[name] = time.perf_counter() - start
        print(f"[{name}: {seconds[name]:.0f} s]", flush=True)

    held_out = json.loads((folder / "model" / "eval_results.json").read_text())
    accuracies = {examples: {arm: [json.loads((finetuned_folder(folder, examples, arm, seed) / "metrics.json")
                                              .read_text())["best"]["accuracy"] for seed in range(args.seeds)]
                             for arm in ARMS} for examples in args.sst2_examples}
    summary = {"seconds": seconds, "held_out": held_out, "sst2_dev_accuracy": accuracies}
    summary_file.write_text(json.dumps(summary, indent=2) + "\n")
    print("\nstep                      wall-clock s")
    for name, value in seconds.items():
        print(f"{name:<26}{value:>12.0f}")
    print(f"\nheld-out masked LM accuracy {held_out['accuracy']:.4f} (frequency baseline "
          f"{held_out.get('frequency_baseline_accuracy', float('nan')):.4f}), perplexity {held_out['perplexity']:.1f}")
    for examples, by_arm in accuracies.items():
        means = {arm: statistics.mean(values) for arm, values in by_arm.items()}
        print(f"\nSST-2 dev accuracy, {examples} training sentences, seeds 0-{args.seeds - 1}:")
        for arm, values in by_arm.items():
            print(f"{arm:<14} mean {means[arm]:.4f}  (" + ", ".join(f"{value:.4f}" for value in values) + ")")
        print(f"margin of the mean: {means['pretrained'] - means['random init']:+.4f}")


if __name__ == "__main__":
    main()
