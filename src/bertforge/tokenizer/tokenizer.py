"""BertTokenizer: texts or text pairs -> input_ids, token_type_ids, attention_mask (+ offsets, word ids).

Gives the same encodings as transformers' BertTokenizerFast, added tokens included; loads and saves the files
transformers does (tokenizer/files.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

from bertforge.errors import ConfigError, InputError
from bertforge.tokenizer.added import AddedToken, AddedTokens
from bertforge.tokenizer.basic import BasicTokenizer
from bertforge.tokenizer.encoding import (
    ENCODING_COLUMNS,
    TOKEN_COLUMNS,
    BatchEncoding,
    Tokens,
    Truncation,
    check_side,
    check_tensor_kind,
    flat_index,
    pad_columns,
    padding_strategy,
    rows_of,
    sequence_ids,
    special_tokens_mask,
    to_tensors,
    truncated_pairs,
    truncation_strategy,
    with_special_tokens,
)
from bertforge.tokenizer.files import (
    DEFAULT_MAX_LENGTH,
    EXTRA_SPECIAL_KEYS,
    MODEL_INPUT_NAMES,
    SETTINGS,
    has_tokenizer_files,
    read_tokenizer_files,
    write_tokenizer_files,
)
from bertforge.tokenizer.vocab import SPECIAL_TOKENS, UNUSED_ROLES, Vocab
from bertforge.tokenizer.wordpiece import CONTINUATION, MAX_WORD_CHARS, WordPiece, WordPieceCache
from bertforge.validation import check_counts, check_number, listed_inputs

SPECIAL_TOKEN_ROLES = (*SPECIAL_TOKENS, *UNUSED_ROLES)  # what a tokenizer's settings may name
# The reference's WordPiece decoder glues these onto the previous token (applied token by token).
DECODE_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                  (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
# transformers' clean_up_tokenization, on the whole decoded text where tokenizer_config.json asks for it
# (clean_up_tokenization_spaces: true, as older BERT checkpoints say): "it ' s" -> "it's".
TEXT_CLEANUP = tuple(pair for pair in DECODE_CLEANUP if pair[0] != " do not")


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


def _special_token_property(role: str) -> property:
    """A special token's string, which setting changes (see BertTokenizer.add_special_tokens)."""

    def setter(self: BertTokenizer, value: str | AddedToken) -> None:
        self.add_special_tokens({role: value})

    return property(lambda self: self._special_token(role), setter)


def _special_token_id_property(role: str, read: Callable[[BertTokenizer], int | None]) -> property:
    """A special token's id, which setting makes the token of that id the role's (tokenizer.pad_token_id = 100, as
    transformers sets it)."""

    def setter(self: BertTokenizer, token_id: int) -> None:
        if not isinstance(token_id, numbers.Integral) or isinstance(token_id, bool) or not 0 <= token_id < len(self):
            raise InputError(f"{role}_id must be a token id below {len(self)}, got {token_id!r}")
        self.add_special_tokens({role: self.convert_ids_to_tokens(int(token_id))})

    return property(read, setter)


