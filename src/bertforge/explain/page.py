"""The explanation page: the user's text with every word shaded by its attribution (green for the target, red
against), above the attention views of attention_view.py (head, model and neuron views) and, for a masked-LM
model, what every layer predicts at the [MASK] and how each token's vector changes across layers. One offline file.
"""

from __future__ import annotations

import html

from bertforge.explain.attribute import explain
from bertforge.explain.methods import DEFAULT_STEPS, UNSIGNED
from bertforge.explain.result import Explanation, faithfulness_line
from bertforge.explain.targets import explained_length
from bertforge.inference.attention_view import DEFAULT_MAX_TOKENS, compute_attention, render_attention_map
from bertforge.model import BertModel

STYLE = """<style>
  #explanation .summary { font-size: 14px; margin-bottom: 6px; }
  #explanation .texts { max-height: 40vh; padding: 8px; }
  #explanation .text { white-space: pre-wrap; line-height: 1.9; font-size: 15px; margin: 0 0 10px; }
  #explanation .text-name { font-size: 12px; color: #666; }
  #explanation .word { border-radius: 3px; padding: 1px 0; }
  table.inner { border-collapse: collapse; font-size: 12px; }
  table.inner td, table.inner th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
</style>"""


def shade(value: float, largest: float) -> str:
    """A background for an attribution: green for, red against, stronger as |value| nears the largest one."""
    strength = min(1.0, abs(value) / largest) if largest > 0 else 0.0
    colour = "22, 150, 60" if value >= 0 else "230, 60, 60"  # both keep dark text at 4.5:1 when strongest
    return f"rgba({colour}, {0.75 * strength:.3f})"


def shaded_text(explanation: Explanation, text: int) -> str:
    """The text exactly as the user gave it, each word a <span> shaded by its attribution."""
    source = explanation.texts[text]
    largest = max((abs(word.attribution) for word in explanation.words), default=0.0)
    parts, cursor = [], 0
    for index, word in enumerate(explanation.words):
        if word.text != text:
            continue
        parts.append(html.escape(source[cursor:word.start]))
        parts.append(f'<span class="word" data-word="{index}" data-attribution="{word.attribution:.6g}" '
                     f'title="{word.attribution:+.4g}" style="background: {shade(word.attribution, largest)}">'
                     f'{html.escape(word.word)}</span>')
        cursor = word.end
    parts.append(html.escape(source[cursor:]))
    return "".join(parts)


def summary(explanation: Explanation) -> str:
    facts = [f"explained: <b>{html.escape(explanation.target)}</b>"
             + (f" ({html.escape(explanation.note)})" if explanation.note else ""), f"method: {explanation.method}"]
    if explanation.score is not None:
        facts.append(f"f(x) = {explanation.score:.4g}")
    if "baseline_scores" in explanation.inner:  # each text against the other: one baseline per text
        empty_text, empty_pair = explanation.inner["baseline_scores"]
        facts.append(f"f(empty text, pair) = {empty_text:.4g}, f(text, empty pair) = {empty_pair:.4g}")
    elif explanation.baseline_score is not None:
        facts.append(f"f(baseline: {html.escape(explanation.baseline)}) = {explanation.baseline_score:.4g}")
    if explanation.completeness_gap is not None:
        how = (f"{explanation.steps} steps" if explanation.method == "integrated_gradients" else
               f"{explanation.steps} sampled orders" if explanation.steps else "every order")  # Shapley values'
        facts.append(f"completeness gap = {explanation.completeness_gap:.3g} ({how})")
    elif explanation.steps:  # LIME's and SmoothGrad's, which sum to nothing in particular
        facts.append(f"{explanation.steps} samples")
    if explanation.faithfulness is not None:
        facts.append(html.escape(faithfulness_line(explanation.faithfulness)))
    others = [html.escape(name) for name in explanation.targets if name != explanation.target]
    if others:
        facts.append("other targets: " + ", ".join(others))
    return " &middot; ".join(facts)


def attribution_section(explanation: Explanation) -> str:
    names = ["text", "pair"]
    texts = "".join(f'<div class="text-name">{names[i]}</div><p class="text" data-text="{i}">'
                    f'{shaded_text(explanation, i)}</p>' for i in range(len(explanation.texts)))
    hint = ("The greener a word, the more it counts (this method has no for or against)"
            if explanation.method in UNSIGNED else "Green words speak for the target, red ones against it")
    return (f'{STYLE}\n<section id="explanation"><h2>Attributions</h2>\n<div class="summary">{summary(explanation)}'
            f'</div>\n<div class="hint">{hint}; hover a word for its attribution, or open the table below.</div>\n'
            # A long text scrolls in its box, which holds nothing focusable: the box takes the focus, so the keyboard
            # scrolls it too (WCAG 2.1.1).
            f'<div class="scroll texts" tabindex="0" role="region" aria-label="the texts, shaded by attribution">'
            f'{texts}</div>{attribution_table(explanation)}</section>')


