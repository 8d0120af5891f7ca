"""Named-entity recognition (CoNLL-2003): tagged words <-> sub-word features, and token logits -> entities.

A word's tag is learned and predicted on its first sub-token; the other tokens carry IGNORE_INDEX. Sentences
longer than a window are split into overlapping windows of whole words, so every word gets a prediction.
With document context (BERT's CoNLL-2003 set-up) the rest of each window is filled with the tokens around the
sentence in its document, which are read but neither labelled nor predicted.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data_files import decode_text, read_bytes, split_lines
from bertforge.errors import ConfigError, InputError, check_choice, no_such_file
from bertforge.heads import IGNORE_INDEX
from bertforge.tasks.data import EncodeSettings, Features, listed
from bertforge.tasks.metrics import LabelScores, compute_metrics, entities, entity_scores
from bertforge.tasks.tables import (
    PLAIN_TEXT_COLUMN,
    ROW_FORMATS,
    find_column,
    read_table,
    stored_label_names,
    task_format,
)
from bertforge.validation import check_number

OUTSIDE = "O"
DOCUMENT_START = "-DOCSTART-"
# What fills a window besides the sentence: nothing, or the neighbouring sentences of its document.
CONTEXTS = ("sentence", "document")
# How word tags are read off the label probabilities (see predict_tags).
DECODINGS = ("argmax", "viterbi")
DEFAULT_STRIDE = 16  # words shared by consecutive windows of a sentence longer than max_length


@dataclass
class NerSettings(EncodeSettings):
    """NER's inputs and decoding; decoding is kept with them so that a fine-tuned model's predictions decode as its
    training run's did."""

    doc_stride: int = DEFAULT_STRIDE  # words shared by consecutive windows of a long sentence
    context: str = "sentence"  # a key of CONTEXTS: "document" fills each window with the sentences around it
    decoding: str = "argmax"  # a key of DECODINGS: "viterbi" reads the most probable valid IOB2 tag sequence

    def __post_init__(self):
        super().__post_init__()
        check_number("doc_stride", self.doc_stride, minimum=0, integer=True)
        check_choice(self.context, CONTEXTS, "context")
        check_choice(self.decoding, DECODINGS, "decoding")


@dataclass
class TaggedSentence:
    words: list[str]
    tags: list[str]  # one IOB2 tag per word; empty for sentences to predict
    document: int | None = None  # index of the document (-DOCSTART- block) in its file; None: a lone sentence
    source: str | None = None  # the user's text the words were found in; None: the words are the text (CoNLL)
    spans: list[tuple[int, int]] | None = None  # (start, end) of each word in `source`
    # The file line of each word (CoNLL), for messages; not part of what the sentence is.
    lines: list[int] | None = field(default=None, compare=False, repr=False)
    # The names the data's ClassLabel feature gives its tag numbers, in their order (see TextExample.label_names).
    label_names: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def text(self) -> str:
        """The text that entity character spans point into: the user's own, or the words joined by spaces."""
        return self.source if self.source is not None else " ".join(self.words)

    def word_spans(self) -> list[tuple[int, int]]:
        """(start, end) of every word in `text`."""
        if self.spans is not None:
            return self.spans
        return [(start, start + len(word)) for start, word in zip(_word_starts(self.words), self.words)]


@dataclass
class TokenFeatures:
    """One model input: [CLS] pieces of a run of whole words [SEP], with a label on each word's first piece."""

    input_ids: list[int]
    labels: list[int]  # label id on the first sub-token of each word, IGNORE_INDEX elsewhere
    sentence: int  # index of the sentence in the list that was encoded
    word_positions: dict[int, int]  # word index in the sentence -> position of its first sub-token


# --- reading ------------------------------------------------------------------------------------------------

# Tag prefixes of the entity schemes read (IOB1, IOB2, IOBES; BILOU's last and unit tags are IOBES' end and single).
ENTITY_PREFIXES = ("B", "I", "E", "S", "L", "U")
_BILOU_AS_IOBES = {"L": "E", "U": "S"}


