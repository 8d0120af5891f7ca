"""`bertforge quantize` end to end on a model fine-tuned on real SST-2: it measures int8 beside fp32 on the dev set,
writes a model that reloads quantized and scores what the report says, and refuses (writing nothing, exit 1) when the
metric drops by more than --max-drop."""

import importlib
import json

import pytest
import torch

from bertforge.cli.main import main
from bertforge.compress import QuantizedLinear
from bertforge.compress.gate import COMPRESSION_FILE, warm_up_examples
from bertforge.tasks.finetuned_model import FinetunedModel

pytestmark = pytest.mark.usefixtures("one_thread")


def test_quantize_writes_a_model_that_reloads_as_reported_and_refuses_a_larger_drop(sst2_teacher, sst2_files,
                                                                                   tmp_path, capsys):
    output = tmp_path / "int8"
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev_200"]),
                 "--output", str(output), "--max-drop", "100"]) == 0
    printed = capsys.readouterr().out
    assert "fp32" in printed and "int8" in printed and "accepted" in printed
    report = json.loads((output / COMPRESSION_FILE).read_text())
    assert report["accepted"] and report["metric"] == "accuracy"

    reloaded = FinetunedModel.load(output)
    assert isinstance(reloaded.model.bert.encoder.layers[0].attention.query, QuantizedLinear)
    examples = reloaded.read(sst2_files["dev_200"], reloaded.columns(), labelled=True)
    assert reloaded.evaluate(examples)["accuracy"] == report["candidate"]["metrics"]["accuracy"]
    # evaluate's record and the server's /info say what the folder holds, beside the inference options asked for
    assert main(["evaluate", "--model", str(output), "--data", str(sst2_files["dev_200"]), "--output", "-"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["quantization"] == "int8" and record["inference"]["precision"] == "fp32"
    assert record["accuracy"] == report["candidate"]["metrics"]["accuracy"]
    from bertforge.inference.serve.routes.status import model_dtype
    assert model_dtype(reloaded.model) == "int8" and model_dtype(FinetunedModel.load(sst2_teacher).model) == "float32"

    # The same quantization again (it is deterministic), allowed a little less than it dropped and no more careful
    # recipe: refused.
    refused = tmp_path / "refused"
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev_200"]),
                 "--output", str(refused), "--max-drop", f"{report['drop'] - 0.25:.2f}", "--no-fallback"]) == 1
    printed = capsys.readouterr().out
    assert "nothing written" in printed and "fp32" in printed
    assert not refused.exists()
    assert not list(tmp_path.glob(".refused*"))  # no temporary folder left behind either

    # The written model is an end point: quantizing, distilling or fine-tuning it again is a one-line error,
    # nothing written.
    for argv in (["quantize", "--model", str(output), "--dev", str(sst2_files["dev_200"])],
                 ["distill", "--teacher", str(output), "--train", str(sst2_files["student"])],
                 ["finetune", "--model", str(output), "--train", str(sst2_files["student"]), "--no-progress"]):
        assert main([*argv, "--output", str(tmp_path / "again")]) == 1
        error = capsys.readouterr().err.strip()
        assert "already quantized (int8)" in error and "\n" not in error
        assert not (tmp_path / "again").exists()


def test_quantize_falls_back_to_more_careful_int8_recipes_and_writes_the_first_within_the_gate(
        sst2_teacher, sst2_files, tmp_path, capsys, monkeypatch):
    """Asked for a gain no recipe makes, every recipe of the fallback is measured on the dev set and reported, and
    nothing is written. Then with the first recipe's metric held down by 5 points (the gate's control flow, not
    the quantizer, under test), the next recipe is written: its checkpoint records its recipe and reloads as it."""
    refused = tmp_path / "refused"
    calibration = ["--calibration-examples", "32"]  # each recipe calibrates anew; the control flow is under test
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev_200"]),
                 "--output", str(refused), "--max-drop", "-100", *calibration]) == 1
    printed = capsys.readouterr().out
    for row in ("fp32", "int8 ", "int8 outliers float32 ", "int8 outliers float32 dynamic "):
        assert f"\n{row}" in printed
    assert "with int8 outliers float32 dynamic, the last of 3 recipes tried," in printed
    assert "nothing written" in printed and not refused.exists()

    quantize_module = importlib.import_module("bertforge.compress.quantize")  # the module, not the function
    real_measure = quantize_module.measure

    def first_recipe_worse(name, finetuned, examples, batch_size):
        measured = real_measure(name, finetuned, examples, batch_size)
        if name == "int8":
            measured.metrics["accuracy"] -= 0.05
        return measured

    monkeypatch.setattr(quantize_module, "measure", first_recipe_worse)
    output = tmp_path / "int8"
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev_200"]), "--output", str(output),
                 "--max-drop", "4", *calibration]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert "with int8 outliers float32 (" in verdict and "accepted" in verdict and "int8 changed it by" in verdict
    report = json.loads((output / COMPRESSION_FILE).read_text())
    assert [row["name"] for row in report["rejected"]] == ["int8"]
    assert report["candidate"]["name"] == "int8 outliers float32"
    reloaded = FinetunedModel.load(output)
    assert reloaded.model.quantization.outlier_folding == "none"
    assert reloaded.model.quantization.activations == "static"
    examples = reloaded.read(sst2_files["dev_200"], reloaded.columns(), labelled=True)
    assert reloaded.evaluate(examples)["accuracy"] == report["candidate"]["metrics"]["accuracy"]


