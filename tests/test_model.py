"""Encoder mechanics on tiny configs: shapes, both attention paths, padding, initialisation, input errors."""

import threading
import types

import pytest
import torch

from bertforge import BertConfig, BertforgeError, BertForTokenClassification, BertModel, attention_kernels
from bertforge.model import FeedForward, SelfAttention
from bertforge.packing import documents_by_position


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
    monkeypatch.setattr(attention_kernels, "EXPLICIT_ATTENTION_MAX_SEQ", explicit_up_to)
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


def test_a_batch_without_real_tokens_is_computed_whole(tiny_config):
    model = BertModel(tiny_config).eval()
    out = model(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long), output_attentions=True)
    assert out.last_hidden_state.shape == (2, 5, 32) and out.last_hidden_state.isfinite().all()
    assert torch.allclose(out.attentions[0], torch.full((2, 4, 5, 5), 0.2))


@pytest.mark.parametrize("first_real", [False, True])  # rows that start with padding: computed whole; else packed
def test_any_mask_layout_gives_the_outputs_of_each_sequence_alone(tiny_config, first_real):
    model = BertModel(tiny_config).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, tiny_config.vocab_size, (4, 40), generator=generator)
    mask = torch.zeros(4, 40, dtype=torch.long)
    mask[0, :40] = 1
    mask[1, 30:] = 1  # left padded
    mask[2, :3] = 1
    mask[3, 5:25] = 1  # padding on both sides
    mask[:, 0] |= first_real  # with a real first position, padding in the middle of a row
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    grouped = model(input_ids, mask, position_ids=position_ids, output_hidden_states=True)
    for row in range(4):
        real = mask[row].bool()
        alone = model(input_ids[row:row + 1, real])
        assert torch.allclose(grouped.last_hidden_state[row, real], alone.last_hidden_state[0], atol=1e-5)
    in_place = model(input_ids, mask, position_ids=position_ids, output_hidden_states=True, output_attentions=True)
    for ours, positions_kept in zip(grouped.hidden_states, in_place.hidden_states):
        assert torch.allclose(ours, positions_kept, atol=1e-5)


def test_a_row_that_starts_with_padding_is_computed_as_every_query_sees_the_real_keys(tiny_config):
    """Left padding, a masked first position, a row without a real token: every position is computed, as the same
    keys given per query and key compute it (transformers' reading; the pooler reads the first position), with
    first_token_only too."""
    model = BertModel(tiny_config).eval()
    input_ids = torch.randint(1, tiny_config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padded
    mask[1, 0] = 0
    mask[2] = 0
    expected = model(input_ids, mask.bool()[:, None, :].expand(3, 9, 9))  # each query sees its row's real keys
    ours = model(input_ids, mask)
    first = model(input_ids, mask, first_token_only=True)
    assert torch.allclose(ours.last_hidden_state, expected.last_hidden_state, atol=1e-6)
    assert torch.allclose(first.last_hidden_state[:, 0], expected.last_hidden_state[:, 0], atol=1e-6)
    for output in (ours, first):
        assert torch.allclose(output.pooler_output, expected.pooler_output, atol=1e-6)


def test_positions_that_do_not_count_on_start_a_new_document():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [3, 4, 5, 6, 7, 8], [0, 1, 5, 6, 6, 7]])
    documents = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 2, 2]])
    assert torch.equal(documents_by_position(positions), documents[:, :, None] == documents[:, None, :])
    assert documents_by_position(positions[1:2]) is None  # one document a row: nothing to mask
    assert documents_by_position(positions[1:2], always=True).all()


def test_documents_told_apart_by_positions_alone_attend_to_themselves(tiny_config):
    """Without an attention_mask, each run of positions counting on from the one before is a document of its own;
    a traced graph (recorded on one document) tells them apart too."""
    model = BertModel(tiny_config).eval()
    input_ids = torch.randint(1, tiny_config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    packed = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2]])
    alone = torch.cat([model(input_ids[:, start:stop]).last_hidden_state for start, stop in ((0, 4), (4, 6), (6, 9))],
                      dim=1)
    assert torch.allclose(model(input_ids, position_ids=packed).last_hidden_state, alone, atol=1e-6)
    with_mask = model(input_ids, torch.ones_like(input_ids), position_ids=packed).last_hidden_state
    assert not torch.allclose(with_mask, alone, atol=1e-3)  # a mask given says nothing of documents
    one_document = torch.arange(9)[None]
    traced = torch.jit.trace(model, example_kwarg_inputs={"input_ids": input_ids, "position_ids": one_document})
    for positions in (packed, one_document):
        eager = model(input_ids, position_ids=positions).last_hidden_state
        assert torch.allclose(traced(input_ids=input_ids, position_ids=positions)[0], eager, atol=1e-6)


def test_the_pooler_is_left_out_by_either_name(tiny_config):
    """transformers' add_pooling_layer=False, bertforge's add_pooler=False, or by position as in either."""
    assert BertModel(tiny_config).pooler is not None
    assert BertModel(tiny_config, add_pooling_layer=True).pooler is not None
    for model in (BertModel(tiny_config, add_pooling_layer=False), BertModel(tiny_config, add_pooler=False),
                  BertModel(tiny_config, False)):
        assert model.pooler is None and model(torch.tensor([[5, 6, 7]])).pooler_output is None
    assert BertForTokenClassification(tiny_config).bert.pooler is None  # a head that reads every token


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


def test_gpu_attention_kernels_stay_chosen_while_another_thread_attends_and_are_put_back_after():
    """torch's SDPA backends are one setting of the process: a thread whose GPU attention ends while another
    thread's runs must not turn cuDNN's kernel (a plan for every new shape) back on under it, and the last one out
    puts back what was there before. Deterministic (the threads step in turn); on CPU: only q.is_cuda is read."""
    on_gpu = types.SimpleNamespace(is_cuda=True)
    before = torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()
    other_in, first_out, seen = threading.Event(), threading.Event(), {}

    def attend_meanwhile():
        with attention_kernels.fused_kernels(on_gpu):
            other_in.set()
            first_out.wait(timeout=60)
            seen["cuDNN, flash"] = torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()

    other = threading.Thread(target=attend_meanwhile)
    with attention_kernels.fused_kernels(on_gpu):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        other.start()
        assert other_in.wait(timeout=60)
    first_out.set()
    other.join()
    assert seen["cuDNN, flash"] == (False, True)  # still the choice, for the thread still attending
    assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before
