"""SPLADE (Formal et al., 2021): a text as one weight per vocabulary entry, read from the masked-LM head. Each
token's logits go through log(1 + relu(.)), and the text's tokens are pooled (max, or sum in the first SPLADE);
most weights are 0, so a text is a short list of (word piece, weight) pairs that an inverted index can hold.
SparseEncoder gives them as sentence-transformers' SparseEncoder does (encode, decode, similarity, sparsity).
Inference-free SPLADE (sentence-transformers' Router with a SparseStaticEmbedding) weights a query's word pieces by
a static table instead (StaticWeights), and runs the model on documents only."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.batching import MODEL_INPUTS, collate, length_sorted_batches
from bertforge.checkpoint.default_model import resolve_model_dir, sentence_transformers_cache
from bertforge.checkpoint.sentence_transformers import (
    SentenceEmbedding,
    SpladePooling,
    read_sentence_embedding,
    write_router,
)
from bertforge.errors import ConfigError, InputError
from bertforge.inference.features import model_rows, text_and_pair
from bertforge.inference.process_pool import PoolMethods
from bertforge.inference.text_encoder import ModelCardData, TextEncoder, encode_inputs
from bertforge.json_config import read_json_object
from bertforge.progress import progress_bar
from bertforge.tokenizer.files import CONFIG_FILE as TOKENIZER_CONFIG_FILE
from bertforge.tokenizer.files import NO_LENGTH_LIMIT, means_no_limit
from bertforge.validation import check_counts, count_of

SPLADE = "splade"  # the pooling that names it (`bertforge serve --pooling`, `embed --pool`), as TEI's --pooling

# Per logit: the term weight it gives (sentence-transformers' SpladePooling activation_function).
SPLADE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": lambda logits: torch.log1p(torch.relu(logits)),
    "log1p_relu": lambda logits: torch.log1p(torch.log1p(torch.relu(logits))),  # OpenSearch's models
}
# Over a text's tokens (..., seq, vocab) -> (..., vocab): its pooling_strategy. The weights are >= 0, so a padding
# position's 0 changes neither.
SPLADE_STRATEGIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "max": lambda weights: weights.max(-2).values,
    "sum": lambda weights: weights.sum(-2),
}


def splade_vector(logits: torch.Tensor, splade: SpladePooling, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(..., seq, vocab) masked-LM logits -> (..., vocab) weights, pooled over the tokens ([CLS] and [SEP]
    included) that `mask` (..., seq) marks real; without it, every one."""
    weights = SPLADE_ACTIVATIONS[splade.activation](logits)
    if mask is not None:
        weights = weights * mask[..., None].to(weights.dtype)
    return SPLADE_STRATEGIES[splade.strategy](weights)


@torch.inference_mode()
def splade_rows(model: nn.Module, rows: Sequence[dict[str, Any]], splade: SpladePooling) -> torch.Tensor:
    """(rows, vocab) float32 weights of rows of model inputs, run as one padded batch and pooled where the model
    is, so that only the pooled weights leave it (not every token's vocabulary-wide logits). Each row is pooled over
    its own tokens: the padding's logits are never activated (measured: masking them is slower on a CPU)."""
    device = next(model.parameters()).device
    batch = collate([{key: row[key] for key in MODEL_INPUTS if key in row} for row in rows],
                    model.config.pad_token_id)
    logits = model(**{name: tensor.to(device) for name, tensor in batch.items()}).logits
    return torch.stack([splade_vector(row_logits[:len(row["input_ids"])], splade)
                        for row_logits, row in zip(logits, rows)]).float()


def keep_largest(vectors: torch.Tensor, count: int | None) -> torch.Tensor:
    """(n, vocab) with each row's `count` largest weights kept and the others 0 (max_active_dims); None: all."""
    if count is None or count >= vectors.shape[-1]:
        return vectors
    values, indices = vectors.topk(count, dim=-1)
    return torch.zeros_like(vectors).scatter_(-1, indices, values)


def dense(embeddings: torch.Tensor) -> torch.Tensor:
    return embeddings.to_dense() if embeddings.is_sparse else embeddings


