"""The trainer on toy problems: learning, accumulation equivalence, reproducibility, best model, early stopping."""

import copy
import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.training import TrainConfig, Trainer, bf16_supported
from bertforge.training.trainer import METRICS_FILE, TRAIN_LOG_FILE


class ToyClassifier(nn.Module):
    """A two-layer network whose forward returns an object with .loss, like the BertFor* models."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(dropout), nn.LayerNorm(16), nn.Linear(16, 2))

    def forward(self, x, labels):
        logits = self.net(x)
        return SimpleNamespace(logits=logits, loss=nn.functional.cross_entropy(logits, labels))


def toy_data(n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return x, (x[:, 0] + x[:, 1] > 0).long()  # linearly separable


def batches_of(x, y, size):
    return [{"x": x[i:i + size], "labels": y[i:i + size]} for i in range(0, len(x), size)]


def config(**overrides):
    return TrainConfig(**{"lr": 1e-2, "epochs": 1, "progress": False, "device": "cpu", **overrides})


def test_loss_decreases_on_a_toy_problem():
    torch.manual_seed(0)
    model = ToyClassifier()
    x, y = toy_data(512)
    dev_x, dev_y = toy_data(256, seed=1)
    evaluate = lambda model: {"loss": model(dev_x, dev_y).loss.item(),
                              "accuracy": (model(dev_x, dev_y).logits.argmax(-1) == dev_y).float().mean().item()}
    before = evaluate(model)
    result = Trainer(model, config(epochs=3), batches_of(x, y, 16), evaluate=evaluate, main_metric="loss",
                     greater_is_better=False).train()
    assert result.steps == 3 * 32 and len(result.history) == 3
    assert result.history[-1]["loss"] < 0.5 * before["loss"]
    assert result.history[-1]["accuracy"] > 0.9


def trained_parameters(batches, grad_accumulation, **overrides):
    torch.manual_seed(0)
    model = ToyClassifier()
    Trainer(model, config(grad_accumulation=grad_accumulation, weight_decay=0.1, **overrides), batches).train()
    return [p.detach().clone() for p in model.parameters()]


def test_accumulating_k_batches_of_n_equals_one_batch_of_k_times_n():
    x, y = toy_data(24)
    # two optimizer steps, so that Adam's second step depends on the size of the first gradients
    one_big = trained_parameters(batches_of(x, y, 12), grad_accumulation=1)
    accumulated = trained_parameters(batches_of(x, y, 4), grad_accumulation=3)
    for big, small in zip(one_big, accumulated):
        torch.testing.assert_close(small, big, rtol=1e-5, atol=1e-6)


def test_a_short_last_window_is_averaged_over_its_own_batches():
    x, y = toy_data(20)
    # 5 batches of 4, accumulating 3: steps over batches [0, 1, 2] and [3, 4]
    accumulated = trained_parameters(batches_of(x, y, 4), grad_accumulation=3, max_grad_norm=None)
    big = trained_parameters([batches_of(x, y, 12)[0], batches_of(x[12:], y[12:], 8)[0]], grad_accumulation=1,
                             max_grad_norm=None)
    for a, b in zip(big, accumulated):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def recorded_losses(seed):
    losses = []

    def loss_fn(model, batch):
        loss = model(**batch).loss
        losses.append(loss.item())
        return loss

    torch.manual_seed(0)  # the same initial weights; the trainer's seed then decides the dropout masks
    model = ToyClassifier(dropout=0.3)
    x, y = toy_data(64)
    Trainer(model, config(seed=seed, epochs=2), batches_of(x, y, 8), loss_fn=loss_fn).train()
    return losses


def test_the_seed_reproduces_the_losses():
    first, second = recorded_losses(seed=7), recorded_losses(seed=7)
    assert first == second
    assert recorded_losses(seed=8) != first


def scripted(values):
    """An evaluator that returns the given accuracies in turn."""
    values = iter(values)
    return lambda model: {"accuracy": next(values)}


def test_the_best_model_is_kept_and_metrics_are_written(tmp_path):
    model = ToyClassifier()
    x, y = toy_data(32)
    saved = []
    save = lambda model: saved.append(copy.deepcopy(model.state_dict()))
    trainer = Trainer(model, config(epochs=1, eval_every=1, output_dir=str(tmp_path), log_every=1),
                      batches_of(x, y, 8), evaluate=scripted([0.5, 0.9, 0.7, 0.8]), main_metric="accuracy",
                      save=save)
    result = trainer.train()
    assert [record["accuracy"] for record in result.history] == [0.5, 0.9, 0.7, 0.8]
    assert result.best["step"] == 2 and result.best["accuracy"] == 0.9
    assert len(saved) == 2  # after evaluation 1 (the first) and 2 (the best), never after a worse one
    summary = json.loads((tmp_path / METRICS_FILE).read_text())
    assert summary["best"] == result.best and summary["evaluations"] == result.history
    log = [json.loads(line) for line in (tmp_path / TRAIN_LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log if r["event"] == "train"] == [1, 2, 3, 4]
    assert [r["step"] for r in log if r["event"] == "eval"] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and r["examples_per_s"] > 0 for r in log if r["event"] == "train")


def test_a_metric_that_is_not_a_number_keeps_the_first_model_and_says_so_once(caplog):
    """A correlation of predictions all the same is NaN: it beats nothing, so the first evaluation is kept while
    every one is NaN, and the first number after them is the best; the warning comes once."""
    x, y = toy_data(48)
    nan = float("nan")
    result = Trainer(ToyClassifier(), config(epochs=1, eval_every=1), batches_of(x, y, 8),
                     evaluate=scripted([nan, nan, 0.3, nan, 0.2, nan]), main_metric="accuracy").train()
    assert result.best["step"] == 3 and result.best["accuracy"] == 0.3
    warnings = [r.getMessage() for r in caplog.records if "is not a number on the dev set" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("accuracy is not a number on the dev set")
    result = Trainer(ToyClassifier(), config(epochs=1, eval_every=1), batches_of(x, y, 16),
                     evaluate=scripted([nan, nan, nan]), main_metric="accuracy").train()
    assert result.best["step"] == 1


def test_early_stopping_stops_after_patience_evaluations_without_improvement():
    x, y = toy_data(80)
    result = Trainer(ToyClassifier(), config(epochs=1, eval_every=1, early_stopping_patience=2),
                     batches_of(x, y, 8), evaluate=scripted([0.6, 0.7, 0.65, 0.69, 0.9, 0.95]),
                     main_metric="accuracy").train()
    assert result.stopped_early and result.steps == 4 and result.best["step"] == 2


def test_a_run_stopped_before_its_next_log_line_logs_its_loss_and_counts_whole_epochs(tmp_path):
    """Early stopping (or max_steps) part-way through an epoch: the training loss of the steps since the last line
    is logged (the curves have a loss to draw), and the epoch stopped in is not counted as done, as the
    evaluations before the stop numbered it."""
    x, y = toy_data(80)  # 10 steps an epoch
    Trainer(ToyClassifier(), config(epochs=3, eval_every=1, early_stopping_patience=2, output_dir=str(tmp_path)),
            batches_of(x, y, 8), evaluate=scripted([0.6, 0.7, 0.65, 0.69, 0.9]), main_metric="accuracy").train()
    log = [json.loads(line) for line in (tmp_path / TRAIN_LOG_FILE).read_text().splitlines()]
    train = [record for record in log if record["event"] == "train"]
    assert [(record["step"], record["epoch"]) for record in train] == [(4, 0)] and train[0]["loss"] > 0
    assert {record["epoch"] for record in log if record["event"] == "eval"} == {0}

    folder = tmp_path / "steps"
    Trainer(ToyClassifier(), config(max_steps=3, output_dir=str(folder)), batches_of(x, y, 8),
            evaluate=scripted([0.5]), main_metric="accuracy").train()
    log = [json.loads(line) for line in (folder / TRAIN_LOG_FILE).read_text().splitlines()]
    assert [(record["event"], record["step"], record["epoch"]) for record in log] == [("train", 3, 0),
                                                                                        ("eval", 3, 0)]


def test_resuming_an_early_stopped_run_after_it_returned_logs_its_last_loss_once(tmp_path):
    """Its last steps' loss, logged at the stop, comes before its last checkpoint: resumed from that checkpoint (a
    run killed while finetune stages its model), the log has the line once, as the run that was not killed."""
    x, y = toy_data(80)

    def run(folder, resume=False):
        torch.manual_seed(0)
        return Trainer(ToyClassifier(), config(epochs=3, eval_every=1, save_every=1, early_stopping_patience=2,
                                               output_dir=str(folder)), batches_of(x, y, 8),
                       evaluate=scripted([0.6, 0.7, 0.65, 0.69, 0.9]), main_metric="accuracy").train(resume=resume)

    run(tmp_path / "whole")
    run(tmp_path / "split")
    resumed = run(tmp_path / "split", resume=True)
    assert resumed.stopped_early and resumed.steps == 4
    assert logged(tmp_path / "split") == logged(tmp_path / "whole")
    assert [r["step"] for r in logged(tmp_path / "split") if r["event"] == "train"] == [4]


def test_without_an_evaluator_the_final_model_is_saved():
    x, y = toy_data(16)
    saved = []
    result = Trainer(ToyClassifier(), config(max_steps=3), batches_of(x, y, 8), save=saved.append).train()
    assert result.steps == 3 and len(saved) == 1 and result.best is None  # max_steps runs past one epoch


@pytest.mark.skipif(not bf16_supported("cpu"), reason="no native bf16 on this CPU")
def test_bf16_autocast_trains():
    x, y = toy_data(64)
    result = Trainer(ToyClassifier(), config(bf16=True), batches_of(x, y, 16)).train()
    assert result.steps == 4


@pytest.mark.parametrize("overrides, message", [({"lr": 0}, "lr must be above 0"),
                                                ({"grad_accumulation": 0}, "grad_accumulation must be at least 1"),
                                                ({"epochs": "3"}, "epochs must be an integer"),
                                                # numpy's global generator, seeded with torch's, takes 32 bits
                                                ({"seed": 2**32}, "seed must be at most 4294967295"),
                                                ({"lr_schedule": "step"}, "unknown lr_schedule 'step'; choose from "
                                                                          "linear, cosine, constant"),
                                                ({"layer_lr_decay": 0}, "layer_lr_decay must be above 0.0"),
                                                ({"layer_lr_decay": 1.2}, "layer_lr_decay must be at most 1.0"),
                                                ({"label_smoothing": 1}, r"label_smoothing must be in \[0, 1\)"),
                                                ({"report_to": ["wandb"]}, "unknown reporter 'wandb'; choose from "
                                                                           "tensorboard")])
def test_bad_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**overrides)


def test_config_round_trips_and_names_unknown_keys():
    settings = TrainConfig(lr=3e-5, betas=(0.9, 0.98), eval_every=100, report_to=("tensorboard",))
    assert TrainConfig.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    assert TrainConfig(report_to="tensorboard").report_to == ("tensorboard",)  # one name, as transformers takes it
    with pytest.raises(ConfigError, match=r"^run.json: unknown key 'learning_rate'"):
        TrainConfig.from_dict({"learning_rate": 1e-4}, "run.json")


class Killed(Exception):
    pass


def logged(folder, wall_clock=False):
    """The training log, without its wall-clock field unless `wall_clock`."""
    return [{k: v for k, v in json.loads(line).items() if wall_clock or k != "examples_per_s"}
            for line in (folder / TRAIN_LOG_FILE).read_text().splitlines()]


@pytest.mark.parametrize("killed", ["at the final evaluation", "after the run, before its checkpoint was removed"])
def test_resuming_after_the_last_steps_checkpoint_gives_the_uninterrupted_log(tmp_path, killed):
    """The last step's checkpoint is written before the final evaluation: a run resumed from it evaluates once
    more, in the epoch the uninterrupted run was in, and its log has each line once."""
    x, y = toy_data(48)
    dev_x, dev_y = toy_data(32, seed=1)
    settings = dict(epochs=2, eval_every=5, save_every=1, log_every=1)  # 12 steps: evaluations at 5, 10 and 12

    def accuracy(model):
        return {"accuracy": (model(dev_x, dev_y).logits.argmax(-1) == dev_y).float().mean().item()}

    def run(folder, evaluate, resume=False):
        torch.manual_seed(0)
        return Trainer(ToyClassifier(dropout=0.1), config(output_dir=str(folder), **settings), batches_of(x, y, 8),
                       evaluate=evaluate, main_metric="accuracy").train(resume=resume)

    whole = run(tmp_path / "whole", accuracy)
    split = tmp_path / "split"
    if killed == "at the final evaluation":
        evaluations = 0

        def dies_at_the_third(model):
            nonlocal evaluations
            evaluations += 1
            if evaluations == 3:
                raise Killed
            return accuracy(model)

        with pytest.raises(Killed):
            run(split, dies_at_the_third)
    else:
        run(split, accuracy)  # the trainer returned; the checkpoint that finetune removes next is still there
    resumed = run(split, accuracy, resume=True)
    assert logged(split) == logged(tmp_path / "whole")
    assert [r["epoch"] for r in logged(split) if r["event"] == "eval"] == [0, 1, 2]
    assert resumed.history == whole.history and resumed.steps == 12


def test_tensorboard_shows_every_number_of_the_log_under_transformers_tags(tmp_path, tensorboard_scalars,
                                                                          logged_scalars):
    """report_to tensorboard: OUTPUT/runs holds the numbers of train_log.jsonl (which other code writes), step for
    step at the optimizer's step, under the tags a transformers Trainer gives them."""
    x, y = toy_data(32)
    Trainer(ToyClassifier(), config(epochs=2, eval_every=3, log_every=2, output_dir=str(tmp_path),
                                    report_to=["tensorboard"]),
            batches_of(x, y, 8), evaluate=scripted([0.5, 0.9, 0.7]), main_metric="accuracy").train()
    shown = tensorboard_scalars(tmp_path / "runs")
    assert set(shown) == {"train/loss", "train/learning_rate", "train/epoch", "train/examples_per_s",
                          "eval/accuracy"}
    assert shown == logged_scalars(logged(tmp_path, wall_clock=True))
    assert [step for step, _ in shown["train/loss"]] == [2, 4, 6, 8]
    assert shown["eval/accuracy"] == [(3, 0.5), (6, pytest.approx(0.9)), (8, pytest.approx(0.7))]


