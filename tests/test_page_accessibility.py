"""Accessibility of every HTML page bertforge writes or serves: axe-core's checks (WCAG 2.1 A and AA, and its best
practices) in a real headless Chromium, and what axe cannot check: the keyboard reaches and works every control, and
what the pages draw (attention lines, thumbnails, the neuron view, attribution colours) has a text form too.

axe-core is one JavaScript file: `make browser` fetches the pinned release from the npm registry into
build/axe-core/ (AXE_CORE_JS may name another copy); without it these tests skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig
from bertforge.explain import explain
from bertforge.explain.page import explanation_page
from bertforge.inference.attention_view import (
    PageLayout,
    compute_attention,
    head_view,
    model_view,
    neuron_view,
    render_attention_map,
)
from bertforge.pretraining import BertForMaskedLM

ROOT = Path(__file__).resolve().parent.parent
AXE_PLACES = (ROOT / "build/axe-core/axe.min.js", ROOT / "node_modules/axe-core/axe.min.js")
# The rules the pages are held to: WCAG 2.0 and 2.1, levels A and AA, and axe's best practices.
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
TEXT, PAIR = "The cat sat on the mat.", "It was tired."


@pytest.fixture(scope="module")
def axe_core() -> str:
    named = os.environ.get("AXE_CORE_JS")
    for place in ([Path(named)] if named else []) + list(AXE_PLACES):
        if place.is_file():
            return place.read_text(encoding="utf-8")
    pytest.skip("needs axe-core's axe.min.js: `make browser` fetches it into build/axe-core/, or set AXE_CORE_JS")


@pytest.fixture(scope="module")
def pages(tmp_path_factory, minilm, tokenizer) -> dict[str, Path]:
    """Every page, rendered from the default model as the commands, the bertviz calls and the server render them."""
    from bertforge.inference.serve.app import create_app
    from bertforge.inference.serve.docs import render_docs

    inputs = tokenizer(TEXT, PAIR, return_tensors="pt")
    with torch.inference_mode():
        attentions = minilm(**inputs, output_attentions=True).attentions
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    attention = compute_attention(minilm, tokenizer, TEXT, PAIR)
    torch.manual_seed(0)  # a small untrained masked-LM model: its page adds the tables of each layer's guess
    masked_lm = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37)).eval()
    html = {
        "attention": render_attention_map(attention, TEXT),  # `bertforge attention` and the server's /attention
        "attention_dark": render_attention_map(attention, TEXT, layout=PageLayout(dark=True)),
        "head_view": head_view(attentions, tokens, sentence_b_start=9, layer=2, heads=[0, 3],
                               html_action="return").data,
        "model_view": model_view(attentions, tokens, sentence_b_start=9, html_action="return").data,  # dark
        "neuron_view": neuron_view(minilm, tokenizer, TEXT, PAIR, layer=2, head=0, html_action="return").data,
        "explanation": explanation_page(minilm, tokenizer, explain(minilm, tokenizer, TEXT, text_pair=PAIR)),
        "masked_lm_explanation": explanation_page(masked_lm, tokenizer, explain(
            masked_lm, tokenizer, "The cat [MASK] on the mat.", method="gradient_x_input")),
        "docs": render_docs(create_app(minilm, tokenizer).openapi()),  # the server's /docs
    }
    folder = tmp_path_factory.mktemp("pages")
    for name, page in html.items():
        (folder / f"{name}.html").write_text(page, encoding="utf-8")
    return {name: folder / f"{name}.html" for name in html}


def axe_violations(driver, axe_source: str) -> list[str]:
    """axe-core's violations on the page as drawn now, one line each: rule, impact and the elements."""
    driver.set_script_timeout(120)
    driver.execute_script(axe_source)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: arguments[0]}}).then(done, e => done({error: String(e)}));",
        AXE_TAGS)
    assert "error" not in result, result
    return [f"{v['id']} ({v['impact']}): {[node['target'] for node in v['nodes']][:5]}" for v in result["violations"]]


@pytest.mark.parametrize("name", ["attention", "attention_dark", "head_view", "model_view", "neuron_view",
                                  "explanation", "masked_lm_explanation", "docs"])
def test_axe_finds_no_violations(browser, axe_core, pages, name):
    browser.get(pages[name].as_uri())
    assert browser.execute_script("return document.documentElement.lang") == "en" and browser.title
    assert axe_violations(browser, axe_core) == []


# ---------------------------------------------------------------- what axe cannot check


def press(driver, *keys) -> dict:
    """Send keys to the focused element; what has the focus then (tag, classes, data attributes, ARIA state)."""
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(*keys).perform()
    return driver.execute_script(
        "const e = document.activeElement; return {tag: e.tagName.toLowerCase(), cls: e.getAttribute('class') || '',"
        " head: e.dataset.head, index: e.dataset.index, pressed: e.getAttribute('aria-pressed'),"
        " label: e.getAttribute('aria-label') || e.textContent, outline: getComputedStyle(e).outlineStyle,"
        " weight: getComputedStyle(e).fontWeight}")


