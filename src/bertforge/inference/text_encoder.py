"""What sentence-transformers' encoders share: TextEncoder, the base of SentenceEncoder (dense) and SparseEncoder
(SPLADE), which loads a checkpoint with its layout (prompts, max_seq_length, similarity function), puts prompts by
role, tokenizes, saves and compares what `encode` gives; and what the ColBERT and cross-encoders take from here too
(construction options, model-card data, sentence-transformers' own fit and evaluate)."""

from __future__ import annotations

import dataclasses
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from bertforge.checkpoint.default_model import HUB_OPTIONS, resolve_model_dir, sentence_transformers_cache
from bertforge.checkpoint.pretrained import ActivationCheckpointing
from bertforge.checkpoint.sentence_transformers import SentenceEmbedding, chosen_prompt
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.inference.features import (
    TextOrPair,
    check_prompt,
    embedding_texts,
    prompt_length,
    sentence_embedding,
    text_and_pair,
)
from bertforge.inference.onnx_backend import BACKENDS, onnx_runtime_model, split_model_kwargs
from bertforge.inference.sentence_modules import ModuleList, modules_of
from bertforge.inference.similarity import SIMILARITIES, as_matrices
from bertforge.runtime import resolve_device

# sentence-transformers 5 and later give every model these prompts, empty unless its configuration fills them.
ROLE_PROMPTS = {"query": "", "document": ""}


def check_construction_options(owner: str, hub_options: dict[str, Any], backend: str,
                               **option_dicts: dict[str, Any] | None) -> None:
    """sentence-transformers' constructor options beyond the named ones: the Hub's are accepted and unused here,
    others refused by name; a backend other than torch's and ONNX Runtime's is refused, and so is one of the
    `option_dicts` (model_kwargs, prompts, ...) given as anything but a dict. Checked before any loading."""
    unknown = sorted(set(hub_options) - HUB_OPTIONS - {"use_auth_token", "model_card_data"})
    if unknown:
        raise ConfigError(f"{owner} takes no option {unknown[0]!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}: {owner} runs {' or '.join(map(repr, BACKENDS))} (`bertforge export "
                          f"onnx` makes ONNX)")
    for name, value in option_dicts.items():
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{owner}: {name} must be a dict, got {value!r}")
    prompts = option_dicts.get("prompts")
    if prompts is not None:
        check_prompts(prompts)


def check_prompts(prompts: Any) -> None:
    """ConfigError unless `prompts` is a dict of prompt names to their texts."""
    if not isinstance(prompts, dict) or not all(isinstance(name, str) and isinstance(text, str)
                                                for name, text in prompts.items()):
        raise ConfigError(f"prompts must be a dict of prompt names to texts, got {prompts!r}")


