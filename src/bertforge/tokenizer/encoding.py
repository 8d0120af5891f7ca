"""From tokens to model rows: truncation (or overflowing windows), [CLS] A [SEP] (B [SEP]), padding, tensors.

The tokenizer turns each text into `Tokens` (ids, and where asked their offsets and word ids); this module makes
the rows transformers' BertTokenizerFast makes of them, with its options: truncation strategies and side,
`return_overflowing_tokens` with `stride`, padding strategies, side and `pad_to_multiple_of`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from bertforge.batching import pad_lists, padding_for
from bertforge.errors import BertforgeError, ConfigError, InputError
from bertforge.windows import window_starts


def _longest_first(first: int, second: int | None, budget: int) -> tuple[int, int | None]:
    """Shorten the longer sequence; if both exceed half the budget, halve it (an odd token goes to the
    longer one, or to the second when they tie, as in tokenizers). (10, 3, 8) -> (5, 3); (10, 10, 7) -> (3, 4)."""
    if second is None:
        return budget, None
    shorter = min(first, second)
    if 2 * shorter <= budget:
        return min(first, budget - shorter), min(second, budget - shorter)
    half, odd = divmod(budget, 2)
    return (half + odd, half) if first > second else (half, half + odd)


def _only_first(first: int, second: int | None, budget: int) -> tuple[int, int | None]:
    """Shorten only the first sequence, which must keep at least one token. (10, 3, 8) -> (5, 3)."""
    excess = first + (second or 0) - budget
    if first <= excess:
        raise InputError(f"truncation='only_first' can't fit: the first text has {first} tokens and "
                         f"{excess} must go; use 'longest_first' or a larger max_length")
    return first - excess, second


def _only_second(first: int, second: int | None, budget: int) -> tuple[int, int | None]:
    """Shorten only the second sequence, which must keep at least one token. (3, 10, 8) -> (3, 5)."""
    if second is None:
        raise InputError("truncation='only_second' needs a text_pair")
    excess = first + second - budget
    if second <= excess:
        raise InputError(f"truncation='only_second' can't fit: the second text has {second} tokens and "
                         f"{excess} must go; use 'longest_first' or a larger max_length")
    return first, second - excess


# name -> (first length, second length or None, token budget) -> lengths to keep; called only when over budget.
TRUNCATION_STRATEGIES: dict[str, Callable[[int, int | None, int], tuple[int, int | None]]] = {
    "longest_first": _longest_first,
    "only_first": _only_first,
    "only_second": _only_second,
}
PADDING_STRATEGIES = ("do_not_pad", "longest", "max_length")
SIDES = ("right", "left")


@dataclass
class Tokens:
    """One text's tokens, without special tokens: ids, and (when asked) character offsets and word indices."""

    ids: list[int]
    offsets: list[tuple[int, int]] | None = None
    word_ids: list[int] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def part(self, start: int, end: int) -> Tokens:
        def cut(values):
            return None if values is None else values[start:end]
        return Tokens(self.ids[start:end], cut(self.offsets), cut(self.word_ids))


@dataclass(frozen=True)
class Truncation:
    """How rows are made to fit `max_length`: a strategy name (None: never cut), the side tokens go from, and with
    `overflow`, the tokens cut off become further rows that repeat `stride` tokens of the one before."""

    max_length: int
    strategy: str | None = "longest_first"
    side: str = "right"
    overflow: bool = False
    stride: int = 0


def truncation_strategy(truncation: bool | str | None) -> str | None:
    """True (and None, bertforge's default: rows fit the model) -> 'longest_first', False -> no truncation; names are
    checked against the table."""
    if truncation is True or truncation is None:
        return "longest_first"
    if truncation is False or truncation == "do_not_truncate":
        return None
    if truncation not in TRUNCATION_STRATEGIES:
        raise ConfigError(f"unknown truncation {truncation!r}; expected True, False or one of "
                          f"{list(TRUNCATION_STRATEGIES)}")
    return truncation


def padding_strategy(padding: bool | str | None) -> str:
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return "do_not_pad"
    if padding not in PADDING_STRATEGIES:
        raise ConfigError(f"unknown padding {padding!r}; expected True, False or one of {list(PADDING_STRATEGIES)}")
    return padding


def check_side(name: str, side: str) -> str:
    if side not in SIDES:
        raise ConfigError(f"{name} must be 'right' or 'left', got {side!r}")
    return side


