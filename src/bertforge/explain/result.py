"""What an explanation holds: one attribution per token and per word, located in the text the user gave.

A token's span is a character range of its own text (the text, or the pair), from the tokenizer's offsets, so
`texts[span.text][start:end]` is the very characters the user wrote (accents, case and spacing kept). A word's
attribution is the sum of its pieces'; the sign says for (+) or against (-) the target.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from bertforge.explain.faithfulness import Faithfulness


@dataclass
class TokenAttribution:
    token: str  # the WordPiece ("##ing", "[CLS]")
    attribution: float
    text: int | None  # which input the token comes from: 0 the text, 1 the pair; None for [CLS], [SEP], ...
    start: int | None  # characters [start, end) of texts[text]; None for special tokens
    end: int | None
    word: int | None  # index into Explanation.words; None for special tokens


@dataclass
class WordAttribution:
    word: str  # texts[text][start:end], as the user wrote it
    attribution: float  # the sum of its tokens'
    text: int
    start: int
    end: int
    tokens: list[int]  # indices into Explanation.tokens


@dataclass
class Explanation:
    """Attributions of one prediction (`target`) to the input, by one method."""

    method: str
    target: str  # what was explained: "positive", "PER: John Smith", "answer: Denver Broncos", "similarity"
    targets: list[str]  # the targets this model offers for this input (any of them can be asked for)
    texts: list[str]  # the text, and the pair when there is one
    tokens: list[TokenAttribution]
    words: list[WordAttribution]
    score: float | None  # f(x): the explained output (a logit, a score, a similarity)
    baseline_score: float | None = None  # f(baseline), for integrated gradients
    completeness_gap: float | None = None  # f(x) - f(baseline) - sum of attributions; None where it has no meaning
    steps: int | None = None
    inner: dict = field(default_factory=dict)  # extra views (the masked-LM layer predictions)
    note: str | None = None  # what to know of the target: a multi-label model's label under its threshold
    faithfulness: Faithfulness | None = None  # f without the top words and with them alone, beside random words
    baseline: str = "pad"  # the token a word becomes where the method takes it away (targets.BASELINES)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=1)

    def top_words(self, count: int) -> list[WordAttribution]:
        """The `count` words that speak most for the target."""
        return sorted(self.words, key=lambda word: -word.attribution)[:count]


def faithfulness_line(measured: Faithfulness) -> str:
    """One line for people: the AOPC figures beside random words'."""
    return (f"f without the top words falls {measured.aopc_comprehensiveness:.3g} (random words: "
            f"{measured.aopc_random_comprehensiveness:.3g}); with them alone {measured.aopc_sufficiency:.3g} "
            f"(random: {measured.aopc_random_sufficiency:.3g}) (ERASER's comprehensiveness and sufficiency, "
            f"averaged over {', '.join(f'{fraction:.0%}' for fraction in measured.fractions)} of the words)")
