"""`bertforge finetune-embeddings` end to end on a tiny encoder: bad input is one line naming its place and nothing
written; a killed run resumed gives the run never stopped; --config and flags make one run config; the folder
written loads as a sentence encoder with the run's pooling, and `bertforge embed` reads it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from scipy import stats

from bertforge import BertModel

SRC = Path(__file__).resolve().parents[2] / "src"
# 24 anchor/positive/negative rows: 6 batches of 4 an epoch
TRIPLES = [(f"what is item {i}", f"item {i} is a thing numbered {i}", f"unrelated words {7 * i}") for i in range(24)]
PAIRS = [("a cat sits on the mat", "a cat is sitting on a mat", 4.6), ("a man plays a guitar", "the sky is blue", 0.2),
         ("it is raining", "water falls from the sky", 3.1), ("birds sing", "music plays", 1.4),
         ("a woman slices an onion", "someone is cutting an onion", 4.2), ("the train is late", "cheese is tasty", 0.6),
         ("a boy kicks a ball", "a child plays football", 3.6), ("stocks fell today", "the market dropped", 2.5)]


def csv_text(header: str, rows) -> str:
    return header + "\n" + "".join(",".join(str(cell) for cell in row) + "\n" for row in rows)


@pytest.fixture(scope="module")
def world(tmp_path_factory, save_tiny_encoder):
    """A tiny BERT checkpoint (no sentence-transformers files: mean pooling) and data files."""
    root = tmp_path_factory.mktemp("embeddings")
    save_tiny_encoder(root / "encoder")
    (root / "triples.csv").write_text(csv_text("anchor,positive,negative", TRIPLES))
    (root / "pairs.csv").write_text(csv_text("sentence1,sentence2,score", PAIRS))
    (root / "log_every_step.json").write_text(json.dumps({"training": {"log_every": 1}}))  # no flag sets it
    return root


def base(world: Path, output: Path, train: str = "triples.csv") -> list:
    return ["finetune-embeddings", "--model", world / "encoder", "--train", world / train, "--output", output,
            "--no-progress", "--device", "cpu"]


def saved_config(output: Path) -> dict:
    return json.loads((output / "finetune_embeddings_config.json").read_text())


# --- bad input ----------------------------------------------------------------------------------------------------

# (id, data file written as is (None: the world's triples), extra argv, exit status, fragments of the one line)
BAD_INPUT = [
    ("missing-text-column", "foo,bar\na,b\n", ["--text-columns", "foo,baz"], 1,
     ["bad.csv", "line 1", "'baz'", "the file has 'foo', 'bar'"]),
    ("no-usual-columns", "foo,bar\na,b\n", [], 1, ["bad.csv", "--text-columns", "the file has 'foo', 'bar'"]),
    ("empty-cell", "anchor,positive\na cat,a kitten\na dog,\n", [], 1,
     ["bad.csv", "line 3", "'positive'", "empty"]),
    ("blank-cell", "anchor,positive\n   ,a kitten\n", [], 1, ["bad.csv", "line 2", "'anchor'", "empty"]),
    ("score-not-a-number", "sentence1,sentence2,score\na cat,a kitten,4.0\na dog,a puppy,high\n", [], 1,
     ["bad.csv", "line 3", "'score'", "'high'", "not a number"]),
    ("scored-rows-with-mnrl", "sentence1,sentence2,score\na cat,a kitten,4.0\n",
     ["--loss", "multiple_negatives_ranking"], 1, ["bad.csv", "multiple_negatives_ranking", "scored pairs"]),
    ("unscored-rows-with-cosent", None, ["--loss", "cosent"], 1, ["triples.csv", "--loss cosent", "no score column"]),
    ("cosine-similarity-with-0-5-scores", "sentence1,sentence2,score\na cat,a kitten,0.8\na dog,a car,4.5\n",
     ["--loss", "cosine_similarity"], 1, ["bad.csv", "cosine_similarity", "4.5", "-1 to 1"]),
    ("score-column-is-a-text", None, ["--score-column", "positive"], 1,
     ["triples.csv", "line 1", "'positive'", "both a text and the score", "--score-column"]),
    ("text-columns-one-name", None, ["--text-columns", "anchor"], 2, ["--text-columns", "'anchor'"]),
    ("text-columns-repeated", None, ["--text-columns", "anchor,anchor"], 1, ["text_columns", "different"]),
    ("resume-no-killed-run", None, ["--resume"], 1, ["out.incomplete", "no killed run", "without --resume"]),
    ("pooling-choice", None, ["--pooling", "banana"], 2, ["--pooling", "'banana'", "cls", "mean"]),
    ("dev-empty-cell", "anchor,positive\na cat,a kitten\n,a puppy\n", ["--train", "{W}/triples.csv", "--dev",
                                                                       "{T}/bad.csv"], 1,
     ["bad.csv", "line 3", "'anchor'", "empty"]),
    ("early-stopping-without-dev", None, ["--early-stopping", "2"], 1, ["--early-stopping 2", "--dev"]),
    ("missing-train-file", None, ["--train", "{T}/missing.csv"], 1, ["missing.csv", "no such file"]),
]


@pytest.mark.parametrize("data, extra, status, fragments", [case[1:] for case in BAD_INPUT],
                         ids=[case[0] for case in BAD_INPUT])
def test_bad_input_is_one_line_naming_it_and_writes_nothing(world, tmp_path, run_cli, data, extra, status,
                                                            fragments):
    argv = base(world, tmp_path / "out")
    if data is not None:
        (tmp_path / "bad.csv").write_text(data)
        argv[argv.index("--train") + 1] = tmp_path / "bad.csv"
    code, out, err = run_cli(*argv, *(str(arg).replace("{T}", str(tmp_path)).replace("{W}", str(world))
                                              for arg in extra))
    assert code == status, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertforge") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()


def test_the_whole_of_stsb_with_cosine_similarity_names_a_score_beyond_one(world, data_dir, tmp_path, run_cli):
    """STS-B scores 0 to 5: fitting cosine to them is refused before the model is even loaded."""
    code, _, err = run_cli(*base(world, tmp_path / "out"), "--train", data_dir / "stsb" / "train.tsv",
                           "--loss", "cosine_similarity")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "train.tsv" in err and "a score of 5 is beyond cosine's -1 to 1" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_model_in_the_output_stays_without_overwrite_and_an_unknown_config_key_is_named(world, tmp_path, run_cli,
                                                                                          one_thread):
    output = tmp_path / "model"
    assert run_cli(*base(world, output), "--max-steps", "1", "--batch-size", "4")[0] == 0
    before = digest(output)
    code, _, err = run_cli(*base(world, output), "--max-steps", "1", "--batch-size", "4", "--seed", "5")
    assert code == 1 and len(err.splitlines()) == 1 and "already holds a model" in err and "--overwrite" in err
    (tmp_path / "run.json").write_text(json.dumps({"batch_size": 4, "trianing": {"lr": 1e-3}}))
    code, _, err = run_cli(*base(world, output), "--config", tmp_path / "run.json", "--overwrite")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "run.json" in err and "unknown key 'trianing'" in err
    assert digest(output) == before and not (tmp_path / "model.incomplete").exists()
    # --overwrite does replace it
    code, _, err = run_cli(*base(world, output), "--max-steps", "1", "--batch-size", "4", "--seed", "5",
                           "--lr", "1e-3", "--overwrite")
    assert code == 0, err
    assert digest(output)["model.safetensors"] != before["model.safetensors"]


# --- kill and resume ----------------------------------------------------------------------------------------------

def killed_run_argv(world: Path, output: Path) -> list:
    """Three epochs of 6 steps, every step logged and checkpointed, dropout on, the dev set scored at each epoch's
    end: a kill can land anywhere."""
    return [*base(world, output), "--config", world / "log_every_step.json", "--dev", world / "triples.csv",
            "--batch-size", "4", "--epochs", "3", "--lr", "1e-3", "--seed", "1", "--save-every", "1"]


def records(path: Path) -> list[dict]:
    """The log without its wall-clock field."""
    return [{k: v for k, v in json.loads(line).items() if k != "examples_per_s"}
            for line in path.read_text().splitlines()]


def test_a_killed_run_resumed_gives_the_weights_and_losses_of_the_run_never_stopped(world, tmp_path, run_cli,
                                                                                    one_thread):
    whole = tmp_path / "whole"
    code, _, err = run_cli(*killed_run_argv(world, whole))
    assert code == 0, err
    assert [r["step"] for r in records(whole / "train_log.jsonl") if r["event"] == "train"] == list(range(1, 19))
    assert [r["step"] for r in records(whole / "train_log.jsonl") if r["event"] == "eval"] == [6, 12, 18]
    assert not (whole / "checkpoint").exists()

    split = tmp_path / "split"
    log = tmp_path / "split.incomplete" / "train_log.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "bertforge", "--threads", "1",
                                *map(str, killed_run_argv(world, split))],
                               env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    while process.poll() is None and not (log.is_file() and log.read_text().count("\n") >= 10):
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, process.stderr.read()
    assert not split.exists()
    step = torch.load(tmp_path / "split.incomplete" / "checkpoint" / "train_state.pt", weights_only=False)["step"]
    assert 7 <= step < 18 and step % 6, f"checkpointed at step {step}: not mid-epoch"

    # Started again without --resume or --overwrite it is refused, the killed run kept.
    code, _, err = run_cli(*killed_run_argv(world, split))
    assert code == 1 and "split.incomplete" in err and "--resume" in err and len(err.splitlines()) == 1, err
    # Resumed with another setting it is refused, naming the setting; with those it began with, it finishes.
    code, _, err = run_cli(*killed_run_argv(world, split), "--resume", "--batch-size", "3")
    assert code == 1 and "batch_size" in err and len(err.splitlines()) == 1, err
    code, _, err = run_cli(*killed_run_argv(world, split), "--resume")
    assert code == 0, err
    assert records(split / "train_log.jsonl") == records(whole / "train_log.jsonl")
    assert json.loads((split / "metrics.json").read_text()) == json.loads((whole / "metrics.json").read_text())
    whole_weights, split_weights = load_file(whole / "model.safetensors"), load_file(split / "model.safetensors")
    assert whole_weights.keys() == split_weights.keys()
    for name, tensor in whole_weights.items():
        assert torch.equal(tensor, split_weights[name]), name
    # and training did change them (else equal weights would say nothing)
    start = load_file(world / "encoder" / "model.safetensors")
    assert any(not torch.equal(start[name], tensor) for name, tensor in whole_weights.items() if name in start)
    assert not (tmp_path / "split.incomplete").exists() and not (split / "checkpoint").exists()
    assert saved_config(split) == {**saved_config(whole), "output": str(split)}

    # Resuming the finished run neither trains nor evaluates again.
    before = digest(split)
    code, out, err = run_cli(*killed_run_argv(world, split), "--resume")
    assert code == 0 and "already finished" in out, err
    assert digest(split) == before


def test_a_run_killed_as_it_removes_its_checkpoint_is_in_place_and_resume_tidies_it(world, tmp_path, run_cli,
                                                                                     interrupted_checkpoint_removal,
                                                                                     one_thread):
    """The run is moved into place before its checkpoint is removed: killed in between, --resume removes what was
    left (it said "no killed run to resume", and a run without --resume that the folder "holds a training run")."""
    from bertforge.inference.sentence_encoder import SentenceEncoder

    output = tmp_path / "model"
    argv = [*base(world, output), "--batch-size", "4", "--max-steps", "2", "--save-every", "1", "--lr", "1e-3"]
    with interrupted_checkpoint_removal():
        code, _, err = run_cli(*argv)
    assert code == 130 and "interrupted" in err
    assert (output / "checkpoint").is_dir() and not (tmp_path / "model.incomplete").exists()
    before = {name: sha for name, sha in digest(output).items() if not name.startswith("checkpoint")}
    SentenceEncoder(str(output), device="cpu")  # whole: it loads

    code, _, err = run_cli(*argv, "--resume", "--seed", "7")  # not the run it continues
    assert code == 1 and len(err.splitlines()) == 1 and "training.seed" in err, err
    code, out, err = run_cli(*argv, "--resume")
    assert code == 0 and "already finished" in out, err
    assert not (output / "checkpoint").exists() and digest(output) == before  # nothing trained or written again


# --- the run config -----------------------------------------------------------------------------------------------

def test_a_run_from_its_config_file_is_the_run_from_flags_and_flags_win(world, tmp_path, run_cli, one_thread):
    flags = ["--batch-size", "4", "--max-steps", "2", "--lr", "1e-3", "--seed", "3", "--pooling", "cls",
             "--text-columns", "anchor,positive", "--scale", "10", "--warmup-ratio", "0.5"]
    code, _, err = run_cli(*base(world, tmp_path / "flags"), *flags)
    assert code == 0, err
    (tmp_path / "run.json").write_text(json.dumps({
        "model": str(world / "encoder"), "train": str(world / "triples.csv"), "batch_size": 4, "pooling": "cls",
        "text_columns": ["anchor", "positive"], "scale": 10,
        "training": {"max_steps": 2, "lr": 1e-3, "seed": 3, "warmup_ratio": 0.5, "progress": False,
                     "device": "cpu"}}))
    code, _, err = run_cli("finetune-embeddings", "--config", tmp_path / "run.json", "--output",
                           tmp_path / "file")
    assert code == 0, err
    from_flags, from_file = saved_config(tmp_path / "flags"), saved_config(tmp_path / "file")
    assert from_file == {**from_flags, "output": str(tmp_path / "file")}
    assert from_flags["text_columns"] == ["anchor", "positive"] and from_flags["training"]["lr"] == 1e-3
    assert records(tmp_path / "file" / "train_log.jsonl") == records(tmp_path / "flags" / "train_log.jsonl")
    assert (tmp_path / "file" / "model.safetensors").read_bytes() == \
        (tmp_path / "flags" / "model.safetensors").read_bytes()

    # The saved config runs again as it is; a flag given over it wins, the file's other settings stay.
    code, _, err = run_cli("finetune-embeddings", "--config", tmp_path / "file" /
                           "finetune_embeddings_config.json", "--output", tmp_path / "over", "--lr", "5e-4",
                           "--pooling", "mean")
    assert code == 0, err
    over = saved_config(tmp_path / "over")
    assert over["training"]["lr"] == 5e-4 and over["pooling"] == "mean"
    assert over["training"]["seed"] == 3 and over["training"]["max_steps"] == 2 and over["batch_size"] == 4
    assert over["text_columns"] == ["anchor", "positive"] and over["training"]["warmup_ratio"] == 0.5


@pytest.mark.parametrize("how", ["flags", "file"])
def test_sentence_transformers_training_defaults_hold(world, tmp_path, run_cli, one_thread, how):
    """lr 2e-5, one epoch, a tenth warming up (not finetune's BERT recipe), whether the training section is
    filled by a flag or by a file that sets something else in it."""
    argv = base(world, tmp_path / "out")
    if how == "file":
        argv = argv[:argv.index("--no-progress")]
        (tmp_path / "run.json").write_text(json.dumps({"training": {"progress": False, "device": "cpu"}}))
        argv += ["--config", tmp_path / "run.json"]
    code, _, err = run_cli(*argv)
    assert code == 0, err
    training = saved_config(tmp_path / "out")["training"]
    assert (training["lr"], training["epochs"], training["warmup_ratio"]) == (2e-5, 1, 0.1)
    assert training["progress"] is False
    log = records(tmp_path / "out" / "train_log.jsonl")
    assert [r["step"] for r in log] == [1]  # 24 rows in one batch of the default 32, one epoch
    assert saved_config(tmp_path / "out")["batch_size"] == 32


def cls_cosines(model: BertModel, tokenizer) -> list[float]:
    """Each of PAIRS' cosine of its texts' first tokens' last hidden states."""
    vectors = []
    for column in (0, 1):
        batch = tokenizer([pair[column] for pair in PAIRS], padding=True, return_tensors="pt")
        with torch.no_grad():
            vectors.append(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0][:, 0])
    return torch.nn.functional.cosine_similarity(*vectors, dim=-1).tolist()


