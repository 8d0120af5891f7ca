"""Accessibility of every HTML page bertforge writes or serves: axe-core's checks (WCAG 2.1 A and AA, and its best
practices) in a real headless Chromium, and what axe cannot check: the keyboard reaches and works every control, and
what the pages draw (attention lines, thumbnails, the neuron view, attribution colours) has a text form too.

axe-core is one JavaScript file: `make browser` fetches the pinned release from the npm registry into
build/axe-core/ (AXE_CORE_JS may name another copy); without it these tests skip.
"""

from __future__ import annotations

import json
import os
import re
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
    from selenium.webdriver.common.by import By

    browser.get(pages["attention"].as_uri())
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 320, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    try:
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        # So does the list of each head's strongest link, which a focused token shows in 'all heads' mode.
        browser.execute_script("document.querySelector('#labels text.left[data-index=\"3\"]').focus()")
        assert browser.find_element(By.ID, "head-links").is_displayed()
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        # And so do a thumbnail's words under the model grid, and the neuron view's table.
        browser.execute_script("document.querySelectorAll('#model-grid button')[5].focus()")
        assert browser.find_element(By.ID, "model-status").text.startswith("layer 0, head 5: strongest")
        assert browser.find_element(By.ID, "neuron-table").is_displayed()
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def page_data_of(path: Path) -> dict:
    """The weights and tokens a page embeds, read from its file (not from the page's script)."""
    found = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>',
                      path.read_text(encoding="utf-8"), re.S)
    return json.loads(found.group(1))


@pytest.mark.parametrize("name", ["attention", "attention_dark"])
def test_segment_b_is_told_apart_without_colour(browser, axe_core, pages, tokenizer, name):
    """WCAG 1.4.1: segment B's tokens are not told from segment A's by colour alone. They are in italics, below a
    dashed rule that a visible key explains, and each token's accessible name says its segment."""
    from selenium.webdriver.common.by import By

    start = tokenizer(TEXT, PAIR)["token_type_ids"].index(1)
    browser.get(pages[name].as_uri())
    labels = browser.find_elements(By.CSS_SELECTOR, "#labels text.left") + browser.find_elements(
        By.CSS_SELECTOR, "#labels text.right")
    looks = browser.execute_script(
        "return Array.from(document.querySelectorAll('#labels text'), t => { const s = getComputedStyle(t);"
        " return [s.fontStyle, s.textDecorationLine, s.fontWeight].join(' '); })")
    half = len(labels) // 2
    for side in (range(half), range(half, len(labels))):
        segment_a = {looks[k] for k in side if k - side.start < start}
        segment_b = {looks[k] for k in side if k - side.start >= start}
        assert len(segment_a) == len(segment_b) == 1 and segment_a != segment_b
    for k, label in enumerate(labels):
        segment = "B" if k % half >= start else "A"
        assert label.accessible_name == f"{label.text}, segment {segment}"
    # The rule lies between the last token of A and the first of B, in both columns.
    rules = browser.execute_script(
        "return Array.from(document.querySelectorAll('#view line.segment-rule'), l => Number(l.getAttribute('y1')))")
    middles = [float(labels[k].get_attribute("y")) for k in (start - 1, start)]
    assert rules == [sum(middles) / 2] * 2
    key = browser.find_element(By.ID, "segment-key")
    assert key.is_displayed() and "segment B" in key.text and "italics" in key.text
    assert axe_violations(browser, axe_core) == []


