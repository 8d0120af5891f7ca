"""from_pretrained / save_pretrained for every bertforge model, through the key table and strict checks."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from bertforge.checkpoint.adapters import is_adapter_folder, load_adapter_folder
from bertforge.checkpoint.default_model import HUB_OPTIONS, resolve_model_dir
from bertforge.checkpoint.hf_format import CONFIG_FILE, config_path, read_state_dict, write_state_dict
from bertforge.checkpoint.key_map import ENCODER_PREFIX, IGNORED_HF_KEYS, TIED_HF_KEYS, from_hf, to_hf
from bertforge.checkpoint.sentence_transformers import (
    TRANSFORMER_CONFIG_FILE,
    read_dense_layers,
    read_sentence_embedding,
    saved_loading_options,
    usable_options,
    write_sentence_embedding,
)
from bertforge.config import BertConfig, bert_config, dtype_name, is_config_key
from bertforge.errors import CheckpointError, ConfigError, check_choice

logger = logging.getLogger("bertforge")

# Encoder tensors a checkpoint must not carry beyond what the model has (that means config.json is wrong);
# the pooler is not among them, since models that read every token are built without one.
ENCODER_MODULES = ("embeddings.", "encoder.")


@dataclass
class LoadReport:
    """What a checkpoint load did besides the one-to-one copy."""

    skipped: list[str] = field(default_factory=list)  # checkpoint tensors this model has no place for
    initialised: list[str] = field(default_factory=list)  # model parameters the checkpoint lacked (or mismatched)
    # heads of another size left to their fresh initialisation: (name, the checkpoint's shape, the model's)
    mismatched: list[tuple[str, torch.Size, torch.Size]] = field(default_factory=list)

    def log(self, source: Path) -> None:
        """Say what was skipped (info) and what kept its fresh initialisation (warning)."""
        if self.skipped:
            logger.info("%s: skipped %d tensors this model does not use: %s", source, len(self.skipped),
                        ", ".join(self.skipped))
        if self.initialised:
            logger.warning("%s: newly initialised (not in the checkpoint): %s", source, ", ".join(self.initialised))


# The attention kernels transformers lets a caller pick; bertforge's attention is one, which computes the same.
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def placement(device_map: Any) -> torch.device | None:
    """transformers' device_map for a model on one device: a device ("cuda:0", 0, torch.device), {"": device}, or
    "auto" (the GPU if there is one, else the CPU); None: stay on the CPU."""
    if device_map is None:
        return None
    if isinstance(device_map, dict):
        if set(device_map) != {""}:
            raise ConfigError(f"device_map {device_map!r}: bertforge places a model on one device; give a device "
                              f"or {{'': device}}")
        device_map = device_map[""]
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device("cuda", device_map) if isinstance(device_map, int) else torch.device(device_map)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device_map {device_map!r} is not a device (e.g. 'cpu', 'cuda:0', 'auto')") from None
    try:  # a device this machine lacks (a CUDA build without a GPU, a CPU-only build) fails here, in one line
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
        raise ConfigError(f"device_map {device_map!r}: this machine can't place a model there ({reason})") from None
    return device


def given_config(config: Any) -> BertConfig:
    """from_pretrained's `config`: a config object (bertforge's or transformers'), or where to read one."""
    if isinstance(config, str | Path):
        path = Path(config)
        return BertConfig.load(config_path(resolve_model_dir(path)) if not path.is_file() else path)
    return bert_config(config)


def _without_encoder_prefix(name: str) -> str:
    return name.removeprefix(ENCODER_PREFIX)


def load_hf_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
                       initialisable: tuple[str, ...] = (), ignore_mismatched_heads: bool = False) -> LoadReport:
    """Copy Hugging Face-named tensors into `model`, strictly (see matched_state)."""
    loaded, report = matched_state(model, state, source, initialisable, ignore_mismatched_heads)
    model.load_state_dict({**model.state_dict(), **loaded})
    return report


