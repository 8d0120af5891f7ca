"""The sentence-transformers layout: how a checkpoint's publisher turns token vectors into one sentence vector.

modules.json lists the pipeline (Transformer -> Pooling -> Dense ... -> Normalize: Dense layers project the pooled
vector, each from a folder of its own with its config.json and weights); sentence_bert_config.json holds the
Transformer's max_seq_length (256 for all-MiniLM-L6-v2) and do_lower_case (sentence-transformers 6 keeps the length
as the tokenizer's model_max_length instead); 1_Pooling/config.json the pooling mode, as "pooling_mode" or, before
sentence-transformers 6, as one pooling_mode_* flag per mode, and whether a prompt's tokens are pooled
(include_prompt); config_sentence_transformers.json the prompts put before texts by name ("query": "query: ") and
the one used when none is named (default_prompt_name), the similarity its vectors are compared with
(similarity_fn_name: cosine when absent), and the dimensions sentence-transformers' encode keeps (truncate_dim, for a
Matryoshka model; all when absent).

A sparse encoder (SPLADE, sentence-transformers' SparseEncoder) lists an MLMTransformer, or a Transformer whose task
is fill-mask, and a SpladePooling whose config.json says how the masked-LM head's logits become one weight per
vocabulary entry; its config_sentence_transformers.json may cap the weights kept per text (max_active_dims). An
inference-free SPLADE model lists one Router (router_config.json): one route (queries) weights each word piece of a
text by a static table (SparseStaticEmbedding), the other (documents) runs the masked-LM model and its SpladePooling,
each module in a subfolder of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.atomic import write_text_atomic
from bertforge.checkpoint.hf_format import SAFETENSORS_FILE, read_state_dict, save_safetensors
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.validation import check_number

logger = logging.getLogger("bertforge")

MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"
SENTENCE_TRANSFORMERS_CONFIG_FILE = "config_sentence_transformers.json"
POOLING_CONFIG_FILE = "config.json"
ROUTER_CONFIG_FILE = "router_config.json"  # before sentence-transformers 5 (Asym): config.json
DENSE_CONFIG_FILE = "config.json"
# The pooling modes bertforge has (inference/features.py POOLINGS has the same names).
SUPPORTED_POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Before sentence-transformers 6: one flag per mode -> the mode's name.
# SPLADE's choices (inference/sparse_encoder.py has tables of the same names): over a text's tokens, and per logit.
SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
POOLING_MODE_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                      "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                      "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


@dataclass(frozen=True)
class SpladePooling:
    """How a SPLADE model's masked-LM logits become one weight per vocabulary entry."""

    strategy: str = "max"  # over a text's tokens: max (SPLADE v2 and later) or sum (the first SPLADE)
    activation: str = "relu"  # relu: log(1 + relu(logit)); log1p_relu: log(1 + that) (OpenSearch's models)


@dataclass(frozen=True)
class SparseRoutes:
    """An inference-free SPLADE model's Router: texts of the `static` task (queries) are weighted by a table of one
    weight per vocabulary entry, with no model run; those of the `model` task by the masked-LM model. Each names a
    route and its modules' folders; encode takes `default` when no task is named (None: a task must be named)."""

    static: str = "query"
    model: str = "document"
    default: str | None = "document"
    static_folder: str = "query_0_SparseStaticEmbedding"
    model_folder: str = "document_0_MLMTransformer"
    pooling_folder: str = "document_1_SpladePooling"

    def route(self, task: str | None) -> str:
        """The route a task's texts take, as the Router resolves it: the route of that name, else the default."""
        if task is None:
            if self.default is None:
                raise InputError(f"this model's Router has no default route: name a task ({self.static!r} or "
                                 f"{self.model!r}), or use encode_query / encode_document")
            return self.default
        if task not in (self.static, self.model):
            raise InputError(f"task {task!r}: this model's Router has routes {self.static!r} and {self.model!r}")
        return task


