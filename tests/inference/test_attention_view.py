"""The attention viewer: the page's data, and its behaviour in a real headless Chromium (offline, file://)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import threading

import pytest
import torch

from bertforge import BertConfig, BertModel
from bertforge.errors import BertforgeError, InputError
from bertforge.inference.attention_view import (
    MIN_WEIGHT,
    compute_attention,
    head_view,
    model_view,
    neuron_view,
    render_attention_html,
    render_attention_map,
)


def page_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)
    return json.loads(match.group(1))


def dense_attention(data: dict) -> torch.Tensor:
    """The page's stored rows ([attended, weight, ...] per attending token) back as (layers, heads, seq, seq)."""
    seq = len(data["tokens"])
    weights = torch.zeros(data["layers"], data["heads"], seq, seq, dtype=torch.float64)
    for layer, heads in enumerate(data["attention"]):
        for head, rows in enumerate(heads):
            for i, row in enumerate(rows):
                for j, weight in zip(row[::2], row[1::2]):
                    weights[layer, head, i, j] = weight
    return weights


def visible(weights: torch.Tensor) -> torch.Tensor:
    """What the page keeps of weights: the ones of at least MIN_WEIGHT (after rounding), the rest 0."""
    weights = weights.double()
    return torch.where(weights.round(decimals=4) >= MIN_WEIGHT, weights, torch.zeros_like(weights))


def test_page_embeds_tokens_and_weights_of_every_layer_and_head():
    weights = torch.rand(2, 3, 5, 5).mul(4).softmax(-1)
    page = render_attention_html(["[CLS]", "a", "[SEP]"], ["b", "[SEP]"], weights)
    data = page_data(page)
    assert data["tokens"] == ["[CLS]", "a", "[SEP]", "b", "[SEP]"] and data["segment_b_start"] == 3
    assert torch.allclose(dense_attention(data), visible(weights), atol=1e-4)


def test_faint_weights_are_left_out_so_long_inputs_stay_small():
    seq = 400
    weights = torch.full((1, 2, seq, seq), 1 / seq)  # uniform: every weight far below MIN_WEIGHT
    weights[0, 0, :, 0] += 0.5  # except one column
    page = render_attention_html(["[CLS]"] + ["w"] * (seq - 2) + ["[SEP]"], [], weights / weights.sum(-1, True))
    assert len(page) < 200_000
    stored = dense_attention(page_data(page))
    assert (stored[0, 0, :, 0] > 0.3).all() and stored[0, 0, :, 1:].abs().sum() == 0 and stored[0, 1].sum() == 0


def test_page_is_self_contained_and_escapes_hostile_tokens():
    hostile = "</script><img src=x onerror=alert(1)>"
    page = render_attention_html(["[CLS]", hostile, "__DATA__", "[SEP]"], [], torch.full((1, 1, 4, 4), 0.25),
                                 title=hostile)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<img" not in page and page.count("</script>") == 2
    assert page_data(page)["tokens"][1:3] == [hostile, "__DATA__"]


def test_model_outputs_render_directly(tokenizer, tiny_config):
    model = BertModel(BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})).eval()
    attention = compute_attention(model, tokenizer, "The cat sat.", "It slept.")
    assert attention.tokens_a == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert attention.tokens_b == ["it", "slept", ".", "[SEP]"]
    assert attention.attentions.shape == (2, 4, 10, 10)
    assert torch.allclose(attention.attentions.sum(-1), torch.ones(2, 4, 10))
    assert page_data(render_attention_map(attention))["segment_b_start"] == 6



