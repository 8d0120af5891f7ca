"""Encoder mechanics on tiny configs: shapes, both attention paths, padding, initialisation, input errors."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertConfig, BertforgeError, BertModel
from bertforge import model as model_module
from bertforge.activations import ACTIVATIONS, ONEDNN_POST_OPS
from bertforge.model import FeedForward, Linear, Padding, SelfAttention, dropout, group_by_length


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


@pytest.mark.parametrize("explicit_up_to", [0, 64])  # SDPA for every block; the explicit path for short ones
def test_sdpa_and_explicit_attention_agree(tiny_config, random_batch, monkeypatch, explicit_up_to):
    monkeypatch.setattr(model_module, "EXPLICIT_ATTENTION_MAX_SEQ", explicit_up_to)
    model = BertModel(tiny_config).eval()
    batch = random_batch(tiny_config, batch_size=4, seq_len=13)
    fast = model(*batch)
    explicit = model(*batch, output_attentions=True)  # the weights always come from the explicit path
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


@pytest.mark.parametrize("seed", range(5))
def test_length_groups_cover_every_sequence_once_longest_first(seed):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 300, (int(torch.randint(1, 80, (1,), generator=generator)),), generator=generator)
    lengths = lengths.tolist()
    blocks = group_by_length(lengths)
    members = [i for block in blocks for i in block]
    assert sorted(members) == [i for i, length in enumerate(lengths) if length > 0]  # empty sequences left out
    longest = [max(lengths[i] for i in block) for block in blocks]
    assert longest == sorted(longest, reverse=True)
    for earlier, later in zip(blocks, blocks[1:]):
        assert min(lengths[i] for i in earlier) > max(lengths[i] for i in later)  # equal lengths share a block


def test_very_different_lengths_attend_in_separate_blocks():
    assert len(group_by_length([500, 8, 8, 8])) == 2
    assert len(group_by_length([20, 19, 18, 17])) == 1


def test_attention_blocks_round_trip_and_mask_only_padding():
    lengths = torch.tensor([300, 7, 0, 5, 290, 60, 60])
    mask = (torch.arange(300)[None, :] < lengths[:, None]).long()
    mask[5] = mask[5].flip(0)  # left padding: real tokens need not start a row
    padding = Padding(mask, torch.float32)
    # Each token, as the batch holds it, is (its sequence, its order in the sequence).
    positions = torch.stack([torch.arange(7)[:, None].expand(7, 300), mask.cumsum(1) - 1], -1).float()
    tokens = padding.remove(positions)
    assert torch.equal(padding.restore(tokens)[mask.bool()], positions[mask.bool()])
    assert len(padding.blocks) > 1
    seen, rows = [], []
    for block in padding.blocks:
        rectangle = block.gather(tokens)  # (batch, seq, 2)
        rows.append(rectangle.reshape(-1, 2))
        real_keys = torch.ones(block.batch, block.seq, dtype=torch.bool) if block.bias is None else \
            block.bias[:, 0, 0, :] == 0
        for row, real in zip(rectangle, real_keys):
            sequence = int(row[0, 0])
            assert torch.equal(row[:, 0], torch.full((block.seq,), float(sequence)))  # padding repeats its own
            assert torch.equal(row[real, 1], torch.arange(int(lengths[sequence])).float())  # tokens fill the start
            assert real.sum() == lengths[sequence]
            seen.append(sequence)
        assert real_keys.sum(1).max() == block.seq  # each block is as long as its longest sequence
    assert sorted(seen) == [0, 1, 3, 4, 5, 6]  # the empty sequence attends nowhere
    assert torch.equal(padding.from_blocks(rows), tokens)
    equal_lengths = next(block for block in padding.blocks if block.seq == 60)
    assert equal_lengths.fill is None and equal_lengths.bias is None  # attends on its tokens as they are


def test_a_batch_without_real_tokens_is_computed_whole(tiny_config):
    model = BertModel(tiny_config).eval()
    out = model(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long), output_attentions=True)
    assert out.last_hidden_state.shape == (2, 5, 32) and out.last_hidden_state.isfinite().all()
    assert torch.allclose(out.attentions[0], torch.full((2, 4, 5, 5), 0.2))


def test_any_mask_layout_gives_the_outputs_of_each_sequence_alone(tiny_config):
    model = BertModel(tiny_config).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, tiny_config.vocab_size, (4, 40), generator=generator)
    mask = torch.zeros(4, 40, dtype=torch.long)
    mask[0, :40] = 1
    mask[1, 30:] = 1  # left padded
    mask[2, :3] = 1
    mask[3, 5:25] = 1  # padding on both sides
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    grouped = model(input_ids, mask, position_ids=position_ids, output_hidden_states=True)
    for row in range(4):
        real = mask[row].bool()
        alone = model(input_ids[row:row + 1, real])
        assert torch.allclose(grouped.last_hidden_state[row, real], alone.last_hidden_state[0], atol=1e-5)
    in_place = model(input_ids, mask, position_ids=position_ids, output_hidden_states=True, output_attentions=True)
    for ours, positions_kept in zip(grouped.hidden_states, in_place.hidden_states):
        assert torch.allclose(ours, positions_kept, atol=1e-5)


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


def test_every_activation_has_its_onednn_post_op():
    assert set(ONEDNN_POST_OPS) == set(ACTIVATIONS)  # every activation a checkpoint may name


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
