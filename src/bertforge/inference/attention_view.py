"""Attention weights of every layer and head, rendered as one self-contained HTML page after bertviz's three views:
the head view (lines between tokens), the model view (every layer x head as a thumbnail) and the neuron view (the
query and key vectors of one head and their products, for a chosen token).

Shapes: layers, heads, seq (tokens of the text, or of both texts of a pair, with [CLS] and [SEP]), head_dim.
The page has no external resources: CSS, JavaScript and the weights (as JSON) are inline, so it opens offline.
Weights under MIN_WEIGHT are left out of the page (they draw nothing), so a long input's page stays small.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.heads import encoder_of
from bertforge.validation import check_within_positions

# Enough for a long sentence pair; the page holds layers * heads * seq^2 weights, which grows fast beyond it.
DEFAULT_MAX_TOKENS = 128
# Decimals kept per weight in the page: lines fainter than 1/1000 are invisible anyway.
DECIMALS = 4
# Weights below this are not stored: the head view draws no line for them and a thumbnail shows them as white.
MIN_WEIGHT = 0.01


# The page's three views, after bertviz's.
VIEWS = ("head", "model", "neuron")


@dataclass
class PageLayout:
    """What a page shows: its views; the model's layers and heads it holds (None: all); the layer and heads
    selected when it opens (the model's numbering; None: the first layer held, every head); dark or light."""

    views: Sequence[str] = VIEWS
    layers: Sequence[int] | None = None
    heads: Sequence[int] | None = None
    start_layer: int | None = None
    start_heads: Sequence[int] | None = None
    dark: bool = False


@dataclass
class AttentionMap:
    tokens_a: list[str]  # [CLS] A... [SEP]
    tokens_b: list[str]  # B... [SEP], or [] for a single text
    attentions: torch.Tensor  # (layers, heads, seq, seq): row = attending token, column = attended token
    queries: torch.Tensor | None = None  # (layers, heads, seq, head_dim), for the neuron view
    keys: torch.Tensor | None = None  # (layers, heads, seq, head_dim)


def encode_for_attention(tokenizer, text: str, pair: str | None = None, max_length: int = DEFAULT_MAX_TOKENS,
                         truncate: bool = True) -> dict[str, list]:
    """The tokenizer's row for a text (or pair), cut to `max_length` tokens (an InputError if not `truncate`)."""
    if not text.strip() or (pair is not None and not pair.strip()):
        raise InputError(f"the {'text' if not text.strip() else 'pair'} is empty: nothing to show attention over")
    for name, value in (("text", text), ("pair", pair)):
        if value is not None and not tokenizer.tokenize(value):  # control and zero-width characters alone
            raise InputError(f"the {name} is empty after tokenization (only spaces, control or zero-width "
                             "characters): nothing to show attention over")
    encoding = tokenizer(text, text_pair=pair, truncation=False)
    if len(encoding["input_ids"]) > max_length:
        if not truncate:
            raise InputError(f"the text is {len(encoding['input_ids'])} tokens long; the limit is {max_length}")
        encoding = tokenizer(text, text_pair=pair, truncation=True, max_length=max_length)
        special = {tokenizer.cls_token_id, tokenizer.sep_token_id}  # the tokens truncation adds, not the text's
        kept = {segment for token, segment in zip(encoding["input_ids"], encoding["token_type_ids"])
                if token not in special}
        for segment, name in enumerate(("text", "pair") if pair is not None else ("text",)):
            if segment not in kept:
                raise InputError(f"max_length {max_length} keeps no token of the {name}: give a larger one")
    return encoding


@torch.inference_mode()
def attention_weights(model, input_ids: list[int], token_type_ids: list[int]) -> torch.Tensor:
    """(layers, heads, seq, seq) attention probabilities for one row; `model` is a BertModel or has `.bert`."""
    encoder = encoder_of(model)
    device = next(encoder.parameters()).device
    output = encoder(torch.tensor([input_ids], device=device), token_type_ids=torch.tensor([token_type_ids],
                     device=device), output_attentions=True)
    return torch.stack([layer[0] for layer in output.attentions]).float().cpu()


@torch.inference_mode()
def query_key_vectors(model, input_ids: list[int], token_type_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's queries and keys for one row, each (layers, heads, seq, head_dim), read by forward hooks on the
    attention's query and key projections (their outputs are (tokens, hidden): one row has no padding to pack)."""
    encoder = encoder_of(model)
    captured: dict[str, list[torch.Tensor]] = {"query": [], "key": []}
    handles = [getattr(layer.attention, name).register_forward_hook(
                   lambda module, inputs, output, name=name: captured[name].append(output.float().cpu()))
               for layer in encoder.encoder.layers for name in captured]
    device = next(encoder.parameters()).device
    try:
        encoder(torch.tensor([input_ids], device=device), token_type_ids=torch.tensor([token_type_ids], device=device))
    finally:
        for handle in handles:
            handle.remove()
    heads = encoder.config.num_attention_heads
    split = [torch.stack([x.reshape(len(input_ids), heads, -1).transpose(0, 1) for x in captured[name]])
             for name in ("query", "key")]
    return split[0], split[1]


def attention_map(tokenizer, encoding: dict[str, list], attentions: torch.Tensor,
                  queries: torch.Tensor | None = None, keys: torch.Tensor | None = None) -> AttentionMap:
    """Pair a row's tokens, split into segments A and B, with its attention weights (and queries and keys)."""
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    segments = encoding["token_type_ids"]
    split = segments.index(1) if 1 in segments else len(tokens)
    return AttentionMap(tokens[:split], tokens[split:], attentions, queries, keys)


def compute_attention(model, tokenizer, text: str, pair: str | None = None, max_length: int | None = None,
                      truncate: bool = True) -> AttentionMap:
    """Tokens, attention weights, queries and keys of every layer for one text (or pair), for render_attention_map;
    `max_length` defaults to DEFAULT_MAX_TOKENS, or the model's positions when fewer."""
    positions = model.config.max_position_embeddings
    check_within_positions(max_length, positions)
    max_length = max_length or min(DEFAULT_MAX_TOKENS, positions)
    encoding = encode_for_attention(tokenizer, text, pair, max_length, truncate)
    ids, segments = encoding["input_ids"], encoding["token_type_ids"]
    return attention_map(tokenizer, encoding, attention_weights(model, ids, segments),
                         *query_key_vectors(model, ids, segments))


def sparse_rows(weights: torch.Tensor) -> list:
    """(layers, heads, seq, seq) -> [layer][head][attending] = [attended, weight, attended, weight, ...], keeping
    the weights of at least MIN_WEIGHT, rounded to DECIMALS (in float64, so 0.1234 prints as that)."""
    rounded = weights.double().round(decimals=DECIMALS)
    layers, heads, seq, _ = rounded.shape
    kept = rounded >= MIN_WEIGHT
    rows = [[[[] for _ in range(seq)] for _ in range(heads)] for _ in range(layers)]
    for (layer, head, i, j), weight in zip(kept.nonzero().tolist(), rounded[kept].tolist()):
        rows[layer][head][i] += (j, weight)
    return rows


def packed_vectors(vectors: torch.Tensor) -> dict:
    """(layers, heads, seq, head_dim) -> int8 values and one float32 scale per vector (both base64):
    value * scale[layer, head, token].

    A scale per vector, not per layer: the neuron view prints the scores and weights it computes from these, and
    a layer's few large queries left the others a coarse grid (weights off by up to 0.07 from the model's). The
    page stays a quarter of float32's size on long inputs.
    """
    scale = vectors.abs().amax(-1).clamp(min=1e-12) / 127  # (layers, heads, seq)
    values = (vectors / scale[..., None]).round().clamp(-127, 127).to(torch.int8)
    return {"shape": list(vectors.shape),
            "scales": base64.b64encode(scale.float().contiguous().numpy().tobytes()).decode("ascii"),
            "values": base64.b64encode(values.contiguous().numpy().tobytes()).decode("ascii")}


def _page_data(tokens_a: Sequence[str], tokens_b: Sequence[str], attentions, queries=None, keys=None,
               layout: PageLayout | None = None) -> dict:
    layout = layout or PageLayout()
    if isinstance(attentions, (list, tuple)) and attentions and isinstance(attentions[0], torch.Tensor):
        attentions = torch.stack(list(attentions))
    weights = torch.as_tensor(attentions, dtype=torch.float32)
    if weights.dim() == 5:  # per-layer tensors straight from the model: (layers, batch=1, heads, seq, seq)
        if weights.shape[1] != 1:
            raise InputError(f"attentions hold a batch of {weights.shape[1]}; render one text at a time")
        weights = weights[:, 0]
    seq = len(tokens_a) + len(tokens_b)
    if weights.dim() != 4 or weights.shape[2:] != (seq, seq):
        raise InputError(f"attentions must be (layers, heads, {seq}, {seq}) for {seq} tokens, "
                         f"got {tuple(weights.shape)}")
    for view in layout.views:
        check_choice(view, VIEWS, "view")
    layers = _chosen("include_layers", layout.layers, weights.shape[0])
    heads = _chosen("include_heads", layout.heads, weights.shape[1])
    start_layer = 0 if layout.start_layer is None else _position("layer", layout.start_layer, layers)
    start_heads = None if layout.start_heads is None else [_position("head", head, heads)
                                                           for head in layout.start_heads]
    shape = (*weights.shape[:2], seq)  # what queries and keys must be, before the page takes its layers and heads
    weights = weights[layers][:, heads]
    data = {
        "tokens": list(tokens_a) + list(tokens_b),
        "segment_b_start": len(tokens_a) if tokens_b else None,
        "layers": weights.shape[0], "heads": weights.shape[1], "min_weight": MIN_WEIGHT,
        "attention": sparse_rows(weights),  # [layer][head][attending] = [attended, weight, ...]
        "layer_names": layers, "head_names": heads, "views": list(layout.views),
        "start_layer": start_layer, "start_heads": start_heads, "dark": layout.dark,
    }
    if queries is not None and keys is not None:
        if queries.shape[:3] != shape or keys.shape != queries.shape:
            raise InputError(f"queries and keys must be (layers, heads, seq, head_dim) with (layers, heads, seq) = "
                             f"{shape}, got {tuple(queries.shape)} and {tuple(keys.shape)}")
        data["queries"], data["keys"] = (packed_vectors(vectors.float()[layers][:, heads])
                                         for vectors in (queries, keys))
    return data


def _chosen(name: str, chosen: Sequence[int] | None, count: int) -> list[int]:
    """The indices `chosen` of `count` (every one when None), in order, each checked."""
    if chosen is None:
        return list(range(count))
    chosen = [int(index) for index in chosen]
    if not chosen:
        raise ConfigError(f"{name} is empty: give at least one index, or None for all")
    for index in chosen:
        if not 0 <= index < count:
            raise ConfigError(f"{name}: {index} is not one of the model's {count} (0 to {count - 1})")
    return sorted(set(chosen))


def _position(name: str, index: int, held: list[int]) -> int:
    """Where the model's layer or head `index` sits among those the page holds."""
    if index not in held:
        raise ConfigError(f"{name} {index} is not on the page (it holds {', '.join(map(str, held))})")
    return held.index(index)


def _script_json(data: dict) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' can end the element or open a comment."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_attention_html(tokens_a: Sequence[str], tokens_b: Sequence[str], attentions,
                          title: str = "Attention", queries: torch.Tensor | None = None,
                          keys: torch.Tensor | None = None, before: str = "", after: str = "",
                          layout: PageLayout | None = None) -> str:
    """A standalone HTML page showing `attentions` (layers, heads, seq, seq) between the tokens of A and B.

    `attentions` may also be the model's tuple of per-layer (1, heads, seq, seq) tensors, or nested lists.
    `queries` and `keys` (layers, heads, seq, head_dim) feed the neuron view. `before` and `after` are trusted HTML
    sections placed above and below the attention views (the explanation page puts its own there). `layout`: which
    views, layers and heads (default: all, light).
    >>> page = render_attention_html(["[CLS]", "hi", "[SEP]"], [], torch.full((1, 2, 3, 3), 1 / 3))
    """
    data = _page_data(tokens_a, tokens_b, attentions, queries, keys, layout)
    values = {"TITLE": html.escape(title), "DATA": _script_json(data), "BEFORE": before, "AFTER": after}
    # One pass, so that a title, token or section spelling a placeholder is never substituted itself.
    return re.sub(r"__(TITLE|DATA|BEFORE|AFTER)__", lambda match: values[match.group(1)], PAGE)


def render_attention_map(attention: AttentionMap, title: str = "Attention", before: str = "", after: str = "",
                         layout: PageLayout | None = None) -> str:
    return render_attention_html(attention.tokens_a, attention.tokens_b, attention.attentions, title,
                                 attention.queries, attention.keys, before, after, layout)


# ---------------------------------------------------------------- bertviz's calls

@dataclass(repr=False)
class AttentionPage:
    """A page as bertviz's html_action="return" gives one: `.data` is the HTML (write it to a file to open it in a
    browser). A notebook shows it in a frame of its own, so that several pages in one notebook keep their controls
    apart."""

    data: str
    height: int = 800

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html.escape(self.data, quote=True)}" style="width: 100%; height: {self.height}px; '
                'border: 0"></iframe>')

    def __repr__(self) -> str:  # what display() prints outside a notebook: a line, not the page
        return f"<AttentionPage: {len(self.data):,} characters of HTML in .data>"


