"""Pre-training heads and models: masked LM (+ next-sentence / sentence-order), and ELECTRA's replaced-token detection.

Shapes: batch, seq, hidden, vocab, masked (the positions with a label). BertForPreTraining, BertForMaskedLM and
BertForNextSentencePrediction save and load as transformers' classes of the same names. The masked-LM decoder is
the word-embedding matrix itself (BERT ties them): the head has no decoder weight of its own and is handed the
matrix, so the tie can't break, nothing is stored twice, and a loaded model is tied by construction (unless its
config unties them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.activations import ACTIVATIONS
from bertforge.checkpoint.pretrained import Pretrained
from bertforge.config import BertConfig, bert_config
from bertforge.errors import ConfigError
from bertforge.heads import IGNORE_INDEX, ClassifierOutput, check_class_labels
from bertforge.model import BertModel, Embeddings
from bertforge.model_output import ModelOutput, by_name_only, returned
from bertforge.packing import real_token_mask

# ELECTRA's weight of the discriminator loss against the generator's MLM loss (Clark et al., 2020, λ = 50).
DISCRIMINATOR_WEIGHT = 50.0


@dataclass
class MaskedLMOutput(ModelOutput):
    # (batch, seq, vocab), as transformers gives; with labels and masked_logits_only, (masked, vocab) in the order
    # of labels != -100: pre-training scores only those (the vocabulary projection is most of the head's cost).
    logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None  # as EncoderOutput's, when asked for
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class PreTrainingOutput(ModelOutput):
    prediction_logits: torch.Tensor  # as MaskedLMOutput.logits
    seq_relationship_logits: torch.Tensor  # (batch, 2)
    loss: torch.Tensor | None = None  # masked_lm_loss + sentence_pair_loss
    masked_lm_loss: torch.Tensor | None = by_name_only()
    sentence_pair_loss: torch.Tensor | None = by_name_only()
    hidden_states: tuple[torch.Tensor, ...] | None = None  # as EncoderOutput's, when asked for
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class ElectraOutput(ModelOutput):
    loss: torch.Tensor  # generator_loss + discriminator_weight * discriminator_loss
    generator_loss: torch.Tensor
    discriminator_loss: torch.Tensor
    generator_logits: torch.Tensor  # (masked, vocab)
    discriminator_logits: torch.Tensor  # (batch, seq): > 0 means "replaced"
    replaced: torch.Tensor  # (batch, seq) bool: the discriminator's targets
    corrupted_ids: torch.Tensor  # (batch, seq): what the discriminator read


class MaskedLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> scores against every word embedding, plus a per-token output bias.

    `embedding_size` is the width of the word embeddings when it differs from the encoder's (ELECTRA's smaller
    generator reads the discriminator's embeddings). `tied=False` (config.json's tie_word_embeddings: false) gives
    the head a decoder matrix of its own, used instead of the word embeddings.
    """

    def __init__(self, hidden_size: int, vocab_size: int, activation: str = "gelu", layer_norm_eps: float = 1e-12,
                 embedding_size: int | None = None, tied: bool = True):
        super().__init__()
        embedding_size = embedding_size or hidden_size
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.activation = ACTIVATIONS[activation]
        self.norm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)
        self.decoder = None if tied else nn.Linear(embedding_size, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """(..., hidden) and the (vocab, embedding) matrix -> (..., vocab) logits."""
        decoder = word_embeddings if self.decoder is None else self.decoder.weight
        return F.linear(self.norm(self.activation(self.dense(x))), decoder, self.bias)

    def scored(self, hidden: torch.Tensor, word_embeddings: torch.Tensor, labels: torch.Tensor | None,
               masked_logits_only: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, loss) of the (batch, seq, hidden) last layer against `labels` (None: no loss): logits for every
        position, or with `masked_logits_only` (and labels) for the labelled ones alone, (masked, vocab)."""
        if labels is None:
            return self(hidden, word_embeddings), None
        check_class_labels(labels, (*hidden.shape[:-1], self.bias.shape[0]), "token", per="token")
        if masked_logits_only:
            is_masked = labels != IGNORE_INDEX
            logits = self(hidden[is_masked], word_embeddings)
            return logits, self.loss(logits, labels[is_masked])
        logits = self(hidden, word_embeddings)
        return logits, self.loss(logits, labels)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the labelled positions (-100 ignored); logits (..., vocab), labels (...).

        float32: a bf16 log-softmax over 30k tokens loses the differences training follows.
        """
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=IGNORE_INDEX)


