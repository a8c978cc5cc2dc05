"""Checks are data: audit.md and junit.xml render the same checks from one list, so a check
one of them fails the other fails too, with the same message (pure rendering, no engine)."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from dspark_patch.report import checks, markdown
from dspark_patch.report.audit_json import from_json_dict, to_json
from dspark_patch.report.checks import CheckCase, check_cases, record_checks
from dspark_patch.report.model import AuditReport
from dspark_patch.report.render import to_junit, to_markdown
from tests.test_report_render import applied_report

LABELS_CHECK = "labels: name every post-image hash"


def _junit_case(report: AuditReport, name: str) -> ET.Element:
    cases = [tc for tc in ET.fromstring(to_junit(report).encode()).iter("testcase") if tc.get("name") == name]
    assert len(cases) == 1
    return cases[0]


def _labels_section(report: AuditReport) -> str:
    return to_markdown(report).split("### Labels", 1)[1].split("\n### ", 1)[0]


def test_a_label_set_that_misses_a_post_image_hash_fails_in_junit_and_markdown_alike() -> None:
    report = applied_report()
    lacking = {k: v for k, v in report.labels.items() if v != report.files[2].post_sha256}
    report = dataclasses.replace(report, labels=lacking)

    failure = _junit_case(report, LABELS_CHECK).find("failure")
    assert failure is not None
    message = failure.get("message")
    assert message == "no label carries the post-image hash of vllm/envs.py"
    section = _labels_section(report)
    assert f"❌ {LABELS_CHECK} — {message}" in section
    assert "✅" not in section


def test_a_label_set_with_every_post_image_hash_passes_in_junit_and_markdown_alike() -> None:
    report = applied_report()
    case = _junit_case(report, LABELS_CHECK)
    assert case.find("failure") is None and case.find("skipped") is None
    section = _labels_section(report)
    assert f"✅ {LABELS_CHECK}" in section
    assert "❌" not in section


def test_a_failed_check_no_section_shows_is_still_on_the_page() -> None:
    # A group the page has no section for (none today): its failure is listed, not dropped.
    assert "### Checks that failed" not in to_markdown(applied_report())
    extra = CheckCase(group="sbom", name="sbom: lists every file", outcome="failed", message="3 files not listed")
    report = dataclasses.replace(applied_report(), checks=(*check_cases(applied_report()), extra))
    md = markdown.to_markdown(report)
    assert "### Checks that failed\n\n- ❌ sbom: lists every file — 3 files not listed" in md
    assert md.index("### Checks that failed") < md.index("### Target")


def test_every_group_a_check_uses_is_named_and_the_page_shows_each_but_the_index() -> None:
    # checks.GROUPS names every group report/checks.py gives a check; the page has a section for
    # each of them (the index's own checks are the index page's header), so a new group is a
    # decision for audit.md too, not a silent "Checks that failed" line.
    source = Path(checks.__file__).read_text(encoding="utf-8")
    used = set(re.findall(r'group="([a-z-]+)"', source)) | set(re.findall(r'_hash_case\("([a-z-]+)"', source))
    assert used == set(checks.GROUPS)
    assert markdown._SHOWN_GROUPS == frozenset(checks.GROUPS) - {"index"}


def test_recording_the_checks_is_what_every_form_then_renders() -> None:
    report = applied_report()
    recorded = record_checks(report)
    assert list(recorded.checks) == check_cases(report) and recorded.checks
    assert to_junit(recorded) == to_junit(report) and to_markdown(recorded) == to_markdown(report)
    # recorded again after the report changed: the list follows the report, nothing stale stays
    failed = record_checks(dataclasses.replace(recorded, labels={}))
    assert [c.name for c in failed.checks if c.group == "labels"] == []
    assert from_json_dict(json.loads(to_json(recorded))) == recorded
