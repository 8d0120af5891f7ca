"""BertConfig: the encoder's hyper-parameters, with the field names of the ecosystem's config.json."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertforge.activations import ACTIVATIONS
from bertforge.atomic import write_text_atomic
from bertforge.errors import ConfigError
from bertforge.json_config import (
    read_json_object,
    value_description,
)
from bertforge.validation import check_fits_in_memory, check_number, encoder_parameters

logger = logging.getLogger("bertforge")

# config.json keys that transformers' PretrainedConfig and BertConfig define (4.x and 5.x), and those older
# versions and the original BERT release wrote: none changes the encoder's computation, so they are kept as they
# are (`BertConfig.extra`) and written back on save. Keys outside this list are kept too, and logged.
TRANSFORMERS_KEYS = frozenset({
    # bookkeeping
    "architectures", "model_type", "transformers_version", "_name_or_path", "_commit_hash", "name", "language",
    "torch_dtype", "dtype", "use_bfloat16", "torchscript", "xla_device", "tf_legacy_loss", "pruned_heads",
    "gradient_checkpointing", "_attn_implementation", "attn_implementation", "_attn_implementation_autoset",
    "return_dict", "output_past", "use_cache",
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "add_cross_attention",
    "cross_attention_hidden_size", "tie_encoder_decoder", "classifier_dropout",
    # tasks and tokens
    "problem_type", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
    "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    # generation settings, which a BERT encoder never reads
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    # the original BERT release (google-research/bert's bert_config.json)
    "directionality", "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
    "pooler_size_per_head", "pooler_type",
})

# bertforge's own config.json key: how a fine-tuning run read its inputs (max_length, long_text, decoding, ...).
FINETUNE_KEY = "bertforge_finetune"

# The number of labels is implied by id2label; older transformers wrote it as well.
LABEL_COUNT_KEYS = ("num_labels", "_num_labels")
LABEL_NAME_KEYS = ("id2label", "label2id")

# Keys whose other values would change what the model computes: key -> the one value bertforge implements
# (RoBERTa and its kin save the same tensor names as BERT but offset their positions).
FIXED_VALUES = {"model_type": "bert", "position_embedding_type": "absolute", "is_decoder": False,
                "add_cross_attention": False, "pruned_heads": {}}

# What a sequence classifier's outputs mean (transformers' `problem_type`); None: regression for one output, else
# one label per example (single_label_classification). bertforge.heads.LOSSES holds each one's loss.
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")

# Keys bertforge writes itself: the fixed ones, the class of the model being saved (`save`'s architecture), and
# quantization_config, which only bertforge.compress.quantize's save may write (checkpoint loading reads it).
WRITTEN_KEYS = ("model_type", "position_embedding_type", "architectures", "quantization_config")

# What transformers' configs (5.x: PreTrainedConfig and BertConfig) answer for attributes an encoder's user reads
# that aren't BertConfig fields, when config.json leaves them out; a key kept in `extra` answers its own value.
# (`dtype` / `torch_dtype` and `name_or_path` are properties of BertConfig: transformers renames them.)
TRANSFORMERS_DEFAULTS = {
    "architectures": None, "transformers_version": None, "_name_or_path": "", "return_dict": True,
    "use_cache": True, "is_decoder": False, "add_cross_attention": False, "is_encoder_decoder": False,
    "chunk_size_feed_forward": 0, "bos_token_id": None, "eos_token_id": None,
    "_commit_hash": None,  # transformers 5.10 and older read it where a pipeline is given a model
}

# config.json's names for the parameters' dtype: transformers 5 writes `dtype`, older versions `torch_dtype`.
DTYPE_KEYS = ("dtype", "torch_dtype")


def is_config_key(key: str) -> bool:
    """Whether BertConfig.with_overrides takes `key` (a field, a key of transformers' kept as it is, or one bertforge
    writes or checks itself)."""
    return key in {field.name for field in dataclasses.fields(BertConfig)} or key in TRANSFORMERS_KEYS or \
        key in FIXED_VALUES or key in WRITTEN_KEYS or key in LABEL_COUNT_KEYS or key == FINETUNE_KEY


def check_fixed_values(data: dict[str, Any], prefix: str = "") -> None:
    """A ConfigError for the first key of FIXED_VALUES that `data` gives another value (`prefix`: where from)."""
    for key, value in data.items():
        if key in FIXED_VALUES and value != FIXED_VALUES[key]:
            raise ConfigError(f"{prefix}{key}={value!r} is not supported (bertforge implements "
                              f"{FIXED_VALUES[key]!r} only)")


@dataclass
class BertConfigFields:
    """BertConfig's fields: encoder sizes and regularisation. Defaults are BERT-base (uncased vocabulary)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # Task heads: label names (id2label keys are strings in JSON, ints here).
    id2label: dict[int, str] = field(default_factory=dict)
    label2id: dict[str, int] = field(default_factory=dict)
    problem_type: str | None = None  # a PROBLEM_TYPES name; None: inferred from the number of labels
    classifier_dropout: float | None = None  # dropout before a classifier head; None: hidden_dropout_prob
    # False: the masked-LM head has its own decoder matrix instead of reading the word embeddings.
    tie_word_embeddings: bool = True
    # What forward returns besides the last layer when its call doesn't say (transformers' names and defaults):
    # every layer's hidden states, every layer's attention weights.
    output_hidden_states: bool = False
    output_attentions: bool = False
    # Other config.json keys (transformers' metadata, generation settings, ...), kept to be written back.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.check()
        if self.label2id and not self.id2label:  # label names given one way round only, as transformers allows
            self.id2label = {int(i): label for label, i in self.label2id.items()}
        self.id2label = {int(i): str(label) for i, label in self.id2label.items()}
        if self.id2label and not self.label2id:
            self.label2id = {label: i for i, label in self.id2label.items()}

    def check(self) -> None:
        """A ConfigError naming the first field out of range; run when the config is made, and again when a model
        is built from it, since a field may have been set since (config.vocab_size = 0, as transformers allows)."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; choose from {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_number(name, getattr(self, name))
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        check_number("layer_norm_eps", self.layer_norm_eps, minimum=0.0, exclusive=True)
        check_number("initializer_range", self.initializer_range, minimum=0.0)
        check_number("pad_token_id", self.pad_token_id, minimum=0, integer=True)
        check_fits_in_memory(encoder_parameters(self), "the model")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id ({self.pad_token_id}) must be a token id below vocab_size")
        for name in ("tie_word_embeddings", "output_hidden_states", "output_attentions"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"problem_type {self.problem_type!r} is not supported; choose from "
                              f"{', '.join(PROBLEM_TYPES)}")
        if self.classifier_dropout is not None:
            check_number("classifier_dropout", self.classifier_dropout)
            if not 0.0 <= self.classifier_dropout < 1.0:
                raise ConfigError(f"classifier_dropout must be in [0, 1), got {self.classifier_dropout!r}")
        for name in ("id2label", "label2id"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a dict of label ids and names, got {getattr(self, name)!r:.60}")

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @num_labels.setter
    def num_labels(self, count: int) -> None:
        """`config.num_labels = N`, as transformers takes it: N labels LABEL_0.. unless there are N already."""
        self.update({"num_labels": count})

    @property
    def use_return_dict(self) -> bool:
        """transformers' reading of config.json's return_dict and torchscript (true unless either says otherwise),
        for code that asks it. bertforge's models return their output objects unless a call says return_dict=False
        or runs under torch.jit.trace, whatever a checkpoint's config.json says, so that one checkpoint saved for
        TorchScript doesn't change what every caller gets."""
        return self.extra.get("return_dict", True) is not False and not self.extra.get("torchscript", False)

    # Presets: BERT-base/large from the paper, and the compact sizes of Turc et al. (2019).
    @classmethod
    def base(cls, **overrides) -> BertConfig:
        return cls(**overrides)

    @classmethod
    def large(cls, **overrides) -> BertConfig:
        return cls(**{**_sized(24, 1024, 16), **overrides})

    @classmethod
    def tiny(cls, **overrides) -> BertConfig:
        return cls(**{**_sized(2, 128, 2), **overrides})

    @classmethod
    def mini(cls, **overrides) -> BertConfig:
        return cls(**{**_sized(4, 256, 4), **overrides})

    @classmethod
    def small(cls, **overrides) -> BertConfig:
        return cls(**{**_sized(4, 512, 8), **overrides})

    @classmethod
    def medium(cls, **overrides) -> BertConfig:
        return cls(**{**_sized(8, 512, 8), **overrides})

    @classmethod
    def preset(cls, name: str, **overrides) -> BertConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown model size {name!r}; choose from {', '.join(PRESETS)} or a config.json")
        return getattr(cls, name)(**overrides)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["id2label"] = {str(i): label for i, label in self.id2label.items()}
        if not self.id2label:
            del data["id2label"], data["label2id"]
        if self.problem_type is None:  # as transformers leaves it out until a loss decides it
            del data["problem_type"]
        if self.classifier_dropout is None:
            del data["classifier_dropout"]
        data = data.pop("extra") | data
        data["position_embedding_type"] = FIXED_VALUES["position_embedding_type"]
        data["model_type"] = "bert"
        return data

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], *, source: str = "config", return_unused_kwargs: bool = False,
                  **kwargs: Any) -> BertConfig | tuple[BertConfig, dict[str, Any]]:
        """Build from a config.json dict. Keys that aren't fields are kept in `extra` (those unknown to
        transformers too are logged); values bertforge can't honour are errors naming key, value and `source`.

        Keyword arguments replace values, as transformers' from_dict takes them: those with_overrides takes
        (num_labels=3, use_cache=False, ...) and the config's other attributes (a key of config_dict's,
        name_or_path); with `return_unused_kwargs=True` the others come back, `(config, {key: value})`, and
        without it they are refused by name. dtype="auto" names no dtype (from_pretrained reads the weights')."""
        config = cls._from_config_json(config_dict, source)
        kwargs = {key: value for key, value in kwargs.items() if not (key in DTYPE_KEYS and value == "auto")}
        taken = {key: kwargs.pop(key) for key in list(kwargs) if is_config_key(key)}
        config.update(taken)
        for key in [key for key in kwargs if hasattr(config, key)]:
            setattr(config, key, kwargs.pop(key))
        if return_unused_kwargs:
            return config, kwargs
        if kwargs:
            raise ConfigError(f"unknown config field {next(iter(kwargs))!r}; BertConfig has "
                              f"{', '.join(sorted(FIELD_NAMES - {'extra'}))}")
        return config

    @classmethod
    def _from_config_json(cls, data: dict[str, Any], source: str) -> BertConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a config is an object of fields, got {value_description(data)}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values: dict[str, Any] = {"extra": {}}
        check_fixed_values(data, f"{source}: ")
        for key, value in data.items():
            if key in LABEL_NAME_KEYS and value is None:
                continue  # transformers 5 writes "label2id": null for names given only as id2label
            if key in known:
                values[key] = value
            elif key not in LABEL_COUNT_KEYS and key not in WRITTEN_KEYS:
                values["extra"][key] = value
        unknown = sorted(set(values["extra"]) - TRANSFORMERS_KEYS - set(FIXED_VALUES) - {FINETUNE_KEY})
        if unknown:
            logger.info("%s: keeping config keys bertforge does not use: %s", source, ", ".join(unknown))
        label_count = next((data[key] for key in LABEL_COUNT_KEYS if key in data), None)
        if data.get("id2label") is None and isinstance(label_count, int) and label_count > 0:
            # What transformers makes of a label count alone.
            values["id2label"] = {i: f"LABEL_{i}" for i in range(label_count)}
        try:
            return cls(**values)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None
        except (TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"{source}: invalid value: {error}") from None

    model_type = "bert"  # transformers' name for the family (a class attribute, not a field)

    def to_diff_dict(self) -> dict[str, Any]:
        """transformers' to_diff_dict: config.json without the defaults. to_dict is that already: it holds the
        fields and the keys given, never a default of transformers' that nobody set (those are read as
        attributes, see TRANSFORMERS_DEFAULTS), so dropping any key would lose it on the way back."""
        return self.to_dict()

    def to_json_string(self, use_diff: bool = True) -> str:
        """config.json's text, as transformers' to_json_string gives it (`use_diff`: see to_diff_dict)."""
        return json.dumps(self.to_diff_dict() if use_diff else self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, json_file_path: str | Path, use_diff: bool = True) -> None:
        """Write config.json's text to a file, as transformers' to_json_file does (BertConfig.from_json_file reads
        it back)."""
        write_text_atomic(json_file_path, self.to_json_string(use_diff))

    def save_pretrained(self, directory: str | Path) -> None:
        """config.json in `directory` (made if needed), as transformers' save_pretrained writes it."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.save(Path(directory) / "config.json")

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **overrides) -> BertConfig:
        """The config.json of a model directory (or "default"), fields overridden by keyword arguments."""
        from bertforge.checkpoint.default_model import resolve_model_dir
        from bertforge.checkpoint.hf_format import config_path

        return cls.load(config_path(resolve_model_dir(name_or_path))).with_overrides(**overrides)

    def with_overrides(self, **overrides: Any) -> BertConfig:
        """This config with fields replaced, as from_pretrained's keyword arguments give them: `num_labels=N`
        names N labels LABEL_0.. (the saved names stay when there are N already), new label names get their
        label2id, transformers' other config keys (use_cache, ...) are kept in `extra`, those save() writes
        (model_type, architectures, ...) are checked and left to it; anything else is refused by name."""
        fields = {f.name for f in dataclasses.fields(self)} - {"extra"}
        check_fixed_values(overrides)
        for key in WRITTEN_KEYS:  # save() writes these itself
            overrides.pop(key, None)
        if "_num_labels" in overrides:  # older transformers' name
            overrides.setdefault("num_labels", overrides.pop("_num_labels"))
        extra = {key: dtype_name(overrides.pop(key)) if key in DTYPE_KEYS else overrides.pop(key)
                 for key in list(overrides) if key not in fields and (key in TRANSFORMERS_KEYS or key == FINETUNE_KEY)}
        if "num_labels" in overrides:
            count = overrides.pop("num_labels")
            check_number("num_labels", count, minimum=1, integer=True)
            if "id2label" not in overrides and count != self.num_labels:
                overrides["id2label"] = {i: f"LABEL_{i}" for i in range(count)}
        if "id2label" in overrides:
            overrides.setdefault("label2id", {})  # derived from the new names
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ConfigError(f"unknown config field {unknown[0]!r}; BertConfig has {', '.join(sorted(fields))}")
        return dataclasses.replace(self, **overrides, extra=self.extra | extra)

    def update(self, values: dict[str, Any]) -> None:
        """Replace fields in place from a dict, as transformers' PretrainedConfig.update: the keys with_overrides
        takes, checked as it checks them."""
        self.__dict__.update(self.with_overrides(**values).__dict__)

    def save(self, path: str | Path, architecture: str | None = None) -> None:
        """Write config.json; `architecture` (a model class name) lets other libraries pick the right class."""
        data = self.to_dict() | ({"architectures": [architecture]} if architecture else {})
        write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> BertConfig:
        return cls.from_dict(read_json_object(path, "config"), source=str(path))

    from_json_file = load  # transformers' name


FIELD_NAMES = frozenset(field.name for field in dataclasses.fields(BertConfigFields))


class BertConfig(BertConfigFields):
    """Encoder sizes and regularisation. Defaults are BERT-base (uncased vocabulary).

    Takes transformers' keywords beside the fields, as its BertConfig does: `BertConfig(num_labels=3)` names three
    labels, and `BertConfig(**config.to_dict())` reads config.json's other keys (metadata kept in `extra`); a key
    that is neither is refused by name. As in transformers, the keys kept in `extra` read as attributes
    (`config.use_cache`), with transformers' defaults where config.json has none (TRANSFORMERS_DEFAULTS), and an
    attribute set that is no field (`config.num_choices = 4`) is kept in `extra`, so that to_dict and save write it.
    """

    def __init__(self, *args: Any, **keywords: Any):
        others = {key: keywords.pop(key) for key in list(keywords) if key not in FIELD_NAMES}
        super().__init__(*args, **keywords)
        if others:
            self.update(others)

    def __iter__(self):
        """config.json's keys, as transformers' config iterates them (PEFT asks `"text_config" in config`)."""
        return iter(self.to_dict())

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> BertConfig:
        """transformers' lookup of a multimodal model's text part: a BERT config is its own."""
        return self

    def __getattr__(self, name: str) -> Any:
        # Only reached when no field, method or property has `name`. `extra` is looked up in __dict__, where
        # copy and pickle haven't put it yet while they rebuild the object.
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        if name in TRANSFORMERS_DEFAULTS:
            return TRANSFORMERS_DEFAULTS[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FIELD_NAMES:
            super().__setattr__(name, value)
            return
        check_fixed_values({name: value})  # config.is_decoder = True can't be honoured
        if hasattr(type(self), name):  # num_labels, dtype, name_or_path, model_type
            super().__setattr__(name, value)
            return
        if name not in TRANSFORMERS_KEYS:
            logger.info("keeping config key bertforge does not use: %s", name)
        self.extra = self.extra | {name: value}  # a new dict: configs made by dataclasses.replace share `extra`

    @property
    def dtype(self) -> torch.dtype | None:
        """transformers' config.dtype (`torch_dtype`, its older name): the dtype config.json names, a torch dtype."""
        name = self.extra.get("dtype") or self.extra.get("torch_dtype")
        chosen = getattr(torch, name, None) if isinstance(name, str) else None
        return chosen if isinstance(chosen, torch.dtype) else name

    @dtype.setter
    def dtype(self, value: torch.dtype | str | None) -> None:
        # One attribute under both names, as in transformers 5, written under the names config.json already has.
        keys = [key for key in DTYPE_KEYS if key in self.extra] or ["dtype"]
        self.extra = self.extra | dict.fromkeys(keys, dtype_name(value))

    torch_dtype = dtype

    @property
    def name_or_path(self) -> str:
        """transformers' config.name_or_path, kept in config.json as `_name_or_path`."""
        return self._name_or_path

    @name_or_path.setter
    def name_or_path(self, value: str | Path) -> None:
        self.extra = self.extra | {"_name_or_path": str(value)}


