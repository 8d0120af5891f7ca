"""Tokenizer throughput: bertforge vs transformers' BertTokenizerFast and the raw Rust tokenizers library.

Encodes the same real English text (WikiText-2, SQuAD contexts, pre-training text read from ../shared/data)
in batches, one thread, and prints tokens/s for each and the ratio bertforge / reference.

    python bench/bench_tokenizer.py --megabytes 5.2 --batch-size 1000 [--offsets] [--accents]
"""

from __future__ import annotations

import os

# One thread for the Rust libraries, set before they are imported; bertforge is single-threaded Python.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from bertforge.checkpoint.default_model import resolve_model_dir  # noqa: E402
from bertforge.tokenizer import BertTokenizer  # noqa: E402

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def read_texts(data_dir: Path, megabytes: float) -> list[str]:
    """Non-empty lines of WikiText-2, SQuAD contexts and pretrain_en, in that order, up to `megabytes` of UTF-8."""
    wikitext = []
    for split in ("valid", "test"):
        wikitext += (data_dir / "wikitext2" / f"wiki.{split}.tokens").read_text(encoding="utf-8").split("\n")
    articles = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    contexts = [paragraph["context"] for article in articles for paragraph in article["paragraphs"]]
    pretrain = []
    for path in sorted((data_dir / "pretrain_en").glob("*.txt")):
        pretrain += path.read_text(encoding="utf-8").split("\n")
    texts, size, budget = [], 0, megabytes * 1e6
    for line in wikitext + contexts + pretrain:
        if line.strip() and size < budget:
            texts.append(line)
            size += len(line.encode("utf-8"))
    return texts


def throughput(encode: Callable[[list[str]], int], texts: list[str], batch_size: int, repeats: int) -> float:
    """Best tokens/s over `repeats` passes; `encode` returns the number of tokens of a batch."""
    best = 0.0
    for _ in range(repeats):
        start, tokens = time.perf_counter(), 0
        for begin in range(0, len(texts), batch_size):
            tokens += encode(texts[begin:begin + batch_size])
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=5.2, help="how much text to encode (UTF-8 MB)")
    parser.add_argument("--batch-size", type=int, default=1000, help="texts per call")
    parser.add_argument("--repeats", type=int, default=3, help="passes per tokenizer; the best is reported")
    parser.add_argument("--offsets", action="store_true", help="also ask for offsets (and word ids from bertforge)")
    parser.add_argument("--accents", action="store_true",
                        help="the same text with its a, e and u accented (à, é, ü): the per-character path that "
                             "French or German text takes")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args()

    texts = read_texts(args.data_dir, args.megabytes)
    if args.accents:
        accented = str.maketrans({"a": "à", "e": "é", "u": "ü"})
        texts = [text.translate(accented) for text in texts]
    model_dir = resolve_model_dir("default")
    megabytes = sum(len(text.encode("utf-8")) for text in texts) / 1e6
    print(f"{len(texts):,} texts, {megabytes:.2f} MB, batches of {args.batch_size}, "
          f"offsets {'on' if args.offsets else 'off'}{', accented' if args.accents else ''}")

    def bertforge_encode(tokenizer: BertTokenizer) -> Callable[[list[str]], int]:
        def encode(batch: list[str]) -> int:
            encoding = tokenizer(batch, truncation=False, return_offsets_mapping=args.offsets,
                                 return_word_ids=args.offsets)
            return sum(map(len, encoding["input_ids"]))
        return encode

    # A fresh tokenizer for one pass measures the cold word cache; the best of several, the warm one.
    results = {"bertforge (cold cache, 1 pass)": throughput(
        bertforge_encode(BertTokenizer.from_pretrained(model_dir)), texts, args.batch_size, 1)}
    results["bertforge"] = throughput(bertforge_encode(BertTokenizer.from_pretrained(model_dir)), texts,
                                      args.batch_size, args.repeats)
    reference = None
    try:
        from transformers import BertTokenizerFast
        from transformers.models.bert.tokenization_bert import load_vocab
    except ImportError:
        print("transformers is not installed: no reference figures")
    else:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        fast = BertTokenizerFast(vocab=load_vocab(str(model_dir / "vocab.txt")),
                                 do_lower_case=config["do_lower_case"], model_max_length=512)

        def transformers_encode(batch: list[str]) -> int:
            encoding = fast(batch, truncation=False, return_offsets_mapping=args.offsets)
            return sum(map(len, encoding["input_ids"]))

        rust = fast.backend_tokenizer

        def tokenizers_encode(batch: list[str]) -> int:
            return sum(len(encoding.ids) for encoding in rust.encode_batch(batch))

        reference = "transformers BertTokenizerFast"
        results[reference] = throughput(transformers_encode, texts, args.batch_size, args.repeats)
        results["tokenizers (Rust, raw)"] = throughput(tokenizers_encode, texts, args.batch_size, args.repeats)

    width = max(map(len, results))
    for name, rate in results.items():
        ratio = f"  x{rate / results[reference]:.2f} vs {reference}" if reference else ""
        print(f"{name:<{width}}  {rate / 1e6:6.3f} M tokens/s{ratio}")


if __name__ == "__main__":
    main()
