"""transformers' `pipeline()` for the BERT tasks, answered by bertforge's own: code written as
`pipeline("fill-mask", model=path)("Paris is the [MASK] of France.")` gets transformers' shapes, keys and numbers.

Each task is one row of PIPELINE_TASKS: the model it needs, its options and an adapter that runs bertforge's own
steps (the task's encode, the model's outputs and the task's decode; fill_mask; the encoder's last layer) and
renames their answer. The few numbers transformers gives and a decode doesn't (a span's probability, a word
piece's own label) come from the same outputs, in one function per task. transformers 5 dropped the
question-answering pipeline; that task follows transformers 4's, the last one.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import math
import os
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bertforge.checkpoint.pretrained import named_dtype
from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.heads import encoder_of
from bertforge.inference.fill_mask import fill_mask, load_masked_lm, mask_positions
from bertforge.model import BertModel
from bertforge.pretraining import BertForMaskedLM
from bertforge.runtime import resolve_device
from bertforge.tasks import classification
from bertforge.tasks.checkpoint_contents import inspect_checkpoint, task_defaults
from bertforge.tasks.data import EncodeSettings, Features, row_outputs
from bertforge.tasks.question_answering import SpanFeatures
from bertforge.tasks.registry import HEADS, Task, head_of, task_of_model
from bertforge.tasks.token_classification import OUTSIDE, TaggedSentence, TokenFeatures, tagged_entities
from bertforge.tokenizer import BertTokenizer
from bertforge.tokenizer.tokenizer import SplitWords
from bertforge.validation import check_number, check_within_positions, readable_length

if TYPE_CHECKING:
    from bertforge.tasks.finetuned_model import FinetunedModel

logger = logging.getLogger("bertforge")

# The default of an option whose mere presence changes the answer's shape (text-classification's top_k).
NOT_GIVEN: Any = object()
MASKED_LM_ARCHITECTURES = {"BertForMaskedLM", "BertForPreTraining"}  # config.json's names of a masked-LM model


@dataclass
class Pipeline:
    """A model ready for one task, called as transformers' pipelines are: `pipe(inputs, **options)`."""

    task: str  # a key of PIPELINE_TASKS
    model: nn.Module = field(repr=False)
    tokenizer: BertTokenizer = field(repr=False)
    device: torch.device
    definition: Task | None = field(default=None, repr=False)  # bertforge's task of a fine-tuned model (ner, ...)
    settings: EncodeSettings | None = field(default=None, repr=False)  # how it reads inputs: its training run's
    options: dict[str, Any] = field(default_factory=dict)  # given to pipeline(): the defaults of every call
    # How rows reach the model: rows(features, read) -> each row's outputs. None: here, in length-sorted batches of
    # the call's batch_size; the server gives its batcher's, the one thread that runs its model.
    rows: Callable[[Features, Callable[[Any], tuple[torch.Tensor, ...]]], list[tuple[torch.Tensor, ...]]] | None = \
        field(default=None, repr=False)

    def __call__(self, inputs: Any = None, *args: Any, **options: Any) -> Any:
        positional = PIPELINE_TASKS[self.task].positional
        if len(args) > len(positional):
            raise ConfigError(f"{self.task} takes {len(positional)} option(s) after the inputs by position "
                              f"({', '.join(positional) or 'none'}), got {len(args)}")
        for name, value in zip(positional, args):
            if name in options:
                raise ConfigError(f"{name} given twice, by position and by name")
            options[name] = value
        options = given_options(self.task, options)
        defaults = {name: option.default for name, option in task_options(self.task).items()}
        streamed = not isinstance(inputs, (str, bytes, Mapping, list, tuple)) and inputs is not None and (
            hasattr(inputs, "__iter__") or hasattr(inputs, "__getitem__") and hasattr(inputs, "__len__"))
        if streamed:  # a generator, or a dataset of inputs (datasets' KeyDataset, a torch Dataset)
            inputs = list(inputs) if hasattr(inputs, "__iter__") else [inputs[i] for i in range(len(inputs))]
        answers = PIPELINE_TASKS[self.task].run(self, inputs, {**defaults, **self.options, **options}, set(options))
        if not streamed:
            return answers
        if len(inputs) == 1 and PIPELINE_TASKS[self.task].list_of_one_alone:
            answers = [answers]  # the one input's answer, which the task gave alone
        return iter(answers)  # an iterator of answers, one per input, as transformers streams them

    @property
    def positions(self) -> int:
        return self.model.config.max_position_embeddings

    def outputs(self, features: Features, read: Callable[[Any], tuple[torch.Tensor, ...]], batch_size: int
                ) -> list[tuple[torch.Tensor, ...]]:
        """Each row's outputs, `read` from the model's."""
        if self.rows is not None:
            return self.rows(features, read)
        return row_outputs(self.model, features, batch_size, read)


@dataclass(frozen=True)
class Option:
    """A task option: its default, and check(name, value) raising a one-line error for a value it can't take."""

    default: Any
    check: Callable[[str, Any], None] = lambda name, value: None
    none_is_default: bool = False  # None given means the default, as transformers reads it (batch_size=None)


@dataclass(frozen=True)
class PipelineTask:
    """One of transformers' pipeline tasks: the model it needs ("encoder": any checkpoint's encoder, "masked_lm",
    or the HEADS key of a fine-tuned model), its options by name, and its adapter
    run(pipe, inputs, options, given) -> transformers' answer (`given`: the options this call names)."""

    needs: str
    options: dict[str, Option]
    run: Callable[[Pipeline, Any, dict[str, Any], set[str]], Any]
    positional: tuple[str, ...] = ()  # options a call may also give by position, after the inputs
    list_of_one_alone: bool = False  # a list of one input answers as that input alone (transformers 4's tasks)


def positive(name: str, value: Any) -> None:
    check_number(name, value, minimum=1, integer=True)


