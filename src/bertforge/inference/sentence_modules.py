"""A SentenceEncoder seen as sentence-transformers' list of modules (Transformer, Pooling, Dense, Normalize), for
code that reaches into it: `model[0].auto_model` (to wrap the BERT model, e.g. in LoRA adapters),
`model[0].tokenizer`, `model[1].pooling_mode`. Each is a view: reading or setting through it reads or changes the
encoder itself (a Dense layer is the encoder's own module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.checkpoint.sentence_transformers import POOLING_MODE_FLAGS


class EncoderView:
    """One of the modules, read from and written to the SentenceEncoder it views."""

    def __init__(self, encoder: Any):
        self._encoder = encoder


class Transformer(EncoderView):
    """model[0]: the BERT model and its tokenizer."""

    @property
    def auto_model(self) -> nn.Module:
        return self._encoder.model

    @auto_model.setter
    def auto_model(self, model: nn.Module) -> None:
        """A wrapped model (peft's get_peft_model(model[0].auto_model, ...)) takes the encoder's place, keeping
        how texts become vectors."""
        settings, dense = self._encoder.settings, getattr(self._encoder.model, "sentence_dense", None)
        self._encoder.model = model
        self._encoder.model.sentence_embedding = settings
        if dense is not None:
            self._encoder.model.sentence_dense = dense

    model = auto_model

    @property
    def tokenizer(self) -> Any:
        return self._encoder.tokenizer

    processor = tokenizer

    @property
    def max_seq_length(self) -> int:
        return self._encoder.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self._encoder.max_seq_length = value

    @property
    def do_lower_case(self) -> bool:
        """Whether the text is lower-cased before tokenizing (the layout's setting; the tokenizer has its own)."""
        return getattr(getattr(self._encoder, "settings", None), "lowercase", False)

    def get_embedding_dimension(self) -> int:
        """The width of the token vectors."""
        return self._encoder.model.config.hidden_size

    get_word_embedding_dimension = get_embedding_dimension

    def tokenize(self, texts: Any) -> dict:
        return self._encoder.tokenize(texts)

    def __repr__(self) -> str:
        return (f"Transformer({{'max_seq_length': {self.max_seq_length}, 'do_lower_case': {self.do_lower_case}, "
                f"'architecture': {type(self.auto_model).__name__!r}}})")


class Pooling(EncoderView):
    """model[1]: how token vectors become one vector per text."""

    @property
    def pooling_mode(self) -> str:
        return self._encoder.settings.pooling

    def get_pooling_mode_str(self) -> str:  # sentence-transformers before 6
        return self.pooling_mode

    @property
    def include_prompt(self) -> bool:
        return self._encoder.settings.include_prompt

    @property
    def embedding_dimension(self) -> int:
        return self._encoder.model.config.hidden_size

    word_embedding_dimension = embedding_dimension

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    get_sentence_embedding_dimension = get_embedding_dimension

    def __getattr__(self, name: str) -> bool:
        """The flags of sentence-transformers before 6: pooling_mode_mean_tokens and the like."""
        if name in POOLING_MODE_FLAGS:
            return POOLING_MODE_FLAGS[name] == self.pooling_mode
        raise AttributeError(f"Pooling has no attribute {name!r}")

    def __repr__(self) -> str:
        return (f"Pooling({{'embedding_dimension': {self.embedding_dimension}, 'pooling_mode': "
                f"{self.pooling_mode!r}, 'include_prompt': {self.include_prompt}}})")


class SpladePooling(EncoderView):
    """A sparse encoder's model[1]: how the masked-LM logits become one weight per vocabulary entry."""

    @property
    def pooling_strategy(self) -> str:
        return self._encoder.settings.splade.strategy

    @property
    def activation_function(self) -> str:
        return self._encoder.settings.splade.activation

    @property
    def word_embedding_dimension(self) -> int:
        return self._encoder.model.config.vocab_size

    def get_embedding_dimension(self) -> int:
        return self.word_embedding_dimension

    get_sentence_embedding_dimension = get_embedding_dimension

    def __repr__(self) -> str:
        return (f"SpladePooling({{'pooling_strategy': {self.pooling_strategy!r}, 'activation_function': "
                f"{self.activation_function!r}, 'word_embedding_dimension': {self.word_embedding_dimension}}})")


class Normalize(EncoderView):
    """model[2], where the layout normalises: each vector scaled to unit length."""

    def __repr__(self) -> str:
        return "Normalize()"


def modules_of(encoder: Any) -> list[Any]:
    """The encoder's modules in sentence-transformers' order: its Dense layers themselves (features.Dense) where
    its layout has them, Normalize only where it normalises; a sparse encoder's masked-LM model and SpladePooling."""
    if encoder.settings.splade is not None:
        return [Transformer(encoder), SpladePooling(encoder)]
    return [Transformer(encoder), Pooling(encoder), *(getattr(encoder.model, "sentence_dense", None) or ())] + (
        [Normalize(encoder)] if encoder.settings.normalize else [])


class MultiVectorMask(EncoderView):
    """A ColBERT model's scoring mask: which token vectors are scored (the skiplist, a query's [MASK]s)."""

    @property
    def skiplist_words(self) -> list[str]:
        return list(self._encoder.layout.skiplist_words)

    @property
    def skiplist_tasks(self) -> list[str]:
        return list(self._encoder.layout.skiplist_tasks)

    def __repr__(self) -> str:
        return f"MultiVectorMask({{'skiplist_words': {self.skiplist_words}, 'skiplist_tasks': {self.skiplist_tasks}}})"


def multi_vector_modules_of(encoder: Any) -> list[Any]:
    """A MultiVectorEncoder's modules in sentence-transformers' order: Transformer, its projection (the Dense
    layers themselves), MultiVectorMask, and Normalize where its layout normalises."""
    return [Transformer(encoder), *encoder.projection, MultiVectorMask(encoder)] + (
        [Normalize(encoder)] if encoder.layout.normalize else [])


class ModuleList:
    """sentence-transformers' model API around its list of modules, for an encoder whose `module_views()` gives
    them: indexing, iteration, and the attributes its trainer, model card and evaluators read."""

    trust_remote_code = False  # bertforge runs no code from a checkpoint (sentence-transformers' trainer asks)

    def module_views(self) -> list[Any]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        return self.module_views()[index]

    def __len__(self) -> int:
        return len(self.module_views())

    def __iter__(self) -> Any:
        return iter(self.module_views())

    def _first_module(self) -> Any:
        return self[0]

    def _last_module(self) -> Any:
        return self[-1]

    def get_backend(self) -> str:
        return getattr(self, "backend", "torch")

    @property
    def modalities(self) -> list[str]:
        """What it encodes (sentence-transformers 6, whose models may also take images or audio): text."""
        return ["text"]

    @property
    def transformers_model(self) -> nn.Module:
        """The BERT encoder (sentence-transformers' name for the model under its modules)."""
        return self.model

    @property
    def processor(self) -> Any:
        return self.tokenizer

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def get_max_seq_length(self) -> int:
        return self.max_seq_length

    @classmethod
    def _load_with_module_classes(cls, path: str | Path, module_classes: Any = None, **options: Any) -> Any:
        """The encoder of a folder it saved: how sentence-transformers' trainer reloads a checkpoint to resume from
        or to keep as the best model (it then copies the state dict over). `module_classes` and the Hub's
        options are unused here."""
        return cls(path)
