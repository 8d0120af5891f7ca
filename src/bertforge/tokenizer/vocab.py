"""Vocab: the WordPiece vocabulary of vocab.txt (one token per line, its id is its line number), and added tokens."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from bertforge.atomic import write_text_atomic
from bertforge.errors import InputError

# role -> default token. A vocabulary may lack some (google-research/bert's test vocabulary has no [PAD] or
# [MASK]): that is an error only when an operation needs the token, named here.
SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# Roles transformers also names, which BERT's template doesn't use: unset unless a user sets them (bert2bert
# recipes set bos_token to [CLS] and eos_token to [SEP]), then saved and read back as the others.
UNUSED_ROLES = ("bos_token", "eos_token")
NEEDED_FOR = {
    "pad_token": "padding",
    "unk_token": "words the vocabulary can't spell",
    "cls_token": "every encoding",
    "sep_token": "every encoding",
    "mask_token": "masking",
}


class Vocab:
    """token <-> id, plus the ids of the special tokens.

    >>> vocab = Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able"])
    >>> vocab.token_to_id["##aff"], vocab.id_to_token[5], vocab.unk_token_id
    (6, 'un', 1)

    `pieces` holds the WordPiece vocabulary itself (vocab.txt); `token_to_id` and `id_to_token` also hold the
    tokens added after it (transformers' added tokens), which WordPiece never produces: they are matched whole.
    """

    def __init__(self, tokens: Iterable[str], special_tokens: dict[str, str] | None = None,
                 path: str | Path | None = None):
        self.id_to_token: list[str] = list(tokens)
        self.path = path
        # A token listed twice maps to its last line, as transformers' load_vocab does.
        self.token_to_id: dict[str, int] = {token: index for index, token in enumerate(self.id_to_token)}
        self.pieces: dict[str, int] = dict(self.token_to_id)
        self.lines = list(self.id_to_token)  # vocab.txt as read (an added token may show one of them otherwise)
        self.special_tokens: dict[str, str | None] = dict(SPECIAL_TOKENS) | dict.fromkeys(UNUSED_ROLES)
        for role, token in (special_tokens or {}).items():
            if role not in self.special_tokens:
                raise InputError(f"unknown special token role {role!r}; expected one of "
                                 f"{sorted(self.special_tokens)}", path=path)
            self.special_tokens[role] = token

    @classmethod
    def from_file(cls, path: str | Path, special_tokens: dict[str, str] | None = None) -> Vocab:
        """Read vocab.txt: line i (0-based) is the token with id i."""
        path = Path(path)
        if not path.is_file():
            raise InputError("vocabulary file not found", path=path)
        try:
            # utf-8-sig: a byte-order mark (a file saved by a Windows editor) is no part of the first token, which
            # would otherwise be "\ufeff[PAD]" and no longer the padding token
            with open(path, encoding="utf-8-sig") as handle:
                # Trailing whitespace is no part of a token (tokenizers' reader trims it, and transformers loads
                # vocab.txt with it): text is split at whitespace, so "hello " could never be matched.
                tokens = [line.rstrip() for line in handle]
        except UnicodeDecodeError as error:
            raise InputError(f"vocabulary is not UTF-8 text ({error.reason})", path=path) from None
        if not tokens:
            raise InputError("vocabulary file is empty", path=path)
        return cls(tokens, special_tokens, path=path)

    @classmethod
    def from_ids(cls, token_to_id: Mapping[str, int], special_tokens: dict[str, str] | None = None) -> Vocab:
        """A vocabulary given as token -> id (transformers' BertTokenizer(vocab={...})), numbered 0 to n-1."""
        by_id = sorted(token_to_id.items(), key=lambda item: item[1])
        if [token_id for _, token_id in by_id] != list(range(len(by_id))):
            raise InputError("a vocabulary given as token -> id must number its tokens 0 to n-1, each id once")
        if not by_id:
            raise InputError("the vocabulary given is empty")
        return cls((token for token, _ in by_id), special_tokens)

    def add(self, token: str, token_id: int, shown: str | None = None) -> None:
        """Give an added token its id: the next free one, or an id the vocabulary already has (which it renames).

        `shown` is what id_to_token gives for it, when not the token itself: the normalised form of a token
        matched after normalisation, as in the reference ('Zürich' -> 'zurich').
        """
        shown = token if shown is None else shown
        if token_id == len(self.id_to_token):
            self.id_to_token.append(shown)
        elif 0 <= token_id < len(self.id_to_token):
            self.id_to_token[token_id] = shown
        else:
            raise InputError(f"added token {token!r} has id {token_id}, but the vocabulary's next id is "
                             f"{len(self.id_to_token)} (ids must follow on without gaps)", path=self.path)
        self.token_to_id[token] = token_id

    def save(self, path: str | Path) -> None:
        """Write vocab.txt (the WordPiece tokens; added tokens are saved apart) so that from_file gives back
        the same ids."""
        write_text_atomic(path, self.to_text())

    def to_text(self) -> str:
        """vocab.txt's contents: one WordPiece token a line, in id order."""
        return "".join(token + "\n" for token in self.lines)

    def __len__(self) -> int:
        return len(self.id_to_token)

    @property
    def num_pieces(self) -> int:
        """The WordPiece vocabulary's size (vocab.txt's lines), added tokens left out."""
        return len(self.lines)

    def __contains__(self, token: str) -> bool:
        return token in self.token_to_id

    # tokenizer.vocab as transformers users read it: a mapping of token -> id (added tokens included)
    def __getitem__(self, token: str) -> int:
        return self.token_to_id[token]

    def __iter__(self) -> Iterator[str]:
        return iter(self.token_to_id)

    def get(self, token: str, default: int | None = None) -> int | None:
        return self.token_to_id.get(token, default)

    def keys(self):
        return self.token_to_id.keys()

    def values(self):
        return self.token_to_id.values()

    def items(self):
        return self.token_to_id.items()

    def has_special(self, role: str) -> bool:
        return self.special_tokens[role] is not None and self.special_tokens[role] in self.token_to_id

    def special_id(self, role: str) -> int:
        """'cls_token' -> 101 on the usual uncased vocabulary; a token the vocabulary lacks is an InputError
        naming it, the file and what needs it."""
        token = self.special_tokens[role]
        token_id = self.token_to_id.get(token)
        if token_id is None:
            raise InputError(f"the vocabulary has no {role.removesuffix('_token')} token {token!r}, which "
                             f"{NEEDED_FOR[role]} needs", path=self.path)
        return token_id

    @property
    def pad_token_id(self) -> int:
        return self.special_id("pad_token")

    @property
    def unk_token_id(self) -> int:
        return self.special_id("unk_token")

    @property
    def cls_token_id(self) -> int:
        return self.special_id("cls_token")

    @property
    def sep_token_id(self) -> int:
        return self.special_id("sep_token")

    @property
    def mask_token_id(self) -> int:
        return self.special_id("mask_token")