def attribution_table(explanation: Explanation) -> str:
    """Every word's attribution as text: the shading is colour alone, and a word's title shows on hover only."""
    names = ["text", "pair"]
    rows = "".join(f"<tr><td>{names[word.text]}</td><td>{html.escape(word.word)}</td>"
                   f"<td>{word.attribution:+.4g}</td></tr>" for word in explanation.words)
    return ('<details><summary>Every word\'s attribution as a table</summary><table class="inner attributions">'
            f'<tr><th scope="col">text</th><th scope="col">word</th><th scope="col">attribution</th></tr>{rows}'
            '</table></details>')


def inner_section(inner: dict) -> str:
    """Tables of the masked-LM views; empty for other models."""
    if "layer_predictions" not in inner:
        return ""
    parts = ['<section id="inner"><h2>Inside the model</h2>']
    tokens = inner["tokens"]
    for prediction in inner["layer_predictions"]:
        rows = "".join(f"<tr><th>{'embeddings' if layer == 0 else f'layer {layer}'}</th>"
                       + "".join(f"<td>{html.escape(token)} {probability:.2f}</td>" for token, probability in top)
                       + "</tr>" for layer, top in enumerate(prediction["layers"]))
        parts.append(f'<div class="hint">What each layer would predict at [MASK] (token {prediction["position"]}), '
                     f'the MLM head applied to its output:</div><table class="inner layer-predictions">{rows}</table>')
    layers = len(inner["layer_similarity"][0]) if inner["layer_similarity"] else 0
    header = "<tr><th>token</th>" + "".join(f"<th>{layer}</th>" for layer in range(1, layers + 1)) + "</tr>"
    rows = "".join(f"<tr><th>{html.escape(token)}</th>" + "".join(
        f'<td style="background: {shade(1 - value, 1.0)}">{value:.2f}</td>' for value in values) + "</tr>"
        for token, values in zip(tokens, inner["layer_similarity"]))
    parts.append('<div class="hint">How similar each token\'s vector is to its vector one layer below (cosine); '
                 'greener where a layer changes it more:</div>'
                 '<div class="scroll" tabindex="0" role="region" aria-label="similarity of each token across layers">'
                 f'<table class="inner layer-similarity">{header}{rows}</table></div></section>')
    return "\n".join(parts)


def explanation_page(model, tokenizer, explanation: Explanation, max_length: int | None = None,
                     attention_max_length: int = DEFAULT_MAX_TOKENS) -> str:
    """One self-contained HTML page: the attributions, then the attention views of the explained input (for two
    texts compared by an encoder, of the first), read as `explain` read it (see its `max_length`) up to
    `attention_max_length` tokens, as the attention viewer's page grows with the square of its tokens."""
    max_length = max_length or explained_length(model, tokenizer)
    pair = None if type(model) is BertModel or len(explanation.texts) == 1 else explanation.texts[1]
    attention = compute_attention(model, tokenizer, explanation.texts[0], pair,
                                  max_length=min(max_length, attention_max_length))
    read = len(tokenizer(explanation.texts[0], pair, truncation=True, max_length=max_length)["input_ids"])
    shown = len(attention.tokens_a) + len(attention.tokens_b)
    cut = (f'<div class="hint" id="attention-cut">The attention views below read the input cut to {shown} of its '
           f'{read} tokens: a page of them all would grow with the square of their number.</div>'
           if shown < read else "")
    title = f"Why {explanation.target}? {explanation.texts[0][:60]}"
    return render_attention_map(attention, title, before=attribution_section(explanation) + cut,
                                after=inner_section(explanation.inner))


def explained(model, tokenizer, text: str, text_pair: str | None = None, target: str | None = None,
              method: str = "integrated_gradients", steps: int | None = None,
              max_length: int | None = None, as_page: bool = False, baseline: str = "pad",
              attention_max_length: int = DEFAULT_MAX_TOKENS) -> dict | str:
    """What `/explain` answers: the explanation as a JSON-ready dict, or (`as_page`) its page."""
    explanation = explain(model, tokenizer, text, text_pair, target, method, steps or DEFAULT_STEPS, max_length,
                          baseline)
    if as_page:
        return explanation_page(model, tokenizer, explanation, max_length, attention_max_length)
    return explanation.to_dict()
