"""Encoder mechanics on tiny configs: shapes, both attention paths, padding, initialisation, input errors."""

import pytest
import torch

from bertforge import BertConfig, BertforgeError, BertModel
from bertforge.model import FeedForward, SelfAttention, dropout


def test_output_shapes(tiny_config, random_batch):
    model = BertModel(tiny_config).eval()
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=3, seq_len=11)
    out = model(input_ids, attention_mask, token_type_ids, output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (3, 11, 32)
    assert out.pooler_output.shape == (3, 32)
    assert len(out.hidden_states) == tiny_config.num_hidden_layers + 1
    assert all(h.shape == (3, 11, 32) for h in out.hidden_states)
    assert len(out.attentions) == 2 and all(a.shape == (3, 4, 11, 11) for a in out.attentions)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)


def test_optional_outputs_are_off_by_default(tiny_config):
    out = BertModel(tiny_config).eval()(torch.tensor([[5, 6, 7]]))
    assert out.hidden_states is None and out.attentions is None


def test_sdpa_and_explicit_attention_agree(tiny_config, random_batch):
    model = BertModel(tiny_config).eval()
    batch = random_batch(tiny_config, batch_size=4, seq_len=13)
    fast = model(*batch)
    explicit = model(*batch, output_attentions=True)
    assert torch.allclose(fast.last_hidden_state, explicit.last_hidden_state, atol=1e-6)


def test_attention_weights_are_distributions_that_ignore_padding(tiny_config, random_batch):
    model = BertModel(tiny_config).eval()
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config)
    probs = model(input_ids, attention_mask, token_type_ids, output_attentions=True).attentions[0]
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-6)
    padded_keys = attention_mask[:, None, None, :].expand_as(probs) == 0
    assert probs[padded_keys].abs().max() == 0


def test_padding_does_not_change_real_tokens(tiny_config, random_batch):
    model = BertModel(tiny_config).eval()
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config, batch_size=3, seq_len=12)
    batched = model(input_ids, attention_mask, token_type_ids).last_hidden_state
    for row in range(3):
        length = int(attention_mask[row].sum())
        alone = model(input_ids[row:row + 1, :length], token_type_ids=token_type_ids[row:row + 1, :length])
        assert torch.allclose(batched[row, :length], alone.last_hidden_state[0], atol=1e-5)
        assert not batched[row, length:].any()  # padding positions are zeros, not garbage


def test_gradients_flow_through_the_unpadded_path(tiny_config, random_batch):
    model = BertModel(tiny_config).train()
    input_ids, attention_mask, token_type_ids = random_batch(tiny_config)
    model(input_ids, attention_mask, token_type_ids).pooler_output.sum().backward()
    assert all(p.grad is not None for name, p in model.named_parameters() if "segments" not in name)
    assert model.embeddings.tokens.weight.grad[tiny_config.pad_token_id].abs().max() == 0


def test_dropout_is_active_in_training_only(tiny_config):
    model = BertModel(tiny_config)
    input_ids = torch.tensor([[5, 6, 7, 8]])
    model.train()
    assert not torch.equal(model(input_ids).last_hidden_state, model(input_ids).last_hidden_state)
    model.eval()
    assert torch.equal(model(input_ids).last_hidden_state, model(input_ids).last_hidden_state)


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


def test_bert_initialisation():
    torch.manual_seed(0)
    config = BertConfig.mini()
    model = BertModel(config)
    weight = model.encoder.layers[0].feed_forward.up.weight
    assert abs(weight.std().item() - config.initializer_range) < 1e-3
    assert abs(weight.mean().item()) < 1e-3
    assert model.encoder.layers[0].attention.query.bias.abs().max() == 0
    assert torch.equal(model.embeddings.norm.weight, torch.ones(config.hidden_size))
    assert torch.equal(model.encoder.layers[1].output_norm.bias, torch.zeros(config.hidden_size))
    assert model.embeddings.tokens.weight[config.pad_token_id].abs().max() == 0


def test_leaf_modules_stand_alone():
    attention_input = torch.randn(2, 5, 16)
    assert FeedForward(16, 64)(attention_input).shape == (2, 5, 16)
    assert SelfAttention(16, 4, 0.0).split_heads(attention_input).shape == (2, 4, 5, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"input_ids": torch.zeros(5, dtype=torch.long)}, r"input_ids must be \(batch, seq\)"),
    ({"input_ids": torch.zeros(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 4)},
     r"attention_mask has shape \(2, 4\), input_ids has \(2, 5\)"),
    ({"input_ids": torch.zeros(1, 65, dtype=torch.long)}, r"sequence length 65 exceeds max_position_embeddings"),
])
def test_input_errors_are_clear(tiny_config, kwargs, message):
    with pytest.raises(BertforgeError, match=message):
        BertModel(tiny_config)(**kwargs)
