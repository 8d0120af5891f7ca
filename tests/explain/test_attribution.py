"""Attributions against independent truths: Captum's LayerIntegratedGradients and plain autograd on transformers'
model with the same weights, completeness, and word spans against transformers' fast tokenizer."""

from __future__ import annotations

import concurrent.futures
import math
import threading

import pytest
import torch

from bertforge import BertConfig, BertForQuestionAnswering, BertForTokenClassification
from bertforge.errors import ConfigError, InputError
from bertforge.explain import METHODS, explain
from bertforge.pretraining import BertForMaskedLM


def attributions_of(explanation) -> torch.Tensor:
    return torch.tensor([token.attribution for token in explanation.tokens], dtype=torch.float64)


def baseline_ids_of(input_ids: torch.Tensor, tokenizer, token_id: int | None = None) -> torch.Tensor:
    """Every token put at `token_id` ([PAD] by default) but [CLS] and [SEP], which are their own baseline."""
    special = (input_ids == tokenizer.cls_token_id) | (input_ids == tokenizer.sep_token_id)
    token_id = tokenizer.pad_token_id if token_id is None else token_id
    return torch.where(special, input_ids, torch.full_like(input_ids, token_id))


def token_groups(inputs: torch.Tensor) -> torch.Tensor:
    """Captum's feature mask of one group per token of (1, seq, hidden) embeddings (contiguous: Captum views it)."""
    return torch.arange(inputs.shape[1])[None, :, None].expand_as(inputs).contiguous()


REVIEW = "a gripping, beautifully acted film that never quite earns its ending."
MASKED_REVIEW = "a gripping, beautifully acted film that never quite [MASK] its ending."


