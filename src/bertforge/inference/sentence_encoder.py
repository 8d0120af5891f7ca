"""sentence-transformers' SentenceTransformer interface (encode, similarity, encode_query, ...) over a BERT
checkpoint, for code written against it: each call is extract_features with the checkpoint's own layout (pooling,
max_seq_length, normalisation, prompts)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.inference.features import extract_features, sentence_embedding


class SentenceEncoder:
    """One vector per text, as SentenceTransformer(name).encode(texts) gives it.

    >>> encoder = SentenceEncoder.from_pretrained("default")
    >>> encoder.encode(["A man is eating food.", "A man is riding a horse."]).shape
    (2, 384)
    """

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model.eval(), tokenizer

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = "default", device: str | torch.device | None = None,
                        **model_options: Any) -> SentenceEncoder:
        """The encoder and tokenizer of a model directory (or "default"), on `device` (default: the CPU);
        `model_options` are BertModel.from_pretrained's (dtype, ...)."""
        from bertforge import BertModel, BertTokenizer

        model = BertModel.from_pretrained(name_or_path, **model_options)
        return cls(model.to(device) if device is not None else model, BertTokenizer.from_pretrained(name_or_path))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_seq_length(self) -> int:
        """Tokens a text is cut to, [CLS] and [SEP] included."""
        return sentence_embedding(self.model).max_length or self.tokenizer.model_max_length

    @property
    def prompts(self) -> dict[str, str]:
        return dict(sentence_embedding(self.model).prompts)

    def get_sentence_embedding_dimension(self) -> int:
        return self.model.config.hidden_size

    def encode(self, sentences: str | Sequence[str], batch_size: int = 32, show_progress_bar: bool = False,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False, normalize_embeddings: bool = False,
               prompt_name: str | None = None, prompt: str | None = None) -> np.ndarray | torch.Tensor:
        """(texts, hidden) float32 vectors, or (hidden,) for a single string: a numpy array, a tensor with
        `convert_to_tensor`. `normalize_embeddings` makes them unit length (the checkpoint's Normalize module
        does anyway); `prompt_name` / `prompt` as in extract_features."""
        single = isinstance(sentences, str)
        vectors = extract_features(self.model, self.tokenizer, [sentences] if single else list(sentences),
                                   batch_size=batch_size, normalize=True if normalize_embeddings else None,
                                   progress=show_progress_bar, prompt_name=prompt_name, prompt=prompt).float()
        vectors = vectors[0] if single else vectors
        if convert_to_tensor:
            return vectors
        return vectors.numpy() if convert_to_numpy else list(vectors)

    def encode_query(self, sentences: str | Sequence[str], **options: Any) -> np.ndarray | torch.Tensor:
        """encode with the checkpoint's "query" prompt, if it has one (sentence-transformers 5)."""
        return self.encode(sentences, **self._role_prompt("query", options))

    def encode_document(self, sentences: str | Sequence[str], **options: Any) -> np.ndarray | torch.Tensor:
        """encode with the checkpoint's "document" prompt (or "passage", "corpus"), if it has one."""
        return self.encode(sentences, **self._role_prompt("document", options))

    def _role_prompt(self, role: str, options: dict[str, Any]) -> dict[str, Any]:
        names = {"query": ("query",), "document": ("document", "passage", "corpus")}[role]
        if "prompt_name" not in options and "prompt" not in options:
            options["prompt_name"] = next((name for name in names if name in self.prompts), None)
        return options

    @staticmethod
    def similarity(embeddings_1: Any, embeddings_2: Any) -> torch.Tensor:
        """(n, m) cosine similarities of two sets of vectors (arrays, tensors, or one vector each)."""
        first, second = (torch.as_tensor(np.asarray(e) if not isinstance(e, torch.Tensor) else e).float()
                         for e in (embeddings_1, embeddings_2))
        first, second = (e[None] if e.dim() == 1 else e for e in (first, second))
        return F.normalize(first, dim=-1) @ F.normalize(second, dim=-1).T
