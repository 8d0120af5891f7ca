"""One int8 linear layer of MiniLM alone, on each kernel bertforge can run it on and on ONNX Runtime's, one run.

    python bench/bench_int8_products.py [--threads 2] [--repeats 30] [--rows 24,128,256,512,768,1536]

Each of all-MiniLM-L6-v2's product shapes (layer 0's joint query-key-value 384->1152, attention output 384->384,
feed-forward 384->1536 and 1536->384; real weights), quantized as `bertforge quantize` does (calibrated on SST-2
dev sentences), called as the model calls it: float32 rows in, float32 out, the input quantized with its calibrated
step. bertforge's layer on oneDNN's kernel (what it runs from SMALL_PRODUCT_ROWS rows on a CPU without VNNI, and
always with VNNI) and on fbgemm's static-input kernel (fewer rows, and replayed graphs), beside ONNX Runtime's
dynamic int8 MatMul of the same float weights (`quantize_dynamic`'s defaults, as bench_compress.py's `ORT int8`),
the three taking turns call by call. Prints the median microseconds a call and ONNX Runtime's time over each
(below 1: ONNX Runtime is faster): where an end-to-end gap between the two comes from the products themselves.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import DATA

from bertforge import BertModel, BertTokenizer
from bertforge.checkpoint import default_model_dir
from bertforge.compress import QuantizationConfig, quantize
from bertforge.compress.calibration import calibration_batches
from bertforge.inference.onnx import onnx_session
from bertforge.runtime import tune_cpu_allocator

# the module (bertforge.compress's `quantize` is its function of that name)
int8_linear = importlib.import_module("bertforge.compress.int8_linear")

# MiniLM's products: a name -> the float layer (or layers, joined as the int8 model joins them) of layer 0
SHAPES = {"query-key-value 384->1152": ("attention.query", "attention.key", "attention.value"),
          "attention output 384->384": ("attention.output",), "up 384->1536": ("feed_forward.up",),
          "down 1536->384": ("feed_forward.down",)}


def sst2_sentences(count: int) -> list[str]:
    lines = (DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:count + 1]
    return [line.split("\t")[0] for line in lines]


def int8_layer(model: BertModel, names: tuple[str, ...]):
    """The int8 layer that runs `names` (joined where the model joins them) of the quantized model's layer 0, as a
    product alone: no activation applied, float32 written (the model's up-projection also applies the GELU and
    writes the down-projection's codes on oneDNN; ONNX Runtime's MatMul does neither)."""
    layer = model.encoder.layers[0]
    if len(names) == 1:
        product = copy.deepcopy(layer.get_submodule(names[0]))
    else:
        product = int8_linear.concatenate(layer.get_submodule(name) for name in names)
    product.activation = None
    product.writes_codes(None)
    return product


def onnx_matmul(float_model: BertModel, names: tuple[str, ...], folder: Path, threads: int, spinning: bool):
    """ONNX Runtime's dynamic int8 of x @ W^T + b for the float layers `names` (joined as one product)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    layer = float_model.encoder.layers[0]
    weight = torch.cat([layer.get_submodule(name).weight for name in names]).detach()
    bias = torch.cat([layer.get_submodule(name).bias for name in names]).detach()
    out_features, in_features = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "weight"], ["product"]), helper.make_node("Add", ["product", "bias"], ["y"])],
        "product", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", in_features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", out_features])],
        [numpy_helper.from_array(weight.t().contiguous().numpy(), "weight"),
         numpy_helper.from_array(bias.numpy(), "bias")])
    fp32, int8 = folder / f"{in_features}x{out_features}.onnx", folder / f"{in_features}x{out_features}.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fp32)
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    session = onnx_session(int8, threads, spinning)
    return lambda x: session.run(["y"], {"x": x[None].numpy()})


def bertforge_call(layer, small_rows: int):
    """The int8 layer called as the model calls it, with SMALL_PRODUCT_ROWS set to `small_rows` (0: oneDNN at any
    size; a large number: fbgemm at any size)."""
    def call(x):
        before = int8_linear.SMALL_PRODUCT_ROWS
        int8_linear.SMALL_PRODUCT_ROWS = small_rows
        try:
            return layer(x)
        finally:
            int8_linear.SMALL_PRODUCT_ROWS = before
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", default="24,128,256,512,768,1536")
    parser.add_argument("--ort-spinning", action="store_true",
                        help="ONNX Runtime's threads spin between calls (its default; bertforge's sessions turn "
                             "it off, see inference/onnx.py): a call alone starts sooner, torch's calls lose cores")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    warnings.simplefilter("ignore")  # torch's notes on its quantized tensors
    logging.disable(logging.WARNING)  # ONNX Runtime's quantizer's advice to pre-process the graph
    tokenizer = BertTokenizer.from_pretrained(default_model_dir())
    float_model = BertModel.from_pretrained(default_model_dir()).eval()
    batches = calibration_batches(tokenizer, sst2_sentences(256), 64)
    int8_model = quantize(BertModel.from_pretrained(default_model_dir()), QuantizationConfig("int8"), batches)
    no_vnni = int8_linear.int8_reduce_range()
    print(f"{machine()}; torch {torch.__version__}, {args.threads} threads; oneDNN's int8 kernel "
          f"{'without' if no_vnni else 'with'} VNNI; ONNX Runtime's threads "
          f"{'spinning' if args.ort_spinning else 'not spinning'} between calls")
    print(f"{'product':28s} {'rows':>5s} {'oneDNN us':>10s} {'fbgemm us':>10s} {'ORT us':>8s} "
          f"{'ORT/oneDNN':>11s} {'ORT/fbgemm':>11s}")
    with tempfile.TemporaryDirectory() as folder, torch.inference_mode():
        for shape, names in SHAPES.items():
            layer = int8_layer(int8_model, names)
            variants = {"oneDNN": bertforge_call(layer, 0), "fbgemm": bertforge_call(layer, 1 << 30),
                        "ORT": onnx_matmul(float_model, names, Path(folder), args.threads, args.ort_spinning)}
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, layer.in_features)
                times: dict[str, list[float]] = {name: [] for name in variants}
                for _ in range(3):  # warm-up: prepacking, first-call allocations
                    for call in variants.values():
                        call(x)
                for _ in range(args.repeats):
                    for name, call in variants.items():
                        start = time.perf_counter()
                        call(x)
                        times[name].append(time.perf_counter() - start)
                median = {name: statistics.median(values) * 1e6 for name, values in times.items()}
                label = f"{shape}{' (outliers in float32)' * bool(len(layer.outlier_index))}"
                print(f"{label:28s} {rows:5d} {median['oneDNN']:10.0f} {median['fbgemm']:10.0f} {median['ORT']:8.0f} "
                      f"{median['ORT'] / median['oneDNN']:11.3f} {median['ORT'] / median['fbgemm']:11.3f}", flush=True)


if __name__ == "__main__":
    main()