@pytest.fixture(scope="module")
def hf_classifier(sst2_classifier_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.BertForSequenceClassification.from_pretrained(sst2_classifier_dir).eval()


def test_classifier_learned_the_slice(sst2_classifier, tokenizer, sst2_dev):
    """The fixture is a real fine-tuned classifier: well above chance on SST-2 dev sentences it never saw."""
    texts, labels = zip(*sst2_dev[:64])
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.no_grad():
        predicted = sst2_classifier(**batch).logits.argmax(-1)
    assert (predicted == torch.tensor(labels)).float().mean() > 0.7


@pytest.mark.parametrize(("label", "text"), [("positive", REVIEW), ("negative", REVIEW), ("positive", MASKED_REVIEW)])
def test_integrated_gradients_equal_captums_layer_integrated_gradients(sst2_classifier, hf_classifier, tokenizer,
                                                                       label, text):
    """Captum's BERT recipe: a baseline of [PAD] but for [CLS] and [SEP]. A [MASK] in a classifier's text is text
    like any other (it stayed in the baseline, so it got 0 and shifted the rest)."""
    captum_attr = pytest.importorskip("captum.attr")
    ours = explain(sst2_classifier, tokenizer, text, target=label, steps=50)
    encoding = tokenizer(text, return_tensors="pt")
    input_ids = encoding["input_ids"]
    baseline = torch.where((input_ids == tokenizer.cls_token_id) | (input_ids == tokenizer.sep_token_id),
                           input_ids, torch.full_like(input_ids, tokenizer.pad_token_id))
    index = sst2_classifier.config.label2id[label]
    reference = captum_attr.LayerIntegratedGradients(lambda ids: hf_classifier(ids).logits[:, index],
                                                     hf_classifier.bert.embeddings.word_embeddings)
    attributions, delta = reference.attribute(input_ids, baselines=baseline, n_steps=50, method="gausslegendre",
                                              return_convergence_delta=True)
    expected = attributions.sum(-1)[0].double()
    assert [token.token for token in ours.tokens] == tokenizer.convert_ids_to_tokens(input_ids[0])
    assert torch.allclose(attributions_of(ours), expected, atol=1e-4, rtol=0)
    assert ours.completeness_gap == pytest.approx(-float(delta), abs=1e-4)
    masks = [token.attribution for token in ours.tokens if token.token == tokenizer.mask_token]
    assert all(abs(value) > 1e-3 for value in masks) and len(masks) == (text == MASKED_REVIEW)


@pytest.mark.parametrize("layer", ["embeddings", "embeddings.word_embeddings"])
def test_captum_attributes_a_bertforge_model_as_it_attributes_transformers(sst2_classifier, hf_classifier, tokenizer,
                                                                          sst2_dev, layer):
    """Captum's own recipe run on a bertforge model (LayerIntegratedGradients on `bert.embeddings`, or on its word
    embeddings by transformers' name), a padded batch of real reviews at once: the attributions transformers' model
    of the same weights gets, in its (batch, seq, hidden) shape."""
    captum_attr = pytest.importorskip("captum.attr")
    texts = [text for text, _ in sst2_dev[:4]]
    encoding = tokenizer(texts, padding=True, return_tensors="pt")
    input_ids, mask = encoding["input_ids"], encoding["attention_mask"]
    assert not mask.all()  # padding, which the two models lay out differently inside
    keep = (input_ids == tokenizer.cls_token_id) | (input_ids == tokenizer.sep_token_id) | (mask == 0)
    baseline = torch.where(keep, input_ids, torch.full_like(input_ids, tokenizer.pad_token_id))
    results = []
    for model in (sst2_classifier, hf_classifier):
        method = captum_attr.LayerIntegratedGradients(lambda ids, m, model=model: model(ids, m).logits[:, 1],
                                                      model.bert.get_submodule(layer))
        results.append(method.attribute(input_ids, baselines=baseline, additional_forward_args=(mask,), n_steps=20))
    ours, theirs = results
    assert ours.shape == theirs.shape == (*input_ids.shape, 384)
    real = mask.bool()
    assert (ours - theirs)[real].abs().max() < 1e-4 * theirs[real].abs().max()


def test_completeness_gap_is_under_one_percent_at_the_default_steps(sst2_classifier, tokenizer, sst2_dev):
    for text, _ in sst2_dev[:3] + [(REVIEW, None)]:
        explanation = explain(sst2_classifier, tokenizer, text)
        difference = explanation.score - explanation.baseline_score
        assert abs(explanation.completeness_gap) < 0.01 * abs(difference)
        total = sum(token.attribution for token in explanation.tokens)
        assert total + explanation.completeness_gap == pytest.approx(difference, abs=1e-9)


@pytest.mark.parametrize("pair", ["Someone plays music.", "A man is playing a guitar."])
def test_an_encoder_explains_each_text_against_the_other_as_captum_does(minilm, hf_minilm, tokenizer, pair):
    """Each text's words are integrated from its baseline with the other text as given: per text, Captum's
    IntegratedGradients on a forward that takes its word embeddings, the other's pooled vector fixed. Identical texts
    (whose empty baselines are identical too: f was 1 at both ends of a path moving both, and every word got 0) get
    attributions."""
    captum_attr = pytest.importorskip("captum.attr")
    text = "A man is playing a guitar."
    ours = explain(minilm, tokenizer, text, pair, steps=50)
    table = hf_minilm.embeddings.word_embeddings
    encodings = [tokenizer(value, return_tensors="pt")["input_ids"] for value in (text, pair)]
    with torch.no_grad():
        pooled = [hf_minilm(input_ids).last_hidden_state.mean(1) for input_ids in encodings]
    expected, baseline_scores, deltas = [], [], []
    for side, input_ids in enumerate(encodings):
        def similarity(embeddings, other=pooled[1 - side]):
            return torch.cosine_similarity(hf_minilm(inputs_embeds=embeddings).last_hidden_state.mean(1), other)
        baseline_ids = baseline_ids_of(input_ids, tokenizer)
        with torch.no_grad():
            inputs, baselines = table(input_ids), table(baseline_ids)
            baseline_scores.append(float(similarity(baselines)))
        attributions, delta = captum_attr.IntegratedGradients(similarity).attribute(
            inputs, baselines=baselines, n_steps=50, method="gausslegendre", return_convergence_delta=True)
        expected.append(attributions.sum(-1)[0].double())
        deltas.append(float(delta))
    assert [token.token for token in ours.tokens] == tokenizer.convert_ids_to_tokens(torch.cat(encodings, 1)[0])
    assert torch.allclose(attributions_of(ours), torch.cat(expected), atol=1e-5, rtol=0)
    assert ours.inner["baseline_scores"] == pytest.approx(baseline_scores, abs=1e-5)
    assert ours.completeness_gap == pytest.approx(-sum(deltas), abs=1e-5)
    # Completeness per text, and as the README states it: f(x) - baseline_score = the sum of all attributions + gap.
    for side in (0, 1):
        words = sum(word.attribution for word in ours.words if word.text == side)
        difference = ours.score - ours.inner["baseline_scores"][side]
        assert abs(words - difference) < 0.01 * abs(difference)
    assert ours.baseline_score == pytest.approx(sum(ours.inner["baseline_scores"]) - ours.score, abs=1e-12)
    total = sum(token.attribution for token in ours.tokens)
    assert total + ours.completeness_gap == pytest.approx(ours.score - ours.baseline_score, abs=1e-9)
    if pair == text:  # the two sides mirror each other
        halves = [[word.attribution for word in ours.words if word.text == side] for side in (0, 1)]
        assert halves[0] == pytest.approx(halves[1], abs=1e-6) and min(map(abs, halves[0])) > 1e-3


def test_gradient_x_input_equals_direct_autograd(sst2_classifier, hf_classifier, tokenizer):
    ours = explain(sst2_classifier, tokenizer, REVIEW, target="positive", method="gradient_x_input")
    encoding = tokenizer(REVIEW, return_tensors="pt")
    embeddings = hf_classifier.bert.embeddings.word_embeddings(encoding["input_ids"]).detach().requires_grad_()
    logit = hf_classifier(inputs_embeds=embeddings).logits[0, 1]
    (gradient,) = torch.autograd.grad(logit, embeddings)
    expected = (gradient * embeddings).sum(-1)[0].double()
    assert torch.allclose(attributions_of(ours), expected, atol=1e-5, rtol=1e-4)
    assert ours.score == pytest.approx(float(logit.detach()), abs=1e-5)


@pytest.mark.parametrize("baseline", ["mask", "unk"])
def test_another_baseline_token_is_captums_baseline_of_that_token(sst2_classifier, hf_classifier, tokenizer, baseline):
    """--baseline mask: every word's path starts at [MASK] ([CLS] and [SEP] kept), as Captum's recipe with that
    baseline gives it; occlusion puts one word at a time there."""
    captum_attr = pytest.importorskip("captum.attr")
    input_ids = tokenizer(REVIEW, return_tensors="pt")["input_ids"]
    token = {"mask": tokenizer.mask_token_id, "unk": tokenizer.unk_token_id}[baseline]
    baseline_ids = baseline_ids_of(input_ids, tokenizer, token)
    reference = captum_attr.LayerIntegratedGradients(lambda ids: hf_classifier(ids).logits[:, 1],
                                                     hf_classifier.bert.embeddings.word_embeddings)
    attributions = reference.attribute(input_ids, baselines=baseline_ids, n_steps=20, method="gausslegendre")
    ours = explain(sst2_classifier, tokenizer, REVIEW, target="positive", steps=20, baseline=baseline)
    assert ours.baseline == baseline
    assert torch.allclose(attributions_of(ours), attributions.sum(-1)[0].double(), atol=1e-4, rtol=0)
    table = hf_classifier.bert.embeddings.word_embeddings
    with torch.no_grad():
        inputs, baselines = table(input_ids), table(baseline_ids)
    ablated = captum_attr.FeatureAblation(lambda embeddings: hf_classifier(inputs_embeds=embeddings).logits[:, 1]
                                          ).attribute(inputs, baselines=baselines, feature_mask=token_groups(inputs),
                                                      perturbations_per_eval=8)
    ours = explain(sst2_classifier, tokenizer, REVIEW, target="positive", method="occlusion", baseline=baseline)
    assert torch.allclose(attributions_of(ours), ablated[0, :, 0].double(), atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="baseline"):
        explain(sst2_classifier, tokenizer, REVIEW, baseline="zeros")


@pytest.mark.parametrize("text", [REVIEW, MASKED_REVIEW])
def test_occlusion_and_saliency_equal_captums(sst2_classifier, hf_classifier, tokenizer, text):
    """Occlusion: Captum's FeatureAblation with one group per token on transformers' word embeddings, each token
    put at its [PAD] baseline ([CLS] and [SEP] are their own, so 0); saliency: the L2 norm over each token's
    dimensions of Captum's Saliency (the gradient's absolute value)."""
    captum_attr = pytest.importorskip("captum.attr")
    encoding = tokenizer(text, return_tensors="pt")
    input_ids = encoding["input_ids"]
    special = (input_ids == tokenizer.cls_token_id) | (input_ids == tokenizer.sep_token_id)
    table = hf_classifier.bert.embeddings.word_embeddings
    with torch.no_grad():
        inputs, baselines = table(input_ids), table(baseline_ids_of(input_ids, tokenizer))
    for label in ("positive", "negative"):
        index = sst2_classifier.config.label2id[label]

        def logit(embeddings, index=index):
            return hf_classifier(inputs_embeds=embeddings).logits[:, index]

        ablated = captum_attr.FeatureAblation(logit).attribute(inputs, baselines=baselines,
                                                               feature_mask=token_groups(inputs),
                                                               perturbations_per_eval=8)
        ours = explain(sst2_classifier, tokenizer, text, target=label, method="occlusion")
        assert torch.allclose(attributions_of(ours), ablated[0, :, 0].double(), atol=1e-5, rtol=0)
        assert [attributions_of(ours)[special[0]].abs().max()] == [0.0]
        assert ours.score == pytest.approx(float(logit(inputs)), abs=1e-5)
        gradients = captum_attr.Saliency(logit).attribute(inputs.clone().requires_grad_(), abs=True)
        ours = explain(sst2_classifier, tokenizer, text, target=label, method="saliency")
        assert torch.allclose(attributions_of(ours), gradients[0].double().norm(dim=-1), atol=1e-6, rtol=1e-4)
        assert ours.completeness_gap is None and min(token.attribution for token in ours.tokens) >= 0


def test_occlusion_of_two_texts_holds_the_other_as_given(minilm, hf_minilm, tokenizer):
    """An encoder's similarity: each token of either text at its baseline, the other text as given, against
    transformers' model run on the occluded ids."""
    text, pair = "A man is playing a guitar.", "Someone plays music."
    ours = explain(minilm, tokenizer, text, pair, method="occlusion")
    encodings = [tokenizer(value, return_tensors="pt")["input_ids"] for value in (text, pair)]
    with torch.no_grad():
        def pooled(input_ids):
            return hf_minilm(input_ids).last_hidden_state.mean(1)

        whole = float(torch.cosine_similarity(pooled(encodings[0]), pooled(encodings[1])))
        expected = []
        for side, input_ids in enumerate(encodings):
            for position, token in enumerate(input_ids[0].tolist()):
                if token in (tokenizer.cls_token_id, tokenizer.sep_token_id):
                    expected.append(0.0)
                    continue
                occluded = input_ids.clone()
                occluded[0, position] = tokenizer.pad_token_id
                vectors = [pooled(occluded if k == side else encodings[k]) for k in (0, 1)]
                expected.append(whole - float(torch.cosine_similarity(*vectors)))
    assert ours.score == pytest.approx(whole, abs=1e-5)
    assert attributions_of(ours).tolist() == pytest.approx(expected, abs=1e-5)


def test_shapley_values_equal_captums_and_their_sampled_estimate_comes_close(sst2_classifier, hf_classifier,
                                                                              tokenizer, monkeypatch):
    """Exact Shapley values (every subset) against Captum's ShapleyValues (every order) on transformers' word
    embeddings, a group per token; then the estimate from sampled orders on a longer text against the exact values
    of the same text. Either way the values sum to f(x) - f(baseline)."""
    from bertforge.explain import methods
    from bertforge.explain.page import summary

    captum_attr = pytest.importorskip("captum.attr")
    text = "dull but gripping"  # five tokens with [CLS] and [SEP]: Captum runs all 120 orders
    encoding = tokenizer(text, return_tensors="pt")
    input_ids = encoding["input_ids"]
    table = hf_classifier.bert.embeddings.word_embeddings
    with torch.no_grad():
        inputs, baselines = table(input_ids), table(baseline_ids_of(input_ids, tokenizer))
    index = sst2_classifier.config.label2id["positive"]

    def logit(embeddings):
        return hf_classifier(inputs_embeds=embeddings).logits[:, index]

    with torch.no_grad():
        theirs = captum_attr.ShapleyValues(logit).attribute(inputs, baselines=baselines,
                                                            feature_mask=token_groups(inputs),
                                                            perturbations_per_eval=64)[0, :, 0].double()
        baseline_logit = float(logit(baselines))
    ours = explain(sst2_classifier, tokenizer, text, target="positive", method="shapley")
    assert torch.allclose(attributions_of(ours), theirs, atol=1e-5, rtol=0)
    assert ours.baseline_score == pytest.approx(baseline_logit, abs=1e-5) and abs(ours.completeness_gap) < 1e-5
    assert ours.steps is None and "(every order)" in summary(ours)

    longer = "a gripping, beautifully acted film that never"  # 8 tokens: 256 subsets
    exact = attributions_of(explain(sst2_classifier, tokenizer, longer, target="positive", method="shapley"))
    monkeypatch.setattr(methods, "EXACT_SHAPLEY_TOKENS", 0)  # sampled orders from here
    sampled = explain(sst2_classifier, tokenizer, longer, target="positive", method="shapley", steps=100)
    assert len(exact) == 10 and abs(sampled.completeness_gap) < 1e-5
    assert sampled.steps == 100 and "(100 sampled orders)" in summary(sampled)
    assert torch.corrcoef(torch.stack([exact, attributions_of(sampled)]))[0, 1] > 0.98
    assert (attributions_of(sampled) - exact).abs().max() < 0.15 * exact.abs().max()
    again = explain(sst2_classifier, tokenizer, longer, target="positive", method="shapley", steps=100)
    assert attributions_of(again).tolist() == attributions_of(sampled).tolist()  # seeded: the same input, the same


def test_lime_equals_captums_lime_on_the_same_samples(sst2_classifier, hf_classifier, tokenizer):
    """LIME against Captum's Lime with sklearn's Ridge(alpha=1) on transformers' word embeddings, one group per token
    that can be taken away ([CLS] and [SEP], their own baseline, join their neighbour's group, which they leave as
    it is), fed the same samples, each weighed by lime's text kernel (a width of 25 on cosine distances x 100)."""
    from bertforge.explain.methods import lime_samples
    from bertforge.explain.page import summary

    captum_attr = pytest.importorskip("captum.attr")
    linear_model = pytest.importorskip("captum._utils.models.linear_model")
    pytest.importorskip("sklearn")
    input_ids = tokenizer(REVIEW, return_tensors="pt")["input_ids"]
    table = hf_classifier.bert.embeddings.word_embeddings
    with torch.no_grad():
        inputs, baselines = table(input_ids), table(baseline_ids_of(input_ids, tokenizer))
    words = input_ids.shape[1] - 2
    groups = (torch.arange(input_ids.shape[1]) - 1).clamp(0, words - 1)
    index = sst2_classifier.config.label2id["positive"]
    steps = 120
    samples = iter(lime_samples(words, steps))

    def logit(embeddings):
        return hf_classifier(inputs_embeds=embeddings).logits[:, index]

    def perturb(original, **kwargs):
        kept = next(samples)
        return torch.tensor([[int(k in kept) for k in range(words)]])

    def similarity(original, perturbed, sample, **kwargs):
        distance = 1 - float(torch.cosine_similarity(sample[0].double(), torch.ones(words, dtype=torch.float64),
                                                     dim=0))
        return math.exp(-((100 * distance) ** 2) / 25 ** 2) ** 0.5

    explainer = captum_attr.Lime(logit, interpretable_model=linear_model.SkLearnRidge(alpha=1.0),
                                 similarity_func=similarity, perturb_func=perturb)
    with torch.no_grad():
        theirs = explainer.attribute(inputs, baselines=baselines, feature_mask=groups[None, :, None].expand_as(inputs)
                                     .contiguous(), n_samples=steps, perturbations_per_eval=40)[0, 1:-1, 0].double()
    ours = explain(sst2_classifier, tokenizer, REVIEW, target="positive", method="lime", steps=steps)
    values = attributions_of(ours)
    assert torch.allclose(values[1:-1], theirs, atol=1e-4 * float(theirs.abs().max()), rtol=0)
    assert values[0] == values[-1] == 0 and ours.completeness_gap is None and ours.baseline_score is None
    assert ours.steps == steps and f"{steps} samples" in summary(ours)
    again = explain(sst2_classifier, tokenizer, REVIEW, target="positive", method="lime", steps=steps)
    assert attributions_of(again).tolist() == values.tolist()  # seeded: the same input, the same


def test_smoothgrad_equals_captums_noise_tunnel_over_saliency(sst2_classifier, hf_classifier, tokenizer,
                                                             monkeypatch):
    """SmoothGrad against Captum's NoiseTunnel ("smoothgrad") over Saliency on transformers' word embeddings, the
    L2 norm per token of its mean |gradient|, given the noise SmoothGrad draws (documented: a seeded generator, one
    standard normal draw per copy, scaled to 1% of the embeddings' spread)."""
    captum_attr = pytest.importorskip("captum.attr")
    input_ids = tokenizer(MASKED_REVIEW, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        inputs = hf_classifier.bert.embeddings.word_embeddings(input_ids)
    index = sst2_classifier.config.label2id["negative"]
    steps = 12
    sigma = 0.01 * float(inputs.max() - inputs.min())
    generator = torch.Generator().manual_seed(0)
    noise = sigma * torch.stack([torch.randn(inputs.shape[1:], generator=generator) for _ in range(steps)])

    def logit(embeddings):
        return hf_classifier(inputs_embeds=embeddings).logits[:, index]

    def drawn(mean, std):  # the normal draw Captum's NoiseTunnel makes
        assert mean == 0 and std.shape == noise.shape and float(std[0, 0, 0]) == pytest.approx(sigma)
        return noise.clone()

    with monkeypatch.context() as patched:
        patched.setattr(torch, "normal", drawn)
        theirs = captum_attr.NoiseTunnel(captum_attr.Saliency(logit)).attribute(
            inputs.clone().requires_grad_(), nt_type="smoothgrad", nt_samples=steps, stdevs=sigma, abs=True)
    ours = explain(sst2_classifier, tokenizer, MASKED_REVIEW, target="negative", method="smoothgrad", steps=steps)
    assert torch.allclose(attributions_of(ours), theirs[0].double().norm(dim=-1), atol=1e-6, rtol=1e-4)
    plain = explain(sst2_classifier, tokenizer, MASKED_REVIEW, target="negative", method="saliency")
    assert not torch.allclose(attributions_of(ours), attributions_of(plain), rtol=0.05)  # the noise counts
    assert ours.steps == steps and ours.completeness_gap is None and min(attributions_of(ours)) > 0


def test_shapley_values_of_two_texts_put_each_back_with_the_other_as_given(minilm, hf_minilm, tokenizer):
    """An encoder's similarity: each text's values sum to f(x) less f(that text at its baseline, the other as
    given), which transformers' model gives on the replaced ids."""
    text, pair = "A man plays a guitar.", "Someone plays music."
    ours = explain(minilm, tokenizer, text, pair, method="shapley")
    encodings = [tokenizer(value, return_tensors="pt")["input_ids"] for value in (text, pair)]
    with torch.no_grad():
        def similarity(first, second):
            return float(torch.cosine_similarity(hf_minilm(first).last_hidden_state.mean(1),
                                                 hf_minilm(second).last_hidden_state.mean(1)))
        whole = similarity(*encodings)
        without = [similarity(baseline_ids_of(encodings[0], tokenizer), encodings[1]),
                   similarity(encodings[0], baseline_ids_of(encodings[1], tokenizer))]
    assert ours.score == pytest.approx(whole, abs=1e-5)
    assert ours.inner["baseline_scores"] == pytest.approx(without, abs=1e-5)
    for side in (0, 1):
        total = sum(token.attribution for token in ours.tokens if token.text == side)
        assert total == pytest.approx(whole - without[side], abs=1e-5)


def test_faithfulness_is_transformers_logit_without_the_top_words_and_with_them_alone(sst2_classifier, hf_classifier,
                                                                                      tokenizer):
    """ERASER's comprehensiveness and sufficiency at each share of the words, against transformers' model run on the
    ids with the top words' pieces (or all the others') put at [PAD]."""
    explanation = explain(sst2_classifier, tokenizer, REVIEW, target="positive")
    measured = explanation.faithfulness
    input_ids = tokenizer(REVIEW, return_tensors="pt")["input_ids"]
    ranked = sorted(explanation.words, key=lambda word: -word.attribution)
    assert [token.token for token in explanation.tokens] == tokenizer.convert_ids_to_tokens(input_ids[0])

    def logit(padded_words):
        ids = input_ids.clone()
        for word in padded_words:
            ids[0, word.tokens] = tokenizer.pad_token_id
        with torch.no_grad():
            return float(hf_classifier(ids).logits[0, 1])

    whole = logit([])
    assert measured.words_removed == [1, 1, 2, 3, 7]  # of 13 words: at least one, rounded up
    for count, comprehensiveness, sufficiency in zip(measured.words_removed, measured.comprehensiveness,
                                                     measured.sufficiency):
        assert comprehensiveness == pytest.approx(whole - logit(ranked[:count]), abs=1e-4)
        assert sufficiency == pytest.approx(whole - logit(ranked[count:]), abs=1e-4)
    assert measured.aopc_comprehensiveness == pytest.approx(sum(measured.comprehensiveness) / 5, abs=1e-12)
    assert len(measured.random_comprehensiveness) == len(measured.random_sufficiency) == 5


def test_top_words_are_more_faithful_than_random_ones_on_real_sentences(sst2_classifier, tokenizer, sst2_dev):
    """On SST-2 dev sentences the classifier never saw, integrated gradients' top words carry the prediction: f
    falls further without them than without random words, and less with them alone than with random words alone
    (measured: 0.83 against 0.04, and -0.09 against 0.79)."""
    measured = [explain(sst2_classifier, tokenizer, text, steps=8).faithfulness for text, _ in sst2_dev[:10]]
    mean = {name: sum(getattr(one, name) for one in measured) / len(measured)
            for name in ("aopc_comprehensiveness", "aopc_random_comprehensiveness", "aopc_sufficiency",
                         "aopc_random_sufficiency")}
    assert mean["aopc_comprehensiveness"] > 2 * mean["aopc_random_comprehensiveness"] > 0, mean
    assert mean["aopc_sufficiency"] < mean["aopc_random_sufficiency"], mean


def test_a_text_read_in_part_says_how_many_words_are_explained(sst2_classifier, tokenizer, minilm_dir, sst2_dev):
    """A text cut at max_length was explained over the part read, silently: the note says how many of its words
    the model reads, counted as transformers' fast tokenizer counts them, truncated and whole."""
    transformers = pytest.importorskip("transformers")
    fast = transformers.AutoTokenizer.from_pretrained(minilm_dir, use_fast=True)
    long_text = " ".join(text for text, _ in sst2_dev[:8])
    explanation = explain(sst2_classifier, tokenizer, long_text, method="attention_rollout", max_length=48)
    total = len(set(fast(long_text, add_special_tokens=False).word_ids()))
    read = len(set(fast(long_text, truncation=True, max_length=48).word_ids()) - {None})
    assert explanation.note == f"the model reads {read} of the text's {total} words; the others are not explained"
    assert len(explanation.words) == read < total
    assert explain(sst2_classifier, tokenizer, REVIEW, method="attention_rollout").note is None


def test_attention_rollout_is_a_distribution_over_the_input(sst2_classifier, tokenizer):
    explanation = explain(sst2_classifier, tokenizer, REVIEW, method="attention_rollout")
    values = [token.attribution for token in explanation.tokens]
    assert min(values) > 0 and sum(values) == pytest.approx(1.0)
    assert explanation.completeness_gap is None


SPAN_TEXTS = [
    "Café  déjà-vu:   it's   \"GREAT\"!!",
    "naïve résumé — Ångström, façade…",
    "東京タワーは高い。 Tokyo tower is tall.",
    "  unaffable  ,, preprocessing\tmisc.  ",
]


@pytest.mark.parametrize("text", SPAN_TEXTS)
def test_word_spans_index_the_users_text_and_pieces_add_up(sst2_classifier, tokenizer, minilm_dir, text):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    explanation = explain(sst2_classifier, tokenizer, text, method="gradient_x_input")
    encoding = reference(text, return_offsets_mapping=True)
    expected: dict[int, list[int]] = {}
    for word_id, (start, end) in zip(encoding.word_ids(), encoding["offset_mapping"]):
        if word_id is not None:
            span = expected.setdefault(word_id, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    assert [(word.start, word.end) for word in explanation.words] == [tuple(span) for span in expected.values()]
    for word in explanation.words:
        assert word.word == text[word.start:word.end] and word.word.strip() == word.word and word.word
        pieces = [explanation.tokens[i] for i in word.tokens]
        assert word.attribution == pytest.approx(sum(piece.attribution for piece in pieces), abs=1e-12)
        assert all(word.start <= piece.start < piece.end <= word.end for piece in pieces)
    assert sum(len(word.tokens) for word in explanation.words) == len(explanation.tokens) - 2  # all but [CLS], [SEP]


def test_pair_words_index_the_pair(sst2_classifier, tokenizer):
    explanation = explain(sst2_classifier, tokenizer, "Is it good?", "Yes,  très bien.")
    pair_words = [word for word in explanation.words if word.text == 1]
    assert [word.word for word in pair_words] == ["Yes", ",", "très", "bien", "."]
    assert all(explanation.texts[1][w.start:w.end] == w.word for w in pair_words)


def test_a_taggers_entities_are_those_predict_gives(tokenizer, tiny_config, data_dir, tmp_path):
    """Words as the task reads them ("Anne-Gaelle", "U.S.", "Germany's" are one word each, tagged at their first
    piece), decoded its one way (here Viterbi, as the run saved it): explain offers predict's entities, not a
    tag read off every piece the tokenizer splits at punctuation."""
    from bertforge.config import FINETUNE_KEY
    from bertforge.tasks import predict
    from bertforge.tasks.token_classification import read_conll

    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": dict(enumerate(labels)), "label2id": {tag: i for i, tag in enumerate(labels)}})
    torch.manual_seed(0)
    tagger = BertForTokenClassification(config).eval()
    with torch.no_grad():  # entities everywhere, their tags left to each token's random logits
        tagger.classifier.weight.mul_(40)
        tagger.classifier.bias.copy_(torch.tensor([-2.0, 0.0, 0.0, 0.0, 0.0]))
    tagger.config.extra |= {"finetuning_task": "ner", FINETUNE_KEY: {"max_length": 64, "decoding": "viterbi"}}
    tagger.save_pretrained(tmp_path / "tagger")
    tokenizer.save_pretrained(tmp_path / "tagger")
    sentences = [" ".join(sentence.words) for sentence in read_conll(data_dir / "conll2003" / "eng.testa")
                 if any("-" in word or "." in word[:-1] or "'" in word for word in sentence.words)][:12]
    answers = predict(tmp_path / "tagger", texts=sentences)
    hyphenated = 0
    for text, answer in zip(sentences, answers):
        expected = [f"{entity['type']}: {entity['text']}" for entity in answer["entities"]]
        if not expected:
            continue
        assert explain(tagger, tokenizer, text, max_length=64).targets == expected, text
        hyphenated += any("-" in entity["text"] or "." in entity["text"] for entity in answer["entities"])
    assert hyphenated >= 3


def test_a_words_tag_o_included_is_explained_at_its_first_piece(tokenizer, tiny_config, tmp_path):
    """Why isn't "Smithson" a person? "O: Smithson" explains the O logit at the word's first piece, as transformers'
    model gives it; a text without entities says how to ask, and a word not in the text is named."""
    transformers = pytest.importorskip("transformers")
    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": {0: "O", 1: "B-PER", 2: "I-PER"},
                           "label2id": {"O": 0, "B-PER": 1, "I-PER": 2}})
    torch.manual_seed(0)
    tagger = BertForTokenClassification(config).eval()
    with torch.no_grad():  # every word is O: no entity
        tagger.classifier.bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    tagger.save_pretrained(tmp_path)
    reference = transformers.BertForTokenClassification.from_pretrained(tmp_path).eval()
    text = "John Smithson met Mary"
    with pytest.raises(InputError, match="^the model finds no entity in the text, so there is none to explain; ask "
                                         "for one word's tag, e.g. --target 'O: John'$"):
        explain(tagger, tokenizer, text)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    first_piece = tokenizer.convert_ids_to_tokens(ids[0]).index("smith")  # smith ##son
    with torch.no_grad():
        logits = reference(ids).logits[0, first_piece]
    for tag, column in (("O", 0), ("B-PER", 1)):
        explanation = explain(tagger, tokenizer, text, target=f"{tag}: Smithson")
        assert explanation.target == f"{tag}: Smithson" and explanation.score == pytest.approx(float(logits[column]),
                                                                                              abs=1e-5)
    with pytest.raises(InputError, match="^no word 'Paris' in the text \\(words: John Smithson met Mary\\)$"):
        explain(tagger, tokenizer, text, target="O: Paris")


def test_an_entity_is_scored_where_the_tagger_reads_its_words(tokenizer, tiny_config, tmp_path):
    """A word's tag is read (and trained) at its first piece alone: the explained score of an entity is the sum,
    over its words, of the tag's logit at that piece, as transformers' model gives it for the fast tokenizer's
    first piece of each word; the other pieces' logits, never read, are not in it."""
    transformers = pytest.importorskip("transformers")
    from bertforge.config import FINETUNE_KEY
    from bertforge.tasks import predict

    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": dict(enumerate(labels)), "label2id": {tag: i for i, tag in enumerate(labels)}})
    torch.manual_seed(1)
    tagger = BertForTokenClassification(config).eval()
    with torch.no_grad():
        tagger.classifier.weight.mul_(40)
        tagger.classifier.bias.copy_(torch.tensor([-2.0, 0.0, 0.0, 0.0, 0.0]))
    tagger.config.extra |= {"finetuning_task": "ner", FINETUNE_KEY: {"max_length": 64}}
    tagger.save_pretrained(tmp_path / "tagger")
    tokenizer.save_pretrained(tmp_path / "tagger")
    reference = transformers.BertForTokenClassification.from_pretrained(tmp_path / "tagger").eval()
    fast = transformers.BertTokenizerFast.from_pretrained(tmp_path / "tagger")
    text = "Satya Nadella visited Kuala Lumpur with Anneliese Quirinius yesterday"
    words = text.split()
    assert sum(len(tokenizer.tokenize(word)) > 1 for word in words) >= 4  # words of several pieces
    encoded = fast(text, return_tensors="pt")
    with torch.inference_mode():
        logits = reference(**encoded).logits[0]
    first_piece = {}
    for position, word in enumerate(encoded.word_ids()):
        if word is not None:
            first_piece.setdefault(word, position)
    [answer] = predict(tmp_path / "tagger", texts=[text])
    checked = 0
    for entity in answer["entities"]:
        chosen = [index for index, word in enumerate(words)
                  if entity["start"] <= text.index(word) < entity["end"]]  # the words are distinct
        expected = sum(logits[first_piece[index], labels.index(answer["tags"][index])].item() for index in chosen)
        explanation = explain(tagger, tokenizer, text, target=f"{entity['type']}: {entity['text']}", max_length=64)
        assert explanation.score == pytest.approx(expected, abs=1e-4)
        checked += any(len(tokenizer.tokenize(words[index])) > 1 for index in chosen)
    assert checked >= 1


def test_an_answer_is_predicts_in_the_window_it_came_from(tokenizer, tiny_config, data_dir, tmp_path):
    """Explain's answer is the one predict gives, found its one way (n-best starts and ends, windows over a long
    context), and its score predict's: the start + end logits in the window that gave it, past the first one too."""
    import json

    from bertforge.config import FINETUNE_KEY
    from bertforge.tasks import predict

    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})
    torch.manual_seed(2)
    reader = BertForQuestionAnswering(config).eval()
    reader.config.extra |= {"finetuning_task": "qa",
                            FINETUNE_KEY: {"max_length": 64, "doc_stride": 16, "max_query_length": 16}}
    reader.save_pretrained(tmp_path / "reader")
    tokenizer.save_pretrained(tmp_path / "reader")
    squad = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    pairs = [(paragraph["qas"][0]["question"], paragraph["context"])
             for article in squad[:4] for paragraph in article["paragraphs"][:2]]
    answers = predict(tmp_path / "reader", texts=[q for q, _ in pairs], text_pairs=[c for _, c in pairs])
    beyond_the_first_window = 0
    for (question, context), answer in zip(pairs, answers):
        explanation = explain(reader, tokenizer, question, context, max_length=64, method="gradient_x_input")
        assert explanation.target == f"answer: {answer['answer']}"
        assert explanation.score == pytest.approx(answer["score"], abs=1e-4)
        words = [word for word in explanation.words if word.text == 1]
        assert all(context[word.start:word.end] == word.word for word in words)
        beyond_the_first_window += words[0].start > 0
    assert beyond_the_first_window >= 3