@pytest.mark.parametrize("killed", ["mid-run, two steps after its checkpoint", "at the final evaluation",
                                    "after the run, before its checkpoint was removed",
                                    "mid-run, reporting to tensorboard only once resumed"])
def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path, killed, tensorboard_scalars, logged_scalars):
    """The killed run's curves from the checkpoint's step on are hidden (purge_step) and reported again by the
    resumed run: the dashboard is the log's, and the uninterrupted run's but for the wall clock. A killed run that
    reported nothing has the whole log reported by the resumed one."""
    x, y = toy_data(48)
    dev_x, dev_y = toy_data(32, seed=1)
    # 12 steps: evaluations at 5, 10 and 12; mid-run, the run dies at step 10's, resumed from step 8's checkpoint
    settings = dict(epochs=2, eval_every=5, save_every=4 if killed.startswith("mid-run") else 1, log_every=1)

    def run(folder, evaluate, resume=False, report=True):
        torch.manual_seed(0)
        reporting = {"report_to": ["tensorboard"] if report else None}
        return Trainer(ToyClassifier(dropout=0.1), config(output_dir=str(folder), **settings, **reporting),
                       batches_of(x, y, 8), evaluate=evaluate, main_metric="accuracy").train(resume=resume)

    def dies_at(evaluation):
        """The dev accuracy, until the `evaluation`th call, which the run dies at (None: never)."""
        evaluations = 0

        def evaluate(model):
            nonlocal evaluations
            evaluations += 1
            if evaluations == evaluation:
                raise Killed
            return {"accuracy": (model(dev_x, dev_y).logits.argmax(-1) == dev_y).float().mean().item()}
        return evaluate

    run(tmp_path / "whole", dies_at(None))
    split = tmp_path / "split"
    if killed == "after the run, before its checkpoint was removed":
        run(split, dies_at(None))
    else:
        with pytest.raises(Killed):
            run(split, dies_at(2 if killed.startswith("mid-run") else 3), report="only once resumed" not in killed)
    run(split, dies_at(None), resume=True)
    # the killed run's and the resumed one's
    assert len(list((split / "runs").glob("events.out.tfevents.*"))) == 1 + ("only once resumed" not in killed)
    shown = tensorboard_scalars(split / "runs")
    assert shown == logged_scalars(logged(split, wall_clock=True))
    assert [step for step, _ in shown["train/loss"]] == list(range(1, 13))
    assert [step for step, _ in shown["eval/accuracy"]] == [5, 10, 12]
    whole = tensorboard_scalars(tmp_path / "whole" / "runs")
    assert {tag: values for tag, values in shown.items() if tag != "train/examples_per_s"} == {
        tag: values for tag, values in whole.items() if tag != "train/examples_per_s"}


