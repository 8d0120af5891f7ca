"""Ranking the layers for `bertforge quantize --float-layers`: bertforge's resumed passes beside whole passes, one run.

    python bench/bench_float_layers.py [--threads 1] [--sentences 64]

all-MiniLM-L6-v2's 37 linear layers, each quantized alone as `quantize` does (calibrated on SST-2 dev sentences) and
the model run on the sentences: `int8_sensitivity` starts each pass where that layer first acts (the encoder layers
before it give back their recorded float32 output); the reference runs the whole model for each layer. Prints both
times, their ratio, and whether the two rankings are equal score for score.
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import read_sst2_dev

from bertforge import BertModel, BertTokenizer
from bertforge.checkpoint import default_model_dir
from bertforge.compress.calibration import calibrate
from bertforge.compress.int8_linear import QuantizedLinear, replace_module
from bertforge.compress.quantize import encoder_linears
from bertforge.compress.sensitivity import int8_sensitivity, model_outputs
from bertforge.fast_cpu import make_plain

# the module (bertforge.compress's `quantize` is its function of that name)


@torch.inference_mode()
def whole_passes(model, batches, linears, int8_layer) -> dict[str, float]:
    """The reference: for each layer, the whole model run with that layer alone in int8."""
    expected = [model_outputs(model, batch) for batch in batches]
    changes = {}
    for name, linear in linears.items():
        replace_module(model, name, int8_layer(name))
        error = norm = 0.0
        for batch, wanted in zip(batches, expected):
            for got, want in zip(model_outputs(model, batch), wanted):
                error += float((got - want).square().sum())
                norm += float(want.square().sum())
        replace_module(model, name, linear)
        changes[name] = error / max(norm, 1e-30)
    return changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tokenizer = BertTokenizer.from_pretrained(default_model_dir())
    model = make_plain(BertModel.from_pretrained(default_model_dir()).eval())
    texts = read_sst2_dev()[:args.sentences]
    batches = [dict(tokenizer(texts[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, len(texts), 16)]
    linears = encoder_linears(model)
    ranges = calibrate(model, batches, linears)

    def int8_layer(name):
        return QuantizedLinear.from_linear(linears[name], *ranges[name], 8)

    start = time.perf_counter()
    reference = whole_passes(model, batches, linears, int8_layer)
    reference_seconds = time.perf_counter() - start
    start = time.perf_counter()
    ranked = int8_sensitivity(model, batches, linears, int8_layer)
    seconds = time.perf_counter() - start

    print(f"machine: {machine()}; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{len(linears)} linear layers ranked on {len(texts)} SST-2 dev sentences")
    print(f"whole passes (reference)   {reference_seconds:8.2f} s   x1.00")
    print(f"bertforge int8_sensitivity {seconds:8.2f} s   x{reference_seconds / seconds:.2f} vs whole passes")
    print(f"the same scores: {ranked == reference}")


if __name__ == "__main__":
    main()