def positive_or_none(name: str, value: Any) -> None:
    check_number(name, value, minimum=1, integer=True, optional=True)


def zero_or_more_or_none(name: str, value: Any) -> None:
    check_number(name, value, minimum=0, integer=True, optional=True)


def one_of(choices: Sequence[str]) -> Callable[[str, Any], None]:
    """A check of a name among `choices`, in any case, as transformers reads "SIMPLE" or "Sigmoid" (its enums are
    read as their values by given_options)."""
    return lambda name, value: value is None or check_choice(str(value).lower(), choices, name)


def text_or_texts(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str) and not (
            isinstance(value, (list, tuple, set)) and all(isinstance(item, str) for item in value)):
        raise ConfigError(f"{name} must be a text or a list of texts, got {value!r:.60}")


def a_text(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name} must be a text, got {value!r:.60}")


# Every task's option: inputs run together (transformers' default of 1 gives the same numbers).
# num_workers: transformers' DataLoader workers, which change no answer; bertforge tokenizes in the calling process.
COMMON_OPTIONS = {"batch_size": Option(32, positive, none_is_default=True),
                  "num_workers": Option(None, zero_or_more_or_none)}


def pipeline(task: str | None = None, model: str | os.PathLike | nn.Module | FinetunedModel = "default",
             tokenizer: str | os.PathLike | BertTokenizer | None = None, device: int | str | torch.device | None = None,
             **options: Any) -> Pipeline:
    """transformers' pipeline(): `task` (a PIPELINE_TASKS key or an alias: "sentiment-analysis", "ner"; None: the
    one the model's head does) on `model`, a model folder, "default" (all-MiniLM-L6-v2, an encoder without trained
    heads), a FinetunedModel, or a loaded bertforge model with its `tokenizer` (a BertTokenizer or a folder).
    `device` as transformers reads it: None the first GPU where there is one, -1 the CPU, N cuda:N, or a name.
    `options` are the task's (top_k, aggregation_strategy, ...), the defaults of every call.

    >>> pipeline("feature-extraction")("A cat.")  # [1][tokens][384]: [CLS] a cat . [SEP]
    """
    from bertforge.tasks.finetuned_model import FinetunedModel  # it imports bertforge.inference, which has us

    if not isinstance(model, (str, os.PathLike, nn.Module, FinetunedModel)):
        raise ConfigError(f"model must be a folder, \"default\" or a bertforge model, got a {type(model).__name__}")
    task = task_for(model) if task is None else task
    check_choice(task, [*PIPELINE_TASKS, *TASK_ALIASES], "pipeline task")
    task = TASK_ALIASES.get(task, task)
    loading = {name: options.pop(name) for name in list(options) if name in LOADING_OPTIONS}
    dtype = loaded_dtype(loading)
    options = given_options(task, options)  # when given, as transformers checks them
    needs = PIPELINE_TASKS[task].needs
    place = pipeline_device(device if device is not None else loading.get("device_map"))
    pipe = given_model(task, needs, model) if not isinstance(model, (str, os.PathLike)) else loaded_model(
        task, needs, model)
    if tokenizer is not None:
        pipe.tokenizer = tokenizer if isinstance(tokenizer, BertTokenizer) else load_tokenizer(tokenizer)
    elif isinstance(model, nn.Module):
        raise ConfigError(f"a loaded {type(model).__name__} needs its tokenizer: pipeline(..., tokenizer=...)")
    pipe.model.to(place, dtype).eval()
    pipe.device, pipe.options = place, dict(options)
    return pipe


# transformers' pipeline() options for loading the model: dtype (torch_dtype: its older name; "auto": as saved),
# framework (PyTorch's, "pt", alone here), device_map (one device, as `device`), model_kwargs (from_pretrained's:
# its dtype is taken, anything else refused by name).
LOADING_OPTIONS = ("dtype", "torch_dtype", "framework", "device_map", "model_kwargs")


def loaded_dtype(loading: dict[str, Any]) -> torch.dtype | None:
    """The dtype pipeline() loads the model in (None: as loaded, float32), from transformers' loading options."""
    if loading.get("framework") not in (None, "pt"):
        raise ConfigError(f"framework {loading['framework']!r}: bertforge runs PyTorch ('pt')")
    model_kwargs = dict(loading.get("model_kwargs") or {})
    unknown = sorted(set(model_kwargs) - {"dtype", "torch_dtype"})
    if unknown:
        raise ConfigError(f"model_kwargs: pipeline() takes the dtype from them, not {unknown[0]!r}")
    dtype = next((given for given in (loading.get("dtype"), loading.get("torch_dtype"), model_kwargs.get("dtype"),
                                      model_kwargs.get("torch_dtype")) if given is not None), None)
    return None if dtype == "auto" else named_dtype(dtype)


def task_for(model: Any) -> str:
    """The pipeline task of a model given without one: the one its head does (HEADS' onnx_task names are
    transformers' task names), fill-mask for a masked LM, feature-extraction for a bare encoder."""
    from bertforge.tasks.finetuned_model import FinetunedModel

    if isinstance(model, FinetunedModel):
        model = model.model
    if isinstance(model, BertForMaskedLM):
        return "fill-mask"
    if isinstance(model, nn.Module):
        return HEADS[head_of(model)].onnx_task
    checkpoint = inspect_checkpoint(model)
    if checkpoint.head == "encoder" and MASKED_LM_ARCHITECTURES & set(checkpoint.architectures):
        return "fill-mask"
    return HEADS[checkpoint.head].onnx_task


def task_options(task: str) -> dict[str, Option]:
    return {**COMMON_OPTIONS, **PIPELINE_TASKS[task].options}


