"""AdamW groups and the warm-up/decay schedule, against hand-derived values."""

import pytest
import torch
from torch import nn

from bertforge import BertForSequenceClassification
from bertforge.training import build_optimizer, linear_warmup_decay, parameter_groups


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
    scheduler = linear_warmup_decay(optimizer, warmup_steps=10, total_steps=110)
    for _ in range(step):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(2.0 * expected)


def test_no_warmup_starts_at_the_peak():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    assert linear_warmup_decay(optimizer, warmup_steps=0, total_steps=4).get_last_lr()[0] == 1.0
