"""Killing `bertforge finetune` (SIGKILL, at moments drawn at random) loses nothing: `--resume` gives the losses,
evaluations and weights of a run never stopped, and a model already in the output folder stays loadable and byte
for byte as it was until a run that replaces it has ended."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertforge import BertForSequenceClassification

SRC = Path(__file__).resolve().parents[2] / "src"
REVIEWS = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg"), ("warm , witty and wise", "pos"),
           ("an utter mess", "neg"), ("beautifully made", "pos"), ("tedious beyond words", "neg")] * 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory, save_tiny_encoder):
    root = tmp_path_factory.mktemp("kill")
    save_tiny_encoder(root / "encoder")
    (root / "train.csv").write_text("review,sentiment\n" + "".join(f'"{t}",{label}\n' for t, label in REVIEWS))
    # Every step logged and checkpointed, an evaluation every 5 steps: a kill can land anywhere, a save included.
    (root / "run.json").write_text(json.dumps({
        "model": str(root / "encoder"), "train": str(root / "train.csv"), "dev": str(root / "train.csv"),
        "text_column": "review", "label_column": "sentiment", "batch_size": 2, "max_length": 16,
        "training": {"epochs": 2, "lr": 1e-3, "seed": 1, "log_every": 1, "save_every": 1, "eval_every": 5,
                     "device": "cpu", "progress": False}}))
    return root


def finetune(root: Path, output: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bertforge", "--threads", "1", "finetune", "--config",
                             str(root / "run.json"), "--output", str(output), *flags],
                            env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def kill_after_steps(process: subprocess.Popen, log: Path, steps: int, extra_seconds: float) -> bool:
    """SIGKILL the run once its log holds `steps` lines (plus a moment); False if it ended first."""
    while process.poll() is None:
        if log.is_file() and log.read_text().count("\n") >= steps:
            time.sleep(extra_seconds)
            process.send_signal(signal.SIGKILL)
            # The run may have ended during that moment: then the signal found it finished, not killed.
            return process.wait() == -signal.SIGKILL
        time.sleep(0.02)
    return False


def records(path: Path) -> list[dict]:
    """The log without its wall-clock field."""
    return [{k: v for k, v in json.loads(line).items() if k != "examples_per_s"}
            for line in path.read_text().splitlines()]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def whole(setup):
    """The run never stopped, which every other run is compared with."""
    output = setup / "whole"
    process = finetune(setup, output)
    assert process.wait() == 0, process.stderr.read()
    return output


def in_process(capsys, *argv) -> tuple[int, str, str]:
    """Commands that end before any training: run in this process, which saves starting Python and torch."""
    from bertforge.cli.main import main
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_killed_at_random_moments_and_resumed_gives_the_uninterrupted_run(setup, whole, tmp_path, capsys):
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    split = tmp_path / "split"
    staging = tmp_path / "split.incomplete"
    kills = 0
    process = finetune(setup, split)
    for _ in range(2):
        steps = rng.randint(1, 26)  # 24 train lines and 5 evaluations in all
        if not kill_after_steps(process, staging / "train_log.jsonl", steps, rng.uniform(0, 0.3)):
            break
        kills += 1
        if split.exists():  # killed once in place: removing its checkpoint, or exiting; --resume tidies up
            assert not staging.exists()
        else:
            assert staging.is_dir(), "a killed run is marked incomplete and not in place"
        process = finetune(setup, split, "--resume")
    assert process.wait() == 0, process.stderr.read()
    assert kills >= 1, f"seed {seed}: the run ended before the first kill"
    assert records(split / "train_log.jsonl") == records(whole / "train_log.jsonl"), f"seed {seed}"
    assert json.loads((split / "metrics.json").read_text()) == json.loads((whole / "metrics.json").read_text())
    assert (split / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    assert not staging.exists() and not (split / "checkpoint").exists()

    # Resuming a finished run neither trains nor evaluates again.
    before = digest(split)
    code, out, _ = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", split, "--resume")
    assert code == 0 and "already finished" in out
    assert digest(split) == before


def test_a_run_killed_or_failed_into_a_model_folder_leaves_the_model_as_it_was(setup, whole, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(whole, model)
    before = digest(model)

    process = finetune(setup, model, "--overwrite", "--seed", "2")  # another model than the one in the folder
    assert kill_after_steps(process, tmp_path / "model.incomplete" / "train_log.jsonl", 7, 0.1)
    assert digest(model) == before
    BertForSequenceClassification.from_pretrained(model)  # still loads

    # Without --overwrite nothing even starts; a run that fails (its dev file is missing) changes nothing either.
    code, _, err = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", model)
    assert code == 1 and len(err.splitlines()) == 1 and "already holds a model" in err
    config = json.loads((setup / "run.json").read_text())
    (tmp_path / "failing.json").write_text(json.dumps({**config, "dev": str(tmp_path / "missing.csv")}))
    code, _, err = in_process(capsys, "finetune", "--config", tmp_path / "failing.json", "--output", model,
                              "--overwrite")
    assert code == 1 and len(err.splitlines()) == 1 and "missing.csv" in err
    assert digest(model) == before

    # Resumed with another setting it is refused, naming the setting; the killed run stays, to be resumed.
    code, _, err = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", model, "--resume",
                              "--seed", "3")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "the run was started with training.seed=2, this one has training.seed=3" in err
    assert (tmp_path / "model.incomplete").is_dir() and digest(model) == before

    # Resuming the killed overwrite finishes it: then, and only then, the folder holds the new model.
    assert finetune(setup, model, "--resume", "--seed", "2").wait() == 0
    assert not (tmp_path / "model.incomplete").exists() and "checkpoint" not in os.listdir(model)
    assert json.loads((model / "finetune_config.json").read_text())["training"]["seed"] == 2
    assert (model / "model.safetensors").read_bytes() != (whole / "model.safetensors").read_bytes()


@pytest.mark.usefixtures("one_thread")  # the kernels of `whole`'s run, so the same rounding
def test_a_run_killed_as_it_removes_its_checkpoint_is_in_place_and_resume_tidies_it(setup, whole, tmp_path, capsys,
                                                                                       interrupted_checkpoint_removal):
    """The run is moved into place before its checkpoint (the optimizer state) is removed: killed in between, the
    model is whole and loads, and --resume only removes what was left."""
    output = tmp_path / "model"
    with interrupted_checkpoint_removal():
        code, _, err = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", output)
    assert code == 130 and "interrupted" in err
    assert (output / "checkpoint").is_dir() and not (tmp_path / "model.incomplete").exists()
    BertForSequenceClassification.from_pretrained(output)

    code, out, _ = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", output, "--resume")
    assert code == 0 and "already finished" in out
    assert not (output / "checkpoint").exists()
    assert records(output / "train_log.jsonl") == records(whole / "train_log.jsonl")
    assert (output / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


@pytest.mark.usefixtures("one_thread")
def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(setup, whole, tmp_path, capsys, caplog,
                                                                         monkeypatch):
    from bertforge.training import trainer

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    output = tmp_path / "model"
    monkeypatch.setattr(trainer, "save_train_state", killed)
    code, _, _ = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", output)
    monkeypatch.undo()
    assert code == 130 and (tmp_path / "model.incomplete" / "train_log.jsonl").read_text().count("\n") == 1

    code, _, _ = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", output, "--resume")
    assert code == 0 and "killed before its first checkpoint; it starts again" in caplog.text
    assert records(output / "train_log.jsonl") == records(whole / "train_log.jsonl")
    assert (output / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


def after_step(monkeypatch, step: int, action) -> None:
    """Run `action` once the trainer has logged training step `step` (a signal, a Ctrl-C, mid-run)."""
    from bertforge.training.trainer import Trainer

    log = Trainer.log

    def log_then_act(self, record):
        log(self, record)
        if record == {**record, "event": "train", "step": step}:
            action()

    monkeypatch.setattr(Trainer, "log", log_then_act)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_saves_a_checkpoint_and_stops_where_resume_gives_the_uninterrupted_run(setup, whole, tmp_path, capsys,
                                                                                     monkeypatch, stop):
    """SIGTERM is the notice a scheduler gives before it kills a job (SLURM, Kubernetes, spot instances): the step in
    flight ends, a checkpoint is saved, exit status 143. Checkpoints come every 1,000 steps here, so the one the run
    resumes from is the one SIGTERM made; before, SIGTERM ended the process and every step since the last one was
    lost. SIGHUP (an ssh session dropped under a run started without nohup) killed the run with no checkpoint: it
    is answered the same way, exit status 129."""
    output = tmp_path / "model"
    run = ("finetune", "--config", setup / "run.json", "--output", output, "--save-every", "1000")
    after_step(monkeypatch, 7, lambda: os.kill(os.getpid(), stop))
    code, _, err = in_process(capsys, *run)
    monkeypatch.undo()
    checkpoint = tmp_path / "model.incomplete" / "checkpoint"
    assert (code, err) == (128 + stop, f"bertforge: stopped by {stop.name} after step 7; its checkpoint is in "
                                       f"{checkpoint}: continue the run with --resume\n")
    assert torch.load(checkpoint / "train_state.pt", weights_only=True)["step"] == 7
    assert signal.getsignal(stop) is signal.SIG_DFL  # the run's handler is gone with it

    code, _, _ = in_process(capsys, *run, "--resume")
    assert code == 0
    assert records(output / "train_log.jsonl") == records(whole / "train_log.jsonl")
    assert json.loads((output / "metrics.json").read_text()) == json.loads((whole / "metrics.json").read_text())
    assert (output / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


@pytest.mark.usefixtures("one_thread")
def test_ctrl_c_after_a_checkpoint_says_where_it_is_and_resume_continues(setup, whole, tmp_path, capsys,
                                                                          monkeypatch):
    """Ctrl-C said "interrupted" alone, where the run had a checkpoint to continue from (SIGTERM's message named
    it): it now says where, and --resume from it gives the uninterrupted run."""
    def interrupt():
        raise KeyboardInterrupt

    output = tmp_path / "model"
    run = ("finetune", "--config", setup / "run.json", "--output", output, "--save-every", "3")
    after_step(monkeypatch, 7, interrupt)
    code, _, err = in_process(capsys, *run)
    monkeypatch.undo()
    checkpoint = tmp_path / "model.incomplete" / "checkpoint"
    assert (code, err) == (130, f"bertforge: interrupted; the run's last checkpoint is in {checkpoint}: continue it "
                                "with --resume\n")
    assert torch.load(checkpoint / "train_state.pt", weights_only=True)["step"] == 6
    code, _, _ = in_process(capsys, *run, "--resume")
    assert code == 0
    assert (output / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


@pytest.mark.usefixtures("one_thread")
def test_under_nohup_sighup_is_still_ignored(setup, whole, tmp_path, capsys, monkeypatch):
    """nohup starts a run with SIGHUP ignored, so that it outlives its terminal: the run's own SIGHUP handler must
    not undo that (it stopped such a run at the next step)."""
    output = tmp_path / "model"
    after_step(monkeypatch, 7, lambda: os.kill(os.getpid(), signal.SIGHUP))
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        code, _, err = in_process(capsys, "finetune", "--config", setup / "run.json", "--output", output)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert code == 0, err
    assert (output / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
