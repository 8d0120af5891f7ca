"""The explanation page in a real headless Chromium (offline), the masked-LM views, and `bertforge explain`."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from bertforge import BertConfig, BertTokenizer
from bertforge.cli import main as cli_main
from bertforge.errors import InputError
from bertforge.explain import explain
from bertforge.explain.page import explanation_page
from bertforge.pretraining import BertForMaskedLM

REVIEW = "A  gripping,   beautifully acted film — but the ending? Dull."




def test_page_shades_the_users_words_beside_the_attention_views(browser, tmp_path, sst2_classifier, tokenizer):
    from selenium.webdriver.common.by import By

    explanation = explain(sst2_classifier, tokenizer, REVIEW)
    path = tmp_path / "explain.html"
    path.write_text(explanation_page(sst2_classifier, tokenizer, explanation), encoding="utf-8")
    browser.get(path.as_uri())
    assert browser.execute_script("return window.performance.getEntriesByType('resource').length") == 0
    text = browser.find_element(By.CSS_SELECTOR, '#explanation .text[data-text="0"]')
    assert browser.execute_script("return arguments[0].textContent", text) == REVIEW  # spacing and dash kept
    spans = browser.find_elements(By.CSS_SELECTOR, "#explanation .word")
    assert [span.text for span in spans] == [word.word for word in explanation.words]
    colours = [span.value_of_css_property("background-color") for span in spans]
    strongest = max(range(len(spans)), key=lambda i: abs(explanation.words[i].attribution))
    rgba = [float(part) for part in re.findall(r"[\d.]+", colours[strongest])]
    assert len(rgba) == 4 and rgba[3] > 0.7  # the strongest word is the most shaded
    for word, colour in zip(explanation.words, colours):  # green for, red against
        red, green = (float(part) for part in re.findall(r"[\d.]+", colour)[:2])
        assert (green > red) == (word.attribution >= 0) or abs(word.attribution) < 1e-3 * abs(
            explanation.words[strongest].attribution)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#model-grid canvas")) == 6 * 12
    assert browser.find_element(By.ID, "neuron").get_attribute("data-weights")
    browser.save_screenshot(str(tmp_path / "explain.png"))


def test_masked_lm_page_shows_each_layers_guess_and_vector_changes(tokenizer, tiny_config, tmp_path):
    config = BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})
    torch.manual_seed(0)
    model = BertForMaskedLM(config).eval()
    explanation = explain(model, tokenizer, "The cat [MASK] on the mat.", method="gradient_x_input")
    (prediction,) = explanation.inner["layer_predictions"]
    assert prediction["position"] == 3 and len(prediction["layers"]) == config.num_hidden_layers + 1
    # The last layer's guess is the model's own prediction at the [MASK].
    encoding = tokenizer("The cat [MASK] on the mat.", return_tensors="pt")
    with torch.no_grad():
        probabilities = model(**encoding).logits[0, 3].softmax(-1)
    best = int(probabilities.argmax())
    assert prediction["layers"][-1][0] == [tokenizer.convert_ids_to_tokens(best), pytest.approx(
        float(probabilities[best]), abs=1e-4)]
    assert explanation.target == tokenizer.convert_ids_to_tokens(best)
    similarity = torch.tensor(explanation.inner["layer_similarity"])
    assert similarity.shape == (9, config.num_hidden_layers) and (similarity.abs() <= 1.0001).all()
    page = explanation_page(model, tokenizer, explanation)
    assert 'class="inner layer-predictions"' in page and page.count("<tr><th>layer ") >= 2


def test_encoder_page_shows_each_texts_baseline(minilm, tokenizer):
    """An encoder's texts are explained one against the other: two baselines, and no masked-LM tables."""
    explanation = explain(minilm, tokenizer, "A man is playing a guitar.", "Someone plays music.", steps=8)
    empty_text, empty_pair = explanation.inner["baseline_scores"]
    page = explanation_page(minilm, tokenizer, explanation)
    assert f"f(empty text, pair) = {empty_text:.4g}, f(text, empty pair) = {empty_pair:.4g}" in page
    assert 'id="inner"' not in page