def test_all_heads_mode_says_each_heads_strongest_link(browser, axe_core, pages):
    """WCAG 1.4.1: in 'all heads' mode a line's colour alone says its head. A focused token's status line, and a
    visible list, give each shown head's strongest link in words; checked against the weights the page embeds."""
    from selenium.webdriver.common.by import By

    data = page_data_of(pages["attention_dark"])
    tokens, layer = data["tokens"], data["start_layer"]
    browser.get(pages["attention_dark"].as_uri())
    status, listing = browser.find_element(By.ID, "head-status"), browser.find_element(By.ID, "head-links")
    swatches = browser.find_elements(By.CSS_SELECTOR, "#legend .swatch")
    assert [swatch.accessible_name for swatch in swatches] == [f"head {name}" for name in data["head_names"]]
    assert not listing.is_displayed()

    def said(text: str) -> list[tuple[str, float, str, str]]:
        """(head, weight, 'to' or 'from', token) for each head named in `text`; a head with no link: weight 0."""
        return [(head, float(weight or 0), direction, token) for head, weight, direction, token in re.findall(
            r"head (\w+): (?:([\d.]+) (to|from) \u201c(.*?)\u201d|none)", text)]

    def check(side: str, index: int, hidden: set[int]) -> None:
        browser.execute_script(f"document.querySelector('#labels text.{side}[data-index=\"{index}\"]').focus()")
        expected = []
        for h, name in enumerate(data["head_names"]):
            if h in hidden:
                continue
            if side == "left":  # the token's own row: [attended, weight, ...]
                row = data["attention"][layer][h][index]
                links = list(zip(row[0::2], row[1::2]))
            else:  # every row's weight for the token
                links = [(i, w) for i, row in enumerate(data["attention"][layer][h])
                         for j, w in zip(row[0::2], row[1::2]) if j == index]
            best = max((w for _, w in links), default=0)  # weights under MIN_WEIGHT are not in the page
            expected.append((str(name), best, {tokens[k] for k, w in links if w == best}))
        found = said(status.get_attribute("textContent"))  # all of it: a screen reader reads past the ellipsis
        assert [head for head, *_ in found] == [head for head, *_ in expected]
        for (_, weight, direction, token), (_, best, strongest) in zip(found, expected):
            assert abs(weight - best) <= 0.005 + 1e-9
            if best:
                assert token in strongest and direction == ("to" if side == "left" else "from")
        # The list shows the same, one head a line (the status line shows one line and cuts the rest).
        items = listing.find_elements(By.TAG_NAME, "li")
        assert listing.is_displayed() and [said(item.text)[0] for item in items] == found

    check("left", 3, set())
    check("right", 2, set())
    browser.execute_script("document.querySelector('#legend .swatch[data-head=\"1\"]').click()")
    check("left", 10, {1})
    assert axe_violations(browser, axe_core) == []
    # One head selected: its lines are one colour and the status line says that head's weights, as before.
    browser.execute_script("const s = document.getElementById('head'); s.value = '2';"
                           "s.dispatchEvent(new Event('change'))")
    browser.execute_script("document.querySelector('#labels text.left[data-index=\"3\"]').focus()")
    assert "per head" not in status.text and status.text and not listing.is_displayed()


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


def described(driver) -> dict[str, str]:
    """Each named button's accessible description, as Chromium computes it for a screen reader, by its name."""
    nodes = driver.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
    return {node["name"]["value"]: node.get("description", {}).get("value", "") for node in nodes
            if node.get("role", {}).get("value") == "button" and node.get("name", {}).get("value")}


