"""BertTokenizer: texts or text pairs -> input_ids, token_type_ids, attention_mask (+ offsets, word ids).

Gives the same encodings as transformers' BertTokenizerFast, added tokens included; loads and saves the files
transformers does (tokenizer/files.py).
"""

from __future__ import annotations

import bisect
import itertools
import numbers
from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

from bertforge.batching import pad_lists, padding_for
from bertforge.errors import BertforgeError, ConfigError, InputError
from bertforge.tokenizer.added import AddedToken, AddedTokens
from bertforge.tokenizer.basic import BasicTokenizer
from bertforge.tokenizer.files import DEFAULT_MAX_LENGTH, SETTINGS, read_tokenizer_files, write_tokenizer_files
from bertforge.tokenizer.vocab import Vocab
from bertforge.tokenizer.wordpiece import CONTINUATION, MAX_WORD_CHARS, WordPiece, WordPieceCache
from bertforge.validation import check_number

# The reference's WordPiece decoder glues these onto the previous token (applied token by token).
DECODE_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                  (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


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


class BatchEncoding(dict):
    """The tokenizer's output: a dict of input_ids, token_type_ids, attention_mask (and offset_mapping,
    word_ids when asked), flat lists for one text, lists of lists for a batch, or tensors.

    `word_ids(i)` gives the word index of each token of sequence i (None for special and padding tokens),
    computing them on first use when the call didn't ask for them.
    """

    def __init__(self, data: dict[str, Any], word_ids: list[list[int | None]] | None = None,
                 compute_word_ids: Callable[[], list[list[int | None]]] | None = None):
        super().__init__(data)
        self._word_ids = word_ids
        self._compute_word_ids = compute_word_ids

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        if self._word_ids is None:
            if self._compute_word_ids is None:
                raise BertforgeError("this encoding has no word ids")
            self._word_ids = self._compute_word_ids()
        return self._word_ids[batch_index]


class SplitWords(str):
    """A text given as words already split (`is_split_into_words`): the words joined by spaces, which the basic
    tokenizer splits at anyway, and where each word starts."""

    starts: list[int]

    @classmethod
    def of(cls, words: Sequence[str]) -> SplitWords:
        if isinstance(words, str) or not all(isinstance(word, str) for word in words):
            raise InputError("with is_split_into_words, a text is a list of words (strings)")
        text = cls(" ".join(words))
        text.starts = list(itertools.accumulate((len(word) + 1 for word in words[:-1]), initial=0))
        return text

    def word_at(self, position: int) -> int:
        """The index of the word that holds character `position` of the joined text."""
        return bisect.bisect_right(self.starts, position) - 1


class BertTokenizer:
    """BERT's tokenizer: basic tokenization, then WordPiece, then [CLS] A [SEP] (B [SEP]).

    >>> tokenizer = BertTokenizer.from_pretrained("default")
    >>> tokenizer.tokenize("Unaffable café owners!")
    ['una', '##ffa', '##ble', 'cafe', 'owners', '!']
    >>> tokenizer("Hi there", text_pair="Bye")["token_type_ids"]
    [0, 0, 0, 0, 1, 1]
    """

    def __init__(self, vocab: Vocab | str | Path, do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, model_max_length: int = DEFAULT_MAX_LENGTH,
                 added_tokens: dict[int, AddedToken] | None = None, max_word_chars: int = MAX_WORD_CHARS):
        """`added_tokens`: id -> AddedToken, matched whole before basic tokenization (the special tokens of the
        vocabulary are added tokens too, as in transformers); ids past the vocabulary extend it."""
        self.vocab = vocab if isinstance(vocab, Vocab) else Vocab.from_file(vocab)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.max_word_chars = max_word_chars
        self.added_tokens = dict(added_tokens or {})
        self.basic = BasicTokenizer(lowercase=do_lower_case, strip_accents=strip_accents,
                                    split_cjk=tokenize_chinese_chars)
        for token_id, token in sorted(self.added_tokens.items()):
            # As in the reference, a normalized token reads back as it is matched ('Zürich' -> 'zurich'), but
            # convert_tokens_to_ids still knows it by what was added.
            shown = self.basic.normalize(token.content)[0] if token.normalized else token.content
            self.vocab.add(token.content, token_id, shown)
        listed = {token.content for token in self.added_tokens.values()}
        for role, content in self.vocab.special_tokens.items():
            if content not in listed and self.vocab.has_special(role):
                self.added_tokens[self.vocab.token_to_id[content]] = AddedToken(content, special=True,
                                                                                normalized=False)
        self.wordpiece = WordPiece(self.vocab, max_word_chars)
        self._pieces = WordPieceCache(self.wordpiece)
        self._added = AddedTokens(self.added_tokens, self.basic.normalize)

    # ---------------------------------------------------------------- loading and saving

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **settings: Any) -> BertTokenizer:
        """Load the tokenizer files of a model directory (tokenizer.json or vocab.txt, tokenizer_config.json,
        special_tokens_map.json, added_tokens.json) or 'default'.

        Keyword arguments override the saved settings: from_pretrained("default", do_lower_case=False).
        """
        from bertforge.checkpoint.default_model import resolve_model_dir

        directory = resolve_model_dir(name_or_path)
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown tokenizer setting {unknown[0]!r}; expected one of {list(SETTINGS)}")
        files = read_tokenizer_files(directory)
        chosen = files.settings | settings
        _check_settings(chosen, directory / "tokenizer_config.json")
        return cls(files.vocab, **chosen, added_tokens=files.added_tokens, max_word_chars=files.max_word_chars)

    def save_pretrained(self, directory: str | Path, model_max_length: int | None = None) -> None:
        """Write the tokenizer files transformers writes (readable by from_pretrained and by transformers).

        `model_max_length` records another length than this tokenizer's, e.g. the max_length a model was
        fine-tuned with, which transformers then truncates to (with truncation=True).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_tokenizer_files(self, directory, model_max_length)

    # ---------------------------------------------------------------- vocabulary

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def cls_token_id(self) -> int:
        return self.vocab.cls_token_id

    @property
    def sep_token_id(self) -> int:
        return self.vocab.sep_token_id

    @property
    def pad_token_id(self) -> int:
        return self.vocab.pad_token_id

    @property
    def mask_token_id(self) -> int:
        return self.vocab.mask_token_id

    @property
    def unk_token_id(self) -> int:
        return self.vocab.unk_token_id

    @property
    def all_special_ids(self) -> list[int]:
        """In transformers' order: [UNK], [SEP], [PAD], [CLS], [MASK] (those the vocabulary has), then the
        added special tokens."""
        roles = [self.vocab.special_id(role) for role in ("unk_token", "sep_token", "pad_token", "cls_token",
                                                           "mask_token") if self.vocab.has_special(role)]
        return roles + [token_id for token_id, token in sorted(self.added_tokens.items())
                        if token.special and token_id not in roles]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """'hello' -> 7592; unknown tokens -> the [UNK] id."""
        unk = self.unk_token_id
        if isinstance(tokens, str):
            return self.vocab.token_to_id.get(tokens, unk)
        return [self.vocab.token_to_id.get(token, unk) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """7592 -> 'hello'; accepts a list or a 1-d tensor of ids."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        if isinstance(ids, int):
            return self._token(ids)
        return [self._token(i) for i in ids]

    def _token(self, token_id: int) -> str:
        if not isinstance(token_id, numbers.Integral):
            raise InputError(f"expected token ids (integers), got {token_id!r:.40}")
        if not 0 <= token_id < len(self.vocab):
            raise InputError(f"token id {token_id} is outside the vocabulary (0..{len(self.vocab) - 1})")
        return self.vocab.id_to_token[token_id]

    # ---------------------------------------------------------------- text <-> tokens

    def tokenize(self, text: str) -> list[str]:
        """'Unaffable café owners!' -> ['una', '##ffa', '##ble', 'cafe', 'owners', '!'] (no [CLS]/[SEP])."""
        return [self.vocab.id_to_token[i] for i in self._encode_ids(text)]

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text, "##" pieces glued to their word: [101, 7592, 999, 102] -> 'hello!'. Takes one id, a list
        or a 1-d tensor (a batch: `batch_decode`).

        Matches transformers' decode for BERT (its WordPiece decoder with clean-up): words are joined by
        spaces and '.', '?', '!', ',' attach to the word before; lower-casing and accents are not undone.
        """
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        if isinstance(ids, int):
            ids = [ids]
        if any(not isinstance(token_id, numbers.Integral) for token_id in ids):
            raise InputError("decode takes one sequence of token ids; for several, use batch_decode")
        return self.convert_tokens_to_string(self.convert_ids_to_tokens(ids), skip_special_tokens)

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """One text per row of ids (lists, or a 2-d tensor)."""
        sequences = sequences.tolist() if hasattr(sequences, "tolist") else sequences
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def convert_tokens_to_string(self, tokens: Sequence[str], skip_special_tokens: bool = False) -> str:
        """['hello', '##s', '!'] -> 'hellos!' (decode's joining, on tokens)."""
        if skip_special_tokens:
            special = {self.vocab.id_to_token[token_id] for token_id in self.all_special_ids}
            tokens = [token for token in tokens if token not in special]
        pieces = []
        for index, token in enumerate(tokens):
            if index > 0:
                token = token[len(CONTINUATION):] if token.startswith(CONTINUATION) else " " + token
            for dirty, clean in DECODE_CLEANUP:
                token = token.replace(dirty, clean)
            pieces.append(token)
        return "".join(pieces)

    def encode(self, text: str, text_pair: str | None = None, **options: Any) -> list[int]:
        """The input ids of one text (or pair), [CLS] and [SEP] included: `self(text, text_pair)["input_ids"]`."""
        if not isinstance(text, str):
            raise InputError("encode takes one text; for a batch, call the tokenizer")
        return self(text, text_pair, **options)["input_ids"]

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""
        return dict(self.vocab.token_to_id)

    def _encode_ids(self, text: str) -> list[int]:
        """The ids of a text, without [CLS]/[SEP]; stays in C for known words when it holds no added token."""
        if not self._added.may_match(text):
            pieces = map(self._pieces.__getitem__, self.basic.split(text))
            return list(chain.from_iterable(map(itemgetter(0), pieces)))
        ids: list[int] = []
        for start, end, token_id in self._added.split(text):
            if token_id is not None:
                ids.append(token_id)
            else:
                ids += chain.from_iterable(self._pieces[word][0] for word in self.basic.split(text[start:end]))
        return ids

    def _words(self, text: str) -> list[tuple[str, int, tuple[int, ...] | None, int | None]]:
        """The text's words (BasicTokenizer.split_with_offsets) and added tokens (their id last, else None)."""
        if not self._added.may_match(text):
            return [(word, start, origins, None) for word, start, origins in self.basic.split_with_offsets(text)]
        words = []
        for start, end, token_id in self._added.split(text):
            if token_id is not None:
                words.append((text[start:end], start, None, token_id))
                continue
            for word, offset, origins in self.basic.split_with_offsets(text[start:end]):
                shifted = tuple(start + origin for origin in origins) if origins is not None else None
                words.append((word, start + offset, shifted, None))
        return words

    def _encode_details(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """Ids, character offsets into `text` and word index of every token (no special tokens)."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        word_ids: list[int] = []
        for index, (word, start, origins, added_id) in enumerate(self._words(text)):
            if added_id is not None:
                ids.append(added_id)
                word_ids.append(index)
                offsets.append((start, start + len(word)))
                continue
            piece_ids, spans = self._pieces[word]
            ids += piece_ids
            word_ids += [index] * len(piece_ids)
            if origins is None:
                offsets += [(start + begin, start + end) for begin, end in spans]
            else:
                # A piece covers the original characters its first and last normalised characters came from.
                offsets += [(origins[begin], origins[end - 1] + 1) for begin, end in spans]
        if isinstance(text, SplitWords):  # the given words, and positions within each
            word_ids = [text.word_at(start) for start, _ in offsets]
            offsets = [(start - text.starts[word], end - text.starts[word])
                       for (start, end), word in zip(offsets, word_ids)]
        return ids, offsets, word_ids

    # ---------------------------------------------------------------- encoding

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
                 max_length: int | None = None, truncation: bool | str = True, padding: bool | str = False,
                 return_offsets_mapping: bool = False, return_word_ids: bool = False,
                 return_tensors: str | None = None, is_split_into_words: bool = False) -> BatchEncoding:
        """Encode one text (flat lists) or a batch (lists of lists); pairs become [CLS] A [SEP] B [SEP].

        max_length defaults to model_max_length; truncation is True/'longest_first', 'only_first',
        'only_second' or False; padding is False, True/'longest' or 'max_length'; return_tensors='pt'
        gives torch.long tensors. Offsets are (start, end) character positions in the original text,
        (0, 0) for [CLS], [SEP] and padding. With `is_split_into_words`, a text is a list of words (a CoNLL
        sentence): word ids number those words, and offsets are positions within each word, as in transformers.
        """
        if is_split_into_words:
            is_batch = bool(text) and not isinstance(text[0], str)
            texts = [SplitWords.of(words) for words in (text if is_batch else [text])]
            pairs = None
            if text_pair is not None:
                pairs = [SplitWords.of(words) for words in (text_pair if is_batch else [text_pair])]
                if len(pairs) != len(texts):
                    raise InputError(f"got {len(texts)} texts but {len(pairs)} text pairs")
        else:
            is_batch = not isinstance(text, str)
            texts = [text] if not is_batch else list(text)
            pairs = _pairs_like(texts, text_pair, is_batch)
        max_length = self.model_max_length if max_length is None else max_length
        strategy = _truncation_strategy(truncation)
        padding = _padding_strategy(padding)
        if return_tensors not in (None, "pt"):
            raise ConfigError(f"return_tensors must be None or 'pt', got {return_tensors!r}")

        with_details = return_offsets_mapping or return_word_ids
        rows = [self._encode_row(first, second, max_length, strategy, with_details)
                for first, second in zip(texts, pairs or [None] * len(texts))]
        columns = {name: [row[name] for row in rows] for name in rows[0]} if rows else \
            {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        if padding != "do_not_pad":
            target = max_length if padding == "max_length" else max(map(len, columns["input_ids"]), default=0)
            for name, rows in columns.items():
                pad_lists(rows, target, padding_for(name, self.pad_token_id))

        word_ids = columns.pop("word_ids", None)
        offsets = columns.pop("offset_mapping", None)
        if return_offsets_mapping:
            columns["offset_mapping"] = offsets
        if return_word_ids:
            columns["word_ids"] = word_ids
        if return_tensors == "pt":
            columns = _to_tensors(columns)
        elif not is_batch:
            columns = {name: values[0] for name, values in columns.items()}

        def compute_word_ids() -> list[list[int | None]]:
            return self(text, text_pair, max_length, truncation, padding, return_word_ids=True,
                        is_split_into_words=is_split_into_words)._word_ids

        return BatchEncoding(columns, word_ids, None if word_ids is not None else compute_word_ids)

    def _encode_row(self, text: str, pair: str | None, max_length: int, strategy: str | None,
                    with_details: bool) -> dict[str, list]:
        """One [CLS] A [SEP] (B [SEP]) row, truncated to max_length."""
        for value in (text, pair):
            if value is not None and not isinstance(value, str):
                raise InputError(f"texts must be strings, got {type(value).__name__}")
        if with_details:
            first = self._encode_details(text)
            second = self._encode_details(pair) if pair is not None else None
        else:
            first = (self._encode_ids(text), None, None)
            second = (self._encode_ids(pair), None, None) if pair is not None else None

        if strategy is not None:
            n_special = 2 if second is None else 3
            budget = max_length - n_special
            if budget < 0:
                raise InputError(f"max_length={max_length} leaves no room for the {n_special} special tokens")
            n_first, n_second = len(first[0]), (len(second[0]) if second is not None else None)
            if n_first + (n_second or 0) > budget:
                keep_first, keep_second = TRUNCATION_STRATEGIES[strategy](n_first, n_second, budget)
                first = tuple(part[:keep_first] if part is not None else None for part in first)
                if second is not None:
                    second = tuple(part[:keep_second] if part is not None else None for part in second)
            elif strategy == "only_second" and second is None:
                raise InputError("truncation='only_second' needs a text_pair")

        cls, sep = [self.cls_token_id], [self.sep_token_id]
        ids = cls + first[0] + sep
        n_first = len(ids)
        if second is not None:
            ids += second[0] + sep
        row: dict[str, list] = {
            "input_ids": ids,
            "token_type_ids": [0] * n_first + [1] * (len(ids) - n_first),
            "attention_mask": [1] * len(ids),
        }
        if with_details:
            none = [(0, 0)]
            row["offset_mapping"] = none + first[1] + none + (second[1] + none if second is not None else [])
            row["word_ids"] = [None] + first[2] + [None] + (second[2] + [None] if second is not None else [])
        return row


def _pairs_like(texts: list[str], text_pair: str | Sequence[str] | None, is_batch: bool) -> list[str] | None:
    if text_pair is None:
        return None
    if isinstance(text_pair, str) != (not is_batch):
        raise InputError("text and text_pair must both be strings or both be lists of strings")
    pairs = [text_pair] if not is_batch else list(text_pair)
    if len(pairs) != len(texts):
        raise InputError(f"got {len(texts)} texts but {len(pairs)} text pairs")
    return pairs


def _truncation_strategy(truncation: bool | str | None) -> str | None:
    """True -> 'longest_first', False/None -> no truncation; names are checked against the table."""
    if truncation is True:
        return "longest_first"
    if truncation is False or truncation is None or truncation == "do_not_truncate":
        return None
    if truncation not in TRUNCATION_STRATEGIES:
        raise ConfigError(f"unknown truncation {truncation!r}; expected True, False or one of "
                          f"{list(TRUNCATION_STRATEGIES)}")
    return truncation


def _padding_strategy(padding: bool | str | None) -> str:
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return "do_not_pad"
    if padding not in PADDING_STRATEGIES:
        raise ConfigError(f"unknown padding {padding!r}; expected True, False or one of {list(PADDING_STRATEGIES)}")
    return padding


def _to_tensors(columns: dict[str, list]) -> dict[str, Any]:
    import torch

    lengths = {len(row) for row in columns["input_ids"]}
    if len(lengths) > 1:
        raise BertforgeError(f"return_tensors='pt' needs rows of one length, got lengths from {min(lengths)} "
                             f"to {max(lengths)}; pass padding=True")
    tensors: dict[str, Any] = {}
    for name, rows in columns.items():
        # word_ids hold None for special tokens, which no integer tensor can: they stay lists.
        tensors[name] = rows if name == "word_ids" else torch.tensor(rows, dtype=torch.long)
    return tensors


def _check_settings(settings: dict[str, Any], source: Path) -> None:
    """Flags must be true/false (the string "no" is truthy), model_max_length a positive integer."""
    for key in ("do_lower_case", "tokenize_chinese_chars", "strip_accents"):
        value = settings.get(key, False)
        if not isinstance(value, bool) and not (key == "strip_accents" and value is None):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
    if "model_max_length" in settings:
        try:
            check_number("model_max_length", settings["model_max_length"], minimum=1, integer=True)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None