def test_tensorboard_without_its_package_is_a_one_line_error_before_any_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what `import tensorboard` meets where it isn't installed
    with pytest.raises(ConfigError) as caught:
        Trainer(ToyClassifier(), config(output_dir=str(tmp_path / "out"), report_to=["tensorboard"]),
                batches_of(*toy_data(8), 8))
    assert str(caught.value) == ("--report-to tensorboard needs the tensorboard package: "
                                 "pip install 'bertforge[tensorboard]'")
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=r"^report_to tensorboard writes into output_dir/runs: give an output_dir$"):
        Trainer(ToyClassifier(), config(report_to=["tensorboard"]), batches_of(*toy_data(8), 8))


def tiny_bert_batches(tiny_config, batches: int = 6, rows: int = 4, length: int = 9) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(1, tiny_config.vocab_size, (rows, length), generator=generator),
             "labels": torch.randint(0, 2, (rows,), generator=generator)} for _ in range(batches)]


def test_a_run_with_layer_rates_a_cosine_and_smoothed_labels_resumes_exactly(tiny_config, tmp_path):
    """One AdamW group pair per layer, each with its own rate under the schedule: killed after a checkpoint and
    resumed, the run logs the losses and ends at the weights of the run that was not killed."""
    from bertforge import BertForSequenceClassification

    batches = tiny_bert_batches(tiny_config)
    settings = dict(epochs=2, eval_every=4, save_every=1, log_every=1, lr=1e-3, warmup_steps=2, lr_schedule="cosine",
                    layer_lr_decay=0.7, label_smoothing=0.1)
    evaluations = 0

    def loss_on_the_first(model):
        nonlocal evaluations
        evaluations += 1
        if evaluations == killed_at:
            raise Killed
        with torch.no_grad():
            return {"loss": model(**batches[0]).loss.item()}

    def run(folder, resume=False):
        torch.manual_seed(0)
        model = BertForSequenceClassification(tiny_config)
        Trainer(model, config(output_dir=str(folder), **settings), batches, evaluate=loss_on_the_first,
                main_metric="loss", greater_is_better=False).train(resume=resume)
        return model

    killed_at = None
    whole = run(tmp_path / "whole")
    killed_at, evaluations = 2, 0
    with pytest.raises(Killed):
        run(tmp_path / "split")
    killed_at, evaluations = None, 0
    resumed = run(tmp_path / "split", resume=True)
    assert logged(tmp_path / "split") == logged(tmp_path / "whole")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    rates = [record["lr"] for record in logged(tmp_path / "whole") if record["event"] == "train"]
    # the logged rate is the head's: --lr's warm-up, then half a cosine over the other 10 of 12 steps
    expected = [1e-3 * (0.5 if step == 1 else 0.5 * (1 + math.cos(math.pi * (step - 2) / 10))) for step in range(1, 13)]
    assert rates == pytest.approx(expected)


def test_label_smoothing_and_class_weights_need_class_labels_and_the_models_own_loss(tiny_config):
    from bertforge import BertForSequenceClassification

    tiny_config.num_labels = 1  # a regression
    model = BertForSequenceClassification(tiny_config)
    batches = [{**batch, "labels": batch["labels"].float()} for batch in tiny_bert_batches(tiny_config, batches=1)]
    with pytest.raises(ConfigError, match=r"label smoothing and class weights need class labels \(classification, "
                                          r"ner\); this run's batches have numbers"):
        Trainer(model, config(label_smoothing=0.1), batches).train()
    with pytest.raises(ConfigError, match="label smoothing and class weights need class labels"):
        Trainer(model, config(), batches, class_weights=[1.0]).train()
    with pytest.raises(ConfigError, match="label smoothing and class weights shape the model's own cross-entropy"):
        Trainer(model, config(label_smoothing=0.1), batches, loss_fn=lambda model, batch: model(**batch).loss)