def _windows(tokens: Tokens | None, keep: int | None, truncation: Truncation) -> list[Tokens | None]:
    """The parts of one sequence that rows hold: itself when it fits in `keep`, else its first (or, cutting from
    the left, last) `keep` tokens, and with overflow the windows after it, `stride` tokens shared between
    neighbours (transformers' order: from the kept end outwards)."""
    if tokens is None or keep is None or len(tokens) <= keep:
        return [tokens]
    if keep == 0 and not truncation.overflow:  # the other sequence took the room: this one is cut away
        return [tokens.part(0, 0)]
    if keep == 0:  # windows of no token would never end
        raise InputError(f"max_length={truncation.max_length} leaves no room for a window of this sequence beside "
                         "the special tokens and the other sequence: give a larger max_length")
    if truncation.stride >= keep:  # (without overflow too: the reference refuses it, by a panic)
        raise InputError(f"stride={truncation.stride} must be smaller than the {keep} tokens a window keeps of "
                         f"a sequence (max_length={truncation.max_length})")
    starts = window_starts(len(tokens), keep, truncation.stride) if truncation.overflow else [0]
    if truncation.side == "right":
        return [tokens.part(start, min(start + keep, len(tokens))) for start in starts]
    return [tokens.part(max(len(tokens) - start - keep, 0), len(tokens) - start) for start in starts]


def truncated_pairs(first: Tokens, second: Tokens | None, truncation: Truncation, add_special_tokens: bool = True
                    ) -> list[tuple[Tokens, Tokens | None]]:
    """(first, second) of each row: one, or with overflow one per window, in tokenizers' order when both
    sequences overflow: (A0, B0), then each later window of A with every window of B, then A0 with B's later
    windows. max_length counts the [CLS] and [SEP]s the rows get, if they get them."""
    n_special = (2 if second is None else 3) if add_special_tokens else 0
    if truncation.strategy is None:
        return [(first, second)]
    budget = truncation.max_length - n_special
    if budget < 0:
        raise InputError(f"max_length={truncation.max_length} leaves no room for the {n_special} special tokens")
    # A stride as long as the room is refused only where a text is cut (by _windows), as transformers does.
    if truncation.stride > budget:
        raise InputError(f"stride={truncation.stride} must be smaller than the {budget} tokens max_length="
                         f"{truncation.max_length} leaves for text")
    n_first, n_second = len(first), (len(second) if second is not None else None)
    if n_first + (n_second or 0) <= budget:  # fits: nothing to cut, whatever the strategy says
        return [(first, second)]
    keep_first, keep_second = TRUNCATION_STRATEGIES[truncation.strategy](n_first, n_second, budget)
    firsts, seconds = _windows(first, keep_first, truncation), _windows(second, keep_second, truncation)
    rows = [(firsts[0], seconds[0])]
    rows += [(a, b) for a in firsts[1:] for b in seconds]
    rows += [(firsts[0], b) for b in seconds[1:]]
    return rows


def with_special_tokens(first: Tokens, second: Tokens | None, cls_id: int, sep_id: int, details: bool,
                        add: bool = True) -> dict[str, list]:
    """[CLS] A [SEP] (B [SEP]) with segment ids and the attention mask; offsets (0, 0) and word id None for the
    special tokens when `details`. `add=False`: A (B) alone, B's tokens still in segment 1."""
    cls, sep, no_offset, no_word = ([cls_id], [sep_id], [(0, 0)], [None]) if add else ([], [], [], [])
    ids = cls + first.ids + sep
    n_first = len(ids)
    if second is not None:
        ids += second.ids + sep
    row: dict[str, list] = {
        "input_ids": ids,
        "token_type_ids": [0] * n_first + [1] * (len(ids) - n_first),
        "attention_mask": [1] * len(ids),
    }
    if details:
        row["offset_mapping"] = (no_offset + first.offsets + no_offset
                                 + (second.offsets + no_offset if second is not None else []))
        row["word_ids"] = no_word + first.word_ids + no_word + (second.word_ids + no_word if second is not None else [])
    return row


def special_tokens_mask(token_type_ids: list[int], added: bool = True) -> list[int]:
    """1 at the template's [CLS] and [SEP]s (when `added`), 0 at the texts' tokens (added special tokens in a
    text count as text, as in transformers); padding adds 1s."""
    mask = [0] * len(token_type_ids)
    if added:
        n_first = token_type_ids.count(0)
        mask[0] = mask[n_first - 1] = mask[-1] = 1
    return mask


