"""A small fine-tuned SST-2 model (the teacher of the distillation tests, the model of the gate tests) and slices of
real SST-2 data as files."""

from __future__ import annotations

import csv

import pytest

from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.training.trainer import TrainConfig


def write_sst2_slice(source, path, start: int, stop: int):
    with open(source, encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join("\t".join(row) for row in [rows[0], *rows[1 + start:1 + stop]]) + "\n")
    return path


@pytest.fixture(scope="session")
def sst2_files(data_dir, tmp_path_factory):
    """teacher: the first 2,000 training sentences; student: the next 64; dev: the first 400 dev sentences."""
    folder = tmp_path_factory.mktemp("sst2")
    train = data_dir / "sst2" / "train.tsv"
    return {"teacher": write_sst2_slice(train, folder / "teacher.tsv", 0, 2000),
            "student": write_sst2_slice(train, folder / "student.tsv", 2000, 2064),
            "dev": write_sst2_slice(data_dir / "sst2" / "dev.tsv", folder / "dev.tsv", 0, 400)}


@pytest.fixture(scope="session")
def sst2_teacher(sst2_files, tmp_path_factory):
    """MiniLM fine-tuned on 2,000 SST-2 sentences for one epoch (0.78 on the dev slice)."""
    output = tmp_path_factory.mktemp("teacher")
    finetune(FinetuneConfig(train=str(sst2_files["teacher"]), output=str(output),
                            training=TrainConfig(epochs=1, lr=1e-4, warmup_ratio=0.1, progress=False, seed=0)))
    return output
