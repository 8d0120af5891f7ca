"""from_pretrained(dtype=...) as transformers has it (and its older name torch_dtype): the parameters in that dtype,
"auto" for the checkpoint's own, a bad name refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertModel, BertTokenizer
from bertforge.errors import BertforgeError


def test_dtype_and_torch_dtype_and_auto(minilm_dir, tmp_path, sst2_dev):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    batch = dict(tokenizer([text for text, _ in sst2_dev[:16]], padding=True, return_tensors="pt"))
    full = BertModel.from_pretrained(minilm_dir)
    for options in ({"dtype": torch.bfloat16}, {"torch_dtype": torch.bfloat16}, {"dtype": "bfloat16"}):
        model = BertModel.from_pretrained(minilm_dir, **options)
        assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
        with torch.inference_mode():
            real = batch["attention_mask"].bool()
            got = model(**batch).last_hidden_state[real].float()
            expected = full(**batch).last_hidden_state[real]
        assert F.cosine_similarity(got, expected, dim=-1).min() > 0.99
    assert next(BertModel.from_pretrained(minilm_dir, dtype="auto").parameters()).dtype == torch.float32
    BertModel.from_pretrained(minilm_dir, dtype=torch.bfloat16).save_pretrained(tmp_path)
    assert next(BertModel.from_pretrained(tmp_path, dtype="auto").parameters()).dtype == torch.bfloat16
    assert next(BertModel.from_pretrained(tmp_path).parameters()).dtype == torch.float32  # the default, as before
    with pytest.raises(BertforgeError, match="dtype must be a floating-point torch dtype or 'auto', got 'int8'"):
        BertModel.from_pretrained(minilm_dir, dtype="int8")


def test_a_default_dtype_set_by_the_user_does_not_change_what_loads(minilm_dir):
    """After torch.set_default_dtype(torch.float64) transformers still loads float32, as the README says bertforge
    does; bertforge loaded float64. dtype= still chooses."""
    transformers = pytest.importorskip("transformers")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs = transformers.BertModel.from_pretrained(minilm_dir)
        ours = BertModel.from_pretrained(minilm_dir)
        chosen = BertModel.from_pretrained(minilm_dir, dtype=torch.float64)
    finally:
        torch.set_default_dtype(previous)
    assert {p.dtype for p in ours.parameters()} == {p.dtype for p in theirs.parameters()} == {torch.float32}
    assert {p.dtype for p in chosen.parameters()} == {torch.float64}