def pad_columns(columns: dict[str, list[list]], pad_token_id: int, padding: str, max_length: int | None,
                pad_to_multiple_of: int | None = None, side: str = "right") -> None:
    """Pad every per-token column in place to the longest row ('longest') or to max_length ('max_length'),
    rounded up to a multiple of `pad_to_multiple_of`; rows already as long are left alone."""
    if padding == "do_not_pad" or not columns:
        return
    if padding == "max_length":
        if max_length is None:
            raise ConfigError("padding='max_length' needs a max_length")
        target = max_length
    else:
        target = max(map(len, next(iter(columns.values()))), default=0)
    if pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    for name, rows in columns.items():
        pad_lists(rows, target, padding_for(name, pad_token_id), left=side == "left")


TENSOR_KINDS = (None, "pt", "np")


def check_tensor_kind(return_tensors: str | None) -> None:
    if return_tensors not in TENSOR_KINDS:
        raise ConfigError(f"return_tensors must be None, 'pt' (torch) or 'np' (numpy), got {return_tensors!r}")


# The columns the tokenizer makes: per-token ones (padded with the others) and per-row counts, all integers.
TOKEN_COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "offset_mapping",
                 "word_ids")
INTEGER_COLUMNS = (*TOKEN_COLUMNS, "overflow_to_sample_mapping", "length")


def to_tensors(columns: dict[str, list], kind: str | None = "pt") -> dict[str, Any]:
    """return_tensors='pt' or 'np': the tokenizer's columns torch.long tensors or int64 arrays (word ids, which
    hold None, stay lists), any other (a data collator's labels) of the type its values have, as transformers makes
    them (a regression target stays a float); None: the lists as they are."""
    if kind is None:
        return columns
    lengths = {len(row) for row in columns.get("input_ids", [])}
    if len(lengths) > 1:
        raise BertforgeError(f"return_tensors={kind!r} needs rows of one length, got lengths from {min(lengths)} "
                             f"to {max(lengths)}; pass padding=True")
    if kind == "np":
        import numpy

        make = lambda rows, integers: numpy.array(rows, dtype=numpy.int64 if integers else None)
    else:
        import torch

        make = lambda rows, integers: torch.tensor(rows, dtype=torch.long if integers else None)
    tensors = {}
    for name, rows in columns.items():
        try:
            tensors[name] = rows if name == "word_ids" else make(rows, name in INTEGER_COLUMNS)
        except (TypeError, ValueError) as error:
            raise BertforgeError(f"return_tensors={kind!r}: can't make one tensor of the {name!r} values "
                                 f"(rows of several lengths?): {error}") from None
    return tensors


class CharSpan(NamedTuple):
    """Characters start:end of a text (transformers' CharSpan)."""
    start: int
    end: int


class TokenSpan(NamedTuple):
    """Tokens start:end of a row (transformers' TokenSpan)."""
    start: int
    end: int


# The columns a row's Encoding reads (besides tokens, offsets, word and sequence ids), as the tokenizer's alignment
# call computes them whatever the original call asked for.
ENCODING_COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask",
                    "overflow_to_sample_mapping")


class Encoding:
    """One row of a BatchEncoding as the tokenizers library's Encoding presents it (`batch.encodings[i]`): ids,
    type_ids, tokens, offsets ((0, 0) for special tokens and padding), attention_mask, special_tokens_mask (padding
    included), word_ids, sequence_ids, n_sequences, and its alignment methods on this row, which answer as
    BatchEncoding's do but with tuples. The first window of a text cut with return_overflowing_tokens lists the
    others as `overflowing`."""

    def __init__(self, batch: BatchEncoding, row: int):
        self._batch, self._row = batch, row

    def _get(self, name: str) -> list:
        return self._batch._aligned()[name][self._row]

    ids = property(lambda self: self._get("input_ids"))
    type_ids = property(lambda self: self._get("token_type_ids"))
    attention_mask = property(lambda self: self._get("attention_mask"))
    special_tokens_mask = property(lambda self: self._get("special_tokens_mask"))
    tokens = property(lambda self: self._get("tokens"))
    offsets = property(lambda self: self._get("offset_mapping"))
    word_ids = property(lambda self: self._get("word_ids"))
    words = word_ids  # the tokenizers library's older name
    sequence_ids = property(lambda self: self._get("sequence_ids"))

    n_sequences = property(lambda self: self._get("n_sequences"))

    @property
    def overflowing(self) -> list[Encoding]:
        samples = self._batch._aligned().get("overflow_to_sample_mapping")
        if samples is None or (self._row > 0 and samples[self._row - 1] == samples[self._row]):
            return []
        return [Encoding(self._batch, row) for row in range(self._row + 1, len(samples))
                if samples[row] == samples[self._row]]

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Encoding(num_tokens={len(self)})"

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        span = self._batch.token_to_chars(self._row, token_index)
        return None if span is None else tuple(span)

    def token_to_word(self, token_index: int) -> int | None:
        return self._batch.token_to_word(self._row, token_index)

    def token_to_sequence(self, token_index: int) -> int | None:
        return self._batch.token_to_sequence(self._row, token_index)

    def char_to_token(self, char_pos: int, sequence_index: int = 0) -> int | None:
        return self._batch.char_to_token(self._row, char_pos, sequence_index)

    def char_to_word(self, char_pos: int, sequence_index: int = 0) -> int | None:
        return self._batch.char_to_word(self._row, char_pos, sequence_index)

    def word_to_tokens(self, word_index: int, sequence_index: int = 0) -> tuple[int, int] | None:
        span = self._batch.word_to_tokens(self._row, word_index, sequence_index)
        return None if span is None else tuple(span)

    def word_to_chars(self, word_index: int, sequence_index: int = 0) -> tuple[int, int] | None:
        span = self._batch.word_to_chars(self._row, word_index, sequence_index)
        return None if span is None else tuple(span)


