"""junit.xml: every check of a run as a test case, so CI systems show them natively.

Checks are data: the cases are the list the report records (`checks`, derived once by
`report/checks.py`: one per check and one per probe case, plus one for a failure no check shows),
rendered here as XML and nothing else, so junit.xml and audit.md show the same checks with the
same messages.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from dspark_patch.report.checks import CheckCase, checks_of
from dspark_patch.report.model import AuditReport

# XML 1.0 cannot carry control characters or lone surrogates (a probe's terminal colours, a
# surrogate-escaped path); drop them rather than write a file no CI can parse.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _suite(root: ET.Element, report: AuditReport, name: str, cases: list[CheckCase]) -> dict[str, int]:
    failures = sum(c.outcome == "failed" for c in cases)
    skipped = sum(c.outcome == "skipped" for c in cases)
    seconds = f"{sum(s.seconds for s in report.steps):.3f}"
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped)}
    suite = ET.SubElement(
        root, "testsuite", {"name": name, **counts, "time": seconds, "timestamp": report.started_at}
    )
    props = ET.SubElement(suite, "properties")
    for prop, value in (
        ("status", report.status),
        ("exit_code", str(report.exit_code)),
        ("target", report.target.ref),
        ("result_image", report.result_image.ref if report.result_image else ""),
        ("patch", (report.patch.id or "bare diff") if report.patch else ""),
        ("variant", (report.patch.variant or "") if report.patch else ""),
        ("tool_version", report.tool_version),
    ):
        ET.SubElement(props, "property", {"name": prop, "value": _xml_text(value)})
    for c in cases:
        tc = ET.SubElement(suite, "testcase", {"classname": f"dspark-patch.{c.group}", "name": _xml_text(c.name)})
        if c.outcome == "failed":
            el = ET.SubElement(tc, "failure", {"message": _xml_text(c.message), "type": c.group})
            el.text = _xml_text(c.detail or c.message)
        elif c.outcome == "skipped":
            ET.SubElement(tc, "skipped", {"message": _xml_text(c.message)})
        elif c.detail:
            ET.SubElement(tc, "system-out").text = _xml_text(c.detail)
    return {"tests": len(cases), "failures": failures, "skipped": skipped}


def to_junit(report: AuditReport) -> str:
    """One suite for a single target; for an index run, one suite per platform (named after
    it) plus one for the index itself when it has a case."""
    root = ET.Element("testsuites", {"name": "dspark-patch"})
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    suites: list[tuple[AuditReport, str, list[CheckCase]]] = []
    if report.index is None:
        suites.append((report, f"dspark-patch {report.command}", checks_of(report)))
    else:
        for p in report.platforms:
            suites.append((p.report, f"dspark-patch {report.command} {p.platform}", checks_of(p.report)))
        own = checks_of(report)
        if own or not report.platforms:
            suites.append((report, f"dspark-patch {report.command} index", own))
    for suite_report, name, cases in suites:
        for key, value in _suite(root, suite_report, name, cases).items():
            totals[key] += value
    seconds = f"{sum(s.seconds for s in report.steps) + sum(s.seconds for p in report.platforms for s in p.report.steps):.3f}"
    root.attrib.update({"tests": str(totals["tests"]), "failures": str(totals["failures"]), "errors": "0",
                        "skipped": str(totals["skipped"]), "time": seconds})
    # Attribute order as before: name, counts, time.
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
