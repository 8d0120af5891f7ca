"""sentence-transformers' CrossEncoder interface (predict, rank, save) over a BERT sequence classifier, for code
written against it: rerankers (one score per (query, document) pair) and pair classifiers (NLI's labels per pair)
give sentence-transformers' numbers on the same checkpoint, through bertforge's batching and classifier.

Where a checkpoint keeps its settings: the activation put on the logits in config_sentence_transformers.json's
"activation_fn" (sentence-transformers 6's own folders, modules.json with model_type CrossEncoder), else in
config.json's "sentence_transformers": {"activation_fn": ...} (sentence-transformers 4 and 5, the Hub's rerankers),
else its older "sbert_ce_default_activation_function"; the token budget in tokenizer_config.json's model_max_length.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.atomic import write_text_atomic
from bertforge.batching import length_sorted_batches
from bertforge.checkpoint.default_model import resolve_model_dir, sentence_transformers_cache
from bertforge.checkpoint.pretrained import ActivationCheckpointing
from bertforge.checkpoint.sentence_transformers import (
    MODULES_FILE,
    SENTENCE_TRANSFORMERS_CONFIG_FILE,
    TRANSFORMER_CONFIG_FILE,
    chosen_prompt,
)
from bertforge.config import architectures_of
from bertforge.errors import ConfigError, InputError
from bertforge.inference.features import check_prompt
from bertforge.inference.onnx_backend import onnx_runtime_model, split_model_kwargs
from bertforge.inference.process_pool import PoolMethods
from bertforge.inference.text_encoder import (
    ModelCardData,
    check_construction_options,
    evaluate_as_sentence_transformers,
    fit_as_sentence_transformers,
)
from bertforge.json_config import read_json_object
from bertforge.progress import progress_bar
from bertforge.runtime import resolve_device
from bertforge.tasks import classification
from bertforge.tasks.data import forward_rows
from bertforge.validation import check_counts

# The activations a saved cross-encoder may name, by class; sentence-transformers writes the class's full path
# (torch.nn.modules.activation.Sigmoid) and also reads the short one (torch.nn.Sigmoid). Softmax is over the labels,
# where sentence-transformers' Softmax() finds that dimension by itself.
SCORE_ACTIVATIONS: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in (nn.Sigmoid, nn.Identity, nn.Tanh,
                                                                               nn.Softmax)}
# config.json's keys for the activation: sentence-transformers 4 and later, and before 4.
SETTINGS_KEY, OLD_ACTIVATION_KEY = "sentence_transformers", "sbert_ce_default_activation_function"
# The one module of sentence-transformers 6's CrossEncoder folder, and how it reads the classifier's scores.
CROSS_ENCODER_MODULES = [{"idx": 0, "name": "0", "path": "",
                          "type": "sentence_transformers.base.modules.transformer.Transformer"}]
CROSS_ENCODER_TRANSFORMER = {"transformer_task": "sequence-classification",
                             "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                             "module_output_name": "scores"}

# Keywords of earlier sentence-transformers releases that CrossEncoder still takes (with a FutureWarning), by their
# names now; None: no longer has an effect.
RENAMED_CONSTRUCTION_OPTIONS = {"model_name": "model_name_or_path", "automodel_args": "model_kwargs",
                                "tokenizer_args": "tokenizer_kwargs", "config_args": "config_kwargs",
                                "cache_dir": "cache_folder", "default_activation_function": "activation_fn"}
RENAMED_PREDICT_OPTIONS = {"activation_fct": "activation_fn", "num_workers": None}


def renamed_keywords(renamed: dict[str, str | None]) -> Callable:
    """A method that also takes the older names of its keywords, as sentence-transformers still does: each is
    passed on under its new name (unless that is given too), or dropped where it no longer has an effect."""
    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self, *args: Any, **options: Any) -> Any:
            for old, new in renamed.items():
                if old in options:
                    value = options.pop(old)
                    warnings.warn(f"CrossEncoder's {old!r} is " + (f"now {new!r}" if new else "no longer used"),
                                  FutureWarning, stacklevel=2)
                    if new is not None:
                        options.setdefault(new, value)
            return method(self, *args, **options)
        return call
    return wrap


def activation_path(activation: Callable) -> str:
    """The dotted name sentence-transformers saves for an activation: nn.Sigmoid() -> the class's full path."""
    kind = type(activation)
    if SCORE_ACTIVATIONS.get(kind.__name__) is not kind:
        raise ConfigError(f"activation_fn {activation!r} can't be saved: a saved cross-encoder names one of "
                          f"{', '.join(SCORE_ACTIVATIONS)}")
    return f"{kind.__module__}.{kind.__name__}"


