"""The inner workings of a masked-LM model, as the BERT books draw them: what each layer would predict at a [MASK]
(the MLM head applied to every layer's output, a "logit lens"), and how much each token's vector changes from one
layer to the next (the cosine similarity of consecutive layers)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertforge.explain.targets import Row, device_of

TOP_TOKENS = 5


@torch.no_grad()
def masked_lm_views(model, tokenizer, row: Row, top_k: int = TOP_TOKENS) -> dict:
    """{"tokens", "layer_predictions": [{"position", "layers": [[[token, probability] x top_k] per layer]}],
    "layer_similarity": [per token, per layer l >= 1: cos(h_l, h_(l-1))]}; layer 0 is the embeddings' output."""
    input_ids, token_type_ids = row.tensors(device=device_of(model))
    states = model.bert(input_ids, token_type_ids=token_type_ids, output_hidden_states=True).hidden_states
    stacked = torch.stack([state[0] for state in states]).float()  # (layers + 1, seq, hidden)
    predictions = []
    for position, token_id in enumerate(row.input_ids):
        if token_id != tokenizer.mask_token_id:
            continue
        logits = model.masked_lm(stacked[:, position], model.bert.embeddings.tokens.weight)  # (layers + 1, vocab)
        top = logits.float().softmax(-1).topk(top_k)
        predictions.append({"position": position, "layers": [
            [[token, round(probability, 4)] for token, probability in
             zip(tokenizer.convert_ids_to_tokens(ids), probabilities)]
            for ids, probabilities in zip(top.indices.tolist(), top.values.tolist())]})
    similarity = F.cosine_similarity(stacked[1:], stacked[:-1], dim=-1).T.cpu()  # (seq, layers)
    return {"tokens": tokenizer.convert_ids_to_tokens(row.input_ids), "layer_predictions": predictions,
            "layer_similarity": similarity.double().round(decimals=4).tolist()}
