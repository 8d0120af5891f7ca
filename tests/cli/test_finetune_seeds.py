"""`finetune --seeds` and `--metric-for-best-model` on a tiny model: each seed is the plain run with that --seed,
the summary is the mean and sample sd of the seeds' own metrics.json, and the kept model is the one the chosen
metric ranks best (the dev loss checked against transformers' loss of the saved model)."""

import json

import pytest
import torch

from bertforge.cli import finetune as finetune_cli
from bertforge.errors import ConfigError

REVIEWS = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg"), ("warm , witty and wise", "pos"),
           ("an utter mess", "neg"), ("beautifully made", "pos"), ("tedious beyond words", "neg"),
           ("not bad at all", "pos"), ("not good at all", "neg")] * 3


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_reviews):
    return write_reviews(tmp_path_factory.mktemp("data"), REVIEWS, REVIEWS[:8], "csv")


def arguments(tiny_model_dir, data, output, *extra):
    train, dev = data
    return ["--model", tiny_model_dir, "--train", train, "--dev", dev, "--text-column", "review",
            "--label-column", "sentiment", "--output", output, "--epochs", "2", "--batch-size", "4",
            "--max-length", "16", "--lr", "1e-3", "--eval-every", "2", "--no-progress", "--device", "cpu", *extra]


def losses(folder):
    return [json.loads(line)["loss"] for line in (folder / "train_log.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "train"]


def test_seeds_runs_each_seed_and_keeps_the_best(tiny_model_dir, data, run_command, tmp_path, one_thread):
    output = tmp_path / "seeds"
    code, out = run_command(finetune_cli, *arguments(tiny_model_dir, data, output, "--seeds", "3,7",
                                                     "--metric-for-best-model", "f1"))
    assert code == 0 and "mean ± sd over 2 seeds: accuracy=" in out
    # seed 7 is exactly the plain run with --seed 7
    code, _ = run_command(finetune_cli, *arguments(tiny_model_dir, data, tmp_path / "plain", "--seed", "7",
                                                   "--metric-for-best-model", "f1"))
    assert losses(output / "seed-7") == losses(tmp_path / "plain")
    assert losses(output / "seed-3") != losses(output / "seed-7")
    assert json.loads((output / "seed-3" / "finetune_config.json").read_text())["training"]["seed"] == 3

    record = json.loads((output / "seeds.json").read_text())
    bests = {seed: json.loads((output / f"seed-{seed}" / "metrics.json").read_text())["best"] for seed in (3, 7)}
    for name in ("accuracy", "f1", "matthews_correlation"):
        values = [bests[3][name], bests[7][name]]
        assert record["summary"][name]["mean"] == pytest.approx(sum(values) / 2)
        assert record["summary"][name]["sd"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)  # n - 1
    best_seed = max((3, 7), key=lambda seed: (bests[seed]["f1"], -[3, 7].index(seed)))
    assert record["best_seed"] == best_seed and record["metric"] == "f1" and record["greater_is_better"]
    kept = output / f"seed-{best_seed}" / "model.safetensors"
    assert (output / "model.safetensors").read_bytes() == kept.read_bytes()

    # --resume reads finished seeds back: nothing retrains, the same summary
    before = (output / "seed-3" / "model.safetensors").stat().st_mtime_ns
    code, out = run_command(finetune_cli, *arguments(tiny_model_dir, data, output, "--seeds", "3,7",
                                                     "--metric-for-best-model", "f1", "--resume"))
    assert code == 0 and (output / "seed-3" / "model.safetensors").stat().st_mtime_ns == before
    assert json.loads((output / "seeds.json").read_text())["summary"] == record["summary"]
    # ... but only with the settings they were trained with
    with pytest.raises(ConfigError, match="training.lr"):
        run_command(finetune_cli, *arguments(tiny_model_dir, data, output, "--seeds", "3,7", "--resume",
                                             "--metric-for-best-model", "f1", "--lr", "2e-3"))


def test_dev_loss_picks_the_lowest(tiny_model_dir, data, run_command, tmp_path, one_thread):
    transformers = pytest.importorskip("transformers")
    from bertforge import BertTokenizer

    output = tmp_path / "model"
    code, _ = run_command(finetune_cli, *arguments(tiny_model_dir, data, output, "--metric-for-best-model", "loss"))
    metrics = json.loads((output / "metrics.json").read_text())
    assert code == 0 and metrics["main_metric"] == "loss" and len(metrics["evaluations"]) >= 3
    assert metrics["best"]["loss"] == min(record["loss"] for record in metrics["evaluations"])
    # the kept model's dev loss, computed by transformers from the saved folder
    model = transformers.BertForSequenceClassification.from_pretrained(output).eval()
    tokenizer = BertTokenizer.from_pretrained(output)
    dev = REVIEWS[:8]
    batch = tokenizer([text for text, _ in dev], padding=True, return_tensors="pt")
    labels = torch.tensor([model.config.label2id[label] for _, label in dev])
    with torch.no_grad():
        loss = model(**batch, labels=labels).loss.item()
    assert metrics["best"]["loss"] == pytest.approx(loss, rel=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["--metric-for-best-model", "acc"], "unknown classification metric 'acc'; choose from accuracy, f1"),
    (["--seeds", "1"], "two or more different"),
    (["--seeds", "1,x"], "comma-separated integers"),
    (["--seeds", "1,2", "--seed", "3"], "--seed or --seeds"),
])
def test_bad_choices(tiny_model_dir, data, run_command, tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        run_command(finetune_cli, *arguments(tiny_model_dir, data, tmp_path / "out", *extra))
