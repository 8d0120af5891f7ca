"""sentence-transformers' SentenceTransformer interface (encode, similarity, encode_query, ...) over a BERT
checkpoint, for code written against it: each call is extract_features with the checkpoint's own layout (pooling,
max_seq_length, normalisation, prompts, similarity function)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.batching import length_sorted_batches
from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.sentence_transformers import SentenceEmbedding, read_sentence_embedding
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.inference.embedding_precision import PRECISIONS, quantize_embeddings
from bertforge.inference.features import (
    after_pooling,
    extract_features,
    model_rows,
    pool,
    pooling_mask,
    prompt_tokens,
)
from bertforge.inference.process_pool import PoolMethods
from bertforge.inference.text_encoder import TextEncoder, encode_inputs
from bertforge.tasks.data import forward_rows
from bertforge.validation import check_counts, count_of


def refuse_sparse_layout(layout: SentenceEmbedding | None) -> None:
    if layout is not None and layout.multi_vector:
        raise ConfigError("this checkpoint is a multi-vector (ColBERT) model, one vector per token: load it with "
                          "MultiVectorEncoder")
    if layout is not None and layout.splade is not None:
        raise ConfigError("this checkpoint is a sparse (SPLADE) encoder: its vectors come from the masked-LM head; "
                          "load it with SparseEncoder")


class SentenceEncoder(PoolMethods, TextEncoder):
    """One vector per text, as SentenceTransformer(name).encode(texts) gives it. A module, as SentenceTransformer
    is: its parameters are the BERT model's, and sentence-transformers' losses train it through `forward`.

    >>> encoder = SentenceEncoder.from_pretrained("default")
    >>> encoder.encode(["A man is eating food.", "A man is riding a horse."]).shape
    (2, 384)
    """

    def __init__(self, model_name_or_path: str | Path | nn.Module | None = None, tokenizer: Any = None, *,
                 truncate_dim: int | None = None, **options: Any):
        """SentenceTransformer(name_or_path, device=..., prompts=..., truncate_dim=..., ...): TextEncoder's
        options, and the dimensions encode keeps by default (else those the checkpoint saved, if any)."""
        super().__init__(model_name_or_path, tokenizer, **options)
        if truncate_dim is not None:
            self.truncate_dim = truncate_dim

    @classmethod
    def load_model(cls, name_or_path: str | Path, **options: Any) -> nn.Module:
        from bertforge import BertModel

        # refused before loading, which would log the masked-LM checkpoint's missing pooler as newly initialised
        refuse_sparse_layout(read_sentence_embedding(resolve_model_dir(
            name_or_path, cache_dir=options.get("cache_dir"), revision=options.get("revision"))))
        return BertModel.from_pretrained(name_or_path, **options)

    def check_layout(self) -> None:
        refuse_sparse_layout(self.settings)

    @property
    def truncate_dim(self) -> int | None:
        """Dimensions encode keeps (the first ones) when its call names none; None: all. Saved with the encoder,
        as sentence-transformers saves it."""
        return self.settings.truncate_dim

    @truncate_dim.setter
    def truncate_dim(self, value: int | None) -> None:
        self._change(truncate_dim=None if value is None else count_of("truncate_dim", value))

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """SentenceTransformer's forward: `features` (tokenize's) with token_embeddings (the last layer) and
        sentence_embedding (pooled, normalised where the layout says so) added; with gradients unless the caller
        turns them off, so that sentence-transformers' losses train the encoder."""
        inputs = {name: tensor.to(self.device) for name, tensor in features.items()
                  if name in ("input_ids", "attention_mask", "token_type_ids")}
        states = self.model(**inputs).last_hidden_state
        mask = inputs["attention_mask"]
        if not self.settings.include_prompt and "prompt_length" in features:  # sentence-transformers' trainer's
            mask = pooling_mask(mask, int(torch.as_tensor(features["prompt_length"]).reshape(-1)[0]))
        vectors = after_pooling(self.model, pool(states, mask, self.settings.pooling), self.settings.normalize)
        return dict(features) | {"token_embeddings": states, "sentence_embedding": vectors}

    def get_embedding_dimension(self) -> int:
        """Dimensions encode gives (sentence-transformers 6.2's name; get_sentence_embedding_dimension before)."""
        width = self._get_untruncated_embedding_dimension()
        return min(width, self.truncate_dim or width)

    def _get_untruncated_embedding_dimension(self) -> int:
        """Dimensions of the model's own vectors, before truncate_dim (sentence-transformers' MatryoshkaLoss asks)."""
        dense = getattr(self.model, "sentence_dense", None)
        return dense[-1].out_features if dense else self.model.config.hidden_size

    get_sentence_embedding_dimension = get_embedding_dimension

    @contextmanager
    def truncate_embeddings(self, truncate_dim: int | None) -> Iterator[None]:
        """Within the block, encode keeps the first `truncate_dim` dimensions (None: all)."""
        before, self.truncate_dim = self.truncate_dim, truncate_dim
        try:
            yield
        finally:
            self.truncate_dim = before

    truncate_sentence_embeddings = truncate_embeddings

    # sentence-transformers' module list, as views onto this encoder (inference/sentence_modules.py):
    # model[0].auto_model, model[0].tokenizer, model[1].pooling_mode, len(model).
    def encode(self, sentences: str | Sequence[str] | None = None, prompt_name: str | None = None,
               prompt: str | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
               output_value: str | None = "sentence_embedding", precision: str | None = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               device: str | torch.device | Sequence[str | torch.device] | None = None,
               normalize_embeddings: bool = False, truncate_dim: int | None = None,
               pool: dict[str, Any] | None = None, chunk_size: int | None = None, *,
               inputs: str | Sequence[str] | None = None) -> Any:
        """SentenceTransformer.encode: (texts, hidden) vectors, (hidden,) for a single string, in the model's dtype
        (float32; float16 or bfloat16 for a model cast to one, bfloat16 as float32 in numpy); a numpy array,
        a tensor with `convert_to_tensor`, a list of tensors with neither. A (text, pair) among the texts is one
        input, [CLS] text [SEP] pair [SEP], as sentence-transformers reads it. `truncate_dim` keeps the first
        dimensions, `normalize_embeddings` makes them unit length (after truncating), `precision` quantizes them
        (int8, uint8, binary, ubinary). output_value="token_embeddings": per text its tokens' (tokens, hidden)
        last layer, [CLS] and [SEP] included (quantized by `precision`: numpy arrays, every token of the call in one
        range); None: per text a dict of its inputs, modality, prompt_length (a prompt's [CLS] and pieces) and both
        outputs. `pool` (from
        start_multi_process_pool), or a list of devices as `device`, shares the texts between processes in chunks
        of `chunk_size` (inference/process_pool.py), with the same answer."""
        self.eval()  # as sentence-transformers' encode: no dropout, whatever mode training left the model in
        sentences = encode_inputs(inputs if sentences is None else sentences)
        if output_value is not None:
            check_choice(output_value, ("sentence_embedding", "token_embeddings"), "output_value", error=InputError)
        precision = "float32" if precision is None else precision  # what sentence-transformers' evaluators pass
        check_choice(precision, PRECISIONS, "precision", error=InputError)
        check_counts(batch_size=batch_size)
        devices = self.place(device)
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        prompt = self._prompt(prompt_name, prompt)
        if truncate_dim is not None:
            check_counts(truncate_dim=truncate_dim)
        if not texts and output_value == "sentence_embedding":  # as sentence-transformers answers no texts
            return torch.tensor([]) if convert_to_tensor else np.array([]) if convert_to_numpy else []
        if not texts:
            return []
        pooled = pool is not None or devices is not None
        options = dict(prompt=prompt, batch_size=batch_size, progress=bool(show_progress_bar) and not pooled,
                       normalize=normalize_embeddings, truncate_dim=truncate_dim, output_value=output_value)
        if pooled:
            answers = self.pooled("_answers", texts, pool, devices, chunk_size, **options)
        else:
            answers = self._answers(texts, **options)
        if output_value is None and precision != "float32":
            raise InputError(f"precision {precision!r} quantizes sentence or token embeddings; output_value=None "
                             "gives each text's inputs and outputs as they are")
        if output_value == "token_embeddings" and precision != "float32":
            # every token of the call in one range per dimension, as sentence-transformers scales them
            lengths = [len(matrix) for matrix in answers]
            whole = quantize_embeddings(torch.cat(answers).numpy(), precision)
            answers = np.split(whole, np.cumsum(lengths)[:-1])
        elif output_value == "token_embeddings":
            answers = [matrix.to(self.model_output_dtype) for matrix in answers]
        if output_value != "sentence_embedding":
            return answers[0] if single else answers
        vectors = answers.to(self.model_output_dtype) if precision == "float32" else \
            torch.from_numpy(quantize_embeddings(answers.numpy(), precision))
        vectors = vectors[0] if single else vectors
        if convert_to_tensor:
            return vectors
        if convert_to_numpy:
            return (vectors.float() if vectors.dtype == torch.bfloat16 else vectors).numpy()  # numpy has no bfloat16
        return vectors if single else list(vectors)

    @property
    def model_output_dtype(self) -> torch.dtype:
        """What encode's vectors come as: the model's float16, bfloat16 or float64 where it was cast to one, as
        sentence-transformers gives them, else float32."""
        dtype = getattr(self.model, "dtype", torch.float32)
        return dtype if dtype in (torch.float16, torch.bfloat16, torch.float64) else torch.float32

    def _answers(self, texts: list[str], prompt: str | None, batch_size: int, progress: bool | None,
                 normalize: bool, truncate_dim: int | None, output_value: str | None) -> torch.Tensor | list:
        """encode's float32 answer for `texts` (in one process, or a pool's worker for its chunk): (texts, hidden)
        vectors for sentence_embedding; else a list, per text (see encode)."""
        if output_value == "sentence_embedding":
            return self._sentence_vectors(texts, prompt, batch_size, progress, normalize, truncate_dim)
        tokens = self._token_embeddings(texts, prompt, batch_size)
        if output_value is None:
            vectors = self._sentence_vectors(texts, prompt, batch_size, progress, normalize, truncate_dim)
            used = self.settings.prompt(None, prompt)  # the default prompt where none is given
            described = {"modality": "text"} | (
                {"prompt_length": prompt_tokens(self.tokenizer, self.settings, used)} if used else {})
            # sentence-transformers' order: the inputs, what describes them, the outputs
            return [{**{name: value for name, value in row.items() if name != "token_embeddings"}, **described,
                     "token_embeddings": row["token_embeddings"], "sentence_embedding": vector}
                    for row, vector in zip(tokens, vectors)]
        return [row["token_embeddings"] for row in tokens]

    def _sentence_vectors(self, texts: list[str], prompt: str | None, batch_size: int, progress: bool | None,
                          normalize: bool, truncate_dim: int | None) -> torch.Tensor:
        vectors = extract_features(self.model, self.tokenizer, texts, batch_size=batch_size,
                                   max_length=self.max_seq_length, progress=bool(progress), prompt=prompt)
        vectors = vectors if vectors.dtype == torch.float64 else vectors.float()  # a float64 model's, kept
        truncate_dim = self.truncate_dim if truncate_dim is None else truncate_dim
        if truncate_dim is not None:
            vectors = vectors[:, :truncate_dim]
        return F.normalize(vectors, dim=-1) if normalize else vectors

    @torch.inference_mode()
    def _token_embeddings(self, texts: list[str], prompt: str | None, batch_size: int) -> list[dict[str, Any]]:
        """Per text (or pair): its input ids, token types, attention mask and last-layer token vectors, cut at
        max_seq_length."""
        rows = [row | {"attention_mask": [1] * len(row["input_ids"])} for row in model_rows(
            self.tokenizer, texts, self.settings, self.settings.prompt(None, prompt), self.max_seq_length)]
        answers: list[dict[str, Any]] = [{}] * len(rows)
        for indices in length_sorted_batches([len(row["input_ids"]) for row in rows], batch_size):
            outputs = forward_rows(self.model, [rows[i] for i in indices], lambda output: (output.last_hidden_state,))
            for i, (states,) in zip(indices, outputs):
                answers[i] = {name: torch.tensor(values) for name, values in rows[i].items()} | {
                    "token_embeddings": states}
        return answers

    def encode_multi_process(self, sentences: Sequence[str], pool: dict[str, Any], prompt_name: str | None = None,
                             prompt: str | None = None, batch_size: int = 32, chunk_size: int | None = None,
                             show_progress_bar: bool | None = None, precision: str = "float32",
                             normalize_embeddings: bool = False, truncate_dim: int | None = None) -> np.ndarray:
        """encode(sentences, pool=pool, ...) as a numpy array: sentence-transformers' older name for it."""
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, batch_size=batch_size,
                           show_progress_bar=show_progress_bar, precision=precision,
                           normalize_embeddings=normalize_embeddings, truncate_dim=truncate_dim, pool=pool,
                           chunk_size=chunk_size)