@dataclass(frozen=True)
class SentenceEmbedding:
    """How to make one vector per text; the defaults are bertforge's own (mean pooling, full length, raw)."""

    pooling: str = "mean"
    max_length: int | None = None  # tokens, [CLS] and [SEP] included; None: the tokenizer's model_max_length
    normalize: bool = False  # unit length
    lowercase: bool = False  # sentence-transformers lower-cases the text before tokenizing
    prompts: dict[str, str] = field(default_factory=dict)  # name -> text put before each text ("query: ")
    default_prompt_name: str | None = None  # the prompt used when none is asked for
    include_prompt: bool = True  # False: pooling leaves out [CLS] and the prompt's tokens
    similarity_fn_name: str | None = None  # how vectors are compared (inference/similarity.py); None: cosine
    splade: SpladePooling | None = None  # a sparse encoder's pooling of the masked-LM logits; None: a dense one
    max_active_dims: int | None = None  # a sparse encoder's cap on the weights kept per text; None: all
    routes: SparseRoutes | None = None  # an inference-free SPLADE model's Router; None: every text runs the model
    multi_vector: bool = False  # a ColBERT model: one vector per token (checkpoint/multi_vector.py), none per text
    truncate_dim: int | None = None  # the first dimensions SentenceEncoder.encode keeps; None: all

    def prompt(self, name: str | None = None, text: str | None = None) -> str:
        """What goes before each text, as sentence-transformers' encode(prompt=, prompt_name=) chooses it: `text`
        itself, else the prompt called `name`, else the default prompt, else nothing."""
        return chosen_prompt(self.prompts, self.default_prompt_name, name, text,
                             "the model's sentence-transformers configuration")


def chosen_prompt(prompts: dict[str, str], default_prompt_name: str | None, name: str | None, text: str | None,
                  owner: str) -> str:
    """What goes before each text, as sentence-transformers' encode(prompt=, prompt_name=) chooses it: `text`
    itself, else the prompt called `name`, else the default prompt, else nothing; an unknown name is an error that
    lists what `owner` (the model, its configuration) has."""
    if text is not None:
        return text
    name = default_prompt_name if name is None else name
    if name is None:
        return ""
    if name not in prompts:
        known = f"has prompts {', '.join(map(repr, sorted(prompts)))}" if prompts else "has no prompts"
        raise InputError(f"prompt_name {name!r}: {owner} {known}")
    return prompts[name]


