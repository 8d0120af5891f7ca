"""Vocab: the WordPiece vocabulary of vocab.txt (one token per line, its id is its line number)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bertforge.atomic import write_text_atomic
from bertforge.errors import InputError

# role -> default token; every BERT vocabulary has these five, and encoding needs all of them.
SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


class Vocab:
    """token <-> id, plus the ids of the special tokens.

    >>> vocab = Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able"])
    >>> vocab.token_to_id["##aff"], vocab.id_to_token[5], vocab.unk_token_id
    (6, 'un', 1)
    """

    def __init__(self, tokens: Iterable[str], special_tokens: dict[str, str] | None = None,
                 path: str | Path | None = None):
        self.id_to_token: list[str] = list(tokens)
        # A token listed twice maps to its last line, as transformers' load_vocab does.
        self.token_to_id: dict[str, int] = {token: index for index, token in enumerate(self.id_to_token)}
        self.special_tokens = dict(SPECIAL_TOKENS)
        for role, token in (special_tokens or {}).items():
            if role not in SPECIAL_TOKENS:
                raise InputError(f"unknown special token role {role!r}; expected one of {sorted(SPECIAL_TOKENS)}",
                                 path=path)
            self.special_tokens[role] = token
        for role, token in self.special_tokens.items():
            if token not in self.token_to_id:
                name = role.removesuffix("_token")
                raise InputError(f"the vocabulary has no {name} token {token!r}", path=path)

    @classmethod
    def from_file(cls, path: str | Path, special_tokens: dict[str, str] | None = None) -> Vocab:
        """Read vocab.txt: line i (0-based) is the token with id i."""
        path = Path(path)
        if not path.is_file():
            raise InputError("vocabulary file not found", path=path)
        try:
            with open(path, encoding="utf-8") as handle:
                # Only the newline is stripped: a token may legitimately end in other whitespace.
                tokens = [line.rstrip("\n") for line in handle]
        except UnicodeDecodeError as error:
            raise InputError(f"vocabulary is not UTF-8 text ({error.reason})", path=path) from None
        if not tokens:
            raise InputError("vocabulary file is empty", path=path)
        return cls(tokens, special_tokens, path=path)

    def save(self, path: str | Path) -> None:
        """Write vocab.txt so that from_file gives back the same ids."""
        write_text_atomic(path, "".join(token + "\n" for token in self.id_to_token))

    def __len__(self) -> int:
        return len(self.id_to_token)

    def __contains__(self, token: str) -> bool:
        return token in self.token_to_id

    def special_id(self, role: str) -> int:
        """'cls_token' -> 101 on the usual uncased vocabulary."""
        return self.token_to_id[self.special_tokens[role]]

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