def test_a_long_text_is_explained_over_the_windows_predict_averages(tokenizer, tiny_config, sst2_dev, tmp_path):
    """A classifier fine-tuned with long_text "windows" answers with the mean of its windows' logits: explain's
    class is predict's and its score that mean, over every window (transformers' model on the task's windows),
    and every word of the text is attributed; a pair's longer text is the one windowed."""
    transformers = pytest.importorskip("transformers")
    from bertforge import BertForSequenceClassification
    from bertforge.config import FINETUNE_KEY
    from bertforge.tasks import predict
    from bertforge.tasks.classification import windows
    from bertforge.tasks.data import TextExample

    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}})
    torch.manual_seed(4)
    classifier = BertForSequenceClassification(config).eval()
    texts = [" ".join(text for text, _ in sst2_dev[i:i + 3]) for i in range(0, 24, 3)]
    pairs = [(text, None) for text in texts[:5]] + [(sst2_dev[30][0], text) for text in texts[5:]]
    with torch.inference_mode():  # logits centred on these windows, so that both classes are predicted
        pieces = [piece for text, pair in pairs for piece in windows(tokenizer, TextExample(text, pair), 16)]
        logits = torch.stack([classifier(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0]
                              for ids, types in pieces])
        classifier.classifier.bias.copy_(-30 * (logits.mean(0) - classifier.classifier.bias))
        classifier.classifier.weight.mul_(30)
    classifier.config.extra |= {"finetuning_task": "classification",
                                FINETUNE_KEY: {"max_length": 16, "long_text": "windows"}}
    classifier.save_pretrained(tmp_path / "windows")
    tokenizer.save_pretrained(tmp_path / "windows")
    reference = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "windows").eval()
    answers = predict(tmp_path / "windows", texts=[text for text, _ in pairs[:5]]) + \
        predict(tmp_path / "windows", texts=[text for text, _ in pairs[5:]], text_pairs=[p for _, p in pairs[5:]])
    labels = set()
    for (text, pair), answer in zip(pairs, answers):
        pieces = windows(tokenizer, TextExample(text, pair), 16)
        assert len(pieces) > 2
        with torch.inference_mode():
            mean = torch.stack([reference(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0]
                                for ids, types in pieces]).mean(0)
        explanation = explain(classifier, tokenizer, text, pair, max_length=16)
        assert explanation.target == answer["label"] == config.id2label[int(mean.argmax())]
        assert explanation.score == pytest.approx(mean.max().item(), rel=1e-3, abs=1e-6)
        assert abs(explanation.completeness_gap) < 0.01 * abs(explanation.score - explanation.baseline_score)
        windowed = 0 if pair is None or len(text) > len(pair) else 1
        last = max(word.end for word in explanation.words if word.text == windowed)
        assert last == len((text, pair)[windowed].rstrip())
        labels.add(answer["label"])
    assert labels == {"negative", "positive"}