@dataclasses.dataclass
class EvaluationRecord:
    """Where sentence-transformers' evaluators leave their results on a model (its `model_card_data`): each
    evaluator's latest metrics, by evaluator."""

    eval_results_dict: dict[Any, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def set_evaluation_metrics(self, evaluator: Any, metrics: dict[str, Any], epoch: int = 0, step: int = 0) -> None:
        self.eval_results_dict[evaluator] = dict(metrics)



# The prompts a query's and a document's text take, the first the model has, as sentence-transformers 5 picks them
# (encode_query, encode_document; the server's input_type).
ROLE_PROMPT_NAMES = {"query": ("query",), "document": ("document", "passage", "corpus")}


def role_prompt_name(names: Sequence[str], prompts: dict[str, str]) -> str | None:
    """The first of `names` that the model has a prompt of; None: none of them."""
    return next((name for name in names if name in prompts), None)


def role_prompt(role: str, prompts: dict[str, str]) -> str:
    """What encode_query ("query") or encode_document ("document") puts before each text, given the checkpoint's
    prompts (the role's own, which sentence-transformers makes empty where the checkpoint has none)."""
    named = ROLE_PROMPTS | prompts
    return named[role_prompt_name(ROLE_PROMPT_NAMES[role], named)]


class ModelCardData:
    """A model's `model_card_data`, where sentence-transformers' evaluators and trainer record what they did: an
    EvaluationRecord, or the card data sentence-transformers' own model of the same kind keeps (`class_name`: its
    trainer writes tags, losses, datasets and logs there) once sentence-transformers' code is loaded, the code that
    asks; bertforge never imports it. A card data object given (`model_card_data=`) is used as it is."""

    def __init__(self, class_name: str):
        self.class_name = class_name

    def __get__(self, owner: nn.Module | None, kind: type | None = None) -> Any:
        if owner is None:
            return self
        record = owner.__dict__.get("_model_card_data")
        library = sys.modules.get("sentence_transformers")
        card_class = getattr(library, self.class_name, None) if library is not None else None
        if card_class is not None and (record is None or isinstance(record, EvaluationRecord)):
            card = card_class()
            card.eval_results_dict.update(record.eval_results_dict if record is not None else {})
            self.__set__(owner, card)
            return card
        if record is None:
            record = owner.__dict__["_model_card_data"] = EvaluationRecord()
        return record

    def __set__(self, owner: nn.Module, card: Any) -> None:
        owner.__dict__["_model_card_data"] = card
        if hasattr(card, "register_model"):  # sentence-transformers' card data reads the model it describes
            card.register_model(owner)


class SentenceTransformersTraining:
    """fit and evaluate as sentence-transformers' encoders have them (dense, sparse and multi-vector): its losses
    and evaluators, on bertforge's training loop."""

    def fit(self, train_objectives: Sequence[tuple[Any, nn.Module]], evaluator: Callable | None = None,
            epochs: int = 1, steps_per_epoch: int | None = None, output_path: str | Path | None = None,
            save_best_model: bool = True, **options: Any) -> None:
        """sentence-transformers' fit (before its Trainer): a DataLoader of InputExample's and a
        sentence-transformers loss built on this encoder (a sparse one's SpladeLoss for SparseEncoder, a
        multi-vector one's MultiVectorMultipleNegativesRankingLoss for MultiVectorEncoder), trained as
        `fit_as_sentence_transformers` says; the best model by `evaluator` is saved to `output_path`. One
        objective."""
        if len(train_objectives) != 1:
            raise ConfigError(f"fit trains one (DataLoader, loss) objective here, got {len(train_objectives)}")
        if steps_per_epoch not in (None, 0):
            raise ConfigError("fit: steps_per_epoch is not supported here (bertforge trains whole epochs)")
        dataloader, loss_model = train_objectives[0]
        fit_as_sentence_transformers(self, loss_model, dataloader, lambda model, batch: summed(model(*batch)),
                                     evaluator, output_path, save_best_model, epochs=epochs, **options)

    def evaluate(self, evaluator: Callable, output_path: str | Path | None = None) -> Any:
        """sentence-transformers' evaluate (its evaluators score this model as their own)."""
        return evaluate_as_sentence_transformers(self, evaluator, output_path)


Encoder = TypeVar("Encoder", bound="TextEncoder")


class TextEncoder(ModuleList, SentenceTransformersTraining, ActivationCheckpointing, nn.Module):
    """What sentence-transformers' dense and sparse encoders share: loading a checkpoint with its layout (prompts,
    max_seq_length, similarity function), tokenizing, prompts by role, saving, and comparing what `encode` gives.
    SentenceEncoder and SparseEncoder (inference/sparse_encoder.py) say how texts become vectors."""

    SUPPORTED_SIMILARITY_FN_NAMES = tuple(SIMILARITIES)
    model_card_data = ModelCardData("SentenceTransformerModelCardData")
    DEFAULT_SIMILARITY = "cosine"  # similarity_fn_name when the checkpoint names none

    def __init__(self, model_name_or_path: str | Path | nn.Module | None = None, tokenizer: Any = None, *,
                 device: str | torch.device | None = None, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, similarity_fn_name: str | None = None,
                 cache_folder: str | Path | None = None, revision: str | None = None,
                 model_kwargs: dict[str, Any] | None = None, tokenizer_kwargs: dict[str, Any] | None = None,
                 processor_kwargs: dict[str, Any] | None = None, config_kwargs: dict[str, Any] | None = None,
                 backend: str = "torch", **hub_options: Any):
        """The constructor as sentence-transformers 6 takes it: a model folder or "default" (None too), its options
        by the same names (model_kwargs for the model's from_pretrained, tokenizer_kwargs/processor_kwargs for the
        tokenizer, config_kwargs for config.json's fields); or a loaded model and its `tokenizer`. Prompts given
        join the checkpoint's (the given text wins); the Hub's options (token, local_files_only,
        trust_remote_code, ...) are unused here."""
        from bertforge import BertTokenizer

        super().__init__()
        owner = type(self).__name__
        check_construction_options(owner, hub_options, backend, prompts=prompts, model_kwargs=model_kwargs,
                                   tokenizer_kwargs=tokenizer_kwargs, processor_kwargs=processor_kwargs,
                                   config_kwargs=config_kwargs)
        model_options, onnx_options = split_model_kwargs(backend, model_kwargs)
        folder = None
        if isinstance(model_name_or_path, nn.Module):
            if tokenizer is None:
                raise ConfigError(f"a loaded model needs its tokenizer: {owner}(model, tokenizer)")
            model = model_name_or_path.to(device) if device is not None else model_name_or_path
        else:
            place = {"cache_dir": sentence_transformers_cache(cache_folder), "revision": revision}
            name_or_path = "default" if model_name_or_path is None else model_name_or_path
            if device is not None:  # named as the caller named it (loading calls it device_map)
                resolve_device(device)
            model = self.load_model(name_or_path, device_map=device, **place, **model_options, **(config_kwargs or {}))
            tokenizer = BertTokenizer.from_pretrained(name_or_path, **place, **(tokenizer_kwargs or {}),
                                                      **(processor_kwargs or {}))
            folder = resolve_model_dir(name_or_path, **place)
        if backend == "onnx":
            model = onnx_runtime_model(model.eval(), tokenizer, folder, **onnx_options)
        self.backend = backend
        self.model, self.tokenizer = model.eval(), tokenizer
        if hub_options.get("model_card_data") is not None:
            self.model_card_data = hub_options["model_card_data"]
        self.check_layout()
        tokenizer_options = (tokenizer_kwargs or {}) | (processor_kwargs or {})
        if "model_max_length" in tokenizer_options:  # sentence-transformers 6: max_seq_length
            self.max_seq_length = tokenizer_options["model_max_length"]
        # sentence-transformers 5 and later give every model "query" and "document" prompts, empty where neither the
        # checkpoint nor `prompts` fills them (saved so); assigning `prompts` afterwards replaces them all
        self._change(prompts=ROLE_PROMPTS | self.settings.prompts | (prompts or {}))
        if default_prompt_name:
            self.default_prompt_name = default_prompt_name
        if similarity_fn_name is not None:
            self.similarity_fn_name = similarity_fn_name

    @classmethod
    def load_model(cls, name_or_path: str | Path, **options: Any) -> nn.Module:
        """The model this encoder reads, from a folder or "default" (`options`: its from_pretrained's)."""
        raise NotImplementedError

    def check_layout(self) -> None:
        """Refuse a checkpoint whose sentence-transformers layout is the other kind of encoder's."""

    @classmethod
    def from_pretrained(cls: type[Encoder], name_or_path: str | Path = "default",
                        device: str | torch.device | None = None, **model_options: Any) -> Encoder:
        """The encoder and tokenizer of a model directory (or "default"), on `device` (default: the CPU);
        `model_options` are the model's from_pretrained's (dtype, ...)."""
        return cls(name_or_path, device=device, model_kwargs=model_options)

    @property
    def settings(self) -> SentenceEmbedding:
        """How texts become vectors: the checkpoint's sentence-transformers layout as this encoder changed it."""
        return sentence_embedding(self.model)

    def _change(self, **fields: Any) -> None:
        self.model.sentence_embedding = dataclasses.replace(self.settings, **fields)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_seq_length(self) -> int:
        """Tokens a text is cut to, [CLS] and [SEP] included; settable, as SentenceTransformer's."""
        return self.settings.max_length or min(self.tokenizer.model_max_length,
                                               self.model.config.max_position_embeddings)

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not \
                3 <= value <= self.model.config.max_position_embeddings:
            raise InputError(f"max_seq_length must be a whole number from 3 to the model's "
                             f"{self.model.config.max_position_embeddings} positions, got {value!r}")
        self._change(max_length=value)

    @property
    def prompts(self) -> dict[str, str]:
        """Prompt name -> the text put before each text: the checkpoint's, with "query" and "document" (empty)
        where it has none of those names; settable, as SentenceTransformer's (the new prompts replace the old,
        role prompts included, so encode_document then takes "passage" or "corpus" where those are given)."""
        return self.settings.prompts

    @prompts.setter
    def prompts(self, value: dict[str, str]) -> None:
        check_prompts(value)
        self._change(prompts=dict(value))

    @property
    def default_prompt_name(self) -> str | None:
        """The prompt encode puts before each text when the call names none; settable (None: no prompt)."""
        return self.settings.default_prompt_name

    @default_prompt_name.setter
    def default_prompt_name(self, name: str | None) -> None:
        if name is not None and name not in self.prompts:
            raise ConfigError(f"default_prompt_name {name!r} is none of the prompts "
                              f"{', '.join(map(repr, self.prompts))}")
        # "query" or "document" where the checkpoint has neither becomes one of its prompts (empty), as encode
        # and a save read the checkpoint's own
        named = {} if name is None else {name: self.prompts[name]}
        self._change(prompts=named | self.settings.prompts, default_prompt_name=name)

    @property
    def similarity_fn_name(self) -> str:
        """cosine, dot, euclidean or manhattan: the checkpoint's (else DEFAULT_SIMILARITY), unless set; `similarity`
        compares with it."""
        return self.settings.similarity_fn_name or self.DEFAULT_SIMILARITY

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str | None) -> None:
        if value is None:  # the default again, as sentence-transformers reads None
            self._change(similarity_fn_name=None)
            return
        name = str(getattr(value, "value", value))  # a name, or sentence-transformers' enum
        check_choice(name, SIMILARITIES, "similarity_fn_name", error=InputError)
        self._change(similarity_fn_name=name)

    def save(self, path: str | Path, model_name: str | None = None, create_model_card: bool = True,
             train_datasets: list[str] | None = None, safe_serialization: bool = True) -> None:
        """A folder sentence-transformers (and bertforge) loads as this encoder: the weights, the tokenizer and the
        layout with this encoder's max_seq_length, prompts and similarity function. No model card is written."""
        self._change(similarity_fn_name=self.similarity_fn_name, max_length=self.max_seq_length)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    save_pretrained = save

    def tokenize(self, texts: Sequence[str] | Sequence[tuple[str, str]]) -> dict[str, Any]:
        """A padded batch of texts (or (text, pair) tuples) as the model reads them: stripped, lower-cased where
        the layout says so, cut to max_seq_length; tensors in a BatchEncoding (`.to(device)`) with the modality,
        as sentence-transformers 6 gives them. No texts: an empty dict."""
        if not len(texts):
            return {}
        pairs = [tuple(text) if isinstance(text, tuple | list) else (text,) for text in texts]
        if any(len(pair) not in (1, 2) or not all(isinstance(t, str) for t in pair) for pair in pairs):
            raise InputError("tokenize takes a list of texts or of (text, pair) tuples")
        columns = [embedding_texts([t.strip() for t in column], self.settings) for column in zip(*pairs)] \
            if len({len(pair) for pair in pairs}) == 1 else None
        if columns is None:
            raise InputError("tokenize takes texts or (text, pair) tuples, not both in one list")
        features = self.tokenizer(*columns, padding=True, truncation=True, max_length=self.max_seq_length,
                                  return_tensors="pt")
        features["modality"] = "text"
        return features

    def preprocess(self, inputs: Sequence[str] | Sequence[tuple[str, str]], prompt: str | None = None,
                   task: str | None = None) -> dict[str, torch.Tensor]:
        """sentence-transformers 6's name for tokenize; `prompt` goes before each text (a pair's first), and where
        the layout pools without it, `prompt_length` says how many first tokens to leave out. `task` names a
        Router's route, which a dense encoder has none of."""
        if not inputs:
            return {}
        if prompt:
            inputs = [(prompt + item[0], *item[1:]) if isinstance(item, tuple | list) else prompt + item
                      for item in inputs]
        features = self.tokenize(inputs)
        left_out = prompt_length(self.tokenizer, self.settings, prompt or "")
        if left_out:
            features["prompt_length"] = left_out
        return features

    def module_views(self) -> list[Any]:
        """sentence-transformers' list of modules (inference/sentence_modules.py): model[0], model[1], ..."""
        return modules_of(self)

    def _prompt(self, name: str | None, text: str | None) -> str | None:
        """The prompt's text as sentence-transformers picks it: `text`, else the named prompt (the empty role
        prompts included); None: extract_features puts the checkpoint's default prompt, if any."""
        check_prompt(text)
        if text is not None or name is None:
            return text
        return chosen_prompt(self.prompts, None, name, None, "the model")

    def encode_query(self, sentences: str | Sequence[str], **options: Any) -> Any:
        """encode with the "query" prompt (the checkpoint's, else none), as sentence-transformers 5."""
        return self.encode(sentences, **self._role_prompt(ROLE_PROMPT_NAMES["query"], options))

    def encode_document(self, sentences: str | Sequence[str], **options: Any) -> Any:
        """encode with the first of the "document", "passage" and "corpus" prompts, as sentence-transformers 5
        (which gives every model a "document" prompt, empty unless the checkpoint fills it)."""
        return self.encode(sentences, **self._role_prompt(ROLE_PROMPT_NAMES["document"], options))

    def _role_prompt(self, names: tuple[str, ...], options: dict[str, Any]) -> dict[str, Any]:
        if "prompt_name" not in options and "prompt" not in options:
            options["prompt_name"] = role_prompt_name(names, self.prompts)
        return options

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """(n, m) similarities of two sets of vectors (arrays, tensors, lists of vectors, or one vector each) by
        similarity_fn_name."""
        first, second = as_matrices(embeddings1, embeddings2)
        return SIMILARITIES[self.similarity_fn_name].table(first, second)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """(n,) similarities of the i-th vector of one set with the i-th of the other; of two single vectors, one
        (a 0-dimensional tensor)."""
        first, second = as_matrices(embeddings1, embeddings2)
        if first.shape != second.shape:
            raise InputError(f"similarity_pairwise needs two sets of the same shape, got {tuple(first.shape)} and "
                             f"{tuple(second.shape)}")
        scores = SIMILARITIES[self.similarity_fn_name].pairwise(first, second)
        return scores[0] if all(map(is_one_vector, (embeddings1, embeddings2))) else scores

    def smart_batching_collate(self, batch: Sequence[Any]) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        """sentence-transformers' collate of InputExample's (`.texts`, `.label`): one tokenized batch per text
        position, and the labels."""
        texts = [example.texts for example in batch]
        if not texts or len({len(row) for row in texts}) != 1:
            raise InputError("every example of a batch needs the same number of texts")
        labels = [example.label for example in batch]
        labels = torch.from_numpy(np.stack(labels)) if isinstance(labels[0], np.ndarray) else torch.tensor(labels)
        return [self.tokenize(list(column)) for column in zip(*texts)], labels


