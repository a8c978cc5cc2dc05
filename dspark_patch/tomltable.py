"""The checks every table of a patch.toml gets, each failure one InvalidPatchSet line naming the
table (`where`) and the key: no key outside the allowed ones, none of the required missing, and
strings that say something."""

from __future__ import annotations

from .errors import InvalidPatchSet


def keys(table: dict, *, allowed: set[str] | frozenset[str], required: set[str] | frozenset[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise InvalidPatchSet(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(table))
    if missing:
        raise InvalidPatchSet(f"{where}: missing key(s) {', '.join(missing)}")


def string(table: dict, key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise InvalidPatchSet(f"{where}: {key} must be a non-empty string")
    return value
