"""sentence-transformers' SentenceTransformer interface (encode, similarity, encode_query, ...) over a BERT
checkpoint, for code written against it: each call is extract_features with the checkpoint's own layout (pooling,
max_seq_length, normalisation, prompts, similarity function)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.batching import length_sorted_batches
from bertforge.errors import InputError, check_choice
from bertforge.inference.features import embedding_texts, extract_features, sentence_embedding
from bertforge.inference.similarity import SIMILARITIES
from bertforge.tasks.data import forward_rows

# sentence-transformers' embedding precisions: name -> (texts, hidden) float32 -> the quantized array. The integer
# ones scale each dimension's range over the texts encoded together onto 256 steps; the binary ones keep the sign
# bits, eight dimensions to a byte.
PRECISIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "float32": lambda vectors: vectors,
    "int8": lambda vectors: (_steps(vectors) - 128).astype(np.int8),
    "uint8": lambda vectors: _steps(vectors).astype(np.uint8),
    "binary": lambda vectors: (np.packbits(vectors > 0, axis=-1).astype(np.int16) - 128).astype(np.int8),
    "ubinary": lambda vectors: np.packbits(vectors > 0, axis=-1),
}
# sentence-transformers 5 and later give every model these prompts, empty unless its configuration fills them.
ROLE_PROMPTS = {"query": "", "document": ""}


def _steps(vectors: np.ndarray) -> np.ndarray:
    """Each value's step, 0 to 255, in its dimension's range over the texts encoded together."""
    if len(vectors) < 2:
        raise InputError("int8 and uint8 embeddings take their range from the texts encoded together: encode more "
                         "than one text")
    low, high = vectors.min(0), vectors.max(0)
    step = np.where(high > low, (high - low) / 255, 1.0)
    return np.clip(np.floor((vectors - low) / step), 0, 255)


class SentenceEncoder:
    """One vector per text, as SentenceTransformer(name).encode(texts) gives it.

    >>> encoder = SentenceEncoder.from_pretrained("default")
    >>> encoder.encode(["A man is eating food.", "A man is riding a horse."]).shape
    (2, 384)
    """

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model.eval(), tokenizer
        self._max_seq_length: int | None = None
        self._similarity_fn_name: str | None = None

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = "default", device: str | torch.device | None = None,
                        **model_options: Any) -> SentenceEncoder:
        """The encoder and tokenizer of a model directory (or "default"), on `device` (default: the CPU);
        `model_options` are BertModel.from_pretrained's (dtype, ...)."""
        from bertforge import BertModel, BertTokenizer

        model = BertModel.from_pretrained(name_or_path, device_map=device, **model_options)
        return cls(model, BertTokenizer.from_pretrained(name_or_path))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_seq_length(self) -> int:
        """Tokens a text is cut to, [CLS] and [SEP] included; settable, as SentenceTransformer's."""
        return self._max_seq_length or sentence_embedding(self.model).max_length or self.tokenizer.model_max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not \
                3 <= value <= self.model.config.max_position_embeddings:
            raise InputError(f"max_seq_length must be a whole number from 3 to the model's "
                             f"{self.model.config.max_position_embeddings} positions, got {value!r}")
        self._max_seq_length = value

    @property
    def prompts(self) -> dict[str, str]:
        """The checkpoint's prompts, with "query" and "document" (empty) where it has none of those names."""
        return ROLE_PROMPTS | sentence_embedding(self.model).prompts

    @property
    def default_prompt_name(self) -> str | None:
        return sentence_embedding(self.model).default_prompt_name

    @property
    def similarity_fn_name(self) -> str:
        """cosine, dot, euclidean or manhattan: the checkpoint's, unless set; `similarity` compares with it."""
        return self._similarity_fn_name or sentence_embedding(self.model).similarity_fn_name or "cosine"

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str) -> None:
        check_choice(str(getattr(value, "value", value)), SIMILARITIES, "similarity_fn_name", error=InputError)
        self._similarity_fn_name = str(getattr(value, "value", value))  # a name, or sentence-transformers' enum

    def get_sentence_embedding_dimension(self) -> int:
        return self.model.config.hidden_size

    def get_max_seq_length(self) -> int:
        return self.max_seq_length

    def encode(self, sentences: str | Sequence[str] | None = None, prompt_name: str | None = None,
               prompt: str | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
               output_value: str | None = "sentence_embedding", precision: str = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False, device: str | None = None,
               normalize_embeddings: bool = False, truncate_dim: int | None = None, *,
               inputs: str | Sequence[str] | None = None) -> Any:
        """SentenceTransformer.encode: (texts, hidden) float32 vectors, (hidden,) for a single string; a numpy array,
        a tensor with `convert_to_tensor`, a list of tensors with neither. `truncate_dim` keeps the first
        dimensions, `normalize_embeddings` makes them unit length (after truncating), `precision` quantizes them
        (int8, uint8, binary, ubinary). output_value="token_embeddings": per text its tokens' (tokens, hidden)
        last layer, [CLS] and [SEP] included; None: per text a dict of its inputs and both outputs."""
        sentences = inputs if sentences is None else sentences
        if not isinstance(sentences, str) and not (isinstance(sentences, Sequence) and all(
                isinstance(text, str) for text in sentences)):
            raise InputError(f"encode takes a text or a list of texts, got {type(sentences).__name__}"
                             f"{' holding other things' if isinstance(sentences, Sequence) else ''}")
        if output_value is not None:
            check_choice(output_value, ("sentence_embedding", "token_embeddings"), "output_value", error=InputError)
        check_choice(precision, PRECISIONS, "precision", error=InputError)
        if device is not None:
            self.model.to(device)
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        prompt = self._prompt(prompt_name, prompt)
        if output_value != "sentence_embedding":
            tokens = self._token_embeddings(texts, prompt, batch_size)
            if output_value is None:
                vectors = self._sentence_vectors(texts, prompt, batch_size, show_progress_bar, normalize_embeddings,
                                                 truncate_dim)
                tokens = [row | {"sentence_embedding": vector} for row, vector in zip(tokens, vectors)]
            else:
                tokens = [row["token_embeddings"] for row in tokens]
            return tokens[0] if single else tokens
        if not texts:  # as sentence-transformers answers no texts
            return torch.tensor([]) if convert_to_tensor else np.array([]) if convert_to_numpy else []
        vectors = self._sentence_vectors(texts, prompt, batch_size, show_progress_bar, normalize_embeddings,
                                         truncate_dim)
        if precision != "float32":
            vectors = torch.from_numpy(PRECISIONS[precision](vectors.numpy()))
        vectors = vectors[0] if single else vectors
        if convert_to_tensor:
            return vectors
        if convert_to_numpy:
            return vectors.numpy()
        return vectors if single else list(vectors)

    def _prompt(self, name: str | None, text: str | None) -> str | None:
        """The prompt's text as sentence-transformers picks it: `text`, else the named prompt (the empty role
        prompts included); None: extract_features puts the checkpoint's default prompt, if any."""
        if text is not None or name is None:
            return text
        if name not in self.prompts:
            raise InputError(f"prompt_name {name!r}: the model has prompts {', '.join(map(repr, self.prompts))}")
        return self.prompts[name]

    def _sentence_vectors(self, texts: list[str], prompt: str | None, batch_size: int, progress: bool | None,
                          normalize: bool, truncate_dim: int | None) -> torch.Tensor:
        vectors = extract_features(self.model, self.tokenizer, texts, batch_size=batch_size,
                                   max_length=self.max_seq_length, progress=bool(progress), prompt=prompt).float()
        if truncate_dim is not None:
            if not isinstance(truncate_dim, int) or truncate_dim < 1:
                raise InputError(f"truncate_dim must be a positive whole number, got {truncate_dim!r}")
            vectors = vectors[:, :truncate_dim]
        return F.normalize(vectors, dim=-1) if normalize else vectors

    @torch.inference_mode()
    def _token_embeddings(self, texts: list[str], prompt: str | None, batch_size: int) -> list[dict[str, Any]]:
        """Per text: its input ids, attention mask and last-layer token vectors, cut at max_seq_length."""
        settings = dataclasses.replace(sentence_embedding(self.model), max_length=self.max_seq_length)
        encoded = self.tokenizer(embedding_texts(texts, settings, settings.prompt(None, prompt)), truncation=True,
                                 max_length=self.max_seq_length)
        rows = [{name: encoded[name][i] for name in ("input_ids", "token_type_ids", "attention_mask")}
                for i in range(len(texts))]
        answers: list[dict[str, Any]] = [{}] * len(rows)
        for indices in length_sorted_batches([len(row["input_ids"]) for row in rows], batch_size):
            outputs = forward_rows(self.model, [rows[i] for i in indices], lambda output: (output.last_hidden_state,))
            for i, (states,) in zip(indices, outputs):
                answers[i] = {name: torch.tensor(values) for name, values in rows[i].items()} | {
                    "token_embeddings": states}
        return answers

    def encode_query(self, sentences: str | Sequence[str], **options: Any) -> Any:
        """encode with the "query" prompt (the checkpoint's, else none), as sentence-transformers 5."""
        return self.encode(sentences, **self._role_prompt(("query",), options))

    def encode_document(self, sentences: str | Sequence[str], **options: Any) -> Any:
        """encode with the first of the "document", "passage" and "corpus" prompts, as sentence-transformers 5
        (which gives every model a "document" prompt, empty unless the checkpoint fills it)."""
        return self.encode(sentences, **self._role_prompt(("document", "passage", "corpus"), options))

    def _role_prompt(self, names: tuple[str, ...], options: dict[str, Any]) -> dict[str, Any]:
        if "prompt_name" not in options and "prompt" not in options:
            options["prompt_name"] = next((name for name in names if name in self.prompts), None)
        return options

    def similarity(self, embeddings_1: Any, embeddings_2: Any) -> torch.Tensor:
        """(n, m) similarities of two sets of vectors (arrays, tensors, lists of vectors, or one vector each) by
        similarity_fn_name."""
        first, second = (_matrix(e) for e in (embeddings_1, embeddings_2))
        return SIMILARITIES[self.similarity_fn_name].table(first, second)

    def similarity_pairwise(self, embeddings_1: Any, embeddings_2: Any) -> torch.Tensor:
        """(n,) similarities of the i-th vector of one set with the i-th of the other."""
        first, second = (_matrix(e) for e in (embeddings_1, embeddings_2))
        if first.shape != second.shape:
            raise InputError(f"similarity_pairwise needs two sets of the same shape, got {tuple(first.shape)} and "
                             f"{tuple(second.shape)}")
        return SIMILARITIES[self.similarity_fn_name].pairwise(first, second)


def _matrix(embeddings: Any) -> torch.Tensor:
    """(n, d) float32 of an array, a tensor, a list of vectors, or one vector."""
    if isinstance(embeddings, list | tuple) and embeddings and isinstance(embeddings[0], torch.Tensor):
        embeddings = torch.stack(list(embeddings))
    matrix = embeddings if isinstance(embeddings, torch.Tensor) else torch.as_tensor(np.asarray(embeddings))
    matrix = matrix.float()
    return matrix[None] if matrix.dim() == 1 else matrix