def encode_inputs(inputs: Any) -> str | list[TextOrPair]:
    """What encode takes, as a text or a list of texts and (text, pair)s: those, a column of texts (a numpy array
    or a pandas Series, as sentence-transformers reads them), and sentence-transformers 6's inputs by modality,
    {"text": ...}, one or a list, of which a text model reads text."""
    if isinstance(inputs, np.ndarray) and inputs.ndim == 1 or type(inputs).__name__ == "Series":
        inputs = inputs.tolist()
    if isinstance(inputs, Mapping) and set(inputs) == {"text"}:
        inputs = inputs["text"]
    elif isinstance(inputs, list | tuple) and inputs and all(
            isinstance(item, Mapping) and set(item) == {"text"} for item in inputs):
        inputs = [item["text"] for item in inputs]
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and all(isinstance(text, str) for text in inputs)):
        return inputs if isinstance(inputs, str) else list(inputs)
    if isinstance(inputs, list) and inputs:  # texts and (text, pair)s, as sentence-transformers' encode reads them
        for item in inputs:
            text_and_pair(item)
        return inputs
    raise InputError(f"encode takes a text, a list of texts or (text, pair)s, or {{\"text\": ...}} inputs, got "
                     f"{type(inputs).__name__}{' holding other things' if isinstance(inputs, Sequence) else ''}")