def test_a_multi_label_model_that_gives_no_label_says_so(tokenizer, tiny_config):
    from bertforge import BertForSequenceClassification

    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": {0: "sports", 1: "health"}, "label2id": {"sports": 0, "health": 1},
                           "problem_type": "multi_label_classification"})
    classifier = BertForSequenceClassification(config).eval()
    with torch.no_grad():  # every probability under 0.5
        classifier.classifier.bias.copy_(torch.tensor([-4.0, -3.0]))
    explanation = explain(classifier, tokenizer, "The cat sat quietly.")
    assert explanation.target == "health" and explanation.note.startswith("the most probable label, 0.") and \
        explanation.note.endswith("is under the threshold 0.5: the model gives no label")
    assert explain(classifier, tokenizer, "The cat sat quietly.", target="sports").note is None
    with torch.no_grad():
        classifier.classifier.bias.copy_(torch.tensor([-4.0, 6.0]))
    explanation = explain(classifier, tokenizer, "The cat sat quietly.")
    assert (explanation.target, explanation.note) == ("health", None)


def test_an_encoders_similarity_is_the_one_its_sentence_vectors_give(minilm, minilm_dir, tokenizer, sst2_dev):
    """Read as its sentence-transformers layout reads (256 tokens for MiniLM, where the tokenizer allows 512) and
    pooled as it pools: the score explained is `bertforge similarity`'s, for a text longer than the layout reads
    and for [CLS] pooling too."""
    import dataclasses

    from bertforge import SentenceEncoder

    long_text = " ".join(text for text, _ in sst2_dev[:40])
    vectors = SentenceEncoder(str(minilm_dir)).encode([long_text, "a great movie"], convert_to_tensor=True)
    explanation = explain(minilm, tokenizer, long_text, "a great movie", steps=4)
    assert explanation.score == pytest.approx(torch.cosine_similarity(vectors[:1], vectors[1:]).item(), abs=1e-5)
    assert len([token for token in explanation.tokens if token.text == 0]) == 256 - 2
    layout = minilm.sentence_embedding
    try:
        minilm.sentence_embedding = dataclasses.replace(layout, pooling="cls")
        by_cls = explain(minilm, tokenizer, "A man plays a guitar.", "Someone is making music.", steps=4)
        with torch.inference_mode():
            first = [minilm(**tokenizer(text, return_tensors="pt")).last_hidden_state[:, 0]
                     for text in ("A man plays a guitar.", "Someone is making music.")]
        assert by_cls.score == pytest.approx(torch.cosine_similarity(*first).item(), abs=1e-5)
    finally:
        minilm.sentence_embedding = layout


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_explains_every_kind_of_model(tokenizer, tiny_config, method):
    """Mechanics on tiny models: a tagger, a reader, a masked LM and a classifier of a truncated text all get a
    finite attribution per token; the unsigned methods' are 0 or more; those that take tokens away leave [CLS] and
    [SEP], their own baseline, at 0."""
    from bertforge import BertForSequenceClassification
    from bertforge.explain.methods import UNSIGNED

    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": {0: "O", 1: "B-PER", 2: "I-PER"},
                           "label2id": {"O": 0, "B-PER": 1, "I-PER": 2}})
    torch.manual_seed(0)
    models = [(BertForTokenClassification(config), "John Smith met Mary", None),
              (BertForQuestionAnswering(config), "Who sat?", "The cat sat on the mat."),
              (BertForMaskedLM(config), "The cat [MASK] on the mat.", None),
              (BertForSequenceClassification(config), "a long review of a film " * 8, None)]
    for model, text, pair in models:
        explanation = explain(model.eval(), tokenizer, text, pair, method=method, steps=8, max_length=16)
        values = attributions_of(explanation)
        assert len(values) == len(explanation.tokens) >= 5 and torch.isfinite(values).all(), type(model).__name__
        if method in UNSIGNED:
            assert values.min() >= 0
        if method in ("occlusion", "shapley", "lime"):
            assert all(token.attribution == 0 for token in explanation.tokens if token.text is None)