def test_attention_computed_by_another_thread_meanwhile_is_each_texts_own(tokenizer, tiny_config):
    """A web app's threads share one model: each text's weights, queries and keys are the ones it gets alone, though
    another thread computes another text's on the model meanwhile. Deterministic: the other thread runs (waited
    for) inside this thread's forward pass, in its last layer, while this thread's hooks on the query and key
    projections are on the shared model. Found by 4 threads' compute_attention: every call failed or mismatched."""
    model = BertModel(BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})).eval()
    first, second = "The cat sat.", "It slept on the warm mat all day."
    alone = [compute_attention(model, tokenizer, text) for text in (first, second)]
    this_thread, meanwhile = threading.get_ident(), []

    def attend_elsewhere(module, inputs):
        if threading.get_ident() == this_thread and not meanwhile:
            meanwhile.append(other_thread.submit(compute_attention, model, tokenizer, second))
            concurrent.futures.wait(meanwhile)

    with concurrent.futures.ThreadPoolExecutor(1) as other_thread:
        handle = model.encoder.layers[-1].register_forward_pre_hook(attend_elsewhere)
        try:
            during = compute_attention(model, tokenizer, first)
        finally:
            handle.remove()
    for got, expected in ((during, alone[0]), (meanwhile[0].result(), alone[1])):
        assert got.tokens_a == expected.tokens_a
        for name in ("attentions", "queries", "keys"):
            assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_the_models_own_attention_tuple_renders(tokenizer, tiny_config):
    model = BertModel(BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})).eval()
    encoding = tokenizer("A cat.", return_tensors="pt")
    with torch.inference_mode():
        output = model(**encoding, output_attentions=True)  # a tuple of (1, heads, seq, seq), one per layer
    page = render_attention_html(tokenizer.convert_ids_to_tokens(encoding["input_ids"][0]), [], output.attentions)
    weights = dense_attention(page_data(page))
    expected = visible(torch.stack(output.attentions)[:, 0])
    assert weights.shape == (2, 4, 5, 5) and torch.allclose(weights, expected, atol=1e-4)
    assert re.search(r"\d\.\d{5}", page.split('id="attention-data">')[1]) is None  # 4 decimals, not float32 noise


def test_wrong_shapes_and_long_texts_are_user_errors(tokenizer, tiny_config):
    with pytest.raises(InputError, match=r"\(layers, heads, 3, 3\)"):
        render_attention_html(["[CLS]", "a", "[SEP]"], [], torch.rand(2, 3, 4, 4))
    model = BertModel(BertConfig(**{**tiny_config.__dict__, "vocab_size": tokenizer.vocab_size})).eval()
    with pytest.raises(InputError, match="the limit is 5"):
        compute_attention(model, tokenizer, "one two three four five six", max_length=5, truncate=False)
    assert len(compute_attention(model, tokenizer, "one two three four five six", max_length=5).tokens_a) == 5
    # a max_length that cuts a text away entirely would draw [CLS] and [SEP] alone (an unknown word still counts)
    for text, pair, max_length, name in (("hello", "world", 3, "text"), ("hello", None, 2, "text"),
                                         ("hello there", "world", 4, "pair")):
        with pytest.raises(InputError, match=f"^max_length {max_length} keeps no token of the {name}"):
            compute_attention(model, tokenizer, text, pair, max_length=max_length)
    assert compute_attention(model, tokenizer, "\u2603 \u2603 \u2603", max_length=3).tokens_a[1] == "[UNK]"
    with pytest.raises(InputError, match="^the pair is empty after tokenization"):  # no max_length would help
        compute_attention(model, tokenizer, "hello", "\u200b\x1b", max_length=3)


# ---------------------------------------------------------------- in the browser (tests/conftest.py's browser)


def line_opacities(driver) -> list[float]:
    return sorted(driver.execute_script(
        "return Array.from(document.querySelectorAll('#lines line'), l => Number(l.getAttribute('stroke-opacity')))"))


def drawn(driver, attribute: str) -> set[str]:
    """The distinct values of a data attribute over the drawn lines (e.g. which heads, which attending tokens)."""
    return set(driver.execute_script(
        f"return Array.from(document.querySelectorAll('#lines line'), l => l.dataset.{attribute})"))


def highlighted(driver, side: str) -> list[float]:
    """Highlight strength of each token box on one side (left boxes come first in the page)."""
    values = driver.execute_script(
        "return Array.from(document.querySelectorAll('#highlights rect'), r => Number(r.getAttribute('fill-opacity')))")
    half = len(values) // 2
    return values[:half] if side == "left" else values[half:]


