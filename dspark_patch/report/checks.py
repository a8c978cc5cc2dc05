"""The pipeline's checks as data: an AuditReport in, a list of frozen CheckCases out.

Checks are data: every check of a run (each file's pre-image hash, hunk placement, post-image
hash and byte-compile; integrity; bytecode; layer; labels; each probe case; each signed
attestation) is derived here, once, and recorded in the report as the run ends (`record_checks`,
called by the pipeline): audit.json holds the list, and audit.md, junit.xml and the attestation
render it rather than computing their own, so they agree by construction. A run that failed for a
reason no check shows (a hunk that does not apply, a missing image, an engine that cannot be
reached) gets one more failing check named after the error, so a failed run is never green; an
error that a failing check already shows is not counted twice. Pure: no XML, no Markdown.
"""

from __future__ import annotations

from dataclasses import replace

from dspark_patch.report.model import AuditReport, CheckCase, CheckOutcome, FileReport

Outcome = CheckOutcome

# Every group a check here can have, in reading order (JUnit's classnames; audit.md's sections).
GROUPS = ("pre-image", "placement", "post-image", "compile", "integrity", "bytecode", "layer", "labels", "probe",
          "attestation", "index", "run")

# Which check groups already show an error of this kind when they fail.
_SHOWN_BY: dict[str, frozenset[str]] = {
    "probe-failed": frozenset({"probe"}),
    "compile-failed": frozenset({"compile"}),
    "layer-mismatch": frozenset({"layer"}),
    "hash-mismatch": frozenset({"pre-image", "post-image"}),
    "verify-mismatch": frozenset({"post-image", "integrity", "bytecode", "labels", "compile"}),
    "modified-base": frozenset({"integrity", "bytecode"}),
    "attestation-invalid": frozenset({"attestation"}),
}


def _hash_case(group: str, f: FileReport, actual: str | None, expected: str | None, side: str) -> CheckCase:
    name = f"{group}: {f.path}"
    if expected is None:
        return CheckCase(group=group, name=name, outcome="skipped", message=f"no known {side}-image hash for this file")
    if actual == expected:
        return CheckCase(group=group, name=name, outcome="passed")
    return CheckCase(
        group=group,
        name=name,
        outcome="failed",
        message=f"{f.path}: sha256 {actual or 'absent'} is not the expected {side}-image {expected}",
        detail=f"expected {expected}\nactual   {actual or '(file absent)'}",
    )


def _file_cases(report: AuditReport, f: FileReport) -> list[CheckCase]:
    cases: list[CheckCase] = []
    # The pre-image is only evidence when this run changed (or planned to change) the file;
    # an already applied file or a verify run has only its current, post-image bytes.
    if report.command == "apply" and report.status != "already-applied":
        if f.action == "add":
            ok = f.pre_sha256 is None
            cases.append(
                CheckCase(
                    group="pre-image",
                    name=f"pre-image: {f.path}",
                    outcome="passed" if ok else "failed",
                    message="" if ok else f"{f.path}: the patch adds this file but it already exists",
                )
            )
        else:
            cases.append(_hash_case("pre-image", f, f.pre_sha256, f.expected_pre_sha256, "pre"))
    if f.hunks:
        fuzzed = [h for h in f.hunks if h.fuzz != 0]
        offsets = ", ".join(f"#{h.index} at line {h.applied_at} ({h.offset:+d})" for h in f.hunks)
        cases.append(
            CheckCase(
                group="placement",
                name=f"placement: {f.path}",
                outcome="failed" if fuzzed else "passed",
                message=f"{f.path}: hunks placed with fuzz: {', '.join(f'#{h.index}' for h in fuzzed)}" if fuzzed else "",
                detail=offsets,
            )
        )
    if f.action == "delete":
        ok = f.post_sha256 is None
        cases.append(
            CheckCase(
                group="post-image",
                name=f"post-image: {f.path}",
                outcome="passed" if ok else "failed",
                message="" if ok else f"{f.path}: the patch deletes this file but it is still there",
            )
        )
    elif f.post_sha256 is None and f.expected_post_sha256 is not None:
        cases.append(
            CheckCase(
                group="post-image",
                name=f"post-image: {f.path}",
                outcome="skipped" if report.status == "failed" else "failed",
                message="not computed: the run stopped before this file's post-image"
                if report.status == "failed"
                else f"{f.path}: no post-image recorded",
            )
        )
    else:
        cases.append(_hash_case("post-image", f, f.post_sha256, f.expected_post_sha256, "post"))
    return cases


def record_checks(report: AuditReport) -> AuditReport:
    """The report with its checks recorded: derived from what it holds now (each platform's report
    of an index run too), replacing any recorded before. The pipeline calls this as a run ends, so
    audit.json holds the very list audit.md, junit.xml and the attestation show."""
    platforms = tuple(replace(p, report=record_checks(p.report)) for p in report.platforms)
    unrecorded = replace(report, platforms=platforms, checks=())
    derived = index_cases(unrecorded) if unrecorded.index is not None else check_cases(unrecorded)
    return replace(unrecorded, checks=tuple(derived))


def checks_of(report: AuditReport) -> list[CheckCase]:
    """The checks a renderer shows: those the report records; a report written before checks were
    recorded (an older audit.json read back) has none, and gets them derived the same way."""
    if report.checks:
        return list(report.checks)
    return index_cases(report) if report.index is not None else check_cases(report)


