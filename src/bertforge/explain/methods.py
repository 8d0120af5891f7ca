"""Attribution methods, one table: integrated gradients, gradient x input, saliency, SmoothGrad, occlusion, Shapley
values, LIME, attention rollout.

Gradients are taken at the word embeddings (the output of the embedding lookup, before positions, segments and
LayerNorm are added), so a token's attribution is the sum over its embedding's dimensions (saliency: their norm);
occlusion puts one token at a time at its baseline there, Shapley values and LIME sets of them.
References: Sundararajan et al. 2017 (integrated gradients, completeness), Simonyan et al. 2014 and Li et al. 2016
(saliency: the gradient's size), Smilkov et al. 2017 (SmoothGrad), Zeiler & Fergus 2014 (occlusion), Shapley 1953
and Strumbelj & Kononenko 2014 (Shapley values, exact and by sampled orders), Ribeiro et al. 2016 (LIME), Abnar &
Zuidema 2020 (rollout).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bertforge.explain.targets import Target, device_of
from bertforge.heads import encoder_of

DEFAULT_STEPS = 50
# Gauss-Legendre's points come from an eigendecomposition of a steps x steps matrix: 2,000 take seconds here, 10^14
# asked for more memory than a machine has. 1,000 is 20 times the default, whose completeness gap is already under
# 1% (tests/explain/test_attribution.py).
MAX_STEPS = 1000
# Shapley values are exact (every subset of the tokens put back from their baseline: 2^n forward passes) up to this
# many tokens on a path, and estimated from `steps` random orders beyond (steps x (n - 1) passes).
EXACT_SHAPLEY_TOKENS = 10
# SmoothGrad's noise: a standard deviation of this share of the spread (max - min) of the embeddings explained, as
# AllenNLP Interpret adds it to word embeddings (Wallace et al. 2019). Smilkov et al.'s 10-20% suits pixels; a word
# embedding's spread is set by a few outlying dimensions (-0.27 to 1.05 for MiniLM), so 15% noise is three times as
# long as the embedding itself and the gradients are taken far from the text (deleting SmoothGrad's top word then
# lowered p(class) 2.4x as much as a random word, saliency's 6.1x; bench/README.md).
SMOOTHGRAD_NOISE = 0.01
# LIME weighs a sample by exp(-d^2 / (2 width^2)), d the cosine distance between the tokens it keeps and all of them,
# and fits a ridge regression of this strength: lime's text explainer's (a width of 25 on distances x 100, and
# Ridge(alpha=1)).
LIME_KERNEL_WIDTH = 0.25
LIME_RIDGE = 1.0
# Tokens per forward-backward pass: the interpolation steps of a long input are split into batches of this size.
TOKENS_PER_BATCH = 4096


@dataclass
class Attributions:
    per_token: list[torch.Tensor]  # per row of the target, (seq,) float64, on the CPU
    score: float | None  # f(x)
    baseline_score: float | None = None
    completeness_gap: float | None = None
    steps: int | None = None
    baseline_scores: list[float] | None = None  # rows integrated one at a time: f(x with row i at its baseline)


def word_embeddings(model, ids: list[int]) -> torch.Tensor:
    """(seq, hidden): the rows of the word-embedding table for `ids`, detached."""
    table = encoder_of(model).embeddings.tokens.weight
    return table[torch.tensor(ids, device=table.device)].detach()


def gauss_legendre(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points in [0, 1] and their weights (summing to 1) for integrating a smooth function with `steps` points;
    the same rule as Captum's default ("gausslegendre")."""
    points, weights = np.polynomial.legendre.leggauss(steps)
    return torch.from_numpy(0.5 * (points + 1)), torch.from_numpy(0.5 * weights)


@torch.no_grad()
def score_at(target: Target, embeddings: list[torch.Tensor]) -> float:
    return float(target.score([values[None] for values in embeddings])[0])


def paths_of(target: Target) -> list[list[int]]:
    """The rows that move from their baseline together: each row on a path of its own where the target's rows are
    explained one at a time (each text against the other as given), else all of them on one."""
    rows = range(len(target.rows))
    return [[i] for i in rows] if target.rows_one_at_a_time else [list(rows)]