def read_layout_json(path: Path, what: str = "sentence-transformers file") -> Any:
    """A JSON file of a sentence-transformers (or ColBERT) layout; a one-line ConfigError naming the file, and
    `what` it is, when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing (the sentence-transformers modules.json names it)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: unreadable {what}: {error}") from None


def _pooling(path: Path) -> str:
    config = read_layout_json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    modes = config.get("pooling_mode")
    if modes is None:
        # sentence-transformers pools by mean when no flag is set.
        modes = [name for key, name in POOLING_MODE_FLAGS.items() if config.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1:
        raise ConfigError(f"{path}: pooling modes {', '.join(map(str, modes))} together are not supported "
                          f"(bertforge does not concatenate poolings)")
    if modes[0] not in SUPPORTED_POOLING_MODES:
        raise ConfigError(f"{path}: pooling mode {modes[0]!r} is not supported (bertforge pools with "
                          f"{', '.join(SUPPORTED_POOLING_MODES)})")
    return modes[0]


def _splade(path: Path) -> SpladePooling:
    config = read_layout_json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    splade = SpladePooling(config.get("pooling_strategy", "max"), config.get("activation_function", "relu"))
    for name, value, choices in (("pooling_strategy", splade.strategy, SPLADE_STRATEGIES),
                                 ("activation_function", splade.activation, SPLADE_ACTIVATIONS)):
        if value not in choices:
            raise ConfigError(f"{path}: SPLADE {name} {value!r} is not supported (bertforge has "
                              f"{', '.join(choices)})")
    return splade


def _prompts(path: Path) -> dict[str, Any]:
    """The prompt settings of config_sentence_transformers.json (none when the file is absent)."""
    if not path.is_file():
        return {}
    config = read_layout_json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(key, str) and isinstance(value, str)
                                                for key, value in prompts.items()):
        raise ConfigError(f"{path}: \"prompts\" must be an object of prompt names to texts")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ConfigError(f"{path}: default_prompt_name {default!r} is not one of its prompts")
    similarity = config.get("similarity_fn_name")
    if similarity is not None and not isinstance(similarity, str):
        raise ConfigError(f"{path}: \"similarity_fn_name\" must be a name (cosine, dot, euclidean, manhattan)")
    counts = {name: config.get(name) for name in ("max_active_dims", "truncate_dim")}
    for name, count in counts.items():
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise ConfigError(f"{path}: \"{name}\" must be a whole number of at least 1, or null")
    return {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": similarity} | counts


def _layout(directory: Path) -> tuple[Path, Path, list] | None:
    """The folder that holds a sentence-transformers layout, its modules.json and the modules it lists (None
    without one)."""
    modules_path = directory / MODULES_FILE
    if not modules_path.is_file():
        # The layout of sentence-transformers before 1.0 keeps the model in a subfolder (0_Transformer/), which
        # is what loads: its settings are in the folder above.
        parent = directory.resolve().parent
        if transformer_folder(parent) != directory.resolve():
            return None
        directory, modules_path = parent, parent / MODULES_FILE
    modules = read_layout_json(modules_path)
    if not isinstance(modules, list):
        raise ConfigError(f"{modules_path}: expected a JSON list of modules")
    return directory, modules_path, modules


def _kind(module: Any) -> str | None:
    return str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else None


def multi_vector_kind(directory: str | Path) -> str | None:
    """Which ColBERT layout a checkpoint directory has (checkpoint/multi_vector.py): "native" (sentence-transformers'
    MultiVectorEncoder), "pylate", "stanford", or None for none."""
    directory = Path(directory)
    config_path = directory / SENTENCE_TRANSFORMERS_CONFIG_FILE
    if (directory / MODULES_FILE).is_file() and config_path.is_file():
        try:
            model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            return None  # read_sentence_embedding names the problem
        return {"MultiVectorEncoder": "native", "ColBERT": "pylate"}.get(model_type)
    try:
        architectures = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("architectures")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return "stanford" if isinstance(architectures, list) and "HF_ColBERT" in architectures else None


def read_sentence_embedding(directory: str | Path) -> SentenceEmbedding | None:
    """The settings of a sentence-transformers checkpoint directory (None without modules.json); a module
    bertforge can't run (a custom one) is a ConfigError naming it and the file. Its Dense layers, which hold
    weights, are read_dense_layers'. A ColBERT checkpoint's layout is checkpoint/multi_vector.py's: here it only
    says that it is one."""
    if multi_vector_kind(directory) is not None:
        return SentenceEmbedding(multi_vector=True)
    layout = _layout(Path(directory))
    if layout is None:
        return None
    directory, modules_path, modules = layout
    settings: dict[str, Any] = {}
    for module in modules:
        kind = _kind(module)
        folder = directory / str(module.get("path", "")) if isinstance(module, dict) else directory
        if kind in ("Transformer", "MLMTransformer"):
            settings |= _transformer(folder)
        elif kind == "Pooling":
            settings["pooling"] = _pooling(folder / POOLING_CONFIG_FILE)
            pooling_config = read_layout_json(folder / POOLING_CONFIG_FILE)
            settings["include_prompt"] = pooling_config.get("include_prompt", True) is not False
        elif kind == "SpladePooling":
            settings["splade"] = _splade(folder / POOLING_CONFIG_FILE)
        elif kind == "Dense" and "pooling" in settings and "normalize" not in settings:
            continue  # a projection of the pooled vector
        elif kind == "Dense":
            where = "after Normalize" if settings.get("normalize") else "on token vectors (before Pooling)"
            raise ConfigError(f"{modules_path}: a Dense module {where} is not supported (bertforge projects the "
                              f"pooled vector, before Normalize)")
        elif kind == "Normalize":
            settings["normalize"] = True
        elif kind in ("Router", "Asym"):
            settings |= _router(folder)
        else:
            raise ConfigError(f"{modules_path}: module {module.get('type') if isinstance(module, dict) else module!r}"
                              f" is not supported (bertforge runs Transformer, Pooling, Dense, Normalize and "
                              f"SPLADE's MLMTransformer and SpladePooling)")
    return SentenceEmbedding(**settings, **_prompts(directory / SENTENCE_TRANSFORMERS_CONFIG_FILE))


def read_dense_layers(directory: str | Path, vectors: str = "sentence_embedding") -> list:
    """The layout's Dense modules in order (inference/features.py's Dense), their weights loaded from their folders;
    [] for none. Any problem with one is an error naming its file. `vectors`: what they project, the pooled
    sentence_embedding, or a ColBERT model's token_embeddings (PyLate's Dense names neither)."""
    from bertforge.inference.features import DEFAULT_DENSE_ACTIVATION, DENSE_ACTIVATIONS, Dense

    layout = _layout(Path(directory))
    layers = []
    for module in layout[2] if layout is not None else []:
        if _kind(module) != "Dense":
            continue
        folder = layout[0] / str(module.get("path", ""))
        path = folder / DENSE_CONFIG_FILE
        config = read_layout_json(path)
        if not isinstance(config, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        try:
            for name in ("in_features", "out_features"):
                check_number(name, config.get(name), minimum=1, integer=True)
            for name in ("bias", "use_residual"):
                if not isinstance(config.get(name, name == "bias"), bool):
                    raise ConfigError(f"{name} must be true or false, got {config[name]!r}")
            activation = config.get("activation_function", DEFAULT_DENSE_ACTIVATION)
            if activation not in DENSE_ACTIVATIONS:
                raise ConfigError(f"activation_function {activation!r} is not supported (bertforge runs "
                                  f"{', '.join(name.rsplit('.', 1)[-1] for name in DENSE_ACTIVATIONS)})")
            for name in ("module_input_name", "module_output_name"):
                if config.get(name, vectors) not in (vectors, None):
                    raise ConfigError(f"{name} {config[name]!r} is not supported here (bertforge projects the "
                                      f"{vectors})")
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
        dense = Dense(config["in_features"], config["out_features"], config.get("bias", True), activation,
                      config.get("use_residual", False))
        state, source = read_state_dict(folder)
        expected = dense.tensors()
        if set(state) != set(expected):
            raise CheckpointError(f"{source}: a Dense module's tensors are {', '.join(sorted(expected))}; this file "
                                  f"holds {', '.join(sorted(state)) or 'none'}")
        for name, tensor in expected.items():
            if state[name].shape != tensor.shape:
                raise CheckpointError(f"{source}: {name} is {tuple(state[name].shape)}; config.json says "
                                      f"{tuple(tensor.shape)}")
            tensor.data.copy_(state[name])
        layers.append(dense)
    return layers


# sentence_bert_config.json's loading options, which sentence-transformers passes to from_pretrained (the model's,
# the tokenizer's, the config's), by their names since v5 and before it
LOADING_OPTIONS = {"model_kwargs": "model_args", "processor_kwargs": "tokenizer_args", "config_kwargs": "config_args"}


def saved_loading_options(folder: str | Path) -> dict[str, dict[str, Any]]:
    """The options the Transformer module's sentence_bert_config.json in `folder` saves, by kind ("model_kwargs",
    "processor_kwargs", "config_kwargs"), as sentence-transformers applies them when it loads the model (under a
    caller's own); {} for a kind it saves none of."""
    path = Path(folder) / TRANSFORMER_CONFIG_FILE
    config = read_layout_json(path) if path.is_file() else {}
    return {kind: _loading_options(config, kind, path) for kind in LOADING_OPTIONS}


def usable_options(options: dict[str, Any], usable: Callable[[str], bool], folder: str | Path,
                   reader: str) -> dict[str, Any]:
    """Saved options less those `reader` has no use for, which are logged with the file they came from and left
    out, as transformers keeps them as attributes nothing reads."""
    ignored = sorted(key for key in options if not usable(key))
    if ignored:
        logger.warning("%s: %s: no setting of %s; ignored", Path(folder) / TRANSFORMER_CONFIG_FILE,
                       ", ".join(ignored), reader)
    return {key: value for key, value in options.items() if key not in ignored}


def _loading_options(config: Any, kind: str, path: Path) -> dict[str, Any]:
    options = config.get(kind, config.get(LOADING_OPTIONS[kind])) if isinstance(config, dict) else None
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: {kind} must be an object of options, got {options!r:.60}")
    return options


def saved_max_length(config: dict[str, Any], path: Path) -> Any:
    """A Transformer module's sequence length as sentence-transformers reads its sentence_bert_config.json: the
    tokenizer's model_max_length where processor_kwargs gives one (it wins there), else max_seq_length."""
    return _loading_options(config, "processor_kwargs", path).get("model_max_length", config.get("max_seq_length"))


def _transformer(folder: Path) -> dict[str, Any]:
    """A Transformer module's settings (sentence_bert_config.json): lower-casing, and max_length where given."""
    path = folder / TRANSFORMER_CONFIG_FILE
    config = read_layout_json(path) if path.is_file() else {}
    length = saved_max_length(config, path)
    if isinstance(length, float) and length.is_integer():
        length = int(length)  # 256.0, as a file written by hand may say
    try:
        check_number("max_seq_length", length, minimum=1, integer=True, optional=True)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return {"lowercase": bool(config.get("do_lower_case", False))} | ({} if length is None else {"max_length": length})


def _router_config(folder: Path) -> dict[str, Any]:
    path = folder / ROUTER_CONFIG_FILE if (folder / ROUTER_CONFIG_FILE).is_file() else folder / "config.json"
    config = read_layout_json(path)
    if not (isinstance(config, dict) and isinstance(config.get("types"), dict)
            and isinstance(config.get("structure"), dict)):
        raise ConfigError(f"{path}: expected a Router's \"types\" and \"structure\" objects")
    return config | {"path": path}


def _router(folder: Path) -> dict[str, Any]:
    """The settings of an inference-free SPLADE Router: a route of one SparseStaticEmbedding and a route of an
    MLMTransformer (or fill-mask Transformer) and a SpladePooling; any other Router is refused by name."""
    config = _router_config(folder)
    kinds = {module: str(kind).rsplit(".", 1)[-1] for module, kind in config["types"].items()}
    routes = {name: [kinds.get(str(module)) for module in modules] for name, modules in config["structure"].items()
              if isinstance(modules, list)}
    static = [name for name, chain in routes.items() if chain == ["SparseStaticEmbedding"]]
    model = [name for name, chain in routes.items()
             if len(chain) == 2 and chain[0] in ("MLMTransformer", "Transformer") and chain[1] == "SpladePooling"]
    parameters = config.get("parameters") or {}
    if len(routes) != 2 or len(static) != 1 or len(model) != 1 or parameters.get("route_mappings"):
        shown = "; ".join(f"{name}: {' -> '.join(map(str, chain))}" for name, chain in routes.items())
        raise ConfigError(f"{config['path']}: a Router of {shown or 'no routes'} is not supported (bertforge runs "
                          f"inference-free SPLADE: one route of a SparseStaticEmbedding, one of an MLMTransformer "
                          f"and a SpladePooling)")
    static_folder, (model_folder, pooling_folder) = (config["structure"][static[0]][0],
                                                     config["structure"][model[0]])
    default = parameters.get("default_route")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(routes))  # the Router's own fallback: its first route
    return {"routes": SparseRoutes(static[0], model[0], default, static_folder, model_folder, pooling_folder),
            "splade": _splade(folder / pooling_folder / POOLING_CONFIG_FILE)} | _transformer(folder / model_folder)