# --- the model written --------------------------------------------------------------------------------------------

def test_the_output_loads_as_a_sentence_encoder_with_its_pooling_and_embed_reads_it(world, tmp_path, run_cli,
                                                                                    tokenizer, one_thread):
    from bertforge import SentenceEncoder

    output = tmp_path / "model"
    code, out, err = run_cli(*base(world, output, "pairs.csv"), "--dev", world / "pairs.csv", "--pooling",
                             "cls", "--batch-size", "4", "--epochs", "2", "--lr", "1e-3", "--max-length", "24")
    assert code == 0, err
    assert "loss: cosent" in out  # scored pairs learn with cosent unless told
    pooling = json.loads((output / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] is True and pooling["pooling_mode_mean_tokens"] is False
    assert json.loads((output / "sentence_bert_config.json").read_text())["max_seq_length"] == 24

    texts = ["a cat sits on the mat", "completely different words here"]
    encoder = SentenceEncoder(str(output), device="cpu")
    assert encoder.max_seq_length == 24  # the tiny encoder's own is 64
    vectors = encoder.encode(texts, convert_to_numpy=True)
    # CLS pooling, computed from the saved weights alone: the first token's last hidden state
    bert = BertModel.from_pretrained(output).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch.get("token_type_ids"))[0]
    np.testing.assert_allclose(vectors, hidden[:, 0].numpy(), rtol=1e-4, atol=1e-5)
    start = BertModel.from_pretrained(world / "encoder").eval()
    with torch.no_grad():
        assert not torch.allclose(start(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0],
                                  hidden)  # fine-tuned, not the starting weights

    # The dev metrics, of the starting model and of the kept one, are the correlations of CLS cosines and scores.
    # A random tiny encoder's cosines all lie within 3e-4 of 1, where float32 rounding (which the batches' padding
    # changes) moves Pearson's by 1e-4; the ranks, 5e-6 apart or more, don't move.
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["main_metric"] == "spearman" and len(metrics["evaluations"]) == 2
    scores = [score for _, _, score in PAIRS]
    for model, recorded in ((start, metrics["before"]), (bert, metrics["best"])):
        cosines = cls_cosines(model, tokenizer)
        assert recorded["spearman"] == pytest.approx(stats.spearmanr(cosines, scores)[0], abs=1e-6)
        assert recorded["pearson"] == pytest.approx(stats.pearsonr(cosines, scores)[0], abs=1e-3)

    (tmp_path / "lines.txt").write_text("\n".join(texts) + "\n")
    code, _, err = run_cli("embed", "--model", output, "--input", tmp_path / "lines.txt", "--output",
                           tmp_path / "vectors.npy", "--no-progress", "--device", "cpu")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), vectors, rtol=1e-4, atol=1e-5)

    # Fine-tuned again from it, without --pooling, the model keeps its own (cls), not a plain BERT's mean.
    code, _, err = run_cli("finetune-embeddings", "--model", output, "--train", world / "pairs.csv",
                           "--output", tmp_path / "again", "--max-steps", "1", "--no-progress", "--device", "cpu")
    assert code == 0, err
    assert (tmp_path / "again" / "1_Pooling" / "config.json").read_text() == \
        (output / "1_Pooling" / "config.json").read_text()


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_again(world, tmp_path, run_cli, caplog,
                                                                              one_thread):
    output = tmp_path / "model"
    code, _, err = run_cli(*base(world, output), "--batch-size", "8")
    assert code == 0, err
    expected = (output / "model.safetensors").read_bytes()
    shutil.rmtree(output)
    # what a kill leaves after the settings were saved and before the first checkpoint: the staging folder alone
    staging = tmp_path / "model.incomplete"
    staging.mkdir()
    shutil.copy(world / "log_every_step.json", staging / "finetune_embeddings_config.json")
    code, _, err = run_cli(*base(world, output), "--batch-size", "8", "--resume")
    assert code == 1 and "the run was started with" in err  # its saved settings are not these
    (staging / "finetune_embeddings_config.json").unlink()
    code, out, err = run_cli(*base(world, output), "--batch-size", "8", "--resume")
    assert code == 0, err
    assert "killed before its first checkpoint; it starts again" in caplog.text
    assert (output / "model.safetensors").read_bytes() == expected and not staging.exists()


