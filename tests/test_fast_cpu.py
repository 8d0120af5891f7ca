"""The CPU fast paths: the cheaper dropout mask, oneDNN on a prepacked weight with the activation as a post-op,
and the swap of a plain model to them and back."""

import copy
import dataclasses
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F

from bertforge.activations import ACTIVATIONS, ONEDNN_POST_OPS
from bertforge.fast_cpu import PrepackedLinear as Linear
from bertforge.fast_cpu import dropout


@pytest.mark.parametrize("p", [0.1, 0.15, 0.5])
def test_dropout_mask_keeps_one_minus_p_and_the_expected_value(p):
    torch.manual_seed(0)
    x = torch.ones(1_000_000, requires_grad=True)
    y = dropout(x, p, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 2e-3  # ~4 standard deviations at n = 1e6
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept)  # the gradient flows through kept elements only
    pairs = kept.view(-1, 2)  # neighbours (16-bit lanes of one random word) are independent
    assert abs(pairs.all(1).float().mean().item() - (1 - p) ** 2) < 3e-3
    assert dropout(x, p, training=False) is x
    assert dropout(x.detach().bfloat16(), p, training=True).dtype == torch.bfloat16


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_linear_inference_on_a_packed_weight_follows_the_weight():
    torch.manual_seed(0)
    layer, x = Linear(48, 96).eval(), torch.randn(3, 7, 48)

    def agrees() -> bool:
        with torch.inference_mode():
            return torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)

    assert agrees() and layer.packed is not None  # the oneDNN path ran
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True)  # its step moves no version counter
    layer(x).square().sum().backward()  # nn.Linear's path, with gradients
    assert agrees()
    layer.train()  # a switch to train mode, then a step
    optimizer.step()
    layer.eval()
    assert agrees()
    layer(x).square().sum().backward()  # a forward pass with gradients, then a step, all in eval mode
    optimizer.step()
    assert agrees()
    with torch.no_grad():
        layer.weight.mul_(2)  # an in-place edit without a forward pass in between
    assert agrees()
    layer.load_state_dict({"weight": layer.weight * 2, "bias": layer.bias})
    assert agrees()
    assert layer.packed is not None
    copied = copy.deepcopy(layer)  # the packed copy itself can be neither copied nor pickled
    assert copied.packed is None and torch.equal(copied.weight, layer.weight)
    assert pickle.loads(pickle.dumps(layer)).packed is None
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # autocast keeps its say
    with torch.inference_mode():
        without_bias = Linear(48, 8, bias=False).eval()  # weights made under inference_mode: no version counter
        assert torch.allclose(without_bias(x), x @ without_bias.weight.T, atol=1e-5)
        without_bias.weight.mul_(2)
        assert torch.allclose(without_bias(x), x @ without_bias.weight.T, atol=1e-5)




@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_eval_on_a_layer_in_eval_mode_keeps_its_packed_weight():
    """Every inference call (a pipeline's, predict, encode) puts the model in eval mode; where it is in eval mode
    already that changes nothing, and the packed copy stays: MiniLM's took 30 ms to pack again, on every call from
    every thread, against 8 ms for a forward pass of one sentence (a 2-core AVX2 CPU)."""
    torch.manual_seed(0)
    layer, x = Linear(48, 96).eval(), torch.randn(3, 7, 48)
    with torch.inference_mode():
        expected = layer(x)
    packed = layer.packed
    assert packed is not None and layer.eval().packed is packed
    with torch.inference_mode():
        assert torch.equal(layer(x), expected) and layer.packed is packed
    assert layer.train().eval().packed is None  # a switch drops it: an optimizer may step in between

class EvaluatedElsewhereOncePacked(Linear):
    """A PrepackedLinear that another thread puts in eval mode (as every encode or pipeline call on a shared model
    does, dropping the packed weight) right after this thread stores a packed weight, before it reads it back."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "packed" and value is not None:
            other = threading.Thread(target=self.eval)
            other.start()
            other.join()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_a_packed_weight_another_thread_drops_still_serves_the_call_that_packed_it():
    """Found by calling an accelerated classifier's pipeline from 6 threads: 4 calls in 360 failed with
    "'NoneType' object is not subscriptable" where another thread's eval() dropped the packed weight."""
    torch.manual_seed(0)
    layer, x = EvaluatedElsewhereOncePacked(48, 96).eval(), torch.randn(3, 7, 48)
    with torch.inference_mode():
        for _ in range(2):  # packed, dropped by the other thread; packed again
            assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)