@pytest.mark.parametrize("name", ["attention", "model_view"])
def test_the_model_views_thumbnails_say_what_they_show(browser, axe_core, pages, name):
    """WCAG 1.1.1: a thumbnail is a heatmap. Its description says its two strongest links and how much of a token's
    weight goes, on average, to [CLS] and [SEP], to the token before and to itself; checked against the weights the
    page embeds. A focused (or hovered) thumbnail shows the same words under the grid."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    data = page_data_of(pages[name])
    tokens, n = data["tokens"], len(data["tokens"])
    browser.get(pages[name].as_uri())
    descriptions = described(browser)
    said = re.compile(r"strongest \u201c(.*?)\u201d \u2192 \u201c(.*?)\u201d ([\d.]+), \u201c(.*?)\u201d \u2192 "
                      r"\u201c(.*?)\u201d ([\d.]+); a token's weight on average: ([\d.]+) on \[CLS\] and \[SEP\], "
                      r"([\d.]+) on the token before, ([\d.]+) on itself")
    for layer, layer_name in enumerate(data["layer_names"]):
        for head, head_name in enumerate(data["head_names"]):
            found = said.fullmatch(descriptions[f"layer {layer_name}, head {head_name}"])
            assert found, descriptions[f"layer {layer_name}, head {head_name}"]
            links = [(w, tokens[i], tokens[j]) for i, row in enumerate(data["attention"][layer][head])
                     for j, w in zip(row[0::2], row[1::2])]
            ranked = sorted((w for w, _, _ in links), reverse=True)
            for rank, (source, target, weight) in enumerate((found.group(1, 2, 3), found.group(4, 5, 6))):
                assert abs(float(weight) - ranked[rank]) <= 0.005 + 1e-9
                assert (source, target) in {(a, b) for w, a, b in links if w == ranked[rank]}
            links = [(w, i, j) for i, row in enumerate(data["attention"][layer][head])
                     for j, w in zip(row[0::2], row[1::2])]
            shares = (sum(w for w, _, j in links if tokens[j] in ("[CLS]", "[SEP]")) / n,
                      sum(w for w, i, j in links if j == i - 1) / n, sum(w for w, i, j in links if j == i) / n)
            for shown, share in zip(found.group(7, 8, 9), shares):
                assert abs(float(shown) - share) <= 0.005 + 1e-9
    if "head" in data["views"]:  # the head view's grid shows the current layer's thumbnails: their words too
        layer = data["layer_names"][data["start_layer"]]
        assert [descriptions[f"head {head}"] for head in data["head_names"]] == [
            descriptions[f"layer {layer}, head {head}"] for head in data["head_names"]]
    # The keyboard: one Tab stop, the arrow keys move, the thumbnail's words show under the grid, Enter opens it.
    status = browser.find_element(By.ID, "model-status")
    first = f"layer {data['layer_names'][0]}, head {data['head_names'][0]}"
    assert tab_to(browser, lambda focused: focused["label"] == first)["pressed"] == "false"
    second = f"layer {data['layer_names'][1]}, head {data['head_names'][0]}"
    assert press(browser, Keys.ARROW_DOWN)["label"] == second
    assert status.text == f"{second}: {descriptions[second]}"
    assert press(browser, Keys.ENTER)["pressed"] == "true"
    assert browser.find_element(By.ID, "model-detail-caption").text == second
    # The thumbnail last used stays the grid's Tab stop, also after a click.
    browser.find_elements(By.CSS_SELECTOR, "#model-grid button")[2].click()
    assert browser.execute_script("return Array.from(document.querySelectorAll('#model-grid button'),"
                                  " b => b.tabIndex).filter(t => t === 0).length") == 1
    assert browser.execute_script("return document.querySelectorAll('#model-grid button')[2].tabIndex") == 0
    assert axe_violations(browser, axe_core) == []


def unpacked(packed: dict) -> torch.Tensor:
    """The page's 8-bit queries or keys as float64: value * scale, as the page stores them."""
    import base64

    values = torch.frombuffer(bytearray(base64.b64decode(packed["values"])), dtype=torch.int8)
    scales = torch.frombuffer(bytearray(base64.b64decode(packed["scales"])), dtype=torch.float32)
    return (values.double().reshape(packed["shape"]) * scales.double().reshape(packed["shape"][:3])[..., None])