def tab_to(driver, match) -> dict:
    """Tab from where the focus is until `match(focused)`; fails if the page's Tab order never gets there."""
    from selenium.webdriver.common.keys import Keys

    for _ in range(40):
        focused = press(driver, Keys.TAB)
        if match(focused):
            return focused
    raise AssertionError("Tab never reached the control")


def drawn(driver, attribute: str) -> set[str]:
    return set(driver.execute_script(
        f"return Array.from(document.querySelectorAll('#lines line'), l => l.dataset.{attribute})"))


def test_every_control_of_the_attention_page_works_from_the_keyboard(browser, axe_core, pages):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    browser.get(pages["attention"].as_uri())
    heads = len(browser.find_elements(By.CSS_SELECTOR, "#legend .swatch"))
    # The legend: one Tab stop, the arrow keys move along it, Space shows or hides a head (and says which).
    swatch = tab_to(browser, lambda focused: "swatch" in focused["cls"])
    assert swatch["head"] == "0" and swatch["pressed"] == "true" and swatch["outline"] != "none"
    assert press(browser, Keys.SPACE)["pressed"] == "false" and drawn(browser, "head") == {
        str(h) for h in range(1, heads)}
    assert press(browser, Keys.ARROW_RIGHT)["head"] == "1"
    press(browser, Keys.ARROW_LEFT), press(browser, Keys.SPACE)
    assert drawn(browser, "head") == {str(h) for h in range(heads)}
    # A token: focus shows its attention, as hovering does, and says its largest weights in words.
    token = press(browser, Keys.TAB)
    assert "token left" in token["cls"] and token["index"] == "0" and int(token["weight"]) >= 700
    assert drawn(browser, "from") == {"0"}
    status = browser.find_element(By.ID, "head-status")
    assert status.get_attribute("aria-live") == "polite" and status.text.startswith("\u201c[CLS]\u201d attends to ")
    assert press(browser, Keys.ARROW_DOWN)["index"] == "1" and drawn(browser, "from") == {"1"}
    assert press(browser, Keys.TAB)["cls"] == "token right" and drawn(browser, "to") == {"0"}
    assert "is attended by" in status.text
    # The head grid: Enter selects a head, in the head view's select too.
    cell = press(browser, Keys.TAB)
    assert "cell" in cell["cls"] and cell["label"] == "head 0" and status.text == "" and len(drawn(browser, "head")) > 1
    press(browser, Keys.ARROW_RIGHT)
    assert press(browser, Keys.ENTER)["pressed"] == "true" and drawn(browser, "head") == {"1"}
    assert Select(browser.find_element(By.ID, "head")).first_selected_option.get_attribute("value") == "1"
    # The model grid: one Tab stop; down a layer, Enter opens the head, whose weights the detail says in words.
    assert press(browser, Keys.TAB)["label"] == "layer 0, head 0"
    assert press(browser, Keys.ARROW_DOWN)["label"] == "layer 1, head 0"
    press(browser, Keys.ENTER)
    detail = browser.find_element(By.CSS_SELECTOR, "#model-detail canvas")
    assert browser.find_element(By.ID, "model-detail-caption").text == "layer 1, head 0"
    assert detail.get_attribute("role") == "img" and "[CLS] \u2192 " in detail.get_attribute("aria-label")
    # The neuron view's canvas says every token's score and weight.
    neuron = browser.find_element(By.ID, "neuron")
    tokens = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#labels text.left")]
    assert neuron.get_attribute("role") == "img" and all(t in neuron.get_attribute("aria-label") for t in tokens)
    # Still no violation with a head opened, a head hidden and a token focused.
    browser.execute_script("document.querySelector('#legend .swatch[data-head=\"2\"]').click();"
                           "document.querySelector('#labels text.left[data-index=\"3\"]').focus()")
    assert axe_violations(browser, axe_core) == []


def test_the_attention_page_reflows_to_a_narrow_window(browser, pages):
    """At 320 CSS pixels (a 1280-pixel window at 400% zoom) the page scrolls down, not sideways: the drawings
    scroll inside their own boxes."""
    browser.get(pages["attention"].as_uri())
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 320, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    try:
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_attributions_have_a_text_form(browser, pages):
    """Green for, red against is colour alone; the table gives each word's attribution with its sign."""
    from selenium.webdriver.common.by import By

    browser.get(pages["explanation"].as_uri())
    words = browser.find_elements(By.CSS_SELECTOR, "#explanation .word")
    browser.find_element(By.CSS_SELECTOR, "#explanation details summary").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "table.attributions tr")[1:]
    assert len(rows) == len(words) > 0
    for word, row in zip(words, rows):
        _, text, value = (cell.text for cell in row.find_elements(By.TAG_NAME, "td"))
        assert text == word.text and value == word.get_attribute("title") and value[0] in "+-"
