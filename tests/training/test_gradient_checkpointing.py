"""Gradient checkpointing recomputes each encoder layer in the backward pass: the same loss and gradients as
keeping the activations (dropout included), on a tiny model; a fine-tuning run takes the flag (pre-training:
tests/cli/test_pretrain_cli.py)."""

from __future__ import annotations

import pytest
import torch

from bertforge import BertConfig, BertForSequenceClassification
from bertforge.errors import BertforgeError
from bertforge.training.trainer import recomputing


def loss_and_gradients(model, batch, seed):
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                           if parameter.grad is not None}


def test_recomputed_layers_give_the_same_gradients():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig.tiny(vocab_size=100, id2label={0: "a", 1: "b"})).train()
    ids = torch.randint(5, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padding, so that packing is exercised
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])}
    expected_loss, expected = loss_and_gradients(model, batch, seed=1)
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    loss, got = loss_and_gradients(model, batch, seed=1)
    assert torch.equal(loss, expected_loss)  # dropout draws the same masks when the layers run again
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-6), name
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    with recomputing(model, True):
        assert model.is_gradient_checkpointing
    assert not model.is_gradient_checkpointing
    with pytest.raises(BertforgeError, match="holds no BERT encoder"):
        with recomputing(torch.nn.Linear(2, 2), True):
            pass


def test_finetune_takes_the_flag(tiny_model_dir, tmp_path, run_cli, data_dir):
    rows = [("a joy from start to finish", "pos"), ("dull and lifeless", "neg")] * 8
    (tmp_path / "train.csv").write_text("sentence,label\n" + "".join(f'"{t}",{label}\n' for t, label in rows))
    code, out, err = run_cli("--threads", "1", "finetune", "--model", tiny_model_dir, "--train",
                             tmp_path / "train.csv", "--output", tmp_path / "model", "--epochs", "1",
                             "--batch-size", "4", "--gradient-checkpointing", "--no-progress", "--device", "cpu")
    assert code == 0, err
    config = (tmp_path / "model" / "finetune_config.json").read_text()
    assert '"gradient_checkpointing": true' in config


def test_every_n_layers_recomputes_those_layers_alone():
    """transformers 5's every_n_layers (its Trainer passes it): layers 0 and 2 of 4 run again in the backward pass,
    1 and 3 keep their activations; the gradients are the same either way."""
    torch.manual_seed(0)
    config = BertConfig.tiny(vocab_size=100, num_hidden_layers=4, id2label={0: "a", 1: "b"})
    model = BertForSequenceClassification(config).train()
    batch = {"input_ids": torch.randint(5, 100, (3, 9)), "labels": torch.tensor([0, 1, 1])}
    expected_loss, expected = loss_and_gradients(model, batch, seed=1)
    calls = [0] * 4
    for index, layer in enumerate(model.bert.encoder.layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: calls.__setitem__(index, calls[index] + 1))
    model.activation_checkpointing_enable(every_n_layers=2, offload=True)  # offload: nothing to move on a CPU
    assert model.is_activation_checkpointing and model.supports_gradient_checkpointing
    loss, got = loss_and_gradients(model, batch, seed=1)
    assert calls == [2, 1, 2, 1]
    assert torch.equal(loss, expected_loss)
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-6), name
    model.activation_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    with pytest.raises(BertforgeError, match="every_n_layers must be a whole number >= 1, got 0"):
        model.gradient_checkpointing_enable(every_n_layers=0)
