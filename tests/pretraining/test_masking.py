"""Masking strategies on real tokenized text: selection rate and the 80/10/10 split within 5 binomial standard
deviations, special tokens never chosen, words and n-gram spans never split, span lengths p(n) ∝ 1/n, seeded
determinism."""

import math
from collections import Counter

import pytest
import torch

from bertforge import ConfigError
from bertforge.pretraining.masking import (
    BERT_REPLACEMENT,
    ELECTRA_REPLACEMENT,
    MASKING_STRATEGIES,
    NGRAM_WEIGHTS,
    Masker,
    choose_tokens,
    ngram_units,
    word_index,
)
from bertforge.pretraining.objectives import get_objective

DRAWS = 12
SIGMAS = 5


@pytest.fixture(scope="module")
def encoded(data_dir, tokenizer):
    """~500 real sentences of two kinds of text as padded pairs [CLS] A [SEP] B [SEP], with word ids."""
    lines = []
    for name in ("abc_science.txt", "inaugural.txt"):
        with open(data_dir / "pretrain_en" / name, encoding="utf-8") as handle:
            lines += [line.strip() for _, line in zip(range(260), handle) if line.strip()]
    firsts, seconds = lines[0:-1:2], lines[1::2]
    encoding = tokenizer(firsts, seconds, max_length=96, padding=True, return_tensors="pt", return_word_ids=True)
    word_ids = [encoding.word_ids(i) for i in range(len(firsts))]
    return encoding, word_ids


def word_groups(encoding, word_ids):
    """(row, segment, word) -> token positions, from the tokenizer's word ids (an independent truth)."""
    groups = {}
    for row, ids in enumerate(word_ids):
        for position, word in enumerate(ids):
            if word is not None:
                segment = int(encoding["token_type_ids"][row, position])
                groups.setdefault((row, segment, word), []).append(position)
    return groups


