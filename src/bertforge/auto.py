"""transformers' Auto classes, for code written with them: `AutoModelForSequenceClassification.from_pretrained(path,
num_labels=3)` loads bertforge's BertForSequenceClassification. bertforge is BERT alone, so each Auto class names one
class (AUTO_CLASSES); a checkpoint of another family is refused by config.json's model_type, as bertforge's own
classes refuse it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from bertforge.config import BertConfig, bert_config
from bertforge.errors import ConfigError, check_choice
from bertforge.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.model import BertModel
from bertforge.pretraining import BertForMaskedLM, BertForNextSentencePrediction, BertForPreTraining
from bertforge.tokenizer import BertTokenizer


class AutoFactory:
    """Made by from_pretrained or from_config, never constructed, as in transformers."""

    loads: ClassVar[type]

    def __init__(self, *args: Any, **kwargs: Any):
        name = type(self).__name__
        raise ConfigError(f"{name} is not constructed: use {name}.from_pretrained(path) or {name}.from_config(config)")

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *args: Any, **options: Any):
        """`loads.from_pretrained`: the same options (num_labels, dtype, device_map, ...)."""
        return cls.loads.from_pretrained(name_or_path, *args, **options)

    @classmethod
    def from_config(cls, config: Any, dtype: torch.dtype | None = None, torch_dtype: torch.dtype | None = None,
                    attn_implementation: str | None = None, trust_remote_code: bool | None = None):
        """A new model of `config` (bertforge's BertConfig or transformers'), initialised as BERT is: no weights
        are read. transformers' options: `dtype` (or `torch_dtype`); attn_implementation is checked (one
        attention serves them all); trust_remote_code is unused."""
        from bertforge.checkpoint.pretrained import ATTENTION_IMPLEMENTATIONS

        if attn_implementation is not None:
            check_choice(attn_implementation, ATTENTION_IMPLEMENTATIONS, "attn_implementation")
        model = cls.loads(bert_config(config))
        dtype = dtype if dtype is not None else torch_dtype
        return model if dtype is None else model.to(dtype)


class AutoModel(AutoFactory):
    loads = BertModel


class AutoModelForPreTraining(AutoFactory):
    loads = BertForPreTraining


class AutoModelForMaskedLM(AutoFactory):
    loads = BertForMaskedLM


class AutoModelForSequenceClassification(AutoFactory):
    loads = BertForSequenceClassification


class AutoModelForTokenClassification(AutoFactory):
    loads = BertForTokenClassification


class AutoModelForQuestionAnswering(AutoFactory):
    loads = BertForQuestionAnswering


class AutoModelForMultipleChoice(AutoFactory):
    loads = BertForMultipleChoice


class AutoModelForNextSentencePrediction(AutoFactory):
    loads = BertForNextSentencePrediction


class AutoTokenizer(AutoFactory):
    loads = BertTokenizer

    @classmethod
    def from_config(cls, config: Any, **options: Any):
        raise ConfigError("AutoTokenizer is made from a model folder: AutoTokenizer.from_pretrained(path)")


class AutoConfig(AutoFactory):
    loads = BertConfig

    @classmethod
    def from_config(cls, config: Any, **options: Any):
        raise ConfigError("AutoConfig reads a model folder (AutoConfig.from_pretrained(path)) or makes a family's "
                          "config (AutoConfig.for_model('bert', ...))")

    @classmethod
    def for_model(cls, model_type: str, **fields: Any) -> BertConfig:
        """A new config of the family `model_type` ("bert", the one bertforge implements) with these fields."""
        check_choice(model_type, ["bert"], "model_type")
        return BertConfig().with_overrides(**fields)


# transformers' Auto class -> the bertforge class it loads
AUTO_CLASSES: dict[str, type] = {auto.__name__: auto.loads for auto in (
    AutoConfig, AutoTokenizer, AutoModel, AutoModelForPreTraining, AutoModelForMaskedLM,
    AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoModelForQuestionAnswering,
    AutoModelForMultipleChoice, AutoModelForNextSentencePrediction)}
