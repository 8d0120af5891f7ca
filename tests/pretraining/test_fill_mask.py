"""`bertforge fill-mask`: the same top-k tokens and probabilities as transformers' fill-mask pipeline, and a
one-line error for a checkpoint without a masked-LM head."""

import json

import pytest
import torch

from bertforge import BertConfig, BertTokenizer
from bertforge.pretraining import BertForMaskedLM

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def masked_lm_dir(tmp_path_factory, minilm_dir):
    """A tiny random masked LM over the real vocabulary, with a peaked output bias so the ranking is clear."""
    directory = tmp_path_factory.mktemp("masked_lm")
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.tiny(vocab_size=30522, hidden_size=32, num_attention_heads=2,
                                            intermediate_size=64))
    with torch.no_grad():
        model.masked_lm.bias.normal_(0, 3)
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(directory)
    return directory


def test_fill_mask_matches_the_transformers_pipeline(run_cli, masked_lm_dir):
    text = "Paris is the [MASK] of France."
    code, out, _ = run_cli("fill-mask", text, "--model", str(masked_lm_dir), "--top-k", "4", "--json")
    assert code == 0
    (ours,) = json.loads(out)
    pipeline = transformers.pipeline("fill-mask", model=str(masked_lm_dir), top_k=4, device="cpu")
    theirs = pipeline(text)
    for mine, reference in zip(ours, theirs, strict=True):  # transformers' keys, and its values
        assert {key: mine[key] for key in ("token", "token_str", "sequence")} == \
            {key: reference[key] for key in ("token", "token_str", "sequence")}
        assert abs(mine["score"] - reference["score"]) < 1e-5

    code, out, _ = run_cli("fill-mask", "[MASK] is the capital of [MASK].", "--model", str(masked_lm_dir),
                           "--top-k", "2")
    assert code == 0 and out.count("[MASK] ") == 2 and len(out.splitlines()) == 6


def test_fill_mask_errors_are_one_line(run_cli, masked_lm_dir, minilm_dir):
    code, _, err = run_cli("fill-mask", "Paris is the [MASK] of France.", "--model", str(minilm_dir))
    assert code == 1 and err.count("\n") == 1
    assert "no trained weights for BertForMaskedLM's head (cls.predictions)" in err
    code, _, err = run_cli("fill-mask", "No mask here.", "--model", str(masked_lm_dir))
    assert code == 1 and err.count("\n") == 1 and "no [MASK] token" in err


def test_a_text_longer_than_the_model_reads_is_refused_not_cut(run_cli, masked_lm_dir):
    """Cut, it would lose a late [MASK] (then "no [MASK]" would be said of a text that has one) or the words that
    decide an early one; transformers' pipeline refuses it too."""
    code, _, err = run_cli("fill-mask", "word " * 600 + "[MASK]", "--model", str(masked_lm_dir))
    assert code == 1 and err.count("\n") == 1 and "the text is 603 tokens long; the model reads at most 512" in err