@pytest.mark.parametrize("strategy", MASKING_STRATEGIES)
def test_rates_and_the_80_10_10_split(strategy, encoded, tokenizer, within):
    encoding, word_ids = encoded
    input_ids = encoding["input_ids"]
    masker = Masker(tokenizer.vocab, strategy=strategy)
    special = torch.tensor([[word is None for word in ids] for ids in word_ids])  # [CLS], [SEP], padding
    generator = torch.Generator().manual_seed(0)
    chosen = masked = randomised = kept = 0
    for _ in range(DRAWS):
        batch = masker(input_ids, generator)
        is_chosen = batch.labels != -100
        assert not is_chosen[special].any(), "special and padding tokens are never chosen"
        assert torch.equal(batch.labels[is_chosen], input_ids[is_chosen])
        assert torch.equal(batch.input_ids[~is_chosen], input_ids[~is_chosen])
        new = batch.input_ids[is_chosen]
        chosen += int(is_chosen.sum())
        masked += int((new == tokenizer.mask_token_id).sum())
        kept += int((new == input_ids[is_chosen]).sum())
        randomised += int(((new != tokenizer.mask_token_id) & (new != input_ids[is_chosen])).sum())
        assert not masker.is_special[new[new != tokenizer.mask_token_id]].any(), "random tokens are never special"

    # Tokens of one unit are chosen together, so the count's variance is p(1-p) * sum of squared unit sizes
    # per draw; with one-token units that is the binomial's n p (1-p).
    maskable = int((~special).sum()) * DRAWS
    sizes = [1] * (maskable // DRAWS) if strategy == "token" else \
        [len(positions) for positions in word_groups(encoding, word_ids).values()]
    if strategy != "ngram":
        variance = 0.15 * 0.85 * sum(size * size for size in sizes) * DRAWS
        assert abs(chosen - 0.15 * maskable) < SIGMAS * math.sqrt(variance), chosen / maskable
    else:
        # Spans of up to three words: at most 3x the words' sizes (a loose, still 5-sigma, bound).
        variance = 0.15 * 0.85 * 3 * sum(size * size for size in sizes) * DRAWS
        assert abs(chosen - 0.15 * maskable) < SIGMAS * math.sqrt(variance), chosen / maskable
    within(masked, chosen, 0.8, "[MASK]")
    # A random draw equals the original with probability ~1/30k: a 0.0003% shift, far below the bound.
    within(randomised, chosen, 0.1, "random token")
    within(kept, chosen, 0.1, "unchanged")


def test_electra_feeds_its_generator_masks_and_originals_only(encoded, tokenizer, within):
    """ELECTRA's masking (its pretrain_helpers.mask): of the chosen tokens 85% [MASK], 15% as they are, none
    random; the objective's table gives it to the training run's masker."""
    assert get_objective("electra").replacement == ELECTRA_REPLACEMENT
    assert {get_objective(name).replacement for name in ("mlm", "mlm+nsp", "mlm+sop")} == {BERT_REPLACEMENT}
    encoding, _ = encoded
    input_ids = encoding["input_ids"]
    masker = Masker(tokenizer.vocab, replacement=ELECTRA_REPLACEMENT)
    generator = torch.Generator().manual_seed(0)
    chosen = masked = kept = 0
    for _ in range(DRAWS):
        batch = masker(input_ids, generator)
        is_chosen = batch.labels != -100
        new, old = batch.input_ids[is_chosen], input_ids[is_chosen]
        assert torch.equal(batch.input_ids[~is_chosen], input_ids[~is_chosen])
        assert bool(((new == tokenizer.mask_token_id) | (new == old)).all()), "no random token"
        chosen, masked = chosen + len(new), masked + int((new == tokenizer.mask_token_id).sum())
        kept += int((new == old).sum())
    within(masked, chosen, 0.85, "[MASK]")
    within(kept, chosen, 0.15, "unchanged")


@pytest.mark.parametrize("strategy", ["whole_word", "ngram"])
def test_words_and_spans_are_never_split(strategy, encoded, tokenizer):
    encoding, word_ids = encoded
    masker = Masker(tokenizer.vocab, strategy=strategy)
    groups = word_groups(encoding, word_ids)
    assert any(len(positions) > 1 for positions in groups.values()), "the text has multi-piece words"
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        chosen = (masker(encoding["input_ids"], generator).labels != -100).tolist()
        for (row, _, _), positions in groups.items():
            assert len({chosen[row][p] for p in positions}) == 1, "a word is chosen whole or not at all"


def test_ngram_spans_stay_in_one_segment_and_cover_at_most_three_words(encoded, tokenizer):
    encoding, word_ids = encoded
    masker = Masker(tokenizer.vocab)
    input_ids = encoding["input_ids"]
    maskable = ~masker.is_special[input_ids]
    keys = word_index(ngram_units(~masker.is_continuation[input_ids], maskable, torch.Generator().manual_seed(2)))
    spans = {}
    for row, ids in enumerate(word_ids):
        for position, word in enumerate(ids):
            if word is not None:
                segment = int(encoding["token_type_ids"][row, position])
                spans.setdefault((row, int(keys[row, position])), set()).add((segment, word))
    assert all(len({segment for segment, _ in words}) == 1 for words in spans.values())
    lengths = Counter(len(words) for words in spans.values())
    assert set(lengths) <= {1, 2, 3} and lengths[3] > 0


def test_ngram_lengths_follow_one_over_n(within):
    """Over a long run of one-token words with no special tokens, every span but the last of a row has the
    length drawn, p(n) = (1/n) / (1 + 1/2 + 1/3)."""
    batch, seq = 64, 512
    word_starts = torch.ones(batch, seq, dtype=torch.bool)
    keys = word_index(ngram_units(word_starts, torch.ones_like(word_starts), torch.Generator().manual_seed(3)))
    lengths = Counter()
    for row in keys.tolist():
        runs = Counter(row)
        last = row[-1]
        lengths.update(length for key, length in runs.items() if key != last)
    total = sum(lengths.values())
    for n, weight in zip((1, 2, 3), NGRAM_WEIGHTS):
        within(lengths[n], total, weight / sum(NGRAM_WEIGHTS), f"spans of {n} words")
    assert set(lengths) == {1, 2, 3}


def test_every_strategy_chooses_each_token_with_the_probability(within):
    """Units are chosen with p, so each token is too: a token far from row ends, over many rows."""
    batch, seq = 4000, 16
    word_starts = torch.rand(batch, seq, generator=torch.Generator().manual_seed(4)) < 0.6
    maskable = torch.ones(batch, seq, dtype=torch.bool)
    for strategy in MASKING_STRATEGIES:
        chosen = choose_tokens(maskable, word_starts, strategy, 0.15, torch.Generator().manual_seed(5))
        within(int(chosen[:, 8].sum()), batch, 0.15, strategy)


@pytest.mark.parametrize("strategy", MASKING_STRATEGIES)
def test_seeded_masks_are_reproducible(strategy, encoded, tokenizer):
    input_ids = encoded[0]["input_ids"]
    masker = Masker(tokenizer.vocab, strategy=strategy)
    first, again, other = (masker(input_ids, torch.Generator().manual_seed(seed)) for seed in (7, 7, 8))
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.labels, again.labels)
    assert not torch.equal(first.labels, other.labels)


def test_unknown_strategy_and_bad_probability(tokenizer):
    with pytest.raises(ConfigError, match="unknown masking strategy 'span'; choose from token, whole_word, ngram"):
        Masker(tokenizer.vocab, strategy="span")
    with pytest.raises(ConfigError, match="probability"):
        Masker(tokenizer.vocab, probability=1.5)(torch.ones(1, 3, dtype=torch.long), torch.Generator())
