"""text-embeddings-inference's request and answer shapes, for the clients that speak them (huggingface_hub's
InferenceClient given the server's URL, LangChain's and LlamaIndex's TEI classes): the routes are in routes/, these
are the conversions between TEI's shapes and bertforge's own."""

from __future__ import annotations

from typing import Any

from bertforge.inference.serve.schemas import TextAndPair


def predict_inputs(inputs: str | list | TextAndPair) -> tuple[bool, list[tuple[str, str | None]]]:
    """TEI's predict `inputs` -> (one input?, its (text, pair or None) items): a text; [text] or [text, pair]; a
    batch of [text] and [text, pair] lists; or three texts or more, which can be no pair: a batch of single texts,
    as TEI reads them (the schema has checked the shapes); or transformers' pipeline's {text, text_pair}, or a list
    of them."""
    if isinstance(inputs, str):
        return True, [(inputs, None)]
    if isinstance(inputs, TextAndPair):  # transformers' pipeline's pair, alone or in a list
        return True, [(inputs.text, inputs.text_pair)]
    if isinstance(inputs[0], TextAndPair):
        return False, [(item.text, item.text_pair) for item in inputs]
    if isinstance(inputs[0], str) and len(inputs) > 2:
        return False, [(text, None) for text in inputs]
    if isinstance(inputs[0], str):
        return True, [(inputs[0], inputs[1] if len(inputs) == 2 else None)]
    return False, [(item[0], item[1] if len(item) == 2 else None) for item in inputs]


def simple_tokens(text: str, row: dict[str, list], tokens: list[str]) -> list[dict[str, Any]]:
    """A tokenized text as TEI lists it: each token's id, its text (the characters it came from; a special token's
    own string), whether it is special, and its start and stop (character offsets here, where TEI counts UTF-8
    bytes: the same for ASCII text, and `text[start:stop]` is the token's text in Python)."""
    answer = []
    for token_id, token, (start, stop), special in zip(row["input_ids"], tokens, row["offset_mapping"],
                                                       row["special_tokens_mask"]):
        if special:
            answer.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
        else:
            answer.append({"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop})
    return answer
