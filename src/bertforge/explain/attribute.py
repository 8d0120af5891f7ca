"""explain(): attribute one prediction of a model to the words of the text the user gave."""

from __future__ import annotations

from bertforge.errors import InputError, check_choice
from bertforge.explain.faithfulness import faithfulness
from bertforge.explain.inner import masked_lm_views
from bertforge.explain.methods import DEFAULT_STEPS, MAX_STEPS, METHODS, USES_GRADIENTS, Attributions
from bertforge.explain.result import Explanation, TokenAttribution, WordAttribution
from bertforge.explain.targets import BASELINES, Row, build_target, explained_length, with_baseline
from bertforge.pretraining.heads import BertForMaskedLM
from bertforge.validation import check_number, check_within_positions


def explain(model, tokenizer, text: str, text_pair: str | None = None, target: str | int | None = None,
            method: str = "integrated_gradients", steps: int = DEFAULT_STEPS,
            max_length: int | None = None, baseline: str = "pad") -> Explanation:
    """Why did `model` say what it said about `text` (and `text_pair`)? Attributions per token and per word.

    `target` names what to explain (a label, an entity, "start", a token at [MASK]; default: the prediction);
    `method` is a name in METHODS; `steps` are integrated gradients' interpolation points (Shapley values' sampled
    orders, LIME's and SmoothGrad's samples); `max_length` defaults
    to what the model was fine-tuned with (its tokenizer's model_max_length), as `predict` reads; `baseline` (a
    name in BASELINES) is the token a word becomes where a method takes it away. A masked-LM model's
    explanation also holds, in `inner`, what each layer would predict at the [MASK] (see inner.py); an encoder's,
    explained by integrated gradients one text against the other, "baseline_scores": f(empty text, pair) and
    f(text, empty pair), whose sum less f(text, pair) is `baseline_score`.
    >>> explain(classifier, tokenizer, "a gripping, funny film").top_words(1)[0].word  # e.g. 'funny'
    """
    check_choice(method, METHODS, "method", error=InputError)
    check_choice(baseline, BASELINES, "baseline", error=InputError)
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    if text_pair is not None and not isinstance(text_pair, str):
        raise InputError(f"text_pair must be a string, got {type(text_pair).__name__}")
    check_number("steps", steps, integer=True)
    if not 1 <= steps <= MAX_STEPS:
        raise InputError(f"steps must be from 1 to {MAX_STEPS}, got {steps}")
    quantization = getattr(model, "quantization", None)
    if method in USES_GRADIENTS and quantization is not None and quantization.precision == "int8":
        raise InputError(f"{method} follows gradients, which int8 layers don't pass on (every attribution would "
                         "be 0): explain the fp32 model it was made from, or use occlusion, shapley, lime "
                         "or attention_rollout")
    check_within_positions(max_length, model.config.max_position_embeddings)
    max_length = max_length or explained_length(model, tokenizer)
    was_training = model.training
    model.eval()  # dropout off: f must be a function of the input
    try:
        chosen = build_target(model, tokenizer, text, text_pair, target, max_length)
        with_baseline(chosen.rows, tokenizer, baseline)
        attributions = METHODS[method](model, chosen, steps)
        inner = masked_lm_views(model, tokenizer, chosen.rows[0]) if isinstance(model, BertForMaskedLM) else {}
        if attributions.baseline_scores is not None:  # one baseline per text: each text against the other
            inner["baseline_scores"] = attributions.baseline_scores
        tokens, words = located(tokenizer, chosen.rows, attributions)
        faithful = faithfulness(model, chosen, ranked_words(chosen.rows, words))
    finally:
        model.train(was_training)
    texts = [text] if text_pair is None else [text, text_pair]
    for word in words:
        word.word = texts[word.text][word.start:word.end]
    return Explanation(method=method, baseline=baseline, target=chosen.name, targets=chosen.choices, texts=texts,
                       tokens=tokens, words=words, score=attributions.score, baseline_score=attributions.baseline_score,
                       completeness_gap=attributions.completeness_gap, steps=attributions.steps, inner=inner,
                       note="; ".join(filter(None, [chosen.note, unread(tokenizer, texts, chosen.rows)])) or None,
                       faithfulness=faithful)


def located(tokenizer, rows: list[Row], attributions: Attributions
            ) -> tuple[list[TokenAttribution], list[WordAttribution]]:
    """Tokens of every row in order, and words: each the span of its pieces, with their attributions summed."""
    tokens: list[TokenAttribution] = []
    words: list[WordAttribution] = []
    word_of: dict[tuple[int, int], int] = {}  # (text, word id) -> index in words
    for row, values in zip(rows, attributions.per_token):
        for token, value, source, span, word_id in zip(tokenizer.convert_ids_to_tokens(row.input_ids),
                                                       values.tolist(), row.texts, row.offsets, row.word_ids):
            index = None
            if source is not None:
                index = word_of.setdefault((source, word_id), len(words))
                if index == len(words):
                    words.append(WordAttribution("", 0.0, source, span[0], span[1], []))
                word = words[index]
                word.start, word.end = min(word.start, span[0]), max(word.end, span[1])
                word.attribution += value
                word.tokens.append(len(tokens))
            tokens.append(TokenAttribution(token, value, source, *(span or (None, None)), index))
    return tokens, words


def ranked_words(rows: list[Row], words: list[WordAttribution]) -> list[list[tuple[int, int]]]:
    """The words, most attributed first, each as its tokens' (row, position)."""
    row_and_position = [(row, position) for row, values in enumerate(rows) for position in range(len(values.input_ids))]
    return [[row_and_position[token] for token in word.tokens]
            for word in sorted(words, key=lambda word: -word.attribution)]


def unread(tokenizer, texts: list[str], rows: list[Row]) -> str | None:
    """Where the model reads part of a text (cut at max_length, or a window of it): how many of its words."""
    parts = []
    for number, text in enumerate(texts):
        words = tokenizer(text, truncation=False, add_special_tokens=False, return_word_ids=True)["word_ids"]
        total = len(set(words))
        read = len({word for row in rows for source, word in zip(row.texts, row.word_ids) if source == number})
        if read < total:
            parts.append(f"the model reads {read} of the {('text', 'pair')[number]}'s {total} words; the others "
                         "are not explained")
    return "; ".join(parts) or None
