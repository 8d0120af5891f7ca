"""Loading a checkpoint: bertforge's from_pretrained vs transformers' and sentence-transformers', one run.

    python bench/bench_load.py [--threads 1] [--repeats 7] [--model DIR] [--random-init]

Each row loads the same folder (the default model, all-MiniLM-L6-v2, unless --model names another) into a model
ready to run: the bare encoder, a classifier whose head the checkpoint lacks (so it is initialised), and the
sentence encoder each library offers. Timed after a warm-up load each (the file is in the page cache for all);
seconds are medians, the ratio is the reference's time over bertforge's. This is what a command, a server or a
worker pays at start, on top of importing the library.

Two columns each: the load alone, and the load with a first forward pass on one short sentence. They differ because
transformers 5 leaves the weights in a private memory map of the safetensors file, read from the page cache as a
forward pass first touches them, where bertforge reads them into the model's own memory at load (so a checkpoint
file overwritten in place can't take a loaded model down with a bus error); the second column compares the two
with every weight read.

A last row loads the encoder once in a new process (the library already imported, not timed), as a command or a
worker process does: a load's one-time costs, such as imports torch makes at first use, show there.

--random-init adds bertforge's old way of loading as a row: the model built with its random initialisation, then
every tensor overwritten from the checkpoint, which is what from_pretrained now skips for a checkpoint that holds
every tensor.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from machine import machine  # bench/ is the script's folder, so on sys.path
from safetensors.torch import load_file

from bertforge import BertConfig, BertForSequenceClassification, BertModel, SentenceEncoder
from bertforge.checkpoint import default_model_dir
from bertforge.checkpoint.pretrained import load_hf_state_dict


def median_seconds(load: Callable[[], object], repeats: int, first_pass: bool = False) -> float:
    load()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model = load()
        if first_pass:
            run_once(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


IDS = torch.tensor([[101, 1037, 2460, 6251, 1012, 102]])  # [CLS] a short sentence . [SEP] in MiniLM's vocabulary


def run_once(model) -> None:
    with torch.inference_mode():
        if hasattr(model, "encode"):  # the sentence encoders
            model.encode(["A short sentence."])
        else:
            model(IDS)


FIRST_LOAD = """
import sys, time
import {module}
start = time.perf_counter()
{module}.BertModel.from_pretrained(sys.argv[1])
print(time.perf_counter() - start)
"""


def first_load_seconds(module: str, folder: str, repeats: int) -> float:
    """The median time of a process's first load of the encoder, `module` (bertforge, transformers) imported."""
    return statistics.median(float(subprocess.run([sys.executable, "-c", FIRST_LOAD.format(module=module), folder],
                                                  capture_output=True, text=True, check=True).stdout.split()[-1])
                             for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: the embedded default model)")
    parser.add_argument("--random-init", action="store_true", help="also time the build-then-overwrite load")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)  # the "newly initialised" notes of the classifier rows, from all three
    import sentence_transformers
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    folder = args.model or str(default_model_dir())

    def old_bertforge_load() -> BertModel:
        model = BertModel(BertConfig.from_pretrained(folder))
        load_hf_state_dict(model, load_file(f"{folder}/model.safetensors"), folder)
        return model.eval()

    rows = [
        ("encoder", lambda: BertModel.from_pretrained(folder), lambda: transformers.BertModel.from_pretrained(folder)),
        ("classifier, new head", lambda: BertForSequenceClassification.from_pretrained(folder, num_labels=3),
         lambda: transformers.BertForSequenceClassification.from_pretrained(folder, num_labels=3)),
        ("sentence encoder", lambda: SentenceEncoder(folder, device="cpu"),
         lambda: sentence_transformers.SentenceTransformer(folder, device="cpu")),
    ]
    print(machine())
    print(f"{folder}, {args.threads} thread(s), median of {args.repeats} loads after one warm-up each")
    print(f"{'':<24}{'load alone':^33}{'load and a first pass':^33}")
    print(f"{'':<24}" + f"{'bertforge':>12}{'reference':>12}{'ratio':>9}" * 2 + "   reference")
    for name, ours, theirs in rows:
        figures = []
        for first_pass in (False, True):
            mine = median_seconds(ours, args.repeats, first_pass)
            reference = median_seconds(theirs, args.repeats, first_pass)
            figures.append(f"{mine:>11.3f}s{reference:>11.3f}s{reference / mine:>8.2f}x")
        library = sentence_transformers if name == "sentence encoder" else transformers
        print(f"{name:<24}{''.join(figures)}   {library.__name__.replace('_', '-')} {library.__version__}")
    mine, reference = first_load_seconds("bertforge", folder, 3), first_load_seconds("transformers", folder, 3)
    print(f"{'encoder, new process':<24}{mine:>11.3f}s{reference:>11.3f}s{reference / mine:>8.2f}x"
          f"{'':>33}   transformers, first load in a process (median of 3 processes)")
    if args.random_init:
        old = median_seconds(old_bertforge_load, args.repeats)
        new = median_seconds(lambda: BertModel.from_pretrained(folder), args.repeats)
        print(f"{'encoder, built at random':<24}{old:>11.3f}s{'':>12}{old / new:>8.2f}x   (bertforge before: its "
              f"time over from_pretrained's)")


if __name__ == "__main__":
    main()
