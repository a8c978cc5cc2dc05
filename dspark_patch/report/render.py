"""One place to get any form of a report, and to write them all next to each other.

The forms themselves live in small modules: `audit_json` (audit.json, read back through its schema),
`markdown` (audit.md), `junit` (junit.xml), `intoto` (the attestation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dspark_patch import ownfiles
from dspark_patch.errors import BadInput, DsparkPatchError, EnvironmentProblem
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
REPORT_FILES = (AUDIT_JSON, AUDIT_MD, JUNIT_XML, STATEMENT_JSON, PREDICATE_JSON)


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
    """Write one report file through the tool's guarded writer (`ownfiles`): a temporary file in
    the same folder renamed into place, never through a link, under the user's umask. Lone
    surrogates from surrogate-escaped paths come out as `\\udcXX`, also a valid JSON escape."""
    return ownfiles.write_file(path, text)


def remove_report_set(directory: Path) -> None:
    """Take a written report set back (its run's result was withdrawn afterwards); best effort."""
    try:
        with ownfiles.open_folder(directory, create=False) as folder:
            for name in REPORT_FILES:
                folder.remove(name)
    except (OSError, DsparkPatchError):
        pass


def write_report_dir(report: AuditReport, directory: Path) -> list[Path]:
    """Write audit.json, audit.md, junit.xml and, when an image was committed, the attestation
    (statement and predicate). Returns the paths written, in that order."""
    directory = Path(directory)
    predicate = to_data(report)
    texts = [(AUDIT_JSON, dumps(predicate)), (AUDIT_MD, to_markdown(report)), (JUNIT_XML, to_junit(report))]
    if subjects(report):
        texts += [(STATEMENT_JSON, dumps(_statement(report))), (PREDICATE_JSON, dumps(predicate))]
    try:
        with ownfiles.open_folder(directory) as folder:
            # One set: written whole or not at all (a full disk leaves the earlier set as it was).
            written = folder.write_set([(name, text.encode("utf-8", "backslashreplace")) for name, text in texts])
            if not subjects(report):
                # A reused report folder must not keep the attestation of an earlier run next to
                # this run's audit: a CI step would sign the wrong image's evidence.
                for stale in (STATEMENT_JSON, PREDICATE_JSON):
                    folder.remove(stale)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the report into {directory}: {exc.strerror or exc}",
                                 hint="choose a writable --report-dir") from None
    return written
