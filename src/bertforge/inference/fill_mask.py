"""Fill-mask: the likeliest tokens for each [MASK] of a text, from a masked-LM checkpoint (transformers'
fill-mask pipeline)."""

from __future__ import annotations

import torch

from bertforge.errors import InputError
from bertforge.validation import readable_length


def fill_mask(model, tokenizer, text: str, top_k: int = 5, max_length: int | None = None
              ) -> list[list[tuple[str, float]]]:
    """For each [MASK] of `text`, in order, the `top_k` likeliest tokens and their probabilities.

    Each mask is predicted on its own (the others stay masked), as transformers' fill-mask pipeline does:
    fill_mask(model, tokenizer, "Paris is the [MASK] of France.") -> [[("capital", 0.99), ...]]. A text longer
    than the model reads is refused, unless `max_length` says where to cut it (the masks it keeps are filled).
    """
    encoding = tokenizer(text, truncation=max_length is not None, max_length=max_length, return_tensors="pt")
    input_ids = encoding["input_ids"]
    limit = readable_length(model, tokenizer)
    if input_ids.shape[1] > limit:  # cut, it could lose its [MASK] or the words that decide it
        raise InputError(f"the text is {input_ids.shape[1]} tokens long; the model reads at most {limit}: shorten "
                         f"it around its [MASK] (in Python, the fill-mask pipeline's "
                         f"tokenizer_kwargs={{'truncation': True}} cuts it there)")
    masks = mask_positions(tokenizer, input_ids[0].tolist())
    place = next(model.parameters()).device  # the inputs go where the model is
    with torch.inference_mode():
        logits = model(input_ids.to(place), encoding["attention_mask"].to(place),
                       encoding["token_type_ids"].to(place)).logits
    return top_tokens(logits[0, masks].float().softmax(-1).cpu(), tokenizer, top_k)


def mask_positions(tokenizer, ids: list[int], what: str = "the text") -> list[int]:
    """Where the [MASK] tokens of a row of token ids are; none is a one-line error naming `what`."""
    masks = [position for position, token_id in enumerate(ids) if token_id == tokenizer.mask_token_id]
    if not masks:
        raise InputError(f"{what} has no {tokenizer.vocab.special_tokens['mask_token']} token to fill in")
    return masks


def top_tokens(probabilities: torch.Tensor, tokenizer, top_k: int) -> list[list[tuple[str, float]]]:
    """Per mask, its `top_k` likeliest tokens and their probabilities, of (masks, vocab) probabilities."""
    top = probabilities.topk(min(top_k, probabilities.shape[-1]), dim=-1)
    return [[(tokenizer.convert_ids_to_tokens(i), p) for i, p in zip(ids.tolist(), values.tolist())]
            for ids, values in zip(top.indices, top.values)]


def load_masked_lm(name_or_path: str, inference=None):
    """A masked-LM checkpoint and its tokenizer, ready to fill masks. A checkpoint without a masked-LM head (a
    sentence encoder such as the default all-MiniLM-L6-v2) is an error, not a random head that predicts noise."""
    from bertforge.inference.optimize import AS_TRAINED
    from bertforge.pretraining.heads import BertForMaskedLM
    from bertforge.tokenizer import BertTokenizer

    model = (inference or AS_TRAINED).apply(BertForMaskedLM.from_pretrained(name_or_path, require_heads=True))
    return model, BertTokenizer.from_pretrained(name_or_path)
