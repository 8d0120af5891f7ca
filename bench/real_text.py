"""The real text the benchmarks run on, read from ../shared/data (never copied into the repository)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def read_sst2_dev() -> list[str]:
    with open(DATA / "sst2" / "dev.tsv", encoding="utf-8") as handle:
        return [row["sentence"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


def read_squad_contexts() -> list[str]:
    squad = json.loads((DATA / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    return [paragraph["context"] for article in squad["data"] for paragraph in article["paragraphs"]]