@pytest.mark.parametrize("name", ["neuron_view", "attention_dark"])
def test_the_neuron_view_has_a_text_form(browser, axe_core, pages, name):
    """WCAG 1.1.1: the neuron view's cells and bars are a picture. A table gives the chosen query's keys of the
    largest weight, each with its weight (the page's stored weight), its score q.k/sqrt(d) and the dimensions whose
    terms add most to that score; checked against the page's embedded weights and its queries and keys."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    data = page_data_of(pages[name])
    tokens = data["tokens"]
    queries, keys = unpacked(data["queries"]), unpacked(data["keys"])
    browser.get(pages[name].as_uri())
    table = browser.find_element(By.ID, "neuron-table")
    for token in (0, 4, len(tokens) - 1):
        Select(browser.find_element(By.ID, "neuron-token")).select_by_value(str(token))
        layer = int(Select(browser.find_element(By.ID, "neuron-layer")).first_selected_option.get_attribute("value"))
        head = int(Select(browser.find_element(By.ID, "neuron-head")).first_selected_option.get_attribute("value"))
        assert table.is_displayed() and f"\u201c{tokens[token]}\u201d (token {token})" in table.find_element(
            By.TAG_NAME, "caption").text
        row = data["attention"][layer][head][token]
        stored = dict(zip(row[0::2], row[1::2]))
        ranked = sorted(stored.values(), reverse=True)
        rows = [[cell.text for cell in tr.find_elements(By.TAG_NAME, "td")]
                for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
        assert len(rows) == min(5, len(tokens))
        q, d = queries[layer, head, token], queries.shape[-1]
        for rank, (key, weight, score, terms) in enumerate(rows[:len(ranked)]):
            index, text = key.split(": ", 1)
            j = int(index)
            assert text == tokens[j] and abs(float(weight) - stored[j]) <= 0.005 + 1e-9
            assert abs(stored[j] - ranked[rank]) < 1e-9  # in order of weight
            product = q * keys[layer, head, j] / d ** 0.5
            assert abs(float(score) - float(product.sum())) <= 0.005 + 1e-6
            largest = product.abs().argsort(descending=True)[:3].tolist()
            assert terms == ", ".join(f"{c}: {'-' if product[c] < 0 else '+'}{abs(float(product[c])):.2f}"
                                      for c in largest)
    assert axe_violations(browser, axe_core) == []


SPOKEN_ITEMS = 24  # the page's limit on the items a picture's accessible name lists


def test_a_long_pages_pictures_have_names_of_bounded_length(browser, axe_core, minilm, tokenizer, squad_contexts,
                                                            tmp_path):
    """A screen reader reads an accessible name whole at every visit: past SPOKEN_ITEMS tokens, the opened head's and
    the neuron view's names list the links or keys of the largest weight and sum up the others, checked against the
    weights the page embeds (a short page's names list every token: the keyboard test above)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page = tmp_path / "long.html"
    page.write_text(render_attention_map(compute_attention(minilm, tokenizer, squad_contexts[0])), encoding="utf-8")
    data = page_data_of(page)
    tokens, n = data["tokens"], len(data["tokens"])
    assert n > 4 * SPOKEN_ITEMS
    browser.get(page.as_uri())
    heads = len(data["head_names"])

    # The opened head: each token's strongest link, the SPOKEN_ITEMS strongest of them in order of weight.
    browser.execute_script(f"document.querySelectorAll('#model-grid button')[{heads + 3}].click()")
    label = browser.find_element(By.CSS_SELECTOR, "#model-detail canvas").get_attribute("aria-label")
    strongest = []
    for i, row in enumerate(data["attention"][1][3]):
        pairs = list(zip(row[0::2], row[1::2]))
        best = max((w for _, w in pairs), default=0)
        strongest.append((best, i, {tokens[j] for j, w in pairs if w == best}))
    ranked = sorted(strongest, key=lambda link: -link[0])
    named = re.findall(r"(?:: |, )(\S+) \u2192 (\S+) (\d\.\d\d)", label)
    assert label.startswith(f"layer 1, head 3; the {SPOKEN_ITEMS} tokens of the strongest links") and \
        f" of {n}: " in label and len(named) == SPOKEN_ITEMS
    cut = ranked[SPOKEN_ITEMS - 1][0]  # the weakest link named
    for (token, attended, weight), (best, _, _) in zip(named, ranked):
        assert abs(float(weight) - best) <= 0.005 + 1e-9  # in order of weight
        # The link named: a token's strongest, of that weight (links of equal weight may swap places).
        assert any(token == tokens[i] and attended in targets for best, i, targets in strongest
                   if abs(best - float(weight)) <= 0.005 + 1e-9)
    rest = max(best for best, _, _ in ranked[SPOKEN_ITEMS:])
    assert rest <= cut and label.endswith(f"; the other {n - SPOKEN_ITEMS} tokens' strongest links weigh "
                                          f"{rest:.2f} or less")

    # The neuron view: the query's keys of the largest weight (weights from the page's queries and keys; the page's
    # stored weight where it has one) and what the other keys weigh together.
    queries, keys = unpacked(data["queries"]), unpacked(data["keys"])
    for token in (0, n // 2):
        Select(browser.find_element(By.ID, "neuron-token")).select_by_value(str(token))
        layer = int(Select(browser.find_element(By.ID, "neuron-layer")).first_selected_option.get_attribute("value"))
        head = int(Select(browser.find_element(By.ID, "neuron-head")).first_selected_option.get_attribute("value"))
        scores = keys[layer, head] @ queries[layer, head, token] / queries.shape[-1] ** 0.5
        weights = scores.softmax(0)
        row = data["attention"][layer][head][token]
        for j, w in zip(row[0::2], row[1::2]):
            weights[j] = w
        label = browser.find_element(By.ID, "neuron").get_attribute("aria-label")
        named = re.findall(r"(?:: |, )(\S+) (-?\d+\.\d\d) (\d\.\d\d)(?=, |; )", label)
        assert label.startswith(f"layer {data['layer_names'][layer]}, head {data['head_names'][head]}, query of "
                                f"{tokens[token]}; the {SPOKEN_ITEMS} keys of the largest weight") and \
            len(named) == SPOKEN_ITEMS
        order = weights.argsort(descending=True, stable=True).tolist()
        for (text, score, weight), j in zip(named, order):
            assert abs(float(weight) - float(weights[j])) <= 0.005 + 1e-6  # in order of weight
            # The key named: a token of that weight and score (keys of near-equal weight may swap places).
            assert any(tokens[k] == text and abs(float(weights[k]) - float(weight)) <= 0.005 + 1e-6
                       and abs(float(scores[k]) - float(score)) <= 0.005 + 1e-6 for k in range(n))
        other = float(weights[order[SPOKEN_ITEMS:]].sum())
        found = re.search(rf"; the other {n - SPOKEN_ITEMS} keys weigh (\d\.\d\d) together$", label)
        assert found and abs(float(found.group(1)) - other) <= 0.01
        assert len(label) < 1200
    assert axe_violations(browser, axe_core) == []


def test_a_long_explanation_page_is_bounded_and_scrolls_from_the_keyboard(browser, axe_core, minilm, tokenizer,
                                                                         squad_contexts, tmp_path):
    """Two Wikipedia paragraphs: the attributions cover every token explained, the attention views the first
    DEFAULT_MAX_TOKENS, as the attention viewer's page (it grows with their square), and the page says so; the boxes
    that scroll take the keyboard's focus (axe: scrollable-region-focusable)."""
    from bertforge.inference.attention_view import DEFAULT_MAX_TOKENS

    text, pair = squad_contexts[0], squad_contexts[1]
    torch.manual_seed(0)
    masked_lm = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37)).eval()
    masked = text.replace(" the ", " [MASK] ", 1)
    for name, model, explanation in (
            ("similarity", minilm, explain(minilm, tokenizer, text, text_pair=pair, method="saliency")),
            ("masked", masked_lm, explain(masked_lm, tokenizer, masked, method="saliency"))):
        read = len(tokenizer(explanation.texts[0], truncation=True, max_length=512)["input_ids"])
        assert read > DEFAULT_MAX_TOKENS
        assert len(explanation.tokens) >= read  # the attributions: every token explained
        page = tmp_path / f"{name}.html"
        page.write_text(explanation_page(model, tokenizer, explanation), encoding="utf-8")
        assert len(page_data_of(page)["tokens"]) == DEFAULT_MAX_TOKENS
        # In the browser, views of fewer tokens: axe takes minutes over the 128-token head view's 38,000 lines.
        page.write_text(explanation_page(model, tokenizer, explanation, attention_max_length=24), encoding="utf-8")
        assert len(page_data_of(page)["tokens"]) == 24
        browser.get(page.as_uri())
        assert browser.find_element("id", "attention-cut").text.startswith(
            f"The attention views below read the input cut to 24 of its {read} tokens")
        assert axe_violations(browser, axe_core) == []
    # A text within the bound: every token in the views, and no such line.
    short = explanation_page(minilm, tokenizer, explain(minilm, tokenizer, TEXT, text_pair=PAIR, method="saliency"))
    assert 'id="attention-cut"' not in short