def is_one_vector(embeddings: Any) -> bool:
    """Whether similarity_pairwise was given one vector (a 1-D tensor or array, or a list of numbers) rather than a
    set of them (which may be a list of sparse tensors, that numpy can't read)."""
    if isinstance(embeddings, torch.Tensor | np.ndarray):
        return embeddings.ndim == 1
    return isinstance(embeddings, list | tuple) and len(embeddings) > 0 and all(
        isinstance(value, numbers.Real) for value in embeddings)


def summed(loss: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """A loss, or the sum of the named parts a loss gives (SpladeLoss: the ranking loss and its regularizers), as
    sentence-transformers' trainer adds them."""
    return sum(loss.values()) if isinstance(loss, dict) else loss


def evaluate_as_sentence_transformers(model: nn.Module, evaluator: Callable, output_path: str | Path | None) -> Any:
    """sentence-transformers' evaluate, for SentenceEncoder and CrossEncoder: `evaluator(model, output_path)`, the
    folder made first."""
    if output_path is not None:
        Path(output_path).mkdir(parents=True, exist_ok=True)
    return evaluator(model, None if output_path is None else str(output_path))


# sentence-transformers' fit schedulers by their lower-cased names -> (bertforge's, of optim.LR_SCHEDULES;
# whether it warms up: ConstantLR ignores warmup_steps)
FIT_SCHEDULERS = {"warmuplinear": ("linear", True), "warmupcosine": ("cosine", True),
                  "warmupconstant": ("constant", True), "constantlr": ("constant", False)}


def fit_as_sentence_transformers(owner: nn.Module, trained: nn.Module, dataloader: Any,
                                 loss_fn: Callable[[nn.Module, Any], torch.Tensor], evaluator: Callable | None,
                                 output_path: str | Path | None, save_best_model: bool, epochs: int = 1,
                                 scheduler: str = "WarmupLinear",
                                 warmup_steps: int = 10000, optimizer_class: type = torch.optim.AdamW,
                                 optimizer_params: dict[str, Any] | None = None, weight_decay: float = 0.01,
                                 evaluation_steps: int = 0, max_grad_norm: float = 1, use_amp: bool = False,
                                 callback: Callable | None = None, show_progress_bar: bool = True,
                                 **unused: Any) -> None:
    """sentence-transformers' fit options (SentenceEncoder's and CrossEncoder's) on bertforge's training loop:
    `trained` (the module holding the parameters) by `loss_fn` on the batches of `dataloader` (collated by
    `owner.smart_batching_collate`), AdamW with the `scheduler` (FIT_SCHEDULERS); a sentence-transformers
    `evaluator` scores `owner` after every epoch (or every `evaluation_steps`) and the best by its primary metric
    is saved to `output_path` (with `save_best_model`). Other optimizers, schedules, callbacks and checkpoints are
    refused by name; `owner` ends in eval mode."""
    from bertforge.training.trainer import TrainConfig, Trainer

    refused = {"scheduler": scheduler.lower() not in FIT_SCHEDULERS, "optimizer_class": optimizer_class
               is not torch.optim.AdamW, "callback": callback is not None,
               **{name: value not in (None, False, 0) for name, value in unused.items()}}
    if any(refused.values()):
        raise ConfigError(f"fit: {next(name for name, no in refused.items() if no)} is not supported here "
                          f"(bertforge trains with AdamW, the schedules WarmupLinear, WarmupCosine, WarmupConstant and "
                          f"ConstantLR, whole epochs)")
    params = {"lr": 2e-5, **(optimizer_params or {})}
    if set(params) - {"lr", "eps", "betas"}:
        raise ConfigError(f"fit: optimizer_params {sorted(set(params) - {'lr', 'eps', 'betas'})[0]!r} is not "
                          f"supported here (lr, eps, betas)")
    schedule, warms_up = FIT_SCHEDULERS[scheduler.lower()]
    config = TrainConfig(lr=params["lr"], eps=params.get("eps", 1e-8), betas=params.get("betas", (0.9, 0.999)),
                         weight_decay=weight_decay, lr_schedule=schedule,
                         warmup_steps=warmup_steps if warms_up else 0, epochs=epochs,
                         max_grad_norm=max_grad_norm or None, eval_every=evaluation_steps or None, bf16=use_amp,
                         progress=show_progress_bar, device=str(next(owner.parameters()).device))

    def evaluate(_) -> dict[str, float]:  # an evaluator names its primary metric once it has run
        metrics = evaluator(owner)
        return metrics | {"primary_metric": metrics[evaluator.primary_metric]}

    dataloader.collate_fn = owner.smart_batching_collate
    save = None if output_path is None or not save_best_model else (lambda _: owner.save(output_path))
    Trainer(trained, config, dataloader, evaluate=None if evaluator is None else evaluate,
            main_metric=None if evaluator is None else "primary_metric",
            greater_is_better=getattr(evaluator, "greater_is_better", True), save=save, loss_fn=loss_fn).train()
    owner.eval()