def head_view(attention, tokens: Sequence[str], sentence_b_start: int | None = None, prettify_tokens: bool = True,
              layer: int | None = None, heads: Sequence[int] | None = None,
              include_layers: Sequence[int] | None = None, html_action: str = "view") -> AttentionPage | None:
    """bertviz's head_view, drawn offline: lines from each token to those it attends to, one colour per head.

    `attention`: the model's `outputs.attentions` for one text (or (layers, heads, seq, seq)); `tokens` its tokens
    (tokenizer.convert_ids_to_tokens); `sentence_b_start`: where a pair's second text starts. `layer` and `heads`
    are selected when the page opens; `include_layers` keeps only those layers. html_action "view" shows the page in
    a notebook; "return" returns it (AttentionPage: `.data` is the HTML)."""
    tokens_a, tokens_b = _split_tokens(tokens, sentence_b_start, prettify_tokens)
    layout = PageLayout(views=("head",), layers=include_layers, start_layer=layer, start_heads=heads)
    return _shown(AttentionPage(render_attention_html(tokens_a, tokens_b, attention, "Attention", layout=layout)),
                  html_action)


def model_view(attention, tokens: Sequence[str], sentence_b_start: int | None = None, prettify_tokens: bool = True,
               display_mode: str = "dark", include_layers: Sequence[int] | None = None,
               include_heads: Sequence[int] | None = None, html_action: str = "view") -> AttentionPage | None:
    """bertviz's model_view, drawn offline: every layer (rows) and head (columns) as a thumbnail of its weights;
    `include_layers` and `include_heads` keep only those. `display_mode`: dark or light. The other arguments are
    head_view's."""
    tokens_a, tokens_b = _split_tokens(tokens, sentence_b_start, prettify_tokens)
    layout = PageLayout(views=("model",), layers=include_layers, heads=include_heads,
                        dark=_is_dark(display_mode))
    return _shown(AttentionPage(render_attention_html(tokens_a, tokens_b, attention, "Attention", layout=layout)),
                  html_action)


