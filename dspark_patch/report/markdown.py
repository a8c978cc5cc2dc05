"""audit.md: the page a reviewer reads in a PR or a CI step summary.

Verdict first (one line a reviewer can stop at), then the evidence in the order one would
check it: which image became which, which patch and release, each file's hashes and hunk
placements, compile, probe, the committed layer, and for a failure what to do next.
"""

from __future__ import annotations

from dspark_patch.report.checks import CheckCase, checks_of
from dspark_patch.report.model import AuditReport, FileReport, ImageRecord

_VERDICT = {
    "applied": "applied",
    "already-applied": "already applied",
    "verified": "verified",
    "dry-run": "dry run",
    "probed": "probe passed",
    "failed": "failed",
}

# The check groups this page has a section for (the files, byte-compile, probe, integrity,
# layer, labels, attestations and what went wrong).
_SHOWN_GROUPS = frozenset({"pre-image", "placement", "post-image", "compile", "probe", "integrity", "bytecode",
                           "layer", "labels", "attestation", "run"})  # checks.GROUPS but the index's (a test holds it)


def _cell(text: object) -> str:
    """Text safe inside a GFM table cell: no pipes, no line breaks, no raw HTML."""
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def _code(text: object) -> str:
    if text is None or text == "":
        return "—"
    s = str(text).replace("|", "\\|").replace("\n", " ")
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def _mark(ok: bool) -> str:
    return "✅" if ok else "❌"


def _check_line(c: CheckCase) -> str:
    """A check as one line: its mark and name, and why when it did not pass."""
    mark = {"passed": "✅", "failed": "❌", "skipped": "⏭️"}[c.outcome]
    return f"{mark} {_cell(c.name)}" + (f" — {_cell(c.message)}" if c.message and c.outcome != "passed" else "")


def _unshown_failures(cases: list[CheckCase]) -> list[str]:
    """Failed checks of a group no section of the page shows, so none is missing here."""
    failed = [c for c in cases if c.outcome == "failed" and c.group not in _SHOWN_GROUPS]
    if not failed:
        return []
    return ["### Checks that failed", "", *(f"- {_check_line(c)}" for c in failed), ""]


def _summary_line(report: AuditReport) -> str:
    patch = report.patch
    what = f"patch `{patch.id}`" if patch and patch.id else "a bare diff" if patch else "no patch"
    if report.series:
        what = "the series " + ", then ".join(f"`{m.id}` (variant `{m.variant}`)" for m in report.series)
    elif patch and patch.variant:
        what += f" (variant `{patch.variant}`)"
    n = len(report.files)
    files = f"{n} file{'s' if n != 1 else ''}"
    after = f" → `{report.result_image.ref}`" if report.result_image else ""
    match report.status:
        case "applied":
            return f"Applied {what} to {files} of `{report.target.ref}`{after}; every hunk placed with zero fuzz."
        case "already-applied":
            return f"{what[0].upper()}{what[1:]} is already in `{report.target.ref}`; nothing was changed."
        case "verified":
            return f"`{report.target.ref}` carries {what}: {files} equal their post-images."
        case "dry-run":
            return f"Dry run: {what} places on {files} of `{report.target.ref}` with zero fuzz; nothing was written."
        case "probed":
            cases = len(report.probe.cases)
            return f"The probe passed in `{report.target.ref}` ({cases} case{'s' if cases != 1 else ''})."
        case "failed":
            first = report.errors[0].message if report.errors else "see the errors below"
            return f"Failed: {first}"


def _route_lines(report: AuditReport) -> list[str]:
    """The route the verdict came through, and why (one line; none for a run refused before one)."""
    if report.route is None:
        return []
    return [f"Route: {_code(report.route.name)} — {_cell(report.route.reason)}.", ""]


def _image_row(label: str, image: ImageRecord | None) -> str:
    if image is None:
        return f"| {label} | — | — | — |"
    return f"| {label} | {_code(image.ref)} | {_code(image.id)} | {_code(image.repo_digest)} |"


def _hash_row(label: str, actual: str | None, expected: str | None) -> str:
    if expected is None:
        check = "not known"
    else:
        check = "✅ matches" if actual == expected else "❌ differs"
    return f"| {label} | {_code(actual)} | {_code(expected)} | {check} |"


def _file_section(f: FileReport, *, changed_here: bool) -> list[str]:
    out = [f"### {_code(f.path)} ({f.action})", "", "| | sha256 | expected | |", "|---|---|---|---|"]
    # Only a run that changes the file has a "before" to check; an already patched file or a
    # verify run holds the post-image alone, and comparing it to the pre-image would show a
    # false "differs".
    if changed_here:
        out.append(_hash_row("before", f.pre_sha256, f.expected_pre_sha256))
    out += [_hash_row("after" if changed_here else "now", f.post_sha256, f.expected_post_sha256), ""]
    if f.hunks:
        out += ["| hunk | header line | placed at | offset | fuzz |", "|---:|---:|---:|---:|---:|"]
        out += [f"| {h.index} | {h.source_start} | {h.applied_at} | {h.offset:+d} | {h.fuzz} |" for h in f.hunks]
        out.append("")
    return out