def test_a_kept_model_below_the_starting_one_is_said(world, tmp_path, run_cli, caplog, one_thread):
    """A high learning rate on eight pairs: the kept model scores below the starting one on the dev pairs, and
    the run says so beside the two figures."""
    output = tmp_path / "model"
    code, out, err = run_cli(*base(world, output, "pairs.csv"), "--dev", world / "pairs.csv", "--batch-size",
                             "4", "--lr", "5e-2", "--warmup-ratio", "0")
    assert code == 0, err
    metrics = json.loads((output / "metrics.json").read_text())
    worse = metrics["best"]["spearman"] < metrics["before"]["spearman"]
    assert worse == ("below the starting model's" in caplog.text), (metrics, caplog.text)
    assert worse, metrics  # this run is one that got worse, so the line above checked the warning is given


def test_matryoshka_dimensions_are_trained_and_scored_each(world, tmp_path, run_cli, one_thread):
    """--matryoshka-dims: the dev set is scored at each smaller cut too, by the correlation of the cut vectors'
    cosines (renormalised) and the scores, before and after; a cut wider than the vectors is refused."""
    from bertforge import SentenceEncoder

    output = tmp_path / "model"
    code, out, err = run_cli(*base(world, output, "pairs.csv"), "--dev", world / "pairs.csv", "--batch-size",
                             "4", "--lr", "1e-3", "--matryoshka-dims", "8,128,32")
    assert code == 0, err
    metrics = json.loads((output / "metrics.json").read_text())
    assert [name for name in metrics["best"] if "dim" in name] == ["spearman_dim32", "spearman_dim8"]
    texts = [text for pair in PAIRS for text in pair[:2]]
    vectors = SentenceEncoder(str(output), device="cpu").encode(texts, convert_to_numpy=True)
    for dims in (32, 8):
        cut = vectors[:, :dims] / np.linalg.norm(vectors[:, :dims], axis=1, keepdims=True)
        cosines = (cut[0::2] * cut[1::2]).sum(axis=1)
        expected = stats.spearmanr(cosines, [score for _, _, score in PAIRS])[0]
        assert metrics["best"][f"spearman_dim{dims}"] == pytest.approx(expected, abs=1e-6)
    assert saved_config(output)["matryoshka_dims"] == [128, 32, 8]
    code, _, err = run_cli(*base(world, tmp_path / "wide", "pairs.csv"), "--matryoshka-dims", "256,64")
    assert code == 1 and "--matryoshka-dims 256" in err and "128 dimensions" in err
    assert not (tmp_path / "wide").exists()


