"""Task heads on top of the encoder, and the BertFor* models that pair them with it (Hugging Face's names).

Shapes: batch, seq (positions per sequence), hidden, labels (num_labels), choices (answers offered per question).
Each head is a Linear subclass, so a head attribute named `classifier` holds exactly `classifier.weight` and
`classifier.bias`: the names in every fine-tuned BERT checkpoint, with no entry in the key table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.checkpoint.default_model import resolve_model_dir
from bertforge.checkpoint.hf_format import config_path
from bertforge.checkpoint.pretrained import Model, Pretrained
from bertforge.config import PROBLEM_TYPES, BertConfig, bert_config
from bertforge.errors import ConfigError, InputError
from bertforge.model import BertModel, check_input_shapes
from bertforge.model_output import ModelOutput, returned
from bertforge.packing import real_token_mask
from bertforge.validation import check_number

# Label value that contributes nothing to a classification loss (padding, sub-word continuations);
# PyTorch's and Hugging Face's default.
IGNORE_INDEX = -100


def encoder_of(model: nn.Module) -> BertModel:
    """The bare encoder of a model: itself, or a task model's `.bert`."""
    return getattr(model, "bert", model)


@dataclass
class ClassifierOutput(ModelOutput):
    logits: torch.Tensor  # (batch, labels) per sequence, (batch, seq, labels) per token, (batch, choices) per question
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None  # as EncoderOutput's, when asked for
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class SpanOutput(ModelOutput):
    start_logits: torch.Tensor  # (batch, seq)
    end_logits: torch.Tensor  # (batch, seq)
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None  # as EncoderOutput's, when asked for
    attentions: tuple[torch.Tensor, ...] | None = None


