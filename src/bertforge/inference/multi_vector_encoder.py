"""sentence-transformers' MultiVectorEncoder over a BERT checkpoint: ColBERT's late interaction (Khattab and Zaharia,
2020). A text becomes one unit vector per token (BERT's last layer, projected to a smaller width); a query and a
document are compared by MaxSim: for each query token, its best match among the document's tokens, summed.

A query is padded with [MASK] up to a fixed width (query expansion), and those positions are scored: BERT fills
them with what the query is about. Document tokens in the skiplist (punctuation, for classic checkpoints) are not
scored. The checkpoint's layout says all of this (checkpoint/multi_vector.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.batching import length_sorted_batches
from bertforge.checkpoint.default_model import resolve_model_dir, sentence_transformers_cache
from bertforge.checkpoint.multi_vector import (
    NEW_PROJECTION_WIDTH,
    SIMILARITY_NAMES,
    read_multi_vector_layout,
    read_projection,
    write_multi_vector_layout,
)
from bertforge.checkpoint.pretrained import ActivationCheckpointing
from bertforge.checkpoint.sentence_transformers import chosen_prompt
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.inference.features import check_prompt, input_list
from bertforge.inference.onnx_backend import onnx_runtime_model, split_model_kwargs
from bertforge.inference.process_pool import PoolMethods
from bertforge.inference.sentence_modules import ModuleList, multi_vector_modules_of
from bertforge.inference.text_encoder import ModelCardData, SentenceTransformersTraining, check_construction_options
from bertforge.inference.token_pooling import HierarchicalTokenPooling
from bertforge.validation import check_counts, count_of

# How many query x document token products one step of maxsim holds at most (float32: 400 MB).
SCORE_CHUNK_ELEMENTS = 100_000_000


def _padded(embeddings: Any, side: str, mask: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(items, tokens, dim) float32 vectors and their (items, tokens) mask, from a list of (tokens_i, dim) tensors
    or arrays (padded here), a padded 3D tensor or array (with its `mask`, else every token counts), or one 2D one
    (a batch of one)."""
    if not isinstance(embeddings, torch.Tensor | np.ndarray | list | tuple):
        raise InputError(f"{side}: expected per-text token vectors, as encode gives them; got "
                         f"{type(embeddings).__name__}")
    if isinstance(embeddings, (torch.Tensor, np.ndarray)):
        embeddings = torch.as_tensor(embeddings)
        if embeddings.dim() == 2:
            embeddings = embeddings[None]
            mask = None if mask is None else torch.as_tensor(mask).reshape(1, -1)
        if embeddings.dim() != 3:
            raise InputError(f"{side}: expected per-text token vectors (tokens, dim), or a batch of them; got a "
                             f"tensor of shape {tuple(embeddings.shape)}")
        if mask is None:
            return embeddings.float(), torch.ones(embeddings.shape[:2], dtype=torch.bool, device=embeddings.device)
        mask = torch.as_tensor(mask, device=embeddings.device)
        if mask.shape != embeddings.shape[:2]:
            raise InputError(f"{side}: a mask of shape {tuple(mask.shape)} for vectors of {tuple(embeddings.shape)}")
        return embeddings.float(), mask.bool()
    if mask is not None:
        raise InputError(f"{side}: a mask goes with padded vectors (a 3D tensor); a list is each text's own tokens")
    items = [torch.as_tensor(item) for item in embeddings]
    if not items or any(item.dim() != 2 for item in items) or len({item.shape[1] for item in items}) != 1:
        raise InputError(f"{side}: expected a non-empty list of (tokens, dim) token vectors of one width")
    vectors = nn.utils.rnn.pad_sequence([item.float() for item in items], batch_first=True)
    lengths = torch.tensor([len(item) for item in items], device=vectors.device)
    return vectors, torch.arange(vectors.shape[1], device=vectors.device)[None] < lengths[:, None]


