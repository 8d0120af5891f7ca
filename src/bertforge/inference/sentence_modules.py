"""A SentenceEncoder seen as sentence-transformers' list of modules (Transformer, Pooling, Dense, Normalize), for
code that reaches into it: `model[0].auto_model` (to wrap the BERT model, e.g. in LoRA adapters),
`model[0].tokenizer`, `model[1].pooling_mode`. Each is a view: reading or setting through it reads or changes the
encoder itself (a Dense layer is the encoder's own module)."""

from __future__ import annotations

from typing import Any

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
        return self._encoder.settings.lowercase

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