def dtype_name(value: Any) -> Any:
    """A dtype as config.json names it (torch.bfloat16 -> "bfloat16"); a name, None or "auto" as it is."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def dropout_overrides(dropout: float | None) -> dict[str, float]:
    """BertConfig fields for one dropout probability on both hidden states and attention weights ({} for None);
    a probability outside [0, 1) is a ConfigError, so run configs call this to validate their `dropout`."""
    if dropout is None:
        return {}
    check_number("dropout", dropout)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout!r}")
    return {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}


def architectures_of(config: dict[str, Any], source: str | Path) -> list[str]:
    """config.json's "architectures": the class names the model was saved from ([] when it says none)."""
    names = config.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"{source}: \"architectures\" must be a list of class names, got {names!r:.60}")
    return names


def bert_config(config: Any) -> BertConfig:
    """The config a model is built from: `config` itself, or another library's BERT config (transformers'
    BertConfig: anything with `to_dict`) read as its config.json would be, so that what bertforge can't honour
    (relative positions, a decoder, an activation it lacks) is refused by name instead of built as something else.

    Every model assembler calls this first, so it also checks what only a model needs: hidden_size split evenly
    into heads. Like transformers, a config of any sizes can be made, saved and read (its ConfigTester makes
    hidden_size=37 with 12 heads); the model refuses it, before from_pretrained reads any weights."""
    if isinstance(config, BertConfig):
        config.check()  # again: a field may have been set since the config was made
    elif callable(getattr(config, "to_dict", None)):  # read, and so checked, as its config.json would be
        config = BertConfig.from_dict(config.to_dict(), source=type(config).__name__)
    else:
        raise ConfigError(f"expected a BertConfig, got {type(config).__name__}")
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(f"hidden_size ({config.hidden_size}) must be divisible by "
                          f"num_attention_heads ({config.num_attention_heads})")
    return config


def _sized(layers: int, hidden: int, heads: int) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": 4 * hidden}


PRESETS = ("tiny", "mini", "small", "medium", "base", "large")
