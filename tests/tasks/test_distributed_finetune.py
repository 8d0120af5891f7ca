"""Fine-tuning under torchrun (2 CPU processes, gloo): the same losses, weights and dev metrics as one process
taking the same global batches; a killed run resumes exactly; --overwrite and staging hold; only rank 0 writes.

Dropout is 0 in these runs: with dropout each process draws its own masks (distributed.rank_seed), which no single
process draws, so only a dropout-free run can be compared with one process step for step."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from bertforge.tasks.classification import ClassificationSettings
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.training import TrainConfig

# 37 rows in global batches of 6: six full batches (3 rows a process) and a last one of 1 row, which leaves rank 1
# nothing of its own; two batches a step (so the first of each pair keeps its gradients local), two epochs.
TRAIN_ROWS, DEV_ROWS, BATCH, ACCUMULATION, EPOCHS, LR = 37, 16, 6, 2, 2, 1e-3
STEPS = EPOCHS * 4  # ceil(7 batches / 2) steps an epoch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sst2_files(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp_sst2")
    paths = {}
    for name, count in (("train", TRAIN_ROWS), ("dev", DEV_ROWS)):
        with open(data_dir / "sst2" / f"{name}.tsv", encoding="utf-8") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:count + 1]
        paths[name] = folder / f"{name}.tsv"
        paths[name].write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return paths


def flags(model_dir, files, output):
    return ["--model", str(model_dir), "--train", str(files["train"]), "--dev", str(files["dev"]),
            "--output", str(output), "--batch-size", str(BATCH), "--grad-accum", str(ACCUMULATION),
            "--epochs", str(EPOCHS), "--lr", str(LR), "--dropout", "0", "--eval-every", "3", "--save-every", "2",
            "--max-length", "32", "--device", "cpu", "--no-progress"]


def torchrun(model_dir, files, output, *extra, script=None):
    """`bertforge finetune` in 2 processes on this machine, as a user would start it."""
    target = [str(script)] if script else ["-m", "bertforge"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *target,
               "finetune", *flags(model_dir, files, output), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def train_losses(output):
    records = [json.loads(line) for line in (output / "train_log.jsonl").read_text().splitlines()]
    return {record["step"]: record["loss"] for record in records if record["event"] == "train"}


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, sst2_files, tmp_path_factory):
    output = tmp_path_factory.mktemp("single") / "model"
    config = FinetuneConfig(model=str(tiny_model_dir), train=str(sst2_files["train"]), dev=str(sst2_files["dev"]),
                            output=str(output), batch_size=BATCH, settings=ClassificationSettings(max_length=32),
                            dropout=0.0,
                            training=TrainConfig(grad_accumulation=ACCUMULATION, epochs=EPOCHS, lr=LR, eval_every=3,
                                                 save_every=2, log_every=1, device="cpu", progress=False))
    return finetune(config)


@pytest.fixture(scope="module")
def two_processes(tiny_model_dir, sst2_files, tmp_path_factory):
    output = tmp_path_factory.mktemp("ddp") / "model"
    result = torchrun(tiny_model_dir, sst2_files, output, "--config", write_log_every(output.parent))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("saved to") == 1  # rank 0 alone reports
    return output


def write_log_every(folder):
    """A run config file: the log interval has no flag."""
    path = folder / "run.json"
    path.write_text(json.dumps({"training": {"log_every": 1}}))
    return str(path)


def test_two_processes_match_one_process_with_the_same_global_batch(one_process, two_processes):
    single = one_process.output_dir
    assert sorted(train_losses(two_processes)) == list(range(1, STEPS + 1))
    for step, loss in train_losses(single).items():
        assert train_losses(two_processes)[step] == pytest.approx(loss, rel=1e-5)  # the global batch's mean loss
    ours, theirs = (json.loads((folder / "metrics.json").read_text()) for folder in (two_processes, single))
    assert [record["step"] for record in ours["evaluations"]] == [3, 6, 8]  # rank 0 evaluated, once each time
    for evaluation, expected in zip(ours["evaluations"], theirs["evaluations"]):
        assert evaluation == pytest.approx(expected, rel=1e-6)
    weights, expected = (load_file(folder / "model.safetensors") for folder in (two_processes, single))
    assert weights.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)
    assert not (two_processes.parent / "model.incomplete").exists()
    assert not (two_processes / "checkpoint").exists()


def test_a_killed_run_resumes_exactly_and_overwrite_replaces_it(two_processes, tiny_model_dir, sst2_files,
                                                                 tmp_path):
    # Both processes die at step 5, after the checkpoint of step 4, as a killed job would.
    script = tmp_path / "dying.py"
    script.write_text(
        "import sys\n"
        "from bertforge.cli.main import main\n"
        "from bertforge.training.trainer import Trainer\n"
        "log = Trainer.log\n"
        "def dying_log(self, record):\n"
        "    if record['step'] == 5:\n"
        "        raise KeyboardInterrupt\n"
        "    log(self, record)\n"
        "Trainer.log = dying_log\n"
        "sys.exit(main(sys.argv[1:]))\n")
    config = write_log_every(tmp_path)
    output = tmp_path / "model"
    assert torchrun(tiny_model_dir, sst2_files, output, "--config", config, script=script).returncode != 0
    staging = tmp_path / "model.incomplete"
    assert sorted(train_losses(staging)) == [1, 2, 3, 4] and not output.exists()
    refused = torchrun(tiny_model_dir, sst2_files, output, "--config", config)
    assert refused.returncode != 0 and "pass --resume to continue it" in refused.stderr

    resumed = torchrun(tiny_model_dir, sst2_files, output, "--config", config, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert train_losses(output) == pytest.approx(train_losses(two_processes), rel=1e-6)
    expected = load_file(two_processes / "model.safetensors")
    for name, value in load_file(output / "model.safetensors").items():
        torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=0, msg=name)

    refused = torchrun(tiny_model_dir, sst2_files, output, "--config", config)
    assert refused.returncode != 0 and "already holds a model" in refused.stderr
    (output / "marker").write_text("the previous run's")
    replaced = torchrun(tiny_model_dir, sst2_files, output, "--config", config, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert not (output / "marker").exists() and not staging.exists()
    assert train_losses(output) == pytest.approx(train_losses(two_processes), rel=1e-6)


def test_each_process_takes_its_rows_of_every_batch_weighted_by_its_loss_terms():
    """Hand-counted shares: per-token labels count their labelled tokens, one label per row counts rows, and a
    process left without rows of a small batch steps on one row with share 0."""
    from bertforge.tasks.data import FeatureBatches, Features
    from bertforge.training.distributed import Shard

    tagged = Features([{"input_ids": [1, 2, 3], "labels": [-100, 1, 2]}, {"input_ids": [1, 2], "labels": [-100, 0]},
                       {"input_ids": [1, 2, 3, 4], "labels": [-100, 1, 1, -100]}], [0, 1, 2])
    batches = [[0, 1, 2], [1]]
    shards = [list(FeatureBatches(tagged, batches, 0, rank, 2)) for rank in (0, 1)]
    assert all(isinstance(shard, Shard) for part in shards for shard in part)
    assert shards[0][0].batch["input_ids"].tolist() == [[1, 2, 3, 0], [1, 2, 3, 4]]  # rows 0 and 2
    assert (shards[0][0].share, shards[1][0].share) == (4 / 5, 1 / 5)
    assert shards[1][0].batch["labels"].tolist() == [[-100, 0]]
    assert (shards[0][1].share, shards[1][1].share) == (1.0, 0.0)
    assert shards[1][1].batch["input_ids"].tolist() == [[1, 2]]  # the batch's one row, counting for nothing

    classified = Features([{"input_ids": [1] * n, "labels": n % 2} for n in range(2, 7)], [0, 1, 2, 3, 4])
    shares = [[shard.share for shard in FeatureBatches(classified, [[0, 1, 2, 3, 4]], 0, rank, 2)] for rank in (0, 1)]
    assert shares == [[3 / 5], [2 / 5]]
    assert [list(batch) for batch in FeatureBatches(classified, [[0, 1]], 0)] == [["input_ids", "labels",
                                                                                  "attention_mask"]]


def test_distill_under_torchrun_trains_as_one_process_and_rank_0_alone_writes(one_process, sst2_files, tmp_path,
                                                                                 capsys):
    """`bertforge distill` in 2 processes: the student (each process teaching its rows of every batch) is the one a
    single process distils from the same global batches; rank 0 measures and writes it, once (the other rank used
    to look for the student in a folder only rank 0 writes, and fail). The hidden-state loss is a mean over each
    process's tokens, weighted by its share of the batch's rows, so with it the run is close to, not the same as,
    one process's: it is checked to run and write once."""
    from bertforge.cli.main import main

    common = ["distill", "--teacher", str(one_process.output_dir), "--train", str(sst2_files["train"]), "--dev",
              str(sst2_files["dev"]), "--student-layers", "1", "--batch-size", str(BATCH), "--epochs", "1",
              "--lr", str(LR), "--dropout", "0", "--max-drop", "100", "--device", "cpu", "--no-progress"]

    def two_processes(output, *extra):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                               "2", "-m", "bertforge", *common, *extra, "--output", str(output)],
                              capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})

    for output, extra in ((tmp_path / "two" / "student", ()),
                          (tmp_path / "hidden" / "student", ("--hidden-weight", "1.0"))):
        result = two_processes(output, *extra)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("accepted; wrote") == 1  # rank 0 alone measured and wrote
        assert sorted(path.name for path in output.parent.iterdir()) == ["student"]  # no training folder left
        assert (output / "model.safetensors").is_file()

    one = tmp_path / "one" / "student"
    assert main([*common, "--output", str(one)]) == 0
    capsys.readouterr()
    weights, expected = (load_file(folder / "model.safetensors") for folder in (tmp_path / "two" / "student", one))
    assert weights.keys() == expected.keys() and len(weights) > 0
    for name in expected:
        torch.testing.assert_close(weights[name], expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_seeds_under_torchrun_train_each_seed_as_one_process_and_rank_0_alone_reports(
        tiny_model_dir, sst2_files, tmp_path):
    """`finetune --seeds 1,2` in 2 processes: one process group for both seeds (it used to meet again for the second
    seed, and hang), each seed's model the one a single process trains with that seed, one report and seeds.json."""
    output = tmp_path / "seeds"
    result = torchrun(tiny_model_dir, sst2_files, output, "--seeds", "1,2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("best seed by accuracy") == 1
    record = json.loads((output / "seeds.json").read_text())
    assert record["seeds"] == [1, 2] and sorted(record["runs"]) == ["1", "2"]

    single = tmp_path / "single"
    config = FinetuneConfig(model=str(tiny_model_dir), train=str(sst2_files["train"]), dev=str(sst2_files["dev"]),
                            output=str(single), batch_size=BATCH, settings=ClassificationSettings(max_length=32),
                            dropout=0.0,
                            training=TrainConfig(grad_accumulation=ACCUMULATION, epochs=EPOCHS, lr=LR, eval_every=3,
                                                 save_every=2, seed=2, device="cpu", progress=False))
    finetune(config)
    expected = load_file(single / "model.safetensors")
    for name, value in load_file(output / "seed-2" / "model.safetensors").items():
        torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=1e-5, msg=name)