def regression_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the one output against float targets."""
    return F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1))


def single_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the labels; entries equal to -100 are ignored (padding, later sub-words)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def multi_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of each label's sigmoid against 0/1 targets, averaged over examples and labels."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


# A classifier's loss by its problem_type (config.json's, as transformers names them). All are computed in
# float32: a bf16 log-softmax loses the small differences that training follows.
LOSSES = dict(zip(PROBLEM_TYPES, (regression_loss, single_label_loss, multi_label_loss), strict=True))


def problem_type_of(num_labels: int, problem_type: str | None) -> str:
    """The LOSSES key of a classifier: the given one, else regression for one output, else single-label."""
    return problem_type or ("regression" if num_labels == 1 else "single_label_classification")


class ClassificationHead(nn.Linear):
    """Dropout and a linear layer on one vector per example: (..., hidden) -> (..., labels).

    `problem_type` (a LOSSES key; None: regression for one label, single-label otherwise) says which loss trains
    it: regression (one score, as GLUE's STS-B), one label per example, or any number of them (multi-label).
    """

    def __init__(self, hidden_size: int, num_labels: int, dropout: float, problem_type: str | None = None):
        if num_labels < 1:
            raise ConfigError(f"a classification head needs at least one label, got num_labels={num_labels}")
        super().__init__(hidden_size, num_labels)
        self.dropout = nn.Dropout(dropout)
        self.problem_type = problem_type_of(num_labels, problem_type)
        self.problem_type_given = problem_type is not None
        if self.problem_type not in LOSSES:
            raise ConfigError(f"problem_type {self.problem_type!r} is not supported; choose from {', '.join(LOSSES)}")
        self.is_regression = self.problem_type == "regression"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.dropout(x))

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The problem type's loss: class ids (-100 ignored), float scores, or (batch, labels) 0/1 targets. With
        no problem_type configured, per-sequence float targets shaped like the logits (several labels) are
        multi-label, as transformers reads them; the first labels decide it for good, as there."""
        if not isinstance(labels, torch.Tensor):
            raise InputError(f"labels must be a tensor, got a {type(labels).__name__}")
        if not self.problem_type_given:
            if (self.out_features > 1 and logits.dim() == 2 and labels.is_floating_point()
                    and labels.shape == logits.shape):
                self.problem_type = "multi_label_classification"
            self.problem_type_given = True
        if self.problem_type == "single_label_classification":
            check_class_labels(labels, logits.shape, "class", per="example" if logits.dim() == 2 else "token")
        return LOSSES[self.problem_type](logits, labels)


class TokenClassificationHead(ClassificationHead):
    """The classification head applied to every token: (batch, seq, hidden) -> (batch, seq, labels).

    Label tokens that have no tag (padding, special tokens, later sub-words of a word) with -100. The loss is
    cross-entropy whatever config.json's problem_type, and for one label too (a token scorer trained with a loss
    of its own), as transformers' BertForTokenClassification has it.
    """

    def __init__(self, hidden_size: int, num_labels: int, dropout: float):
        super().__init__(hidden_size, num_labels, dropout, problem_type="single_label_classification")


class SpanHead(nn.Linear):
    """Start and end scores for every token, from one linear layer (the BERT paper's S and E vectors)."""

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start_logits, end_logits = super().forward(x).unbind(-1)  # (batch, seq) each
        return start_logits, end_logits

    def loss(self, logits: tuple[torch.Tensor, torch.Tensor], labels: tuple[torch.Tensor, torch.Tensor],
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean of the start and end cross-entropies; `labels` are (start_positions, end_positions).

        As in Hugging Face: positions are clamped to [0, seq], and position seq (an answer truncated out of
        this window) is ignored; a negative position becomes 0, the [CLS] token of "no answer". Unlike it, padding
        is no candidate: an example's loss doesn't depend on how much padding its batch has (transformers puts the
        scores of padding tokens in the softmax; bertforge computes no hidden state there to score), and a position
        on padding is ignored, as one past the window is.
        """
        losses = []
        for position_logits, positions in zip(logits, labels):
            seq_len = position_logits.shape[1]
            positions = positions.reshape(-1).clamp(0, seq_len)
            position_logits = position_logits.float()
            if attention_mask is not None:
                position_logits = position_logits.masked_fill(attention_mask == 0, torch.finfo(torch.float32).min)
                padding = F.pad(attention_mask == 0, (0, 1)).gather(1, positions[:, None]).squeeze(1)
                positions = positions.masked_fill(padding, seq_len)
            losses.append(F.cross_entropy(position_logits, positions, ignore_index=seq_len))
        return (losses[0] + losses[1]) / 2


class MultipleChoiceHead(nn.Linear):
    """Dropout and one score per choice, from the choice's pooled [CLS] vector: (..., hidden) -> (...). A softmax
    over a question's choices picks its answer (SWAG, RACE)."""

    def __init__(self, hidden_size: int, dropout: float):
        super().__init__(hidden_size, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.dropout(x)).squeeze(-1)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of (batch, choices) scores against (batch,) right-choice indices (-100 ignored)."""
        return F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def check_class_labels(labels: torch.Tensor, shape: torch.Size | tuple[int, ...], what: str,
                       per: str = "example") -> None:
    """One-line errors for labels that don't fit logits of `shape` (..., classes), instead of cross-entropy's own:
    a tensor of one id per `per` (an example of (batch, classes) logits, a token of (batch, seq, classes)), each a
    class (or -100, ignored). Values are checked where it costs nothing (CPU, eager): a GPU would have to wait."""
    *positions, num_classes = shape
    if not isinstance(labels, torch.Tensor):
        raise InputError(f"labels must be a tensor of {what} ids, got a {type(labels).__name__}")
    # cross-entropy takes int64 (or uint8) targets alone
    if labels.dtype not in (torch.int64, torch.uint8) or labels.numel() != math.prod(positions):
        raise InputError(f"labels must be {tuple(positions)} {what} ids (int64), one per {per}; got "
                         f"{labels.dtype} of shape {tuple(labels.shape)}")
    if labels.device.type != "cpu" or torch.compiler.is_compiling():
        return
    wrong = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
    if wrong.any():
        raise InputError(f"label {int(labels[wrong][0])} is no {what} id: they run from 0 to {num_classes - 1} "
                         f"(-100: ignored)")


def classifier_dropout(config: BertConfig) -> float:
    """The dropout before a classifier: config.classifier_dropout where set, else the hidden states' (as in
    transformers)."""
    return config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout


def default_labels(num_labels: int) -> dict[int, str]:
    """Names for labels nobody named: 3 -> {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}, as Hugging Face writes."""
    return {i: f"LABEL_{i}" for i in range(num_labels)}


# Hugging Face's number of labels when a config names none, so that a bare encoder checkpoint loads into a
# classifier the way users know from transformers.
DEFAULT_NUM_LABELS = 2


class LabelledModel(Pretrained, nn.Module):
    """The encoder plus a head whose size is the number of labels in config.id2label.

    Loading accepts `num_labels=` or `id2label=` (and `label2id=`) on top of config.json's fields.
    """

    # The new head may be missing from a checkpoint (a bare encoder) and then keeps BERT's initialisation.
    initialisable = Pretrained.initialisable + ("classifier.",)

    def __init__(self, config: BertConfig, add_pooler: bool = True):
        super().__init__()
        config = bert_config(config)
        if not config.id2label:
            labels = default_labels(DEFAULT_NUM_LABELS)
            config = dataclasses.replace(config, id2label=labels,
                                         label2id={label: i for i, label in labels.items()})
        self.config = config
        self.bert = BertModel(config, add_pooler=add_pooler)

    @property
    def num_labels(self) -> int:
        return self.config.num_labels

    @classmethod
    def from_pretrained(cls: type[Model], name_or_path: str | Path, num_labels: int | None = None,
                        **config_overrides) -> Model:
        """Like `Pretrained.from_pretrained`; `num_labels=3` names new labels LABEL_0..LABEL_2.

        Example: BertForSequenceClassification.from_pretrained("default", id2label={0: "neg", 1: "pos"}).
        """
        check_number("num_labels", num_labels, minimum=1, integer=True, optional=True)
        id2label = config_overrides.get("id2label")
        if id2label is None and config_overrides.get("label2id") is not None:  # names given the other way round
            id2label = {i: label for label, i in config_overrides["label2id"].items()}
        if num_labels is not None and id2label is not None and len(id2label) != num_labels:
            raise ConfigError(f"num_labels={num_labels} disagrees with the {len(id2label)} labels of id2label")
        if num_labels is not None and id2label is None:
            # Keep the checkpoint's label names when it already has that many labels, as transformers does.
            directory = resolve_model_dir(name_or_path, config_overrides.get("subfolder", ""),
                                          config_overrides.get("cache_dir"), config_overrides.get("revision"))
            saved = BertConfig.load(config_path(directory))
            if saved.num_labels != num_labels:
                id2label = default_labels(num_labels)
        if id2label is not None:
            id2label = {int(i): str(label) for i, label in id2label.items()}
            config_overrides["id2label"] = id2label
            # The checkpoint's label2id describes its old labels; derive the new one unless given.
            config_overrides.setdefault("label2id", {label: i for i, label in id2label.items()})
        return super().from_pretrained(name_or_path, **config_overrides)


class BertForSequenceClassification(LabelledModel):
    """One label (or one score, for regression; or a set of labels, multi-label) per sequence, from the pooled
    [CLS] vector."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        config = self.config
        self.classifier = ClassificationHead(config.hidden_size, self.num_labels, classifier_dropout(config),
                                             config.problem_type)
        self.classifier.apply(self.bert.init_weights)
        self.first_token_only = True  # the pooler reads [CLS] alone: the last layer computes nothing else

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, **encoder_options) -> ClassifierOutput:
        """`labels`: (batch,) class ids, float targets when num_labels == 1, or (batch, labels) 0/1 targets when
        config.problem_type is multi_label_classification. `inputs_embeds`: token vectors in the place of input_ids.
        `encoder_options`: BertModel.forward's output_hidden_states and output_attentions;
        `return_dict=False`: a tuple."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            first_token_only=self.first_token_only, return_dict=True,
                            **encoder_options)
        logits = self.classifier(encoded.pooler_output)  # (batch, labels)
        loss = None if labels is None else self.classifier.loss(logits, labels)
        if labels is not None and self.config.problem_type is None:
            # saved with the model, so that what reads config.json (transformers' pipeline) scores as it was trained
            self.config.problem_type = self.classifier.problem_type
        return returned(ClassifierOutput(logits=logits, loss=loss, hidden_states=encoded.hidden_states,
                                         attentions=encoded.attentions), return_dict)


@contextmanager
def every_position(*models: nn.Module) -> Iterator[None]:
    """Within: the models compute every position of their last layer, for code that reads each layer's output
    through hooks (calibration, hidden-state distillation); the result they return is the same."""
    heads = [module for model in models for module in model.modules() if hasattr(module, "first_token_only")]
    before = [head.first_token_only for head in heads]
    try:
        for head in heads:
            head.first_token_only = False
        yield
    finally:
        for head, value in zip(heads, before):
            head.first_token_only = value


class BertForTokenClassification(LabelledModel):
    """One label per token (e.g. named-entity tags), from the last hidden state."""

    initialisable = ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooler=False)
        self.classifier = TokenClassificationHead(self.config.hidden_size, self.num_labels,
                                                  classifier_dropout(self.config))
        self.classifier.apply(self.bert.init_weights)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, **encoder_options) -> ClassifierOutput:
        """`labels`: (batch, seq) class ids, -100 where a token has no label. `encoder_options`: as
        BertForSequenceClassification's."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True,
                            **encoder_options)
        logits = self.classifier(encoded.last_hidden_state)  # (batch, seq, labels)
        loss = None if labels is None else self.classifier.loss(logits, labels)
        return returned(ClassifierOutput(logits=logits, loss=loss, hidden_states=encoded.hidden_states,
                                         attentions=encoded.attentions), return_dict)


