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
    masked_lm = BertForMaskedLM.from_pretrained(minilm_dir)
    masked_lm.resize_token_embeddings(30522 + 3, pad_to_multiple_of=8)  # 30528
    assert masked_lm.masked_lm.bias.shape == (30528,)
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