def write_router(directory: str | Path, settings: SentenceEmbedding, vocab_size: int) -> None:
    """Write an inference-free SPLADE model's layout (`settings.routes`) as sentence-transformers 5 saves it: the
    JSON of modules.json, router_config.json, config_sentence_transformers.json and each module's folder; the
    weights and tokenizers in those folders are the encoder's to write (SparseEncoder.save)."""
    directory, routes = Path(directory), settings.routes
    kinds = {routes.static_folder: "sparse_encoder.models.SparseStaticEmbedding",
             routes.model_folder: "sparse_encoder.models.MLMTransformer",
             routes.pooling_folder: "sparse_encoder.models.SpladePooling"}
    router = {"types": {folder: f"sentence_transformers.{kind}" for folder, kind in kinds.items()},
              "structure": {routes.static: [routes.static_folder],
                            routes.model: [routes.model_folder, routes.pooling_folder]},
              "parameters": {"default_route": routes.default, "allow_empty_key": routes.default is not None}}
    listing = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]
    for folder in kinds:
        (directory / folder).mkdir(parents=True, exist_ok=True)
    files = {MODULES_FILE: listing, ROUTER_CONFIG_FILE: router,
             SENTENCE_TRANSFORMERS_CONFIG_FILE: _encoder_config(settings),
             f"{routes.model_folder}/{TRANSFORMER_CONFIG_FILE}": _transformer_config(settings),
             f"{routes.pooling_folder}/{POOLING_CONFIG_FILE}": _splade_config(settings, vocab_size),
             f"{routes.static_folder}/config.json": {"frozen": False}}
    for name, content in files.items():
        write_text_atomic(directory / name, json.dumps(content, indent=2) + "\n")