class BertForQuestionAnswering(Pretrained, nn.Module):
    """Extractive question answering: where the answer span starts and ends in the passage."""

    initialisable = ("qa_outputs.",)

    def __init__(self, config: BertConfig):
        super().__init__()
        config = bert_config(config)
        if config.num_labels not in (0, 2):
            # Label names from a classifier checkpoint mean nothing here, and transformers would size its span
            # layer by them; the two outputs are start and end.
            config = dataclasses.replace(config, id2label={}, label2id={})
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        # No dropout before the span scores, as in the original BERT and transformers.
        self.qa_outputs = SpanHead(config.hidden_size)
        self.qa_outputs.apply(self.bert.init_weights)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None, end_positions: torch.Tensor | None = None,
                return_dict: bool | None = None, **encoder_options) -> SpanOutput:
        """`start_positions`, `end_positions`: (batch,) token indices of the answer; both or neither.
        `encoder_options`: as BertForSequenceClassification's."""
        if (start_positions is None) != (end_positions is None):
            raise ValueError("give both start_positions and end_positions, or neither")
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True,
                            **encoder_options)
        start_logits, end_logits = self.qa_outputs(encoded.last_hidden_state)
        loss = None
        if start_positions is not None:
            loss = self.qa_outputs.loss((start_logits, end_logits), (start_positions, end_positions),
                                        real_token_mask(attention_mask))
        return returned(SpanOutput(start_logits=start_logits, end_logits=end_logits, loss=loss,
                                   hidden_states=encoded.hidden_states, attentions=encoded.attentions), return_dict)