def test_every_task_has_targets(tokenizer, tiny_config, minilm):
    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size,
                           "id2label": {0: "O", 1: "B-PER", 2: "I-PER"},
                           "label2id": {"O": 0, "B-PER": 1, "I-PER": 2}})
    torch.manual_seed(0)
    tagger = BertForTokenClassification(config).eval()
    with torch.no_grad():  # every word begins a person: two entities
        tagger.classifier.bias.copy_(torch.tensor([0.0, 5.0, 0.0]))
    explanation = explain(tagger, tokenizer, "John Smith")
    assert explanation.targets == ["PER: John", "PER: Smith"] and explanation.target == "PER: John"
    assert abs(explanation.completeness_gap) < 0.01 * abs(explanation.score - explanation.baseline_score)
    assert explain(tagger, tokenizer, "John Smith", target="Smith").target == "PER: Smith"
    with torch.no_grad():  # every word continues a person: one entity of two words, three tokens
        tagger.classifier.bias.copy_(torch.tensor([0.0, 0.0, 5.0]))
    explanation = explain(tagger, tokenizer, "John Smithson")
    assert explanation.targets == ["PER: John Smithson"]

    reader = BertForQuestionAnswering(config).eval()
    answer = explain(reader, tokenizer, "Who sat?", "The cat sat.", target="start")
    assert answer.target.startswith("start: ") and [w.word for w in answer.words][-3:] == ["cat", "sat", "."]
    with pytest.raises(InputError, match="give the pair"):
        explain(reader, tokenizer, "Who sat?")
    with pytest.raises(InputError, match="the pair to explain is empty"):  # it was a TypeError
        explain(reader, tokenizer, "Who sat?", "\x1b ")

    fill = BertForMaskedLM(config).eval()
    guess = explain(fill, tokenizer, "The cat [MASK] on the mat.", method="gradient_x_input")
    assert guess.target in guess.targets and len(guess.targets) >= 5
    # a word as the user writes it, read as the uncased tokenizer reads it; a word piece as it is
    assert explain(fill, tokenizer, "The cat [MASK] on the mat.", target="Sat", method="gradient_x_input").target == \
        "sat"
    assert explain(fill, tokenizer, "The cat [MASK] on the mat.", target="##ing",
                   method="gradient_x_input").target == "##ing"

    similar = explain(minilm, tokenizer, "A man plays a guitar.", "Someone is making music.")
    assert similar.target == "similarity" and {w.text for w in similar.words} == {0, 1}
    assert abs(similar.completeness_gap) < 0.01 * abs(similar.score - similar.baseline_score)
    with pytest.raises(InputError, match="give the second as the pair"):
        explain(minilm, tokenizer, "One text.")