def test_viewer_in_headless_chromium(browser, tmp_path, minilm, tokenizer):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # Real weights: the default model's attention, so heads and layers genuinely differ.
    attention = compute_attention(minilm, tokenizer, "The cat sat on the mat.", "It was tired.")
    path = tmp_path / "view.html"
    page = render_attention_map(attention, title="The cat sat on the mat.")
    path.write_text(page, encoding="utf-8")
    weights = dense_attention(page_data(page)).tolist()  # as the page holds them (rounded, faint ones left out)

    browser.get(path.as_uri())
    assert browser.title == "The cat sat on the mat."
    assert browser.execute_script("return window.performance.getEntriesByType('resource').length") == 0
    tokens = [element.text for element in browser.find_elements(By.CSS_SELECTOR, "#labels text.left")]
    assert tokens == attention.tokens_a + attention.tokens_b
    layers, heads = len(Select(browser.find_element(By.ID, "layer")).options), len(
        Select(browser.find_element(By.ID, "head")).options) - 1
    assert (layers, heads) == attention.attentions.shape[:2]

    # "all heads" is the starting mode: lines in several head colours, and a grid of one small view per head.
    assert drawn(browser, "head") == {str(h) for h in range(heads)}
    assert len(browser.find_elements(By.CSS_SELECTOR, "#grid canvas")) == heads
    browser.save_screenshot(str(tmp_path / "all_heads.png"))

    head, layer = Select(browser.find_element(By.ID, "head")), Select(browser.find_element(By.ID, "layer"))
    head.select_by_value("0")
    single = line_opacities(browser)
    assert drawn(browser, "head") == {"0"}
    expected = sorted(w for row in weights[0][0] for w in row if w >= 0.01)
    assert len(single) == len(expected) and max(abs(a - b) for a, b in zip(single, expected)) <= 1e-3
    head.select_by_value("3")
    assert line_opacities(browser) != single
    layer.select_by_value("4")
    assert line_opacities(browser) != single
    layer.select_by_value("0")
    head.select_by_value("0")
    assert line_opacities(browser) == single

    # Hovering an attending token keeps only its lines and highlights what it attends to.
    assert max(highlighted(browser, "right")) == 0
    token = browser.find_elements(By.CSS_SELECTOR, "#labels text.left")[2]
    ActionChains(browser).move_to_element(token).perform()
    assert drawn(browser, "from") == {"2"}
    right = highlighted(browser, "right")
    strongest = max(range(len(right)), key=weights[0][0][2].__getitem__)
    assert max(right) > 0 and right.index(max(right)) == strongest
    browser.save_screenshot(str(tmp_path / "hover.png"))
    ActionChains(browser).move_by_offset(0, 400).perform()
    assert max(highlighted(browser, "right")) == 0

    # Clicking a small view in the grid selects its head.
    browser.find_elements(By.CSS_SELECTOR, "#grid .cell")[5].click()
    assert head.first_selected_option.get_attribute("value") == "5"
    # In "all heads" mode a legend colour toggles its head's lines.
    head.select_by_value("all")
    browser.find_element(By.CSS_SELECTOR, '#legend .swatch[data-head="1"]').click()
    assert drawn(browser, "head") == {str(h) for h in range(heads)} - {"1"}
    browser.find_element(By.CSS_SELECTOR, '#legend .swatch[data-head="1"]').click()
    assert "1" in drawn(browser, "head")

    # Hovering an attended token shows who attends to it.
    ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "#labels text.right")[0]).perform()
    assert drawn(browser, "to") == {"0"} and max(highlighted(browser, "left")) > 0
    shutil.copy(tmp_path / "all_heads.png", "/tmp/attention_view.png")
    assert (tmp_path / "all_heads.png").stat().st_size > 10_000


