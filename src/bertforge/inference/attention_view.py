"""Attention weights of every layer and head, rendered as one self-contained HTML page after bertviz's three views:
the head view (lines between tokens), the model view (every layer x head as a thumbnail) and the neuron view (the
query and key vectors of one head and their products, for a chosen token).

Shapes: layers, heads, seq (tokens of the text, or of both texts of a pair, with [CLS] and [SEP]), head_dim.
The page has no external resources: CSS, JavaScript and the weights (as JSON) are inline, so it opens offline.
Weights under MIN_WEIGHT are left out of the page (they draw nothing), so a long input's page stays small.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, overload

import torch

from bertforge.errors import ConfigError, InputError, check_choice
from bertforge.heads import encoder_of
from bertforge.model import BertModel, reads_packed_tokens
from bertforge.tokenizer import BertTokenizer
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
def attention_vectors(model, input_ids: list[int], token_type_ids: list[int]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row's (layers, heads, seq, seq) attention probabilities, and the queries and keys they come from, each
    (layers, heads, seq, head_dim), in one forward pass: the queries and keys are read by forward hooks on the
    attention's query and key projections (their outputs are (tokens, hidden): one row has no padding to pack).
    `model` is a BertModel or has `.bert`."""
    encoder = encoder_of(model)
    captured: dict[str, list[torch.Tensor]] = {"query": [], "key": []}
    caller = threading.get_ident()

    def capture(name: str):
        def hook(module, inputs, output):
            if threading.get_ident() == caller:  # not another thread's call on the shared model meanwhile
                captured[name].append(output.float().cpu())
        return reads_packed_tokens(hook)

    handles = [getattr(layer.attention, name).register_forward_hook(capture(name))
               for layer in encoder.encoder.layers for name in captured]
    device = next(encoder.parameters()).device
    try:
        output = encoder(torch.tensor([input_ids], device=device),
                         token_type_ids=torch.tensor([token_type_ids], device=device), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    heads = encoder.config.num_attention_heads
    queries, keys = (torch.stack([x.reshape(len(input_ids), heads, -1).transpose(0, 1) for x in captured[name]])
                     for name in ("query", "key"))
    return torch.stack([layer[0] for layer in output.attentions]).float().cpu(), queries, keys


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
    return attention_map(tokenizer, encoding, *attention_vectors(model, ids, segments))


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
        if not -count <= index < count:
            raise ConfigError(f"{name}: {index} is not one of the model's {count} (0 to {count - 1}, or from the "
                              f"end -1 to -{count})")
    return sorted({index % count for index in chosen})  # -1, as a Python index (and bertviz's), is the last


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
    return re.sub(r"__(TITLE|DATA|BEFORE|AFTER)__", lambda match: values[match.group(1)], page_template())


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
        # The title names the frame for a screen reader, which lists a notebook's frames by it.
        return (f'<iframe title="attention view" srcdoc="{html.escape(self.data, quote=True)}" style="width: 100%; '
                f'height: {self.height}px; border: 0"></iframe>')

    def __repr__(self) -> str:  # what display() prints outside a notebook: a line, not the page
        return f"<AttentionPage: {len(self.data):,} characters of HTML in .data>"


# html_action="return" gives the page, "view" nothing: said to type checkers, so that `.data` needs no check for None
@overload
def head_view(attention, tokens: Sequence[str], sentence_b_start: int | None = ..., prettify_tokens: bool = ...,
              layer: int | None = ..., heads: Sequence[int] | None = ..., include_layers: Sequence[int] | None = ...,
              *, html_action: Literal["return"]) -> AttentionPage: ...
@overload
def head_view(attention, tokens: Sequence[str], sentence_b_start: int | None = ..., prettify_tokens: bool = ...,
              layer: int | None = ..., heads: Sequence[int] | None = ..., include_layers: Sequence[int] | None = ...,
              html_action: str = ...) -> AttentionPage | None: ...
def head_view(attention, tokens: Sequence[str], sentence_b_start: int | None = None, prettify_tokens: bool = True,
              layer: int | None = None, heads: Sequence[int] | None = None,
              include_layers: Sequence[int] | None = None, html_action: str = "view") -> AttentionPage | None:
    """bertviz's head_view, drawn offline: lines from each token to those it attends to, one colour per head.

    `attention`: the model's `outputs.attentions` for one text (or (layers, heads, seq, seq)); `tokens` its tokens
    (tokenizer.convert_ids_to_tokens); `sentence_b_start`: where a pair's second text starts. `layer` and `heads`
    are selected when the page opens; `include_layers` keeps only those layers (-1: the last). html_action "view"
    shows the page in a notebook; "return" returns it (AttentionPage: `.data` is the HTML). The page stores each
    weight to DECIMALS places and leaves out those below MIN_WEIGHT, which draw nothing, where bertviz stores every
    weight whole: a page stays small (a weight itself is compute_attention's)."""
    tokens_a, tokens_b = _split_tokens(tokens, sentence_b_start, prettify_tokens)
    layout = PageLayout(views=("head",), layers=include_layers, start_layer=layer, start_heads=heads)
    return _shown(AttentionPage(render_attention_html(tokens_a, tokens_b, attention, "Attention", layout=layout)),
                  html_action)


@overload
def model_view(attention, tokens: Sequence[str], sentence_b_start: int | None = ..., prettify_tokens: bool = ...,
               display_mode: str = ..., include_layers: Sequence[int] | None = ...,
               include_heads: Sequence[int] | None = ..., *, html_action: Literal["return"]) -> AttentionPage: ...
@overload
def model_view(attention, tokens: Sequence[str], sentence_b_start: int | None = ..., prettify_tokens: bool = ...,
               display_mode: str = ..., include_layers: Sequence[int] | None = ...,
               include_heads: Sequence[int] | None = ..., html_action: str = ...) -> AttentionPage | None: ...
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


def neuron_view(model, *arguments: Any, model_type: str | None = None, **options: Any) -> AttentionPage | None:
    """bertviz's neuron view, drawn offline: the query of a chosen token against every token's key, their product,
    and the weight that gives. Called as bertviz's `neuron_view.show(model, model_type, tokenizer, sentence_a,
    sentence_b=None, display_mode="dark", layer=None, head=None, html_action="view")`, or without model_type
    (the model is BERT). `model` a bertforge model (BertModel, or one with `.bert`), whose queries and keys it
    reads; `layer` and `head` are selected when the page opens."""
    if arguments and isinstance(arguments[0], str):  # bertviz's order: the model type before the tokenizer
        if model_type is not None:
            raise ConfigError("model_type is given twice, by position and by name")
        model_type, arguments = arguments[0], arguments[1:]
    if model_type not in (None, "bert"):
        raise ConfigError(f"model_type {model_type!r}: this neuron view draws BERT models (model_type 'bert')")
    return _neuron_page(model, *arguments, **options)


def _neuron_page(model, tokenizer, sentence_a: str, sentence_b: str | None = None, display_mode: str = "dark",
                 layer: int | None = None, head: int | None = None, html_action: str = "view"
                 ) -> AttentionPage | None:
    if not isinstance(encoder_of(model), BertModel):
        raise ConfigError(f"neuron_view reads a bertforge model's queries and keys, not a {type(model).__name__}'s: "
                          f"load the checkpoint with bertforge.BertModel.from_pretrained(path)")
    if not isinstance(tokenizer, BertTokenizer):
        raise ConfigError(f"neuron_view takes bertforge's tokenizer, not a {type(tokenizer).__name__}: "
                          f"bertforge.BertTokenizer.from_pretrained(path)")
    sentence_b = sentence_b or None  # an empty second sentence is none, as bertviz reads it
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
@functools.cache
def page_template() -> str:
    """attention_view.html, beside this module: the page, with __TITLE__, __DATA__, __BEFORE__ and __AFTER__ to fill."""
    return resources.files("bertforge.inference").joinpath("attention_view.html").read_text(encoding="utf-8")