def test_bad_requests_are_one_line_errors(sst2_classifier, tokenizer):
    with pytest.raises(InputError, match="choose from: negative, positive"):
        explain(sst2_classifier, tokenizer, REVIEW, target="neutral")
    with pytest.raises(InputError, match=f"choose from {', '.join(METHODS)}"):
        explain(sst2_classifier, tokenizer, REVIEW, method="anchors")
    with pytest.raises(InputError, match="empty"):
        explain(sst2_classifier, tokenizer, "   ")
    # a max_length that leaves one of the texts no word piece (it was explained with none of its words)
    with pytest.raises(InputError, match="max_length 4 keeps no word piece of the pair: give a larger max_length"):
        explain(sst2_classifier, tokenizer, REVIEW, "A pair.", max_length=4)
    with pytest.raises(InputError, match="max_length 2 keeps no word piece of the text"):
        explain(sst2_classifier, tokenizer, REVIEW, max_length=2)


def test_arguments_of_the_wrong_type_are_named(sst2_classifier, minilm, tokenizer):
    """steps "5" failed comparing an int with a str and 1.5 was taken; a pair of 5 was blamed on `text`, and an
    encoder's text None was asked for a second text."""
    for steps in ("5", 1.5):
        with pytest.raises(ConfigError, match=f"steps must be an integer, got {steps!r}"):
            explain(sst2_classifier, tokenizer, REVIEW, steps=steps)
    with pytest.raises(InputError, match="^text_pair must be a string, got int$"):
        explain(sst2_classifier, tokenizer, REVIEW, text_pair=5)
    with pytest.raises(InputError, match="^text must be a string, got NoneType$"):
        explain(minilm, tokenizer, text=None)