def to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1, IOB2, IOBES or BILOU -> IOB2: every entity starts with B- and goes on with I-, whatever marked it.

    In IOB1, B- only separates two adjacent entities of one type, so an I- that follows O or another type
    begins an entity: ["I-PER", "I-PER", "O", "I-LOC", "B-LOC"] -> ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"];
    IOBES: ["S-LOC", "B-PER", "E-PER"] -> ["B-LOC", "B-PER", "I-PER"].
    """
    converted = [OUTSIDE] * len(tags)
    iobes = [_BILOU_AS_IOBES[tag[0]] + tag[1:] if tag[:1] in _BILOU_AS_IOBES and tag[1:2] == "-" else tag
             for tag in tags]
    for kind, first, last in entities(iobes):
        converted[first:last + 1] = [f"B-{kind}"] + [f"I-{kind}"] * (last - first)
    return converted


NOT_A_TAG = ("tag {tag!r} is not an entity tag (expected O, or B-TYPE and I-TYPE: IOB; E-, S- (IOBES) and L-, U- "
             "(BILOU) are read too)")


def _is_iob(tag: str) -> bool:
    return tag == OUTSIDE or (tag[:1] in ENTITY_PREFIXES and tag[1:2] == "-" and len(tag) > 2)


def read_conll(path: str | Path, labelled: bool = True) -> list[TaggedSentence]:
    """Sentences of a CoNLL file: one `word ... tag` line per token (the tag is the last column), a blank line
    between sentences, -DOCSTART- lines start a new document. IOB1 tags (the original CoNLL-2003 files), IOBES and
    BILOU become IOB2. Columns are separated by tabs in a line that has one (a word may then hold spaces), else by
    spaces. `labelled=False` (to predict) reads the words alone: a line may be just its word.

    "EU NNP B-NP I-ORG\\nrejects VBZ B-VP O\\n" -> [TaggedSentence(["EU", "rejects"], ["B-ORG", "O"])].
    """
    path = Path(path)
    try:
        # a byte-order mark is no part of the first word; CoNLL-2002's files are Latin-1: an error naming the line
        lines = split_lines(decode_text(read_bytes(path), path))
    except FileNotFoundError:
        raise no_such_file(path) from None
    except OSError as error:
        raise InputError(f"can't read the file ({error})", path) from None

    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    numbers: list[int] = []
    document = 0
    for number, line in enumerate(lines, start=1):
        columns = [column.strip() for column in line.split("\t" if "\t" in line else " ") if column.strip()]
        if not columns or columns[0] == DOCUMENT_START:
            if words:
                sentences.append(TaggedSentence(words, to_iob2(tags), document, lines=numbers))
            words, tags, numbers = [], [], []
            if columns and sentences and sentences[-1].document == document:
                document += 1
            continue
        words.append(columns[0])
        numbers.append(number)
        if not labelled:
            continue
        if len(columns) < 2:
            raise InputError(f"expected a word and its tag separated by whitespace, got {line.strip()!r}",
                             path, number)
        if not _is_iob(columns[-1]):
            raise InputError(NOT_A_TAG.format(tag=columns[-1]), path, number)
        tags.append(columns[-1])
    if words:
        sentences.append(TaggedSentence(words, to_iob2(tags), document, lines=numbers))
    return sentences


def collect_labels(sentences: Sequence[TaggedSentence]) -> dict[int, str]:
    """id2label of the tags in (training) sentences: "O" first, then sorted: {0: "O", 1: "B-LOC", 2: "B-PER", ...}."""
    tags = {tag for sentence in sentences for tag in sentence.tags} - {OUTSIDE}
    if not tags:
        raise InputError(f"ner needs tags other than {OUTSIDE} in the training data to learn from, found only "
                         f"{OUTSIDE}")
    return dict(enumerate([OUTSIDE, *sorted(tags)]))


# --- features -----------------------------------------------------------------------------------------------

def _word_starts(words: Sequence[str]) -> list[int]:
    """Where each word starts in " ".join(words): ["EU", "rejects"] -> [0, 3]."""
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    return starts


def _word_pieces(sentence: TaggedSentence, tokenizer) -> list[list[int]]:
    """The sub-token ids of every word, from one tokenizer call on the sentence's text.

    The tokenizer's own word ids count its basic words ("AL-AIN" is three of them), so tokens are mapped to
    our words by character offset instead. A word that tokenizes to nothing gets no pieces.
    """
    spans = sentence.word_spans()
    starts = [start for start, _ in spans]
    encoded = tokenizer(sentence.text, truncation=False, return_offsets_mapping=True)
    pieces: list[list[int]] = [[] for _ in spans]
    # [1:-1] drops [CLS] and [SEP].
    for token_id, (start, _) in zip(encoded["input_ids"][1:-1], encoded["offset_mapping"][1:-1]):
        word = bisect_right(starts, start) - 1
        if word >= 0 and start < spans[word][1]:  # a token between words (never, for CoNLL words) is skipped
            pieces[word].append(token_id)
    return pieces


def _windows(lengths: Sequence[int], budget: int, stride: int) -> list[tuple[int, int]]:
    """(first, stop) word ranges of at most `budget` pieces, consecutive ranges sharing `stride` words.

    (pieces per word [2, 1, 1, 3, 1], budget 4, stride 1) -> [(0, 3), (2, 4), (3, 5)]. A range always
    advances by at least one word; a word longer than the budget is a range of its own (cut later).
    """
    windows = []
    first = 0
    while True:
        stop, used = first, 0
        while stop < len(lengths) and (stop == first or used + lengths[stop] <= budget):
            used += lengths[stop]
            stop += 1
        windows.append((first, stop))
        if stop >= len(lengths):
            return windows
        first = max(first + 1, stop - stride)


def _documents(sentences: Sequence[TaggedSentence], pieces: Sequence[list[list[int]]]
               ) -> list[tuple[list[int], list[int]]]:
    """For each sentence, the sub-tokens of its whole document (one list, shared by the document's sentences)
    and where each of its words starts in that list, plus where the sentence ends (so that a sentence without
    words, such as an empty text to predict, still has a place).

    Consecutive sentences with the same `document` form a document; a sentence without one is its own.
    """
    located: list[tuple[list[int], list[int]]] = []
    tokens: list[int] = []
    for index, (sentence, words) in enumerate(zip(sentences, pieces)):
        if index == 0 or sentence.document is None or sentence.document != sentences[index - 1].document:
            tokens = []
        starts = []
        for word in words:
            starts.append(len(tokens))
            tokens += word
        located.append((tokens, starts + [len(tokens)]))
    return located


def _around(tokens: list[int], start: int, stop: int, room: int) -> tuple[list[int], list[int]]:
    """Up to `room` tokens from either side of tokens[start:stop], split evenly where both sides have enough."""
    left = min(start, room // 2)
    right = min(len(tokens) - stop, room - left)
    left = min(start, room - right)
    return tokens[start - left:start], tokens[stop:stop + right]


def token_features(sentences: Sequence[TaggedSentence], tokenizer, label2id: Mapping[str, int] | None = None,
                   max_length: int = 128, stride: int = 16, context: str = "sentence") -> list[TokenFeatures]:
    """Model inputs for sentences, one or more per sentence (in order); `label2id=None` for prediction.

    `stride` is the number of words shared by consecutive windows of a sentence that doesn't fit in
    `max_length` tokens. Example (default vocabulary), words ["Johanson", "lives", "in", "Washington"] tagged
    [B-PER, O, O, B-LOC]: tokens [CLS] johan ##son lives in washington [SEP] get labels
    [-100, B-PER, -100, O, O, B-LOC, -100]. With `context="document"` the tokens of the sentences before and
    after it in its document fill the window on both sides, with -100 labels.
    """
    if max_length < 3:
        raise ConfigError(f"max_length={max_length} leaves no room for a word between [CLS] and [SEP]")
    if stride < 0:
        raise ConfigError(f"stride must be at least 0 words, got {stride}")
    check_choice(context, CONTEXTS, "context")
    budget = max_length - 2
    pieces = [_word_pieces(sentence, tokenizer) for sentence in sentences]
    documents = _documents(sentences, pieces) if context == "document" else None
    features = []
    for index, sentence in enumerate(sentences):
        labels = _label_ids(sentence, label2id, index)
        for first, stop in _windows([len(p) for p in pieces[index]], budget, stride):
            window_ids, window_labels, positions = [], [], {}
            for word in range(first, stop):
                if not pieces[index][word]:
                    continue
                positions[word] = len(window_ids)
                window_ids += pieces[index][word]
                window_labels += [labels[word]] + [IGNORE_INDEX] * (len(pieces[index][word]) - 1)
            # Only a single word longer than the budget overflows here; its first piece, the labelled one, stays.
            window_ids, window_labels = window_ids[:budget], window_labels[:budget]
            before, after = [], []
            if documents is not None:
                tokens, starts = documents[index]
                before, after = _around(tokens, starts[first], starts[first] + len(window_ids),
                                        budget - len(window_ids))
            offset = 1 + len(before)  # [CLS] and the context before
            features.append(TokenFeatures(
                [tokenizer.cls_token_id, *before, *window_ids, *after, tokenizer.sep_token_id],
                [IGNORE_INDEX] * offset + window_labels + [IGNORE_INDEX] * (len(after) + 1),
                index, {word: offset + position for word, position in positions.items()}))
    return features


def _label_ids(sentence: TaggedSentence, label2id: Mapping[str, int] | None, index: int) -> list[int]:
    if label2id is None:
        return [IGNORE_INDEX] * len(sentence.words)
    if len(sentence.tags) != len(sentence.words):
        raise InputError(f"sentence {index + 1} has {len(sentence.words)} words but {len(sentence.tags)} tags")
    unknown = [word for word, tag in enumerate(sentence.tags) if tag not in label2id]
    if unknown:
        raise InputError(f"{_where(sentence, index, unknown[0])}: tag {sentence.tags[unknown[0]]!r} is not among "
                         f"the model's labels ({', '.join(label2id)})")
    return [label2id[tag] for tag in sentence.tags]


def _where(sentence: TaggedSentence, index: int, word: int) -> str:
    """Where a word is, for messages: its file line when the sentence was read from one, else the sentence's
    place (counted from 1) in the list given."""
    if sentence.lines is not None:
        return f"line {sentence.lines[word]}"
    return f"sentence {index + 1}"


# --- decoding -----------------------------------------------------------------------------------------------

def predict_tags(sentences: Sequence[TaggedSentence], features: Sequence[TokenFeatures],
                 logits: Sequence[torch.Tensor], id2label: Mapping[int, str], decoding: str = "argmax"
                 ) -> list[tuple[list[str], list[float]]]:
    """One (tags, probabilities) pair per sentence, one tag per word, from each feature's (seq, labels) logits.

    A word seen by several windows takes the prediction of the window where it is most central (where it has
    the most context on its nearer side). A word with no sub-tokens is "O" with probability 1.
    decoding: "argmax" tags each word with its most probable label; "viterbi" picks the most probable sequence
    of tags that is valid IOB2 (I-X only after B-X or I-X), from the same per-word probabilities.
    """
    check_choice(decoding, DECODINGS, "decoding")
    # Per sentence, per word: (context on the nearer side, feature index, position).
    best: list[dict[int, tuple[int, int, int]]] = [{} for _ in sentences]
    for feature_index, feature in enumerate(features):
        length = len(feature.input_ids)
        for word, position in feature.word_positions.items():
            context = min(position, length - 1 - position)
            if word not in best[feature.sentence] or context > best[feature.sentence][word][0]:
                best[feature.sentence][word] = (context, feature_index, position)

    outside = next(i for i, label in id2label.items() if label == OUTSIDE) if OUTSIDE in id2label.values() else None
    allowed = iob2_transitions(id2label).numpy() if decoding == "viterbi" else None
    # Every feature's per-token log-probabilities, one row per token of all features (numpy: the per-sentence
    # work below is many small operations, where torch's per-call cost would dominate).
    starts = [0, *accumulate(len(feature_logits) for feature_logits in logits)]  # each feature's first row
    rows = (torch.cat([feature_logits.float() for feature_logits in logits]).log_softmax(-1).numpy() if logits
            else np.zeros((0, len(id2label)), dtype=np.float32))
    predictions = []
    for sentence, chosen in zip(sentences, best):
        log_probs = np.full((len(sentence.words), len(id2label)), -np.inf, dtype=np.float32)
        words = list(chosen)
        log_probs[words] = rows[[starts[feature_index] + position for _, feature_index, position in chosen.values()]]
        if outside is not None and len(chosen) < len(sentence.words):
            seen = np.zeros(len(sentence.words), dtype=bool)
            seen[words] = True
            log_probs[~seen, outside] = 0.0
        labels = viterbi(log_probs, allowed) if allowed is not None else log_probs.argmax(-1).tolist()
        tags = [id2label[label] for label in labels]
        probabilities = np.exp(log_probs[np.arange(len(labels)), labels]).tolist()
        predictions.append((tags, probabilities))
    return predictions


def iob2_transitions(id2label: Mapping[int, str]) -> torch.Tensor:
    """(labels + 1, labels) booleans: may label j follow label i; the last row is the sentence start.
    IOB2 allows I-X only after B-X or I-X; labels that are not IOB are allowed anywhere."""
    labels = [id2label[i] for i in range(len(id2label))]
    allowed = torch.ones(len(labels) + 1, len(labels), dtype=torch.bool)
    for j, label in enumerate(labels):
        if label.startswith("I-"):
            allowed[:, j] = torch.tensor([previous in (f"B-{label[2:]}", label) for previous in labels] + [False])
    return allowed


def viterbi(log_probs, allowed) -> list[int]:
    """The label sequence of highest total log-probability among those `allowed` permits; (words, labels) in,
    as numpy arrays or CPU tensors."""
    log_probs, allowed = np.asarray(log_probs, dtype=np.float64), np.asarray(allowed, dtype=bool)
    if len(log_probs) == 0:
        return []
    forbidden = np.where(allowed, 0.0, -np.inf)
    score = log_probs[0] + forbidden[-1]
    backpointers = []
    for word_scores in log_probs[1:]:
        candidates = score[:, None] + forbidden[:-1]  # (previous, next)
        previous = candidates.argmax(0)
        score = candidates[previous, np.arange(len(previous))] + word_scores
        backpointers.append(previous)
    labels = [int(score.argmax())]
    for previous in reversed(backpointers):
        labels.append(int(previous[labels[-1]]))
    return labels[::-1]


def tagged_entities(sentence: TaggedSentence | Sequence[str], tags: Sequence[str],
                    probabilities: Sequence[float] | None = None) -> list[dict]:
    """Entities with character spans in the sentence's text (the user's own, or its words joined by spaces) and
    the mean word probability as score.

    (["John", "Smith", "lives", "in", "Paris"], ["B-PER", "I-PER", "O", "O", "B-LOC"]) ->
    [{"type": "PER", "text": "John Smith", "start": 0, "end": 10, "score": ...},
     {"type": "LOC", "text": "Paris", "start": 20, "end": 25, "score": ...}].
    """
    if not isinstance(sentence, TaggedSentence):
        sentence = TaggedSentence(list(sentence), [])
    text, spans = sentence.text, sentence.word_spans()
    probabilities = [1.0] * len(spans) if probabilities is None else probabilities
    # A checkpoint's labels without a chunk prefix (PER, LABEL_3) each mark an entity of that type, neighbours of
    # one type joining, as transformers' pipeline reads them.
    tags = [tag if tag == OUTSIDE or (len(tag) > 2 and tag[0] in "BIES" and tag[1] == "-") else f"I-{tag}"
            for tag in tags]
    found = []
    for type_, first, last in entities(tags):
        start, end = spans[first][0], spans[last][1]
        score = sum(probabilities[first:last + 1]) / (last - first + 1)
        found.append({"type": type_, "text": text[start:end], "start": start, "end": end, "score": score})
    return found


# --- the "ner" task (registry row): files -> examples -> Features -> answers -> metrics ------------------------

# Words, initialisms, numbers with points or slashes, and single punctuation marks, as CoNLL-2003 writes them:
# "U.S. troops' start-up rose 25.76 on 12/03, fine." -> U.S. troops ' start-up rose 25.76 on 12/03 , fine .
# A letter with the combining marks after it ("u\u0308" of a decomposed "ü", as macOS writes names) is one letter.
_MARKS = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]*"
_LETTER = rf"\w{_MARKS}"
_WORD = re.compile(rf"(?:{_LETTER}\.){{2,}}|\d+(?:[.,:/]\d+)+|(?:{_LETTER})+(?:[-'&](?:{_LETTER})+)*|\S{_MARKS}")


def sentence_from_text(text: str, text_pair: str | None = None) -> TaggedSentence:
    """A sentence to tag from raw text, split into words and punctuation as CoNLL-2003 tokenizes, each word
    remembering where it is in `text`, so that entity spans index the text as given (spaces, line breaks and all).

    "Jean-Luc  met U.S. staff." -> words Jean-Luc met U.S. staff . at (0, 8) (10, 13) (14, 18) (19, 24) (24, 25).
    """
    if text_pair is not None:
        raise InputError("named-entity recognition takes one text, not a pair")
    matches = list(_WORD.finditer(text))
    return TaggedSentence([match.group() for match in matches], [], source=text,
                          spans=[match.span() for match in matches])


def read_sentences(path: str | Path | Any, columns=None, id2label: Mapping[int, str] | None = None,
                   labelled: bool = True, settings=None, format: str | None = None) -> list[TaggedSentence]:
    """Sentences of a CoNLL file, or of rows of words and tags (JSON lines, Parquet, a datasets folder, or such rows
    in memory: see read_tagged_rows); to predict, also a text file with one sentence per line (data_format decides
    which a .txt file is, unless `format` says)."""
    kind = task_format(path, format, labelled, "named-entity recognition", ("conll", "CoNLL"),
                       ("txt", "text with one sentence per line"), rows="words and tags")
    if kind is None or kind in ROW_FORMATS:
        return read_tagged_rows(path, columns, id2label, labelled, kind)
    path = Path(path)
    if kind == "txt":
        lines = read_table(path, "txt").rows
        return [sentence_from_text(row[PLAIN_TEXT_COLUMN]) for _, row in lines]
    sentences = read_conll(path, labelled)
    if not sentences:
        raise InputError("the file has no sentences", path)
    if not labelled:
        return sentences
    if id2label is not None:
        known = set(id2label.values())
        for sentence in sentences:
            unknown = [word for word, tag in enumerate(sentence.tags) if tag not in known]
            if unknown:
                raise InputError(f"tag {sentence.tags[unknown[0]]!r} is not one of the model's labels "
                                 f"({', '.join(id2label.values())})", path, line=sentence.lines[unknown[0]])
    return sentences


# The columns of a row of words and tags when the column flags name none the data has: transformers' run_ner and
# the Hub's NER datasets (conll2003, wnut_17: "tokens", "ner_tags").
WORD_COLUMNS, TAG_COLUMNS = ("tokens", "words"), ("ner_tags", "tags")


def read_tagged_rows(data: Any, columns=None, id2label: Mapping[int, str] | None = None, labelled: bool = True,
                     format: str | None = None) -> list[TaggedSentence]:
    """Sentences from rows that each hold a sentence's words (a list) and, labelled, its tags (a list as long; IOB,
    IOBES or BILOU names, or numbers that the data's ClassLabel feature names). A row of the words ["-DOCSTART-"]
    starts a new document, as the line does in CoNLL.

    Numbers that nothing in the data names are refused, never read through a model's labels: the Hub's CoNLL-2003
    numbers its tags O, B-PER, I-PER, ..., and a model's own order is often another (sorted, or its trainer's)."""
    table = read_table(data, format)
    words_column = find_column(table, columns.text if columns else None, WORD_COLUMNS, "the words of each sentence")
    tags_column = find_column(table, columns.label if columns else None, TAG_COLUMNS,
                              "the tag of each word") if labelled else None
    names = stored_label_names(data, format).get(tags_column) if labelled else None
    declared = tuple(names) if names else None
    known = set(id2label.values()) if id2label is not None else None
    sentences, document = [], 0
    for line, row in table.rows:
        words = listed(row.get(words_column))
        if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
            raise table.error("expected a list of words (texts)", line, field=words_column)
        blank = next((index for index, word in enumerate(words) if not word.strip()), None)
        if blank is not None:  # a word of spaces alone (U+00A0 included) has no token to tag
            raise table.error(f"word {blank + 1} of the sentence is blank ({json.dumps(words[blank])}): a word has "
                              "characters other than spaces", line, field=words_column)
        if words == [DOCUMENT_START]:
            document += bool(sentences)
            continue
        if not words:
            continue  # an empty sentence, as a blank line
        tags = _row_tags(table, line, listed(row.get(tags_column)), len(words), names, tags_column) if labelled else []
        for tag in tags if known is not None else ():
            if tag not in known:
                raise table.error(f"tag {tag!r} is not one of the model's labels ({', '.join(id2label.values())})",
                                  line, field=tags_column)
        sentences.append(TaggedSentence([word.strip() for word in words], tags, document, lines=[line] * len(words),
                                        label_names=declared))
    if not sentences:
        raise table.error("no sentences")
    return sentences


def _row_tags(table, line: int, tags: Any, count: int, names: Sequence[str] | None, column: str) -> list[str]:
    """One row's tags as IOB2 names: as many as its words, numbers named by `names`."""
    if not isinstance(tags, list) or len(tags) != count:
        raise table.error(f"expected a list of {count} tag{'s' if count != 1 else ''}, one per word", line,
                          field=column)
    named = []
    for tag in tags:
        if isinstance(tag, int) and not isinstance(tag, bool):
            if names is None:
                raise table.error(f"tag {tag} is a number that nothing in the data names (a model's own label "
                                  "order need not be the data's): write the tags' names (B-PER), or read the datasets "
                                  "folder or Parquet file that keeps them", line, field=column)
            if not 0 <= tag < len(names):
                raise table.error(f"tag {tag} is not a label number (0 to {len(names) - 1})", line, field=column)
            tag = names[tag]
        if not isinstance(tag, str) or not _is_iob(tag):
            raise table.error(NOT_A_TAG.format(tag=tag), line, field=column)
        named.append(tag)
    return to_iob2(named)