def given_options(task: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a call (or pipeline()) gives, checked: each one of the task's and a value it takes, else a
    one-line ConfigError naming it. transformers' enums (AggregationStrategy.SIMPLE) are read as their values, and
    None where it means the default is left out."""
    known, given = task_options(task), {}
    for name, value in options.items():
        check_choice(name, known, f"{task} option")
        value = value.value if isinstance(value, enum.Enum) else value
        if value is None and known[name].none_is_default:
            continue
        known[name].check(name, value)
        given[name] = value
    return given


def pipeline_device(device: int | str | torch.device | None) -> torch.device:
    """transformers' `device`: None the first GPU where there is one, a negative index the CPU, index N cuda:N
    (the CPU on a machine without CUDA, as transformers falls back), or a device name, checked to exist here."""
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device, type(None))):
        raise ConfigError(f"device must be an index, a name (cpu, cuda, cuda:N) or a torch.device, got {device!r}")
    if isinstance(device, int):
        device = f"cuda:{device}" if device >= 0 and torch.cuda.is_available() else "cpu"
    return resolve_device(None if device is None else str(device))


def load_tokenizer(name_or_path: Any) -> BertTokenizer:
    if not isinstance(name_or_path, (str, os.PathLike)):
        kind, folder = type(name_or_path), getattr(name_or_path, "name_or_path", None) or "its folder"
        raise ConfigError(f"tokenizer must be bertforge's BertTokenizer or a folder, got {kind.__module__}."
                          f"{kind.__name__}: give tokenizer={str(folder)!r}")
    return BertTokenizer.from_pretrained(name_or_path)


def loaded_model(task: str, needs: str, name_or_path: str | os.PathLike) -> Pipeline:
    """The model `task` needs, from a folder (or "default"); a folder without that head is a one-line error."""
    from bertforge.tasks.finetuned_model import FinetunedModel

    if needs == "encoder":  # transformers' AutoModel: the encoder of any checkpoint, without an unused pooler
        model = BertModel.from_pretrained(name_or_path, add_pooling_layer=False)
        return Pipeline(task, model, BertTokenizer.from_pretrained(name_or_path), torch.device("cpu"))
    if needs == "masked_lm":
        model, tokenizer = load_masked_lm(str(name_or_path))
        return Pipeline(task, model, tokenizer, torch.device("cpu"))
    checkpoint = inspect_checkpoint(name_or_path)
    if checkpoint.head != needs:
        raise ConfigError(f"{checkpoint.directory}: {task} needs a model fine-tuned with a {needs} head; "
                          f"it holds {holds(checkpoint.head)}")
    finetuned = FinetunedModel.load(checkpoint.directory)
    return Pipeline(task, finetuned.model, finetuned.tokenizer, torch.device("cpu"), finetuned.task,
                    finetuned.settings)


def given_model(task: str, needs: str, model: Any) -> Pipeline:
    """The pipeline of a model already loaded: a FinetunedModel (with its tokenizer and settings), or a bertforge
    model (its tokenizer given to pipeline(); a fine-tuned head reads inputs with its task's default settings)."""
    from bertforge.tasks.finetuned_model import FinetunedModel

    tokenizer = None
    if isinstance(model, FinetunedModel):
        model, tokenizer, definition, settings = model.model, model.tokenizer, model.task, model.settings
    else:
        definition = task_of_model(model) if needs not in ("encoder", "masked_lm") else None
        settings = definition and task_defaults(definition.name, model.config.max_position_embeddings).settings
    if needs == "encoder":
        model = encoder_of(model)  # a task model's encoder
        if not isinstance(model, BertModel):
            raise ConfigError(f"{task} needs a bertforge encoder; a {type(model).__name__} has none")
    elif needs == "masked_lm":
        if not isinstance(model, BertForMaskedLM):
            raise ConfigError(f"fill-mask needs a BertForMaskedLM, not a {type(model).__name__}")
    elif head_of(model) != needs:
        raise ConfigError(f"{task} needs a model fine-tuned with a {needs} head; a {type(model).__name__} holds "
                          f"{holds(head_of(model))}")
    return Pipeline(task, model, tokenizer, torch.device("cpu"), definition, settings)


def holds(head: str) -> str:
    return "an encoder without a trained task head" if head == "encoder" else f"a {head} head"


# --- inputs ---------------------------------------------------------------------------------------------------

def text_batch(inputs: Any, task: str) -> tuple[list[str], bool]:
    """(texts, whether one text was given) of a text or a list of texts."""
    if isinstance(inputs, str):
        return [inputs], True
    if isinstance(inputs, (list, tuple)) and all(isinstance(text, str) for text in inputs):
        return list(inputs), False
    raise InputError(f"{task} takes a text or a list of texts, got {describe(inputs)}")


def describe(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"


def token_limit(pipe: Pipeline, options: dict[str, Any]) -> int | None:
    """How many tokens an input keeps: `max_length`, or with truncation=True the tokenizer's model_max_length, as
    transformers' tokenizer cuts (within the model's positions); None: not cut, as transformers reads a text."""
    if options["max_length"] is None and not options["truncation"]:
        return None
    return min(options["max_length"] or pipe.tokenizer.model_max_length, pipe.positions)


# --- feature-extraction ---------------------------------------------------------------------------------------

def last_hidden_state(output) -> tuple[torch.Tensor, ...]:
    return (output.last_hidden_state,)


def extract(pipe: Pipeline, inputs: Any, options: dict[str, Any], given: set[str]) -> Any:
    """Per text, the last layer's vectors of every token, [CLS] and [SEP] included (unless tokenize_kwargs'
    add_special_tokens is false): a [1][tokens][hidden] list, or with return_tensors=True a (1, tokens, hidden)
    tensor."""
    texts, single = text_batch(inputs, pipe.task)
    tokenizing = {"add_special_tokens": True, **(options["tokenize_kwargs"] or {})}  # over the call's cutting
    limit = token_limit(pipe, options | tokenizing)  # transformers' way to say how to cut
    encoded = pipe.tokenizer(texts, truncation=limit is not None, max_length=limit,
                             add_special_tokens=tokenizing["add_special_tokens"])
    rows = [{"input_ids": ids, "token_type_ids": segments}
            for ids, segments in zip(encoded["input_ids"], encoded["token_type_ids"])]
    empty = next((index for index, row in enumerate(rows) if not row["input_ids"]), None)
    if empty is not None:  # add_special_tokens False on a text of no word piece
        raise InputError(f"text {empty} has no token to read without [CLS] and [SEP]")
    longest = max((len(row["input_ids"]) for row in rows), default=0)
    if longest > pipe.positions:
        raise InputError(f"a text is {longest} tokens long; the model reads at most {pipe.positions} "
                         "(truncation=True cuts it)")
    states = pipe.outputs(Features(rows, list(range(len(rows)))), last_hidden_state, options["batch_size"])
    answers = [vectors[None] if options["return_tensors"] else [vectors.tolist()] for (vectors,) in states]
    return answers[0] if single else answers


# --- fill-mask ------------------------------------------------------------------------------------------------

def fill(pipe: Pipeline, inputs: Any, options: dict[str, Any], given: set[str]) -> Any:
    """Per [MASK], the top_k tokens {score, token, token_str, sequence}: a list for a text with one mask, a list
    per mask for several; a list of those for several texts (a list of one text answers as the text alone)."""
    texts, single = text_batch(inputs, pipe.task)
    targets = target_ids(pipe.tokenizer, options["targets"])
    limit = token_limit(pipe, {**CUTTING_DEFAULTS, **(options["tokenizer_kwargs"] or {})})
    answers = [filled(pipe, text, options["top_k"], targets, limit) for text in texts]
    return answers[0] if single or len(answers) == 1 else answers


def filled(pipe: Pipeline, text: str, top_k: int, targets: set[int] | None, limit: int | None) -> list:
    # With targets, every token's probability (softmax over the whole vocabulary), of which the targets' are kept.
    kept = top_k if targets is None else pipe.model.config.vocab_size
    predictions = fill_mask(pipe.model, pipe.tokenizer, text, kept, limit)
    ids = pipe.tokenizer(text, truncation=limit is not None, max_length=limit)["input_ids"]
    return fill_answer(pipe.tokenizer, ids, predictions, top_k, targets)


def fill_answer(tokenizer: BertTokenizer, ids: list[int], predictions: list[list[tuple[str, float]]], top_k: int,
                targets: set[int] | None) -> list:
    """transformers' answer for one text of token `ids` whose masks' likeliest tokens are `predictions` (every
    token's, in order, when there are targets): per mask its top_k {score, token, token_str, sequence}, a mask's
    list alone for a text of one."""
    masks = mask_positions(tokenizer, ids)
    one_mask = len(masks) == 1
    answers = []
    for position, candidates in zip(masks, predictions):
        answer = []
        for token, score in candidates:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if targets is not None and token_id not in targets:
                continue
            sequence = [token_id if index == position else other for index, other in enumerate(ids)]
            # Each mask's sequence keeps the other masks, and then [CLS] and [SEP] too, as transformers writes it.
            answer.append({"score": score, "token": token_id, "token_str": tokenizer.decode([token_id]),
                           "sequence": tokenizer.decode([i for i in sequence if i != tokenizer.pad_token_id],
                                                        skip_special_tokens=one_mask)})
            if len(answer) == top_k:
                break
        answers.append(answer)
    return answers[0] if one_mask else answers


def target_ids(tokenizer: BertTokenizer, targets: str | Sequence[str] | None) -> set[int] | None:
    """The token ids of fill-mask's `targets`: a token of the vocabulary, else the first token of the text."""
    if targets is None:
        return None
    vocab = tokenizer.get_vocab()
    ids = set()
    for target in [targets] if isinstance(targets, str) else targets:
        if target in vocab:
            ids.add(vocab[target])
            continue
        pieces = tokenizer(str(target), add_special_tokens=False, truncation=False)["input_ids"]
        if pieces:
            logger.warning("target %r is not in the vocabulary; using its first token %r", target,
                           tokenizer.convert_ids_to_tokens(pieces[0]))
            ids.add(pieces[0])
    if not ids:
        raise InputError(f"no token to score: none of the targets {targets!r} is in the vocabulary or tokenizes")
    return ids


# --- text-classification --------------------------------------------------------------------------------------

def classify(pipe: Pipeline, inputs: Any, options: dict[str, Any], given: set[str]) -> Any:
    """Per text (or {"text", "text_pair"} dict), {label, score} of the best label; with top_k (None: all) the top
    labels best first. As transformers 5: one text answers in a list of one unless the call names top_k.
    `return_all_scores=True` (transformers 4's spelling of top_k=None) answers as transformers 4 did: every label,
    one text's in a list of one."""
    if isinstance(inputs, (str, Mapping)):
        items = [classification_item(inputs)]
    elif isinstance(inputs, (list, tuple)):
        items = [classification_item(item) for item in inputs]
    else:
        raise InputError(f"{pipe.task} takes a text, a {{\"text\", \"text_pair\"}} dict or a list of them, "
                         f"got {describe(inputs)}")
    top_k = None if options["return_all_scores"] and "top_k" not in given else options["top_k"]
    function = str(options["function_to_apply"] or classification.TASK_SCORES[pipe.definition.name]).lower()
    scores = classification.SCORE_FUNCTIONS[function](sequence_logits(pipe, items, token_limit(pipe, options),
                                                       options["batch_size"]))
    answers = []
    for row in scores:
        ranked = [{"label": answer["label"], "score": answer["score"]}  # transformers' key order
                  for answer in classification.ranked_scores(row, pipe.model.config.id2label,
                                                             1 if top_k is NOT_GIVEN else top_k)]
        answers.append(ranked[0] if top_k is NOT_GIVEN else ranked)
    if isinstance(inputs, str) and ("top_k" not in given or options["return_all_scores"]):
        return [answers[0]]
    return answers[0] if isinstance(inputs, (str, Mapping)) else answers


def classification_item(item: Any) -> tuple[str, str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, Mapping) and isinstance(item.get("text"), str) and set(item) <= {"text", "text_pair"}:
        return item["text"], item.get("text_pair")
    raise InputError(f"expected a text or a {{\"text\", \"text_pair\"}} dict, got {str(item)[:60]!r}")


def sequence_logits(pipe: Pipeline, items: list[tuple[str, str | None]], limit: int | None,
                    batch_size: int) -> torch.Tensor:
    """(items, labels) logits from the task's encode and outputs, single texts and pairs encoded apart (a task
    encodes one kind at a time); a text longer than the limit (the model's positions when not cut) is read as the
    training run said: truncated, or in windows whose logits are averaged."""
    task = pipe.definition
    settings = dataclasses.replace(pipe.settings, max_length=limit or pipe.positions)
    logits = torch.empty(len(items), pipe.model.config.num_labels)
    for paired in (False, True):
        chosen = [index for index, (_, pair) in enumerate(items) if (pair is not None) == paired]
        if chosen:
            examples = [task.example(*items[index]) for index in chosen]
            features = task.encode(pipe.tokenizer, examples, settings, pipe.model.config.id2label)
            outputs = pipe.outputs(features, task.outputs, batch_size)
            logits[chosen] = classification.example_logits(features, outputs, len(examples))
    return logits


# --- zero-shot-classification ---------------------------------------------------------------------------------

def zero_shot(pipe: Pipeline, inputs: Any, options: dict[str, Any], given: set[str]) -> Any:
    """Per text, {sequence, labels, scores}: each candidate label put in the hypothesis template and read by a
    natural-language-inference classifier as the text's continuation. The labels compete in a softmax of their
    entailment logits; with multi_label (or one label) each label's score is entailment against contradiction. As
    transformers' zero-shot pipeline: the entailment label is the one whose name starts with "entail" (else the
    last), contradiction the first (the last when entailment is the first; a one-output model's scores are so
    0.5 each, as there)."""
    texts, single = text_batch(inputs, pipe.task)
    labels = candidate_labels(options["candidate_labels"])
    template = options["hypothesis_template"]
    if not isinstance(template, str) or fills(template) in (None, template):
        raise ConfigError(f"hypothesis_template must hold one {{}} where the label goes, got {template!r}")
    names = [str(name).lower() for name in pipe.model.config.id2label.values()]
    entailment = next((index for index, name in enumerate(names) if name.startswith("entail")), -1)
    contradiction = -1 if entailment == 0 else 0
    items = [(text, template.format(label)) for text in texts for label in labels]
    logits = sequence_logits(pipe, items, None, options["batch_size"]).view(len(texts), len(labels), -1)
    if options["multi_label"] or len(labels) == 1:
        scores = logits[..., [contradiction, entailment]].softmax(-1)[..., 1]
    else:
        scores = logits[..., entailment].softmax(-1)
    answers = []
    for text, row in zip(texts, scores):
        order = row.argsort(stable=True).flip(0).tolist()  # equal scores: the later label first, as transformers
        answers.append({"sequence": text, "labels": [labels[i] for i in order],
                        "scores": [row[i].item() for i in order]})
    return answers[0] if single else answers


def candidate_labels(labels: Any) -> list[str]:
    """transformers' forms: a list of labels, or one text of labels separated by commas."""
    if isinstance(labels, str):
        labels = [label.strip() for label in labels.split(",") if label.strip()]
    if not labels or not isinstance(labels, (list, tuple)) or not all(isinstance(label, str) for label in labels):
        raise ConfigError(f"candidate_labels must be one or more labels (a list, or a text of labels separated by "
                          f"commas), got {labels!r:.60}")
    return list(labels)


# --- token-classification -------------------------------------------------------------------------------------

# How transformers' word strategies make one label distribution of a word's pieces' (pieces, labels).
WORD_SCORES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "first": lambda probs: probs[0],
    "average": lambda probs: probs.mean(0),
    "max": lambda probs: probs[probs.max(-1).values.argmax()],  # the piece of the most confident label
}
AGGREGATIONS = ("none", "simple", *WORD_SCORES)  # "none": every piece; "simple": pieces grouped into entities


def tag(pipe: Pipeline, inputs: Any, options: dict[str, Any], given: set[str]) -> Any:
    """Per text, with aggregation_strategy "none" each word piece whose label isn't ignored {entity, score, index,
    word, start, end}; otherwise entities {entity_group, score, word, start, end} of pieces ("simple") or of whole
    words labelled as WORD_SCORES says. Texts are cut at the tokenizer's model_max_length, as transformers cuts,
    unless `stride` asks for every window of that length, consecutive windows sharing `stride` pieces (where
    windows' entities overlap, the longer is kept, of equal ones the surer). With is_split_into_words, a text is a
    list of words, joined by `delimiter` where the answer's spans point."""
    strategy = str(options["aggregation_strategy"]).lower()
    ignored = {options["ignore_labels"]} if isinstance(options["ignore_labels"], str) else set(options["ignore_labels"])
    limit = readable_length(pipe.model, pipe.tokenizer)
    stride = options["stride"]
    if stride is not None and strategy == "none":
        raise ConfigError("stride tags every window of a long text and joins their entities: choose an "
                          "aggregation_strategy other than 'none'")
    if stride is not None and stride >= limit - 2:
        raise ConfigError(f"stride={stride} must be less than the {limit - 2} word pieces a window of the model's "
                          f"{limit} tokens holds")
    if options["is_split_into_words"]:
        word_lists, single = word_batch(inputs, pipe.task)
        split = [SplitWords.of(words) for words in word_lists]
        texts = [str(text) for text in split]  # plain text: the tokenizer reads words split at spaces as given
    else:
        texts, single = text_batch(inputs, pipe.task)
    sentences = [piece_sentence(pipe.tokenizer, text, None if stride is not None else limit) for text in texts]
    settings = dataclasses.replace(pipe.settings, max_length=limit, context="sentence", doc_stride=stride or 0)
    features = pipe.definition.encode(pipe.tokenizer, sentences, settings, pipe.model.config.id2label)
    outputs = pipe.outputs(features, pipe.definition.outputs, options["batch_size"])
    windows: list[list[list[dict[str, Any]]]] = [[] for _ in sentences]
    for window, (logits,) in zip(features.extras, outputs, strict=True):
        windows[window.sentence].append(tagged(pipe, sentences[window.sentence], window, logits, strategy, ignored))
    answers = [found[0] if len(found) == 1 else longest_of_overlaps([item for part in found for item in part])
               for found in windows]
    if options["is_split_into_words"]:
        delimiter = " " if options["delimiter"] is None else options["delimiter"]
        answers = [[{**item, "start": moved(item["start"]), "end": moved(item["end"], end=True)} for item in answer]
                   for answer, moved in ((answer, delimited(text, delimiter)) for answer, text in zip(answers, split))]
    return answers[0] if single else answers


def word_batch(inputs: Any, task: str) -> tuple[list[list[str]], bool]:
    """(texts as word lists, whether one text was given) of is_split_into_words inputs: a list of words, or a
    list of them. One list of words is answered in a list of one, as transformers answers it."""
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(word, str) for word in inputs):
        return [list(inputs)], False
    if isinstance(inputs, (list, tuple)) and all(
            isinstance(words, (list, tuple)) and all(isinstance(word, str) for word in words) for words in inputs):
        return [list(words) for words in inputs], False
    raise InputError(f"{task} with is_split_into_words takes a list of words or a list of them, got "
                     f"{describe(inputs)}")


def delimited(text: SplitWords, delimiter: str) -> Callable[..., int]:
    """moved(position[, end]): a character position in the words joined by spaces (`text`), in the words joined by
    `delimiter`: shifted by the delimiter's extra length once per word before it (an end position: the word it
    ends)."""

    def moved(position: int, end: bool = False) -> int:
        return position + text.word_at(position - end) * (len(delimiter) - 1)

    return moved


def longest_of_overlaps(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entity where windows' entities overlap, in order of start: of entities starting within the one before,
    the longer (of equal lengths the higher score) is kept, as transformers joins its windows."""
    kept: list[dict[str, Any]] = []
    for entity in sorted(entities, key=lambda item: item["start"]):
        if kept and kept[-1]["start"] <= entity["start"] < kept[-1]["end"]:
            length, kept_length = entity["end"] - entity["start"], kept[-1]["end"] - kept[-1]["start"]
            if length > kept_length or length == kept_length and entity["score"] > kept[-1]["score"]:
                kept[-1] = entity
        else:
            kept.append(entity)
    return kept


def piece_sentence(tokenizer: BertTokenizer, text: str, limit: int | None) -> TaggedSentence:
    """The text as the ner task reads a sentence, each word piece of its first `limit` tokens ([CLS] and [SEP]
    counted; None: all) a word of its own: the task then gives every piece a place of its own in a window."""
    encoded = tokenizer(text, truncation=limit is not None, max_length=limit, return_offsets_mapping=True)
    spans = [(start, end) for start, end in encoded["offset_mapping"][1:-1]]
    return TaggedSentence([text[start:end] for start, end in spans], [], source=text, spans=spans)


def tagged(pipe: Pipeline, sentence: TaggedSentence, window: TokenFeatures, logits: torch.Tensor, strategy: str,
           ignored: set[str]) -> list[dict[str, Any]]:
    tokenizer, id2label = pipe.tokenizer, pipe.model.config.id2label
    # A piece sharing its start with the one before (rare normalisations) was read with it and has no place.
    pieces = [piece for piece in range(len(sentence.words)) if piece in window.word_positions]
    positions = [window.word_positions[piece] for piece in pieces]
    probs = logits[positions].float().softmax(-1)  # (pieces, labels): each piece's own label distribution
    ids = [window.input_ids[position] for position in positions]
    spans = [sentence.spans[piece] for piece in pieces]
    # An unknown piece is named by its text, and starts a word, as transformers does.
    words = [sentence.text[start:end] if token_id == tokenizer.unk_token_id else token
             for token_id, token, (start, end) in zip(ids, tokenizer.convert_ids_to_tokens(ids), spans)]
    if strategy in ("none", "simple"):
        groups = [[index] for index in range(len(pieces))]
    else:
        groups = word_groups(words, spans, ids, tokenizer.unk_token_id)
        probs = torch.stack([WORD_SCORES[strategy](probs[group]) for group in groups]) if groups else probs
    labels = probs.argmax(-1).tolist()
    scores = probs.max(-1).values.tolist()
    tags = [id2label[label] for label in labels]
    if strategy == "none":
        return [{"entity": tags[index], "score": scores[index], "index": positions[index], "word": words[index],
                 "start": spans[index][0], "end": spans[index][1]}
                for index in range(len(pieces)) if tags[index] not in ignored]
    units = [tokenizer.convert_tokens_to_string([words[index] for index in group]) for group in groups]
    unit_spans = [(spans[group[0]][0], spans[group[-1]][1]) for group in groups]
    first = {start: unit for unit, (start, _) in enumerate(unit_spans)}
    last = {end: unit for unit, (_, end) in enumerate(unit_spans)}
    entities = tagged_entities(TaggedSentence(units, [], source=sentence.text, spans=unit_spans), tags, scores)
    if OUTSIDE not in ignored:  # the runs of units outside entities, as transformers groups them when asked
        entities = sorted(entities + outside_runs(tags, scores, unit_spans), key=lambda entity: entity["start"])
    return [{"entity_group": entity["type"], "score": entity["score"],
             "word": tokenizer.convert_tokens_to_string(units[first[entity["start"]]:last[entity["end"]] + 1]),
             "start": entity["start"], "end": entity["end"]}
            for entity in entities if entity["type"] not in ignored]


def outside_runs(tags: list[str], scores: list[float], spans: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Each run of consecutive units tagged O as one group {type, score (their mean), start, end}."""
    runs = []
    for outside, group in itertools.groupby(range(len(tags)), key=lambda unit: tags[unit] == OUTSIDE):
        units = list(group)
        if outside:
            runs.append({"type": OUTSIDE, "score": sum(scores[unit] for unit in units) / len(units),
                         "start": spans[units[0]][0], "end": spans[units[-1]][1]})
    return runs


def word_groups(words: list[str], spans: list[tuple[int, int]], ids: list[int], unk_token_id: int
                ) -> list[list[int]]:
    """The pieces of each word: a piece continues a word when its token is longer than the characters it covers
    ("##son" over "son"), transformers' test."""
    groups: list[list[int]] = []
    for index, (word, (start, end), token_id) in enumerate(zip(words, spans, ids)):
        if groups and token_id != unk_token_id and len(word) != end - start:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


# --- question-answering ---------------------------------------------------------------------------------------

def answer(pipe: Pipeline, inputs: Any, options: dict[str, Any], given: set[str]) -> Any:
    """Per question, {score, start, end, answer}: the best span of its context (the top_k best, in a list), its
    score the probability transformers gives it; "" at 0, 0 when handle_impossible_answer lets "no answer" win."""
    pairs = question_pairs(inputs, options["question"], options["context"])
    settings = qa_settings(pipe, options)
    task = pipe.definition
    examples = [task.example(question, context) for question, context in pairs]
    features = task.encode(pipe.tokenizer, examples, settings, {})
    outputs = pipe.outputs(features, task.outputs, options["batch_size"])
    scored = [span_log_probabilities(starts, ends, window)
              for (starts, ends), window in zip(outputs, features.extras, strict=True)]
    decoded = task.decode(features, examples, scored, pipe.model.config)
    answers = [ranked_answers(pipe.tokenizer, example.context, found["n_best"], options["top_k"],
                              bool(options["align_to_words"])) for example, found in zip(examples, decoded)]
    return answers[0] if len(answers) == 1 else answers


def question_pairs(inputs: Any, question: Any, context: Any) -> list[tuple[str, str]]:
    """(question, context) pairs from transformers' forms: question= and context= (texts; several questions about
    one context; or lists of both; or the two by position, `qa(question, context)`), a {"question", "context"}
    dict, or a list of them."""
    if question is None and context is not None and (isinstance(inputs, str) or (
            isinstance(inputs, (list, tuple)) and all(isinstance(item, str) for item in inputs))):
        inputs, question = None, inputs  # the question(s) by position, the context after them
    if inputs is not None and (question is not None or context is not None):
        raise InputError("give the questions either as question= and context=, or as dicts, not both")
    if inputs is None:
        if question is None or context is None:
            raise InputError("question-answering needs question= and context= (or {\"question\", \"context\"} dicts)")
        questions = [question] if isinstance(question, str) else question
        if not isinstance(questions, (list, tuple)) or not isinstance(context, (str, list, tuple)):
            raise InputError("question= and context= take a text or a list of texts each")
        contexts = [context] * len(questions) if isinstance(context, str) else context
        if len(questions) != len(contexts):
            raise InputError(f"got {len(questions)} questions but {len(contexts)} contexts")
        pairs = list(zip(questions, contexts))
    else:
        items = [inputs] if isinstance(inputs, Mapping) else inputs
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, Mapping) for item in items):
            raise InputError(f"question-answering takes {{\"question\", \"context\"}} dicts, got {describe(inputs)}")
        pairs = [(item.get("question"), item.get("context")) for item in items]
    for question_text, context_text in pairs:
        for name, text in (("question", question_text), ("context", context_text)):
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"each {name} must be a non-empty text, got {text!r:.60}")
    return pairs