def check_cases(report: AuditReport) -> list[CheckCase]:
    """Every check this report has evidence for, in reading order."""
    cases: list[CheckCase] = []
    for f in report.files:
        cases += _file_cases(report, f)

    c = report.compile
    if c.ran:
        for cf in c.files:
            cases.append(
                CheckCase(
                    group="compile",
                    name=f"compile: {cf.path}",
                    outcome="passed" if cf.ok else "failed",
                    message="" if cf.ok else f"{cf.path}: byte-compile failed",
                    detail=cf.detail,
                )
            )
        if not c.ok and not any(not cf.ok for cf in c.files):
            cases.append(CheckCase(group="compile", name="compile", outcome="failed", message="byte-compile failed"))
    elif report.files:
        cases.append(CheckCase(group="compile", name="compile", outcome="skipped", message="byte-compile not run"))

    i = report.integrity
    if i is not None:
        bad = [*i.unverified, *(f"differs: {p}" for p in i.mismatched), *(f"missing: {p}" for p in i.missing),
               *(f"added: {p}" for p in i.added), *(f"RECORD row disagrees: {p}" for p in i.record_disagrees),
               *(f"installer file: {p}" for p in i.installer_findings)]
        cases.append(
            CheckCase(
                group="integrity",
                name=f"integrity: {i.checked} files of the published wheel",
                outcome="failed" if bad else "passed",
                message=f"{len(bad)} findings against the published wheel" if bad else "",
                detail="\n".join(bad),
            )
        )
        cases.append(
            CheckCase(
                group="bytecode",
                name="bytecode: valid for the current source",
                outcome="failed" if i.stale_bytecode else "passed",
                message=f"stale bytecode: {', '.join(i.stale_bytecode)}" if i.stale_bytecode else "",
            )
        )

    layer = report.layer
    if layer is not None:
        unexpected = "\n".join(f"{ch.kind} {ch.path}" for ch in layer.unexpected)
        cases.append(
            CheckCase(
                group="layer",
                name="layer: exactly the expected files",
                outcome="passed" if layer.ok else "failed",
                message="" if layer.ok else "the container changed files outside the patch; nothing was committed",
                detail=unexpected,
            )
        )

    # Our labels carry each post-image hash (docs/design.md, labels): a label set that lacks one would let
    # an admission policy trust an image whose files it does not describe.
    posted = [f for f in report.files if f.post_sha256]
    if report.labels and posted:
        values = list(report.labels.values())
        missing = [f.path for f in posted if f.post_sha256 is not None and not any(f.post_sha256 in v for v in values)]
        cases.append(
            CheckCase(
                group="labels",
                name="labels: name every post-image hash",
                outcome="failed" if missing else "passed",
                message=f"no label carries the post-image hash of {', '.join(missing)}" if missing else "",
            )
        )

    p = report.probe
    # publish carries the in-image job's probe result as that job's claim (model.py ProbeReport)
    claim = "claimed by the in-image job, not verified by the publisher" if p.claimed_by else ""
    if p.ran:
        for pc in p.cases:
            cases.append(
                CheckCase(
                    group="probe",
                    name=f"probe: {pc.name}",
                    outcome="passed" if pc.ok else "failed",
                    message=claim if pc.ok else f"probe case {pc.name} failed" + (f" ({claim})" if claim else ""),
                    detail=pc.detail,
                )
            )
        if not p.ok and not any(not pc.ok for pc in p.cases):
            cases.append(
                CheckCase(group="probe", name="probe", outcome="failed", message="the probe failed", detail=p.detail)
            )
    else:
        cases.append(CheckCase(group="probe", name="probe", outcome="skipped", message=p.detail or "probe not run"))

    cases += attestation_cases(report)
    failed_groups = {c.group for c in cases if c.outcome == "failed"}
    for e in report.errors:
        if _SHOWN_BY.get(e.kind, frozenset()) & failed_groups:
            continue
        cases.append(
            CheckCase(
                group="run",
                name=f"run: {e.kind}",
                outcome="failed",
                message=e.message,
                detail=f"{e.message}\nWhat to do: {e.hint}" if e.hint else e.message,
            )
        )
    return cases


def attestation_cases(report: AuditReport) -> list[CheckCase]:
    """One case per signed attestation attached (apply --sign-key) or checked (verify --attestation)."""
    return [CheckCase(group="attestation", name=f"attestation: {a.subject}",
                      outcome="passed" if a.state in ("attached", "valid") else "failed", message=a.detail,
                      detail=f"{a.state}; key {a.keyid}; artifact {a.artifact or '-'} via {a.via or '-'}"
                      + (f"\n{a.detail}" if a.detail else ""))
            for a in report.attestations]


def index_cases(report: AuditReport) -> list[CheckCase]:
    """The index's own checks: that it was published (after a push), and any failure of the
    run that no platform's suite shows (a bad --platform, a refused push)."""
    cases: list[CheckCase] = []
    index = report.index
    if index is not None and index.result_digest:
        cases.append(CheckCase(group="index", name=f"index: published {index.result_ref}", outcome="passed",
                               detail=index.result_digest))
    cases += attestation_cases(report)
    shown = {e.message for p in report.platforms for e in p.report.errors}
    for e in report.errors:
        if any(message in e.message for message in shown):
            continue
        cases.append(CheckCase(group="run", name=f"run: {e.kind}", outcome="failed", message=e.message,
                               detail=f"{e.message}\nWhat to do: {e.hint}" if e.hint else e.message))
    return cases
