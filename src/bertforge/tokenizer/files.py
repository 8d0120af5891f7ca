"""The tokenizer files transformers reads and writes, in its order of precedence.

tokenizer.json (the WordPiece vocabulary, normaliser settings and added tokens; transformers 5 writes only this)
or vocab.txt; then special_tokens_map.json and added_tokens.json (older versions); then tokenizer_config.json,
whose settings and added_tokens_decoder win over the others, as in transformers. tokenizer.json's truncation and
padding sections are not adopted: bertforge truncates and pads as each call asks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.atomic import write_text_atomic
from bertforge.errors import CheckpointError, ConfigError
from bertforge.tokenizer.added import AddedToken
from bertforge.tokenizer.vocab import SPECIAL_TOKENS, UNUSED_ROLES, Vocab
from bertforge.tokenizer.wordpiece import CONTINUATION, MAX_WORD_CHARS

logger = logging.getLogger("bertforge")

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"

DEFAULT_MAX_LENGTH = 512
# What transformers writes as model_max_length for "no limit" (its VERY_LARGE_INTEGER)
NO_LENGTH_LIMIT = int(1e30)
# tokenizer_config.json keys that bertforge honours; the other keys transformers writes are metadata.
SETTINGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length", "padding_side",
            "truncation_side", "clean_up_tokenization_spaces", "split_special_tokens", "model_input_names")
# What the tokenizer returns when a call doesn't say (tokenizer_config.json's model_input_names; a checkpoint of a
# model without segments, DistilBERT's, leaves token_type_ids out).
MODEL_INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
# tokenizer.json's BertNormalizer fields -> the tokenizer_config.json settings they mean.
NORMALIZER_SETTINGS = {"lowercase": "do_lower_case", "strip_accents": "strip_accents",
                       "handle_chinese_chars": "tokenize_chinese_chars"}
# Where the lists of extra special tokens live: transformers 4 and 5 spell them differently.
EXTRA_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")


@dataclass
class TokenizerFiles:
    """What a directory's tokenizer files say: BertTokenizer's arguments."""

    vocab: Vocab
    settings: dict[str, Any]
    added_tokens: dict[int, AddedToken]
    max_word_chars: int = MAX_WORD_CHARS
    # the special tokens the files list beyond the roles (additional_special_tokens, or transformers 5's
    # extra_special_tokens): a special added token they don't list is special, but not among all_special_ids
    extra_special: tuple[str, ...] = ()


def has_tokenizer_files(directory: Path) -> bool:
    """Whether the folder holds a vocabulary (tokenizer.json or vocab.txt)."""
    return (directory / TOKENIZER_FILE).is_file() or (directory / VOCAB_FILE).is_file()


def read_tokenizer_files(directory: Path) -> TokenizerFiles:
    """Every tokenizer layout transformers writes; an unreadable file or an unsupported setting is an error
    naming the file."""
    config = _read_json(directory / CONFIG_FILE)
    _check_config(config, directory / CONFIG_FILE)
    special_map = _read_json(directory / SPECIAL_TOKENS_MAP_FILE)
    settings: dict[str, Any] = {}
    added: dict[int, AddedToken] = {}
    roles: dict[str, str] = {}
    max_word_chars = MAX_WORD_CHARS
    lowercase_first = False
    if (directory / TOKENIZER_FILE).is_file():
        path = directory / TOKENIZER_FILE
        data = _read_json(path)
        tokens, roles["unk_token"], max_word_chars = _wordpiece_model(data.get("model"), path)
        normalizer_settings, lowercase_first = _normalizer_settings(data.get("normalizer"), path)
        settings |= normalizer_settings
        pre_tokenizer = data.get("pre_tokenizer")
        pre_tokenizer = pre_tokenizer.get("type") if isinstance(pre_tokenizer, dict) else pre_tokenizer
        if pre_tokenizer != "BertPreTokenizer":
            raise ConfigError(f"{path}: pre_tokenizer {pre_tokenizer!r} is not supported (BERT's is BertPreTokenizer)")
        if data.get("truncation") or data.get("padding"):
            logger.info("%s: its truncation and padding sections are not adopted (bertforge truncates at "
                        "model_max_length and pads as each call asks)", path)
        entries = data.get("added_tokens") or []
        if not isinstance(entries, list):
            raise CheckpointError(f"{path}: added_tokens must be a list of tokens, got {entries!r:.60}")
        for index, entry in enumerate(entries):
            where = f"added_tokens[{index}]"
            token_id = _token_id(entry.get("id") if isinstance(entry, dict) else None, path, f"{where}'s id")
            added[token_id] = _added_token(entry, path, where)
        vocab = Vocab(tokens, path=path)
    else:
        vocab = Vocab.from_file(directory / VOCAB_FILE)
    sources = ((special_map, directory / SPECIAL_TOKENS_MAP_FILE), (config, directory / CONFIG_FILE))
    for source, source_path in sources:
        roles |= {role: _content(source[role], source_path, role) for role in (*SPECIAL_TOKENS, *UNUSED_ROLES)
                  if source.get(role)}
    extra_special = list(dict.fromkeys(_content(token, source_path, key) for source, source_path in sources
                                       for key in EXTRA_SPECIAL_KEYS
                                       for token in _listed(source.get(key), source_path, key)))
    for content, token_id in _read_json(directory / ADDED_TOKENS_FILE).items():
        token_id = _token_id(token_id, directory / ADDED_TOKENS_FILE, f"the id of {content!r}")
        added.setdefault(token_id, AddedToken.from_dict(content, special=content in extra_special))
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise CheckpointError(f"{directory / CONFIG_FILE}: added_tokens_decoder must be an object of token ids to "
                              f"tokens, got {decoder!r:.60}")
    for token_id, entry in decoder.items():
        where = f"added_tokens_decoder[{token_id!r}]"
        added[_token_id(token_id, directory / CONFIG_FILE, where)] = _added_token(entry, directory / CONFIG_FILE,
                                                                                   where)
    next_id = max([len(vocab), *(token_id + 1 for token_id in added)])
    listed = {token.content for token in added.values()}
    for content in [content for content in extra_special if content not in listed]:
        # Listed as special but given no id: the vocabulary's own entry, or the next free id (transformers adds it).
        token_id = vocab.token_to_id.get(content)
        if token_id is None:
            token_id, next_id = next_id, next_id + 1
        added[token_id] = AddedToken(content, special=True, normalized=False)
    vocab.special_tokens |= roles
    settings |= {key: config[key] for key in SETTINGS if key in config}
    if lowercase_first:
        settings |= _lowercased(settings)
    if means_no_limit(settings.get("model_max_length")):
        # BERT's position table makes 512 the real limit
        settings["model_max_length"] = DEFAULT_MAX_LENGTH
    return TokenizerFiles(vocab, settings, added, max_word_chars, tuple(extra_special))


def means_no_limit(model_max_length: Any) -> bool:
    """Whether a recorded model_max_length is transformers' huge sentinel for "no limit" (NO_LENGTH_LIMIT)."""
    return (isinstance(model_max_length, (int, float)) and not isinstance(model_max_length, bool)
            and model_max_length > 10**12)