def matched_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
                  initialisable: tuple[str, ...] = (), ignore_mismatched_heads: bool = False
                  ) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """Hugging Face-named tensors in `model`'s names, strictly, and what else a load of them does.

    Encoder names match with or without the `bert.` prefix, so a task checkpoint loads into the bare encoder
    (its heads are skipped) and an encoder checkpoint into a task model (parameters under `initialisable`,
    its new heads, keep their fresh initialisation). With `ignore_mismatched_heads`, a head of another size (a
    classifier of 2 labels loaded for 3) is a new head too. Anything else missing, left over or misshapen is an
    error.
    """
    current = model.state_dict()
    by_key = {_without_encoder_prefix(name): name for name in current}
    loaded, report = {}, LoadReport()
    state = _resolve_tied_copies(state, source, {to_hf(name) for name in current})
    for hf_name, tensor in state.items():
        if IGNORED_HF_KEYS.search(hf_name):
            continue
        key = _without_encoder_prefix(from_hf(hf_name))
        if key not in by_key:
            if key.startswith(ENCODER_MODULES):
                raise CheckpointError(f"{source}: tensor {hf_name!r} has no place in this model "
                                      f"(does config.json match the weights?)")
            report.skipped.append(hf_name)
            continue
        name = by_key[key]
        if tensor.shape != current[name].shape and ignore_mismatched_heads and key.startswith(initialisable):
            report.mismatched.append((hf_name, tensor.shape, current[name].shape))
            continue  # left to its fresh initialisation, and reported so
        if tensor.shape != current[name].shape:
            raise CheckpointError(f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                                  f"the model expects {tuple(current[name].shape)}")
        loaded[name] = tensor
    for name in current:
        if name not in loaded:
            if not _without_encoder_prefix(name).startswith(initialisable):
                raise CheckpointError(f"{source}: missing tensor {to_hf(name)!r}")
            report.initialised.append(to_hf(name))
    return loaded, report