def test_queries_and_keys_give_the_attention_weights(minilm, tokenizer):
    """The neuron view's vectors, read by hooks, reproduce the model's own weights: softmax(q k^T / sqrt(d))."""
    attention = compute_attention(minilm, tokenizer, "The cat sat on the mat.", "It was tired.")
    layers, heads, seq, _ = attention.attentions.shape
    assert attention.queries.shape == attention.keys.shape == (layers, heads, seq, 384 // heads)
    scores = attention.queries @ attention.keys.transpose(-1, -2) / (384 // heads) ** 0.5
    assert torch.allclose(scores.softmax(-1), attention.attentions, atol=1e-5)


def test_model_and_neuron_views_in_headless_chromium(browser, tmp_path, minilm, tokenizer):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    attention = compute_attention(minilm, tokenizer, "The cat sat on the mat.", "It was tired.")
    layers, heads, seq, _ = attention.attentions.shape
    path = tmp_path / "views.html"
    path.write_text(render_attention_map(attention), encoding="utf-8")
    browser.get(path.as_uri())
    assert browser.execute_script("return window.performance.getEntriesByType('resource').length") == 0

    # Model view: one thumbnail per layer and head; a click opens that head (large, and in the head view).
    thumbnails = browser.find_elements(By.CSS_SELECTOR, "#model-grid canvas")
    assert len(thumbnails) == layers * heads
    thumbnails[3 * heads + 7].click()
    detail = browser.find_element(By.ID, "model-detail")
    assert (detail.get_attribute("data-layer"), detail.get_attribute("data-head")) == ("3", "7")
    assert "selected" in thumbnails[3 * heads + 7].get_attribute("class")
    assert Select(browser.find_element(By.ID, "layer")).first_selected_option.get_attribute("value") == "3"
    assert drawn(browser, "head") == {"7"}
    painted = browser.execute_script(
        "const c = document.querySelector('#model-detail canvas'), d = c.getContext('2d')"
        ".getImageData(0, 0, c.width, c.height).data; let dark = 0;"
        "for (let k = 0; k < d.length; k += 4) if (d[k] < 250) dark++; return [c.width, dark];")
    assert painted[0] == seq and painted[1] > 0
    browser.save_screenshot(str(tmp_path / "model_view.png"))

    # Neuron view: for a chosen token, the weights the head view holds (the model's, to 4 decimals), and the faint
    # ones it leaves out recomputed in the page from its (8-bit) queries and keys.
    for name, value in (("layer", "2"), ("head", "5"), ("token", "4")):
        Select(browser.find_element(By.ID, f"neuron-{name}")).select_by_value(value)
    neuron = browser.find_element(By.ID, "neuron")
    assert neuron.get_attribute("data-token") == "4" and neuron.get_attribute("data-head") == "5"
    weights = torch.tensor(json.loads(neuron.get_attribute("data-weights")), dtype=torch.float64)
    expected = attention.attentions[2, 5, 4].double()
    kept = visible(expected) > 0
    assert (weights[kept] - expected[kept]).abs().max() < 1e-4 and (weights - expected).abs().max() < 0.01
    assert int(neuron.get_attribute("height")) > 14 * seq
    browser.execute_script("document.getElementById('neuron').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "neuron_view.png"))


def test_a_500_token_input_scrolls(browser, tmp_path, minilm, tokenizer, squad_contexts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    text = " ".join(squad_contexts[:6])
    attention = compute_attention(minilm, tokenizer, text, max_length=500)
    assert attention.attentions.shape[-1] == 500
    path = tmp_path / "long.html"
    path.write_text(render_attention_map(attention), encoding="utf-8")
    browser.get(path.as_uri())
    assert len(browser.find_elements(By.CSS_SELECTOR, "#labels text.left")) == 500
    for box in ("head-view-box", "neuron-box"):
        scrolled = browser.execute_script(
            f"const box = document.getElementById('{box}'); box.scrollTop = 4000;"
            "return [box.scrollHeight, box.clientHeight, box.scrollTop];")
        assert scrolled[0] > 5 * scrolled[1] and scrolled[2] == 4000, box
    Select(browser.find_element(By.ID, "neuron-token")).select_by_value("499")
    weights = json.loads(browser.find_element(By.ID, "neuron").get_attribute("data-weights"))
    assert len(weights) == 500 and abs(sum(weights) - 1) < 0.01
    browser.save_screenshot(str(tmp_path / "long.png"))


def bertviz_params(html) -> dict:
    """The data bertviz embeds in the page it returns (`const params = {...}`)."""
    page = html.data if hasattr(html, "data") else str(html)
    start = page.index("const params = ") + len("const params = ")
    return json.JSONDecoder().raw_decode(page, start)[0]


@pytest.mark.parametrize("view", ["head_view", "model_view"])
def test_bertviz_draws_bertforge_attentions_as_transformers_ones(view, minilm_dir):
    """bertviz's own head_view and model_view, given a bertforge model's attentions as its README feeds them from
    transformers (a sentence pair, sentence_b_start), draw the weights they draw for transformers' model."""
    bertviz = pytest.importorskip("bertviz")
    transformers = pytest.importorskip("transformers")
    from bertforge import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    inputs = tokenizer("The cat sat on the mat because it was tired.", "It fell asleep at once.",
                       return_tensors="pt")
    ours = BertModel.from_pretrained(minilm_dir, output_attentions=True)
    theirs = transformers.BertModel.from_pretrained(minilm_dir, output_attentions=True, attn_implementation="eager")
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    second = inputs["token_type_ids"][0].tolist().index(1)
    drawn = []
    for model in (ours, theirs.eval()):
        with torch.inference_mode():
            attentions = model(**inputs).attentions
        drawn.append(bertviz_params(getattr(bertviz, view)(attentions, tokens, sentence_b_start=second,
                                                           html_action="return")))
    mine, reference = drawn
    assert [(part["name"], part["left_text"]) for part in mine["attention"]] == [
        (part["name"], part["left_text"]) for part in reference["attention"]]
    assert len(mine["attention"]) == 5  # all, and the four sentence-to-sentence blocks
    for part, expected in zip(mine["attention"], reference["attention"], strict=True):
        torch.testing.assert_close(torch.tensor(part["attn"]), torch.tensor(expected["attn"]), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def pair_attentions(minilm, tokenizer):
    """The default model's outputs.attentions for a sentence pair, with its tokens and where the second text
    starts: what bertviz's README passes to head_view and model_view."""
    inputs = tokenizer("The cat sat on the mat because it was tired.", "It fell asleep at once.",
                       return_tensors="pt")
    with torch.inference_mode():
        attentions = minilm(**inputs, output_attentions=True).attentions
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    return attentions, tokens, inputs["token_type_ids"][0].tolist().index(1)


def test_bertviz_calls_hold_the_layers_and_heads_bertviz_holds(pair_attentions):
    """head_view and model_view take bertviz's arguments; the weights they keep for include_layers and
    include_heads are the ones bertviz's own model_view keeps."""
    from bertforge.inference.attention_view import AttentionPage

    attentions, tokens, second = pair_attentions
    page = model_view(attentions, tokens, sentence_b_start=second, include_layers=[1, 4], include_heads=[0, 5, 11],
                      html_action="return")
    assert isinstance(page, AttentionPage)
    data = page_data(page.data)
    assert (data["views"], data["layer_names"], data["head_names"], data["dark"]) == (["model"], [1, 4], [0, 5, 11],
                                                                                      True)
    assert data["tokens"] == tokens and data["segment_b_start"] == second
    weights = torch.stack(attentions)[:, 0]
    assert torch.allclose(dense_attention(data), visible(weights[[1, 4]][:, [0, 5, 11]]), atol=1e-4)
    bertviz = pytest.importorskip("bertviz")
    theirs = bertviz_params(bertviz.model_view(attentions, tokens, sentence_b_start=second, include_layers=[1, 4],
                                               include_heads=[0, 5, 11], html_action="return"))
    assert torch.allclose(dense_attention(data), visible(torch.tensor(theirs["attention"][0]["attn"])), atol=1e-4)

    data = page_data(head_view(attentions, tokens, second, layer=3, heads=[2, 7], html_action="return").data)
    assert (data["views"], data["start_layer"], data["start_heads"], data["dark"]) == (["head"], 3, [2, 7], False)
    assert data["layer_names"] == list(range(6)) and data["head_names"] == list(range(12))
    # a layer chosen among some: its place on the page, named by the model's number
    data = page_data(head_view(attentions, tokens, layer=5, include_layers=[2, 5], html_action="return").data)
    assert (data["start_layer"], data["layer_names"], data["segment_b_start"]) == (1, [2, 5], None)
    # in a notebook, a frame of its own, so that two pages' controls stay apart
    frame = page._repr_html_()
    assert frame.startswith('<iframe title="attention view" srcdoc="&lt;!DOCTYPE html&gt;') and "<script>" not in frame


@pytest.mark.parametrize("call, message", [
    (lambda a, t: head_view(a, t, include_layers=[6], html_action="return"),
     "include_layers: 6 is not one of the model's 6 (0 to 5, or from the end -1 to -6)"),
    (lambda a, t: head_view(a, t, layer=3, include_layers=[1, 2], html_action="return"),
     "layer 3 is not on the page (it holds 1, 2)"),
    (lambda a, t: model_view(a, t, include_heads=[], html_action="return"),
     "include_heads is empty: give at least one index, or None for all"),
    (lambda a, t: model_view(a, t, display_mode="sepia", html_action="return"),
     "unknown display_mode 'sepia'; choose from dark, light"),
    (lambda a, t: head_view(a, t, html_action="show"), "unknown html_action 'show'; choose from view, return"),
    (lambda a, t: head_view(a, t, sentence_b_start=40, html_action="return"),
     "sentence_b_start 40 is not inside the 20 tokens"),
    (lambda a, t: head_view(a, t[:-1], html_action="return"),
     "attentions must be (layers, heads, 19, 19) for 19 tokens, got (6, 12, 20, 20)"),
])
def test_bertviz_calls_refuse_what_they_cannot_draw_in_one_line(pair_attentions, call, message):
    attentions, tokens, _ = pair_attentions
    with pytest.raises(BertforgeError) as caught:
        call(attentions, tokens)
    assert str(caught.value) == message


def test_bertviz_calls_as_bertviz_users_write_them(pair_attentions, minilm, tokenizer, minilm_dir):
    """A layer counted from the end (-1: the last, as in bertviz's Python indexing); neuron_view called in
    bertviz's own order, with the model type before the tokenizer, and an empty second sentence read as none; a
    transformers model or tokenizer, or another model type, refused in one line."""
    attentions, tokens, second = pair_attentions
    data = page_data(model_view(attentions, tokens, include_layers=[-1, 0], html_action="return").data)
    assert data["layer_names"] == [0, 5]
    theirs = neuron_view(minilm, "bert", tokenizer, "The cat sat.", "", "dark", 1, 2, "return")
    assert theirs.data == neuron_view(minilm, tokenizer, "The cat sat.", layer=1, head=2, html_action="return").data
    assert neuron_view(minilm, tokenizer, "The cat sat.", model_type="bert", html_action="return").data == \
        neuron_view(minilm, tokenizer, "The cat sat.", html_action="return").data
    transformers = pytest.importorskip("transformers")
    for call, message in [
            (lambda: neuron_view(minilm, "gpt2", tokenizer, "The cat sat."), "model_type 'gpt2': this neuron view "
                                                                               "draws BERT models"),
            (lambda: neuron_view(minilm, "bert", tokenizer, "The cat sat.", model_type="bert"),
             "model_type is given twice"),
            (lambda: neuron_view(transformers.BertModel.from_pretrained(str(minilm_dir)), tokenizer, "The cat sat."),
             "neuron_view reads a bertforge model's queries and keys, not a BertModel's"),
            (lambda: neuron_view(minilm, transformers.AutoTokenizer.from_pretrained(str(minilm_dir)), "The cat sat."),
             "neuron_view takes bertforge's tokenizer, not a BertTokenizer")]:
        with pytest.raises(BertforgeError, match=message):
            call()


def test_view_displays_in_a_notebook(pair_attentions, monkeypatch):
    display = pytest.importorskip("IPython.display")
    shown = []
    monkeypatch.setattr(display, "display", shown.append)
    attentions, tokens, _ = pair_attentions
    assert model_view(attentions, tokens) is None
    assert len(shown) == 1 and page_data(shown[0].data)["views"] == ["model"]
    assert "<iframe" in shown[0]._repr_html_()
    # outside a notebook IPython's display prints the repr: a line, not the page (bertviz prints its object's)
    assert repr(shown[0]) == f"<AttentionPage: {len(shown[0].data):,} characters of HTML in .data>"


def test_bertviz_calls_in_headless_chromium(browser, tmp_path, pair_attentions, minilm, tokenizer):
    """Each call's page shows its own view only, with the layers, heads and starting choices asked for."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    attentions, tokens, second = pair_attentions

    def open_page(page, name):
        path = tmp_path / f"{name}.html"
        path.write_text(page.data, encoding="utf-8")
        browser.get(path.as_uri())
        assert browser.execute_script("return window.performance.getEntriesByType('resource').length") == 0
        return {view: browser.find_element(By.ID, f"{view}-section").is_displayed()
                for view in ("head", "model", "neuron")}

    shown = open_page(head_view(attentions, tokens, second, layer=3, heads=[2, 7], html_action="return"), "head")
    assert shown == {"head": True, "model": False, "neuron": False}
    assert Select(browser.find_element(By.ID, "layer")).first_selected_option.text == "3"
    assert drawn(browser, "head") == {"2", "7"}
    swatches = browser.find_elements(By.CSS_SELECTOR, "#legend .swatch")
    assert [s.get_attribute("data-head") for s in swatches if "off" not in s.get_attribute("class")] == ["2", "7"]
    expected = visible(torch.stack(attentions)[3, 0, [2, 7]])
    assert len(line_opacities(browser)) == int((expected > 0).sum())

    shown = open_page(model_view(attentions, tokens, second, include_layers=[1, 4], include_heads=[0, 5, 11],
                                 html_action="return"), "model")
    assert shown == {"head": False, "model": True, "neuron": False}
    assert browser.execute_script("return document.body.classList.contains('dark')")
    assert [label.text for label in browser.find_elements(By.CSS_SELECTOR, "#model-grid .row-label")] == [
        "layer 1", "layer 4"]
    thumbnails = browser.find_elements(By.CSS_SELECTOR, "#model-grid canvas")
    assert [t.get_attribute("title") for t in thumbnails] == [
        f"layer {layer}, head {head}" for layer in (1, 4) for head in (0, 5, 11)]
    thumbnails[4].click()
    assert browser.find_element(By.ID, "model-detail-caption").text == "layer 4, head 5"
    browser.save_screenshot(str(tmp_path / "model_view.png"))

    shown = open_page(neuron_view(minilm, tokenizer, "The cat sat on the mat.", "It was tired.", layer=2, head=5,
                                  html_action="return"), "neuron")
    assert shown == {"head": False, "model": False, "neuron": True}
    neuron = browser.find_element(By.ID, "neuron")
    assert (neuron.get_attribute("data-layer"), neuron.get_attribute("data-head")) == ("2", "5")
    Select(browser.find_element(By.ID, "neuron-token")).select_by_value("4")
    weights = torch.tensor(json.loads(neuron.get_attribute("data-weights")))
    expected = compute_attention(minilm, tokenizer, "The cat sat on the mat.", "It was tired.").attentions[2, 5, 4]
    assert (weights - expected).abs().max() < 0.03

    # As a notebook shows them: two pages in one document, each in its frame, each with its own controls.
    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!DOCTYPE html><html><body>" + "".join(
        page._repr_html_() for page in (head_view(attentions, tokens, layer=1, html_action="return"),
                                        head_view(attentions, tokens, layer=4, html_action="return"))) +
        "</body></html>", encoding="utf-8")
    browser.get(notebook.as_uri())
    chosen = []
    for frame in browser.find_elements(By.TAG_NAME, "iframe"):
        browser.switch_to.frame(frame)
        chosen.append(Select(browser.find_element(By.ID, "layer")).first_selected_option.text)
        assert len(line_opacities(browser)) > 0
        browser.switch_to.default_content()
    assert chosen == ["1", "4"]