def write_tokenizer_files(tokenizer, directory: Path, model_max_length: int | None = None) -> list[Path]:
    """vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json and (with tokens added beyond
    the vocabulary) added_tokens.json: what transformers 4 and 5 write, so that each of them reads it back. Returns
    the files written."""
    vocab = tokenizer.vocab
    vocab.save(directory / VOCAB_FILE)
    written = [directory / CONFIG_FILE, directory / SPECIAL_TOKENS_MAP_FILE, directory / VOCAB_FILE]
    roles = {role: token for role, token in vocab.special_tokens.items() if vocab.has_special(role)}
    added = dict(sorted(tokenizer.added_tokens.items()))
    extra_special = tokenizer.additional_special_tokens
    config = {key: getattr(tokenizer, key) for key in SETTINGS if key != "model_input_names"} | roles | (
        {} if tuple(tokenizer.model_input_names) == MODEL_INPUT_NAMES else
        {"model_input_names": list(tokenizer.model_input_names)}) | {
        "model_max_length": model_max_length or tokenizer.model_max_length,
        "added_tokens_decoder": {str(token_id): token.to_dict() for token_id, token in added.items()},
        "additional_special_tokens": extra_special,
        "tokenizer_class": "BertTokenizer",
    }
    write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special_map = roles | ({"additional_special_tokens": extra_special} if extra_special else {})
    write_text_atomic(directory / SPECIAL_TOKENS_MAP_FILE, json.dumps(special_map, indent=2, ensure_ascii=False)
                      + "\n")
    beyond = {token.content: token_id for token_id, token in added.items() if token_id >= vocab.num_pieces}
    if beyond:
        write_text_atomic(directory / ADDED_TOKENS_FILE, json.dumps(beyond, indent=2, ensure_ascii=False) + "\n")
        written.append(directory / ADDED_TOKENS_FILE)
    if vocab.has_special("cls_token") and vocab.has_special("sep_token") and vocab.has_special("unk_token"):
        write_text_atomic(directory / TOKENIZER_FILE, json.dumps(_tokenizer_json(tokenizer, added), indent=2,
                                                                 ensure_ascii=False) + "\n")
        written.append(directory / TOKENIZER_FILE)
    else:
        # transformers would read a stale tokenizer.json in preference to the vocab.txt just written.
        (directory / TOKENIZER_FILE).unlink(missing_ok=True)
    return written


