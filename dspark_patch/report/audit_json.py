"""audit.json: an `AuditReport` through the shared encoder, and its way back.

`audit.schema.json` (shipped beside this module, JSON Schema draft 2020-12) is the only
description of the document: reading a saved report validates it against that schema, and
anything that does not hold is the user's input (`BadInput`, one line naming the field).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from dspark_patch import ownfiles
from dspark_patch.errors import BadInput, TargetNotFound
from dspark_patch.report.model import SCHEMA, AuditReport
from dspark_patch.serialise import dumps, from_data

# An audit.json of the largest series on a big image is a few MB; 64 MiB is far above any honest one.
REPORT_LIMIT = 64 << 20

SCHEMA_RESOURCE = "audit.schema.json"
_SHOWN_CHARS = 160  # of a validation message, which can quote a whole object


def load_schema() -> dict[str, Any]:
    """The JSON Schema of audit.json as shipped in the package (not read from the source tree)."""
    text = resources.files("dspark_patch.report").joinpath(SCHEMA_RESOURCE).read_text("utf-8")
    return json.loads(text)


@cache
def _validator() -> Any:
    # Loaded when a saved report is read, not by every command that writes one (45 ms of each start).
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema(), format_checker=jsonschema.FormatChecker())


def to_json(report: AuditReport) -> str:
    return dumps(report)


def from_json_dict(data: Any) -> AuditReport:
    """Rebuild the report from audit.json (so a saved report can be rendered again)."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if isinstance(schema, str) and schema != SCHEMA:
        raise BadInput(
            f"audit report: schema is {schema!r}, this dspark-patch reads {SCHEMA!r}",
            hint="render it with the dspark-patch version that wrote it",
        )
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(data))
    if error is not None:
        where = error.json_path.removeprefix("$").removeprefix(".") or "the top level"
        message = error.message if len(error.message) <= _SHOWN_CHARS else error.message[:_SHOWN_CHARS] + "..."
        raise BadInput(
            f"audit report: {where}: {message}",
            hint=f"pass an audit.json written by dspark-patch (schema {SCHEMA})",
        )
    return from_data(AuditReport, data)


def read_report(path: Path) -> AuditReport:
    """Load a saved audit.json; a missing or malformed file is the user's input, not a bug. It
    may come from an image's own job (publish), so it is read as hostile: ownfiles.read_json
    (no link, at most REPORT_LIMIT bytes, nesting bounded)."""
    try:
        data = ownfiles.read_json(path, limit=REPORT_LIMIT, what="")
    except ownfiles.MissingFile:
        raise TargetNotFound(
            f"{path}: no such file", hint="pass the audit.json a run wrote with --report-dir"
        ) from None
    try:
        return from_json_dict(data)
    except BadInput as exc:
        raise BadInput(f"{path}: {exc.message}", hint=exc.hint) from None