class BatchEncoding(dict):
    """The tokenizer's output: a dict of input_ids, token_type_ids, attention_mask (and offset_mapping,
    overflow_to_sample_mapping, ... when asked), flat lists for one text, lists of lists for a batch, or tensors.

    Where each token came from, as transformers' fast tokenizers answer it: `word_ids(i)`, `tokens(i)`,
    `sequence_ids(i)` (0 for the text's tokens, 1 for the pair's, None for special tokens and padding),
    `token_to_chars`, `char_to_token`, `word_to_tokens`, `word_to_chars`, `token_to_word`, `char_to_word`,
    `token_to_sequence`. Each takes (row, index), or the index alone for row 0; character positions count in the
    sequence's own text. `encodings`: each row as the tokenizers library's Encoding (see Encoding). What the call
    didn't ask for is computed on first use.
    """

    is_fast = True

    def __init__(self, data: dict[str, Any], word_ids: list[list[int | None]] | None = None,
                 align: Callable[[], dict[str, list]] | None = None):
        super().__init__(data)
        self._word_ids = word_ids
        self._align = align
        self._alignment: dict[str, list] | None = None

    def __getitem__(self, key: str | int | slice) -> Any:
        """A column by name; by position, as transformers' fast encodings answer it, row i's Encoding (a slice: a
        list of them)."""
        if isinstance(key, int | slice):
            return self.encodings[key]
        return super().__getitem__(key)

    @property
    def data(self) -> dict[str, Any]:
        """The columns as a plain dict (transformers' BatchEncoding.data)."""
        return dict(self)

    def convert_to_tensors(self, tensor_type: str | None = None) -> BatchEncoding:
        """The columns as tensors in place ('pt': torch, 'np': numpy), as return_tensors would have made them."""
        check_tensor_kind(tensor_type)
        lists = {name: value.tolist() if hasattr(value, "tolist") else value for name, value in self.items()}
        self.update(to_tensors(lists, tensor_type))
        return self

    def __reduce__(self) -> tuple:
        """Pickled (as a DataLoader's worker processes send their batches) with where its tokens came from worked
        out first: the function that works it out on first use is the tokenizer's own and stays behind."""
        alignment = self._aligned() if self._align is not None or self._alignment is not None else None
        return _unpickled_encoding, (dict(self), self._word_ids, alignment)

    def _aligned(self) -> dict[str, list]:
        """Per row: tokens, offset_mapping, word_ids and sequence_ids."""
        if self._alignment is None:
            if self._align is None:
                raise BertforgeError("this encoding does not know where its tokens came from (pad's output)")
            self._alignment = self._align()
        return self._alignment

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        if self._word_ids is not None:
            return self._word_ids[batch_index]
        return self._aligned()["word_ids"][batch_index]

    def tokens(self, batch_index: int = 0) -> list[str]:
        return self._aligned()["tokens"][batch_index]

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._aligned()["sequence_ids"][batch_index]

    @property
    def encodings(self) -> list[Encoding]:
        return [Encoding(self, row) for row in range(len(self._aligned()["tokens"]))]

    @property
    def n_sequences(self) -> int:
        """1 for texts, 2 for pairs (the most of any row)."""
        return max(self._aligned()["n_sequences"], default=1)

    def _token(self, row: int, token: int) -> int | None:
        """The row's token at `token`, a negative one counted from the end (as transformers' BatchEncoding reads
        it); None past either end, where the tokenizers library answers None rather than failing."""
        length = len(self.sequence_ids(row))
        token += length if token < 0 else 0
        return token if 0 <= token < length else None

    def token_to_sequence(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        row, token = _row_and_index(batch_or_token_index, token_index)
        token = self._token(row, token)
        return None if token is None else self.sequence_ids(row)[token]

    def token_to_word(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        row, token = _row_and_index(batch_or_token_index, token_index)
        token = self._token(row, token)
        return None if token is None else self.word_ids(row)[token]

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> CharSpan | None:
        """The characters a token came from; None for a special token or padding."""
        row, token = _row_and_index(batch_or_token_index, token_index)
        token = self._token(row, token)
        if token is None or self.sequence_ids(row)[token] is None:
            return None
        return CharSpan(*self._aligned()["offset_mapping"][row][token])

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None,
                      sequence_index: int = 0) -> int | None:
        """The token of the sequence's character; None where no token holds it (a space)."""
        row, char = _row_and_index(batch_or_char_index, char_index)
        offsets = self._aligned()["offset_mapping"][row]
        return next((token for token in self._sequence_tokens(row, sequence_index)
                     if offsets[token][0] <= char < offsets[token][1]), None)

    def _sequence_tokens(self, row: int, sequence_index: int) -> list[int] | range:
        """The tokens of the row's sequence `sequence_index`, none for a pair's text that gave no tokens. A sequence
        the row doesn't have (a single text asked about its pair) is the whole row, as in the tokenizers library."""
        sequences = self.sequence_ids(row)
        if not 0 <= sequence_index < self._aligned()["n_sequences"][row]:
            return range(len(sequences))
        return [token for token, sequence in enumerate(sequences) if sequence == sequence_index]

    def word_to_tokens(self, batch_or_word_index: int, word_index: int | None = None,
                       sequence_index: int = 0) -> TokenSpan | None:
        """The tokens a word of the sequence became; None for a word the row doesn't hold (cut off)."""
        row, word = _row_and_index(batch_or_word_index, word_index)
        word_ids, tokens = self.word_ids(row), []
        for token in self._sequence_tokens(row, sequence_index):
            if word_ids[token] is not None and word_ids[token] > word:
                break  # the tokenizers library reads up to the first later word (a whole pair: its first text)
            if word_ids[token] == word:
                tokens.append(token)
        return TokenSpan(tokens[0], tokens[-1] + 1) if tokens else None

    def word_to_chars(self, batch_or_word_index: int, word_index: int | None = None,
                      sequence_index: int = 0) -> CharSpan | None:
        row, word = _row_and_index(batch_or_word_index, word_index)
        span = self.word_to_tokens(row, word, sequence_index)
        if span is None:
            return None
        offsets = self._aligned()["offset_mapping"][row]
        return CharSpan(offsets[span.start][0], offsets[span.end - 1][1])

    def char_to_word(self, batch_or_char_index: int, char_index: int | None = None,
                     sequence_index: int = 0) -> int | None:
        row, char = _row_and_index(batch_or_char_index, char_index)
        token = self.char_to_token(row, char, sequence_index)
        return None if token is None else self.word_ids(row)[token]

    def __getattr__(self, name: str) -> Any:
        """encoding.input_ids, as transformers allows."""
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> BatchEncoding:
        """Tensors moved to `device` (model(**encoding.to("cuda")))."""
        moved = {name: value.to(device) if hasattr(value, "to") else value for name, value in self.items()}
        return BatchEncoding(moved, self._word_ids, self._align)


def _unpickled_encoding(data: dict[str, Any], word_ids: list[list[int | None]] | None,
                        alignment: dict[str, list] | None) -> BatchEncoding:
    encoding = BatchEncoding(data, word_ids)
    encoding._alignment = alignment
    return encoding


def _row_and_index(row_or_index: int, index: int | None) -> tuple[int, int]:
    """transformers' convention for the alignment methods: (row, index), or the index alone in row 0."""
    return (0, row_or_index) if index is None else (row_or_index, index)


def sequence_ids(special_tokens_mask: list[int], token_type_ids: list[int]) -> list[int | None]:
    """Which text each token came from: its segment, None for [CLS], [SEP] and padding."""
    return [None if special else segment for special, segment in zip(special_tokens_mask, token_type_ids)]


def rows_of(values: Any) -> list:
    """A column given as a tensor, or as a list of lists, arrays or tensors -> a list (of lists)."""
    if hasattr(values, "tolist"):
        return values.tolist()
    return [row.tolist() if hasattr(row, "tolist") else row for row in values]


def flat_index(groups: list[int]) -> list[int]:
    """overflow_to_sample_mapping: [2, 1] rows from texts 0 and 1 -> [0, 0, 1]."""
    return list(itertools.chain.from_iterable([index] * count for index, count in enumerate(groups)))
