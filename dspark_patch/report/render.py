"""One place to get any form of a report, and to write them all next to each other.

The forms themselves live in small modules: `audit_json` (audit.json, read back through its schema),
`markdown` (audit.md), `junit` (junit.xml), `intoto` (the attestation).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

from dspark_patch.errors import BadInput, EnvironmentProblem
from dspark_patch.report.audit_json import from_json_dict, load_schema, read_report, to_json
from dspark_patch.report.intoto import PREDICATE_TYPE, STATEMENT_TYPE, subjects, to_intoto
from dspark_patch.report.junit import to_junit
from dspark_patch.report.markdown import to_markdown
from dspark_patch.report.model import AuditReport
from dspark_patch.serialise import dumps, to_data

__all__ = [
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "Format",
    "from_json_dict",
    "load_schema",
    "read_report",
    "render_as",
    "to_intoto",
    "to_json",
    "to_junit",
    "to_markdown",
    "write_report_dir",
    "write_text_atomic",
]

Format = Literal["json", "md", "junit", "intoto"]

AUDIT_JSON = "audit.json"
AUDIT_MD = "audit.md"
JUNIT_XML = "junit.xml"
STATEMENT_JSON = "attestation.intoto.json"
PREDICATE_JSON = "predicate.json"


def _statement(report: AuditReport) -> dict:
    named = subjects(report)
    if not named:
        raise BadInput(
            "this report has no result image, so there is nothing for an attestation to name",
            hint="attest the report of an `apply --image ... --tag ...` run that committed an image",
        )
    (name, digest), *more = named
    return to_intoto(report, subject_name=name, subject_digest=digest, more=more)


def render_as(report: AuditReport, fmt: Format) -> str:
    """The text of one form, as `dspark-patch report render --format` prints it."""
    match fmt:
        case "json":
            return to_json(report)
        case "md":
            return to_markdown(report)
        case "junit":
            return to_junit(report)
        case "intoto":
            return dumps(_statement(report))


def write_text_atomic(path: Path, text: str) -> Path:
    """Write through a temporary file in the same folder and `os.replace`, so a reader (or a
    killed run) never sees half a report. Lone surrogates from surrogate-escaped paths come out
    as `\\udcXX`, which is also a valid JSON escape."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="\n") as fh:
                fh.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot write the report {path}: {exc.strerror}",
            hint="choose a writable --report-dir",
        ) from None
    return path


def write_report_dir(report: AuditReport, directory: Path) -> list[Path]:
    """Write audit.json, audit.md, junit.xml and, when an image was committed, the attestation
    (statement and predicate). Returns the paths written, in that order."""
    directory = Path(directory)
    predicate = to_data(report)
    written = [
        write_text_atomic(directory / AUDIT_JSON, dumps(predicate)),
        write_text_atomic(directory / AUDIT_MD, to_markdown(report)),
        write_text_atomic(directory / JUNIT_XML, to_junit(report)),
    ]
    if subjects(report):
        written.append(write_text_atomic(directory / STATEMENT_JSON, dumps(_statement(report))))
        written.append(write_text_atomic(directory / PREDICATE_JSON, dumps(predicate)))
    else:
        # A reused report folder must not keep the attestation of an earlier run next to
        # this run's audit: a CI step would sign the wrong image's evidence.
        for stale in (STATEMENT_JSON, PREDICATE_JSON):
            (directory / stale).unlink(missing_ok=True)
    return written
