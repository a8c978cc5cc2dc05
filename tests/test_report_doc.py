"""docs/report.md's audit.json field table says what the shipped schema says (fast tier): every
field the schema has (two levels down, `$ref`s followed) is in the table, every field the
table names is in the schema, and each enum value of a layer change's `kind` is explained."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dspark_patch.report.audit_json import load_schema

DOC = Path(__file__).resolve().parents[1] / "docs" / "report.md"


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The object (or array item object) a schema node describes, following $ref and oneOf."""
    if "$ref" in node and node["$ref"].startswith("#/$defs/"):
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    for option in node.get("oneOf", ()):
        if option.get("type") == "object" or "$ref" in option:
            return _resolve(schema, option)
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        return _resolve(schema, node["items"])
    return node


def schema_fields(schema: dict[str, Any], node: dict[str, Any], prefix: str = "", depth: int = 2) -> set[str]:
    found: set[str] = set()
    for name, child in (node.get("properties") or {}).items():
        path = f"{prefix}{name}"
        found.add(path)
        if depth > 1 and child.get("$ref") != "#":  # `platforms[].report` is the whole report again
            found |= schema_fields(schema, _resolve(schema, child), f"{path}.", depth - 1)
    return found


def _top_names(group: str) -> list[str]:
    """`ok, ran, cases: [{name, ok}], detail` -> ok, ran, cases, detail (names at the outer level)."""
    names, depth, current = [], 0, ""
    for char in group + ",":
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if depth == 0 and char in ",:":
            if current.strip() and re.fullmatch(r"[a-z_]+", current.strip()):
                names.append(current.strip())
            current = "" if char == "," else "\0"  # after `name:` skip to the next comma
        elif current != "\0" or char == ",":
            current = current if current == "\0" else current + char
    return names


def doc_rows() -> list[tuple[list[str], str, str]]:
    section = DOC.read_text(encoding="utf-8").split("## audit.json", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            fields = [f.replace("[]", "") for f in re.findall(r"`([^`]+)`", cells[0])]
            # `files[].pre_sha256`, `post_sha256`: a bare second name shares the first one's parent
            parent = fields[0].rpartition(".")[0]
            fields = [f if "." in f or not parent else f"{parent}.{f}" for f in fields]
            rows.append((fields, cells[1], "|".join(cells[2:])))
    return rows


def doc_fields() -> set[str]:
    found: set[str] = set()
    for fields, kind, _ in doc_rows():
        for field in fields:
            parts = field.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
            match = re.match(r"`?\[?\{(.*)\}\]?", kind)
            if match:
                found |= {f"{field}.{name}" for name in _top_names(match.group(1))}
    return found


def test_the_field_table_and_the_schema_name_the_same_fields() -> None:
    schema = load_schema()
    documented, shipped = doc_fields(), schema_fields(schema, schema)
    assert sorted(shipped - documented) == []      # in the schema, not explained
    assert sorted(documented - shipped - {f for f in documented if f.count(".") >= 2}) == []  # explained, not there


def test_each_layer_change_kind_is_explained() -> None:
    schema = load_schema()
    kinds = schema["$defs"]["layer_change"]["properties"]["kind"]["enum"]
    (meaning,) = [m for fields, _, m in doc_rows() if fields == ["layer"]]
    assert [k for k in kinds if f"`{k}`" not in meaning] == []


def test_the_outer_names_of_a_nested_group_are_read() -> None:
    assert _top_names("ok, ran, cases: [{name, ok, detail}], detail, census") == ["ok", "ran", "cases", "detail", "census"]
