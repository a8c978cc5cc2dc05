"""The one JSON encoder: frozen dataclasses to JSON and back, for every document we write.

Field order is key order, tuples become lists and mappings objects. Reading back trusts the
shape: validate the document against its JSON Schema first (the schema is the only
description of the output), then `from_data` rebuilds the dataclasses from the type hints.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

_T = TypeVar("_T")


def to_data(value: Any) -> Any:
    """Plain dicts, lists, strings, numbers, booleans and None, ready for `json.dumps`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """The JSON text of a result or report, as written to files and printed by --json."""
    return json.dumps(to_data(value), indent=2, ensure_ascii=False) + "\n"


def from_data(cls: type[_T], data: Any) -> _T:
    """Rebuild a dataclass from data already validated against its schema."""
    return typing.cast(_T, _build(cls, data))


def _build(hint: Any, data: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _build(hints[f.name], data[f.name]) for f in dataclasses.fields(hint) if f.name in data})
    if origin is typing.Union or origin is types.UnionType:
        if data is None:
            return None
        (kind,) = [a for a in args if a is not type(None)]  # our models only use `X | None`
        return _build(kind, data)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        return tuple(_build(a, v) for a, v in zip(args, data, strict=False))
    if origin in (Mapping, dict) or (isinstance(origin, type) and issubclass(origin, Mapping)):
        return {k: _build(args[1], v) for k, v in data.items()}
    if hint is float:
        return float(data)  # JSON writes 2.0 as 2
    return data  # str, int, bool, Literal: as the schema let them through
