"""The ColBERT (late-interaction) layout: how a checkpoint's publisher turns a text into one vector per token.

Three layouts hold such a model, and sentence-transformers' MultiVectorEncoder loads all three:
- sentence-transformers' own (config_sentence_transformers.json: "model_type": "MultiVectorEncoder"): modules.json
  lists Transformer -> Dense (on token vectors) -> MultiVectorMask -> Normalize; sentence_bert_config.json holds
  query_length, document_length and query_expansion; 2_MultiVectorMask/config.json the skiplist (and any
  allowlist); a last HierarchicalTokenPooling module, if any, how documents' token vectors are pooled
  (inference/token_pooling.py).
- PyLate's ("model_type": "ColBERT"): Transformer -> Dense, with the rest as top-level fields of
  config_sentence_transformers.json (query_prefix "[unused0]", query_length, attend_to_expansion_tokens,
  skiplist_words, ...); masking and normalising were PyLate's code.
- Stanford's ColBERT (config.json "architectures": ["HF_ColBERT"]): a BERT checkpoint whose weights also hold the
  projection (linear.weight), with artifact.metadata giving query_maxlen, doc_maxlen, the marker tokens and whether
  punctuation is skipped.

Any other BERT checkpoint (a sentence-transformers model too) becomes a new ColBERT model, as sentence-transformers
makes one: its encoder's token vectors, projected by its Dense layers if its layout has any, else by a new one to
128 dimensions, untrained (converted_layout).

A query is the query marker (or prompt) and the text, padded with [MASK] to a fixed width (query expansion): the
masks are scored (in sentence-transformers' layout, by its MultiVectorMask module), which is how ColBERT gives short
queries more to match with. Document tokens in the skiplist
(punctuation, for the classic checkpoints) are not scored.
"""

from __future__ import annotations

import dataclasses
import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.atomic import write_text_atomic
from bertforge.checkpoint.hf_format import SAFETENSORS_FILE, read_state_dict, save_safetensors
from bertforge.checkpoint.sentence_transformers import (
    DENSE_CONFIG_FILE,
    MODULES_FILE,
    SENTENCE_TRANSFORMERS_CONFIG_FILE,
    TRANSFORMER_CONFIG_FILE,
    multi_vector_kind,
    read_dense_layers,
    read_layout_json,
    saved_max_length,
)
from bertforge.errors import CheckpointError, ConfigError
from bertforge.validation import check_number

STANFORD_METADATA_FILE = "artifact.metadata"
MASK_CONFIG_FILE = "config.json"
POOLING_MODULE = "multi_vector_encoder.modules.token_pooling.HierarchicalTokenPooling"
POOLING_KEYS = ("pool_factor", "max_tokens", "distance_threshold", "num_protected_tokens", "normalize_embeddings",
                "tasks")
EXPANSION_STRATEGIES = ("fixed", "min")  # fixed: every query is `length` tokens; min: at least that many
SIMILARITY_NAMES = ("maxsim", "meanmaxsim")
CLASSIC_QUERY_LENGTH = 32  # ColBERT's query width, where a checkpoint doesn't say
NEW_PROJECTION_WIDTH = 128  # a new ColBERT model's token vectors, as sentence-transformers makes it


@dataclass(frozen=True)
class QueryExpansion:
    """ColBERT's query augmentation: a query padded to `length` tokens with `token` ([MASK] when None), the
    padding scored; `attend`: the encoder attends to those positions too (PyLate's attend_to_expansion_tokens)."""

    length: int = CLASSIC_QUERY_LENGTH
    strategy: str = "fixed"
    attend: bool = False
    token: str | None = None


@dataclass(frozen=True)
class MultiVectorLayout:
    """How texts become token vectors and how those are compared."""

    prompts: dict[str, str] = field(default_factory=dict)  # role -> text put before it ("query": "[unused0] ")
    default_prompt_name: str | None = None
    markers: tuple[str, ...] = ()  # marker tokens a legacy checkpoint inserted as one token each ([unused0])
    max_length: int | None = None  # tokens of a text of no role; None: the tokenizer's model_max_length
    query_length: int | None = None  # of a query, where no expansion fixes it
    document_length: int | None = None
    query_expansion: QueryExpansion | None = None
    skiplist_words: tuple[str, ...] = ()  # tokens not scored in the texts of skiplist_tasks
    skiplist_tasks: tuple[str, ...] = ("document",)  # a text of no role counts as a document
    keep_only_token_ids: tuple[int, ...] = ()  # when given, the only tokens scored in a text that isn't a query
    # sentence-transformers' MultiVectorMask module, which scores a query's [MASK]s and applies the skiplist; a
    # layout without one scores the tokens attended to only
    scoring_mask: bool = True
    normalize: bool = True  # unit-length token vectors
    similarity_fn_name: str | None = None  # maxsim (None) or meanmaxsim
    truncate_dim: int | None = None
    # sentence-transformers' HierarchicalTokenPooling module, last: its settings (inference/token_pooling.py)
    token_pooling: dict[str, Any] | None = None
    converted: bool = False  # made here from a checkpoint of another kind: its projection may be new