def off_baseline(target: Target, rows: list[int]) -> list[tuple[int, int]]:
    """(row, position) of the tokens of `rows` that a method can take away: those that are not their own baseline
    ([CLS] and [SEP] are)."""
    return [(i, j) for i in rows for j, (token, base) in enumerate(zip(target.rows[i].input_ids,
                                                                          target.rows[i].baseline_ids))
            if token != base]


def accounted(per_token: list[torch.Tensor], score: float, path_baselines: list[float], steps: int | None
              ) -> Attributions:
    """Attributions that account for f(x) - f(baseline): with one path, its baseline's score; with several, f(x)
    less the sum of each path's difference f(x) - f(path's rows at their baseline), so that completeness reads the
    same. The gap is what the attributions leave of it."""
    several = len(path_baselines) > 1
    baseline_score = score - sum(score - value for value in path_baselines) if several else path_baselines[0]
    gap = score - baseline_score - float(sum(values.sum() for values in per_token))
    return Attributions(per_token, score, baseline_score, gap, steps, path_baselines if several else None)


def integrated_gradients(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """(x - b) * the average gradient of f on the straight path from the baseline b to x, per token.

    Completeness: the attributions sum to f(x) - f(b) up to the integration error, reported as the gap. Where the
    target's rows are integrated one at a time, row i's attributions sum to f(x) - f(x with row i at its baseline):
    the baseline score reported is f(x) minus the sum of those differences, so that completeness reads the same.
    """
    inputs = [word_embeddings(model, row.input_ids) for row in target.rows]
    baselines = [word_embeddings(model, row.baseline_ids) for row in target.rows]
    rows = range(len(inputs))
    paths = paths_of(target)
    alphas, weights = (values.to(inputs[0].device) for values in gauss_legendre(steps))
    totals = [torch.zeros(x.shape, dtype=torch.float64, device=x.device) for x in inputs]  # weighted sum of gradients
    batch = max(1, TOKENS_PER_BATCH // (len(paths) * sum(len(row.input_ids) for row in target.rows)))
    with torch.enable_grad():
        for begin in range(0, steps, batch):
            alpha = alphas[begin:begin + batch].to(inputs[0].dtype)[:, None, None]  # (steps, 1, 1)
            moving = {(p, i): (baselines[i] + alpha * (inputs[i] - baselines[i])).requires_grad_()
                      for p, path in enumerate(paths) for i in path}
            # Every path in one batch: per row, its points on the first path, then on the next.
            held = [x.expand(len(alpha), -1, -1) for x in inputs]
            scaled = [torch.cat([moving.get((p, i), held[i]) for p in range(len(paths))]) for i in rows]
            gradients = torch.autograd.grad(target.score(scaled).sum(), list(moving.values()))
            weight = weights[begin:begin + batch][:, None, None]
            for (_, i), gradient in zip(moving, gradients):
                totals[i] += (gradient.double() * weight).sum(0)
    per_token = [((x - b).double() * total).sum(-1).cpu() for x, b, total in zip(inputs, baselines, totals)]
    score = score_at(target, inputs)
    path_baselines = [score_at(target, [baselines[i] if i in path else inputs[i] for i in rows]) for path in paths]
    return accounted(per_token, score, path_baselines, steps)


def gradient_x_input(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """The gradient of f at the word embeddings times the embeddings, per token (a first-order Taylor term)."""
    inputs = [word_embeddings(model, row.input_ids).requires_grad_() for row in target.rows]
    with torch.enable_grad():
        score = target.score([x[None] for x in inputs])
        gradients = torch.autograd.grad(score.sum(), inputs)
    per_token = [(gradient * x.detach()).double().sum(-1).cpu() for gradient, x in zip(gradients, inputs)]
    return Attributions(per_token, float(score[0].detach()))


def saliency(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """The size (L2 norm) of the gradient of f at each token's word embedding: how much a small change of that
    token would move f, whichever way. Unsigned."""
    inputs = [word_embeddings(model, row.input_ids).requires_grad_() for row in target.rows]
    with torch.enable_grad():
        score = target.score([x[None] for x in inputs])
        gradients = torch.autograd.grad(score.sum(), inputs)
    per_token = [gradient.double().norm(dim=-1).cpu() for gradient in gradients]
    return Attributions(per_token, float(score[0].detach()))


def smoothgrad(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """The gradient's size averaged over `steps` copies of the word embeddings with Gaussian noise added (a standard
    deviation of SMOOTHGRAD_NOISE times their spread): the gradient at one point is noisy from token to token, its
    mean size around the input is not. Per dimension the mean of |gradient| (Captum's NoiseTunnel over Saliency),
    then its L2 norm per token, as saliency's. Unsigned. The noise comes from a seeded generator, a draw per copy and
    row in turn, so the same input gives the same values."""
    inputs = [word_embeddings(model, row.input_ids) for row in target.rows]
    sigma = SMOOTHGRAD_NOISE * float(max(x.max() for x in inputs) - min(x.min() for x in inputs))
    generator = torch.Generator().manual_seed(0)
    totals = [torch.zeros(x.shape, dtype=torch.float64) for x in inputs]  # sums of |gradient|
    batch = max(1, TOKENS_PER_BATCH // sum(len(x) for x in inputs))
    with torch.enable_grad():
        for begin in range(0, steps, batch):
            draws = [[torch.randn(x.shape, generator=generator) for x in inputs]
                     for _ in range(min(batch, steps - begin))]
            noisy = [(x + sigma * torch.stack(row_draws).to(x.device, x.dtype)).requires_grad_()
                     for x, row_draws in zip(inputs, zip(*draws))]
            gradients = torch.autograd.grad(target.score(noisy).sum(), noisy)
            for total, gradient in zip(totals, gradients):
                total += gradient.double().abs().sum(0).cpu()
    return Attributions([(total / steps).norm(dim=-1) for total in totals], score_at(target, inputs), steps=steps)


@torch.no_grad()
def scores_without(model, target: Target, variants: list[list[tuple[int, int]]]) -> list[float]:
    """f with each variant's tokens, (row, position), at their baseline and the rest as given; the variants run in
    batches of about TOKENS_PER_BATCH tokens. What occlusion and the faithfulness report (faithfulness.py) run."""
    inputs = [word_embeddings(model, row.input_ids) for row in target.rows]
    baselines = [word_embeddings(model, row.baseline_ids) for row in target.rows]
    batch = max(1, TOKENS_PER_BATCH // sum(len(x) for x in inputs))
    scores: list[float] = []
    for begin in range(0, len(variants), batch):
        chunk = variants[begin:begin + batch]
        masks = [torch.zeros(len(chunk), len(x), 1, dtype=torch.bool, device=x.device) for x in inputs]
        for index, tokens in enumerate(chunk):
            for row, position in tokens:
                masks[row][index, position] = True
        rows = [torch.where(mask, baseline, x) for mask, baseline, x in zip(masks, baselines, inputs)]
        scores.extend(target.score(rows).double().cpu().tolist())
    return scores


def occlusion(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """f(x) - f(x with one token at its baseline), per token: what f loses without that token, the rest as given.

    Forward passes alone (no gradient), so it explains int8 models too. Tokens that are their own baseline ([CLS],
    [SEP]) lose nothing and are not run.
    """
    score = score_at(target, [word_embeddings(model, row.input_ids) for row in target.rows])
    occluded = off_baseline(target, list(range(len(target.rows))))
    per_token = [torch.zeros(len(row.input_ids), dtype=torch.float64) for row in target.rows]
    for (i, j), value in zip(occluded, scores_without(model, target, [[token] for token in occluded])):
        per_token[i][j] = score - value
    return Attributions(per_token, score)


def shapley_passes(tokens: int, steps: int) -> int:
    """The forward passes Shapley values take for `tokens` tokens on one path (`steps` orders where sampled)."""
    return 2 ** tokens if tokens <= EXACT_SHAPLEY_TOKENS else steps * (tokens - 1) + 2


def shapley_values(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """Each token's Shapley value: what f gains as the token is put back from its baseline, averaged over every
    order in which the tokens could be put back, the others held as given. The only attribution that is fair in
    Shapley's sense (symmetric, with no gain for a token f ignores) and sums exactly to f(x) - f(baseline).

    Exact (every subset, weighted by how many orders reach it) up to EXACT_SHAPLEY_TOKENS tokens on a path; beyond,
    the mean over `steps` random orders, the same for the same input (a seeded generator), whose values still sum to
    f(x) - f(baseline). Forward passes alone, as occlusion, so it explains int8 models too. Where the target's rows
    are explained one at a time, each row's tokens are put back with the other rows as given, as integrated
    gradients' paths run.
    """
    score = score_at(target, [word_embeddings(model, row.input_ids) for row in target.rows])
    per_token = [torch.zeros(len(row.input_ids), dtype=torch.float64) for row in target.rows]
    path_baselines, sampled = [], False
    for path in paths_of(target):
        players = off_baseline(target, path)
        exact = len(players) <= EXACT_SHAPLEY_TOKENS
        sampled = sampled or not exact
        values = (exact_shapley if exact else sampled_shapley)(functools.partial(scores_with, model, target, players),
                                                               len(players), steps)
        for (i, j), value in zip(players, values[1:]):
            per_token[i][j] = value
        path_baselines.append(values[0])
    return accounted(per_token, score, path_baselines, steps if sampled else None)  # steps: the orders sampled


def scores_with(model, target: Target, players: list[tuple[int, int]], present: list[set[int]]) -> list[float]:
    """f with the players of each set present (as given) and the other players at their baseline."""
    return scores_without(model, target, [[player for k, player in enumerate(players) if k not in kept]
                                          for kept in present])


def exact_shapley(scores_of: Callable[[list[set[int]]], list[float]], players: int, steps: int) -> list[float]:
    """f(nobody), then each player's Shapley value from f of every subset: the sum over subsets S without player k
    of |S|! (n - |S| - 1)! / n! (f(S with k) - f(S)). `scores_of` takes the subsets present."""
    subsets = [frozenset(k for k in range(players) if mask >> k & 1) for mask in range(2 ** players)]
    scores = dict(zip(subsets, scores_of([set(subset) for subset in subsets])))
    weight = [math.factorial(size) * math.factorial(players - size - 1) / math.factorial(players)
              for size in range(players)]
    values = [sum(weight[len(subset)] * (scores[subset | {k}] - scores[subset]) for subset in subsets
                  if k not in subset) for k in range(players)]
    return [scores[frozenset()], *values]


def sampled_shapley(scores_of: Callable[[list[set[int]]], list[float]], players: int, steps: int) -> list[float]:
    """f(nobody), then each player's mean gain over `steps` random orders of putting the players back."""
    generator = torch.Generator().manual_seed(0)
    orders = [torch.randperm(players, generator=generator).tolist() for _ in range(steps)]
    # Every order starts from nobody and ends with everybody: those two are run once.
    nobody, everybody = scores_of([set(), set(range(players))])
    middles = scores_of([set(order[:count]) for order in orders for count in range(1, players)])
    values = [0.0] * players
    for index, order in enumerate(orders):
        path = [nobody, *middles[index * (players - 1):(index + 1) * (players - 1)], everybody]
        for count, player in enumerate(order):
            values[player] += (path[count + 1] - path[count]) / steps
    return [nobody, *values]


def lime(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """The weights of a linear model of f fitted around the input: f on `steps` samples of it (the input itself,
    then random sets of tokens at their baseline), each weighed by how close it is to the input, fitted by a weighted
    ridge regression whose coefficient of a token is its attribution (Ribeiro et al. 2016, sampled and weighed as
    lime's text explainer does). Forward passes alone, so it explains int8 models too. Not exact, nor summing to
    anything: a local approximation whose samples are seeded, so the same input gives the same values. Where the
    target's rows are explained one at a time, each row's tokens are sampled with the other rows as given."""
    score = score_at(target, [word_embeddings(model, row.input_ids) for row in target.rows])
    per_token = [torch.zeros(len(row.input_ids), dtype=torch.float64) for row in target.rows]
    for path in paths_of(target):
        players = off_baseline(target, path)
        if not players:
            continue
        present = lime_samples(len(players), steps)
        scores = scores_with(model, target, players, present)
        kept = torch.tensor([[k in sample for k in range(len(players))] for sample in present], dtype=torch.float64)
        fitted = weighted_ridge(kept, torch.tensor(scores, dtype=torch.float64), lime_weights(kept), LIME_RIDGE)
        for (i, j), value in zip(players, fitted):
            per_token[i][j] = value
    return Attributions(per_token, score, steps=steps)


def lime_samples(players: int, count: int) -> list[set[int]]:
    """The players present in each of LIME's `count` samples: all of them first, then in each sample a number of
    them, from 1 to players - 1 alike (1 where there is one), taken away at random. Seeded."""
    generator = torch.Generator().manual_seed(0)
    samples = [set(range(players))]
    for _ in range(count - 1):
        removed = int(torch.randint(1, max(players, 2), (1,), generator=generator))
        samples.append(set(torch.randperm(players, generator=generator)[removed:].tolist()))
    return samples


def lime_weights(kept: torch.Tensor) -> torch.Tensor:
    """exp(-d^2 / (2 LIME_KERNEL_WIDTH^2)) of each row's cosine distance d to a row of ones (1 where none is kept)."""
    distance = 1 - (kept.sum(-1) / kept.shape[-1]).sqrt()  # cos(z, 1) = |z|_1 / (sqrt(|z|_1) sqrt(n)) for 0/1 z
    return torch.exp(-distance ** 2 / (2 * LIME_KERNEL_WIDTH ** 2))


def weighted_ridge(features: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, strength: float
                   ) -> list[float]:
    """The coefficients b minimising sum_i w_i (y_i - c - x_i . b)^2 + strength |b|^2, with an intercept c that is
    not penalised: centre on the weighted means, then solve the normal equations (as sklearn's Ridge does)."""
    share = weights / weights.sum()
    x = features - share @ features
    y = targets - share @ targets
    gram = x.T @ (weights[:, None] * x) + strength * torch.eye(x.shape[1], dtype=x.dtype)
    return torch.linalg.solve(gram, x.T @ (weights * y)).tolist()


@torch.no_grad()
def attention_rollout(model, target: Target, steps: int = DEFAULT_STEPS) -> Attributions:
    """How much of each input token reaches the positions f reads, through every layer's head-averaged attention,
    with the residual connection counted as half (Abnar & Zuidema 2020). Positive, summing to 1 per row; unsigned."""
    per_token = []
    for row, readout in zip(target.rows, target.readout):
        input_ids, token_type_ids = row.tensors(device=device_of(model))
        attentions = encoder_of(model)(input_ids, token_type_ids=token_type_ids, output_attentions=True).attentions
        flow = torch.eye(len(row.input_ids), dtype=torch.float64)
        for layer in attentions:
            mixed = 0.5 * layer[0].double().cpu().mean(0) + 0.5 * torch.eye(len(row.input_ids), dtype=torch.float64)
            flow = (mixed / mixed.sum(-1, keepdim=True)) @ flow  # rows: positions after the layer; columns: inputs
        per_token.append(readout.double() @ flow)
    embeddings = [word_embeddings(model, row.input_ids) for row in target.rows]
    return Attributions(per_token, score_at(target, embeddings))


METHODS: dict[str, Callable[..., Attributions]] = {
    "integrated_gradients": integrated_gradients,
    "gradient_x_input": gradient_x_input,
    "saliency": saliency,
    "smoothgrad": smoothgrad,
    "occlusion": occlusion,
    "shapley": shapley_values,
    "lime": lime,
    "attention_rollout": attention_rollout,
}
# Those that follow gradients through the model: none flow through int8 layers (their kernel has no backward).
USES_GRADIENTS = ("integrated_gradients", "gradient_x_input", "saliency", "smoothgrad")
UNSIGNED = ("saliency", "smoothgrad", "attention_rollout")  # how much, not for or against