def _tokenizer_json(tokenizer, added: dict[int, AddedToken]) -> dict[str, Any]:
    """The tokenizers library's serialisation of this BERT tokenizer."""
    vocab = tokenizer.vocab
    cls, sep = vocab.special_tokens["cls_token"], vocab.special_tokens["sep_token"]

    def special(token: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": token_id, **token.to_dict()} for token_id, token in added.items()],
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": tokenizer.tokenize_chinese_chars,
                       "strip_accents": tokenizer.strip_accents, "lowercase": tokenizer.do_lower_case},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special(cls, 0), sequence("A", 0), special(sep, 0)],
            "pair": [special(cls, 0), sequence("A", 0), special(sep, 0), sequence("B", 1), special(sep, 1)],
            "special_tokens": {token: {"id": token, "ids": [vocab.token_to_id[token]], "tokens": [token]}
                               for token in (cls, sep)},
        },
        "decoder": {"type": "WordPiece", "prefix": CONTINUATION, "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": vocab.special_tokens["unk_token"],
                  "continuing_subword_prefix": CONTINUATION, "max_input_chars_per_word": tokenizer.max_word_chars,
                  "vocab": {token: index for index, token in enumerate(vocab.lines)}},
    }


def _wordpiece_model(model: Any, path: Path) -> tuple[list[str], str, int]:
    """tokenizer.json's model: the tokens in id order, the unknown token and the word length limit."""
    if not isinstance(model, dict) or model.get("type", "WordPiece") != "WordPiece" or \
            not isinstance(model.get("vocab"), dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise ConfigError(f"{path}: model type {kind!r} is not supported (BERT's tokenizer is WordPiece)")
    prefix = model.get("continuing_subword_prefix", CONTINUATION)
    if prefix != CONTINUATION:
        raise ConfigError(f"{path}: continuing_subword_prefix={prefix!r} is not supported (BERT's is '##')")
    vocab = model["vocab"]
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        if not isinstance(index, int) or not 0 <= index < len(vocab) or tokens[index]:
            raise CheckpointError(f"{path}: the vocabulary's ids are not 0..{len(vocab) - 1}, each once "
                                  f"({token!r} has {index!r})")
        tokens[index] = token
    longest = model.get("max_input_chars_per_word") or MAX_WORD_CHARS
    if isinstance(longest, bool) or not isinstance(longest, int) or longest < 1:
        raise CheckpointError(f"{path}: max_input_chars_per_word must be a whole number from 1, got {longest!r}")
    return tokens, model.get("unk_token") or SPECIAL_TOKENS["unk_token"], longest


def _normalizer_settings(normalizer: Any, path: Path) -> tuple[dict[str, Any], bool]:
    """The settings of tokenizer.json's BertNormalizer, and whether a Lowercase step runs before it:
    sentence-transformers 6 saves a model it lower-cases (do_lower_case) with Sequence [Lowercase, BertNormalizer]."""
    steps = normalizer.get("normalizers") if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence" \
        else None
    lowercase_first = isinstance(steps, list) and len(steps) == 2 and isinstance(steps[0], dict) and \
        steps[0].get("type") == "Lowercase" and isinstance(steps[1], dict) and steps[1].get("type") == "BertNormalizer"
    if lowercase_first:
        normalizer = steps[1]
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        kind = normalizer.get("type") if isinstance(normalizer, dict) else normalizer
        raise ConfigError(f"{path}: normalizer {kind!r} is not supported (BERT's is BertNormalizer)")
    if normalizer.get("clean_text", True) is False:
        raise ConfigError(f"{path}: normalizer clean_text=false is not supported (bertforge always cleans text)")
    settings = {setting: normalizer[field] for field, setting in NORMALIZER_SETTINGS.items() if field in normalizer}
    return settings, lowercase_first


def _lowercased(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of a BertNormalizer with a Lowercase step before it: lower-cased whatever its own flag, but
    accents stripped only as that flag says when strip_accents is None (Lowercase + BertNormalizer(lowercase=False)
    keeps 'é'). tokenizer_config.json's do_lower_case describes the BertNormalizer alone, as sentence-transformers
    leaves it."""
    own_lowercase = settings.get("do_lower_case", True)
    strip_accents = settings.get("strip_accents")
    if not isinstance(own_lowercase, bool):
        return {}  # left for _check_settings to report
    return {"do_lower_case": True, "strip_accents": own_lowercase if strip_accents is None else strip_accents}


def _check_config(config: dict[str, Any], path: Path) -> None:
    """Refuse tokenizer_config.json settings bertforge can't honour."""
    if config.get("do_basic_tokenize", True) is False:
        raise ConfigError(f"{path}: do_basic_tokenize=false is not supported (bertforge always splits words first)")
    if config.get("never_split"):
        raise ConfigError(f"{path}: never_split is not supported (add the words as tokens instead)")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a tokenizer file ({} when the file is absent)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is no part of the JSON
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:  # json.loads recurses per level of nesting
        raise CheckpointError(f"{path}: a JSON value nested too deeply to read") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _token_id(value: Any, path: Path, where: str) -> int:
    """A token id as the files hold it: a whole number, or its digits (the keys of added_tokens_decoder)."""
    if isinstance(value, str) and value.isdecimal():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise CheckpointError(f"{path}: {where}: expected a token id (a whole number from 0), got {value!r:.60}")


def _added_token(entry: Any, path: Path, where: str) -> AddedToken:
    """An added token as transformers writes it: {"content": text, "special": ..., ...} (or the bare text)."""
    _content(entry, path, where)
    return AddedToken.from_dict(entry)


def _content(value: Any, path: Path, where: str) -> str:
    """A token as transformers writes it: its text, or {"content": "[UNK]", ...}."""
    content = value.get("content") if isinstance(value, dict) else value
    if not isinstance(content, str) or not content:
        raise CheckpointError(f"{path}: {where}: expected a token (its text, or {{\"content\": its text, ...}}), "
                              f"got {value!r:.60}")
    return content


def _listed(value: Any, path: Path, key: str) -> list:
    """A list of tokens, or the values of transformers 5's named extra special tokens."""
    if isinstance(value, dict):
        return list(value.values())
    if value is not None and not isinstance(value, list):
        raise CheckpointError(f"{path}: {key} must be a list of tokens, got {value!r:.60}")
    return value or []