def converted_layout(directory: Path) -> MultiVectorLayout:
    """A new ColBERT model over another BERT checkpoint: no query expansion, no skiplist, its prompts and length."""
    from bertforge.checkpoint.sentence_transformers import read_sentence_embedding

    settings = read_sentence_embedding(directory)
    if settings is None:
        return MultiVectorLayout(converted=True)
    if settings.splade is not None or settings.routes is not None:
        raise ConfigError(f"{directory}: a sparse (SPLADE) model; MultiVectorEncoder makes a ColBERT model from a "
                          f"BERT encoder or a sentence-transformers model")
    return MultiVectorLayout(prompts=dict(settings.prompts), default_prompt_name=settings.default_prompt_name,
                             max_length=settings.max_length, converted=True)


def _object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    config = read_layout_json(path, "ColBERT configuration")
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return config


def _expansion(value: Any, path: Path) -> QueryExpansion | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"strategy", "attend", "token", "length"}:
        raise ConfigError(f"{path}: query_expansion must be an object of strategy, attend, token and length")
    try:
        check_number("query_expansion length", value.get("length"), minimum=1, integer=True)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    strategy = value.get("strategy", "fixed")
    if strategy not in EXPANSION_STRATEGIES:
        raise ConfigError(f"{path}: query_expansion strategy {strategy!r}; choose from "
                          f"{', '.join(EXPANSION_STRATEGIES)}")
    if not isinstance(value.get("attend", False), bool) or not isinstance(value.get("token"), (str, type(None))):
        raise ConfigError(f"{path}: query_expansion's attend must be true or false, and its token a string or null")
    return QueryExpansion(value["length"], strategy, value.get("attend", False), value.get("token"))


def _length(config: dict[str, Any], name: str, path: Path) -> int | None:
    value = config.get(name)
    try:
        check_number(name, value, minimum=1, integer=True, optional=True)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return value


def _words(value: Any, name: str, path: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(word, str) for word in value):
        raise ConfigError(f"{path}: {name} must be a list of strings")
    return tuple(value)


def _similarity(config: dict[str, Any]) -> str | None:
    """The saved similarity where it is one of MultiVectorEncoder's (PyLate's "MaxSim" and a converted model's
    "cosine" fall back to maxsim, as sentence-transformers reads them)."""
    name = config.get("similarity_fn_name")
    return name if name in SIMILARITY_NAMES else None


def _prompts(config: dict[str, Any], path: Path) -> tuple[dict[str, str], str | None]:
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConfigError(f"{path}: \"prompts\" must be an object of prompt names to texts")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ConfigError(f"{path}: default_prompt_name {default!r} is not one of its prompts")
    return dict(prompts), default


def _native(directory: Path, modules: list) -> MultiVectorLayout:
    """sentence-transformers' own MultiVectorEncoder layout."""
    config_path = directory / SENTENCE_TRANSFORMERS_CONFIG_FILE
    config = _object(config_path)
    prompts, default = _prompts(config, config_path)
    transformer_path = directory / TRANSFORMER_CONFIG_FILE
    transformer = _object(transformer_path)
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    mask: dict[str, Any] = {}
    pooling: dict[str, Any] | None = None
    if "Normalize" in kinds and "Dense" in kinds[kinds.index("Normalize"):]:
        raise ConfigError(f"{directory / MODULES_FILE}: a Dense module after Normalize is not supported in a "
                          f"multi-vector model (bertforge normalizes the projected token vectors)")
    for module, kind in zip(modules, kinds):
        if kind == "MultiVectorMask":
            mask_path = directory / str(module.get("path", "")) / MASK_CONFIG_FILE
            mask = _object(mask_path)
            kept = mask.get("keep_only_token_ids") or []
            if not isinstance(kept, list) or not all(type(token) is int and token >= 0 for token in kept):
                raise ConfigError(f"{mask_path}: keep_only_token_ids must be a list of token ids (or null)")
        elif kind == "HierarchicalTokenPooling":
            pooling_path = directory / str(module.get("path", "")) / MASK_CONFIG_FILE
            if module is not modules[-1]:
                raise ConfigError(f"{directory / MODULES_FILE}: HierarchicalTokenPooling before other modules is not "
                                  f"supported (bertforge pools the finished token vectors)")
            saved = _object(pooling_path)
            # as sentence-transformers loads it: a config from before normalize_embeddings existed didn't normalize
            pooling = {"normalize_embeddings": False} | {key: saved[key] for key in POOLING_KEYS if key in saved}
            try:  # its settings checked now, naming the file
                from bertforge.inference.token_pooling import HierarchicalTokenPooling
                HierarchicalTokenPooling(**pooling)
            except (ConfigError, TypeError) as problem:
                raise ConfigError(f"{pooling_path}: {problem}") from None
        elif kind not in ("Transformer", "Dense", "Normalize"):
            raise ConfigError(f"{directory / MODULES_FILE}: module {module.get('type')!r} is not supported in a "
                              f"multi-vector model (bertforge runs Transformer, Dense, MultiVectorMask, Normalize)")
    tasks = mask.get("skiplist_tasks", ["document"])
    truncate_dim = config.get("truncate_dim")
    check_number("truncate_dim", truncate_dim, minimum=1, integer=True, optional=True)
    return MultiVectorLayout(
        prompts=prompts, default_prompt_name=default,
        max_length=_length({"max_seq_length": saved_max_length(transformer, transformer_path)}, "max_seq_length",
                           transformer_path),
        query_length=_length(transformer, "query_length", transformer_path),
        document_length=_length(transformer, "document_length", transformer_path),
        query_expansion=_expansion(transformer.get("query_expansion"), transformer_path),
        skiplist_words=_words(mask.get("skiplist_words", []), "skiplist_words", directory),
        skiplist_tasks=(tasks,) if isinstance(tasks, str) else _words(tasks, "skiplist_tasks", directory),
        keep_only_token_ids=tuple(mask.get("keep_only_token_ids") or ()),
        scoring_mask="MultiVectorMask" in kinds, normalize="Normalize" in kinds,
        similarity_fn_name=_similarity(config), truncate_dim=truncate_dim, token_pooling=pooling)