def transformer_folder(directory: str | Path) -> Path | None:
    """The subfolder modules.json names for the Transformer module (0_Transformer/ before sentence-transformers
    1.0), where config.json and the weights are; None for the usual layout (the folder itself) or none at all."""
    directory = Path(directory).resolve()
    if not (directory / MODULES_FILE).is_file() or (directory / "config.json").is_file():
        return None
    try:
        modules = json.loads((directory / MODULES_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # read_sentence_embedding names the problem
    for module in modules if isinstance(modules, list) else []:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        if kind.endswith("Transformer") and module.get("path") and (
                directory / str(module["path"]) / "config.json").is_file():
            return (directory / str(module["path"])).resolve()
        if kind.rsplit(".", 1)[-1] in ("Router", "Asym"):  # the masked-LM model is one of the Router's modules
            try:
                router = _router_config(directory / str(module.get("path", "")))
            except ConfigError:
                return None  # read_sentence_embedding names the problem
            for folder, kind in router["types"].items():
                path = directory / str(module.get("path", "")) / str(folder)
                if str(kind).endswith("Transformer") and (path / "config.json").is_file():
                    return path.resolve()
    return None


def write_sentence_embedding(directory: str | Path, settings: SentenceEmbedding, hidden_size: int,
                             vocab_size: int | None = None, dense: Sequence[Any] = ()) -> None:
    """Write the layout `read_sentence_embedding` reads, in the form every sentence-transformers version loads
    (one pooling_mode_* flag per mode; a SPLADE model's modules by their sentence-transformers 5 names), so that a
    saved encoder pools as the one it was loaded from. `vocab_size`: a SPLADE model's width; `dense`: the Dense
    layers after its pooling (read_dense_layers'), each written to a folder of its own."""
    directory = Path(directory)
    if settings.splade is not None:
        pooling_folder, kinds = "1_SpladePooling", ("sparse_encoder.models.MLMTransformer",
                                                    "sparse_encoder.models.SpladePooling")
        pooling = _splade_config(settings, vocab_size)
    else:
        pooling_folder, kinds = "1_Pooling", ("models.Transformer", "models.Pooling")
        pooling = {"word_embedding_dimension": hidden_size} | {
            flag: mode == settings.pooling for flag, mode in POOLING_MODE_FLAGS.items()} | {
            "include_prompt": settings.include_prompt}
    dense_folders = [f"{2 + index}_Dense" for index in range(len(dense))]
    normalize_folder = f"{2 + len(dense)}_Normalize"
    modules = [("", kinds[0]), (pooling_folder, kinds[1])] + [(folder, "models.Dense") for folder in dense_folders] + [
        (normalize_folder, "models.Normalize")] * settings.normalize
    listing = [{"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.{kind}"}
               for index, (path, kind) in enumerate(modules)]
    write_text_atomic(directory / MODULES_FILE, json.dumps(listing, indent=2) + "\n")
    write_text_atomic(directory / TRANSFORMER_CONFIG_FILE, json.dumps(_transformer_config(settings), indent=2) + "\n")
    write_text_atomic(directory / SENTENCE_TRANSFORMERS_CONFIG_FILE,
                      json.dumps(_encoder_config(settings), indent=2) + "\n")
    (directory / pooling_folder).mkdir(exist_ok=True)
    write_text_atomic(directory / pooling_folder / POOLING_CONFIG_FILE, json.dumps(pooling, indent=2) + "\n")
    for name, layer in zip(dense_folders, dense):
        folder = directory / name
        folder.mkdir(exist_ok=True)
        config = {"in_features": layer.in_features, "out_features": layer.out_features,
                  "bias": layer.bias is not None, "activation_function": layer.activation} | (
            {"use_residual": True} if layer.use_residual else {})
        write_text_atomic(folder / DENSE_CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        save_safetensors({name: tensor.detach().float().contiguous().cpu() for name, tensor in layer.tensors().items()},
                         folder / SAFETENSORS_FILE)
    if settings.normalize:
        (directory / normalize_folder).mkdir(exist_ok=True)


def _encoder_config(settings: SentenceEmbedding) -> dict[str, Any]:
    """config_sentence_transformers.json: prompts, similarity, truncate_dim, and a sparse encoder's kind and
    max_active_dims."""
    config = {"prompts": settings.prompts, "default_prompt_name": settings.default_prompt_name} | (
        {} if settings.similarity_fn_name is None else {"similarity_fn_name": settings.similarity_fn_name}) | (
        {} if settings.truncate_dim is None else {"truncate_dim": settings.truncate_dim})
    if settings.splade is not None:
        config = {"model_type": "SparseEncoder"} | config | (
            {} if settings.max_active_dims is None else {"max_active_dims": settings.max_active_dims})
    return config


def _transformer_config(settings: SentenceEmbedding) -> dict[str, Any]:
    """sentence_bert_config.json, as _transformer reads it."""
    return {"do_lower_case": settings.lowercase} | (
        {} if settings.max_length is None else {"max_seq_length": settings.max_length})


def _splade_config(settings: SentenceEmbedding, vocab_size: int | None) -> dict[str, Any]:
    """A SpladePooling's config.json, as _splade reads it."""
    return {"pooling_strategy": settings.splade.strategy, "activation_function": settings.splade.activation,
            "word_embedding_dimension": vocab_size}
