"""Attention weights of every layer and head, rendered as one self-contained HTML page (after bertviz's head view).

Shapes: layers, heads, seq (tokens of the text, or of both texts of a pair, with [CLS] and [SEP]).
The page has no external resources: CSS, JavaScript and the weights (as JSON) are inline, so it opens offline.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bertforge.errors import InputError

# Enough for a long sentence pair; the page holds layers * heads * seq^2 weights, which grows fast beyond it.
DEFAULT_MAX_TOKENS = 128
# Decimals kept per weight in the page: lines fainter than 1/1000 are invisible anyway.
DECIMALS = 4


@dataclass
class AttentionMap:
    tokens_a: list[str]  # [CLS] A... [SEP]
    tokens_b: list[str]  # B... [SEP], or [] for a single text
    attentions: torch.Tensor  # (layers, heads, seq, seq): row = attending token, column = attended token


def encode_for_attention(tokenizer, text: str, pair: str | None = None, max_length: int = DEFAULT_MAX_TOKENS,
                         truncate: bool = True) -> dict[str, list]:
    """The tokenizer's row for a text (or pair), cut to `max_length` tokens (an InputError if not `truncate`)."""
    encoding = tokenizer(text, text_pair=pair, truncation=False)
    if len(encoding["input_ids"]) > max_length:
        if not truncate:
            raise InputError(f"the text is {len(encoding['input_ids'])} tokens long; the limit is {max_length}")
        encoding = tokenizer(text, text_pair=pair, truncation=True, max_length=max_length)
    return encoding


@torch.inference_mode()
def attention_weights(model, input_ids: list[int], token_type_ids: list[int]) -> torch.Tensor:
    """(layers, heads, seq, seq) attention probabilities for one row; `model` is a BertModel or has `.bert`."""
    encoder = getattr(model, "bert", model)
    output = encoder(torch.tensor([input_ids]), token_type_ids=torch.tensor([token_type_ids]), output_attentions=True)
    return torch.stack([layer[0] for layer in output.attentions]).float()


def attention_map(tokenizer, encoding: dict[str, list], attentions: torch.Tensor) -> AttentionMap:
    """Pair a row's tokens, split into segments A and B, with its attention weights."""
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    segments = encoding["token_type_ids"]
    split = segments.index(1) if 1 in segments else len(tokens)
    return AttentionMap(tokens[:split], tokens[split:], attentions)


def compute_attention(model, tokenizer, text: str, pair: str | None = None, max_length: int = DEFAULT_MAX_TOKENS,
                      truncate: bool = True) -> AttentionMap:
    """Tokens and attention weights of every layer for one text (or pair), ready for render_attention_map."""
    encoding = encode_for_attention(tokenizer, text, pair, max_length, truncate)
    return attention_map(tokenizer, encoding,
                         attention_weights(model, encoding["input_ids"], encoding["token_type_ids"]))


def _page_data(tokens_a: Sequence[str], tokens_b: Sequence[str], attentions) -> dict:
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
    return {
        "tokens": list(tokens_a) + list(tokens_b),
        "segment_b_start": len(tokens_a) if tokens_b else None,
        # In float64, so that 0.1234 prints as that and not as float32's 0.12340000271797180.
        "attention": weights.double().round(decimals=DECIMALS).tolist(),  # [layer][head][attending][attended]
    }


def _script_json(data: dict) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' can end the element or open a comment."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_attention_html(tokens_a: Sequence[str], tokens_b: Sequence[str], attentions,
                          title: str = "Attention") -> str:
    """A standalone HTML page showing `attentions` (layers, heads, seq, seq) between the tokens of A and B.

    `attentions` may also be the model's tuple of per-layer (1, heads, seq, seq) tensors, or nested lists.
    >>> page = render_attention_html(["[CLS]", "hi", "[SEP]"], [], torch.full((1, 2, 3, 3), 1 / 3))
    """
    values = {"TITLE": html.escape(title), "DATA": _script_json(_page_data(tokens_a, tokens_b, attentions))}
    # One pass, so that a title or token spelling a placeholder is never substituted itself.
    return re.sub(r"__(TITLE|DATA)__", lambda match: values[match.group(1)], PAGE)


def render_attention_map(attention: AttentionMap, title: str = "Attention") -> str:
    return render_attention_html(attention.tokens_a, attention.tokens_b, attention.attentions, title)


