"""What a model's forward returns: a dataclass of tensors that also reads as transformers' ModelOutput does, so
that code written for it (`outputs[0]`, `outputs["logits"]`, `outputs.to_tuple()`) runs unchanged."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import torch
import torch.utils._pytree as pytree


def by_name_only(default: Any = None) -> Any:
    """A field of bertforge's own beside transformers' (PreTrainingOutput's two losses): read by name, left out of
    the tuple, where it would move the fields after it from the positions transformers gives them."""
    return dataclasses.field(default=default, metadata={"in_tuple": False})


class ModelOutput:
    """Mixed into the output dataclasses. As a tuple, the fields that are set, the loss first (as transformers
    orders them: `loss, logits = model(..., labels=labels)[:2]`); as a mapping, those fields by name. torch.export
    and torch.compile read each output as a tree of its fields, as they read transformers' outputs."""

    def __init_subclass__(cls, **options: Any) -> None:
        super().__init_subclass__(**options)
        # The fields are read when an output is flattened: the dataclass decorator makes them after this runs.
        pytree.register_pytree_node(cls, _fields_of, partial(_output_of, cls),
                                    serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")

    def to_tuple(self) -> tuple[Any, ...]:
        by_name = {field.name for field in dataclasses.fields(self) if not field.metadata.get("in_tuple", True)}
        return tuple(self[name] for name in self.keys() if name not in by_name)

    def keys(self) -> list[str]:
        names = [field.name for field in dataclasses.fields(self) if getattr(self, field.name) is not None]
        # stable: the loss first, the rest in order, then keys the caller added
        return sorted(names, key=lambda name: name != "loss") + list(self.__dict__.get("_added", {}))

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return self.__dict__["_added"][key] if key in self.__dict__.get("_added", {}) else getattr(self, key)
        return self.to_tuple()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        """A field set by name, or another key kept beside the fields (transformers' pipelines add input_ids)."""
        if any(field.name == key for field in dataclasses.fields(self)):
            setattr(self, key, value)
        else:
            self.__dict__.setdefault("_added", {})[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.keys() else default

    def values(self) -> list[Any]:
        return [self[key] for key in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(key, self[key]) for key in self.keys()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


def _fields_of(output: ModelOutput) -> tuple[list[Any], list[str]]:
    names = [field.name for field in dataclasses.fields(output)]
    return [getattr(output, name) for name in names], names


def _output_of(cls: type, values: list[Any], names: list[str]) -> ModelOutput:
    return cls(**dict(zip(names, values)))


def returned(output: ModelOutput, return_dict: bool | None) -> ModelOutput | tuple[Any, ...]:
    """A forward's result as its caller asked: the output (None or True), or its tuple (False, as transformers'
    `return_dict=False` gives, for code that unpacks tuples; and by default under torch.jit.trace, which records
    tensors and tuples only, as transformers' `torchscript=True` makes its models return)."""
    if return_dict is False or (return_dict is None and torch.jit.is_tracing()):
        return output.to_tuple()
    return output