class NextSentenceHead(nn.Linear):
    """Two scores from the pooled [CLS] vector: is segment B the real continuation of A (NSP), or are A and B in
    their original order (SOP)? Label 0 = yes, 1 = no, as in transformers."""

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 2)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels.reshape(-1))


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense -> activation -> one logit per token, "was this token replaced?"."""

    def __init__(self, hidden_size: int, activation: str = "gelu"):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = ACTIVATIONS[activation]
        self.prediction = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prediction(self.activation(self.dense(x))).squeeze(-1)  # (batch, seq)

    @staticmethod
    def loss(logits: torch.Tensor, replaced: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Mean binary cross-entropy over the real (non-padding) tokens, special tokens included as in ELECTRA;
        over every position without an `attention_mask`."""
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(replaced)
        return F.binary_cross_entropy_with_logits(logits[real].float(), replaced[real].float())


def _check_both_or_neither(**targets) -> None:
    given = [name for name, value in targets.items() if value is not None]
    if given and len(given) != len(targets):
        raise ValueError(f"give {' and '.join(targets)} together, or neither")


class BertForPreTraining(Pretrained, nn.Module):
    """BERT as pre-trained: masked LM on every token and a sentence-pair task (NSP or SOP) on [CLS].

    With `labels` (and `next_sentence_label`) the loss is the mean masked-LM loss plus the mean sentence-pair
    loss, and only the masked positions are scored; without them, every position is scored (for inspection
    and comparison with transformers).
    """

    # Starting from an encoder-only checkpoint (continued pre-training), the heads keep BERT's initialisation.
    initialisable = ("pooler.", "masked_lm.", "next_sentence.")

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config = bert_config(config)
        self.bert = BertModel(config)
        self.masked_lm = MaskedLMHead(config.hidden_size, config.vocab_size, config.hidden_act, config.layer_norm_eps,
                                      tied=config.tie_word_embeddings)
        self.next_sentence = NextSentenceHead(config.hidden_size)
        self.masked_lm.apply(self.bert.init_weights)
        self.next_sentence.apply(self.bert.init_weights)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, next_sentence_label: torch.Tensor | None = None,
                masked_logits_only: bool = False, return_dict: bool | None = None,
                **encoder_options) -> PreTrainingOutput:
        """`labels`: (batch, seq) original ids at masked positions, -100 elsewhere; `next_sentence_label`: (batch,).
        `masked_logits_only`: see MaskedLMOutput.logits. `encoder_options`: BertModel.forward's
        output_hidden_states and output_attentions; `return_dict=False`: a tuple."""
        _check_both_or_neither(labels=labels, next_sentence_label=next_sentence_label)
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True,
                            **encoder_options)
        pair_logits = self.next_sentence(encoded.pooler_output)  # (batch, 2)
        logits, masked_lm_loss = self.masked_lm.scored(encoded.last_hidden_state, self.bert.embeddings.tokens.weight,
                                                       labels, masked_logits_only)
        states = {"hidden_states": encoded.hidden_states, "attentions": encoded.attentions}
        if labels is None:
            return returned(PreTrainingOutput(prediction_logits=logits, seq_relationship_logits=pair_logits,
                                              **states), return_dict)
        check_class_labels(next_sentence_label, pair_logits.shape, "next-sentence")
        pair_loss = self.next_sentence.loss(pair_logits, next_sentence_label)
        return returned(PreTrainingOutput(prediction_logits=logits, seq_relationship_logits=pair_logits,
                                          loss=masked_lm_loss + pair_loss, masked_lm_loss=masked_lm_loss,
                                          sentence_pair_loss=pair_loss, **states), return_dict)