def built_and_loaded(model: torch.nn.Module, build: Callable[[], torch.nn.Module], state: dict[str, torch.Tensor],
                     source: Path, initialisable: tuple[str, ...], ignore_mismatched_heads: bool
                     ) -> tuple[torch.nn.Module, LoadReport]:
    """The model `build` makes, holding the checkpoint's `state`; `model` is one it made on the meta device.

    A new model's random initialisation is most of a load's time (0.22 of MiniLM's 0.26 s), all of it overwritten
    when the checkpoint holds every tensor: so the model is first built on the meta device (shapes, no numbers),
    and where nothing is left new it gets uninitialised memory that the checkpoint fills. A checkpoint that leaves
    a head new gets the model built and initialised in full, so a seed gives that head what it always gave."""
    loaded, report = matched_state(model, state, source, initialisable, ignore_mismatched_heads)
    if report.initialised:
        model = build()
    else:
        shared = distinct_tensors(model)
        # Module.to_empty's empty_like of a meta tensor runs torch's Python reference code (0.45 s of imports
        # at first use); a new tensor of the same shape is the same memory without it.
        model._apply(lambda tensor: torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu"))
        if distinct_tensors(model) != shared:  # a tensor two modules shared came apart
            model = build()
    model.load_state_dict({**model.state_dict(), **loaded})
    return model, report


# torch.nn.init's initialisers, which the modules' constructors call (nn.Linear's, nn.Embedding's, BERT's own)
INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


@contextmanager
def shapes_only() -> Iterator[None]:
    """Modules built here get tensors on the meta device (shapes, no memory, no numbers), and torch.nn.init leaves
    meta tensors as they are: drawing "numbers" for one runs torch's Python reference code, whose first use in a
    process costs about 0.7 s of imports, for numbers that do not exist. Other tensors, in other threads too, are
    initialised as ever."""
    originals = {name: getattr(torch.nn.init, name) for name in INITIALISERS if hasattr(torch.nn.init, name)}

    def real_only(initialise: Callable) -> Callable:
        @functools.wraps(initialise)
        def initialise_real(tensor: torch.Tensor, *args, **kwargs):
            return tensor if tensor.is_meta else initialise(tensor, *args, **kwargs)
        return initialise_real

    for name, initialise in originals.items():
        setattr(torch.nn.init, name, real_only(initialise))
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, initialise in originals.items():
            setattr(torch.nn.init, name, initialise)


def distinct_tensors(model: torch.nn.Module) -> int:
    """How many distinct parameters and buffers `model` holds (a tensor shared by two modules counts once)."""
    return len({id(tensor) for tensor in (*model.parameters(), *model.buffers())})


def _resolve_tied_copies(state: dict[str, torch.Tensor], source: Path | str, model_names: set[str]
                         ) -> dict[str, torch.Tensor]:
    """Drop the extra copies of tied tensors (the masked-LM decoder is the word-embedding matrix), after
    checking that they are copies; a copy whose original is absent stands in for it. A model with a place for
    the copy (an untied decoder) takes it as it is; a model without that head skips it like the head's others."""
    state = dict(state)
    for copy, original in TIED_HF_KEYS.items():
        if copy not in state or copy in model_names:
            continue
        tensor = state.pop(copy)
        # An untied decoder of the model's own: transformers 5 adds its own bias (the decoder's), so that is the
        # output bias; transformers 4 made the two one tensor.
        untied = copy.rsplit(".", 1)[0] + ".weight" in model_names
        if original not in state or untied:
            state[original] = tensor
        elif not torch.equal(tensor, state[original]):
            head = copy.rsplit(".", 2)[0]
            if any(name.startswith(head + ".") for name in model_names):
                raise CheckpointError(f"{source}: {copy!r} differs from {original!r} (an untied decoder), but "
                                      f"config.json does not set tie_word_embeddings to false")
            state[copy] = tensor
    return state


def in_our_names(state: Mapping[str, torch.Tensor], model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
    """A state dict in transformers' names (a transformers model's state_dict(), torch.load of a
    pytorch_model.bin) in `model`'s names, through the key map; one in ours as it is (with its metadata)."""
    if all(from_hf(name) == name and not IGNORED_HF_KEYS.search(name) and name not in TIED_HF_KEYS
           for name in state):
        return state
    state = _resolve_tied_copies(dict(state), "the state dict", {to_hf(name) for name in model.state_dict()})
    return {from_hf(name): tensor for name, tensor in state.items() if not IGNORED_HF_KEYS.search(name)}


# Where an encoder keeps its sentence-transformers layout's Dense layers (inference/features.py's Dense): tensors of
# the layout, which save_pretrained writes in their own folders, not in the BERT checkpoint.
DENSE_PREFIX = "sentence_dense."


# sentence-transformers' saved model options read as from_pretrained's own; the rest are config overrides, as
# transformers takes them (a saved device_map is the saving machine's, not this one's)
SAVED_MODEL_OPTIONS = frozenset({"dtype", "torch_dtype", "attn_implementation", "device_map"})
CONSTRUCTOR_KEYS = frozenset({"add_pooling_layer"})  # options of a model's constructor, as transformers takes them


class ActivationCheckpointing:
    """transformers' gradient (activation) checkpointing switches, for any module holding BERT encoders: a bertforge
    model, or an encoder of sentence-transformers' kinds (whose trainer calls them when its arguments ask)."""

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1,
                                      offload: bool = False) -> None:
        """Recompute each encoder layer's activations in the backward pass instead of keeping them (training
        only): far less memory for long sequences and large models, for about a third more compute.
        `every_n_layers`: only every n-th layer (the first, the n+1-th, ...) recomputes, the others keep theirs (less
        memory saved, less compute spent); `offload`: on an accelerator, what recomputation starts from waits in
        pinned host memory. `gradient_checkpointing_kwargs` is accepted for transformers' callers; bertforge always
        recomputes non-reentrantly (use_reentrant=False), which needs no input to require gradients."""
        set_gradient_checkpointing(self, True, every_n_layers, offload)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None,
                                        every_n_layers: int = 1, offload: bool = False) -> None:
        """transformers 5's name for gradient_checkpointing_enable (what its Trainer calls)."""
        set_gradient_checkpointing(self, True, every_n_layers, offload)

    def gradient_checkpointing_disable(self) -> None:
        set_gradient_checkpointing(self, False)

    activation_checkpointing_disable = gradient_checkpointing_disable
    supports_gradient_checkpointing = True

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(encoder.gradient_checkpointing for encoder in encoders_of(self))

    is_activation_checkpointing = is_gradient_checkpointing


Model = TypeVar("Model", bound="Pretrained")