def activation_from_path(path: Any, source: str) -> nn.Module:
    """The activation a saved dotted name stands for (full or short torch.nn path)."""
    name = str(path).rsplit(".", 1)[-1]
    kind = SCORE_ACTIVATIONS.get(name)
    if kind is None or path not in (f"{kind.__module__}.{name}", f"torch.nn.{name}"):
        raise ConfigError(f"{source}: activation_fn {path!r} is not supported; choose from "
                          f"{', '.join(f'torch.nn.{name}' for name in SCORE_ACTIVATIONS)}")
    return kind(dim=-1) if kind is nn.Softmax else kind()


def _cross_encoder_layout(directory: Path) -> dict[str, Any]:
    """What sentence-transformers 6's own CrossEncoder folder says ({} for any other folder): its
    config_sentence_transformers.json, with max_seq_length where its sentence_bert_config.json has one."""
    settings_path = directory / SENTENCE_TRANSFORMERS_CONFIG_FILE
    if not (directory / MODULES_FILE).is_file() or not settings_path.is_file():
        return {}
    settings = read_json_object(settings_path, "sentence-transformers config")
    # Another model type (an embedding model's folder) is converted by sentence-transformers, its settings unread.
    if settings.get("model_type") != "CrossEncoder":
        return {}
    transformer_path = directory / TRANSFORMER_CONFIG_FILE
    transformer = read_json_object(transformer_path, "sentence-transformers config") if \
        transformer_path.is_file() else {}
    return settings | {"max_seq_length": transformer.get("max_seq_length")}