@pytest.mark.parametrize(("text", "pair", "empty"), [
    ("\x1b", None, "text"), ("\u200b\u200d \x00\ufeff", None, "text"), ("", None, "text"),
    ("Is it good?", "\x1b\t", "pair"), ("Is it good?", "", "pair")])
def test_a_text_that_tokenizes_to_nothing_is_refused(sst2_classifier, minilm, tokenizer, text, pair, empty):
    """Control and zero-width characters tokenize to no piece, as spaces do: such a text was explained as [CLS] [SEP]
    with no word and every attribution 0."""
    for model in (sst2_classifier, minilm) if pair is not None else (sst2_classifier,):
        with pytest.raises(InputError, match=f"^the {empty} to explain is empty after tokenization") as error:
            explain(model, tokenizer, text, pair)
        assert "\n" not in str(error.value)


def test_special_tokens_alone_and_a_mask_out_of_reach_are_named(sst2_classifier, tokenizer, tiny_config):
    """Both were told to give a larger max_length (or to put a [MASK] in the text), which could not help."""
    for text, pair, name in (("[CLS] [SEP]", None, "text"), ("[PAD]", None, "text"), ("Is it good?", "[SEP]", "pair")):
        with pytest.raises(InputError, match=rf"^the {name} to explain holds special tokens alone \("):
            explain(sst2_classifier, tokenizer, text, pair)
    fill = BertForMaskedLM(BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})).eval()
    with pytest.raises(InputError, match="^the \\[MASK\\] is beyond the first 16 tokens the model reads"):
        explain(fill, tokenizer, "word " * 30 + "[MASK].", max_length=16)