def _index_markdown(report: AuditReport) -> str:
    """An index run: the verdict for the whole, the index before and after, then each
    platform's own audit as a section (its headings one level down)."""
    index = report.index
    assert index is not None
    done = sum(p.report.ok for p in report.platforms)
    lines = [
        f"## {_mark(report.ok)} dspark-patch {report.command}: {_VERDICT[report.status]}",
        "",
        f"{done} of {len(report.platforms)} platform(s) of the index `{index.ref}` "
        f"{'passed' if report.ok else 'passed; the run failed'}.",
        "",
        *_route_lines(report),
    ]
    lines += _errors(report)
    lines += ["### Index", "", "| | ref | digest | kind |", "|---|---|---|---|",
              f"| before | {_code(index.ref)} | {_code(index.digest)} | {_code(index.media_type)} |",
              f"| after | {_code(index.result_ref)} | {_code(index.result_digest)} | "
              f"{_code(index.media_type) if index.result_digest else '—'} |", "",
              f"Platforms in the index: {', '.join(_code(p) for p in index.platforms) or 'none'}.", ""]
    if report.platforms:
        lines += ["| platform | verdict | emulated | source manifest | result manifest |", "|---|---|---|---|---|"]
        lines += [f"| {_code(p.platform)} | {_mark(p.report.ok)} {_VERDICT[p.report.status]} | "
                  f"{'yes' if p.emulated else 'no'} | {_code(p.source_manifest)} | {_code(p.result_manifest)} |"
                  for p in report.platforms]
        lines.append("")
    lines += _steps_and_notes(report, "### Steps of the index")
    for p in report.platforms:
        lines += [f"## Platform {_code(p.platform)}", ""]
        lines += ["#" + line if line.startswith("#") else line for line in to_markdown(p.report).splitlines()]
        lines.append("")
    return "\n".join(lines)


def _attestations(report: AuditReport) -> list[str]:
    if not report.attestations:
        return []
    lines = ["### Signed attestations", "", "| | manifest | state | key | artifact | via | detail |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {_mark(a.state in ('attached', 'valid'))} | {_code(a.subject)} | {a.state} | {_code(a.keyid[:16])} | "
              f"{_code(a.artifact)} | {a.via or '—'} | {_cell(a.detail) or '—'} |" for a in report.attestations]
    return [*lines, ""]


def _steps_and_notes(report: AuditReport, steps_title: str) -> list[str]:
    lines: list[str] = _attestations(report)
    if report.steps:
        lines += [steps_title, "", "| step | status | seconds | detail |", "|---|---|---:|---|"]
        lines += [f"| {_cell(s.name)} | {s.status} | {s.seconds:.2f} | {_cell(s.detail)} |" for s in report.steps]
        lines.append("")
    if report.notes:
        lines += ["### Notes", "", *(f"- {_cell(n)}" for n in report.notes), ""]
    return lines


def _errors(report: AuditReport) -> list[str]:
    if not report.errors:
        return []
    lines = ["### What went wrong", ""]
    for e in report.errors:
        lines.append(f"- **{_cell(e.kind)}** (exit {e.exit_code}): {_cell(e.message)}")
        if e.hint:
            lines.append(f"  - What to do: {_cell(e.hint)}")
    return [*lines, ""]