class Pretrained(ActivationCheckpointing):
    """Mixin for models built from a BertConfig: load and save the ecosystem's checkpoint directory."""

    # Parameter prefixes (without `bert.`) that may be absent from a checkpoint and keep their initialisation:
    # the pooler, because masked-LM-only checkpoints have none.
    initialisable: tuple[str, ...] = ("pooler.",)

    @classmethod
    def from_pretrained(cls: type[Model], name_or_path: str | Path, require_heads: bool = False,
                        ignore_mismatched_sizes: bool = False, dtype: torch.dtype | str | None = None,
                        torch_dtype: torch.dtype | str | None = None, device_map: Any = None,
                        attn_implementation: str | None = None, output_loading_info: bool = False,
                        subfolder: str = "", cache_dir: str | Path | None = None, revision: str | None = None,
                        config: Any = None, variant: str | None = None, use_safetensors: bool | None = None,
                        **config_overrides) -> Model:
        """Load from a checkpoint directory or "default"; keyword arguments override config.json fields.

        transformers' loading options work as there: `device_map` ("cpu", "cuda:0", "auto", {"": device}: one
        device), `output_loading_info` (also returns {"missing_keys", "unexpected_keys", ...}), `subfolder`,
        `cache_dir` and `revision` (of the local Hugging Face cache), BertModel's `add_pooling_layer`, `config`
        (a BertConfig, transformers' BertConfig, or a directory or file to read one from, in config.json's place),
        `variant` (model.VARIANT.safetensors) and `use_safetensors` (True: those files only; False: the PyTorch
        ones);
        `attn_implementation` is checked and needs nothing (one attention, which returns its weights when asked),
        and the Hub's own options (token, local_files_only, ...) are accepted and unused.

        `dtype` (or transformers' older name `torch_dtype`): the parameters' dtype, e.g. torch.bfloat16; "auto"
        keeps the checkpoint's own (config.json's dtype or torch_dtype); default float32.

        `require_heads=True` refuses a checkpoint without trained weights for this model's heads (instead of
        initialising them), for uses that need them trained, such as filling in [MASK] tokens.
        `ignore_mismatched_sizes=True` (transformers' name) gives a head of another size in the checkpoint (a
        classifier for other labels) a fresh initialisation instead of refusing it; the encoder must still fit.
        """
        directory = resolve_model_dir(name_or_path, subfolder, cache_dir, revision)
        if config is None and is_adapter_folder(directory):  # a LoRA adapter alone: its base, the adapter merged in
            return load_adapter_folder(cls, directory, dict(
                require_heads=require_heads, ignore_mismatched_sizes=ignore_mismatched_sizes, dtype=dtype,
                torch_dtype=torch_dtype, device_map=device_map, attn_implementation=attn_implementation,
                output_loading_info=output_loading_info, cache_dir=cache_dir, revision=revision, variant=variant,
                use_safetensors=use_safetensors, **config_overrides))
        # the options sentence-transformers loads this model with (its sentence_bert_config.json), under the caller's
        saved, saved_overrides = saved_model_options(directory)
        saved_dtype = dtype is None and torch_dtype is None and saved.get("dtype", saved.get("torch_dtype"))
        dtype = saved_dtype or dtype
        attn_implementation = attn_implementation or saved.get("attn_implementation")
        config_overrides = saved_overrides | config_overrides
        has_config = config_path(directory).is_file()
        if config is None and not has_config and any(directory.glob("*.safetensors")):
            raise ConfigError(f"{config_path(directory)}: no such config file; weights saved without one (as "
                              f"transformers' Trainer saves a bertforge model) load with config= (the model's "
                              f"BertConfig, or the folder it was loaded from)")
        given = config
        config = given_config(config) if config is not None else BertConfig.load(config_path(directory))
        dtype = dtype if dtype is not None else torch_dtype
        device = placement(device_map)
        if attn_implementation is not None:
            check_choice(attn_implementation, ATTENTION_IMPLEMENTATIONS, "attn_implementation")
        config_overrides = {key: value for key, value in config_overrides.items() if key not in HUB_OPTIONS}
        constructor = {}
        if "add_pooling_layer" in config_overrides:  # BertModel(config, add_pooling_layer=False) in transformers
            if "add_pooler" not in inspect.signature(cls.__init__).parameters:
                raise ConfigError(f"add_pooling_layer: {cls.__name__} takes no such option (BertModel does)")
            constructor["add_pooler"] = bool(config_overrides.pop("add_pooling_layer"))
        config = config.with_overrides(**config_overrides)
        # compress builds on the models, so it is imported here, not at the top
        from bertforge.compress.quantize import finish_loading, prepare_quantized, read_quantization

        build = functools.partial(cls, config, **constructor)
        try:
            bert_config(config)  # before the weights are read: what building the model would refuse first
        except ConfigError as error:  # sizes a config may hold but a model can't use (config.bert_config)
            raise (ConfigError(f"{config_path(directory)}: {error}") if given is None else error) from None
        quantization = read_quantization(directory) if has_config else None
        state, source = read_state_dict(directory, use_safetensors, variant)
        named = "config.json" if given is None and "num_hidden_layers" not in config_overrides else "the config given"
        check_layer_count(config, state, source, named)
        try:
            with shapes_only():  # see built_and_loaded
                skeleton = build()
        except ConfigError as error:
            raise (ConfigError(f"{config_path(directory)}: {error}") if given is None else error) from None
        try:
            dtype = parameter_dtype(dtype, config, state)
        except ConfigError as error:
            raise ConfigError(f"{directory / TRANSFORMER_CONFIG_FILE}: {error}") if saved_dtype else error from None
        if quantization is None:
            model, report = built_and_loaded(skeleton, build, state, source, cls.initialisable, ignore_mismatched_sizes)
        else:  # int8 layers take the place of the float ones before the tensors load
            model = prepare_quantized(build(), quantization)
            report = load_hf_state_dict(model, state, source, cls.initialisable, ignore_mismatched_sizes)
        if require_heads and report.initialised:
            modules = {name.rsplit(".", 1)[0] for name in report.initialised}
            heads = sorted(m for m in modules if not any(m.startswith(other + ".") for other in modules))
            raise CheckpointError(f"{source}: no trained weights for {cls.__name__}'s head ({', '.join(heads)}) "
                                  f"in this checkpoint, which was saved from a model without it")
        report.log(source)
        # How the checkpoint's publisher pools it into sentence vectors (sentence-transformers' modules.json),
        # which extract_features follows by default; None when the directory doesn't say.
        model.sentence_embedding = read_sentence_embedding(directory)
        if not hasattr(model, "bert") and not (model.sentence_embedding and model.sentence_embedding.multi_vector):
            # an encoder: its layout's projections of the pooled vector (LaBSE's)
            dense = read_dense_layers(directory)
            if dense:
                model.sentence_dense = torch.nn.ModuleList(dense)
        if quantization is not None:
            if device is not None and device.type != "cpu":
                raise ConfigError(f"device_map: {source} is int8, which runs on the CPU only")
            model = finish_loading(model.eval())
        else:
            # float32 unless asked: a default dtype the user set (torch.set_default_dtype) built it in that one
            model = model.to(dtype or torch.float32).eval()
        if device is not None:
            model = model.to(device)
        model.name_or_path = str(name_or_path)
        if output_loading_info:  # as transformers 5 reports them: sets, a mismatched head not among the missing
            mismatched = {name for name, _, _ in report.mismatched}
            return model, {"missing_keys": set(report.initialised) - mismatched, "unexpected_keys": set(report.skipped),
                           "mismatched_keys": set(report.mismatched), "error_msgs": []}
        return model

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """nn.Module.load_state_dict, which also takes a state dict in transformers' names (`model.load_state_dict(
        transformers_model.state_dict())`, or torch.load of a pytorch_model.bin), as from_pretrained reads them."""
        state = in_our_names(state_dict, self)
        if not any(name.startswith(DENSE_PREFIX) for name in state):  # a BERT checkpoint's: the layout's Dense stays
            state = dict(state) | {name: tensor for name, tensor in self.state_dict().items()
                                   if name.startswith(DENSE_PREFIX)}
        return super().load_state_dict(state, strict=strict, assign=assign)

    # What transformers' PreTrainedModel says of a BERT model, for code that asks
    main_input_name = "input_ids"
    base_model_prefix = "bert"
    config_class = BertConfig
    # What accelerate's device maps must keep whole on one device (infer_auto_device_map's no_split_module_classes).
    _no_split_modules = ["Embeddings", "EncoderLayer"]
    name_or_path = ""  # what from_pretrained was given
    # transformers' Trainer: the losses are means over the batch's labels, so with gradient accumulation the Trainer
    # divides them by the steps itself and passes no `num_items_in_batch` to forward.
    accepts_loss_kwargs = False

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point type of the parameters (float32, bfloat16, ...)."""
        return next((p.dtype for p in self.parameters() if p.is_floating_point()), torch.float32)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """How many numbers the model learns (a tied matrix counted once); without the embedding tables if asked."""
        embeddings = {id(module.weight) for module in self.modules() if isinstance(module, torch.nn.Embedding)}
        return sum(p.numel() for p in self.parameters() if (p.requires_grad or not only_trainable)
                   and not (exclude_embeddings and id(p) in embeddings))

    def can_generate(self) -> bool:
        return False  # an encoder: no text generation

    def tie_weights(self) -> None:
        """Nothing to do: the masked-LM head reads the word-embedding matrix itself, so the tie can't break."""

    def get_input_embeddings(self) -> torch.nn.Embedding:
        """The word-embedding table (vocabulary, hidden)."""
        encoder = getattr(self, "bert", self)
        return encoder.embeddings.tokens

    def set_input_embeddings(self, table: torch.nn.Embedding) -> None:
        """Put `table` (vocabulary, hidden) in the word embeddings' place; a masked-LM head, whose bias has a row per
        word, keeps its size only through resize_token_embeddings."""
        from bertforge.pretraining.heads import MaskedLMHead  # the heads build on this module

        if not isinstance(table, torch.nn.Embedding) or table.embedding_dim != self.config.hidden_size:
            raise ConfigError(f"set_input_embeddings takes an nn.Embedding of {self.config.hidden_size} columns (the "
                              f"hidden size), got {table!r:.80}")
        rows = table.num_embeddings
        if rows != self.config.vocab_size and any(isinstance(module, MaskedLMHead) for module in self.modules()):
            raise ConfigError(f"a table of {rows} words for a model whose masked-LM head scores "
                              f"{self.config.vocab_size}: resize with resize_token_embeddings({rows}) first")
        self._put_word_embeddings(table)

    def _put_word_embeddings(self, table: torch.nn.Embedding) -> None:
        """`table` in the word embeddings' place, and its size as the config's vocab_size (the head's and the
        encoder's config both)."""
        getattr(self, "bert", self).embeddings.tokens = table
        for owner in (self, getattr(self, "bert", None)):
            if owner is not None:
                owner.config.vocab_size = table.num_embeddings

    def set_attn_implementation(self, attn_implementation: str) -> None:
        """Checked and kept as it is: bertforge has one attention, which returns its weights whenever asked."""
        check_choice(attn_implementation, ATTENTION_IMPLEMENTATIONS, "attn_implementation")

    def _init_weights(self, module: torch.nn.Module) -> None:
        """BERT's initialisation of one module, under transformers' name: `layer.apply(model._init_weights)` draws a
        layer afresh (re-initialising the top layers before fine-tuning, for one)."""
        self.base_model.init_weights(module)

    def get_output_embeddings(self) -> torch.nn.Module | None:
        """What a masked-LM head scores the vocabulary against, as transformers answers it: a module whose `weight`
        is (vocabulary, hidden), the word-embedding table itself when tied, the head's own decoder when not; None
        for a model without such a head."""
        from bertforge.pretraining.heads import MaskedLMHead

        head = next((module for module in self.modules() if isinstance(module, MaskedLMHead)), None)
        if head is None:
            return None
        return head.decoder if head.decoder is not None else self.get_input_embeddings()

    @property
    def base_model(self) -> torch.nn.Module:
        """The encoder under the head (the model itself for BertModel), as transformers names it: what code that
        freezes the encoder reaches for."""
        return getattr(self, self.base_model_prefix, self)

    def enable_input_require_grads(self) -> None:
        """Make the word embeddings' output require gradients even when the table is frozen (transformers' hook for
        adapters trained with reentrant checkpointing; harmless with bertforge's non-reentrant one)."""
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(
            lambda module, inputs, output: output.requires_grad_(True))

    def disable_input_require_grads(self) -> None:
        hook = getattr(self, "_require_grads_hook", None)
        if hook is not None:
            hook.remove()
            self._require_grads_hook = None

    def get_memory_footprint(self, return_buffers: bool = True) -> int:
        """Bytes the parameters (and buffers) take, as transformers counts them."""
        tensors = [*self.parameters(), *(self.buffers() if return_buffers else ())]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> torch.nn.Embedding:
        """Give the word embeddings (and a masked-LM head's decoder and bias) `new_num_tokens` rows, after
        `tokenizer.add_tokens`: model.resize_token_embeddings(len(tokenizer)).

        New rows start at the mean of the old ones (transformers' default since 4.46: a new token starts as an
        average word, not as noise the model never saw), or with `mean_resizing=False` as a new model's weights
        start; fewer rows drop the last ones. A decoder tied to the embeddings gets a bias of zero for its new
        words, as transformers pads it.
        """
        table = self.get_input_embeddings()
        rows = table.num_embeddings if new_num_tokens is None else new_num_tokens
        if not isinstance(rows, int) or rows < 1:
            raise ConfigError(f"new_num_tokens must be a positive integer, got {new_num_tokens!r}")
        if pad_to_multiple_of:
            rows = -(-rows // pad_to_multiple_of) * pad_to_multiple_of
        if rows == table.num_embeddings:
            return table
        padding_idx = table.padding_idx if table.padding_idx is not None and table.padding_idx < rows else None
        resized = torch.nn.Embedding(rows, table.embedding_dim, padding_idx=padding_idx,
                                     device=table.weight.device, dtype=table.weight.dtype)
        new_rows = "mean" if mean_resizing else self.config.initializer_range
        with torch.no_grad():
            resized.weight.copy_(_resized(table.weight, rows, new_rows))
        self._put_word_embeddings(resized)
        from bertforge.pretraining.heads import MaskedLMHead  # the heads build on this module

        for head in self.modules():  # a masked-LM head scores every word: its bias (and own decoder) follow
            if isinstance(head, MaskedLMHead):
                tied = head.decoder is None
                head.bias = torch.nn.Parameter(_resized(head.bias.detach(), rows, 0.0 if tied or not mean_resizing
                                                        else "mean"))
                if not tied:
                    head.decoder.weight = torch.nn.Parameter(_resized(head.decoder.weight.detach(), rows, new_rows))
                    head.decoder.out_features = rows
        return resized

    def save_pretrained(self, directory: str | Path, is_main_process: bool = True,
                        state_dict: dict[str, torch.Tensor] | None = None, safe_serialization: bool = True,
                        max_shard_size: Any = None, push_to_hub: bool = False, **options: Any) -> Path:
        """Write config.json and model.safetensors with the ecosystem's names (and an encoder's
        sentence-transformers layout, when it was loaded with one). transformers' options as its callers pass them:
        `is_main_process=False` writes nothing (another process of the run saves); `state_dict` (bertforge's or
        transformers' names) in the place of the model's own tensors; one safetensors file whatever
        `max_shard_size` (safe_serialization=False, pickled weights, is refused, as is pushing to the Hub)."""
        directory = Path(directory)
        if not safe_serialization:
            raise ConfigError("save_pretrained: bertforge writes safetensors only (safe_serialization=False)")
        if push_to_hub or options.get("token") or options.get("repo_id"):
            raise ConfigError("save_pretrained: bertforge runs offline; push the folder with huggingface_hub")
        unknown = sorted(set(options) - {"token", "repo_id", "save_peft_format", "commit_message",
                                         "private", "create_pr"})
        if unknown:
            raise ConfigError(f"save_pretrained takes no option {unknown[0]!r}")
        if not is_main_process:
            return directory
        directory.mkdir(parents=True, exist_ok=True)
        state = {to_hf(name): tensor for name, tensor in (state_dict or self.state_dict()).items()
                 if not name.startswith(DENSE_PREFIX)}  # the layout's Dense layers: written with the layout
        for copy, original in TIED_HF_KEYS.items():
            if copy.rsplit(".", 1)[0] + ".weight" in state and copy not in state and original in state:
                state[copy] = state[original].clone()  # an untied decoder's bias, where transformers 5 reads it
        quantization = getattr(self, "quantization", None)
        if quantization is not None and quantization.precision == "bf16":  # exact: its weights are bf16 values
            state = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
                     for name, tensor in state.items()}
        saved_dtype(self.config, state).save(directory / CONFIG_FILE, architecture=type(self).__name__)
        if quantization is not None:  # what from_pretrained needs to shape the model for its tensors again
            from bertforge.compress.quantize import note_quantization  # compress builds on checkpoints

            note_quantization(directory, quantization)
        write_state_dict(state, directory)
        # An encoder loaded with a sentence-transformers layout pools as it says; a task model's head replaced that,
        # except a SPLADE model's masked-LM head, which its layout pools. An inference-free SPLADE model's Router
        # keeps this model in a folder of its own, beside the others: SparseEncoder.save writes that layout.
        layout = getattr(self, "sentence_embedding", None)
        if layout is not None and layout.routes is None and not layout.multi_vector and (
                not hasattr(self, "bert") or layout.splade and hasattr(self, "masked_lm")):
            write_sentence_embedding(directory, layout, self.config.hidden_size, self.config.vocab_size,
                                     getattr(self, "sentence_dense", None) or ())
        return directory