def fills(template: str) -> str | None:
    """The template with a label in its {} (the template unchanged without one); None where str.format can't fill
    it with one label ("{} and {}", "{name}")."""
    try:
        return template.format("x")
    except (IndexError, KeyError, ValueError):
        return None


def qa_settings(pipe: Pipeline, options: dict[str, Any]) -> EncodeSettings:
    """The qa task's settings from transformers 4's options and defaults: windows of max_seq_len tokens
    (the tokenizer's model_max_length, at most 384) sharing doc_stride tokens (half a window, at most 128), spans
    of at most max_answer_len tokens. n_best is a window's every token: the decode pairs every start with every
    end, as transformers does, before ranked_answers keeps transformers' number of candidates."""
    max_seq_len = options["max_seq_len"] or min(pipe.tokenizer.model_max_length, 384)
    check_within_positions(max_seq_len, pipe.positions, "max_seq_len")
    doc_stride = options["doc_stride"] if options["doc_stride"] is not None else min(max_seq_len // 2, 128)
    # A window keeps room for max_question_len question tokens and more context than the stride repeats;
    # transformers cuts no question, so by default the room follows the window.
    question_room = options["max_question_len"] or max(1, min(64, max_seq_len - 4 - doc_stride))
    return dataclasses.replace(pipe.settings, max_length=max_seq_len, doc_stride=doc_stride,
                               max_query_length=question_room, n_best=max_seq_len,
                               max_answer_length=options["max_answer_len"],
                               version_2=bool(options["handle_impossible_answer"]), null_score_threshold=0.0)


def span_log_probabilities(starts: torch.Tensor, ends: torch.Tensor, window: SpanFeatures
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A window's start and end logits as log-probabilities over the places an answer may start or end ([CLS]:
    none, and the context's tokens), as transformers normalises them: the task's decode scores a span by
    log p(start) + log p(end), so exp(score) is transformers' score, and "no answer" the [CLS] pair's."""
    readable = torch.tensor([position == 0 or offset is not None for position, offset in enumerate(window.offsets)])
    return (starts.float().masked_fill(~readable, -math.inf).log_softmax(-1),
            ends.float().masked_fill(~readable, -math.inf).log_softmax(-1))


def ranked_answers(tokenizer: BertTokenizer, context: str, candidates: list[dict[str, Any]], top_k: int,
                   align_to_words: bool) -> dict[str, Any] | list[dict[str, Any]]:
    """The decode's candidates (best first) as transformers 4 answers: its candidates (top_k * 2 + 10 spans when
    they are widened to whole words, else top_k) and the null answer if the decode gave it, answers of the same
    text (in any case) made one whose score is the sum of theirs, the top_k best; one answer is a dict, several a
    list. A context split into windows gets the best spans of all its windows, each span once."""
    spans = [found for found in candidates if found["end"] > found["start"]]
    null = [found for found in candidates if found["end"] == found["start"] and found["score"] is not None]
    words = word_spans(tokenizer, context) if align_to_words else None
    answers: dict[str, dict[str, Any]] = {}
    for candidate in null + spans[:top_k * 2 + 10 if align_to_words else top_k]:
        start, end = candidate["start"], candidate["end"]
        if words and end > start:
            start, end = widened(words, start, end)
        score = math.exp(candidate["score"])
        text = context[start:end]
        if text.lower() in answers:
            answers[text.lower()]["score"] += score
        else:
            answers[text.lower()] = {"score": score, "start": start, "end": end, "answer": text}
    ranked = sorted(answers.values(), key=lambda found: found["score"], reverse=True)[:top_k]
    return ranked[0] if len(ranked) == 1 else ranked


def word_spans(tokenizer: BertTokenizer, text: str) -> list[tuple[int, int]]:
    """(start, end) of each of the tokenizer's words (split at spaces and punctuation) in `text`, in order."""
    encoded = tokenizer(text, truncation=False, return_offsets_mapping=True, return_word_ids=True)
    spans: dict[int, tuple[int, int]] = {}
    for (start, end), word in zip(encoded["offset_mapping"], encoded["word_ids"]):
        if word is not None:
            spans[word] = (spans[word][0], end) if word in spans else (start, end)
    return sorted(spans.values())


def widened(words: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """A character span stretched to the starts and ends of the words it touches."""
    starts = [word_start for word_start, _ in words]
    return words[bisect_right(starts, start) - 1][0], words[bisect_right(starts, end - 1) - 1][1]


# --- the tasks ------------------------------------------------------------------------------------------------

# Cut inputs (transformers' tokenizer options): to max_length tokens, or with truncation=True to model_max_length.
CUTTING = {"truncation": Option(False), "max_length": Option(None, lambda name, value: check_number(
    name, value, minimum=3, integer=True, optional=True))}
CUTTING_DEFAULTS = {name: option.default for name, option in CUTTING.items()}


def cutting_options(name: str, value: Any, allowed: Mapping[str, Option] = CUTTING) -> None:
    """transformers' tokenize_kwargs (feature-extraction) and tokenizer_kwargs (fill-mask): the CUTTING options (and
    feature-extraction's add_special_tokens) as a dict, each checked as given by name."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a dict of {', '.join(allowed)}, got {value!r:.60}")
    for key, given in value.items():
        check_choice(key, allowed, f"{name} key")
        allowed[key].check(key, given)


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r:.60}")


# feature-extraction's tokenize_kwargs: how to cut, and whether to add [CLS] and [SEP] (their vectors then absent)
TOKENIZING = {**CUTTING, "add_special_tokens": Option(True, boolean)}


PIPELINE_TASKS: dict[str, PipelineTask] = {
    "feature-extraction": PipelineTask("encoder", {**CUTTING, "return_tensors": Option(False),
                                                   "tokenize_kwargs": Option(None, lambda name, value: cutting_options(
                                                       name, value, TOKENIZING))}, extract),
    "fill-mask": PipelineTask("masked_lm", {"top_k": Option(5, positive, none_is_default=True),
                                            "targets": Option(None, text_or_texts),
                                            "tokenizer_kwargs": Option(None, cutting_options)}, fill,
                              list_of_one_alone=True),
    "text-classification": PipelineTask("sequence_classification", {
        # top_k=None: every label; not given at all, the best label alone and not in a list (see classify)
        "top_k": Option(NOT_GIVEN, lambda name, value: value is NOT_GIVEN or zero_or_more_or_none(name, value)),
        "function_to_apply": Option(None, one_of(list(classification.SCORE_FUNCTIONS))),
        # padding: how transformers' tokenizer fills its batches, which changes no score
        "padding": Option(False, lambda name, value: isinstance(value, bool) or check_choice(
            str(value).lower(), ("longest", "max_length", "do_not_pad"), name)),
        "return_all_scores": Option(False), **CUTTING}, classify),
    "token-classification": PipelineTask("token_classification", {
        "aggregation_strategy": Option("none", one_of(AGGREGATIONS), none_is_default=True),
        "ignore_labels": Option([OUTSIDE], text_or_texts, none_is_default=True),
        "stride": Option(None, zero_or_more_or_none),
        "is_split_into_words": Option(False), "delimiter": Option(None, a_text)}, tag),
    "question-answering": PipelineTask("question_answering", {
        "question": Option(None), "context": Option(None), "top_k": Option(1, positive),
        "max_answer_len": Option(15, positive), "max_seq_len": Option(None, positive_or_none),
        "doc_stride": Option(None, zero_or_more_or_none),
        "max_question_len": Option(None, positive_or_none), "handle_impossible_answer": Option(False),
        "align_to_words": Option(True)}, answer, positional=("context",), list_of_one_alone=True),
    "zero-shot-classification": PipelineTask("sequence_classification", {
        "candidate_labels": Option(None), "hypothesis_template": Option("This example is {}."),
        "multi_label": Option(False)}, zero_shot, positional=("candidate_labels",)),
}
TASK_ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}
