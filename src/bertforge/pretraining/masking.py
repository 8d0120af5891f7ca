"""Dynamic masking for masked-LM pre-training: which tokens to predict (a named strategy), then what each becomes
(BERT's 80/10/10, or ELECTRA's 85/15: a Replacement).

Shapes: batch, seq. A strategy groups the tokens of each sequence into units that are masked together (a token,
a whole word, an n-gram of whole words); each unit is chosen with the masking probability, so every maskable
token is chosen with exactly that probability whatever the strategy. Masks are drawn afresh for every batch
(RoBERTa's dynamic masking), from an explicit torch.Generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bertforge.errors import ConfigError, check_choice
from bertforge.heads import IGNORE_INDEX
from bertforge.tokenizer.vocab import Vocab
from bertforge.tokenizer.wordpiece import CONTINUATION

MASK_PROBABILITY = 0.15


@dataclass(frozen=True)
class Replacement:
    """What a chosen token becomes: [MASK] with probability `mask`, a random token with `random`, else itself."""
    mask: float
    random: float

    def __post_init__(self):
        if not (0 <= self.mask and 0 <= self.random and self.mask + self.random <= 1):
            raise ConfigError(f"a chosen token's replacement shares must be at least 0 and add up to at most 1, got "
                              f"mask={self.mask}, random={self.random}")


# BERT (section 3.1): 80% [MASK], 10% a random token, 10% as they are, so that the model can't learn that only
# [MASK] positions matter.
BERT_REPLACEMENT = Replacement(mask=0.8, random=0.1)
# ELECTRA's generator input (Clark et al., 2020; its pretrain_helpers.mask): 85% [MASK], 15% as they are, none
# random: the discriminator learns to tell the generator's replacements, not noise the data adds.
ELECTRA_REPLACEMENT = Replacement(mask=0.85, random=0.0)
# N-gram spans: 1 to 3 whole words, shorter ones more likely, p(n) ∝ 1/n -> 6/11, 3/11, 2/11 (ALBERT's n-gram
# masking, Lan et al., 2019).
NGRAM_WEIGHTS = tuple(1.0 / n for n in (1, 2, 3))


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # (batch, seq) with the chosen tokens replaced
    labels: torch.Tensor  # (batch, seq): the original id at chosen positions, -100 elsewhere


def word_index(word_starts: torch.Tensor) -> torch.Tensor:
    """The index of the word each token belongs to: starts [1, 0, 1, 1, 0, 0] -> [0, 0, 1, 2, 2, 2]."""
    return (word_starts.long().cumsum(1) - 1).clamp(min=0)


def token_units(word_starts: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Every token on its own (the original BERT): sub-words of one word are chosen independently."""
    return torch.ones_like(word_starts)


