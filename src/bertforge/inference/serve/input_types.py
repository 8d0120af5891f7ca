"""What the hosted embedding APIs call a text (OpenAI-compatible servers' input_type, Cohere's input_type, Jina's
task), as the prompt a sentence-transformers model was trained to read before such a text."""

from __future__ import annotations

from bertforge.inference.text_encoder import role_prompt

# An API's name for a query or a document -> that role, whose prompt encode_query / encode_document put
ROLES = {"query": "query", "document": "document", "search_query": "query", "search_document": "document",
         "retrieval.query": "query", "retrieval.passage": "document"}


def input_prompt(kind: str | None, prompts: dict[str, str]) -> str | None:
    """The prompt before a text of this kind: the model's prompt of that very name (Jina v3's "retrieval.query",
    Cohere's "classification", ...), else its role's prompt as encode_query and encode_document choose it, else
    none."""
    if kind is None:
        return None
    if kind in prompts:
        return prompts[kind]
    return role_prompt(ROLES[kind], prompts) if kind in ROLES else None