class CrossEncoder(PoolMethods, ActivationCheckpointing, nn.Module):
    """A score (or one per label) per text pair, as sentence-transformers' CrossEncoder(name).predict(pairs). A
    module, as sentence-transformers' is: its parameters are the classifier's.

    >>> reranker = CrossEncoder("default")  # an untrained one-output head on MiniLM
    >>> reranker.predict([("How big is Berlin?", "Berlin has 3.5 million people."), ("A", "B")]).shape
    (2,)
    """

    model_card_data = ModelCardData("CrossEncoderModelCardData")

    @renamed_keywords(RENAMED_CONSTRUCTION_OPTIONS)
    def __init__(self, model_name_or_path: str | Path | nn.Module | None = None, num_labels: Any = None,
                 max_length: int | None = None, activation_fn: Callable | None = None,
                 device: str | torch.device | None = None, *, tokenizer: Any = None,
                 prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                 cache_folder: str | Path | None = None, revision: str | None = None,
                 model_kwargs: dict[str, Any] | None = None, tokenizer_kwargs: dict[str, Any] | None = None,
                 processor_kwargs: dict[str, Any] | None = None, config_kwargs: dict[str, Any] | None = None,
                 backend: str = "torch", **hub_options: Any):
        """CrossEncoder(name_or_path, num_labels=..., max_length=..., activation_fn=..., device=...) as
        sentence-transformers takes it: a model folder or "default" (None too; an encoder without a classifier gets
        a new one-output head, as there), model_kwargs for BertForSequenceClassification.from_pretrained,
        config_kwargs for config.json's fields, tokenizer_kwargs/processor_kwargs for the tokenizer; or a loaded
        BertForSequenceClassification and its tokenizer: CrossEncoder(model, tokenizer). The Hub's options (token,
        local_files_only, trust_remote_code, ...) are unused here. `prompts` (name -> text put before each pair's
        first text) join those of a sentence-transformers 6 folder, the given text winning."""
        from bertforge import BertForSequenceClassification, BertTokenizer
        from bertforge.checkpoint.hf_format import config_path

        super().__init__()
        if "classifier_dropout" in hub_options:  # sentence-transformers 4's keyword for config.json's field
            warnings.warn("CrossEncoder's 'classifier_dropout' is now config_kwargs={'classifier_dropout': ...}",
                          FutureWarning, stacklevel=2)
            config_kwargs = {"classifier_dropout": hub_options.pop("classifier_dropout")} | (config_kwargs or {})
        check_construction_options("CrossEncoder", hub_options, backend, prompts=prompts, model_kwargs=model_kwargs,
                                   tokenizer_kwargs=tokenizer_kwargs, processor_kwargs=processor_kwargs,
                                   config_kwargs=config_kwargs)
        model_kwargs, onnx_options = split_model_kwargs(backend, model_kwargs)
        cache_folder = sentence_transformers_cache(cache_folder)
        directory = None
        if activation_fn is not None and not callable(activation_fn):
            raise ConfigError(f"activation_fn must be a function of the logits such as torch.nn.Sigmoid(), got "
                              f"{activation_fn!r}")
        layout: dict[str, Any] = {}
        if isinstance(model_name_or_path, nn.Module):
            # CrossEncoder(model, tokenizer): the second argument is sentence-transformers' num_labels position.
            if tokenizer is None and num_labels is not None and not isinstance(num_labels, int):
                tokenizer, num_labels = num_labels, None
            if tokenizer is None:
                raise ConfigError("a loaded model needs its tokenizer: CrossEncoder(model, tokenizer)")
            if not isinstance(model_name_or_path, BertForSequenceClassification):
                raise ConfigError(f"CrossEncoder runs a BertForSequenceClassification, got "
                                  f"{type(model_name_or_path).__name__}")
            if num_labels is not None and num_labels != model_name_or_path.num_labels:
                raise ConfigError(f"num_labels={num_labels}: the loaded model has {model_name_or_path.num_labels}")
            model = model_name_or_path.to(device) if device is not None else model_name_or_path
        else:
            name_or_path = "default" if model_name_or_path is None else model_name_or_path
            if device is not None:  # named as the caller named it (loading calls it device_map)
                resolve_device(device)
            model_options = {"device_map": device} | model_kwargs  # model_kwargs' device_map wins, as there
            config_options = dict(config_kwargs or {}) | ({} if num_labels is None else {"num_labels": num_labels})
            directory = resolve_model_dir(name_or_path, model_options.get("subfolder", ""), cache_folder, revision)
            path = config_path(directory)
            architectures = architectures_of(read_json_object(path, "config"), path)
            if "num_labels" not in config_options and not any(
                    name.endswith("ForSequenceClassification") for name in architectures):
                # An encoder without a trained classifier: sentence-transformers gives it one output, a score.
                config_options["num_labels"] = 1
            model = BertForSequenceClassification.from_pretrained(name_or_path, cache_dir=cache_folder,
                                                                  revision=revision, **model_options,
                                                                  **config_options)
            tokenizer = BertTokenizer.from_pretrained(name_or_path, cache_dir=cache_folder, revision=revision,
                                                      **(tokenizer_kwargs or {}) | (processor_kwargs or {}))
            layout = _cross_encoder_layout(directory)
        if backend == "onnx":
            model = onnx_runtime_model(model.eval(), tokenizer, directory, **onnx_options)
        self.backend = backend
        self.model, self.tokenizer = model.eval(), tokenizer
        if hub_options.get("model_card_data") is not None:
            self.model_card_data = hub_options["model_card_data"]
        if max_length is None:
            max_length = layout.get("max_seq_length") or min(tokenizer.model_max_length,
                                                             model.config.max_position_embeddings)
        self.max_length = max_length
        self.activation_fn = self._saved_activation(layout) if activation_fn is None else activation_fn
        self.prompts: dict[str, str] = dict(layout.get("prompts") or {}) | dict(prompts or {})
        self.default_prompt_name = default_prompt_name or layout.get("default_prompt_name")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ConfigError(f"default_prompt_name {self.default_prompt_name!r} is none of the prompts "
                              f"{', '.join(map(repr, self.prompts)) or '(none)'}")

    def _saved_activation(self, layout: dict[str, Any]) -> Callable:
        """The activation as sentence-transformers picks it: the folder's own CrossEncoder settings, config.json's,
        else Sigmoid for one output (a probability) and Identity for several (the logits)."""
        if layout.get("activation_fn") is not None:
            return activation_from_path(layout["activation_fn"], SENTENCE_TRANSFORMERS_CONFIG_FILE)
        extra = self.config.extra
        settings = extra.get(SETTINGS_KEY)
        path = settings["activation_fn"] if isinstance(settings, dict) and "activation_fn" in settings else \
            extra.get(OLD_ACTIVATION_KEY)
        if path is not None:
            return activation_from_path(path, "config.json")
        return nn.Sigmoid() if self.num_labels == 1 else nn.Identity()

    @property
    def config(self):
        """The model's BertConfig."""
        return self.model.config

    @property
    def num_labels(self) -> int:
        """Outputs per pair: 1 for a score (rerankers, STS-B), the labels of a pair classifier (NLI's 3)."""
        return self.model.num_labels

    @property
    def max_length(self) -> int:
        """Tokens a pair is cut to (the longer text first), [CLS] and both [SEP] included; settable."""
        return self._max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        limit = self.model.config.max_position_embeddings
        if not isinstance(value, int) or isinstance(value, bool) or not 3 <= value <= limit:
            raise InputError(f"max_length must be a whole number from 3 to the model's {limit} positions, got "
                             f"{value!r}")
        self._max_length = value

    max_seq_length = max_length  # sentence-transformers 6's name

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def get_backend(self) -> str:
        return self.backend

    def save(self, path: str | Path, model_name: str | None = None, create_model_card: bool = True,
             train_datasets: list[str] | None = None, safe_serialization: bool = True) -> None:
        """A folder sentence-transformers' CrossEncoder (4 and later) and bertforge load as this one: the weights,
        config.json with the activation, the tokenizer with max_length, and sentence-transformers 6's layout with the
        activation and the prompts. No model card is written."""
        path = Path(path)
        activation = activation_path(self.activation_fn)
        config = self.model.config
        settings = config.extra.get(SETTINGS_KEY)
        self.model.config = dataclasses.replace(config, extra=config.extra | {
            SETTINGS_KEY: (settings if isinstance(settings, dict) else {}) | {"activation_fn": activation}})
        try:
            self.model.save_pretrained(path)
        finally:
            self.model.config = config
        self.tokenizer.save_pretrained(path, model_max_length=self.max_length)
        layout = _cross_encoder_layout(path)  # an earlier save's settings, which keep the keys not written here
        layout.pop("max_seq_length", None)  # sentence_bert_config.json's, below
        layout |= {"model_type": "CrossEncoder", "activation_fn": activation, "prompts": self.prompts,
                   "default_prompt_name": self.default_prompt_name}
        transformer = CROSS_ENCODER_TRANSFORMER | {"max_seq_length": self.max_length}
        for name, content in ((MODULES_FILE, CROSS_ENCODER_MODULES), (TRANSFORMER_CONFIG_FILE, transformer),
                              (SENTENCE_TRANSFORMERS_CONFIG_FILE, layout)):
            write_text_atomic(path / name, json.dumps(content, indent=2, sort_keys=True) + "\n")

    save_pretrained = save

    def _prompt(self, name: str | None, text: str | None) -> str:
        """What goes before each pair's first text, as sentence-transformers picks it: `text`, else the prompt
        called `name`, else the default prompt, else nothing."""
        check_prompt(text)
        return chosen_prompt(self.prompts, self.default_prompt_name, name, text, "the model")

    @renamed_keywords(RENAMED_PREDICT_OPTIONS)
    def predict(self, sentences: Any = None, prompt_name: str | None = None, prompt: str | None = None,
                batch_size: int = 32, show_progress_bar: bool | None = None,
                activation_fn: Callable | None = None, apply_softmax: bool = False, convert_to_numpy: bool = True,
                convert_to_tensor: bool = False,
                device: str | torch.device | Sequence[str | torch.device] | None = None,
                pool: dict[str, Any] | None = None, chunk_size: int | None = None, *, inputs: Any = None) -> Any:
        """CrossEncoder.predict: a (text, pair) tuple (or [text, pair]) gives a float32 scalar, or (num_labels,)
        scores; a list of them (n,) scores for one output, (n, num_labels) for several. `activation_fn` replaces
        the model's for this call; `apply_softmax` makes several outputs probabilities (after the activation).
        A numpy array, a tensor with `convert_to_tensor` (on the model's device), a list of tensors with
        neither. `prompt` (or the prompt called `prompt_name`, else the default one) goes before each first text.
        `pool` (from start_multi_process_pool), or a list of devices as `device`, shares the pairs between
        processes in chunks of `chunk_size` (inference/process_pool.py), with the same answer."""
        sentences = inputs if sentences is None else sentences
        pairs, single = _pairs(sentences)
        prompt = self._prompt(prompt_name, prompt)
        pairs = [(prompt + first, second) for first, second in pairs]
        check_counts(batch_size=batch_size)
        if activation_fn is not None and not callable(activation_fn):
            raise InputError(f"activation_fn must be a function of the logits such as torch.nn.Sigmoid(), got "
                             f"{activation_fn!r}")
        devices = self.place(device)
        if not pairs:  # as sentence-transformers answers no pairs
            return torch.tensor([]) if convert_to_tensor else np.array([]) if convert_to_numpy else []
        activation = self.activation_fn if activation_fn is None else activation_fn
        if pool is not None or devices is not None:
            logits = self.pooled("_logits", pairs, pool, devices, chunk_size, batch_size=batch_size,
                                 progress=False).to(self.device)
        else:
            logits = self._logits(pairs, batch_size, bool(show_progress_bar))
        scores = activation(logits)
        if self.num_labels == 1 and scores.dim() > 1:
            scores = scores.squeeze(-1)
        if apply_softmax and scores.dim() > 1:
            scores = scores.softmax(dim=1)
        if convert_to_tensor:
            answer = scores
        elif convert_to_numpy:
            answer = scores.float().cpu().numpy()
        else:
            answer = list(scores)
        return answer[0] if single else answer

    @torch.inference_mode()
    def _logits(self, pairs: list[tuple[str, str]], batch_size: int, progress: bool) -> torch.Tensor:
        """(pairs, num_labels) float32 logits on the model's device: each pair cut to max_length longest text
        first, run in length-sorted batches."""
        self.model.eval()
        encoded = self.tokenizer([first for first, _ in pairs], [second for _, second in pairs],
                                 truncation="longest_first", max_length=self.max_length)
        rows = [{"input_ids": ids, "token_type_ids": segments}
                for ids, segments in zip(encoded["input_ids"], encoded["token_type_ids"])]
        batches = length_sorted_batches([len(row["input_ids"]) for row in rows], batch_size)
        batches = progress_bar(batches, desc="Batches", unit="batch", enabled=progress)
        logits = torch.empty(len(rows), self.num_labels)
        for indices in batches:
            for i, (row_logits,) in zip(indices, forward_rows(self.model, [rows[i] for i in indices],
                                                                  classification.outputs)):
                logits[i] = row_logits[0]
        return logits.to(self.device)

    def smart_batching_collate(self, batch: Sequence[Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """sentence-transformers' collate of InputExample's (`.texts`: a pair, `.label`): the pairs as the model
        reads them (cut to max_length longest text first) and the labels (a float per pair for one output, a class
        id for several)."""
        pairs = [tuple(example.texts) for example in batch]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise InputError("a cross-encoder trains on InputExample's of two texts each")
        labels = torch.tensor([example.label for example in batch],
                              dtype=torch.float if self.num_labels == 1 else torch.long)
        return self._features(pairs), labels

    def _features(self, pairs: Sequence[tuple[str, str]]) -> dict[str, torch.Tensor]:
        """A batch of pairs as the model reads them: each cut to max_length (the longer text first), padded."""
        return dict(self.tokenizer([first for first, _ in pairs], [second for _, second in pairs], padding=True,
                                   truncation="longest_first", max_length=self.max_length, return_tensors="pt"))

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None) -> dict[str, torch.Tensor]:
        """sentence-transformers 6's preprocess: a list of (text, pair) tuples as the model reads them (`prompt`
        before each first text), padded, as tensors on the model's device: `ce.model(**features)`."""
        pairs, single = _pairs(inputs, "preprocess")
        if single:
            raise InputError("preprocess takes a list of (text, pair) tuples; wrap one pair in a list")
        if not pairs:
            return {}
        prefix = prompt or ""
        return {name: tensor.to(self.device)
                for name, tensor in self._features([(prefix + first, second) for first, second in pairs]).items()}

    def tokenize(self, texts: Sequence[Any], **options: Any) -> dict[str, torch.Tensor]:
        """sentence-transformers' name for preprocess before 6."""
        return self.preprocess(texts, **options)

    def evaluate(self, evaluator: Callable, output_path: str | Path | None = None) -> Any:
        """sentence-transformers' evaluate (its cross-encoder evaluators score this model as their own)."""
        return evaluate_as_sentence_transformers(self, evaluator, output_path)

    def get_max_seq_length(self) -> int:
        """sentence-transformers' older way to read max_seq_length."""
        return self.max_length

    @property
    def default_activation_function(self) -> Callable:
        """sentence-transformers' name for the activation the model's scores go through (activation_fn)."""
        return self.activation_fn

    def fit(self, train_dataloader: Any, evaluator: Callable | None = None, epochs: int = 1,
            loss_fct: Callable | None = None, activation_fct: Callable | None = None,
            output_path: str | Path | None = None, save_best_model: bool = True, **options: Any) -> None:
        """sentence-transformers' CrossEncoder.fit (before its Trainer): a DataLoader of InputExample's (a pair and
        its label), `loss_fct` of the (activated) logits and the labels (default: binary cross-entropy of the
        logits for one output, cross-entropy for several), on bertforge's training loop with AdamW and linear
        warm-up then decay; the best model by `evaluator` is saved to `output_path`."""
        loss_fct = loss_fct or (nn.BCEWithLogitsLoss() if self.num_labels == 1 else nn.CrossEntropyLoss())
        activation_fct = activation_fct or nn.Identity()

        def loss(model: nn.Module, batch: tuple[dict[str, torch.Tensor], torch.Tensor]) -> torch.Tensor:
            features, labels = batch
            logits = activation_fct(model(**features).logits)
            return loss_fct(logits.view(-1) if self.num_labels == 1 else logits, labels)

        fit_as_sentence_transformers(self, self.model, train_dataloader, loss, evaluator, output_path,
                                     save_best_model, epochs=epochs, **options)

    @renamed_keywords(RENAMED_PREDICT_OPTIONS)
    def rank(self, query: str, documents: Sequence[str], top_k: int | None = None, return_documents: bool = False,
             prompt_name: str | None = None, prompt: str | None = None, batch_size: int = 32,
             show_progress_bar: bool | None = None, activation_fn: Callable | None = None,
             device: str | torch.device | Sequence[str | torch.device] | None = None,
             pool: dict[str, Any] | None = None, chunk_size: int | None = None, *, apply_softmax: bool = False,
             convert_to_tensor: bool = False) -> list[dict[str, Any]]:
        """CrossEncoder.rank: [{"corpus_id", "score"[, "text"]}] of the documents, best first, the first `top_k`
        (all for None); scores are floats. One-output models only. apply_softmax and convert_to_tensor are
        accepted and change nothing, as in sentence-transformers 6."""
        if top_k is not None:  # a slice's negative or fractional end would drop documents or fail
            check_counts(top_k=top_k)
        if self.num_labels != 1:
            raise ConfigError(f"rank needs a model with one output (num_labels=1), this one has {self.num_labels}: "
                              f"use predict with (query, document) pairs")
        documents = list(documents) if isinstance(documents, Iterable) and not isinstance(documents, str) else None
        if not isinstance(query, str) or documents is None or not all(isinstance(text, str) for text in documents):
            raise InputError("rank takes a query text and a list of document texts")
        scores = self.predict([(query, document) for document in documents], prompt_name, prompt, batch_size,
                              show_progress_bar, activation_fn, convert_to_tensor=True, device=device, pool=pool,
                              chunk_size=chunk_size).tolist()
        results = [{"corpus_id": i, "score": score} | ({"text": documents[i]} if return_documents else {})
                   for i, score in enumerate(scores)]
        return sorted(results, key=lambda result: result["score"], reverse=True)[:top_k]


def _pairs(sentences: Any, call: str = "predict") -> tuple[list[tuple[str, str]], bool]:
    """(the pairs, whether one pair was given) of predict's input, told apart as sentence-transformers does: a
    tuple or list whose first item is a text is one pair."""
    if isinstance(sentences, np.ndarray):
        sentences = sentences.tolist()
    if not isinstance(sentences, list | tuple):
        raise InputError(f"{call} takes a (text, pair) tuple or a list of them, got {type(sentences).__name__}")
    single = bool(sentences) and not isinstance(sentences[0], list | tuple)
    pairs = [sentences] if single else list(sentences)
    for index, pair in enumerate(pairs):
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not all(isinstance(text, str) for text in pair):
            where = "" if single else f" (item {index})"
            raise InputError(f"{call} takes (text, pair) tuples of two strings, got {pair!r:.80}{where}")
    return [tuple(pair) for pair in pairs], single