def nonzero_weights(vector: torch.Tensor) -> tuple[list[int], list[float]]:
    """A (vocab,) vector's nonzero weights: their vocabulary ids, in id order, and the weights."""
    vector = dense(vector)
    ids = vector.nonzero().flatten()
    return ids.tolist(), vector[ids].tolist()


def is_splade_checkpoint(name_or_path: str | Path) -> bool:
    """Whether a model folder (or "default") has sentence-transformers' SparseEncoder layout (SpladePooling)."""
    layout = read_sentence_embedding(resolve_model_dir(name_or_path))
    return layout is not None and layout.splade is not None


def with_splade_layout(model: nn.Module) -> nn.Module:
    """A masked-LM model ready to give SPLADE vectors: its checkpoint's SpladePooling, else SPLADE v2's (max over
    tokens of log(1 + relu)); a model without the head, or with a dense sentence-transformers layout, is refused."""
    if not hasattr(model, "masked_lm"):
        raise ConfigError(f"SPLADE reads a masked-LM model (BertForMaskedLM), got a {type(model).__name__}")
    layout = getattr(model, "sentence_embedding", None)
    if layout is not None and layout.splade is None:
        raise ConfigError("this checkpoint is a dense sentence-transformers encoder (its modules.json pools token "
                          "vectors), not a SPLADE model: SentenceEncoder and `bertforge embed` read it")
    if layout is None:
        model.sentence_embedding = SentenceEmbedding(splade=SpladePooling())
    return model


def load_splade_model(name_or_path: str | Path, **options: Any) -> nn.Module:
    """A BERT masked-LM checkpoint as a SPLADE model (with_splade_layout); `options`: from_pretrained's."""
    from bertforge.pretraining.heads import BertForMaskedLM

    return with_splade_layout(BertForMaskedLM.from_pretrained(name_or_path, require_heads=True, **options))


class StaticWeights:
    """The query side of inference-free SPLADE (sentence-transformers' SparseStaticEmbedding): a text's vector holds,
    at each word piece the text contains, the table's weight for it (an IDF, say), and 0 elsewhere; no model runs.
    Its folder holds the table (model.safetensors: "weight", one per vocabulary entry; or an idf.json of word piece
    -> weight that its config.json names) and the tokenizer that splits the texts, without [CLS] and [SEP]."""

    WEIGHTS_FILE = "model.safetensors"

    def __init__(self, folder: Path, vocab_size: int):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from bertforge.tokenizer import BertTokenizer

        self.tokenizer = BertTokenizer.from_pretrained(folder)
        self.max_length = recorded_max_length(folder)
        config_path = folder / "config.json"
        try:
            config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
            idf_file = config.get("path") if isinstance(config, dict) else None
            if isinstance(idf_file, str) and idf_file.endswith(".json"):
                table = json.loads((folder / idf_file).read_text(encoding="utf-8"))
                ids = self.tokenizer.convert_tokens_to_ids(list(table))
                weight = torch.zeros(vocab_size).index_put_((torch.tensor(ids, dtype=torch.long),),
                                                            torch.tensor(list(table.values()), dtype=torch.float32))
            else:
                weight = load_file(folder / self.WEIGHTS_FILE)["weight"].float()
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as error:
            raise ConfigError(f"{folder}: unreadable SparseStaticEmbedding weights: {error}") from None
        if weight.shape != (vocab_size,):
            raise ConfigError(f"{folder}: SparseStaticEmbedding has {tuple(weight.shape)} weights, the model's "
                              f"vocabulary {vocab_size}")
        self.weight = weight

    def vectors(self, texts: list[str], prompt: str | None = None) -> torch.Tensor:
        """(texts, vocab) weights of `texts`, `prompt` put before each."""
        encoded = self.tokenizer([(prompt or "") + text for text in texts], add_special_tokens=False,
                                 truncation=self.max_length is not None, max_length=self.max_length)["input_ids"]
        vectors = torch.zeros(len(texts), len(self.weight))
        for row, ids in enumerate(encoded):
            ids = torch.tensor(ids, dtype=torch.long)
            vectors[row, ids] = self.weight[ids]
        return vectors

    def save(self, folder: Path) -> None:
        from bertforge.checkpoint.hf_format import save_safetensors

        save_safetensors({"weight": self.weight.contiguous()}, folder / self.WEIGHTS_FILE)
        self.tokenizer.save_pretrained(folder, model_max_length=self.max_length or NO_LENGTH_LIMIT)


