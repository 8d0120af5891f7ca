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