def bertforge(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertforge", *arguments], capture_output=True, text=True,
                          timeout=600)


def test_cli_writes_json_and_html_and_reports_bad_input(sst2_classifier_dir, sst2_classifier, tokenizer, tmp_path):
    result = bertforge("explain", "--model", str(sst2_classifier_dir), "--text", REVIEW, "--target", "positive",
                       "--output", str(tmp_path / "why.json"))
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "why.json").read_text(encoding="utf-8"))
    expected = explain(sst2_classifier, tokenizer, REVIEW, target="positive")
    assert written["target"] == "positive" and written["targets"] == ["negative", "positive"]
    assert [w["word"] for w in written["words"]] == [w.word for w in expected.words]
    assert written["words"][0]["attribution"] == pytest.approx(expected.words[0].attribution, abs=1e-6)
    result = bertforge("explain", "--model", str(sst2_classifier_dir), "--text", REVIEW, "--method",
                       "attention_rollout", "--output", str(tmp_path / "why.html"))
    page = (tmp_path / "why.html").read_text(encoding="utf-8")
    assert result.returncode == 0 and "<svg" in page and "this method has no for or against" in page
    result = bertforge("explain", "--model", str(sst2_classifier_dir), "--text", REVIEW, "--method", "occlusion",
                       "--output", str(tmp_path / "why.html"))
    page = (tmp_path / "why.html").read_text(encoding="utf-8")
    assert result.returncode == 0 and "Green words speak for the target, red ones against it" in page
    result = bertforge("explain", "--model", str(sst2_classifier_dir), "--text", REVIEW, "--target", "neutral")
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "unknown label 'neutral'; choose from: negative, positive" in result.stderr
    result = bertforge("explain", "--text", "x", "--output", str(tmp_path / "why.txt"))
    assert result.returncode == 1 and "must be a .html or .json file" in result.stderr


def test_more_steps_than_the_rule_can_take_are_refused(sst2_classifier, tokenizer, capsys):
    """Gauss-Legendre's points for n steps are an n x n eigenproblem: 10^14 steps asked the machine for more memory
    than it has, and the error named a --batch-size that explain doesn't take."""
    with pytest.raises(InputError, match="steps must be from 1 to 1000, got 1001"):
        explain(sst2_classifier, tokenizer, REVIEW, steps=1001)
    with pytest.raises(SystemExit) as stop:
        cli_main.main(["explain", "--text", REVIEW, "--steps", "99999999999999"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --steps: must be from 1 to 1000, got 99999999999999" in err, err


def test_cli_explains_what_predict_reads_of_a_long_text(sst2_classifier_dir, tmp_path):
    """A checkpoint from elsewhere reads as many tokens in `predict` as its files allow (its tokenizer's
    model_max_length): `explain` attributes the prediction made from those tokens, not from the whole text."""
    from bertforge.tasks.checkpoint_contents import inspect_checkpoint
    from bertforge.tasks.finetuned_model import predict

    long_review = " ".join([REVIEW] * 40)
    read = inspect_checkpoint(sst2_classifier_dir).settings().max_length
    assert read == 512 < len(BertTokenizer.from_pretrained(sst2_classifier_dir).tokenize(long_review))
    result = bertforge("explain", "--model", str(sst2_classifier_dir), "--text", long_review, "--method",
                       "attention_rollout", "--output", str(tmp_path / "why.json"))
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "why.json").read_text(encoding="utf-8"))
    assert len(written["tokens"]) == read
    assert written["target"] == predict(sst2_classifier_dir, texts=[long_review])[0]["label"]
    # The page: the same attributions; attention views of at most --attention-max-length tokens, said on the page.
    result = bertforge("explain", "--model", str(sst2_classifier_dir), "--text", long_review, "--method",
                       "attention_rollout", "--attention-max-length", "60", "--output", str(tmp_path / "why.html"))
    page = (tmp_path / "why.html").read_text(encoding="utf-8")
    assert result.returncode == 0 and f"cut to 60 of its {read} tokens" in page
    assert page.count('class="word"') == len(written["words"])
