"""The report of an index run in every form: audit.json (through the shipped schema and back),
audit.md (a section per platform), junit.xml (a suite per platform) and the in-toto statement
(the new index and each platform manifest as subjects). Pure: no engine, no registry."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import jsonschema
import pytest

from dspark_patch.errors import BadInput
from dspark_patch.report.model import AuditReport, ErrorReport, ImageRecord, IndexReport, PlatformReport, TargetReport
from dspark_patch.report.render import from_json_dict, load_schema, render_as, to_json, to_junit, to_markdown
from tests.test_report_render import applied_report, sha

REPO = "registry.local:5000/vllm/vllm-openai"
SOURCE_INDEX = "sha256:" + sha("source index")
NEW_INDEX = "sha256:" + sha("patched index")
PLATFORMS = ("linux/amd64", "linux/arm64/v8")


def _platform(name: str, *, ok: bool = True) -> PlatformReport:
    manifest = "sha256:" + sha(f"patched {name}")
    report = applied_report()
    report = replace(report, target=replace(report.target, ref=f"{REPO}@sha256:{sha('source ' + name)}"),
                     result_image=ImageRecord(ref=f"{REPO}:0.33.0-dspark-{name.replace('/', '-')}",
                                           id="sha256:" + sha(f"config {name}"), repo_digest=f"{REPO}@{manifest}"))
    if not ok:
        report = replace(report, status="failed", exit_code=1, result_image=None, errors=(ErrorReport(
            kind="probe-failed", message="the patch set's probe failed: allocation", hint=None, exit_code=1),))
    return PlatformReport(platform=name, source_manifest="sha256:" + sha("source " + name),
                          emulated=name != "linux/amd64", report=report,
                          result_manifest=manifest if ok else None)


def index_report(*, arm64_ok: bool = True) -> AuditReport:
    platforms = (_platform(PLATFORMS[0]), _platform(PLATFORMS[1], ok=arm64_ok))
    base = AuditReport(command="apply", status="applied", exit_code=0, tool_version="0.1.0",
                       started_at="2026-01-01T00:00:00+00:00", target=TargetReport(kind="image", ref=f"{REPO}:0.33.0"),
                       index=IndexReport(ref=f"{REPO}:0.33.0", media_type="application/vnd.oci.image.index.v1+json",
                                         digest=SOURCE_INDEX, platforms=PLATFORMS,
                                         result_ref=f"{REPO}:0.33.0-dspark" if arm64_ok else None,
                                         result_digest=NEW_INDEX if arm64_ok else None),
                       platforms=platforms)
    if arm64_ok:
        return base
    return replace(base, status="failed", exit_code=1, errors=(ErrorReport(
        kind="probe-failed", message="linux/arm64/v8: the patch set's probe failed: allocation", hint=None,
        exit_code=1),))


def test_an_index_report_is_valid_audit_json_and_reads_back_whole():
    for report in (index_report(), index_report(arm64_ok=False)):
        doc = json.loads(to_json(report))
        jsonschema.Draft202012Validator(load_schema()).validate(doc)
        assert from_json_dict(doc) == report
        assert [p["platform"] for p in doc["platforms"]] == list(PLATFORMS)


def test_a_platform_with_a_malformed_digest_is_refused_by_the_schema():
    doc = json.loads(to_json(index_report()))
    doc["platforms"][1]["source_manifest"] = "md5:abc"
    with pytest.raises(BadInput, match=r"platforms\[1\]\.source_manifest"):
        from_json_dict(doc)


def test_junit_has_one_suite_per_platform_and_a_failed_platform_fails_its_own_suite():
    root = ET.fromstring(to_junit(index_report(arm64_ok=False)))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert list(suites) == ["dspark-patch apply linux/amd64", "dspark-patch apply linux/arm64/v8"]
    assert suites["dspark-patch apply linux/amd64"].get("failures") == "0"
    assert suites["dspark-patch apply linux/arm64/v8"].get("failures") != "0"
    assert root.get("failures") == suites["dspark-patch apply linux/arm64/v8"].get("failures")


def test_markdown_has_the_index_and_a_section_per_platform():
    text = to_markdown(index_report())
    assert text.startswith("## ✅ dspark-patch apply: applied")
    assert NEW_INDEX in text and SOURCE_INDEX in text
    for name in PLATFORMS:
        assert f"## Platform `{name}`" in text
    # Each platform's own report sits one heading level down, under its platform.
    assert "### ✅ dspark-patch apply: applied" in text


def test_intoto_subjects_are_the_new_index_and_each_platform_manifest():
    statement = json.loads(render_as(index_report(), "intoto"))
    assert [s["digest"]["sha256"] for s in statement["subject"]] == [
        NEW_INDEX[7:], sha("patched linux/amd64"), sha("patched linux/arm64/v8")]
    assert {s["name"] for s in statement["subject"]} == {REPO}