def neuron_view(model, tokenizer, sentence_a: str, sentence_b: str | None = None, display_mode: str = "dark",
                layer: int | None = None, head: int | None = None, html_action: str = "view") -> AttentionPage | None:
    """bertviz's neuron view (its `neuron_view.show`, less model_type: the model is BERT), drawn offline: the query
    of a chosen token against every token's key, their product, and the weight that gives. `model` a bertforge
    model (BertModel, or one with `.bert`); `layer` and `head` are selected when the page opens."""
    attention = compute_attention(model, tokenizer, sentence_a, sentence_b)
    layout = PageLayout(views=("neuron",), start_layer=layer, start_heads=None if head is None else [head],
                        dark=_is_dark(display_mode))
    return _shown(AttentionPage(render_attention_map(attention, "Attention", layout=layout)), html_action)


def _split_tokens(tokens: Sequence[str], sentence_b_start: int | None, prettify: bool) -> tuple[list, list]:
    """Tokens as the page's segments A and B; prettified as bertviz does (byte-level and SentencePiece word
    marks as spaces; WordPiece's ## is kept)."""
    tokens = [str(token) for token in tokens]
    if prettify:
        tokens = [token.replace("\u0120", " ").replace("\u2581", " ").replace("</w>", "") for token in tokens]
    if sentence_b_start is None:
        return tokens, []
    if not 0 < sentence_b_start < len(tokens):
        raise ConfigError(f"sentence_b_start {sentence_b_start} is not inside the {len(tokens)} tokens")
    return tokens[:sentence_b_start], tokens[sentence_b_start:]