def test_an_int8_model_is_explained_by_forward_passes_and_refused_by_gradients(sst2_classifier_dir, tokenizer,
                                                                              sst2_dev):
    """No gradient flows through an int8 layer's kernel: the gradient methods would give every word 0, so they
    are refused; attention rollout reads the attention probabilities, which int8 computes as fp32 does (nearly)."""
    from bertforge import BertForSequenceClassification
    from bertforge.compress import QuantizationConfig, quantize

    model = BertForSequenceClassification.from_pretrained(sst2_classifier_dir)
    fp32_rollout = attributions_of(explain(model, tokenizer, REVIEW, method="attention_rollout"))
    fp32_occlusion = attributions_of(explain(model, tokenizer, REVIEW, method="occlusion"))
    fp32_shapley = attributions_of(explain(model, tokenizer, REVIEW, method="shapley", steps=20))
    fp32_lime = attributions_of(explain(model, tokenizer, REVIEW, method="lime", steps=100))
    calibration = [dict(tokenizer([text for text, _ in sst2_dev[:32]], padding=True, return_tensors="pt"))]
    quantize(model, QuantizationConfig("int8"), calibration)
    for method in ("integrated_gradients", "gradient_x_input", "saliency", "smoothgrad"):
        with pytest.raises(InputError, match="int8 layers"):
            explain(model, tokenizer, REVIEW, method=method)
    int8_rollout = attributions_of(explain(model, tokenizer, REVIEW, method="attention_rollout"))
    assert torch.nn.functional.cosine_similarity(int8_rollout, fp32_rollout, dim=0) > 0.99
    # Occlusion runs forward alone: the int8 model's own, close to the fp32 model's.
    int8_occlusion = attributions_of(explain(model, tokenizer, REVIEW, method="occlusion"))
    assert torch.nn.functional.cosine_similarity(int8_occlusion, fp32_occlusion, dim=0) > 0.9
    # So do Shapley values (sampled orders beyond 10 tokens).
    int8_shapley = attributions_of(explain(model, tokenizer, REVIEW, method="shapley", steps=20))
    assert torch.nn.functional.cosine_similarity(int8_shapley, fp32_shapley, dim=0) > 0.9
    # And LIME (the same seeded samples).
    int8_lime = attributions_of(explain(model, tokenizer, REVIEW, method="lime", steps=100))
    assert torch.nn.functional.cosine_similarity(int8_lime, fp32_lime, dim=0) > 0.9


def test_explain_leaves_another_threads_calls_on_the_same_model_as_they_are(sst2_classifier, tokenizer, sst2_dev):
    """A web app's threads share one loaded model: a prediction another thread makes while explain runs the model is
    the prediction it makes alone, and the explanation is the one explain gives alone. Deterministic: the other
    thread predicts (waited for) in the middle of explain's forward passes, past the word-embedding lookup, where a
    hook that explain left on the shared lookup would replace the other thread's embeddings."""
    texts = [text for text, _ in sst2_dev[:4]]

    def predict(text: str) -> torch.Tensor:
        with torch.inference_mode():
            return sst2_classifier(**tokenizer(text, return_tensors="pt")).logits

    alone = [predict(text) for text in texts]
    explained_alone = attributions_of(explain(sst2_classifier, tokenizer, REVIEW, steps=8))
    explaining, meanwhile = threading.get_ident(), []

    def predict_elsewhere(module, inputs):
        if threading.get_ident() == explaining and len(meanwhile) < len(texts):
            meanwhile.append(other_thread.submit(predict, texts[len(meanwhile)]))
            concurrent.futures.wait(meanwhile[-1:])

    with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
        handle = sst2_classifier.classifier.register_forward_pre_hook(predict_elsewhere)
        try:
            explained = attributions_of(explain(sst2_classifier, tokenizer, REVIEW, steps=8))
        finally:
            handle.remove()
    assert len(meanwhile) == len(texts)
    for text, expected, future in zip(texts, alone, meanwhile):
        assert torch.equal(future.result(), expected), text
    assert torch.equal(explained, explained_alone)