def encode(tokenizer, sentences: Sequence[TaggedSentence], settings: NerSettings,
           id2label: Mapping[int, str]) -> Features:
    """One row per window ({input_ids[, labels]}); the TokenFeatures ride along as extras for decoding."""
    labelled = all(sentence.tags for sentence in sentences)
    label2id = {label: i for i, label in id2label.items()} if labelled else None
    windows = token_features(sentences, tokenizer, label2id, settings.max_length, settings.doc_stride,
                             settings.context)
    rows = [{"input_ids": w.input_ids, **({"labels": w.labels} if labelled else {})} for w in windows]
    index = [w.sentence for w in windows]
    split = sum(count > 1 for count in Counter(index).values())
    notes = [f"{split} of {len(sentences)} sentences were split into windows of max_length={settings.max_length}"
             ] if split else []
    return Features(rows, index, truncated=split, notes=notes, extras=windows, settings=settings)


def outputs(output) -> tuple[torch.Tensor, ...]:
    """(batch, seq, labels) logits: a tag's scores at every token."""
    return (output.logits,)


def decode(features: Features, sentences: Sequence[TaggedSentence], outputs: Sequence[tuple[torch.Tensor, ...]],
           config) -> list[dict]:
    """One answer per sentence from each row's (seq, labels) logits, decoded as the features' settings say
    (argmax or viterbi): {"entities": [{type, text, start, end, score}], "tags": one per word}."""
    decoding = features.settings.decoding if features.settings is not None else "argmax"
    tagged = predict_tags(sentences, features.extras, [row[0] for row in outputs], config.id2label, decoding)
    return [{"entities": tagged_entities(sentence, tags, probabilities), "tags": tags}
            for sentence, (tags, probabilities) in zip(sentences, tagged)]


def score(answers: Sequence[dict], sentences: Sequence[TaggedSentence], id2label=None) -> dict[str, float]:
    """Entity precision, recall and F1 (CoNLL's, seqeval's default mode), and the words' tag accuracy."""
    return compute_metrics("token_classification", [a["tags"] for a in answers], [s.tags for s in sentences])


def per_label(answers: Sequence[dict], sentences: Sequence[TaggedSentence],
              id2label=None) -> dict[str, LabelScores]:
    """Each entity type's precision, recall, F1 and support (its true entities), as seqeval's report."""
    return entity_scores([a["tags"] for a in answers], [s.tags for s in sentences])


def inputs(sentence: TaggedSentence) -> dict:
    """What a prediction echoes: the text that entity spans point into."""
    return {"text": sentence.text}
