"""BertTokenizer: texts or text pairs -> input_ids, token_type_ids, attention_mask (+ offsets, word ids).

Gives the same encodings as transformers' BertTokenizerFast; save/load use the same vocab.txt and
tokenizer_config.json files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

from bertforge.atomic import write_text_atomic
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.tokenizer.basic import BasicTokenizer
from bertforge.tokenizer.vocab import SPECIAL_TOKENS, Vocab
from bertforge.tokenizer.wordpiece import CONTINUATION, WordPiece, WordPieceCache
from bertforge.validation import check_number

DEFAULT_MAX_LENGTH = 512
# tokenizer_config.json keys that bertforge honours; the other keys transformers writes are metadata.
SETTINGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length")
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


class BertTokenizer:
    """BERT's tokenizer: basic tokenization, then WordPiece, then [CLS] A [SEP] (B [SEP]).

    >>> tokenizer = BertTokenizer.from_pretrained("default")
    >>> tokenizer.tokenize("Unaffable café owners!")
    ['una', '##ffa', '##ble', 'cafe', 'owners', '!']
    >>> tokenizer("Hi there", text_pair="Bye")["token_type_ids"]
    [0, 0, 0, 0, 1, 1]
    """

    def __init__(self, vocab: Vocab | str | Path, do_lower_case: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, model_max_length: int = DEFAULT_MAX_LENGTH):
        self.vocab = vocab if isinstance(vocab, Vocab) else Vocab.from_file(vocab)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.basic = BasicTokenizer(lowercase=do_lower_case, strip_accents=strip_accents,
                                    split_cjk=tokenize_chinese_chars,
                                    never_split=self.vocab.special_tokens.values())
        self.wordpiece = WordPiece(self.vocab)
        # Special tokens found in the text reach WordPiece as whole words, which the vocabulary holds whole.
        self._pieces = WordPieceCache(self.wordpiece)

    # ---------------------------------------------------------------- loading and saving

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **settings: Any) -> BertTokenizer:
        """Load vocab.txt (+ tokenizer_config.json when present) from a model directory or 'default'.

        Keyword arguments override the saved settings: from_pretrained("default", do_lower_case=False).
        """
        from bertforge.checkpoint.default_model import resolve_model_dir

        directory = resolve_model_dir(name_or_path)
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown tokenizer setting {unknown[0]!r}; expected one of {list(SETTINGS)}")
        config = _read_tokenizer_config(directory / "tokenizer_config.json")
        special_tokens = {role: _token_content(config[role]) for role in SPECIAL_TOKENS if config.get(role)}
        vocab = Vocab.from_file(directory / "vocab.txt", special_tokens)
        chosen = {key: config[key] for key in SETTINGS if key in config} | settings
        _check_settings(chosen, directory / "tokenizer_config.json")
        if chosen.get("model_max_length", 0) > 10**12:
            # transformers writes a huge sentinel for "no limit"; BERT's position table makes 512 the real one.
            chosen["model_max_length"] = DEFAULT_MAX_LENGTH
        return cls(vocab, **chosen)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write vocab.txt and tokenizer_config.json (readable by from_pretrained and by transformers)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.vocab.save(directory / "vocab.txt")
        config = {key: getattr(self, key) for key in SETTINGS}
        config |= self.vocab.special_tokens
        config["tokenizer_class"] = "BertTokenizer"
        write_text_atomic(directory / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")

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
        """In transformers' order: [UNK], [SEP], [PAD], [CLS], [MASK]."""
        return [self.vocab.special_id(role) for role in ("unk_token", "sep_token", "pad_token", "cls_token",
                                                          "mask_token")]

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
        if not 0 <= token_id < len(self.vocab):
            raise InputError(f"token id {token_id} is outside the vocabulary (0..{len(self.vocab) - 1})")
        return self.vocab.id_to_token[token_id]

    # ---------------------------------------------------------------- text <-> tokens

    def tokenize(self, text: str) -> list[str]:
        """'Unaffable café owners!' -> ['una', '##ffa', '##ble', 'cafe', 'owners', '!'] (no [CLS]/[SEP])."""
        return [self.vocab.id_to_token[i] for i in self._encode_ids(text)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text, "##" pieces glued to their word: [101, 7592, 999, 102] -> 'hello!'.

        Matches transformers' decode for BERT (its WordPiece decoder with clean-up): words are joined by
        spaces and '.', '?', '!', ',' attach to the word before; lower-casing and accents are not undone.
        """
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            special = set(self.vocab.special_tokens.values())
            tokens = [token for token in tokens if token not in special]
        pieces = []
        for index, token in enumerate(tokens):
            if index > 0:
                token = token[len(CONTINUATION):] if token.startswith(CONTINUATION) else " " + token
            for dirty, clean in DECODE_CLEANUP:
                token = token.replace(dirty, clean)
            pieces.append(token)
        return "".join(pieces)

    def _encode_ids(self, text: str) -> list[int]:
        """The WordPiece ids of a text, without special tokens; stays in C for known words."""
        pieces = map(self._pieces.__getitem__, self.basic.split(text))
        return list(chain.from_iterable(map(itemgetter(0), pieces)))

    def _encode_details(self, text: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """Ids, character offsets into `text` and word index of every token (no special tokens)."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        word_ids: list[int] = []
        for index, (word, start, origins) in enumerate(self.basic.split_with_offsets(text)):
            piece_ids, spans = self._pieces[word]
            ids += piece_ids
            word_ids += [index] * len(piece_ids)
            if origins is None:
                offsets += [(start + begin, start + end) for begin, end in spans]
            else:
                # A piece covers the original characters its first and last normalised characters came from.
                offsets += [(origins[begin], origins[end - 1] + 1) for begin, end in spans]
        return ids, offsets, word_ids

    # ---------------------------------------------------------------- encoding

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
                 max_length: int | None = None, truncation: bool | str = True, padding: bool | str = False,
                 return_offsets_mapping: bool = False, return_word_ids: bool = False,
                 return_tensors: str | None = None) -> BatchEncoding:
        """Encode one text (flat lists) or a batch (lists of lists); pairs become [CLS] A [SEP] B [SEP].

        max_length defaults to model_max_length; truncation is True/'longest_first', 'only_first',
        'only_second' or False; padding is False, True/'longest' or 'max_length'; return_tensors='pt'
        gives torch.long tensors. Offsets are (start, end) character positions in the original text,
        (0, 0) for [CLS], [SEP] and padding.
        """
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
            _pad(columns, target, self.pad_token_id)

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
            return self(text, text_pair, max_length, truncation, padding, return_word_ids=True)._word_ids

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


def _pad(columns: dict[str, list[list]], target: int, pad_token_id: int) -> None:
    """Pad every row on the right to `target` (rows already longer are left alone)."""
    fill = {"input_ids": pad_token_id, "token_type_ids": 0, "attention_mask": 0, "offset_mapping": (0, 0),
            "word_ids": None}
    for name, rows in columns.items():
        for row in rows:
            if len(row) < target:
                row += [fill[name]] * (target - len(row))


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


def _read_tokenizer_config(path: Path) -> dict[str, Any]:
    """tokenizer_config.json as a dict ({} when absent); refuses settings bertforge can't honour."""
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if config.get("do_basic_tokenize", True) is False:
        raise ConfigError(f"{path}: do_basic_tokenize=false is not supported (bertforge always splits words first)")
    if config.get("never_split"):
        raise ConfigError(f"{path}: never_split is not supported (special tokens are never split already)")
    return config


def _token_content(value: str | dict[str, Any]) -> str:
    """A special token as transformers writes it: a string, or {"content": "[UNK]", ...}."""
    return value["content"] if isinstance(value, dict) else value


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
