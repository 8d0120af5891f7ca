import pytest
import torch

from bertforge import activations


def test_softmax_is_torchs_for_every_row_length_with_masked_keys_and_gradients(monkeypatch):
    monkeypatch.setattr(activations, "float32_lanes", lambda: 64)  # the whole-tensor passes for every row here
    generator = torch.Generator().manual_seed(0)
    for keys in [1, 2, 7, 8, 9, 15, 16, 17, 33]:
        scores = torch.randn(3, 4, 5, keys, generator=generator) * 30  # large scores: the row maximum matters
        scores[0, :, :, keys // 2:] = torch.finfo(torch.float32).min  # padding keys, as packing.key_bias masks them
        scores[1, 0, 0, :] = torch.finfo(torch.float32).min  # a row of padding only: uniform, as torch gives
        scores.requires_grad_()
        expected_scores = scores.detach().clone().requires_grad_()
        probs, expected = activations.softmax(scores), expected_scores.softmax(dim=-1)
        torch.testing.assert_close(probs, expected, atol=1e-7, rtol=1e-6)
        weights = torch.randn(probs.shape, generator=generator)
        (probs * weights).sum().backward()
        (expected * weights).sum().backward()
        torch.testing.assert_close(scores.grad, expected_scores.grad, atol=1e-6, rtol=1e-5)



def test_every_hidden_act_of_transformers_is_its_function():
    """Each name in the table against transformers' ACT2FN of that name; the only names left out hold weights."""
    transformers_activations = pytest.importorskip("transformers.activations")
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 6
    x[:4] = torch.tensor([0.0, -30.0, 30.0, 1e-3])
    for name, function in activations.ACTIVATIONS.items():
        expected = transformers_activations.ACT2FN[name](x)
        torch.testing.assert_close(function(x), expected, atol=1e-6, rtol=1e-6, msg=name)
    left_out = set(transformers_activations.ACT2CLS) - set(activations.ACTIVATIONS)
    assert left_out <= {"prelu", "xielu"}, left_out
    for name in left_out:
        assert list(transformers_activations.ACT2FN[name].parameters()), name


def test_a_checkpoint_with_any_hidden_act_loads_and_matches(tmp_path):
    """A tiny transformers BertModel per activation, saved and loaded: the same outputs on a padded batch."""
    transformers = pytest.importorskip("transformers")
    from bertforge import BertModel

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 99, (3, 9), generator=generator)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    real = mask.bool()
    for name in activations.ACTIVATIONS:
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=24, hidden_act=name)
        reference = transformers.BertModel(config).eval()
        reference.save_pretrained(tmp_path / name)
        ours = BertModel.from_pretrained(tmp_path / name).eval()
        with torch.no_grad():
            expected, got = reference(ids, attention_mask=mask), ours(ids, attention_mask=mask)
        torch.testing.assert_close(got.last_hidden_state[real], expected.last_hidden_state[real], atol=1e-5,
                                   rtol=1e-5, msg=name)
        torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-5, rtol=1e-5, msg=name)