def to_markdown(report: AuditReport) -> str:
    if report.index is not None:
        return _index_markdown(report)
    lines: list[str] = [
        f"## {_mark(report.ok)} dspark-patch {report.command}: {_VERDICT[report.status]}",
        "",
        _summary_line(report),
        "",
        *_route_lines(report),
    ]

    cases = checks_of(report)
    lines += _errors(report)
    lines += _unshown_failures(cases)

    t = report.target
    lines += ["### Target", "", "| | ref | image id | repo digest |", "|---|---|---|---|"]
    if t.kind == "image":
        lines += [_image_row("before", t.image), _image_row("after", report.result_image)]
    else:
        lines.append(f"| local tree | {_code(t.ref)} | — | — |")
    lines.append("")
    facts: list[tuple[str, str]] = []
    if t.distribution:
        d = t.distribution
        facts += [("release", f"{_code(d.name)} {_code(d.version)}"), ("location", _code(d.location))]
    if t.python:
        facts.append(("python", f"{_code(t.python)} {_cell(t.python_version or '')}".rstrip()))
    p = report.patch
    if p:
        facts += [
            ("patch", _code(p.id) if p.id else "bare diff"),
            ("variant", _code(p.variant)),
            ("diff sha256", _code(p.sha256)),
            ("source", _code(p.source)),
            ("hash checks", "on" if p.hash_checks else "off: placement at zero fuzz was the only guard"),
        ]
        if p.review is not None:
            facts.append(("review", "reviewed" if p.review == "reviewed"
                          else "**unreviewed**: made by `dspark-patch port`, not yet marked reviewed by a person"))
    facts += [("tool", f"dspark-patch {_cell(report.tool_version)}"), ("started", _cell(report.started_at))]
    lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts), ""]

    if report.files:
        lines += ["### Files", ""]
        changed_here = report.command == "apply" and report.status != "already-applied"
        for f in report.files:
            lines += _file_section(f, changed_here=changed_here)

    c = report.compile
    lines += ["### Byte-compile", ""]
    if not c.ran:
        lines += ["Not run.", ""]
    else:
        lines += ["| file | result | detail |", "|---|---|---|"]
        lines += [f"| {_code(cf.path)} | {_mark(cf.ok)} | {_cell(cf.detail)} |" for cf in c.files]
        lines.append("")

    pr = report.probe
    lines += ["### Probe", ""]
    if pr.source:
        lines += [f"The patch set's code {_cell(pr.source)} ran in {_cell(pr.ran_in)}.", ""]
    if not pr.ran:
        lines += [f"Not run{': ' + _cell(pr.detail) if pr.detail else '.'}", ""]
    else:
        if pr.claimed_by:
            lines += [f"**Claimed by the {_cell(pr.claimed_by)}, not verified by the publisher**: `publish` "
                      "carried this result from the in-image report and ran nothing.", ""]
        if pr.detail:
            lines += [_cell(pr.detail), ""]
        lines += ["| case | result | detail |", "|---|---|---|"]
        lines += [f"| {_code(pc.name)} | {_mark(pc.ok)} | {_cell(pc.detail)} |" for pc in pr.cases]
        lines.append("")
        if pr.census:
            lines += ["#### Census: every reader the probe's claim rests on", ""]
            lines += ["| where | function | symbol | kind | DSpark V2 path | None-safe | verdict |",
                      "|---|---|---|---|---|---|---|"]
            lines += [
                f"| {_code(f'{e.file}:{e.line}')} | {_code(e.function)} | {_code(e.symbol)} | {_cell(e.kind)} "
                f"| {'reached' if e.reached else 'not reached'} | {_mark(e.none_safe)} | {_cell(e.verdict)} |"
                for e in pr.census
            ]
            lines.append("")

    i = report.integrity
    if i is not None:
        lines += ["### Integrity of the rest of the distribution", ""]
        against = f"the published wheel {_code(i.reference)}" if i.reference else "no published wheel (none known)"
        lines.append(f"{i.checked} files checked against {against}; {i.bytecode_checked} .pyc files recompiled and compared"
                     + (f" ({i.bytecode_proofs_reused} of them proven by a proof kept from an earlier compile)"
                        if i.bytecode_proofs_reused else "")
                     + (" (this image's answer, kept by its image id from an earlier run of the same check: nothing ran)"
                        if i.kept_answer else "") + ".")
        lines += [f"- ❌ {_cell(u)}" for u in i.unverified]
        for label, paths in (
            ("❌ differ from the published wheel", i.mismatched),
            ("❌ missing", i.missing),
            ("❌ added (not in the published wheel)", i.added),
            ("❌ RECORD rows that disagree with the published wheel", i.record_disagrees),
            ("❌ named like the installer's files, but not in their shape", i.installer_findings),
            ("❌ bytecode", i.stale_bytecode),
            ("installer metadata (the installer's own files, accepted by their shape)", i.installer_metadata),
            ("console-script rows with no file there (nothing to read)", i.not_checked),
        ):
            if paths:
                lines += ["", f"{label}:", *(f"- {_code(x)}" for x in paths)]
        lines.append("")

    layer = report.layer
    if layer is not None:
        lines += [f"### Layer {_mark(layer.ok)}", ""]
        if layer.changes:
            lines += ["| change | path |", "|---|---|", *(f"| {ch.kind} | {_code(ch.path)} |" for ch in layer.changes)]
        else:
            lines.append("No changes.")
        if layer.unexpected:
            lines += ["", "Unexpected (refused the commit):", *(f"- {ch.kind} {_code(ch.path)}" for ch in layer.unexpected)]
        lines.append("")

    if report.labels:
        verdicts = [_check_line(c) for c in cases if c.group == "labels"]
        lines += ["### Labels", "", *verdicts, *([""] if verdicts else []), "| label | value |", "|---|---|"]
        lines += [f"| {_code(k)} | {_code(v)} |" for k, v in report.labels.items()]
        lines.append("")

    lines += _steps_and_notes(report, "### Steps")

    return "\n".join(lines)