def _is_dark(display_mode: str) -> bool:
    check_choice(display_mode, ("dark", "light"), "display_mode")
    return display_mode == "dark"


def _shown(page: AttentionPage, html_action: str) -> AttentionPage | None:
    """bertviz's html_action: "view" displays the page in a notebook, "return" hands it back."""
    check_choice(html_action, ("view", "return"), "html_action")
    if html_action == "return":
        return page
    try:
        from IPython.display import display
    except ImportError:
        raise ConfigError("html_action='view' shows the page in a notebook, which needs IPython; use "
                          "html_action='return' and write the page's .data to a file") from None
    display(page)
    return None


# The page. JavaScript reads the JSON block; the head view draws one SVG line per stored (attending, attended) pair
# (opacity and width = weight) and redraws on every control change or hover; the model view paints one thumbnail per
# layer and head; the neuron view recomputes one head's weights from its queries and keys, for one token.
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 8px; }
  h2 { font-size: 16px; margin: 20px 0 6px; }
  .controls { display: flex; gap: 16px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
  .controls label { font-size: 14px; }
  .legend { display: flex; gap: 4px; flex-wrap: wrap; }
  .swatch { width: 22px; height: 16px; border: 2px solid transparent; cursor: pointer; font-size: 10px;
            color: #fff; text-align: center; line-height: 16px; border-radius: 3px; }
  .swatch.off { opacity: 0.2; }
  .hint { font-size: 12px; color: #666; margin: 4px 0 8px; }
  .scroll { max-height: 75vh; overflow: auto; border: 1px solid #eee; }
  #view { display: block; }
  #view text, #neuron-labels { font-size: 13px; font-family: ui-monospace, Menlo, Consolas, monospace; }
  #view text { cursor: default; dominant-baseline: middle; }
  #view text.segment-b { fill: #7a4a00; }
  #view rect.highlight { fill: #ff9800; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(92px, 1fr)); gap: 6px; margin-top: 12px;
          max-width: 900px; }
  .cell { text-align: center; font-size: 11px; cursor: pointer; }
  .cell canvas { width: 84px; height: 84px; border: 2px solid #ddd; image-rendering: pixelated; }
  .cell.selected canvas { border-color: #333; }
  .layout { display: flex; gap: 32px; align-items: flex-start; flex-wrap: wrap; }
  #model-grid { display: grid; gap: 3px; }
  #model-grid canvas { width: 56px; height: 56px; border: 2px solid #ddd; cursor: pointer; image-rendering: pixelated; }
  #model-grid canvas.selected { border-color: #333; }
  #model-grid .row-label { font-size: 11px; align-self: center; color: #666; }
  #model-detail canvas { width: 320px; height: 320px; border: 1px solid #999; image-rendering: pixelated; }
  #neuron { display: block; }
  body.dark { background: #111; color: #ddd; }
  body.dark .hint, body.dark #model-grid .row-label { color: #aaa; }
  body.dark .scroll { border-color: #333; }
  body.dark #view text { fill: #ddd; }
  body.dark #view text.segment-b { fill: #f0b060; }
  body.dark select { background: #222; color: #ddd; }
  body.dark #neuron { background: #fff; }
  body.dark #model-grid canvas.selected, body.dark .cell.selected canvas { border-color: #ddd; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
__BEFORE__
<section id="head-section">
<h2>Head view</h2>
<div class="controls">
  <label>Layer <select id="layer"></select></label>
  <label>Head <select id="head"></select></label>
  <div class="legend" id="legend" title="click a colour to show or hide that head in 'all heads' mode"></div>
</div>
<div class="hint">Left: attending tokens; right: attended tokens. Line opacity and width are the attention weight.
Hover a token to see only its attention.</div>
<div class="layout">
  <div class="scroll" id="head-view-box"><svg id="view" xmlns="http://www.w3.org/2000/svg"></svg></div>
  <div>
    <div class="hint">Every head of this layer (rows attend to columns); click one to select it.</div>
    <div class="grid" id="grid"></div>
  </div>
</div>
</section>
<section id="model-section">
<h2>Model view</h2>
<div class="hint">Every layer (rows) and head (columns); click a thumbnail to open that head.</div>
<div class="layout">
  <div class="scroll" id="model-view-box"><div id="model-grid"></div></div>
  <div id="model-detail"><div id="model-detail-caption" class="hint">no head opened</div><canvas></canvas></div>
</div>
</section>
<section id="neuron-section">
<h2>Neuron view</h2>
<div class="controls">
  <label>Layer <select id="neuron-layer"></select></label>
  <label>Head <select id="neuron-head"></select></label>
  <label>Token <select id="neuron-token"></select></label>
</div>
<div class="hint" id="neuron-hint">The query q of the chosen token; for every token its key k, the product q &times; k
(blue positive, orange negative), the score q&middot;k/&radic;d and the attention weight it gets (softmax).</div>
<div class="scroll" id="neuron-box"><canvas id="neuron"></canvas></div>
</section>
__AFTER__
<script type="application/json" id="attention-data">__DATA__</script>
<script>
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("attention-data").textContent);
  const TOKENS = DATA.tokens, N = TOKENS.length, LAYERS = DATA.layers, HEADS = DATA.heads;
  // Layers and heads by the model's numbering (a page may hold some of them only); which views the page shows.
  const LAYER_NAMES = DATA.layer_names, HEAD_NAMES = DATA.head_names;
  for (const view of ["head", "model", "neuron"]) {
    if (!DATA.views.includes(view)) document.getElementById(view + "-section").style.display = "none";
  }
  if (DATA.dark) document.body.classList.add("dark");
  const ROW = 20, LEFT_X = 150, RIGHT_X = 370, WIDTH = 520, TOP = 10;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("view");
  const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
  const legend = document.getElementById("legend"), grid = document.getElementById("grid");
  const state = { layer: DATA.start_layer, head: "all", focus: null, hidden: new Set() };
  if (DATA.start_heads !== null) {
    for (let h = 0; h < HEADS; h++) if (!DATA.start_heads.includes(h)) state.hidden.add(h);
  }

  function headColour(h) { return "hsl(" + Math.round(360 * h / HEADS) + ", 75%, 45%)"; }
  function isB(i) { return DATA.segment_b_start !== null && i >= DATA.segment_b_start; }
  function element(name, attributes) {
    const node = document.createElementNS(SVG_NS, name);
    for (const key in attributes) node.setAttribute(key, attributes[key]);
    return node;
  }

  // The stored weights of one head as a dense N x N array (row = attending token); the current layer's are kept.
  const denseCache = new Map();
  function weightsOf(layer, head) {
    const key = layer + "," + head;
    if (!denseCache.has(key)) {
      if (denseCache.size >= 2 * HEADS) denseCache.clear();
      const dense = new Float32Array(N * N), rows = DATA.attention[layer][head];
      for (let i = 0; i < N; i++) {
        const row = rows[i];
        for (let k = 0; k < row.length; k += 2) dense[i * N + row[k]] = row[k + 1];
      }
      denseCache.set(key, dense);
    }
    return denseCache.get(key);
  }

  // A head's weights painted into a canvas of N x N pixels (darker blue = more attention).
  function paintHead(canvas, layer, head) {
    canvas.width = N; canvas.height = N;
    const context = canvas.getContext("2d"), image = context.createImageData(N, N);
    image.data.fill(255);
    const rows = DATA.attention[layer][head];
    for (let i = 0; i < N; i++) {
      const row = rows[i];
      for (let k = 0; k < row.length; k += 2) {
        const shade = 255 - Math.round(255 * Math.min(1, row[k + 1])), at = 4 * (i * N + row[k]);
        image.data[at] = shade; image.data[at + 1] = shade;
      }
    }
    context.putImageData(image, 0, 0);
  }

  for (let l = 0; l < LAYERS; l++) layerSelect.add(new Option(String(LAYER_NAMES[l]), String(l)));
  layerSelect.value = String(state.layer);
  headSelect.add(new Option("all heads", "all"));
  for (let h = 0; h < HEADS; h++) headSelect.add(new Option(String(HEAD_NAMES[h]), String(h)));
  for (let h = 0; h < HEADS; h++) {
    const swatch = document.createElement("div");
    swatch.className = "swatch";
    swatch.dataset.head = String(h);
    swatch.style.background = headColour(h);
    swatch.textContent = String(HEAD_NAMES[h]);
    swatch.classList.toggle("off", state.hidden.has(h));
    swatch.addEventListener("click", function () {
      if (state.hidden.has(h)) state.hidden.delete(h); else state.hidden.add(h);
      swatch.classList.toggle("off", state.hidden.has(h));
      draw();
    });
    legend.appendChild(swatch);
  }

  svg.setAttribute("width", WIDTH);
  svg.setAttribute("height", TOP * 2 + ROW * N);
  const highlights = element("g", { id: "highlights" });
  const lines = element("g", { id: "lines" });
  const labels = element("g", { id: "labels" });
  svg.append(highlights, lines, labels);
  const y = function (i) { return TOP + ROW * i + ROW / 2; };
  const boxes = { left: [], right: [] };
  for (const side of ["left", "right"]) {
    for (let i = 0; i < N; i++) {
      const box = element("rect", { x: side === "left" ? 0 : RIGHT_X + 4, y: y(i) - ROW / 2 + 1,
                                    width: LEFT_X - 4, height: ROW - 2, rx: 3, class: "highlight",
                                    "fill-opacity": 0 });
      highlights.appendChild(box);
      boxes[side].push(box);
      const label = element("text", { x: side === "left" ? LEFT_X - 6 : RIGHT_X + 6, y: y(i),
                                      "text-anchor": side === "left" ? "end" : "start",
                                      class: "token " + side + (isB(i) ? " segment-b" : ""),
                                      "data-side": side, "data-index": i });
      label.textContent = TOKENS[i];
      label.addEventListener("mouseenter", function () { state.focus = { side: side, index: i }; draw(); });
      label.addEventListener("mouseleave", function () { state.focus = null; draw(); });
      labels.appendChild(label);
    }
  }

  function shownHeads() {
    if (state.head !== "all") return [Number(state.head)];
    const heads = [];
    for (let h = 0; h < HEADS; h++) if (!state.hidden.has(h)) heads.push(h);
    return heads;
  }

  function draw() {
    lines.replaceChildren();
    const heads = shownHeads(), focus = state.focus, single = heads.length === 1 && state.head !== "all";
    const emphasis = { left: new Float64Array(N), right: new Float64Array(N) };
    for (const h of heads) {
      const weights = weightsOf(state.layer, h);
      for (let i = 0; i < N; i++) {
        if (focus && focus.side === "left" && focus.index !== i) continue;
        for (let j = 0; j < N; j++) {
          if (focus && focus.side === "right" && focus.index !== j) continue;
          const w = weights[i * N + j];
          if (focus) {
            emphasis.right[j] = Math.max(emphasis.right[j], focus.side === "left" ? w : 0);
            emphasis.left[i] = Math.max(emphasis.left[i], focus.side === "right" ? w : 0);
          }
          if (w === 0) continue;  // only weights of at least MIN_WEIGHT are stored
          lines.appendChild(element("line", {
            x1: LEFT_X, y1: y(i), x2: RIGHT_X, y2: y(j), stroke: single ? "#1f5fbf" : headColour(h),
            "stroke-opacity": w.toFixed(3), "stroke-width": (0.5 + 3 * w).toFixed(2),
            "data-head": h, "data-from": i, "data-to": j }));
        }
      }
    }
    for (const side of ["left", "right"]) {
      for (let i = 0; i < N; i++) {
        let value = emphasis[side][i];
        if (focus && focus.side === side && focus.index === i) value = 1;
        boxes[side][i].setAttribute("fill-opacity", (0.6 * value).toFixed(3));
      }
    }
    drawGrid();
  }

  function drawGrid() {
    grid.replaceChildren();
    for (let h = 0; h < HEADS; h++) {
      const cell = document.createElement("div");
      cell.className = "cell" + (String(h) === state.head ? " selected" : "");
      cell.dataset.head = String(h);
      const canvas = document.createElement("canvas");
      paintHead(canvas, state.layer, h);
      const caption = document.createElement("div");
      caption.textContent = "head " + HEAD_NAMES[h];
      caption.style.color = headColour(h);
      cell.append(canvas, caption);
      cell.addEventListener("click", function () { state.head = String(h); headSelect.value = state.head; draw(); });
      grid.appendChild(cell);
    }
  }

  // ---- model view: every layer x head; a click opens the head here and in the head view.
  const modelGrid = document.getElementById("model-grid"), detail = document.getElementById("model-detail");
  modelGrid.style.gridTemplateColumns = "auto repeat(" + HEADS + ", 60px)";
  for (let l = 0; l < LAYERS; l++) {
    const label = document.createElement("div");
    label.className = "row-label";
    label.textContent = "layer " + LAYER_NAMES[l];
    modelGrid.appendChild(label);
    for (let h = 0; h < HEADS; h++) {
      const thumb = document.createElement("canvas");
      thumb.dataset.layer = String(l); thumb.dataset.head = String(h);
      thumb.title = "layer " + LAYER_NAMES[l] + ", head " + HEAD_NAMES[h];
      paintHead(thumb, l, h);
      thumb.addEventListener("click", function () { openHead(l, h); });
      modelGrid.appendChild(thumb);
    }
  }
  function openHead(l, h) {
    for (const thumb of modelGrid.querySelectorAll("canvas")) {
      thumb.classList.toggle("selected", thumb.dataset.layer === String(l) && thumb.dataset.head === String(h));
    }
    paintHead(detail.querySelector("canvas"), l, h);
    detail.dataset.layer = String(l); detail.dataset.head = String(h);
    document.getElementById("model-detail-caption").textContent = "layer " + LAYER_NAMES[l] + ", head " +
      HEAD_NAMES[h];
    state.layer = l; state.head = String(h);
    layerSelect.value = String(l); headSelect.value = String(h);
    draw();
  }

  // ---- neuron view: q of one token against every token's k, for one layer and head.
  const neuron = document.getElementById("neuron"), neuronSelects = {};
  for (const [name, count] of [["layer", LAYERS], ["head", HEADS], ["token", N]]) {
    const select = document.getElementById("neuron-" + name);
    const names = { layer: LAYER_NAMES, head: HEAD_NAMES }[name];
    for (let i = 0; i < count; i++) {
      select.add(new Option(name === "token" ? i + ": " + TOKENS[i] : String(names[i]), i));
    }
    select.addEventListener("change", drawNeurons);
    neuronSelects[name] = select;
  }
  function unpack(packed) {
    const text = atob(packed.values), values = new Int8Array(text.length);
    for (let k = 0; k < text.length; k++) values[k] = (text.charCodeAt(k) << 24) >> 24;
    const bytes = Uint8Array.from(atob(packed.scales), (c) => c.charCodeAt(0));
    return { values: values, scales: new Float32Array(bytes.buffer), dim: packed.shape[3] };
  }
  const QUERIES = DATA.queries ? unpack(DATA.queries) : null, KEYS = DATA.keys ? unpack(DATA.keys) : null;
  function vector(packed, l, h, t) {
    const out = new Float64Array(packed.dim), row = (l * HEADS + h) * N + t, at = row * packed.dim;
    for (let c = 0; c < packed.dim; c++) out[c] = packed.values[at + c] * packed.scales[row];
    return out;
  }
  function cellColour(value, largest) {
    const strength = Math.min(1, Math.abs(value) / (largest || 1));
    return (value >= 0 ? "rgba(31, 95, 191, " : "rgba(230, 120, 0, ") + strength.toFixed(3) + ")";
  }
  function drawNeurons() {
    if (!QUERIES) {
      document.getElementById("neuron-hint").textContent = "This page holds no queries and keys.";
      return;
    }
    const l = Number(neuronSelects.layer.value), h = Number(neuronSelects.head.value);
    const t = Number(neuronSelects.token.value), dim = QUERIES.dim, CELL = 6, LINE = 14, LABEL = 120;
    const q = vector(QUERIES, l, h, t), keys = [], products = [], scores = [];
    for (let j = 0; j < N; j++) {
      const k = vector(KEYS, l, h, j), product = new Float64Array(dim);
      let score = 0;
      for (let c = 0; c < dim; c++) { product[c] = q[c] * k[c]; score += product[c]; }
      keys.push(k); products.push(product); scores.push(score / Math.sqrt(dim));
    }
    const top = Math.max.apply(null, scores), exps = scores.map(function (s) { return Math.exp(s - top); });
    const total = exps.reduce(function (a, b) { return a + b; }, 0);
    const weights = exps.map(function (e) { return e / total; });
    // Where the page holds the model's own weight (the head view's), that one: 8-bit vectors recompute it closely,
    // not exactly, and the two views must not show two numbers for one weight.
    const stored = DATA.attention[l][h][t];
    for (let k = 0; k < stored.length; k += 2) weights[stored[k]] = stored[k + 1];
    let largestKey = 0, largestProduct = 0, largestQuery = 0;
    for (let j = 0; j < N; j++) for (let c = 0; c < dim; c++) {
      largestKey = Math.max(largestKey, Math.abs(keys[j][c]));
      largestProduct = Math.max(largestProduct, Math.abs(products[j][c]));
    }
    for (let c = 0; c < dim; c++) largestQuery = Math.max(largestQuery, Math.abs(q[c]));
    const keyX = LABEL, productX = keyX + dim * CELL + 16, scoreX = productX + dim * CELL + 16;
    neuron.width = scoreX + 180; neuron.height = (N + 2) * LINE + 4;
    const context = neuron.getContext("2d");
    context.clearRect(0, 0, neuron.width, neuron.height);
    context.font = "12px ui-monospace, Menlo, Consolas, monospace";
    context.textBaseline = "middle";
    context.fillStyle = "#222";
    context.fillText("q: " + TOKENS[t], 2, LINE / 2);
    for (let c = 0; c < dim; c++) {
      context.fillStyle = cellColour(q[c], largestQuery);
      context.fillRect(keyX + c * CELL, 1, CELL - 1, LINE - 2);
    }
    context.fillStyle = "#666";
    context.fillText("k", keyX, 1.5 * LINE); context.fillText("q \u00d7 k", productX, 1.5 * LINE);
    context.fillText("q\u00b7k/\u221ad   weight", scoreX, 1.5 * LINE);
    for (let j = 0; j < N; j++) {
      const rowY = (j + 2) * LINE;
      context.fillStyle = j === t ? "#c00" : "#222";
      context.fillText(TOKENS[j].slice(0, 14), 2, rowY + LINE / 2);
      for (let c = 0; c < dim; c++) {
        context.fillStyle = cellColour(keys[j][c], largestKey);
        context.fillRect(keyX + c * CELL, rowY + 1, CELL - 1, LINE - 2);
        context.fillStyle = cellColour(products[j][c], largestProduct);
        context.fillRect(productX + c * CELL, rowY + 1, CELL - 1, LINE - 2);
      }
      context.fillStyle = "#222";
      context.fillText(scores[j].toFixed(2), scoreX, rowY + LINE / 2);
      context.fillStyle = "#1f5fbf";
      context.fillRect(scoreX + 60, rowY + 2, 100 * weights[j], LINE - 4);
    }
    neuron.dataset.layer = String(l); neuron.dataset.head = String(h); neuron.dataset.token = String(t);
    neuron.dataset.weights = JSON.stringify(weights.map(function (w) { return Number(w.toFixed(4)); }));
  }

  layerSelect.addEventListener("change", function () { state.layer = Number(layerSelect.value); draw(); });
  headSelect.addEventListener("change", function () { state.head = headSelect.value; draw(); });
  neuronSelects.layer.value = String(state.layer);
  if (DATA.start_heads !== null) neuronSelects.head.value = String(DATA.start_heads[0]);
  draw();
  drawNeurons();
})();
</script>
</body>
</html>
"""
