"""Is an explanation faithful to the model? ERASER's comprehensiveness and sufficiency, beside random words.

The words an explanation ranks highest are put at their baseline ([PAD]) and the model is run again (DeYoung et
al. 2020, "ERASER"): comprehensiveness is how much f falls without them, sufficiency how much it falls with them
alone (the other words at their baseline). Each is measured at a share of the words (ERASER's 1, 5, 10, 20 and 50%,
at least one word) and averaged over those shares (AOPC). The same counts of words drawn at random give what an
explanation that knows nothing would score: a faithful one falls further than random without its words
(comprehensiveness above random's) and less with them alone (sufficiency below random's). f is the output
explained (a logit, a score, a similarity), as the attributions are of it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import fmean

import torch

from bertforge.explain.methods import score_at, scores_without, word_embeddings
from bertforge.explain.targets import Target

FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)
RANDOM_DRAWS = 4  # random word sets per share, averaged


@dataclass
class Faithfulness:
    fractions: list[float]
    words_removed: list[int]  # per share: how many words
    comprehensiveness: list[float]  # per share: f(x) - f(x without the top words)
    sufficiency: list[float]  # per share: f(x) - f(the top words alone)
    random_comprehensiveness: list[float]  # the same for random words, averaged over RANDOM_DRAWS draws
    random_sufficiency: list[float]
    aopc_comprehensiveness: float  # the mean over the shares: higher is more faithful
    aopc_sufficiency: float  # lower is more faithful
    aopc_random_comprehensiveness: float
    aopc_random_sufficiency: float


@torch.no_grad()
def faithfulness(model, target: Target, ranked_words: list[list[tuple[int, int]]], seed: int = 0
                 ) -> Faithfulness | None:
    """`ranked_words`: the words, most attributed first, each as its (row, position) tokens. None without words."""
    if not ranked_words:
        return None
    generator = random.Random(seed)
    words = range(len(ranked_words))
    counts = [max(1, math.ceil(fraction * len(words))) for fraction in FRACTIONS]
    # Each variant: the words put at their baseline. Per share: without the top, the top alone, then random draws.
    variants: list[list[int]] = []
    for count in counts:
        for chosen in [set(words[:count])] + [set(generator.sample(words, count)) for _ in range(RANDOM_DRAWS)]:
            variants.append(sorted(chosen))
            variants.append([word for word in words if word not in chosen])
    tokens = [[token for word in variant for token in ranked_words[word]] for variant in variants]
    scores = scores_without(model, target, tokens)
    score = score_at(target, [word_embeddings(model, row.input_ids) for row in target.rows])
    drops = [score - value for value in scores]
    per_share = 2 * (1 + RANDOM_DRAWS)
    shares = [drops[i * per_share:(i + 1) * per_share] for i in range(len(counts))]
    comprehensiveness = [share[0] for share in shares]
    sufficiency = [share[1] for share in shares]
    random_comprehensiveness = [sum(share[2::2]) / RANDOM_DRAWS for share in shares]
    random_sufficiency = [sum(share[3::2]) / RANDOM_DRAWS for share in shares]
    return Faithfulness(list(FRACTIONS), counts, comprehensiveness, sufficiency, random_comprehensiveness,
                        random_sufficiency, fmean(comprehensiveness), fmean(sufficiency),
                        fmean(random_comprehensiveness), fmean(random_sufficiency))
