"""Training state: a save/load round trip continues training exactly (weights, optimizer moments, schedule, RNG,
fp16 loss scale); a failed save keeps the previous checkpoint; foreign files are refused in one line."""

import errno
import random

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.checkpoint.train_state import TRAIN_STATE_FILE, check_same_settings, load_train_state, save_train_state
from bertforge.errors import CheckpointError, ConfigError
from bertforge.training.optim import build_optimizer, warmup_schedule


def make_run(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.LayerNorm(8), nn.Linear(8, 1))
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.01)
    return model, optimizer, warmup_schedule(optimizer, warmup_steps=2, total_steps=10)


def train_step(model, optimizer, scheduler):
    loss = model(torch.randn(5, 4)).pow(2).mean()  # the inputs and the dropout mask both use the global RNG
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def test_resumed_training_continues_exactly(tmp_path):
    model, optimizer, scheduler = make_run()
    for _ in range(3):
        train_step(model, optimizer, scheduler)
    save_train_state(tmp_path, model, optimizer, scheduler, step=3, data={"position": 7}, extra={"note": "x"})
    expected = [train_step(model, optimizer, scheduler) for _ in range(3)]
    expected_draws = (random.random(), np.random.rand(), torch.rand(1).item())

    model, optimizer, scheduler = make_run(seed=1)  # other weights and RNG state, all overwritten by the load
    random.seed(5)
    np.random.seed(5)
    state = load_train_state(tmp_path, model, optimizer, scheduler)
    assert (state.step, state.data, state.extra) == (3, {"position": 7}, {"note": "x"})
    assert [train_step(model, optimizer, scheduler) for _ in range(3)] == expected
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected_draws


def test_the_fp16_loss_scale_is_saved_and_restored(tmp_path):
    model, optimizer, scheduler = make_run()
    # GradScaler's CPU flavour has the same state as CUDA's, so the round trip is checked without a GPU.
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    scaler.scale(model(torch.randn(5, 4)).pow(2).mean()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 2048.0  # finite gradients for growth_interval steps: the scale doubles
    save_train_state(tmp_path, model, optimizer, scheduler, step=1, scaler=scaler)
    restored = torch.amp.GradScaler("cpu")
    load_train_state(tmp_path, *make_run(), scaler=restored)
    assert restored.state_dict() == scaler.state_dict()

    save_train_state(tmp_path, model, optimizer, scheduler, step=1)  # a float32 or bf16 run's checkpoint
    assert "scaler" not in torch.load(tmp_path / TRAIN_STATE_FILE, weights_only=True)
    with pytest.raises(CheckpointError, match="no fp16 loss scaler state"):
        load_train_state(tmp_path, *make_run(), scaler=torch.amp.GradScaler("cpu"))
    load_train_state(tmp_path, *make_run(), scaler=torch.amp.GradScaler("cpu", enabled=False))


def test_a_save_that_fails_keeps_the_last_good_checkpoint_and_says_why(tmp_path, file_size_limit):
    """A full disk (here a file size limit, which fails a write the same way). torch.save reports it as an assertion
    of its own ("unexpected pos 576 vs 534"); the error is the OS's, naming the file."""
    model, optimizer, scheduler = make_run()
    save_train_state(tmp_path, model, optimizer, scheduler, step=1)
    size = (tmp_path / TRAIN_STATE_FILE).stat().st_size
    for limit in (size // 4, size // 2, size - 100):
        with file_size_limit(limit), pytest.raises(OSError) as failure:
            save_train_state(tmp_path, model, optimizer, scheduler, step=2)
        assert (failure.value.errno, failure.value.filename) == (errno.EFBIG, str(tmp_path / TRAIN_STATE_FILE))
        assert load_train_state(tmp_path, *make_run()).step == 1
        assert [path.name for path in tmp_path.iterdir()] == [TRAIN_STATE_FILE]


def test_missing_or_foreign_files_are_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no training checkpoint"):
        load_train_state(tmp_path, *make_run())
    (tmp_path / TRAIN_STATE_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable training checkpoint"):
        load_train_state(tmp_path, *make_run())
    torch.save({"weights": torch.zeros(1)}, tmp_path / TRAIN_STATE_FILE)
    with pytest.raises(CheckpointError, match="not a bertforge training checkpoint"):
        load_train_state(tmp_path, *make_run())


def test_a_resumed_run_has_the_settings_it_started_with_but_for_those_that_change_nothing(tmp_path):
    """One check for fine-tuning and pre-training: nested settings by their dotted name, a changeable one passed,
    any other named with both values; a field added since the run started is compared with its default (each
    caller reads the saved settings back through its config class)."""
    from bertforge.pretraining.run import PretrainConfig, _check_resumable

    saved = {"lr": 0.1, "training": {"seed": 1, "log_every": 10}}
    check_same_settings(saved, {"lr": 0.1, "training": {"seed": 1, "log_every": 5}}, {"training.log_every"}, "run")
    with pytest.raises(ConfigError, match="run: the run was started with training.seed=1, this one has "
                                          "training.seed=2; resume with the same settings"):
        check_same_settings(saved, {"lr": 0.1, "training": {"seed": 2, "log_every": 10}}, set(), "run")
    config = PretrainConfig(data="d", output="o")
    older = {key: value for key, value in config.to_dict().items() if key != "holdout"}  # saved before it existed
    _check_resumable(older, config, tmp_path / "pretrain_config.json")
    with pytest.raises(ConfigError, match="the run was started with holdout=.*this one has holdout=7"):
        _check_resumable(older, PretrainConfig(data="d", output="o", holdout=7), tmp_path / "pretrain_config.json")