def test_the_gelus_and_relu_have_onednn_post_ops():
    assert set(ONEDNN_POST_OPS) <= set(ACTIVATIONS)
    assert {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu"} <= set(ONEDNN_POST_OPS)  # those BERT checkpoints use


@pytest.mark.parametrize("activation", ["gelu", "silu"])  # fused into the up-projection, or after it
def test_accelerate_keeps_any_activation(tiny_config, random_batch, activation):
    from bertforge import BertModel
    from bertforge.fast_cpu import accelerate

    torch.manual_seed(0)
    model = BertModel(dataclasses.replace(tiny_config, hidden_act=activation)).eval()
    batch = random_batch(tiny_config, batch_size=3, seq_len=9)
    with torch.inference_mode():
        expected = model(*batch).last_hidden_state
        fast = accelerate(model)(*batch).last_hidden_state
    assert torch.allclose(fast, expected, atol=1e-5)
    feed_forward = model.encoder.layers[0].feed_forward
    fused = activation in ONEDNN_POST_OPS
    assert (feed_forward.up.activation == activation) is fused
    assert isinstance(feed_forward.activation, torch.nn.Identity) is fused


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_linear_applies_its_activation_on_every_path(activation):
    """oneDNN's post-op (eval, no gradients) and the plain path (training) compute the same activation."""
    torch.manual_seed(0)
    layer, x = Linear(48, 96, activation=activation).eval(), torch.randn(3, 7, 48)
    expected = ACTIVATIONS[activation](F.linear(x, layer.weight, layer.bias))
    with torch.inference_mode():
        fused = layer(x)
    assert layer.packed is not None  # the oneDNN path ran
    assert torch.allclose(fused, expected, atol=1e-5)
    assert torch.allclose(layer.train()(x), expected, atol=1e-6)


def test_accelerate_swaps_plain_modules_and_make_plain_swaps_them_back(tiny_config, random_batch):
    from bertforge import BertModel
    from bertforge.fast_cpu import Dropout, accelerate, make_plain

    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    parameters = dict(model.named_parameters())
    batch = random_batch(tiny_config, batch_size=3, seq_len=9)
    with torch.inference_mode():
        expected = model(*batch).last_hidden_state
        assert accelerate(model) is model and accelerate(model) is model  # idempotent
        fast = model(*batch).last_hidden_state
    feed_forward = model.encoder.layers[0].feed_forward
    assert type(feed_forward.up) is Linear and feed_forward.up.activation == tiny_config.hidden_act
    assert isinstance(feed_forward.activation, torch.nn.Identity)  # fused into the up-projection
    assert not any(type(module) in (torch.nn.Linear, torch.nn.Dropout) for module in model.modules())
    assert any(type(module) is Dropout for module in model.modules())
    assert all(parameters[name] is parameter for name, parameter in model.named_parameters())  # shared, not copied
    assert torch.allclose(fast, expected, atol=1e-5)

    assert make_plain(model) is model
    assert not any(type(module) in (Linear, Dropout, torch.nn.Identity) for module in model.modules())
    assert type(feed_forward.up) is torch.nn.Linear and feed_forward.activation.name == tiny_config.hidden_act
    assert all(parameters[name] is parameter for name, parameter in model.named_parameters())
    assert not model.training and all(not module.training for module in model.modules())
    with torch.inference_mode():
        assert torch.equal(model(*batch).last_hidden_state, expected)


def test_training_under_the_fast_paths_keeps_the_plain_models_gradients(tiny_config, random_batch):
    """Dropout off: the fast path's training forward and backward are nn.Linear's own."""
    import dataclasses

    from bertforge import BertModel
    from bertforge.fast_cpu import accelerated

    config = dataclasses.replace(tiny_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    plain, fast = BertModel(config).train(), BertModel(config).train()
    fast.load_state_dict(plain.state_dict())
    batch = random_batch(config)
    plain(*batch).pooler_output.sum().backward()
    with accelerated(fast):
        fast(*batch).pooler_output.sum().backward()
    for (name, mine), theirs in zip(fast.named_parameters(), plain.parameters()):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-6), name
    assert type(fast.encoder.layers[0].feed_forward.up) is torch.nn.Linear  # plain again after the block