def _pylate(directory: Path) -> MultiVectorLayout:
    """PyLate's layout (before sentence-transformers took it in): its settings are top-level fields."""
    path = directory / SENTENCE_TRANSFORMERS_CONFIG_FILE
    config = _object(path)
    prompts, default = _prompts(config, path)
    markers = []
    for prefix_key, role in (("query_prefix", "query"), ("document_prefix", "document")):
        if prefix_key in config:
            prefix = config[prefix_key] or ""
            if not isinstance(prefix, str):
                raise ConfigError(f"{path}: {prefix_key} must be a string")
            markers.append(prefix)
            prompts[role] = prefix + prompts.get(role, "").removeprefix(prefix)
    query_length = _length(config, "query_length", path)
    expansion = None
    if config.get("do_query_expansion", True) is not False:
        attend = config.get("attend_to_expansion_tokens", config.get("attend_to_mask_tokens", False))
        expansion = QueryExpansion(query_length or CLASSIC_QUERY_LENGTH, attend=bool(attend))
    skiplist = config.get("skiplist_words")
    transformer_path = directory / TRANSFORMER_CONFIG_FILE
    return MultiVectorLayout(
        prompts=prompts, default_prompt_name=default, markers=tuple(marker for marker in markers if marker.strip()),
        max_length=_length(_object(transformer_path), "max_seq_length", transformer_path),
        query_length=None if expansion else query_length, document_length=_length(config, "document_length", path),
        query_expansion=expansion,
        skiplist_words=tuple(string.punctuation) if skiplist is None else _words(skiplist, "skiplist_words", path),
        similarity_fn_name=_similarity(config))


def _stanford(directory: Path) -> MultiVectorLayout:
    """Stanford's ColBERT: artifact.metadata beside a BERT checkpoint (defaults where the file is absent)."""
    path = directory / STANFORD_METADATA_FILE
    metadata = _object(path)
    markers = tuple(str(metadata.get(key) or default) for key, default in
                    (("query_token_id", "[unused0]"), ("doc_token_id", "[unused1]")))
    return MultiVectorLayout(
        prompts={"query": markers[0] + " ", "document": markers[1] + " "}, markers=markers,
        document_length=_length(metadata, "doc_maxlen", path),
        query_expansion=QueryExpansion(_length(metadata, "query_maxlen", path) or CLASSIC_QUERY_LENGTH,
                                       attend=bool(metadata.get("attend_to_mask_tokens"))),
        skiplist_words=tuple(string.punctuation) if metadata.get("mask_punctuation", True) else ())


def read_multi_vector_layout(directory: str | Path) -> MultiVectorLayout:
    """The ColBERT settings of a checkpoint directory, in whichever of the three layouts it has, or those of a new
    ColBERT model over any other BERT checkpoint."""
    directory = Path(directory)
    kind = multi_vector_kind(directory)
    if kind is None:
        return converted_layout(directory)
    if kind == "stanford":
        return _stanford(directory)
    if kind == "pylate":
        return _pylate(directory)
    return _native(directory, read_layout_json(directory / MODULES_FILE, "ColBERT configuration"))


