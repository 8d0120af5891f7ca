"""Typed dataclasses that round-trip to JSON, the source of truth for every configuration (a run's config file, a
command's flags): JsonConfig, and the checks that make a bad file a one-line error naming its key and the file
(an unknown key, a value of the wrong JSON type); read_json_object reads any JSON object file that way."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

from bertforge.atomic import write_text_atomic
from bertforge.errors import ConfigError


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from a file; a missing, unreadable or malformed file is a ConfigError naming it."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(f"a {what} file is named by its path, got {path!r:.60}")
    path = Path(path)
    try:
        # utf-8-sig: a byte-order mark (Windows editors and PowerShell write one) is no part of the JSON
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}, line {error.lineno}: invalid JSON: {error.msg}") from None
    # ValueError: not UTF-8, or an integer of over 4300 digits; RecursionError: nesting deeper than Python's stack
    except (OSError, ValueError, RecursionError) as error:
        raise ConfigError(f"{path}: cannot read {what}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {what} must be a JSON object")
    return data


def config_from_dict(cls, data: Any, source: str):
    """Build a config dataclass from a JSON object; unknown keys, values of the wrong JSON type and bad values name
    the key and `source`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [key for key in data if key not in names]
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; expected keys: {', '.join(names)}")
    check_field_types(cls, data, source)
    try:
        return cls(**data)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def check_field_types(cls, data: dict[str, Any], source: str) -> None:
    """Refuse a value whose JSON type isn't its field's annotation ("FILE: training: expected an object, got a
    list"), so that no value of the wrong type reaches code that assumes the right one; keys that aren't fields
    are left to the caller. Ranges and choices are checked where each dataclass is defined."""
    hints = field_types(cls)
    for key, value in data.items():
        if key in hints and not matches_type(value, hints[key]):
            raise ConfigError(f"{source}: {key}: expected {type_description(hints[key])}, got "
                              f"{value_description(value)}")


@functools.cache
def field_types(cls) -> dict[str, Any]:
    """A dataclass's fields and their annotations, resolved (the modules use `from __future__ import annotations`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _union_members(annotation: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return None


def matches_type(value: Any, annotation: Any) -> bool:
    """Whether `value` (as JSON reads it, or as Python code passes it) is of the annotated type: JSON has no
    tuples, so a list stands for one; an int is a float too, a bool is neither; a nested dataclass is an object."""
    members = _union_members(annotation)
    if members is not None:
        return any(matches_type(value, member) for member in members)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation in (str, Path):
        return isinstance(value, str)
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, (dict, annotation))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(matches_type, value, args))
        return not args or all(matches_type(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict)
    return True  # an annotation this check doesn't know: the dataclass checks it


def type_description(annotation: Any) -> str:
    """An annotation in JSON's words: "an object", "true or false", "a string or null", "a list of 2 numbers"."""
    members = _union_members(annotation)
    if members is not None:
        return " or ".join(type_description(member) for member in members)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args and args[-1] is not Ellipsis and len(set(args)) == 1:
        return f"a list of {len(args)} {type_description(args[0]).split(' ', 1)[1]}s"
    descriptions = {type(None): "null", bool: "true or false", int: "an integer", float: "a number",
                    str: "a string", Path: "a string", list: "a list", tuple: "a list", dict: "an object"}
    if dataclasses.is_dataclass(annotation):
        return "an object"
    return descriptions.get(origin or annotation, getattr(annotation, "__name__", str(annotation)))


# What each kind of JSON value is called in messages (bool before int: True is an int to Python).
VALUE_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "a list", tuple: "a list", dict: "an object"}


def value_kind(value: Any) -> str:
    """'an integer', 'a list', 'null': what kind of JSON value `value` is."""
    return next((name for type_, name in VALUE_KINDS.items() if isinstance(value, type_)),
                f"a {type(value).__name__}")


def value_description(value: Any) -> str:
    """What a JSON value is, with a short one's text or a list's length and items: 'a string ("yes")', "a list of
    2 lists"."""
    kind = value_kind(value)
    if isinstance(value, (bool, int, float, str)):
        text = json.dumps(value, ensure_ascii=False)
        return f"{kind} ({text if len(text) <= 40 else text[:37] + '...'})"
    if isinstance(value, (list, tuple)):
        # what the items are, where that is what is wrong: "a list of 2 lists" where 2 numbers belong
        if not value:
            return f"an empty {kind.split(' ')[-1]}"
        items = {value_kind(item).split(" ")[-1] for item in value}
        item = items.pop() if len(items) == 1 else "item"
        return f"{kind} of {len(value)} {item}{'s' * (len(value) > 1)}"
    return kind


class JsonConfig:
    """Base of the run configs (training, fine-tuning, pre-training): a dataclass that round-trips to a JSON file.
    Unknown keys and bad values are ConfigErrors naming the key and the file; a field whose default is a JsonConfig
    (e.g. FinetuneConfig.training) nests as a JSON object."""

    def to_dict(self) -> dict[str, Any]:
        return as_json(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config"):
        nested = {f.name: f.default_factory for f in dataclasses.fields(cls)
                  if isinstance(f.default_factory, type) and issubclass(f.default_factory, JsonConfig)}
        if isinstance(data, dict):
            data = {key: nested[key].from_dict(value, f"{source}, {key}")
                    if key in nested and isinstance(value, dict) else value for key, value in data.items()}
        return config_from_dict(cls, data, source)

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path):
        return cls.from_dict(read_json_object(path, "run config"), str(path))


def as_json(value: Any) -> Any:
    """Tuples as lists, all the way down: the value as JSON reads it back."""
    if isinstance(value, (tuple, list)):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    return value