def test_recomputed_activations_train_the_same_and_the_dashboard_shows_the_log(world, tmp_path, run_cli, one_thread,
                                                                                tensorboard_scalars):
    """--gradient-checkpointing recomputes each layer in the backward pass (the same dropout masks): the same
    weights; --report-to tensorboard puts the log's losses and dev metrics on the dashboard."""
    flags = ["--batch-size", "4", "--epochs", "2", "--dev", world / "triples.csv", "--config",
             world / "log_every_step.json"]
    code, _, err = run_cli(*base(world, tmp_path / "plain"), *flags)
    assert code == 0, err
    code, _, err = run_cli(*base(world, tmp_path / "recomputed"), *flags, "--gradient-checkpointing", "--report-to",
                           "tensorboard")
    assert code == 0, err
    plain, recomputed = (load_file(tmp_path / name / "model.safetensors") for name in ("plain", "recomputed"))
    assert plain.keys() == recomputed.keys() and all(torch.equal(plain[key], recomputed[key]) for key in plain)
    log = records(tmp_path / "recomputed" / "train_log.jsonl")
    scalars = tensorboard_scalars(tmp_path / "recomputed" / "runs")
    losses = [(record["step"], record["loss"]) for record in log if record["event"] == "train"]
    assert len(losses) == 12 and scalars["train/loss"] == [(step, pytest.approx(loss)) for step, loss in losses]
    assert [step for step, _ in scalars["eval/mrr@10"]] == [6, 12]
