"""AdamW groups (weight decay, layer-wise learning rates) against hand-derived values; the warm-up schedules
against hand-derived values and transformers' own."""

import re

import pytest
import torch
from torch import nn

from bertforge import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification
from bertforge.errors import ConfigError
from bertforge.training import LR_SCHEDULES, build_optimizer, parameter_groups, warmup_schedule


def test_no_decay_on_biases_and_layer_norms(tiny_config):
    model = BertForSequenceClassification(tiny_config)
    decay, no_decay = parameter_groups(model, weight_decay=0.01)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    exempt = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert decayed | exempt == set(names.values()) and not decayed & exempt
    # independent truth: the names transformers' recipe exempts (every bias, every LayerNorm parameter)
    is_exempt = lambda name: name.endswith("bias") or "norm" in name
    assert exempt == {name for name in names.values() if is_exempt(name)}
    assert "bert.embeddings.tokens.weight" in decayed and "classifier.weight" in decayed


def test_frozen_and_tied_parameters():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight  # tied
    model[0].bias.requires_grad_(False)
    decay, no_decay = parameter_groups(model, 0.1)
    assert len(decay["params"]) == 1 and len(no_decay["params"]) == 1


def test_optimizer_settings(tiny_config):
    optimizer = build_optimizer(BertForSequenceClassification(tiny_config), lr=3e-5, weight_decay=0.01,
                                betas=(0.9, 0.98), eps=1e-6)
    assert [group["lr"] for group in optimizer.param_groups] == [3e-5, 3e-5]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.98) and optimizer.param_groups[0]["eps"] == 1e-6


@pytest.mark.parametrize("step, expected", [(0, 0.0), (5, 0.5), (10, 1.0), (60, 0.5), (100, 0.1), (110, 0.0),
                                            (120, 0.0)])
def test_linear_warmup_then_decay(step, expected):
    parameter = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    scheduler = warmup_schedule(optimizer, warmup_steps=10, total_steps=110)
    for _ in range(step):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(2.0 * expected)


def test_no_warmup_starts_at_the_peak():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    assert warmup_schedule(optimizer, warmup_steps=0, total_steps=4).get_last_lr()[0] == 1.0


# bertforge's schedule -> transformers' lr_scheduler_type with the same warm-up
TRANSFORMERS_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


@pytest.mark.parametrize("shape", LR_SCHEDULES)
@pytest.mark.parametrize("warmup_steps, total_steps", [(10, 110), (0, 7), (3, 4)])
def test_each_schedule_is_transformers_own(shape, warmup_steps, total_steps):
    """At every step, the rate transformers' get_scheduler gives for the same warm-up and length."""
    transformers = pytest.importorskip("transformers")
    rates = {}
    for name, make in (("ours", lambda o: warmup_schedule(o, warmup_steps, total_steps, shape)),
                       ("theirs", lambda o: transformers.get_scheduler(TRANSFORMERS_SCHEDULES[shape], o,
                                                                       warmup_steps, total_steps))):
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=3e-4)
        scheduler, rates[name] = make(optimizer), []
        for _ in range(total_steps + 1):
            rates[name].append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
    assert rates["ours"] == pytest.approx(rates["theirs"], abs=1e-12)
    assert max(rates["ours"]) == pytest.approx(3e-4)


def test_cosine_by_hand():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_schedule(optimizer, warmup_steps=10, total_steps=110, shape="cosine")
    rates = []
    for _ in range(111):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    # half a cosine after the warm-up: 1 at step 10, (1 + cos(pi / 4)) / 2 a quarter of the way, 0.5 halfway, 0 at
    # the end
    assert rates[5] == 0.5 and rates[10] == 1.0 and rates[35] == pytest.approx(0.853553, abs=1e-6)
    assert rates[60] == pytest.approx(0.5) and rates[110] == pytest.approx(0.0, abs=1e-12)
    # a warm-up as long as the run ends at 0 too (transformers' cosine would stay at the peak)
    whole_run_warmup = warmup_schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 3, 3, "cosine")
    assert whole_run_warmup.lr_lambdas[0](2) == pytest.approx(2 / 3) and whole_run_warmup.lr_lambdas[0](3) == 0
    with pytest.raises(ConfigError, match="unknown lr_schedule 'cosine_with_restarts'; choose from linear, cosine"):
        warmup_schedule(optimizer, 1, 2, "cosine_with_restarts")


def rate_by_name(model: nn.Module, lr: float, decay: float) -> dict[str, float]:
    """Each parameter's rate under layer-wise decay, from its name alone: the head and pooler lr, encoder layer i of
    L lr x decay ** (L - i), the embeddings lr x decay ** (L + 1)."""
    layers = model.config.num_hidden_layers
    rates = {}
    for name, _ in model.named_parameters():
        layer = re.search(r"\.encoder\.layers\.(\d+)\.", name)
        depth = 0 if ".embeddings." in name else int(layer.group(1)) + 1 if layer else layers + 1
        rates[name] = lr * decay ** (layers + 1 - depth)
    return rates


@pytest.mark.parametrize("model_class", [BertForSequenceClassification, BertForTokenClassification,
                                         BertForMaskedLM])
def test_layer_lr_decay_gives_each_level_its_rate_and_keeps_the_decay_exemptions(tiny_config, model_class):
    model = model_class(tiny_config)
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.01, layer_lr_decay=0.5)
    names = {id(p): name for name, p in model.named_parameters()}  # a tied parameter once, by its first name
    found = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            name = names[id(parameter)]
            assert name not in found
            found[name] = (group["lr"], group["weight_decay"])
    assert set(found) == set(names.values())
    expected = rate_by_name(model, 1e-3, 0.5)
    for name, (rate, weight_decay) in found.items():
        assert rate == pytest.approx(expected[name]), name
        assert weight_decay == (0.0 if name.endswith("bias") or "norm" in name else 0.01), name
    assert len({rate for rate, _ in found.values()}) == tiny_config.num_hidden_layers + 2
    # no decay: the two groups at lr that every run had (and a checkpoint's optimizer state holds)
    assert [group["lr"] for group in build_optimizer(model, lr=1e-3, weight_decay=0.01).param_groups] == [1e-3] * 2


def test_layer_lr_decay_needs_a_bert_encoder():
    with pytest.raises(ConfigError, match="layer_lr_decay needs a model with one BERT encoder; Sequential has 0"):
        build_optimizer(nn.Sequential(nn.Linear(2, 2)), lr=1e-3, weight_decay=0.0, layer_lr_decay=0.9)