def test_quantize_keeps_the_layers_asked_for_in_float32(sst2_teacher, sst2_files, tmp_path, capsys):
    """--float-layers N: the N layers whose int8 product alone changes the model's output most on the calibration
    data stay float32 in the written model, which names them and reloads scoring what the report says. (16
    calibration sentences: ranking the 37 layers runs the model over them for each.)"""
    output = tmp_path / "int8"
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev_200"]), "--output", str(output),
                 "--float-layers", "2", "--calibration-examples", "16", "--max-drop", "100", "--no-fallback"]) == 0
    assert "\nint8 2 float32 layers " in capsys.readouterr().out
    report = json.loads((output / COMPRESSION_FILE).read_text())
    assert report["candidate"]["name"] == "int8 2 float32 layers"
    reloaded = FinetunedModel.load(output)
    kept = reloaded.model.quantization.kept_float
    assert len(kept) == 2
    layers = dict(reloaded.model.named_modules())
    assert all(isinstance(layers[name], torch.nn.Linear) for name in kept)
    assert sum(isinstance(layer, QuantizedLinear) for layer in layers.values()) == 6 * 6 + 1 - 2
    examples = reloaded.read(sst2_files["dev_200"], reloaded.columns(), labelled=True)
    assert reloaded.evaluate(examples)["accuracy"] == report["candidate"]["metrics"]["accuracy"]


def test_the_fallback_recipes_each_take_one_careful_step_and_name_themselves():
    from bertforge.compress.quantize import QuantizationConfig, fallback_recipes, recipe_name

    def names(**settings):
        return [recipe_name(recipe) for recipe in fallback_recipes(QuantizationConfig(**settings))]

    assert names() == ["int8", "int8 outliers float32", "int8 outliers float32 dynamic"]
    assert names(outlier_folding="none") == ["int8 outliers float32", "int8 outliers float32 dynamic"]
    assert names(activations="dynamic") == ["int8 dynamic", "int8 outliers float32 dynamic"]
    assert names(outlier_folding="none", activations="dynamic") == ["int8 outliers float32 dynamic"]
    assert names(outlier_folding="all", outlier_channels=16, smoothing=0.5) == [
        "int8 16 outliers folded everywhere smoothing 0.5", "int8 16 outliers float32 smoothing 0.5",
        "int8 16 outliers float32 smoothing 0.5 dynamic"]
    assert names(outlier_channels=0) == ["int8 no outliers", "int8 no outliers dynamic"]
    assert names(precision="bf16") == ["bf16"]


def test_quantize_will_not_write_into_a_directory_with_files(sst2_teacher, sst2_files, capsys):
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev"]),
                 "--output", str(sst2_teacher)]) == 1
    assert "not empty" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize(("device", "message"), [("cuda", "no CUDA GPU"),
                                                  ("tpu", "--device 'tpu' is not a device; use cpu, cuda")])
def test_quantize_checks_its_device_before_loading_anything(sst2_teacher, sst2_files, tmp_path, capsys, device,
                                                            message):
    output = tmp_path / "bf16"
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev"]), "--output", str(output),
                 "--precision", "bf16", "--device", device]) == 1
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error and "Traceback" not in error
    assert not output.exists()