def _padded_pair(queries: Any, documents: Any, query_mask: Any, document_mask: Any
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """_padded's queries and documents, refused unless their token vectors are of one width."""
    padded = _padded(queries, "queries", query_mask), _padded(documents, "documents", document_mask)
    widths = [vectors.shape[-1] for vectors, _ in padded]
    if widths[0] != widths[1]:
        raise InputError(f"queries have token vectors of {widths[0]} dimensions, documents of {widths[1]}: they "
                         f"compare only at one width")
    return padded


def maxsim(queries: Any, documents: Any, length_normalize: bool = False, query_mask: Any = None,
           document_mask: Any = None) -> torch.Tensor:
    """(queries, documents) MaxSim scores: for each query token the largest dot product with a document token,
    summed over the query's tokens (divided by their number with `length_normalize`: MeanMaxSim). Each side: a
    list of (tokens, dim) vectors, as encode gives them, or a padded 3D tensor (with its (texts, tokens) mask), or
    one 2D one."""
    (query_vectors, query_mask), (document_vectors, document_mask) = _padded_pair(queries, documents, query_mask,
                                                                                  document_mask)
    query_vectors = query_vectors.to(document_vectors.device)
    query_mask = query_mask.to(document_vectors.device)
    per_document = query_vectors.shape[0] * query_vectors.shape[1] * document_vectors.shape[1]
    step = max(1, SCORE_CHUNK_ELEMENTS // max(per_document, 1))
    scores = []
    for start in range(0, document_vectors.shape[0], step):
        products = torch.einsum("qnd,bmd->qbnm", query_vectors, document_vectors[start:start + step])
        products = products.masked_fill(~document_mask[None, start:start + step, None, :], float("-inf"))
        best = products.amax(-1).masked_fill(~query_mask[:, None, :], 0)  # a masked query token adds nothing
        scores.append(best.sum(-1))
    scores = torch.cat(scores, dim=1)
    return scores / query_mask.sum(-1, keepdim=True).clamp(min=1) if length_normalize else scores


def maxsim_pairwise(queries: Any, documents: Any, length_normalize: bool = False, query_mask: Any = None,
                    document_mask: Any = None) -> torch.Tensor:
    """MaxSim of each query with the document at its position: (pairs,) scores."""
    (query_vectors, query_mask), (document_vectors, document_mask) = _padded_pair(queries, documents, query_mask,
                                                                                  document_mask)
    if len(query_vectors) != len(document_vectors):
        raise InputError(f"similarity_pairwise: {len(query_vectors)} queries and {len(document_vectors)} documents; "
                         f"it pairs them one to one")
    query_vectors, query_mask = query_vectors.to(document_vectors.device), query_mask.to(document_vectors.device)
    products = torch.einsum("pnd,pmd->pnm", query_vectors, document_vectors)
    products = products.masked_fill(~document_mask[:, None, :], float("-inf"))
    scores = products.amax(-1).masked_fill(~query_mask, 0).sum(-1)
    return scores / query_mask.sum(-1).clamp(min=1) if length_normalize else scores


def first_dimensions(rows: Sequence[torch.Tensor], dimensions: int) -> list[torch.Tensor]:
    """The first `dimensions` of each token vector, made unit length again (sentence-transformers' truncate_dim)."""
    return [F.normalize(row[:, :dimensions], dim=-1) for row in rows]


def check_token_pooling(token_pooling: Any) -> None:
    """InputError unless `token_pooling` is None or pools token vectors (sentence-transformers' pool(embeddings,
    task=))."""
    if token_pooling is not None and not callable(getattr(token_pooling, "pool", None)):
        raise InputError(f"token_pooling must pool token vectors, such as HierarchicalTokenPooling(...), got "
                         f"{token_pooling!r:.80}")


def new_projection(hidden_size: int, width: int = NEW_PROJECTION_WIDTH) -> nn.Module:
    """A new model's token projection: hidden_size -> width, no bias, no activation, initialised as nn.Linear is
    (torch's random generator: torch.manual_seed makes it repeatable)."""
    from bertforge.inference.features import Dense

    dense = Dense(hidden_size, width, bias=False, activation="torch.nn.modules.linear.Identity")
    dense.weight.data.copy_(nn.Linear(hidden_size, width, bias=False).weight.data)
    return dense


class MultiVectorEncoder(PoolMethods, ModuleList, SentenceTransformersTraining, ActivationCheckpointing, nn.Module):
    """Token vectors per text, as MultiVectorEncoder(name).encode_query / encode_document give them, and MaxSim.

    >>> encoder = MultiVectorEncoder("path/to/colbert")
    >>> queries = encoder.encode_query(["What is the capital of France?"])
    >>> documents = encoder.encode_document(["Paris is the capital of France.", "Berlin is in Germany."])
    >>> encoder.similarity(queries, documents)  # (1, 2) MaxSim scores
    """

    SUPPORTED_SIMILARITY_FN_NAMES = SIMILARITY_NAMES
    model_card_data = ModelCardData("MultiVectorEncoderModelCardData")  # where its evaluators record results
    # sentence-transformers' settings for kernels fetched from the Hub, which its token-pooling loss reads: none here
    use_kernels = False
    _token_pooling_kernel_config = None

    def __init__(self, model_name_or_path: str | Path = "default", *, device: str | torch.device | None = None,
                 prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                 similarity_fn_name: str | None = None, truncate_dim: int | None = None,
                 token_pooling: Any = None, cache_folder: str | Path | None = None, revision: str | None = None,
                 model_kwargs: dict[str, Any] | None = None, tokenizer_kwargs: dict[str, Any] | None = None,
                 processor_kwargs: dict[str, Any] | None = None, config_kwargs: dict[str, Any] | None = None,
                 backend: str = "torch", **hub_options: Any):
        """The constructor as sentence-transformers takes it, for a ColBERT checkpoint in any of the three layouts
        (checkpoint/multi_vector.py), or a new ColBERT model over any other BERT checkpoint ("default" too), its
        projection untrained unless the checkpoint's layout has Dense layers; the Hub's options are unused here.
        Prompts given join the checkpoint's. `token_pooling` (HierarchicalTokenPooling, or sentence-transformers'
        own) pools what encode gives, unless encode is given another. backend="onnx" runs the BERT encoder in ONNX
        Runtime, from the folder's onnx/model.onnx (model_kwargs file_name, provider, export: as SentenceEncoder's)."""
        from bertforge import BertModel, BertTokenizer

        super().__init__()
        check_construction_options("MultiVectorEncoder", hub_options, backend, prompts=prompts,
                                   model_kwargs=model_kwargs, tokenizer_kwargs=tokenizer_kwargs,
                                   processor_kwargs=processor_kwargs, config_kwargs=config_kwargs)
        check_token_pooling(token_pooling)
        model_options, onnx_options = split_model_kwargs(backend, model_kwargs)
        place = {"cache_dir": sentence_transformers_cache(cache_folder), "revision": revision}
        folder = resolve_model_dir(model_name_or_path, **place)
        layout = read_multi_vector_layout(folder)
        self.model = BertModel.from_pretrained(model_name_or_path, device_map=device, **place, **model_options,
                                               **(config_kwargs or {})).eval()
        self.tokenizer = BertTokenizer.from_pretrained(model_name_or_path, **place, **(tokenizer_kwargs or {}),
                                                       **(processor_kwargs or {}))
        projection = read_projection(folder)
        if layout.converted and not projection:  # a new ColBERT model: sentence-transformers' untrained projection
            projection = [new_projection(self.model.config.hidden_size)]
        self.projection = nn.ModuleList(projection).to(self.model.device)
        self._register_markers(layout.markers)
        if backend == "onnx":  # the BERT encoder runs in ONNX Runtime; the projection and the rest stay here
            self.model = onnx_runtime_model(self.model, self.tokenizer, folder, **onnx_options)
        self.backend = backend
        self.layout = dataclasses.replace(layout, converted=False, prompts=layout.prompts | (prompts or {}),
                                          default_prompt_name=default_prompt_name or layout.default_prompt_name)
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ConfigError(f"default_prompt_name {self.default_prompt_name!r} is none of the prompts "
                              f"{', '.join(map(repr, self.prompts))}")
        if similarity_fn_name is not None:
            self.similarity_fn_name = similarity_fn_name
        if truncate_dim is not None:
            self.truncate_dim = truncate_dim
        self.token_pooling = token_pooling
        self.name_or_path = str(model_name_or_path)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "token_pooling":  # a setting (sentence-transformers' pooling is a module): not a part to save
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _register_markers(self, markers: Sequence[str]) -> None:
        """A legacy checkpoint's markers ([unused0]) were inserted as one token each; the prompt puts them in the
        text, so they are made special tokens, read whole and as written (sentence-transformers does the same)."""
        from bertforge.tokenizer.added import AddedToken

        vocab = self.tokenizer.get_vocab()
        added = {token.content for token in self.tokenizer.added_tokens.values()}
        for marker in markers:
            for token in (marker, marker.split(None, 1)[0]):
                if token in vocab or token in added:
                    if self.tokenizer.tokenize(token) != [token]:
                        marked = AddedToken(token, normalized=False, special=True)
                        self.tokenizer.add_special_tokens({"additional_special_tokens": [marked]},
                                                          replace_additional_special_tokens=False)
                    break

    # ------------------------------------------------------------------ settings

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def prompts(self) -> dict[str, str]:
        return self.layout.prompts

    @property
    def default_prompt_name(self) -> str | None:
        return self.layout.default_prompt_name

    @property
    def similarity_fn_name(self) -> str:
        """maxsim, or meanmaxsim (MaxSim over the query's token count)."""
        return self.layout.similarity_fn_name or "maxsim"

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str) -> None:
        value = getattr(value, "value", value)  # sentence-transformers' SimilarityFunction
        check_choice(value, SIMILARITY_NAMES, "similarity_fn_name")
        self.layout = dataclasses.replace(self.layout, similarity_fn_name=value)

    @property
    def truncate_dim(self) -> int | None:
        """Dimensions each token vector keeps (the first ones, then made unit length again); None: all."""
        return self.layout.truncate_dim

    @truncate_dim.setter
    def truncate_dim(self, value: int | None) -> None:
        self.layout = dataclasses.replace(self.layout, truncate_dim=None if value is None
                                          else count_of("truncate_dim", value))

    @property
    def max_seq_length(self) -> int:
        """Tokens of a text encoded with no role; queries and documents may have lengths of their own."""
        limit = self.model.config.max_position_embeddings
        return min(self.layout.max_length or self.tokenizer.model_max_length, limit)

    def get_embedding_dimension(self) -> int:
        width = self._get_untruncated_embedding_dimension()
        return min(width, self.truncate_dim or width)

    def _get_untruncated_embedding_dimension(self) -> int:
        """Dimensions of the model's own token vectors, before truncate_dim (MultiVectorMatryoshkaLoss asks)."""
        return self.projection[-1].out_features if len(self.projection) else self.model.config.hidden_size

    # ------------------------------------------------------------------ encoding

    def _prompt(self, prompt_name: str | None, prompt: str | None) -> str:
        check_prompt(prompt)
        return chosen_prompt(self.prompts, self.default_prompt_name, prompt_name, prompt, "the model")

    def role_max_length(self, task: str | None) -> int:
        """Tokens a text of this role ("query", "document" or None) keeps ([CLS] and [SEP] included)."""
        expansion = self.layout.query_expansion if task == "query" else None
        own = {"query": self.layout.query_length, "document": self.layout.document_length}.get(task)
        if expansion is not None and expansion.strategy == "fixed":
            return expansion.length
        length = own or self.max_seq_length
        return max(length, expansion.length) if expansion is not None and own else length

    def _skipped_ids(self) -> torch.Tensor | None:
        """The skiplist's token ids: each word that is one token of the vocabulary (the others would skip [UNK])."""
        unk = self.tokenizer.unk_token
        ids = [self.tokenizer.convert_tokens_to_ids(word) for word in self.layout.skiplist_words
               if word in self.tokenizer.get_vocab() or word == unk]
        return torch.tensor(ids, dtype=torch.long) if ids else None

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, task: str | None = None
                   ) -> dict[str, torch.Tensor]:
        """The model's input for a batch of texts of one role (sentence-transformers' name): input_ids,
        attention_mask and token_type_ids, padded to the longest; a query's padding up to its width is [MASK]s,
        marked in query_expansion_positions. `prompt` goes before each text."""
        texts = [(prompt or "") + text for text in inputs]
        return self._batch(self.tokenizer(texts, truncation=True, max_length=self.role_max_length(task))["input_ids"],
                           task)

    def _batch(self, encoded: Sequence[Sequence[int]], task: str | None) -> dict[str, torch.Tensor]:
        expansion = self.layout.query_expansion if task == "query" else None
        width = max(len(ids) for ids in encoded)
        if expansion is not None:
            width = max(width, expansion.length)
        ids = torch.full((len(encoded), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for row, tokens in enumerate(encoded):
            ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            attention[row, :len(tokens)] = 1
        features = {"input_ids": ids, "attention_mask": attention, "token_type_ids": torch.zeros_like(ids)}
        if expansion is None:
            return features
        expanded = (attention == 0) & (torch.arange(width) < expansion.length)
        token = expansion.token or self.tokenizer.mask_token
        features["input_ids"] = ids.masked_fill(expanded, self.tokenizer.convert_tokens_to_ids(token))
        if expansion.attend:
            features["attention_mask"] = attention.masked_fill(expanded, 1)
        return features | {"query_expansion_positions": expanded}

    def forward(self, features: dict[str, torch.Tensor], task: str | None = None) -> dict[str, torch.Tensor]:
        """sentence-transformers' forward: `features` (preprocess's) with token_embeddings, (texts, tokens, dim),
        and attention_mask become the scoring mask (real tokens, a query's [MASK]s, less the skiplist); with
        gradients unless the caller turns them off, so that sentence-transformers' losses train the model."""
        inputs = {name: features[name].to(self.device) for name in ("input_ids", "attention_mask", "token_type_ids")}
        expanded = features.get("query_expansion_positions")
        scored = inputs["attention_mask"].bool()
        model_mask = inputs["attention_mask"]
        if expanded is not None:
            if self.backend == "torch":
                # The [MASK]s the encoder doesn't attend to still get vectors of their own, which are scored: a mask
                # per query and key has every position computed, where (texts, tokens) would leave the padding out.
                # (ONNX Runtime's graph computes every position under either mask.)
                model_mask = model_mask[:, None, :].expand(-1, model_mask.shape[1], -1)
            if task == "query" and self.layout.scoring_mask:
                scored = scored | expanded.to(self.device).bool()
        states = self.model(input_ids=inputs["input_ids"], attention_mask=model_mask,
                            token_type_ids=inputs["token_type_ids"]).last_hidden_state
        for layer in self.projection:
            states = layer(states)
        if self.layout.normalize:
            states = F.normalize(states, dim=-1)
        skipped = self._skipped_ids() if (task or "document") in self.layout.skiplist_tasks else None
        if skipped is not None:
            scored = scored & ~torch.isin(inputs["input_ids"], skipped.to(self.device))
        if task != "query" and self.layout.keep_only_token_ids:
            kept = torch.tensor(self.layout.keep_only_token_ids, device=self.device)
            scored = scored & torch.isin(inputs["input_ids"], kept)
        if self.layout.token_pooling is not None:  # the checkpoint's own pooling, its last module
            pooled = HierarchicalTokenPooling(**self.layout.token_pooling).pool(
                [vectors[mask] for vectors, mask in zip(states, scored)], task=task)
            states = nn.utils.rnn.pad_sequence(pooled, batch_first=True)
            scored = torch.arange(states.shape[1], device=self.device) < torch.tensor(
                [len(vectors) for vectors in pooled], device=self.device)[:, None]
        return dict(features) | {"token_embeddings": states, "attention_mask": scored}

    @torch.inference_mode()
    def _rows(self, texts: list[str], task: str | None, batch_size: int) -> list[torch.Tensor]:
        """Each text's scored token vectors, (tokens, dim), unit length where the layout says so."""
        encoded = self.tokenizer(texts, truncation=True, max_length=self.role_max_length(task))["input_ids"]
        rows: list[torch.Tensor] = [torch.empty(0)] * len(texts)
        for indices in length_sorted_batches([len(ids) for ids in encoded], batch_size):
            for i, vectors in zip(indices, self.token_vectors([encoded[i] for i in indices], task)):
                rows[i] = vectors
        return rows

    def token_vectors(self, encoded: Sequence[Sequence[int]], task: str | None) -> list[torch.Tensor]:
        """One batch of token id lists ([CLS] ... [SEP], cut to the role's length) as each one's scored token
        vectors, (tokens, dim), float32: the query's [MASK]s added, the skiplist left out. The server's worker
        runs this on the rows it batches."""
        output = self.forward(self._batch(encoded, task), task)
        return [vectors[scored].float() for vectors, scored in zip(output["token_embeddings"],
                                                                   output["attention_mask"])]

    def role_prompt(self, task: str | None, prompt_name: str | None = None) -> str:
        """What goes before a text of this role: the named prompt, else the role's own ("query", "document"),
        else the default prompt for a text of no role."""
        if prompt_name is None and task is not None:
            return self.prompts.get(task, "")
        return self._prompt(prompt_name, None)

    def encode(self, inputs: str | Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
               batch_size: int = 32, show_progress_bar: bool | None = None,
               output_value: str | None = "token_embeddings", convert_to_numpy: bool = False,
               device: str | torch.device | None = None, normalize_embeddings: bool = False,
               truncate_dim: int | None = None, task: str | None = None, pool: dict[str, Any] | None = None,
               chunk_size: int | None = None, token_pooling: Any = None, is_query: bool | None = None,
               **options: Any) -> Any:
        """Per text its scored token vectors, (tokens_i, dim): a list, or one for a single text; numpy arrays with
        `convert_to_numpy`. `task` ("query" or "document") chooses the prompt-free settings of that role: prefer
        encode_query and encode_document, which also choose the role's prompt. `truncate_dim` keeps the first
        dimensions of each vector and makes it unit length again. `token_pooling` (by default the encoder's) pools
        each document's vectors before that. `pool` (start_multi_process_pool's) or a list of devices as `device`
        shares the texts between processes. `is_query` (PyLate's): True encodes as encode_query does, False as
        encode_document (PyLate's encode takes a query when it isn't given; here a text without a role)."""
        if is_query is not None:
            if not isinstance(is_query, bool):
                raise InputError(f"is_query must be true or false, got {is_query!r}")
            if task is not None:
                raise InputError("give task or is_query, not both")
            task = "query" if is_query else "document"
            if prompt_name is None and prompt is None:
                prompt = self.role_prompt(task)
        if "convert_to_tensor" in options:
            raise InputError("MultiVectorEncoder.encode has no convert_to_tensor: texts have different numbers of "
                             "token vectors, so they stay a list (convert_to_numpy=True gives arrays)")
        unused = sorted(name for name, value in options.items() if value is not None)
        if unused:
            raise InputError(f"MultiVectorEncoder.encode takes no option {unused[0]!r} here")
        if output_value != "token_embeddings":
            raise InputError(f"output_value {output_value!r}: MultiVectorEncoder gives token_embeddings")
        if task not in (None, "query", "document"):
            raise InputError(f"task {task!r}: choose from 'query', 'document'")
        check_counts(batch_size=batch_size)
        check_token_pooling(token_pooling)
        single = isinstance(inputs, str)
        texts = input_list(inputs, "inputs")
        if not all(isinstance(text, str) for text in texts):
            raise InputError("MultiVectorEncoder.encode takes texts: a string or a list of strings")
        devices = self.place(device)
        used = self._prompt(prompt_name, prompt)
        texts = [used + text for text in texts]
        if not texts:
            rows = []
        elif pool is not None or devices is not None:
            rows = self.pooled("_rows", texts, pool, devices, chunk_size, task=task, batch_size=batch_size)
        else:
            rows = self._rows(texts, task, batch_size)
        if normalize_embeddings:
            rows = [F.normalize(row, dim=-1) for row in rows]
        token_pooling = self.token_pooling if token_pooling is None else token_pooling
        if token_pooling is not None:  # anything with sentence-transformers' pool(embeddings, task=)
            rows = token_pooling.pool(rows, task=task)
        truncate_dim = self.truncate_dim if truncate_dim is None else truncate_dim
        if truncate_dim is not None:
            check_counts(truncate_dim=truncate_dim)
            rows = first_dimensions(rows, truncate_dim)
        if convert_to_numpy:
            rows = [row.cpu().numpy() for row in rows]
        return rows[0] if single else rows

    def encode_query(self, inputs: str | Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
                     **options: Any) -> Any:
        """encode as a query: the "query" prompt (the default prompt is not used), the query's width, [MASK]s."""
        return self._encode_role("query", inputs, prompt_name, prompt, options)

    def encode_document(self, inputs: str | Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
                        **options: Any) -> Any:
        """encode as a document: the "document" prompt, the document length, the skiplist."""
        return self._encode_role("document", inputs, prompt_name, prompt, options)

    def _encode_role(self, role: str, inputs: Any, prompt_name: str | None, prompt: str | None,
                     options: dict[str, Any]) -> Any:
        return self.encode(inputs, prompt_name=prompt_name, prompt=prompt, is_query=role == "query", **options)

    def similarity(self, embeddings1: Any, embeddings2: Any, a_mask: torch.Tensor | None = None,
                   b_mask: torch.Tensor | None = None, length_normalize: bool | None = None,
                   **scoring: Any) -> torch.Tensor:
        """(queries, documents) scores by the model's similarity_fn_name (`length_normalize` in its place: True
        is meanmaxsim). Padded 3D inputs take their (texts, tokens) masks, as sentence-transformers' losses pass
        them; `chunk_elements` and `device` are accepted (maxsim chunks by itself)."""
        return self._score(maxsim, embeddings1, embeddings2, a_mask, b_mask, length_normalize, scoring)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any, a_mask: torch.Tensor | None = None,
                            b_mask: torch.Tensor | None = None, length_normalize: bool | None = None,
                            **scoring: Any) -> torch.Tensor:
        """(pairs,) scores of each query with the document at its position (options as similarity's)."""
        return self._score(maxsim_pairwise, embeddings1, embeddings2, a_mask, b_mask, length_normalize, scoring)

    def _score(self, score: Callable, queries: Any, documents: Any, a_mask: Any, b_mask: Any,
               length_normalize: bool | None, scoring: dict[str, Any]) -> torch.Tensor:
        unknown = sorted(set(scoring) - {"chunk_elements", "device"})
        if unknown:
            raise InputError(f"similarity takes no option {unknown[0]!r}")
        if length_normalize is None:
            length_normalize = self.similarity_fn_name == "meanmaxsim"
        return score(queries, documents, length_normalize=length_normalize, query_mask=a_mask, document_mask=b_mask)

    def rank(self, query: str, documents: Sequence[str], top_k: int | None = None, return_documents: bool = False,
             batch_size: int = 32) -> list[dict[str, Any]]:
        """The documents best first for `query`, as CrossEncoder.rank answers: {"corpus_id", "score"} (and
        "text")."""
        if top_k is not None:
            check_counts(top_k=top_k)
        documents = list(documents) if isinstance(documents, Iterable) and not isinstance(documents, str) else None
        if not isinstance(query, str) or documents is None or not all(isinstance(text, str) for text in documents):
            raise InputError("rank takes a query text and a list of document texts")
        scores = self.similarity(self.encode_query([query], batch_size=batch_size),
                                 self.encode_document(documents, batch_size=batch_size))[0].tolist()
        order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_k]
        return [{"corpus_id": i, "score": scores[i]} | ({"text": documents[i]} if return_documents else {})
                for i in order]

    def module_views(self) -> list[Any]:
        """sentence-transformers' list of modules (inference/sentence_modules.py): model[0].auto_model, ..."""
        return multi_vector_modules_of(self)

    # ------------------------------------------------------------------ training

    def smart_batching_collate(self, batch: Sequence[Any]) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """sentence-transformers' collate of InputExample's (`.texts`, `.label`): the first text of each is a
        query, the others documents, each with its role's prompt, as encode_query and encode_document read
        them; one batch per text position (its `task` named, as sentence-transformers' collator names it)."""
        texts = [example.texts for example in batch]
        if not texts or len({len(row) for row in texts}) != 1 or len(texts[0]) < 2:
            raise InputError("every example of a batch needs the same number of texts: a query and its documents")
        roles = ["query"] + ["document"] * (len(texts[0]) - 1)
        columns = [self.preprocess(list(column), prompt=self.prompts.get(role, ""), task=role) | {"task": role}
                   for role, column in zip(roles, zip(*texts))]
        labels = [0 if example.label is None else example.label for example in batch]
        return columns, torch.tensor(labels)

    # ------------------------------------------------------------------ saving

    def save(self, path: str | Path, **options: Any) -> None:
        """Write the model in sentence-transformers' MultiVectorEncoder layout, whichever layout it was loaded
        from: the BERT checkpoint, the tokenizer (with any marker tokens), the projection and the settings."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        write_multi_vector_layout(path, self.layout, list(self.projection))

    save_pretrained = save

    def __repr__(self) -> str:
        return (f"MultiVectorEncoder({self.name_or_path!r}, dim={self.get_embedding_dimension()}, "
                f"similarity={self.similarity_fn_name})")