class BertTokenizer:
    """BERT's tokenizer: basic tokenization, then WordPiece, then [CLS] A [SEP] (B [SEP]).

    >>> tokenizer = BertTokenizer.from_pretrained("default")
    >>> tokenizer.tokenize("Unaffable café owners!")
    ['una', '##ffa', '##ble', 'cafe', 'owners', '!']
    >>> tokenizer("Hi there", text_pair="Bye")["token_type_ids"]
    [0, 0, 0, 0, 1, 1]
    """

    def __init__(self, vocab: Vocab | str | Path | Mapping[str, int] | None = None, do_lower_case: bool = True,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 model_max_length: int = DEFAULT_MAX_LENGTH, added_tokens: dict[int, AddedToken] | None = None,
                 max_word_chars: int = MAX_WORD_CHARS, padding_side: str = "right", truncation_side: str = "right",
                 clean_up_tokenization_spaces: bool = False, split_special_tokens: bool = False,
                 model_input_names: Sequence[str] = MODEL_INPUT_NAMES, vocab_file: str | Path | None = None,
                 **special_tokens: Any):
        """`vocab`: a vocab.txt path (transformers 4 calls it `vocab_file`), a Vocab, or token -> id.
        `added_tokens`: id -> AddedToken, matched whole before basic tokenization (the special tokens of the
        vocabulary are added tokens too, as in transformers); ids past the vocabulary extend it.
        `model_input_names`: what a call returns unless it says (without token_type_ids: no segment ids).
        `special_tokens`: roles as transformers takes them (unk_token="<unk>", additional_special_tokens=[...]),
        applied as add_special_tokens applies them."""
        special = _special_settings(special_tokens)
        self.vocab = _vocab_of(vocab, vocab_file)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.max_word_chars = max_word_chars
        self.padding_side = check_side("padding_side", padding_side)
        self.truncation_side = check_side("truncation_side", truncation_side)
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        # True: "[SEP]" written in a text is read as text ('[', 'sep', ']'), not as the special token.
        self.split_special_tokens = split_special_tokens
        self.model_input_names = _input_names(model_input_names)
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
        # Special added tokens left out of additional_special_tokens (and so of all_special_ids), as transformers
        # keeps them: those add_tokens made special, those a replacing add_special_tokens dropped, and those given
        # here but not listed in `special_tokens`. They are still matched whole and dropped by decode's
        # skip_special_tokens.
        roles = set(self.vocab.special_tokens.values())
        self._unlisted = {token_id for token_id, token in self.added_tokens.items()
                          if token.special and token.content not in roles}
        self._match_added_tokens()
        self.add_special_tokens(special)

    def _match_added_tokens(self) -> None:
        """The finders of added tokens in a text: all of them, and the non-special ones (split_special_tokens)."""
        self._added = AddedTokens(self.added_tokens, self.basic.normalize)
        self._added_plain = AddedTokens({token_id: token for token_id, token in self.added_tokens.items()
                                         if not token.special}, self.basic.normalize)

    def _finder(self, split_special_tokens: bool | None) -> AddedTokens:
        split = self.split_special_tokens if split_special_tokens is None else split_special_tokens
        return self._added_plain if split else self._added

    def add_tokens(self, tokens: str | AddedToken | Sequence[str | AddedToken], special_tokens: bool = False) -> int:
        """Add whole tokens matched before WordPiece ('covid19', or special ones like '[E1]'), each with the next
        free id; returns how many tokens it added, as transformers 5 counts them (one the vocabulary has already
        counts too; `len(tokenizer)` says how many rows a model needs: `resize_token_embeddings(len(tokenizer))`).

        Plain strings become transformers' defaults: matched after normalisation (case-insensitively on an
        uncased vocabulary), or, with `special_tokens`, as written and dropped by decode's skip_special_tokens.
        An AddedToken (the tokenizers library's, which transformers exports, or bertforge's) keeps its flags
        (lstrip, rstrip, single_word, normalized). A token the vocabulary has already keeps its id and is from now
        on matched whole; an added token given again as a string stays as it is, given as an AddedToken takes its
        flags.
        """
        if isinstance(tokens, str) or hasattr(tokens, "content"):
            tokens = [tokens]
        elif not isinstance(tokens, Iterable):
            raise InputError(f"add_tokens takes a token (a string or an AddedToken) or a list of them, got "
                             f"{type(tokens).__name__}")
        given = [(item, AddedToken.of(item, special_tokens)) for item in tokens]  # every one checked, then added
        known = {token.content: token_id for token_id, token in self.added_tokens.items()}
        listed = set(self.all_special_ids)
        added = 0
        for item, token in given:
            existing = self.added_tokens.get(known.get(token.content))
            # given again: as it is, unless an AddedToken with other flags, or a string to be made special
            if not token.content or existing is not None and (
                    existing == token or isinstance(item, str) and (existing.special or not special_tokens)):
                continue
            token_id = known.get(token.content, self.vocab.token_to_id.get(token.content))
            if token_id is None:
                token_id = len(self.vocab)
            added += 1
            shown = self.basic.normalize(token.content)[0] if token.normalized else token.content
            self.vocab.add(token.content, token_id, shown)
            self.added_tokens[token_id] = token
            known[token.content] = token_id
            if token.special and token_id not in listed:
                self._unlisted.add(token_id)  # special, but not listed: as transformers' add_tokens leaves it
        self._match_added_tokens()
        return added

    def add_special_tokens(self, special_tokens: dict[str, Any], replace_additional_special_tokens: bool = True,
                           replace_extra_special_tokens: bool | None = None) -> int:
        """{'additional_special_tokens': ['[E1]', '[/E1]']} adds special tokens; a role ('cls_token': '<cls>')
        becomes that token, added if new. Returns how many tokens were added (as add_tokens counts).

        As in transformers, the tokens listed replace additional_special_tokens unless
        `replace_additional_special_tokens` (transformers 5: `replace_extra_special_tokens`) is False; those
        replaced stay special (matched whole, dropped by decode's skip_special_tokens) but leave all_special_ids."""
        replace = replace_additional_special_tokens if replace_extra_special_tokens is None else \
            replace_extra_special_tokens
        added = 0
        for role, value in special_tokens.items():
            if role in EXTRA_SPECIAL_KEYS:
                if isinstance(value, str) or hasattr(value, "content") or not isinstance(value, Iterable):
                    raise InputError(f"{role} takes a list of tokens (strings or AddedTokens), got {value!r:.60}")
                tokens = list(value)
                added += self.add_tokens(tokens, special_tokens=True)
                listed = {self.vocab.token_to_id[getattr(token, "content", token)] for token in tokens
                          if getattr(token, "content", token)}
                if replace and listed:
                    self._unlisted |= set(self._listed_extra_ids())
                self._unlisted -= listed
            elif role in self.vocab.special_tokens:
                content = getattr(value, "content", value)  # a string or an AddedToken
                added += self.add_tokens([value], special_tokens=True)
                before, self.vocab.special_tokens[role] = self.vocab.special_tokens[role], content
                if before not in self.vocab.special_tokens.values() and self.vocab.token_to_id.get(before) in \
                        self.added_tokens:  # the role's token before: still special, no longer listed
                    self._unlisted.add(self.vocab.token_to_id[before])
            else:
                raise ConfigError(f"unknown special token role {role!r}; expected 'additional_special_tokens' or "
                                  f"one of {sorted(self.vocab.special_tokens)}")
        return added

    # ---------------------------------------------------------------- loading and saving

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **settings: Any) -> BertTokenizer:
        """Load the tokenizer files of a model directory (tokenizer.json or vocab.txt, tokenizer_config.json,
        special_tokens_map.json, added_tokens.json) or 'default'.

        Keyword arguments override the saved settings: from_pretrained("default", do_lower_case=False); special
        tokens as transformers takes them (unk_token="<unk>", additional_special_tokens=["[E1]"]: see
        add_special_tokens). transformers' loading options are taken as the models take them (subfolder,
        cache_dir, revision; the Hub's own, and use_fast, unused).
        """
        from bertforge.checkpoint.adapters import adapter_base, is_adapter_folder
        from bertforge.checkpoint.default_model import HUB_OPTIONS, resolve_model_dir
        from bertforge.checkpoint.sentence_transformers import saved_loading_options, usable_options

        place = {"cache_dir": settings.pop("cache_dir", None), "revision": settings.pop("revision", None)}
        directory = resolve_model_dir(name_or_path, settings.pop("subfolder", ""), **place)
        if is_adapter_folder(directory) and not has_tokenizer_files(directory):  # PEFT saves no tokenizer: the base's
            directory = resolve_model_dir(adapter_base(directory), **place)
        # the options sentence-transformers loads this tokenizer with (sentence_bert_config.json), under the caller's
        known = {*SETTINGS, *SPECIAL_TOKEN_ROLES, *EXTRA_SPECIAL_KEYS, *SLOW_ONLY_SETTINGS, *HUB_OPTIONS, "use_fast"}
        saved = saved_loading_options(directory)["processor_kwargs"]
        settings = usable_options(saved, known.__contains__, directory, "BERT's tokenizer") | settings
        # transformers' options about fetching, and use_fast (this tokenizer is the fast one's equal): unused
        settings = {key: value for key, value in settings.items() if key not in HUB_OPTIONS | {"use_fast"}}
        special = _special_settings(settings, others=SETTINGS)
        files = read_tokenizer_files(directory)
        chosen = files.settings | settings
        _check_settings(chosen, directory / "tokenizer_config.json")
        if not any(key in special for key in EXTRA_SPECIAL_KEYS):  # the caller's own list replaces the files'
            special["additional_special_tokens"] = list(files.extra_special)
        tokenizer = cls(files.vocab, **chosen, added_tokens=files.added_tokens, max_word_chars=files.max_word_chars,
                        **special)
        tokenizer.name_or_path = str(name_or_path)
        return tokenizer

    def train_new_from_iterator(self, text_iterator: Iterable[str | Sequence[str]], vocab_size: int,
                                length: int | None = None, new_special_tokens: Sequence[Any] = (),
                                special_tokens_map: Mapping[str, str] | None = None, min_frequency: int = 0,
                                limit_alphabet: int | None = None, initial_alphabet: Sequence[str] = (),
                                show_progress: bool = True) -> BertTokenizer:
        """transformers' train_new_from_iterator: a tokenizer with this one's settings (lower-casing, accents,
        Chinese characters, maximum length, padding and truncation sides) and a new WordPiece vocabulary of at most
        `vocab_size` tokens, learnt from the texts (an iterator of texts or of batches of texts, as a dataset's
        column gives them). The vocabulary's special tokens are BERT's, then `new_special_tokens` (listed as
        additional special tokens). The trainer's options, as the tokenizers library reads them: `min_frequency`
        (the fewest times a pair is seen to be merged), `limit_alphabet` (the most frequent characters kept),
        `initial_alphabet` (characters kept though unseen; a string's first). `length` and `show_progress` only
        concern a progress bar there."""
        from bertforge.tokenizer.learn_vocab import count_words, learn_wordpiece

        check_counts(ConfigError, vocab_size=vocab_size)  # before the texts are read
        check_number("min_frequency", min_frequency, minimum=0, integer=True)
        check_number("limit_alphabet", limit_alphabet, minimum=1, integer=True, optional=True)
        if special_tokens_map:
            raise ConfigError("train_new_from_iterator learns BERT's special tokens; special_tokens_map can't rename "
                              "them: set the roles afterwards with add_special_tokens")
        if {role: self.vocab.special_tokens[role] for role in SPECIAL_TOKENS} != SPECIAL_TOKENS:
            raise ConfigError("train_new_from_iterator learns BERT's special tokens ([PAD], [UNK], [CLS], [SEP], "
                              "[MASK]); this tokenizer has others")
        if isinstance(initial_alphabet, str) or isinstance(new_special_tokens, str):
            raise InputError("initial_alphabet and new_special_tokens take lists (of characters, of tokens)")
        extra = [getattr(token, "content", token) for token in new_special_tokens]
        if not all(isinstance(token, str) and token for token in extra):
            raise InputError(f"new_special_tokens takes tokens (strings or AddedTokens), got "
                             f"{new_special_tokens!r:.60}")

        def texts() -> Iterator[str]:
            for item in text_iterator:
                batch = [item] if isinstance(item, str) else item
                if not isinstance(batch, (list, tuple)) or not all(isinstance(text, str) for text in batch):
                    raise InputError(f"train_new_from_iterator reads texts or lists of texts, got {item!r:.60}")
                yield from batch

        counts = count_words(texts(), lowercase=self.do_lower_case, strip_accents=self.strip_accents,
                             split_cjk=self.tokenize_chinese_chars)
        if not counts:
            raise InputError("train_new_from_iterator: the texts hold no words")
        tokens = learn_wordpiece(counts, vocab_size, max(1, min_frequency), alphabet_limit=limit_alphabet,
                                 initial_alphabet=[text[0] for text in initial_alphabet if text], extra_special=extra)
        trained = BertTokenizer(Vocab(tokens), do_lower_case=self.do_lower_case, strip_accents=self.strip_accents,
                                tokenize_chinese_chars=self.tokenize_chinese_chars,
                                model_max_length=self.model_max_length, padding_side=self.padding_side,
                                truncation_side=self.truncation_side,
                                clean_up_tokenization_spaces=self.clean_up_tokenization_spaces,
                                model_input_names=self.model_input_names)
        if new_special_tokens:  # their ids are the vocabulary's, after BERT's five
            trained.add_special_tokens({"additional_special_tokens": list(new_special_tokens)})
        return trained

    def save_pretrained(self, directory: str | Path, model_max_length: int | None = None) -> tuple[str, ...]:
        """Write the tokenizer files transformers writes (readable by from_pretrained and by transformers); their
        paths, as transformers returns them.

        `model_max_length` records another length than this tokenizer's, e.g. the max_length a model was
        fine-tuned with, which transformers then truncates to (with truncation=True).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return tuple(map(str, write_tokenizer_files(self, directory, model_max_length)))

    # ---------------------------------------------------------------- vocabulary

    @property
    def vocab_size(self) -> int:
        """The WordPiece vocabulary's size, without tokens added after it (those count in `len(tokenizer)`)."""
        return self.vocab.num_pieces

    def __len__(self) -> int:
        """Every id the tokenizer can give: the size of embedding table a model needs."""
        return len(self.vocab)

    cls_token_id = _special_token_id_property("cls_token", lambda self: self.vocab.cls_token_id)
    sep_token_id = _special_token_id_property("sep_token", lambda self: self.vocab.sep_token_id)
    pad_token_id = _special_token_id_property("pad_token", lambda self: self.vocab.pad_token_id)
    mask_token_id = _special_token_id_property("mask_token", lambda self: self.vocab.mask_token_id)
    unk_token_id = _special_token_id_property("unk_token", lambda self: self.vocab.unk_token_id)

    def _special_token(self, role: str) -> str | None:
        return self.vocab.special_tokens[role] if self.vocab.has_special(role) else None

    # The special tokens as strings (None where the vocabulary lacks one): f"Paris is the {tokenizer.mask_token}";
    # set as transformers sets them (tokenizer.pad_token = "[UNK]"), through add_special_tokens.
    cls_token = _special_token_property("cls_token")
    sep_token = _special_token_property("sep_token")
    pad_token = _special_token_property("pad_token")
    mask_token = _special_token_property("mask_token")
    unk_token = _special_token_property("unk_token")
    # BERT marks no beginning or end of text beyond [CLS] and [SEP]: None, as transformers' BERT tokenizers answer
    # code written for every model (generation, collators) that asks, unless set (tokenizer.bos_token =
    # tokenizer.cls_token, as bert2bert recipes do); the encoding doesn't change.
    bos_token = _special_token_property("bos_token")
    eos_token = _special_token_property("eos_token")

    bos_token_id = _special_token_id_property(
        "bos_token", lambda self: self.vocab.token_to_id[self.bos_token] if self.bos_token is not None else None)
    eos_token_id = _special_token_id_property(
        "eos_token", lambda self: self.vocab.token_to_id[self.eos_token] if self.eos_token is not None else None)

    @property
    def special_tokens_map(self) -> dict[str, Any]:
        """Role -> token, and the added special tokens under 'additional_special_tokens', as transformers lists
        them."""
        roles = {role: token for role, token in self.vocab.special_tokens.items() if self.vocab.has_special(role)}
        extra = self.additional_special_tokens
        return roles | ({"additional_special_tokens": extra} if extra else {})

    @property
    def additional_special_tokens(self) -> list[str]:
        """Special tokens listed beyond the roles ('[E1]'), by add_special_tokens or the files."""
        return [self.added_tokens[token_id].content for token_id in self._listed_extra_ids()]

    @additional_special_tokens.setter
    def additional_special_tokens(self, tokens: Sequence[str | AddedToken]) -> None:
        self.add_special_tokens({"additional_special_tokens": tokens})

    extra_special_tokens = additional_special_tokens  # transformers 5's name

    def _listed_extra_ids(self) -> list[int]:
        roles = set(self.vocab.special_tokens.values())
        return [token_id for token_id, token in sorted(self.added_tokens.items())
                if token.special and token.content not in roles and token_id not in self._unlisted]

    @property
    def all_special_tokens(self) -> list[str]:
        """The tokens of all_special_ids, in its order (an added one as it was added, not as normalised)."""
        return [self.added_tokens[token_id].content if token_id in self.added_tokens else
                self.vocab.id_to_token[token_id] for token_id in self.all_special_ids]

    @property
    def all_special_ids(self) -> list[int]:
        """In transformers' order: the bos and eos tokens where set, [UNK], [SEP], [PAD], [CLS], [MASK] (those the
        vocabulary has), each once, then the added special tokens."""
        roles = list(dict.fromkeys(self.vocab.special_id(role) for role in (
            "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
            if self.vocab.has_special(role)))
        return roles + [token_id for token_id in self._listed_extra_ids() if token_id not in roles]

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        """Id -> AddedToken of every token matched whole (the vocabulary's special tokens included)."""
        return dict(sorted(self.added_tokens.items()))

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        """Token -> id of added_tokens_decoder."""
        return {token.content: token_id for token_id, token in sorted(self.added_tokens.items())}

    def get_added_vocab(self) -> dict[str, int]:
        """Token -> id of the added tokens, as transformers 5 lists them (the special ones included)."""
        return self.added_tokens_encoder

    def __repr__(self) -> str:
        return (f"BertTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
                f"added_tokens={len(self) - self.vocab_size}, do_lower_case={self.do_lower_case}, "
                f"model_max_length={self.model_max_length}, padding_side={self.padding_side!r}, "
                f"truncation_side={self.truncation_side!r}, special_tokens={self.special_tokens_map})")

    name_or_path = ""  # what from_pretrained was given, as transformers keeps it
    is_fast = True  # transformers' flag for a tokenizer with offsets and the alignment methods, which this has
    pad_token_type_id = 0  # the segment id of padding

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """[CLS] A [SEP]: 2; [CLS] A [SEP] B [SEP]: 3."""
        return 3 if pair else 2

    def get_special_tokens_mask(self, token_ids_0: Sequence[int], token_ids_1: Sequence[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        """1 for a special token: of ids that already have them (already_has_special_tokens), the special ids
        among them; else of the row the ids would make, its [CLS] and [SEP]s."""
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise InputError("already_has_special_tokens takes one list of ids (the row), not a pair")
            special = set(self.all_special_ids)
            return [1 if token_id in special else 0 for token_id in token_ids_0]
        mask = [1] + [0] * len(token_ids_0) + [1]
        return mask if token_ids_1 is None else mask + [0] * len(token_ids_1) + [1]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """'hello' -> 7592; unknown tokens -> the [UNK] id."""
        unk = self.unk_token_id
        if isinstance(tokens, str):
            return self.vocab.token_to_id.get(tokens, unk)
        if not isinstance(tokens, Iterable):
            raise InputError(f"convert_tokens_to_ids takes a token or a list of tokens, got {type(tokens).__name__}")
        return [self.vocab.token_to_id.get(token, unk) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str | list[str]:
        """7592 -> 'hello'; accepts a list or a 1-d tensor of ids (`skip_special_tokens`: the special ones left
        out)."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        if isinstance(ids, int):
            return self._token(ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [token_id for token_id in ids if token_id not in special]
        return [self._token(i) for i in ids]

    def _token(self, token_id: int) -> str:
        if not isinstance(token_id, numbers.Integral):
            raise InputError(f"expected token ids (integers), got {token_id!r:.40}")
        if not 0 <= token_id < len(self.vocab):
            raise InputError(f"token id {token_id} is outside the vocabulary (0..{len(self.vocab) - 1})")
        return self.vocab.id_to_token[token_id]

    # ---------------------------------------------------------------- text <-> tokens

    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False,
                 split_special_tokens: bool | None = None) -> list[str]:
        """'Unaffable café owners!' -> ['una', '##ffa', '##ble', 'cafe', 'owners', '!'] (no [CLS]/[SEP] unless
        `add_special_tokens`); with a `pair`, its tokens follow (as transformers 5 lists them), untruncated."""
        if not isinstance(text, str):
            raise InputError(f"tokenize takes one text (and one pair), got {type(text).__name__}; for a batch, call "
                             f"the tokenizer")
        if pair is None and not add_special_tokens:
            return [self.vocab.id_to_token[i] for i in self._encode_ids(text, split_special_tokens)]
        row = self(text, pair, truncation=False, add_special_tokens=add_special_tokens,
                   split_special_tokens=split_special_tokens)
        return self.convert_ids_to_tokens(row["input_ids"])

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None, spaces_between_special_tokens: bool = True
               ) -> str | list[str]:
        """Ids -> text, "##" pieces glued to their word: [101, 7592, 999, 102] -> '[CLS] hello! [SEP]', or 'hello!'
        with `skip_special_tokens`. Takes one id, a list or a 1-d tensor; a list of lists or a 2-d tensor gives a
        text per row, as batch_decode and transformers 5's decode.

        Matches transformers' decode for BERT (its WordPiece decoder with clean-up): words are joined by
        spaces and '.', '?', '!', ',' attach to the word before; lower-casing and accents are not undone.
        `clean_up_tokenization_spaces` (default: the tokenizer's setting) also glues "it ' s" into "it's".
        `spaces_between_special_tokens` is taken as transformers' (fast) BERT tokenizer takes it: special tokens are
        words of their own to WordPiece's decoder either way.
        """
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        if isinstance(ids, numbers.Integral):
            ids = [ids]
        if not isinstance(ids, Iterable):
            raise InputError(f"decode takes token ids (one, a sequence of them or a list of sequences), got "
                             f"{type(ids).__name__}")
        if ids and all(isinstance(row, Sequence) and not isinstance(row, str) for row in ids):
            return self.batch_decode(ids, skip_special_tokens, clean_up_tokenization_spaces)
        if any(not isinstance(token_id, numbers.Integral) for token_id in ids):
            raise InputError("decode takes token ids: one sequence of them, or a list of sequences")
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(ids), skip_special_tokens)
        if self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces:
            return self.clean_up_tokenization(text)
        return text

    @staticmethod
    def clean_up_tokenization(text: str) -> str:
        """transformers' clean-up of decoded text: spaces before punctuation and English contractions removed
        ("it ' s fine ." -> "it's fine.")."""
        for dirty, clean in TEXT_CLEANUP:
            text = text.replace(dirty, clean)
        return text

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None, spaces_between_special_tokens: bool = True
                     ) -> list[str]:
        """One text per row of ids (lists, or a 2-d tensor); one sequence of ids is one row, as transformers reads
        it."""
        sequences = sequences.tolist() if hasattr(sequences, "tolist") else sequences
        if not isinstance(sequences, Iterable):
            raise InputError(f"batch_decode takes sequences of token ids, got {type(sequences).__name__}")
        if sequences and all(isinstance(token_id, numbers.Integral) for token_id in sequences):
            sequences = [sequences]
        return [self.decode(list(ids), skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    def convert_tokens_to_string(self, tokens: Sequence[str], skip_special_tokens: bool = False) -> str:
        """['hello', '##s', '!'] -> 'hellos!' (decode's joining, on tokens)."""
        if skip_special_tokens:  # every special token, listed or not, as transformers' decode drops them
            special = {self.vocab.id_to_token[token_id] for token_id in self.all_special_ids} | {
                self.vocab.id_to_token[token_id] for token_id, token in self.added_tokens.items() if token.special}
            tokens = [token for token in tokens if token not in special]
        pieces = []
        for index, token in enumerate(tokens):
            if index > 0:
                token = token[len(CONTINUATION):] if token.startswith(CONTINUATION) else " " + token
            for dirty, clean in DECODE_CLEANUP:
                token = token.replace(dirty, clean)
            pieces.append(token)
        return "".join(pieces)

    def encode(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
               **options: Any) -> list[int] | list[list[int]]:
        """The input ids of one text (or pair), [CLS] and [SEP] included: `self(text, text_pair)["input_ids"]`; a
        list of texts gives a list per text, as there."""
        return self(text, text_pair, **options)["input_ids"]

    def encode_plus(self, text: Any, text_pair: Any = None, **options: Any) -> BatchEncoding:
        """transformers 4's encode_plus (gone from 5), as code written for it calls it: one text or pair, as a call
        encodes it."""
        return self(text, text_pair, **options)

    def batch_encode_plus(self, batch_text_or_text_pairs: Sequence[Any], **options: Any) -> BatchEncoding:
        """transformers 4's batch_encode_plus: a list of texts or of (text, pair) tuples, as a call encodes it."""
        if isinstance(batch_text_or_text_pairs, str):
            raise InputError("batch_encode_plus takes a list of texts or of (text, pair) tuples, not one text")
        return self(list(batch_text_or_text_pairs), **options)

    def build_inputs_with_special_tokens(self, token_ids_0: Sequence[int],
                                         token_ids_1: Sequence[int] | None = None) -> list[int]:
        """[CLS] A [SEP], or [CLS] A [SEP] B [SEP], of token ids (transformers 4's name)."""
        row = [self.cls_token_id, *token_ids_0, self.sep_token_id]
        return row if token_ids_1 is None else [*row, *token_ids_1, self.sep_token_id]

    def create_token_type_ids_from_sequences(self, token_ids_0: Sequence[int],
                                             token_ids_1: Sequence[int] | None = None) -> list[int]:
        """The segment ids of build_inputs_with_special_tokens' row: 0 through A's [SEP], then 1."""
        first = [0] * (len(token_ids_0) + 2)
        return first if token_ids_1 is None else first + [1] * (len(token_ids_1) + 1)

    @property
    def max_len_single_sentence(self) -> int:
        return self.model_max_length - self.num_special_tokens_to_add(pair=False)

    @property
    def max_len_sentences_pair(self) -> int:
        return self.model_max_length - self.num_special_tokens_to_add(pair=True)

    def save_vocabulary(self, save_directory: str | Path, filename_prefix: str | None = None) -> tuple[str]:
        """The vocabulary alone, as vocab.txt (PREFIX-vocab.txt) in `save_directory`; its path, as transformers."""
        path = Path(save_directory) / (f"{filename_prefix}-vocab.txt" if filename_prefix else "vocab.txt")
        self.vocab.save(path)
        return (str(path),)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""
        return dict(self.vocab.token_to_id)

    def _encode_ids(self, text: str, split_special_tokens: bool | None = None) -> list[int]:
        """The ids of a text, without [CLS]/[SEP]; stays in C for known words when it holds no added token."""
        added = self._finder(split_special_tokens)
        if not added.may_match(text):
            pieces = map(self._pieces.__getitem__, self.basic.split(text))
            return list(chain.from_iterable(map(itemgetter(0), pieces)))
        ids: list[int] = []
        for start, end, token_id in added.split(text):
            if token_id is not None:
                ids.append(token_id)
            else:
                ids += chain.from_iterable(self._pieces[word][0] for word in self.basic.split(text[start:end]))
        return ids

    def _words(self, text: str, split_special_tokens: bool | None = None
               ) -> list[tuple[str, int, tuple[int, ...] | None, int | None]]:
        """The text's words (BasicTokenizer.split_with_offsets) and added tokens (their id last, else None)."""
        added = self._finder(split_special_tokens)
        if not added.may_match(text):
            return [(word, start, origins, None) for word, start, origins in self.basic.split_with_offsets(text)]
        words = []
        for start, end, token_id in added.split(text):
            if token_id is not None:
                words.append((text[start:end], start, None, token_id))
                continue
            for word, offset, origins in self.basic.split_with_offsets(text[start:end]):
                shifted = tuple(start + origin for origin in origins) if origins is not None else None
                words.append((word, start + offset, shifted, None))
        return words

    def _encode_details(self, text: str, split_special_tokens: bool | None = None
                        ) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """Ids, character offsets into `text` and word index of every token (no special tokens)."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        word_ids: list[int] = []
        for index, (word, start, origins, added_id) in enumerate(self._words(text, split_special_tokens)):
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

    def __call__(self, text: str | Sequence[str] | None = None, text_pair: str | Sequence[str] | None = None,
                 max_length: int | None = None, truncation: bool | str | None = None, padding: bool | str = False,
                 return_offsets_mapping: bool = False, return_word_ids: bool = False,
                 return_tensors: str | None = None, is_split_into_words: bool = False,
                 return_overflowing_tokens: bool = False, stride: int = 0, pad_to_multiple_of: int | None = None,
                 padding_side: str | None = None, return_token_type_ids: bool | None = None,
                 return_attention_mask: bool | None = None, return_special_tokens_mask: bool = False,
                 return_length: bool = False, split_special_tokens: bool | None = None,
                 add_special_tokens: bool = True, text_target: str | Sequence[str] | None = None,
                 text_pair_target: str | Sequence[str] | None = None, verbose: bool = True,
                 pad_to_max_length: bool = False) -> BatchEncoding:
        """Encode one text (flat lists) or a batch (lists of lists); pairs become [CLS] A [SEP] B [SEP].

        max_length defaults to model_max_length; truncation is True/'longest_first', 'only_first',
        'only_second' or False, from the tokenizer's `truncation_side` (not given: 'longest_first', so that rows fit
        the model, at a multiple of `pad_to_multiple_of` where one is asked for); padding is False, True/'longest' or
        'max_length', on `padding_side`; return_tensors='pt' gives torch.long tensors ('np': numpy). Offsets are
        (start, end) character positions in the original text, (0, 0) for [CLS], [SEP] and padding. With
        `return_overflowing_tokens`, what truncation cuts off becomes further rows, each repeating `stride`
        tokens of the row before, and `overflow_to_sample_mapping` says which text each row came from (the
        result is a batch even for one text). With `is_split_into_words`, a text is a list of words (a CoNLL
        sentence): word ids number those words, and offsets are positions within each word, as in transformers.
        `split_special_tokens` (default: the tokenizer's) reads "[SEP]" written in a text as text.
        `add_special_tokens=False`: no [CLS] and [SEP] (the second text's tokens are still segment 1).
        `text_target` (and `text_pair_target`), as transformers takes them: encoded with the same options, their
        input ids become the `labels` of the texts' encoding, or the encoding itself without a `text`. `verbose`
        is accepted and unused (the errors here are exceptions, not warnings). `pad_to_max_length=True` is
        transformers 4's padding="max_length", for code written for it.
        """
        if pad_to_max_length and padding is False:
            padding = "max_length"
        if text_target is not None or text_pair_target is not None:
            # the same options for the targets as for the texts: every parameter but the four texts
            options = {name: value for name, value in locals().items()
                       if name not in ("self", "text", "text_pair", "text_target", "text_pair_target")}
            target = self(text_target, text_pair_target, **options)
            if text is None:
                return target
            encoding = self(text, text_pair, **options)
            encoding["labels"] = target["input_ids"]
            return encoding
        if text is None:
            raise InputError("nothing to encode: give a text (or a text_target)")
        # A batch as a list, read once: alignment calls the tokenizer again with it (a generator would be empty).
        if not isinstance(text, str | list | tuple):
            text = listed_inputs(text, "text")
        if text_pair is not None and not isinstance(text_pair, str | list | tuple):
            text_pair = listed_inputs(text_pair, "text_pair")
        # What the alignment (worked out when first asked for) encodes again: the inputs and this tokenizer as they
        # are now, so that the caller's later edits of either change none of this encoding's answers.
        called_text, called_pair, as_called = _copied(text), _copied(text_pair), self._as_now()
        is_batch = _is_batch_input(text, is_split_into_words)
        if not is_batch and not text_pair:
            text_pair = None  # one text with an empty pair is one text, as transformers reads it
        if is_split_into_words:
            items = list(text) if is_batch else [text]
            pair_items = None if text_pair is None else list(text_pair) if is_batch else [text_pair]
            if pair_items is None and is_batch and all(isinstance(item, (tuple, list)) and len(item) == 2 and
                                                       not isinstance(item[0], str) for item in items):
                items, pair_items = [item[0] for item in items], [item[1] for item in items]  # (words, words)
            texts = [SplitWords.of(words) for words in items]
            pairs = None if pair_items is None else [SplitWords.of(words) for words in pair_items]
            if pairs is not None and len(pairs) != len(texts):
                raise InputError(f"got {len(texts)} texts but {len(pairs)} text pairs")
        else:
            texts, second_texts = [text] if not is_batch else list(text), text_pair
            if is_batch and text_pair is None and texts and all(isinstance(item, (tuple, list)) and len(item) == 2
                                                                 for item in texts):
                texts, second_texts = [item[0] for item in texts], [item[1] for item in texts]  # (text, pair) items
                item_names = ("text[{}][0]", "text[{}][1]")
            else:
                item_names = ("text[{}]", "text_pair[{}]")
            pairs = _pairs_like(texts, second_texts, is_batch)
            _check_strings(texts, item_names[0])
            if pairs is not None:  # a None among them would be dropped: that row encoded as one text
                _check_strings(pairs, item_names[1])
        if isinstance(max_length, numbers.Integral) and not isinstance(max_length, bool):
            max_length = int(max_length)  # numpy's integers too
        check_number("max_length", max_length, integer=True, optional=True)
        check_number("stride", stride, minimum=0, integer=True)
        fit = Truncation(self.model_max_length if max_length is None else max_length,
                         truncation_strategy(truncation), self.truncation_side, return_overflowing_tokens, stride)
        padding = padding_strategy(padding)
        if pad_to_multiple_of is not None:
            check_number("pad_to_multiple_of", pad_to_multiple_of, minimum=1, integer=True)
            if padding != "do_not_pad" and fit.strategy and fit.max_length % pad_to_multiple_of:
                # Padding past the truncation length would give rows longer than max_length (the model's 512).
                if truncation is not None:
                    raise ConfigError(f"truncation to {fit.max_length} tokens and padding to a multiple of "
                                      f"{pad_to_multiple_of} can't both hold: give a max_length that is a multiple "
                                      f"of pad_to_multiple_of, or truncation=False")
                # Not asked for (transformers would cut nothing): cut where both hold.
                fit = dataclasses.replace(fit, max_length=fit.max_length - fit.max_length % pad_to_multiple_of)
        side = self.padding_side if padding_side is None else check_side("padding_side", padding_side)
        check_tensor_kind(return_tensors)

        details = return_offsets_mapping or return_word_ids
        groups = [self._encode_rows(first, second, fit, details, split_special_tokens, add_special_tokens)
                  for first, second in zip(texts, pairs or [None] * len(texts))]
        rows = list(chain.from_iterable(groups))
        names = ("input_ids", "token_type_ids", "attention_mask") + (("offset_mapping", "word_ids") if details else ())
        columns = {name: [row[name] for row in rows] for name in names}
        if return_special_tokens_mask:
            columns["special_tokens_mask"] = [special_tokens_mask(row["token_type_ids"], add_special_tokens)
                                              for row in rows]
        if padding != "do_not_pad":  # a vocabulary without [PAD] encodes fine until padding is asked for
            pad_columns(columns, self.pad_token_id, padding, fit.max_length, pad_to_multiple_of, side)

        word_ids = columns.pop("word_ids", None)
        offsets = columns.pop("offset_mapping", None)
        if not (return_token_type_ids if return_token_type_ids is not None else
                "token_type_ids" in self.model_input_names):
            del columns["token_type_ids"]
        if not (return_attention_mask if return_attention_mask is not None else
                "attention_mask" in self.model_input_names):
            del columns["attention_mask"]
        if return_offsets_mapping:
            columns["offset_mapping"] = offsets
        if return_word_ids:
            columns["word_ids"] = word_ids
        if return_length:  # as transformers counts it, padding included
            columns["length"] = [len(ids) for ids in columns["input_ids"]]
        if return_overflowing_tokens:
            columns["overflow_to_sample_mapping"] = flat_index([len(group) for group in groups])
            is_batch = True
        if return_tensors is not None:
            columns = to_tensors(columns, return_tensors)
        elif not is_batch:  # one text: flat lists (but `length` stays a list, as transformers gives it)
            columns = {name: values if name == "length" else values[0] for name, values in columns.items()}

        def align() -> dict[str, list]:
            """Per row: tokens, offsets, word ids and sequence ids, from the same call with every detail asked."""
            # (BertTokenizer's own call: a subclass's __call__ may change the texts, which `called_text` holds done)
            full = BertTokenizer.__call__(
                as_called, called_text, called_pair, max_length, truncation, padding, return_offsets_mapping=True,
                return_word_ids=True, return_special_tokens_mask=True, return_token_type_ids=True,
                return_attention_mask=True, is_split_into_words=is_split_into_words,
                return_overflowing_tokens=return_overflowing_tokens, stride=stride,
                pad_to_multiple_of=pad_to_multiple_of, padding_side=side, split_special_tokens=split_special_tokens,
                add_special_tokens=add_special_tokens)
            rows = {name: values if is_batch else [values] for name, values in full.items()}
            return {name: rows[name] for name in ENCODING_COLUMNS if name in rows} | {
                    "tokens": [self.convert_ids_to_tokens(ids) for ids in rows["input_ids"]],
                    "offset_mapping": [[tuple(span) for span in row] for row in rows["offset_mapping"]],
                    "word_ids": rows["word_ids"],
                    "sequence_ids": [sequence_ids(mask, segments) for mask, segments in
                                     zip(rows["special_tokens_mask"], rows["token_type_ids"])],
                    # a pair is two sequences even where a text gave no token (and no [SEP] says so)
                    "n_sequences": [1 if pairs is None else 2] * len(rows["input_ids"])}

        return BatchEncoding(columns, word_ids, align)

    def _as_now(self) -> BertTokenizer:
        """A copy that keeps this tokenizer's settings, added tokens and special tokens as they are now (its
        vocabulary shared: added tokens only append to it)."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.vocab = object.__new__(type(self.vocab))
        copy.vocab.__dict__.update(self.vocab.__dict__, special_tokens=dict(self.vocab.special_tokens))
        return copy

    def _encode_rows(self, text: str, pair: str | None, fit: Truncation, details: bool,
                     split: bool | None = None, add_special_tokens: bool = True) -> list[dict[str, list]]:
        """The [CLS] A [SEP] (B [SEP]) rows of one text or pair (strings, as __call__ checked): one, truncated to
        fit, or one per window."""
        encode = (lambda value: Tokens(*self._encode_details(value, split))) if details else \
            (lambda value: Tokens(self._encode_ids(value, split)))
        first = encode(text)
        second = encode(pair) if pair is not None else None
        return [with_special_tokens(a, b, self.cls_token_id, self.sep_token_id, details, add_special_tokens)
                for a, b in truncated_pairs(first, second, fit, add_special_tokens)]

    def pad(self, encoded_inputs: Any, padding: bool | str = True, max_length: int | None = None,
            pad_to_multiple_of: int | None = None, return_tensors: str | None = None,
            padding_side: str | None = None, return_attention_mask: bool | None = None,
            verbose: bool = True) -> BatchEncoding:
        """Pad encodings made without padding into one batch, as a data collator does: a list of encodings
        (dicts of flat lists, e.g. dataset rows) or one dict of lists of rows. The tokenizer's per-token columns
        are padded; other values (labels) are kept as they are, as transformers keeps them, and become tensors of
        their own type. `return_attention_mask=False` leaves the mask out; `verbose` is accepted and unused, as in
        __call__. Without `return_tensors`, input ids given as torch tensors or numpy arrays come back as such, as
        transformers gives them back."""
        check_tensor_kind(return_tensors)
        as_given = _array_kind(encoded_inputs) if return_tensors is None else None
        single = False
        if isinstance(encoded_inputs, Mapping):
            columns = {name: rows_of(values) if isinstance(values, list | tuple) or hasattr(values, "tolist") else
                       values for name, values in encoded_inputs.items()}
            ids = columns.get("input_ids") or [[]]
            single = not isinstance(ids[0], (list, tuple))
            if single:  # one encoding, flat lists: padded and given back flat
                columns = {name: [values] for name, values in columns.items()}
        else:
            encodings = list(encoded_inputs) if isinstance(encoded_inputs, Iterable) else []
            if not encodings or not all(isinstance(encoding, Mapping) for encoding in encodings):
                raise InputError(f"pad takes a list of encodings (dicts of input_ids, ...) or one dict of lists, got "
                                 f"{encoded_inputs!r:.60}")
            for index, encoding in enumerate(encodings):
                missing = [name for name in encodings[0] if name not in encoding]
                if missing:
                    raise InputError(f"pad: encoding {index} has no {missing[0]!r}, which the first has")
            columns = {name: [rows_of(encoding[name]) if hasattr(encoding[name], "tolist") else encoding[name]
                              for encoding in encodings] for name in encodings[0]}
        if "input_ids" not in columns:
            raise InputError(f"pad needs input_ids among the encodings' keys, got {sorted(columns)}")
        lengths = [len(ids) for ids in columns["input_ids"]]
        per_token = {name: [list(row) for row in rows] for name, rows in columns.items() if name in TOKEN_COLUMNS}
        for name, rows in per_token.items():
            if any(len(row) != n for row, n in zip(rows, lengths)):
                raise InputError(f"pad: the {name} of an encoding is not as long as its input_ids")
        if "attention_mask" not in per_token:
            per_token["attention_mask"] = [[1] * n for n in lengths]
        side = self.padding_side if padding_side is None else check_side("padding_side", padding_side)
        padding = padding_strategy(padding)
        if padding == "max_length" and max_length is None:
            max_length = self.model_max_length
        pad_columns(per_token, self.pad_token_id, padding, max_length, pad_to_multiple_of, side)
        columns |= per_token
        if return_attention_mask is False:
            del columns["attention_mask"]
        if as_given is not None:
            made = to_tensors(columns, as_given)
            return BatchEncoding({name: values[0] for name, values in made.items()} if single else made)
        if single and return_tensors is None:
            columns = {name: values[0] for name, values in columns.items()}
        return BatchEncoding(to_tensors(columns, return_tensors))


def _array_kind(encoded_inputs: Any) -> str | None:
    """The kind of array pad's input ids came as ("pt": torch's, "np": numpy's), None for lists: that of the first
    row with tokens, as transformers looks."""
    encodings = encoded_inputs if isinstance(encoded_inputs, list | tuple) else [encoded_inputs]
    for encoding in encodings:
        ids = encoding.get("input_ids") if isinstance(encoding, Mapping) else None
        for row in ids if isinstance(ids, list | tuple) else [ids]:
            if getattr(row, "ndim", 0) >= 1 and len(row):
                return {"torch": "pt", "numpy": "np"}.get(type(row).__module__.split(".")[0])
            if isinstance(row, int) or isinstance(row, list | tuple) and row:
                return None
    return None


def _check_strings(values: list, name: str) -> None:
    """A one-line error naming the first of `values` that is not a string; `name` takes its index ("text[{}]")."""
    for index, value in enumerate(values):
        if not isinstance(value, str):
            kind = "None" if value is None else "bytes: decode them first" if isinstance(value, (bytes, bytearray)) \
                else type(value).__name__
            raise InputError(f"{name.format(index)} must be a string, got {kind}")


def _copied(value: Any) -> Any:
    """Inputs as they are now: lists and tuples copied at every depth (the strings in them can't change)."""
    if isinstance(value, list | tuple):
        return (list if isinstance(value, list) else tuple)(_copied(item) for item in value)
    return value


def _is_batch_input(text: str | Sequence, is_split_into_words: bool) -> bool:
    """Whether a call's `text` is a batch: a list of texts, or of word lists when the words are given."""
    if is_split_into_words:
        return bool(text) and not isinstance(text[0], str)
    return not isinstance(text, str)


def _pairs_like(texts: list[str], text_pair: str | Sequence[str] | None, is_batch: bool) -> list[str] | None:
    if text_pair is None:
        return None
    if isinstance(text_pair, str) != (not is_batch):
        raise InputError("text and text_pair must both be strings or both be lists of strings")
    pairs = [text_pair] if not is_batch else list(text_pair)
    if len(pairs) != len(texts):
        raise InputError(f"got {len(texts)} texts but {len(pairs)} text pairs")
    return pairs


def _input_names(names: Sequence[str]) -> list[str]:
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names) or \
            not set(names) <= set(MODEL_INPUT_NAMES) or "input_ids" not in names:
        raise ConfigError(f"model_input_names must list input_ids and any of token_type_ids, attention_mask; got "
                          f"{names!r}")
    return list(names)


def _vocab_of(vocab: Vocab | str | Path | Mapping[str, int] | None, vocab_file: str | Path | None) -> Vocab:
    if (vocab is None) == (vocab_file is None):
        raise ConfigError("BertTokenizer needs one vocabulary: vocab (a vocab.txt path, or token -> id) or "
                          "vocab_file")
    vocab = vocab if vocab is not None else vocab_file
    if isinstance(vocab, Vocab):
        return vocab
    if isinstance(vocab, Mapping):
        return Vocab.from_ids(vocab)
    return Vocab.from_file(vocab)


def _special_settings(settings: dict[str, Any], others: Sequence[str] = ()) -> dict[str, Any]:
    """Takes the special tokens (unk_token="<unk>", additional_special_tokens=[...]) out of `settings` and
    returns them (those given as None left out, as transformers ignores them); refuses the slow tokenizer's
    options by name, and any other setting but `others`."""
    special = {key: settings.pop(key) for key in list(settings)
               if key in SPECIAL_TOKEN_ROLES or key in EXTRA_SPECIAL_KEYS}
    _check_slow_only(settings)
    unknown = sorted(set(settings) - set(others))
    if unknown:
        raise ConfigError(f"unknown tokenizer setting {unknown[0]!r}; expected one of "
                          f"{list(SETTINGS) + list(SPECIAL_TOKEN_ROLES) + list(EXTRA_SPECIAL_KEYS)}")
    return {key: value for key, value in special.items() if value is not None}


SLOW_ONLY_SETTINGS = frozenset({"do_basic_tokenize", "never_split"})  # _check_slow_only's


def _check_slow_only(settings: dict[str, Any]) -> None:
    """transformers' slow BertTokenizer's options, which its fast one (and so bertforge's) doesn't have: their
    defaults are accepted, anything else refused by name rather than ignored."""
    if settings.pop("do_basic_tokenize", True) is not True:
        raise ConfigError("do_basic_tokenize=False is not supported: bertforge always splits words first, as "
                          "transformers' fast tokenizer does")
    if settings.pop("never_split", None):
        raise ConfigError("never_split is transformers' slow tokenizer's (its fast one ignores it); to keep a word "
                          "whole, add it: tokenizer.add_tokens([...])")


def _check_settings(settings: dict[str, Any], source: Path) -> None:
    """Flags must be true/false (the string "no" is truthy), model_max_length a positive integer."""
    for key in ("do_lower_case", "tokenize_chinese_chars", "strip_accents", "clean_up_tokenization_spaces",
                "split_special_tokens"):
        value = settings.get(key, False)
        if not isinstance(value, bool) and not (key == "strip_accents" and value is None):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
    for key in ("padding_side", "truncation_side"):
        if key in settings and settings[key] not in ("right", "left"):
            raise ConfigError(f"{source}: {key} must be 'right' or 'left', got {settings[key]!r}")
    try:
        if "model_max_length" in settings:
            check_number("model_max_length", settings["model_max_length"], minimum=1, integer=True)
        if "model_input_names" in settings:
            _input_names(settings["model_input_names"])
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