def test_quantize_measures_extractive_qa_by_its_own_metric(data_dir, tmp_path, capsys):
    """The gate is the task's own: on SQuAD (a MiniLM reader trained a few steps on real questions) it reports
    exact match and F1 of the decoded answer spans, and the written model scores what the report says."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune
    from bertforge.training.trainer import TrainConfig

    articles = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    train.write_text(json.dumps({"version": articles["version"], "data": articles["data"][:1]}))
    dev_article = dict(articles["data"][45], paragraphs=articles["data"][45]["paragraphs"][:4])
    dev.write_text(json.dumps({"version": articles["version"], "data": [dev_article]}))
    reader = tmp_path / "reader"
    finetune(FinetuneConfig(task="qa", train=str(train), output=str(reader), max_train_examples=48, batch_size=16,
                            training=TrainConfig(epochs=1, lr=1e-4, progress=False, seed=0)))
    output = tmp_path / "int8"
    assert main(["quantize", "--model", str(reader), "--dev", str(dev), "--output", str(output),
                 "--max-drop", "100"]) == 0
    printed = capsys.readouterr().out
    assert "exact_match" in printed and "f1" in printed
    report = json.loads((output / COMPRESSION_FILE).read_text())
    assert report["metric"] == "f1"
    reloaded = FinetunedModel.load(output)
    assert isinstance(reloaded.model.bert.encoder.layers[0].feed_forward.up, QuantizedLinear)
    examples = reloaded.read(dev, reloaded.columns(), labelled=True)
    assert reloaded.evaluate(examples)["f1"] == report["candidate"]["metrics"]["f1"]


def test_quantize_calibrates_on_unlabelled_text(sst2_teacher, sst2_files, tmp_path, capsys):
    """Calibration needs inputs only: a plain text file of real sentences, one a line (no columns, no labels)."""
    sentences = [line.split("\t")[0] for line in sst2_files["student"].read_text(encoding="utf-8").splitlines()[1:]]
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    output = tmp_path / "int8"
    assert main(["quantize", "--model", str(sst2_teacher), "--dev", str(sst2_files["dev"]), "--output", str(output),
                 "--calibration", str(text), "--max-drop", "100"]) == 0
    report = json.loads((output / COMPRESSION_FILE).read_text())
    assert abs(report["drop"]) <= 2  # calibrated on 64 real sentences, the int8 model still tracks fp32


def test_the_gate_warms_up_on_every_example(sst2_teacher):
    # Each new batch shape pays a first call (cuBLAS choosing its kernel, oneDNN making its int8 one), which would
    # decide the timing.
    finetuned = FinetunedModel.load(sst2_teacher)
    examples = list(range(10))
    assert warm_up_examples(finetuned, examples, batch_size=4) == examples
    finetuned.model.to("meta")  # any device but the CPU
    assert warm_up_examples(finetuned, examples, batch_size=4) == examples


def test_a_dev_set_whose_metric_is_not_a_number_is_refused_before_any_candidate(tiny_model_dir, data_dir, tmp_path,
                                                                                capsys):
    """Spearman's correlation of scores that are all the same is NaN: no drop can be measured against it. A dev
    set of one score (the Hub's STS-B test split, -1 everywhere) is refused as it is read, by finetune, quantize and
    distill alike; a model whose scores are all the same (a head of zero weights) on a dev set that varies makes it
    NaN too: quantize says so after scoring the original alone, distill before training; neither writes anything."""
    from safetensors.torch import load_file, save_file

    rows = [line.split("\t") for line in (data_dir / "stsb" / "dev.tsv").read_text().splitlines()[1:41]]
    header = "sentence1,sentence2,score\n"
    quoted = [f'"{row[-3]}","{row[-2]}",' for row in rows if '"' not in row[-3] + row[-2]]
    (tmp_path / "train.csv").write_text(header + "".join(f"{pair}{i % 5}\n" for i, pair in enumerate(quoted)))
    (tmp_path / "flat.csv").write_text(header + "".join(f"{pair}2.5\n" for pair in quoted))
    finetune = ["finetune", "--task", "regression", "--model", str(tiny_model_dir), "--train",
                str(tmp_path / "train.csv"), "--text-column", "sentence1", "--text-pair-column", "sentence2",
                "--label-column", "score", "--max-steps", "2", "--batch-size", "8", "--max-length", "32",
                "--eval-every", "1", "--output", str(tmp_path / "model"), "--no-progress"]
    assert main([*finetune, "--dev", str(tmp_path / "flat.csv")]) == 1
    assert "flat.csv, field 'score': every score is 2.5: a split without labels?" in capsys.readouterr().err
    assert main([*finetune, "--dev", str(tmp_path / "train.csv")]) == 0
    for argv in (["quantize", "--model", str(tmp_path / "model")],
                 ["distill", "--teacher", str(tmp_path / "model"), "--train", str(tmp_path / "train.csv"),
                  "--student-layers", "1", "--no-progress"]):
        assert main([*argv, "--dev", str(tmp_path / "flat.csv"), "--output", str(tmp_path / "small")]) == 1
        assert "every score is 2.5: a split without labels?" in capsys.readouterr().err
        assert not (tmp_path / "small").exists()
    weights = load_file(tmp_path / "model" / "model.safetensors")
    weights["classifier.weight"].zero_()  # every pair the same score
    save_file(weights, tmp_path / "model" / "model.safetensors", metadata={"format": "pt"})
    for argv in (["quantize", "--model", str(tmp_path / "model")],
                 ["distill", "--teacher", str(tmp_path / "model"), "--train", str(tmp_path / "train.csv"),
                  "--student-layers", "1", "--no-progress"]):
        assert main([*argv, "--dev", str(tmp_path / "train.csv"), "--output", str(tmp_path / "small")]) == 1
        captured = capsys.readouterr()
        assert captured.err.strip().endswith("train.csv: spearman is not a number on this dev set (for a correlation: "
                                             "every score the same), so no drop can be measured; give a dev set the "
                                             "metric can score"), captured.err
        assert "fp32" not in captured.out and "step" not in captured.err and not (tmp_path / "small").exists()