def saved_model_options(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a sentence-transformers folder's sentence_bert_config.json saves for from_pretrained: (from_pretrained's
    own options, SAVED_MODEL_OPTIONS; the config overrides, model_kwargs' others and config_kwargs), those BERT has
    no use for left out (usable_options)."""
    saved = saved_loading_options(directory)
    model_options = saved["model_kwargs"]
    overrides = {key: value for key, value in model_options.items() if key not in SAVED_MODEL_OPTIONS} | \
        saved["config_kwargs"]
    overrides = usable_options(overrides, lambda key: is_config_key(key) or key in HUB_OPTIONS | CONSTRUCTOR_KEYS,
                               directory, "BERT's")
    return {key: value for key, value in model_options.items() if key in SAVED_MODEL_OPTIONS}, overrides


def encoders_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The BERT encoders in `model` (the modules that can recompute their layers: model.Encoder)."""
    return [module for module in model.modules() if hasattr(module, "gradient_checkpointing")]


def set_gradient_checkpointing(model: torch.nn.Module, enable: bool, every_n_layers: int = 1,
                               offload: bool = False) -> None:
    """Turn recomputation on or off in every encoder of `model` (any module, a Pretrained one or not): in every
    `every_n_layers`-th layer, with its saved inputs in host memory if `offload`."""
    encoders = encoders_of(model)
    if enable and not encoders:
        raise ConfigError(f"gradient checkpointing: {type(model).__name__} holds no BERT encoder")
    if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
        raise ConfigError(f"every_n_layers must be a whole number >= 1, got {every_n_layers!r}")
    for encoder in encoders:
        encoder.gradient_checkpointing = enable
        encoder.checkpoint_every, encoder.offload_checkpoints = every_n_layers, bool(offload)


def check_layer_count(config: BertConfig, state: dict[str, torch.Tensor], source: Path, named: str) -> None:
    """Weights of fewer layers than config.json names are refused before the model is built: a config of 40,000
    layers over weights of 2 built 2.4 GB of layers for 38 s before a tensor was found missing."""
    layers = {int(match[1]) for name in state if (match := LAYER_INDEX.search(name))}
    if layers and config.num_hidden_layers > max(layers) + 1:
        raise CheckpointError(f"{source}: holds {max(layers) + 1} layers, where {named} says num_hidden_layers "
                              f"{config.num_hidden_layers} (does {named} match the weights?)")


LAYER_INDEX = re.compile(r"(?:^|\.)encoder\.layers?\.(\d+)\.")


def parameter_dtype(dtype: torch.dtype | str | None, config: BertConfig, state: dict[str, torch.Tensor]
                    ) -> torch.dtype | None:
    """from_pretrained's dtype: a torch dtype, its name ("bfloat16"), or "auto" for the checkpoint's own (what
    config.json says, else what its tensors are)."""
    if dtype == "auto":
        stored = next((tensor.dtype for tensor in state.values() if tensor.is_floating_point()), torch.float32)
        dtype = config.extra.get("dtype") or config.extra.get("torch_dtype") or stored
    return named_dtype(dtype)


def named_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A floating-point torch dtype, given as itself or by its name ("bfloat16"); None as it is."""
    chosen = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if dtype is not None and (not isinstance(chosen, torch.dtype) or not chosen.is_floating_point):
        raise ConfigError(f"dtype must be a floating-point torch dtype or 'auto', got {dtype!r}")
    return chosen


def _resized(table: torch.Tensor, rows: int, new_rows: str | float = "mean") -> torch.Tensor:
    """The first `rows` rows of a (vocabulary, ...) tensor, or all of them and then new rows: their mean
    ("mean"), zeros (0.0), or drawn as a new model's weights are, with that standard deviation."""
    if rows <= table.shape[0]:
        return table[:rows].clone()
    shape = (rows - table.shape[0], *table.shape[1:])
    if new_rows == "mean":
        extra = table.float().mean(dim=0, keepdim=True).to(table.dtype).expand(shape)
    else:
        extra = torch.randn(shape, device=table.device).mul(new_rows).to(table.dtype)
    return torch.cat([table, extra])


def saved_dtype(config: BertConfig, state: dict[str, torch.Tensor]) -> BertConfig:
    """The config with its dtype keys (transformers' torch_dtype or dtype, those it has; dtype for tensors other
    than float32) naming the precision of the tensors written: a checkpoint loaded from bf16 is saved in float32,
    and transformers loads in that dtype."""
    keys = [key for key in ("torch_dtype", "dtype") if key in config.extra]
    floating = next((tensor.dtype for tensor in state.values() if tensor.is_floating_point()), None)
    if not keys and floating not in (None, torch.float32):
        keys = ["dtype"]  # transformers 5's name; float32, what a config without one means, goes unsaid
    if not keys or floating is None:
        return config
    return dataclasses.replace(config, extra={**config.extra, **dict.fromkeys(keys, dtype_name(floating))})