class BertForNextSentencePrediction(Pretrained, nn.Module):
    """BERT's second pre-training task alone: does segment B follow segment A in the text? From the pooled [CLS]
    vector, logits (batch, 2): index 0 "B follows A", index 1 "B is a random sentence", as in transformers.

    A BertForPreTraining checkpoint loads into it (its masked-LM head is skipped), so bert-base's own NSP head
    scores sentence pairs.
    """

    # From an encoder-only checkpoint, the pooler and the head keep BERT's initialisation.
    initialisable = ("pooler.", "next_sentence.")

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config = bert_config(config)
        self.bert = BertModel(config)
        self.next_sentence = NextSentenceHead(config.hidden_size)
        self.next_sentence.apply(self.bert.init_weights)
        self.first_token_only = True  # the pooler reads [CLS] alone: the last layer computes nothing else

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, **encoder_options) -> ClassifierOutput:
        """`labels`: (batch,) 0 where B follows A, 1 where B is random. `encoder_options`: as
        BertForPreTraining's."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            first_token_only=self.first_token_only, return_dict=True,
                            **encoder_options)
        logits = self.next_sentence(encoded.pooler_output)  # (batch, 2)
        loss = None
        if labels is not None:
            check_class_labels(labels, logits.shape, "next-sentence")
            loss = self.next_sentence.loss(logits, labels)
        return returned(ClassifierOutput(logits=logits, loss=loss, hidden_states=encoded.hidden_states,
                                         attentions=encoded.attentions), return_dict)


class BertForMaskedLM(Pretrained, nn.Module):
    """The encoder (without pooler, as in transformers) and the masked-LM head: fill in [MASK] tokens."""

    initialisable = ("masked_lm.",)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config = bert_config(config)
        self.bert = BertModel(config, add_pooler=False)
        self.masked_lm = MaskedLMHead(config.hidden_size, config.vocab_size, config.hidden_act, config.layer_norm_eps,
                                      tied=config.tie_word_embeddings)
        self.masked_lm.apply(self.bert.init_weights)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, masked_logits_only: bool = False,
                return_dict: bool | None = None, **encoder_options) -> MaskedLMOutput:
        """`labels`: (batch, seq) original ids at masked positions, -100 elsewhere. `masked_logits_only`: see
        MaskedLMOutput.logits. `encoder_options`: as BertForPreTraining's."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True,
                            **encoder_options)
        logits, loss = self.masked_lm.scored(encoded.last_hidden_state, self.bert.embeddings.tokens.weight, labels,
                                             masked_logits_only)
        return returned(MaskedLMOutput(logits=logits, loss=loss, hidden_states=encoded.hidden_states,
                                       attentions=encoded.attentions), return_dict)


class ProjectedEmbeddings(nn.Module):
    """Shared embeddings read by a narrower encoder: the embedding output projected to its width (ELECTRA)."""

    def __init__(self, embeddings: Embeddings, embedding_size: int, hidden_size: int):
        super().__init__()
        self.shared = embeddings
        self.projection = nn.Linear(embedding_size, hidden_size)

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds=None):
        return self.projection(self.shared(input_ids, token_type_ids, position_ids, inputs_embeds))


