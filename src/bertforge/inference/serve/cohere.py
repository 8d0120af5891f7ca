"""Cohere's rerank API (/v1/rerank, /v2/rerank), which Cohere's clients send and Jina's and vLLM's rerank clients
send too: the routes are in app.py, these are the conversions between its documents and bertforge's texts."""

from __future__ import annotations

from bertforge.errors import InputError

DEFAULT_FIELD = "text"  # what an object document is read by when no rank_fields are named


def document_text(document: str | dict[str, str], rank_fields: list[str] | None, index: int) -> str:
    """The text a document is ranked by: a text itself; an object's "text", or its rank_fields as "field: value"
    lines in the order named (the structured form Cohere's documentation gives for them)."""
    if isinstance(document, str):
        return document
    fields = rank_fields or [DEFAULT_FIELD]
    missing = [field for field in fields if field not in document]
    if missing:
        hint = "" if rank_fields else "; name the fields to rank by with rank_fields"
        raise InputError(f"documents.{index} has no field {missing[0]!r}{hint}")
    if rank_fields is None:
        return document[DEFAULT_FIELD]
    return "\n".join(f"{field}: {document[field]}" for field in fields)


def returned_document(document: str | dict[str, str]) -> dict[str, str]:
    """A document as Cohere returns it with return_documents: a text as {"text": ...}, an object as sent."""
    return {DEFAULT_FIELD: document} if isinstance(document, str) else document