def read_projection(directory: str | Path) -> list:
    """The layers that project each token vector (inference/features.py's Dense), loaded: the Dense modules of a
    sentence-transformers or PyLate layout, or Stanford's linear.weight among the BERT weights. A checkpoint of
    another kind: its layout's Dense layers, moved from the pooled vector to each token's ([] for none)."""
    from bertforge.inference.features import Dense

    directory = Path(directory)
    kind = multi_vector_kind(directory)
    if kind is None:
        return read_dense_layers(directory)
    if kind != "stanford":
        return read_dense_layers(directory, vectors="token_embeddings")
    state, source = read_state_dict(directory)
    weight = state.get("linear.weight")
    if weight is None or weight.dim() != 2:
        raise CheckpointError(f"{source}: a Stanford ColBERT checkpoint keeps its projection as linear.weight, a "
                              f"matrix; this file has {'none' if weight is None else tuple(weight.shape)}")
    dense = Dense(weight.shape[1], weight.shape[0], bias=False, activation="torch.nn.modules.linear.Identity")
    dense.weight.data.copy_(weight)
    return [dense]


def write_multi_vector_layout(directory: str | Path, layout: MultiVectorLayout, dense: list) -> None:
    """Write sentence-transformers' own MultiVectorEncoder layout (whatever layout the model came in), so that
    sentence-transformers and bertforge load the saved model as it was."""
    directory = Path(directory)
    folders = [f"{1 + index}_Dense" for index in range(len(dense))]
    mask_folder = f"{1 + len(dense)}_MultiVectorMask"
    modules = [("", "base.modules.transformer.Transformer")] + [
        (folder, "base.modules.dense.Dense") for folder in folders] + [
        (mask_folder, "multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask")] * layout.scoring_mask + [
        (f"{1 + len(dense) + layout.scoring_mask}_Normalize", "base.modules.normalize.Normalize")] * layout.normalize
    pooling_folder = f"{len(modules)}_HierarchicalTokenPooling"
    if layout.token_pooling is not None:
        modules.append((pooling_folder, POOLING_MODULE))
    listing = [{"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.{kind}"}
               for index, (path, kind) in enumerate(modules)]
    write_text_atomic(directory / MODULES_FILE, json.dumps(listing, indent=2) + "\n")
    transformer: dict[str, Any] = {"transformer_task": "feature-extraction",
                                   "module_output_name": "token_embeddings"}
    for name in ("max_length", "query_length", "document_length"):
        if getattr(layout, name) is not None:
            transformer["max_seq_length" if name == "max_length" else name] = getattr(layout, name)
    if layout.query_expansion is not None:
        transformer["query_expansion"] = dataclasses.asdict(layout.query_expansion)
    write_text_atomic(directory / TRANSFORMER_CONFIG_FILE, json.dumps(transformer, indent=2) + "\n")
    config = {"model_type": "MultiVectorEncoder", "prompts": layout.prompts,
              "default_prompt_name": layout.default_prompt_name, "similarity_fn_name": layout.similarity_fn_name} | (
        {} if layout.truncate_dim is None else {"truncate_dim": layout.truncate_dim})
    write_text_atomic(directory / SENTENCE_TRANSFORMERS_CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    for folder, layer in zip(folders, dense):
        (directory / folder).mkdir(exist_ok=True)
        layer_config = {"in_features": layer.in_features, "out_features": layer.out_features,
                        "bias": layer.bias is not None, "activation_function": layer.activation,
                        "module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
        write_text_atomic(directory / folder / DENSE_CONFIG_FILE, json.dumps(layer_config, indent=2) + "\n")
        save_safetensors({name: tensor.detach().float().contiguous().cpu() for name, tensor in layer.tensors().items()},
                         directory / folder / SAFETENSORS_FILE)
    if layout.scoring_mask:
        (directory / mask_folder).mkdir(exist_ok=True)
        mask = {"skiplist_words": list(layout.skiplist_words), "skiplist_tasks": list(layout.skiplist_tasks),
                "keep_only_token_ids": list(layout.keep_only_token_ids) or None}
        write_text_atomic(directory / mask_folder / MASK_CONFIG_FILE, json.dumps(mask, indent=2) + "\n")
    if layout.token_pooling is not None:
        (directory / pooling_folder).mkdir(exist_ok=True)
        write_text_atomic(directory / pooling_folder / MASK_CONFIG_FILE,
                          json.dumps(layout.token_pooling, indent=2) + "\n")
    if layout.normalize:  # token vectors: without its config.json, Normalize would look for a sentence vector
        folder = directory / f"{1 + len(dense) + layout.scoring_mask}_Normalize"
        folder.mkdir(exist_ok=True)
        write_text_atomic(folder / MASK_CONFIG_FILE, json.dumps(
            {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}, indent=2) + "\n")