def electra_generator_config(config: BertConfig, divisor: int = 4) -> BertConfig:
    """The generator ELECTRA pairs with a discriminator: same depth, 1/`divisor` of the width (the paper's
    best range is 1/4 to 1/2). BERT-base (768 wide, 12 heads) -> 192 wide, 3 heads, feed-forward 768."""
    heads = max(1, config.num_attention_heads // divisor)
    hidden = max(heads, config.hidden_size // divisor // heads * heads)
    return dataclasses.replace(config, hidden_size=hidden, num_attention_heads=heads,
                               intermediate_size=max(1, config.intermediate_size // divisor), id2label={}, label2id={})


class ElectraForPreTraining(nn.Module):
    """ELECTRA (Clark et al., 2020): a small masked-LM generator fills the masked positions with plausible tokens,
    and the discriminator learns, at every token, whether it was replaced.

    The two share the embeddings (tokens, positions, segments, LayerNorm), as ELECTRA does; a generator
    narrower than the discriminator reads them through a linear projection, and its masked-LM head projects
    back to the embedding width to score against the shared word embeddings. The discriminator is the
    encoder you keep: `model.discriminator.save_pretrained(dir)` writes an ordinary BERT checkpoint (without
    a pooler, which ELECTRA doesn't train). Sampling is not differentiable, so the discriminator's loss
    trains the generator only through the shared embeddings, as in the paper.
    """

    def __init__(self, config: BertConfig, generator_config: BertConfig | None = None,
                 discriminator_weight: float = DISCRIMINATOR_WEIGHT):
        super().__init__()
        config = bert_config(config)
        generator_config = bert_config(generator_config or electra_generator_config(config))
        for name in ("vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id"):
            if getattr(generator_config, name) != getattr(config, name):
                raise ConfigError(f"the ELECTRA generator shares the embeddings, so its {name} must equal the "
                                  f"discriminator's ({getattr(generator_config, name)} != {getattr(config, name)})")
        self.config, self.generator_config = config, generator_config
        self.discriminator_weight = discriminator_weight
        self.discriminator = BertModel(config, add_pooler=False)
        self.replaced_token = ReplacedTokenHead(config.hidden_size, config.hidden_act)
        self.generator = BertModel(generator_config, add_pooler=False)
        shared = self.discriminator.embeddings
        self.generator.embeddings = shared if generator_config.hidden_size == config.hidden_size else \
            ProjectedEmbeddings(shared, config.hidden_size, generator_config.hidden_size)
        self.generator_head = MaskedLMHead(generator_config.hidden_size, config.vocab_size,
                                           generator_config.hidden_act, generator_config.layer_norm_eps,
                                           embedding_size=config.hidden_size)
        heads = [self.replaced_token, self.generator_head]
        if isinstance(self.generator.embeddings, ProjectedEmbeddings):
            heads.append(self.generator.embeddings.projection)
        for module in heads:
            module.apply(self.discriminator.init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                rng: torch.Generator | None = None) -> ElectraOutput:
        """`input_ids` as masked for the generator, `labels` the original ids at masked positions (-100
        elsewhere); `rng` draws the generator's samples."""
        if labels is None:
            raise ValueError("ELECTRA needs labels: the original ids at the masked positions")
        check_class_labels(labels, (*input_ids.shape, self.config.vocab_size), "token", per="token")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        is_masked = labels != IGNORE_INDEX
        original_ids = torch.where(is_masked, labels, input_ids)
        word_embeddings = self.discriminator.embeddings.tokens.weight

        hidden = self.generator(input_ids, attention_mask, token_type_ids).last_hidden_state[is_masked]
        generator_logits = self.generator_head(hidden, word_embeddings)  # (masked, vocab)
        generator_loss = self.generator_head.loss(generator_logits, labels[is_masked])
        with torch.no_grad():
            sampled = torch.multinomial(generator_logits.float().softmax(-1), 1, generator=rng).squeeze(1)
        corrupted_ids = original_ids.masked_scatter(is_masked, sampled)
        # A sample that happens to be the original token is real, not replaced (ELECTRA, section 2).
        replaced = corrupted_ids != original_ids

        hidden = self.discriminator(corrupted_ids, attention_mask, token_type_ids).last_hidden_state
        discriminator_logits = self.replaced_token(hidden)  # (batch, seq)
        discriminator_loss = self.replaced_token.loss(discriminator_logits, replaced, real_token_mask(attention_mask))
        return ElectraOutput(loss=generator_loss + self.discriminator_weight * discriminator_loss,
                             generator_loss=generator_loss, discriminator_loss=discriminator_loss,
                             generator_logits=generator_logits, discriminator_logits=discriminator_logits,
                             replaced=replaced, corrupted_ids=corrupted_ids)
