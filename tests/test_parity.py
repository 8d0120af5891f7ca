"""The real MiniLM checkpoint against transformers.BertModel: same inputs, every output within 1e-5."""

import pytest
import torch

from bertforge import attention_kernels

TOLERANCE = 1e-5


def max_difference(ours, reference, rows):
    return (ours[rows] - reference[rows]).abs().max().item()


def test_every_output_matches_the_reference(minilm, hf_minilm, tokenizer, real_sentences):
    batch = tokenizer(real_sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < 20 and lengths.max() > 150, "the batch should mix short and long sequences"
    real = batch["attention_mask"].bool()
    with torch.inference_mode():
        ours = minilm(**batch, output_hidden_states=True, output_attentions=True)
        reference = hf_minilm(**batch, output_hidden_states=True, output_attentions=True)

    assert len(ours.hidden_states) == len(reference.hidden_states) == 7
    for layer, (mine, theirs) in enumerate(zip(ours.hidden_states, reference.hidden_states)):
        assert max_difference(mine, theirs, real) < TOLERANCE, f"hidden state {layer}"
    assert max_difference(ours.last_hidden_state, reference.last_hidden_state, real) < TOLERANCE
    assert (ours.pooler_output - reference.pooler_output).abs().max() < TOLERANCE
    for layer, (mine, theirs) in enumerate(zip(ours.attentions, reference.attentions)):
        # Rows of padding queries are meaningless (bertforge does not compute them); compare real queries.
        query_rows = real[:, None, :].expand(mine.shape[:3])
        assert max_difference(mine, theirs, query_rows) < TOLERANCE, f"attention weights of layer {layer}"


@pytest.mark.parametrize("explicit_up_to", [0, 64, 512])  # all SDPA, by length (the default), all explicit
def test_sdpa_and_explicit_paths_agree_on_real_weights(minilm, tokenizer, real_sentences, monkeypatch,
                                                       explicit_up_to):
    monkeypatch.setattr(attention_kernels, "EXPLICIT_ATTENTION_MAX_SEQ", explicit_up_to)
    batch = tokenizer(real_sentences, padding=True, return_tensors="pt")
    with torch.inference_mode():
        fast = minilm(**batch, output_hidden_states=True)
        explicit = minilm(**batch, output_hidden_states=True, output_attentions=True)
    for mine, theirs in zip(fast.hidden_states, explicit.hidden_states):
        # The same sums in another order (SDPA's kernel splits them by the CPU's vector width): float32 rounding of
        # the largest values, ~10 in MiniLM's states, so relative to them (measured: 1e-6 of it, an AMX Xeon).
        assert (mine - theirs).abs().max() < 2e-6 * theirs.abs().max().clamp(min=1)
    assert (fast.pooler_output - explicit.pooler_output).abs().max() < TOLERANCE


def test_padding_does_not_change_real_token_outputs(minilm, tokenizer, real_sentences):
    batch = tokenizer(real_sentences, padding="max_length", max_length=512, return_tensors="pt")
    with torch.inference_mode():
        padded = minilm(**batch)
        for row, text in enumerate(real_sentences):
            alone = minilm(**tokenizer(text, return_tensors="pt"))
            length = alone.last_hidden_state.shape[1]
            assert (padded.last_hidden_state[row, :length] - alone.last_hidden_state[0]).abs().max() < TOLERANCE
            assert (padded.pooler_output[row] - alone.pooler_output[0]).abs().max() < TOLERANCE


@pytest.mark.parametrize("explicit_up_to", [0, 64])  # SDPA for every length; by length (the default)
def test_first_token_only_matches_the_reference(minilm, hf_minilm, tokenizer, real_sentences, monkeypatch,
                                                explicit_up_to):
    """The last layer run for [CLS] alone (what a sequence classifier reads) gives the reference's [CLS] vector and
    pooled output, over a batch of short and long texts that attends in several blocks."""
    monkeypatch.setattr(attention_kernels, "EXPLICIT_ATTENTION_MAX_SEQ", explicit_up_to)
    texts = real_sentences + [real_sentences[0]]  # two equal lengths: a block without padding
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    asked = []  # the last layer's query rows: one per text
    hook = minilm.encoder.layers[-1].attention.query.register_forward_hook(
        lambda module, inputs, output: asked.append(inputs[0].shape[0]))
    with torch.inference_mode():
        ours = minilm(**batch, first_token_only=True)
        reference = hf_minilm(**batch)
    hook.remove()
    assert asked == [len(texts)]
    assert ours.last_hidden_state.shape == (len(texts), 1, minilm.config.hidden_size)
    assert (ours.last_hidden_state[:, 0] - reference.last_hidden_state[:, 0]).abs().max() < TOLERANCE
    assert (ours.pooler_output - reference.pooler_output).abs().max() < TOLERANCE


def test_a_row_that_starts_with_padding_reads_as_in_the_reference(minilm, hf_minilm, tokenizer, real_sentences):
    """transformers computes every position, padding too, and its pooler reads the first: where that is padding (left
    padding; a mask with 0 at the first position, as in transformers' integration test; a row without a real token)
    bertforge gives the same vectors at every position, and the same first position with first_token_only."""
    encode = dict(padding=True, truncation=True, max_length=128, return_tensors="pt")
    left = tokenizer(real_sentences, padding_side="left", **encode)
    masked = tokenizer(real_sentences, **encode)
    masked["attention_mask"][0, 0] = 0  # the first position ([CLS]) masked out
    masked["attention_mask"][1] = 0  # no real token: every key masked, a uniform softmax as transformers' eager
    # attention gives (its SDPA attention, torch's kernel, gives such a query no context at all instead)
    for batch in (left, masked):
        assert not batch["attention_mask"][:, 0].all()
        with torch.inference_mode():
            ours = minilm(**batch)
            first = minilm(**batch, first_token_only=True)
            reference = hf_minilm(**batch)
        read = batch["attention_mask"].bool()
        read[:, 0] = True  # the real tokens, and the first position that the pooler reads
        assert max_difference(ours.last_hidden_state, reference.last_hidden_state, read) < TOLERANCE
        # Padding queries at the end of a short row (among many masked keys) round differently in SDPA's kernel:
        # up to 6e-5 from the reference's eager attention, as the reference's own SDPA attention is too.
        assert (ours.last_hidden_state - reference.last_hidden_state).abs().max() < 1e-4
        assert (ours.pooler_output - reference.pooler_output).abs().max() < TOLERANCE
        assert (first.last_hidden_state[:, 0] - reference.last_hidden_state[:, 0]).abs().max() < TOLERANCE
        assert (first.pooler_output - reference.pooler_output).abs().max() < TOLERANCE


def test_first_token_only_is_ignored_when_every_layer_is_asked_for(minilm, tokenizer, real_sentences):
    batch = tokenizer(real_sentences[:3], padding=True, return_tensors="pt")
    with torch.inference_mode():
        with_states = minilm(**batch, first_token_only=True, output_hidden_states=True)
    assert with_states.last_hidden_state.shape == batch["input_ids"].shape + (minilm.config.hidden_size,)