def recorded_max_length(folder: Path) -> int | None:
    """The model_max_length the folder's tokenizer_config.json records (the tokenizer loaded from it has checked
    it), or None where it records none or transformers' "no limit". A static table has no position table to bound
    it (bertforge's tokenizer reads "no limit" as BERT's 512), so where sentence-transformers leaves a query whole,
    so does StaticWeights."""
    path = folder / TOKENIZER_CONFIG_FILE
    limit = read_json_object(path, "tokenizer config").get("model_max_length") if path.is_file() else None
    return None if limit is None or means_no_limit(limit) else limit


class SparseEncoder(PoolMethods, TextEncoder):
    """One sparse vector per text, as sentence-transformers' SparseEncoder(name).encode(texts) gives it: a
    (texts, vocab) sparse COO tensor. The checkpoint is a BERT masked-LM model; its sentence-transformers layout
    (SpladePooling) says how the logits are pooled, else SPLADE v2's max over tokens of log(1 + relu(logits)).

    >>> encoder = SparseEncoder("path/to/splade")
    >>> encoder.decode(encoder.encode("The cat sat on the mat."), top_k=3)
    [('mat', 2.37), ('cat', 2.30), ('sat', 1.96)]
    """

    model_card_data = ModelCardData("SparseEncoderModelCardData")

    DEFAULT_SIMILARITY = "dot"

    def __init__(self, model_name_or_path: str | Path | nn.Module | None = None, tokenizer: Any = None, *,
                 max_active_dims: int | None = None, **options: Any):
        """SparseEncoder(name_or_path, device=..., prompts=..., max_active_dims=..., ...): TextEncoder's options,
        and how many of each text's largest weights encode keeps by default (None: the checkpoint's, else all)."""
        super().__init__(model_name_or_path, tokenizer, **options)
        if max_active_dims is not None:
            self.max_active_dims = max_active_dims
        self.static_weights = None  # inference-free SPLADE's table (settings.routes): its queries run no model
        routes = self.settings.routes
        if routes is not None:  # the table is in the Router's folder, beside the model's own
            source = getattr(self.model, "name_or_path", "")
            if not source:
                raise ConfigError("an inference-free SPLADE model (a Router with a SparseStaticEmbedding) loads from "
                                  "its folder: SparseEncoder(path), or its model's from_pretrained(path)")
            cache = sentence_transformers_cache(options.get("cache_folder"))
            router_folder = resolve_model_dir(source, cache_dir=cache, revision=options.get("revision")).parent
            self.static_weights = StaticWeights(router_folder / routes.static_folder, self.get_embedding_dimension())

    @classmethod
    def load_model(cls, name_or_path: str | Path, **options: Any) -> nn.Module:
        return load_splade_model(name_or_path, **options)

    def check_layout(self) -> None:
        with_splade_layout(self.model)

    @property
    def splade(self) -> SpladePooling:
        return self.settings.splade

    @property
    def max_active_dims(self) -> int | None:
        """How many of each text's largest weights encode keeps when its call names no number; None: all."""
        return self.settings.max_active_dims

    @max_active_dims.setter
    def max_active_dims(self, value: int | None) -> None:
        self._change(max_active_dims=None if value is None else count_of("max_active_dims", value))

    def get_embedding_dimension(self) -> int:
        """The width of encode's vectors: the vocabulary's size."""
        return self.model.config.vocab_size

    get_sentence_embedding_dimension = get_embedding_dimension

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """SparseEncoder's forward: `features` (tokenize's) with token_embeddings (the masked-LM logits) and
        sentence_embedding (the pooled weights) added."""
        if self.settings.routes is not None:
            raise ConfigError("training an inference-free SPLADE model (its Router) is not supported: its queries "
                              "take a static table; encode_query and encode_document run it")
        inputs = {name: tensor.to(self.device) for name, tensor in features.items()
                  if name in ("input_ids", "attention_mask", "token_type_ids")}
        logits = self.model(**inputs).logits
        pooled = splade_vector(logits, self.splade, inputs["attention_mask"])
        return dict(features) | {"token_embeddings": logits, "sentence_embedding": pooled}

    def encode(self, inputs: str | Sequence[str] | None = None, prompt_name: str | None = None,
               prompt: str | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
               convert_to_tensor: bool = True, convert_to_sparse_tensor: bool = True, save_to_cpu: bool = False,
               device: str | torch.device | Sequence[str | torch.device] | None = None,
               max_active_dims: int | None = None, pool: dict[str, Any] | None = None,
               chunk_size: int | None = None, *, sentences: str | Sequence[str] | None = None,
               task: str | None = None) -> Any:
        """SparseEncoder.encode: a (texts, vocab) tensor, sparse (COO) unless convert_to_sparse_tensor=False; a
        (vocab,) one for a single string; a list of per-text tensors with convert_to_tensor=False.
        `max_active_dims` keeps each text's largest weights (default: the encoder's max_active_dims). `task`
        ("query", "document"; encode_query and encode_document name theirs) picks an inference-free model's route.
        `pool` (from start_multi_process_pool), or a list of devices as `device`, shares the texts between
        processes in chunks of `chunk_size` (inference/process_pool.py), with the same answer."""
        self.eval()
        texts = encode_inputs(sentences if inputs is None else inputs)
        check_counts(batch_size=batch_size)
        max_active_dims = self.max_active_dims if max_active_dims is None else max_active_dims
        if max_active_dims is not None:
            check_counts(max_active_dims=max_active_dims)
        if self.settings.routes is not None:
            self.settings.routes.route(task)  # a task it has no route for is refused before any work
        devices = self.place(device)
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        options = dict(prompt=self._prompt(prompt_name, prompt), task=task, batch_size=batch_size,
                       progress=bool(show_progress_bar) and pool is None and devices is None)
        if texts and (pool is not None or devices is not None):
            # a worker's chunk comes back sparse: its (chunk, vocab) weights are mostly 0
            vectors = self.pooled("_sparse_weights", texts, pool, devices, chunk_size, **options).to_dense()
        else:
            vectors = self._weights(texts, **options)
        vectors = keep_largest(vectors, max_active_dims)
        if save_to_cpu:
            vectors = vectors.cpu()
        if convert_to_sparse_tensor:
            vectors = vectors.to_sparse()
        if single:
            return vectors[0]
        return vectors if convert_to_tensor else list(vectors)

    def encode_query(self, sentences: str | Sequence[str], **options: Any) -> Any:
        """encode with the "query" prompt and task (an inference-free model's static table)."""
        return super().encode_query(sentences, **{"task": "query"} | options)

    def encode_document(self, sentences: str | Sequence[str], **options: Any) -> Any:
        """encode with the "document" prompt and task."""
        return super().encode_document(sentences, **{"task": "document"} | options)

    def save(self, path: str | Path, model_name: str | None = None, create_model_card: bool = True,
             train_datasets: list[str] | None = None, safe_serialization: bool = True) -> None:
        """TextEncoder.save; an inference-free model in the Router layout sentence-transformers saves, each module
        in its folder."""
        routes = self.settings.routes
        if routes is None:
            return super().save(path, model_name, create_model_card, train_datasets, safe_serialization)
        path = Path(path)
        self._change(similarity_fn_name=self.similarity_fn_name, max_length=self.max_seq_length)
        self.model.save_pretrained(path / routes.model_folder)
        self.tokenizer.save_pretrained(path / routes.model_folder)
        self.static_weights.save(path / routes.static_folder)
        write_router(path, self.settings, self.get_embedding_dimension())

    save_pretrained = save

    def _sparse_weights(self, texts: list[str], **options: Any) -> torch.Tensor:
        return self._weights(texts, **options).to_sparse()

    def _weights(self, texts: list[str], prompt: str | None, task: str | None, batch_size: int,
                 progress: bool) -> torch.Tensor:
        """(texts, vocab) float32 weights of the task's route: the static table's, or the model's with each text
        cut to max_seq_length tokens."""
        settings = self.settings
        prompt = settings.prompt(None, prompt)  # None: the default prompt, if any
        if settings.routes is not None and settings.routes.route(task) == settings.routes.static:
            if any(text_and_pair(text)[1] is not None for text in texts):
                raise InputError(f"the {task!r} route weighs the word pieces of single texts: give it texts, "
                                 "not (text, pair)s")
            return self.static_weights.vectors(texts, prompt).to(self.device)
        rows = model_rows(self.tokenizer, texts, settings, prompt, self.max_seq_length)
        vectors = torch.zeros(len(texts), self.get_embedding_dimension(), device=self.device)
        batches = length_sorted_batches([len(row["input_ids"]) for row in rows], batch_size)
        batches = progress_bar(batches, desc="encoding", unit="batch", enabled=progress)
        for indices in batches:
            vectors[indices] = splade_rows(self.model, [rows[i] for i in indices], self.splade)
        return vectors

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        return super().similarity(*(self._dense(e) for e in (embeddings1, embeddings2)))

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        return super().similarity_pairwise(*(self._dense(e) for e in (embeddings1, embeddings2)))

    @staticmethod
    def _dense(embeddings: Any) -> Any:
        if isinstance(embeddings, list | tuple) and embeddings and isinstance(embeddings[0], torch.Tensor):
            return torch.stack([dense(e) for e in embeddings])
        return dense(embeddings) if isinstance(embeddings, torch.Tensor) else embeddings

    def decode(self, embeddings: torch.Tensor, top_k: int | None = None
               ) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """Each vector's nonzero weights as (word piece, weight), largest first, at most `top_k` of them; one list
        for a (vocab,) vector, a list per row of a (n, vocab) one."""
        if top_k is not None:
            check_counts(top_k=top_k)
        matrix = self._matrix(embeddings, "decode")
        if matrix.shape[-1] != self.get_embedding_dimension():  # else ids of another vocabulary are named here
            raise InputError(f"decode takes vectors as wide as the vocabulary ({self.get_embedding_dimension()}), "
                             f"got {matrix.shape[-1]}")
        answers = []
        for row in matrix:
            ids, weights = nonzero_weights(row)
            order = sorted(range(len(ids)), key=lambda i: -weights[i])[:top_k]
            answers.append([(self.tokenizer.convert_ids_to_tokens(ids[i]), weights[i]) for i in order])
        return answers[0] if embeddings.dim() == 1 else answers

    @staticmethod
    def sparsity(embeddings: torch.Tensor) -> dict[str, float]:
        """The mean number of nonzero weights per vector (active_dims) and the mean share of zeros
        (sparsity_ratio)."""
        matrix = SparseEncoder._matrix(embeddings, "sparsity")
        if matrix.numel() == 0:
            return {"active_dims": 0.0, "sparsity_ratio": 1.0}
        active = (matrix != 0).sum(-1).float()
        return {"active_dims": active.mean().item(), "sparsity_ratio": (1 - active / matrix.shape[-1]).mean().item()}

    @staticmethod
    def intersection(embeddings_1: torch.Tensor, embeddings_2: torch.Tensor) -> torch.Tensor:
        """The weights two texts share: a (vocab,) vector times a (vocab,) or (n, vocab) one, sparse; decode names
        the word pieces that matched."""
        first, second = dense(embeddings_1), dense(embeddings_2)
        if first.dim() != 1 or second.dim() not in (1, 2) or first.shape[-1] != second.shape[-1]:
            raise InputError(f"intersection takes a (vocab,) vector and a (vocab,) or (n, vocab) one of the same "
                             f"width, got {tuple(first.shape)} and {tuple(second.shape)}")
        return (first * second).to_sparse()

    @staticmethod
    def _matrix(embeddings: torch.Tensor, caller: str) -> torch.Tensor:
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() not in (1, 2):
            raise InputError(f"{caller} takes a (vocab,) or (n, vocab) tensor, as encode gives")
        matrix = dense(embeddings).float().cpu()
        return matrix[None] if matrix.dim() == 1 else matrix
