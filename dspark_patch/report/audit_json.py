"""audit.json: the versioned, machine-readable form of an `AuditReport`, and its way back.

The shape is checked against `audit.schema.json` (shipped beside this module, JSON Schema
draft 2020-12) in the tests; `jsonschema` is a test dependency only, so `from_json_dict` does
its own checks and turns anything malformed into a `BadInput` that names the field.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from dspark_patch.errors import BadInput, TargetNotFound
from dspark_patch.report.model import (
    SCHEMA,
    AuditReport,
    Command,
    CompiledFile,
    CompileReport,
    DistributionInfo,
    ErrorReport,
    FileReport,
    HunkReport,
    ImageRef,
    IntegrityReport,
    LayerChange,
    LayerReport,
    PatchReport,
    ProbeCase,
    ProbeReport,
    Status,
    StepReport,
    StepStatus,
    TargetReport,
)

SCHEMA_RESOURCE = "audit.schema.json"


def load_schema() -> dict[str, Any]:
    """The JSON Schema of audit.json as shipped in the package (not read from the source tree)."""
    text = resources.files("dspark_patch.report").joinpath(SCHEMA_RESOURCE).read_text("utf-8")
    return json.loads(text)


# --- report -> dict ---------------------------------------------------------------------
def _image(image: ImageRef | None) -> dict[str, Any] | None:
    return None if image is None else {"ref": image.ref, "id": image.id, "repo_digest": image.repo_digest}


def _file(f: FileReport) -> dict[str, Any]:
    return {
        "path": f.path,
        "action": f.action,
        "pre_sha256": f.pre_sha256,
        "post_sha256": f.post_sha256,
        "expected_pre_sha256": f.expected_pre_sha256,
        "expected_post_sha256": f.expected_post_sha256,
        "hunks": [asdict(h) for h in f.hunks],
    }


def to_json_dict(report: AuditReport) -> dict[str, Any]:
    """The audit.json object; key order is the reading order (verdict, target, patch, evidence)."""
    t = report.target
    return {
        "schema": report.schema,
        "command": report.command,
        "status": report.status,
        "exit_code": report.exit_code,
        "tool_version": report.tool_version,
        "started_at": report.started_at,
        "target": {
            "kind": t.kind,
            "ref": t.ref,
            "python": t.python,
            "python_version": t.python_version,
            "distribution": None if t.distribution is None else asdict(t.distribution),
            "image": _image(t.image),
        },
        "result_image": _image(report.result_image),
        "patch": None if report.patch is None else asdict(report.patch),
        "files": [_file(f) for f in report.files],
        "compile": {
            "ok": report.compile.ok,
            "ran": report.compile.ran,
            "files": [asdict(c) for c in report.compile.files],
        },
        "probe": {
            "ok": report.probe.ok,
            "ran": report.probe.ran,
            "cases": [asdict(c) for c in report.probe.cases],
            "detail": report.probe.detail,
        },
        "integrity": None
        if report.integrity is None
        else {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(report.integrity).items()},
        "layer": None
        if report.layer is None
        else {
            "ok": report.layer.ok,
            "changes": [asdict(c) for c in report.layer.changes],
            "unexpected": [asdict(c) for c in report.layer.unexpected],
        },
        # An object, not pairs: that is how `docker inspect` shows labels and how policies read them.
        "labels": dict(report.labels),
        "steps": [asdict(s) for s in report.steps],
        "errors": [asdict(e) for e in report.errors],
        "notes": list(report.notes),
    }


def to_json(report: AuditReport) -> str:
    return json.dumps(to_json_dict(report), indent=2, ensure_ascii=False) + "\n"


# --- dict -> report ---------------------------------------------------------------------
class _Reader:
    """Typed access to one JSON object, naming the exact field when something is off."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise BadInput(f"audit report: {where or 'the top level'} is not an object")
        self.data = data
        self.where = where

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, types: tuple[type, ...], optional: bool, default: Any = ...) -> Any:
        if key not in self.data:
            if default is not ...:
                return default
            raise BadInput(f"audit report: `{self._path(key)}` is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        # bool is an int in Python; a count or exit code given as true/false is malformed.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise BadInput(f"audit report: `{self._path(key)}` has the wrong type ({type(value).__name__})")
        return value

    def text(self, key: str, *, optional: bool = False, default: Any = ...) -> Any:
        return self._get(key, (str,), optional, default)

    def choice(self, key: str, literal: Any) -> Any:
        value = self.text(key)
        allowed = get_args(literal)
        if value not in allowed:
            raise BadInput(f"audit report: `{self._path(key)}` is {value!r}, expected one of {', '.join(allowed)}")
        return value

    def integer(self, key: str) -> int:
        return self._get(key, (int,), False)

    def number(self, key: str) -> float:
        return float(self._get(key, (int, float), False))

    def flag(self, key: str) -> bool:
        return self._get(key, (bool,), False)

    def obj(self, key: str, *, optional: bool = False) -> _Reader | None:
        value = self._get(key, (dict,), optional)
        return None if value is None else _Reader(value, self._path(key))

    def objs(self, key: str) -> list[_Reader]:
        return [_Reader(v, f"{self._path(key)}[{i}]") for i, v in enumerate(self._get(key, (list,), False))]

    def strs(self, key: str) -> tuple[str, ...]:
        items = self._get(key, (list,), False)
        if not all(isinstance(v, str) for v in items):
            raise BadInput(f"audit report: `{self._path(key)}` must be a list of strings")
        return tuple(items)


def _read_image(r: _Reader | None) -> ImageRef | None:
    if r is None:
        return None
    return ImageRef(ref=r.text("ref"), id=r.text("id"), repo_digest=r.text("repo_digest", optional=True, default=None))


def _layer_changes(layer: _Reader, key: str) -> tuple[LayerChange, ...]:
    return tuple(
        LayerChange(kind=c.choice("kind", Literal["A", "C", "D"]), path=c.text("path")) for c in layer.objs(key)
    )


def from_json_dict(d: dict[str, Any]) -> AuditReport:
    """Rebuild the report from audit.json (so a saved report can be rendered again)."""
    r = _Reader(d, "")
    schema = r.text("schema")
    if schema != SCHEMA:
        raise BadInput(
            f"audit report: schema is {schema!r}, this dspark-patch reads {SCHEMA!r}",
            hint="render it with the dspark-patch version that wrote it",
        )
    t = r.obj("target")
    assert t is not None
    dist = t.obj("distribution", optional=True)
    patch = r.obj("patch", optional=True)
    comp = r.obj("compile")
    probe = r.obj("probe")
    integ = r.obj("integrity", optional=True)
    layer = r.obj("layer", optional=True)
    assert comp is not None and probe is not None
    labels = r._get("labels", (dict,), False)
    if not all(isinstance(v, str) for v in labels.values()):
        raise BadInput("audit report: every value in `labels` must be a string")
    return AuditReport(
        schema=schema,
        command=r.choice("command", Command),
        status=r.choice("status", Status),
        exit_code=r.integer("exit_code"),
        tool_version=r.text("tool_version"),
        started_at=r.text("started_at"),
        target=TargetReport(
            kind=t.choice("kind", Literal["local", "image"]),
            ref=t.text("ref"),
            python=t.text("python", optional=True),
            python_version=t.text("python_version", optional=True),
            distribution=None
            if dist is None
            else DistributionInfo(name=dist.text("name"), version=dist.text("version"), location=dist.text("location")),
            image=_read_image(t.obj("image", optional=True)),
        ),
        result_image=_read_image(r.obj("result_image", optional=True)),
        patch=None
        if patch is None
        else PatchReport(
            id=patch.text("id", optional=True),
            variant=patch.text("variant", optional=True),
            sha256=patch.text("sha256"),
            source=patch.text("source"),
            hash_checks=patch.flag("hash_checks"),
        ),
        files=tuple(
            FileReport(
                path=f.text("path"),
                action=f.choice("action", Literal["modify", "add", "delete"]),
                pre_sha256=f.text("pre_sha256", optional=True),
                post_sha256=f.text("post_sha256", optional=True),
                expected_pre_sha256=f.text("expected_pre_sha256", optional=True),
                expected_post_sha256=f.text("expected_post_sha256", optional=True),
                hunks=tuple(
                    HunkReport(
                        index=h.integer("index"),
                        source_start=h.integer("source_start"),
                        applied_at=h.integer("applied_at"),
                        offset=h.integer("offset"),
                        fuzz=h.integer("fuzz"),
                    )
                    for h in f.objs("hunks")
                ),
            )
            for f in r.objs("files")
        ),
        compile=CompileReport(
            ok=comp.flag("ok"),
            ran=comp.flag("ran"),
            files=tuple(
                CompiledFile(path=c.text("path"), ok=c.flag("ok"), detail=c.text("detail")) for c in comp.objs("files")
            ),
        ),
        probe=ProbeReport(
            ok=probe.flag("ok"),
            ran=probe.flag("ran"),
            cases=tuple(
                ProbeCase(name=c.text("name"), ok=c.flag("ok"), detail=c.text("detail")) for c in probe.objs("cases")
            ),
            detail=probe.text("detail"),
        ),
        integrity=None
        if integ is None
        else IntegrityReport(
            checked=integ.integer("checked"),
            mismatched=integ.strs("mismatched"),
            missing=integ.strs("missing"),
            not_checked=integ.strs("not_checked"),
            stale_bytecode=integ.strs("stale_bytecode"),
            # Absent in reports written before `added` existed.
            added=integ.strs("added") if "added" in integ.data else (),
        ),
        layer=None
        if layer is None
        else LayerReport(
            ok=layer.flag("ok"),
            changes=_layer_changes(layer, "changes"),
            unexpected=_layer_changes(layer, "unexpected"),
        ),
        labels=tuple(labels.items()),
        steps=tuple(
            StepReport(
                name=s.text("name"),
                status=s.choice("status", StepStatus),
                seconds=s.number("seconds"),
                detail=s.text("detail"),
            )
            for s in r.objs("steps")
        ),
        errors=tuple(
            ErrorReport(
                kind=e.text("kind"),
                message=e.text("message"),
                hint=e.text("hint", optional=True),
                exit_code=e.integer("exit_code"),
            )
            for e in r.objs("errors")
        ),
        notes=r.strs("notes"),
    )


def read_report(path: Path) -> AuditReport:
    """Load a saved audit.json; a missing or malformed file is the user's input, not a bug."""
    try:
        text = Path(path).read_text("utf-8")
    except FileNotFoundError:
        raise TargetNotFound(
            f"{path}: no such file", hint="pass the audit.json a run wrote with --report-dir"
        ) from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    return from_json_dict(data)