# The page. JavaScript reads the JSON block, draws one SVG line per (attending, attended) pair whose weight is at
# least MIN_WEIGHT (opacity and width = weight) and redraws on every control change or hover.
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 8px; }
  .controls { display: flex; gap: 16px; align-items: center; flex-wrap: wrap; margin-bottom: 8px; }
  .controls label { font-size: 14px; }
  .legend { display: flex; gap: 4px; flex-wrap: wrap; }
  .swatch { width: 22px; height: 16px; border: 2px solid transparent; cursor: pointer; font-size: 10px;
            color: #fff; text-align: center; line-height: 16px; border-radius: 3px; }
  .swatch.off { opacity: 0.2; }
  .hint { font-size: 12px; color: #666; margin: 4px 0 8px; }
  #view { display: block; }
  #view text { font-size: 13px; font-family: ui-monospace, Menlo, Consolas, monospace; cursor: default;
               dominant-baseline: middle; }
  #view text.segment-b { fill: #7a4a00; }
  #view rect.highlight { fill: #ff9800; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(92px, 1fr)); gap: 6px; margin-top: 12px;
          max-width: 900px; }
  .cell { text-align: center; font-size: 11px; cursor: pointer; }
  .cell canvas { width: 84px; height: 84px; border: 2px solid #ddd; image-rendering: pixelated; }
  .cell.selected canvas { border-color: #333; }
  .layout { display: flex; gap: 32px; align-items: flex-start; flex-wrap: wrap; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
<div class="controls">
  <label>Layer <select id="layer"></select></label>
  <label>Head <select id="head"></select></label>
  <div class="legend" id="legend" title="click a colour to show or hide that head in 'all heads' mode"></div>
</div>
<div class="hint">Left: attending tokens; right: attended tokens. Line opacity and width are the attention weight.
Hover a token to see only its attention.</div>
<div class="layout">
  <svg id="view" xmlns="http://www.w3.org/2000/svg"></svg>
  <div>
    <div class="hint">Every head of this layer (rows attend to columns); click one to select it.</div>
    <div class="grid" id="grid"></div>
  </div>
</div>
<script type="application/json" id="attention-data">__DATA__</script>
<script>
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("attention-data").textContent);
  const TOKENS = DATA.tokens, N = TOKENS.length;
  const LAYERS = DATA.attention.length, HEADS = DATA.attention[0].length;
  const MIN_WEIGHT = 0.01, ROW = 20, LEFT_X = 150, RIGHT_X = 370, WIDTH = 520, TOP = 10;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("view");
  const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
  const legend = document.getElementById("legend"), grid = document.getElementById("grid");
  const state = { layer: 0, head: "all", focus: null, hidden: new Set() };

  function headColour(h) { return "hsl(" + Math.round(360 * h / HEADS) + ", 75%, 45%)"; }
  function isB(i) { return DATA.segment_b_start !== null && i >= DATA.segment_b_start; }
  function element(name, attributes) {
    const node = document.createElementNS(SVG_NS, name);
    for (const key in attributes) node.setAttribute(key, attributes[key]);
    return node;
  }

  for (let l = 0; l < LAYERS; l++) layerSelect.add(new Option(String(l), String(l)));
  headSelect.add(new Option("all heads", "all"));
  for (let h = 0; h < HEADS; h++) headSelect.add(new Option(String(h), String(h)));
  for (let h = 0; h < HEADS; h++) {
    const swatch = document.createElement("div");
    swatch.className = "swatch";
    swatch.dataset.head = String(h);
    swatch.style.background = headColour(h);
    swatch.textContent = String(h);
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
      const weights = DATA.attention[state.layer][h];
      for (let i = 0; i < N; i++) {
        if (focus && focus.side === "left" && focus.index !== i) continue;
        for (let j = 0; j < N; j++) {
          if (focus && focus.side === "right" && focus.index !== j) continue;
          const w = weights[i][j];
          if (focus) {
            emphasis.right[j] = Math.max(emphasis.right[j], focus.side === "left" ? w : 0);
            emphasis.left[i] = Math.max(emphasis.left[i], focus.side === "right" ? w : 0);
          }
          if (w < MIN_WEIGHT) continue;
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
      canvas.width = N; canvas.height = N;
      const context = canvas.getContext("2d"), image = context.createImageData(N, N);
      const weights = DATA.attention[state.layer][h];
      for (let i = 0; i < N; i++) {
        for (let j = 0; j < N; j++) {
          const shade = 255 - Math.round(255 * Math.min(1, weights[i][j])), at = 4 * (i * N + j);
          image.data[at] = shade; image.data[at + 1] = shade; image.data[at + 2] = 255; image.data[at + 3] = 255;
        }
      }
      context.putImageData(image, 0, 0);
      const caption = document.createElement("div");
      caption.textContent = "head " + h;
      caption.style.color = headColour(h);
      cell.append(canvas, caption);
      cell.addEventListener("click", function () { state.head = String(h); headSelect.value = state.head; draw(); });
      grid.appendChild(cell);
    }
  }

  layerSelect.addEventListener("change", function () { state.layer = Number(layerSelect.value); draw(); });
  headSelect.addEventListener("change", function () { state.head = headSelect.value; draw(); });
  draw();
})();
</script>
</body>
</html>
"""