def whole_word_units(word_starts: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """All pieces of a word together: "un ##aff ##able" is masked whole or not at all (BERT's whole-word masking)."""
    return word_starts


def ngram_units(word_starts: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Spans of 1 to 3 consecutive whole words, p(n) ∝ 1/n; a span never reaches across a special token.

    The words of each sequence are tiled by spans of random length; each span is then chosen or not as one
    unit. Tiling (rather than drawing overlapping spans) keeps the chosen share at exactly the masking
    probability and each span at its drawn length. One-token words 0..6, lengths [2, 1, 3, 1, ...] -> spans
    [0, 0, 1, 2, 2, 2, 3], returned as where they start: [1, 0, 1, 1, 0, 0, 1].
    """
    batch, seq = word_starts.shape
    # Inverse-CDF sampling of the lengths: a uniform draw past the cumulative probability of 1 (of 1 or 2) words
    # adds one word.
    cumulative = torch.tensor(NGRAM_WEIGHTS).cumsum(0) / sum(NGRAM_WEIGHTS)
    uniform = torch.rand(batch, seq, generator=generator, device=word_starts.device)
    lengths = 1 + (uniform >= cumulative[0]).long() + (uniform >= cumulative[1]).long()  # (batch, seq), in 1..3
    # Span k starts at word lengths[0] + ... + lengths[k-1]; mark those words (column seq collects the starts
    # beyond the last possible word).
    span_starts = torch.zeros(batch, seq + 1, dtype=torch.bool, device=word_starts.device)
    span_starts[:, 0] = True
    span_starts.scatter_(1, lengths.cumsum(1).clamp(max=seq), True)
    starts = word_starts & span_starts.gather(1, word_index(word_starts))
    # A special token ([SEP] between the segments) ends a span too, so that no span holds words of both
    # segments: the words on either side become separate units.
    after_special = torch.cat([torch.ones_like(maskable[:, :1]), ~maskable[:, :-1]], dim=1)
    return starts | after_special


# name -> (word_starts, maskable, generator) -> (batch, seq) bool, True where a unit begins: a run of tokens that
# is masked together. The CLI's --masking choices are these keys.
MASKING_STRATEGIES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]] = {
    "token": token_units,
    "whole_word": whole_word_units,
    "ngram": ngram_units,
}


def choose_tokens(maskable: torch.Tensor, word_starts: torch.Tensor, strategy: str, probability: float,
                  generator: torch.Generator) -> torch.Tensor:
    """(batch, seq) bool: the tokens to predict. Each unit of the strategy is chosen with `probability`."""
    unit = word_index(strategy_function(strategy)(word_starts, maskable, generator))  # (batch, seq), < seq
    draws = torch.rand(unit.shape, generator=generator, device=unit.device)  # one per possible unit
    return (draws.gather(1, unit) < probability) & maskable


def mask_tokens(input_ids: torch.Tensor, maskable: torch.Tensor, word_starts: torch.Tensor, strategy: str,
                mask_token_id: int, random_token_ids: torch.Tensor, generator: torch.Generator,
                probability: float = MASK_PROBABILITY, replacement: Replacement = BERT_REPLACEMENT) -> MaskedBatch:
    """Choose tokens with `strategy` and replace them as `replacement` says (BERT's 80% [MASK] / 10% random /
    10% unchanged by default).

    maskable: (batch, seq) bool, False at special and padding tokens (never chosen).
    word_starts: (batch, seq) bool, True where a token starts a word (its string doesn't begin with "##").
    random_token_ids: the ids a random replacement is drawn from (the vocabulary without special tokens).
    """
    if not 0.0 < probability < 1.0:
        raise ConfigError(f"the masking probability must be in (0, 1), got {probability}")
    chosen = choose_tokens(maskable, word_starts, strategy, probability, generator)
    draw = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    to_mask = chosen & (draw < replacement.mask)
    to_random = chosen & (draw >= replacement.mask) & (draw < replacement.mask + replacement.random)
    random_ids = random_token_ids.to(input_ids.device)[
        torch.randint(len(random_token_ids), input_ids.shape, generator=generator, device=input_ids.device)]
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return MaskedBatch(input_ids=masked, labels=labels)


def strategy_function(name: str):
    check_choice(name, MASKING_STRATEGIES, "masking strategy")
    return MASKING_STRATEGIES[name]


def is_special_token(token: str) -> bool:
    """[CLS], [PAD], [unused17] ...: bracketed names, which WordPiece never produces from text (it splits '[')."""
    return len(token) > 2 and token.startswith("[") and token.endswith("]")


class Masker:
    """`mask_tokens` with everything it needs read from a vocabulary: batch of ids + generator -> MaskedBatch.

    >>> masker = Masker(tokenizer.vocab, strategy="whole_word")
    >>> batch = masker(input_ids, torch.Generator().manual_seed(0))
    """

    def __init__(self, vocab: Vocab, strategy: str = "token", probability: float = MASK_PROBABILITY,
                 replacement: Replacement = BERT_REPLACEMENT):
        strategy_function(strategy)
        self.strategy, self.probability, self.replacement = strategy, probability, replacement
        self.mask_token_id = vocab.mask_token_id
        tokens = vocab.id_to_token
        self.is_continuation = torch.tensor([token.startswith(CONTINUATION) for token in tokens])
        special = set(vocab.special_tokens.values())
        self.is_special = torch.tensor([token in special or is_special_token(token) for token in tokens])
        self.random_token_ids = (~self.is_special).nonzero().squeeze(1)

    def __call__(self, input_ids: torch.Tensor, generator: torch.Generator) -> MaskedBatch:
        maskable = ~self.is_special.to(input_ids.device)[input_ids]
        word_starts = ~self.is_continuation.to(input_ids.device)[input_ids]
        return mask_tokens(input_ids, maskable, word_starts, self.strategy, self.mask_token_id,
                           self.random_token_ids, generator, self.probability, self.replacement)
