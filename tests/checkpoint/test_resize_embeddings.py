"""Tokens added to the tokenizer need rows in the model: resize_token_embeddings as transformers has it, checked
against transformers on the real MiniLM weights, through a masked-LM head, and through save and load."""

from __future__ import annotations

import pytest
import torch

from bertforge import BertModel
from bertforge.errors import BertforgeError
from bertforge.heads import BertForSequenceClassification
from bertforge.pretraining.heads import BertForMaskedLM
from bertforge.tokenizer import BertTokenizer

TEXTS = ["The covid19 numbers rose again, said the minilm6 report.", "A plain sentence without new words."]


def test_new_tokens_start_at_the_mean_and_match_transformers(minilm_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    assert tokenizer.add_tokens(["covid19", "minilm6"]) == 2
    model = BertModel.from_pretrained(minilm_dir)
    old = model.get_input_embeddings().weight.detach().clone()
    table = model.resize_token_embeddings(len(tokenizer))
    assert table is model.get_input_embeddings() and table.weight.shape == (30524, 384)
    assert model.config.vocab_size == 30524
    assert torch.equal(table.weight[:30522], old)
    assert torch.allclose(table.weight[30522:], old.mean(dim=0).expand(2, -1), atol=1e-7)

    # transformers samples its new rows around the same mean with a 1e-9-scaled covariance: equal to ~1e-5.
    reference = transformers.BertModel.from_pretrained(minilm_dir).eval()
    reference.resize_token_embeddings(len(tokenizer))
    encoding = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert (encoding["input_ids"] >= 30522).sum() == 2
    with torch.no_grad():
        got = model(**encoding).last_hidden_state
        expected = reference(**encoding).last_hidden_state
    real = encoding["attention_mask"].bool()
    assert (got - expected)[real].abs().max() < 2e-3


def test_a_masked_lm_head_and_a_classifier_follow_and_save(minilm_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    masked_lm = BertForMaskedLM.from_pretrained(minilm_dir)
    masked_lm.resize_token_embeddings(30522 + 3, pad_to_multiple_of=8)  # 30528
    assert masked_lm.masked_lm.bias.shape == (30528,)
    reference = transformers.BertForMaskedLM.from_pretrained(minilm_dir)
    reference.resize_token_embeddings(30522 + 3, pad_to_multiple_of=8)
    # the tied decoder's bias for the new words: zeros, as transformers pads it
    torch.testing.assert_close(masked_lm.masked_lm.bias.detach(), reference.cls.predictions.bias.detach())
    ids = torch.tensor([[101, 30525, 102]])
    assert masked_lm(ids).logits.shape == (1, 3, 30528)

    classifier = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    classifier.resize_token_embeddings(30530)
    classifier.save_pretrained(tmp_path)
    reloaded = BertForSequenceClassification.from_pretrained(tmp_path)
    assert reloaded.config.vocab_size == 30530
    assert torch.equal(reloaded.get_input_embeddings().weight, classifier.get_input_embeddings().weight)

    shrunk = BertModel.from_pretrained(minilm_dir)
    shrunk.resize_token_embeddings(1000)
    assert shrunk.get_input_embeddings().weight.shape == (1000, 384)
    with pytest.raises(BertforgeError, match="token id 2000 is outside the model.s vocab_size of 1000"):
        shrunk(torch.tensor([[101, 2000, 102]]))  # an id past the table is refused by name
    with pytest.raises(BertforgeError, match="new_num_tokens must be a positive integer"):
        shrunk.resize_token_embeddings(0)


def test_set_input_embeddings_as_transformers_sets_them(minilm_dir):
    """A table of its own in the word embeddings' place (new words' rows included) gives transformers' outputs for the
    same table; a masked-LM head's size is kept by resize_token_embeddings, so a table of another size is refused."""
    transformers = pytest.importorskip("transformers")
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    tokenizer.add_tokens(["covid19", "minilm6"])
    model, reference = BertModel.from_pretrained(minilm_dir), transformers.BertModel.from_pretrained(minilm_dir).eval()
    generator = torch.Generator().manual_seed(0)
    weight = torch.cat([model.get_input_embeddings().weight.detach(), 0.05 * torch.randn(2, 384, generator=generator)])
    for target in (model, reference):
        target.set_input_embeddings(torch.nn.Embedding.from_pretrained(weight.clone(), freeze=False, padding_idx=0))
    assert model.config.vocab_size == 30524 and model.get_input_embeddings().weight.shape == (30524, 384)
    encoding = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        got, expected = model(**encoding).last_hidden_state, reference(**encoding).last_hidden_state
    real = encoding["attention_mask"].bool()
    assert (got - expected)[real].abs().max() < 1e-4
    with pytest.raises(BertforgeError, match=r"resize with resize_token_embeddings\(30524\) first"):
        BertForMaskedLM.from_pretrained(minilm_dir).set_input_embeddings(torch.nn.Embedding(30524, 384))
    with pytest.raises(BertforgeError, match="takes an nn.Embedding of 384 columns"):
        model.set_input_embeddings(torch.nn.Embedding(30524, 128))
    model.set_attn_implementation("eager")
    with pytest.raises(BertforgeError, match="unknown attn_implementation 'fast'"):
        model.set_attn_implementation("fast")


def test_init_weights_draws_a_layer_afresh(minilm_dir):
    """`layer.apply(model._init_weights)`, the re-initialisation of top layers before fine-tuning (transformers 4's
    recipe; transformers 5 leaves loaded weights as they are there): BERT's initialisation, normal weights of std
    initializer_range, zero biases, LayerNorm 1 and 0, in that layer only."""
    ours = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    trained = ours.bert.encoder.layers[5].feed_forward.up.weight.std().item()
    below = ours.bert.encoder.layers[4].feed_forward.up.weight.detach().clone()
    torch.manual_seed(0)
    ours.bert.encoder.layers[5].apply(ours._init_weights)
    drawn = ours.bert.encoder.layers[5].feed_forward.up
    assert abs(trained - 0.02) > 0.02 and abs(drawn.weight.std().item() - ours.config.initializer_range) < 1e-3
    assert abs(drawn.weight.mean().item()) < 1e-3 and not drawn.bias.any()
    norm = ours.bert.encoder.layers[5].output_norm
    assert torch.equal(norm.weight.detach(), torch.ones(384)) and not norm.bias.any()
    assert torch.equal(ours.bert.encoder.layers[4].feed_forward.up.weight, below)


def test_new_rows_drawn_as_new_weights_without_mean_resizing(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir)
    old = model.get_input_embeddings().weight.detach().clone()
    torch.manual_seed(0)
    new_rows = model.resize_token_embeddings(30522 + 2000, mean_resizing=False).weight[30522:].detach()
    assert torch.equal(model.get_input_embeddings().weight[:30522], old)
    # drawn around zero with the initializer's spread (0.02), not at the old rows' mean
    assert new_rows.mean().abs() < 1e-3 and abs(new_rows.std().item() - model.config.initializer_range) < 1e-3