class BertForMultipleChoice(Pretrained, nn.Module):
    """Multiple choice (SWAG, RACE): each choice is read with its question as one sequence, and scored from its
    pooled [CLS] vector; the choices of a question compete in a softmax."""

    # An encoder checkpoint gives the scorer BERT's initialisation.
    initialisable = Pretrained.initialisable + ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config = bert_config(config)
        self.bert = BertModel(config)
        self.classifier = MultipleChoiceHead(config.hidden_size, classifier_dropout(config))
        self.classifier.apply(self.bert.init_weights)
        self.first_token_only = True  # the pooler reads [CLS] alone: the last layer computes nothing else

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, **encoder_options) -> ClassifierOutput:
        """Inputs are (batch, choices, seq), every choice padded to one length (`inputs_embeds`: (batch, choices,
        seq, hidden)). `labels`: (batch,) the index of each question's right choice. `encoder_options`: as
        BertForSequenceClassification's; hidden states and attentions are per choice, (batch * choices, ...), as in
        transformers."""
        self.check_inputs(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        batch_size, num_choices = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        # To the encoder every choice is one more sequence: (batch * choices, seq, ...).
        flat = [None if tensor is None else tensor.flatten(0, 1)
                for tensor in (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)]
        encoded = self.bert(*flat, first_token_only=self.first_token_only, return_dict=True, **encoder_options)
        logits = self.classifier(encoded.pooler_output).view(batch_size, num_choices)
        loss = None
        if labels is not None:
            check_class_labels(labels, logits.shape, "choice")
            loss = self.classifier.loss(logits, labels)
        return returned(ClassifierOutput(logits=logits, loss=loss, hidden_states=encoded.hidden_states,
                                         attentions=encoded.attentions), return_dict)

    def check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds) -> None:
        """The (batch, choices, seq) shapes, checked before they are flattened (the encoder checks the rest)."""
        check_input_shapes(("batch", "choices", "seq"), self.config.hidden_size, input_ids, attention_mask,
                           token_type_ids, position_ids, inputs_embeds)
