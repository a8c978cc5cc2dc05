"""Checks are data: audit.md and junit.xml render the same checks from one list, so a check
one of them fails the other fails too, with the same message (pure rendering, no engine)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from dspark_patch.report import markdown
from dspark_patch.report.checks import CheckCase, check_cases
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


def test_a_failed_check_no_section_shows_is_still_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    # A group the page has no section for (none today): its failure is listed, not dropped.
    assert "### Checks that failed" not in to_markdown(applied_report())
    extra = CheckCase(group="sbom", name="sbom: lists every file", outcome="failed", message="3 files not listed")
    monkeypatch.setattr(markdown, "check_cases", lambda r: [*check_cases(r), extra])
    md = markdown.to_markdown(applied_report())
    assert "### Checks that failed\n\n- ❌ sbom: lists every file — 3 files not listed" in md
    assert md.index("### Checks that failed") < md.index("### Target")
