"""Cohere's rerank API (/v1/rerank, /v2/rerank), which Cohere's clients send and Jina's and vLLM's rerank clients
send too, and its embed API (/v1/embed, /v2/embed): the routes are in routes/, these are the conversions between its
documents and embedding types and bertforge's texts and vectors (Jina's embedding types are the same)."""

from __future__ import annotations

import base64

import numpy as np
import torch

from bertforge.errors import InputError
from bertforge.inference.embedding_precision import quantize_embeddings

# Cohere's truncate -> (cut a text over the model's length, from which side); NONE answers 413
TRUNCATION = {"END": (True, "right"), "START": (True, "left"), "NONE": (False, "right")}

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


def typed_embeddings(vectors: torch.Tensor, embedding_type: str, dtype: str = "float32", endianness: str = "little"
                     ) -> list:
    """Unit vectors (texts, dim) as Cohere's embedding type gives them: floats, base64 of little-endian float32
    (or of vLLM's embed_dtype and endianness), or packed sign bits (binary shifted to -128..127, ubinary 0..255, as
    sentence-transformers packs them)."""
    if embedding_type == "float":
        return vectors.tolist()
    if embedding_type == "base64":
        return [base64_values(vector, dtype, endianness) for vector in vectors]
    check_embedding_types([embedding_type])
    return quantize_embeddings(np.asarray(vectors.to(torch.float32).numpy()), embedding_type).tolist()


def base64_values(values: torch.Tensor, dtype: str = "float32", endianness: str = "little") -> str:
    """A vector (or a text's token vectors, one after the other) as base64 of its little-endian float32 values, as
    OpenAI's, Jina's and Cohere's base64 encodings give them; or of vLLM's `embed_dtype` (float16, bfloat16) in
    its `endianness` (little, big, or native: this machine's)."""
    order = {"little": "<", "big": ">", "native": "="}[endianness]
    if dtype == "bfloat16":  # numpy has no bfloat16: its 16 bits, as integers
        raw = values.to(torch.bfloat16).view(torch.int16).numpy().astype(order + "i2")
    else:
        raw = values.to(torch.float32).numpy().astype(order + {"float32": "f4", "float16": "f2"}[dtype])
    return base64.b64encode(raw.tobytes()).decode()


def check_embedding_types(kinds: list[str]) -> None:
    """int8 and uint8 are refused: their steps need calibration ranges (per dimension), which a server has no data
    to set; binary and ubinary need none."""
    refused = [kind for kind in kinds if kind in ("int8", "uint8")]
    if refused:
        raise InputError(f"embedding_types {refused[0]}: int8 and uint8 need calibration ranges, which this server "
                         f"does not have; ask for float, base64, binary or ubinary")
