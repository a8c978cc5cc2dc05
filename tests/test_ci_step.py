"""The CI image-build step: --push to a real (loopback) registry, the attestation's subject,
the GitHub step summary, --junit, and --json on stdout — all from real runs of the CLI."""

from __future__ import annotations

import json
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import docker
import jsonschema
import pytest

from dspark_patch.patchset import resolve
from dspark_patch.report.audit_json import load_schema
from tests.support.cli import run
from tests.support.images import fixture_image
from tests.support.registry import loopback_registry, put_image

PY = sys.executable


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A team's registry, which already holds the source image the step starts from."""
    with loopback_registry(tmp_path_factory.mktemp("registry")) as address:
        put_image(fixture_image(), f"{address}/dspark-patch/vllm:source")
        yield address


@pytest.mark.engine
def test_push_lands_in_the_registry_and_the_attestation_names_the_pushed_digest(registry, tmp_path):
    client = docker.from_env()
    tag = f"{registry}/dspark-patch/vllm:{uuid.uuid4().hex[:8]}"
    reports = tmp_path / "reports"
    summary = tmp_path / "step-summary.md"
    summary.write_text("# earlier step\n")
    res = run("apply", "--image", fixture_image(), "--tag", tag, "--push", "--json",
              "--report-dir", str(reports), "--junit", str(tmp_path / "junit.xml"),
              env={"GITHUB_STEP_SUMMARY": str(summary)})
    try:
        assert res.returncode == 0, res.stderr
        audit = json.loads(res.stdout)  # --json: stdout is the report and nothing else
        jsonschema.validate(audit, load_schema())
        repo_digest = audit["result_image"]["repo_digest"]
        repository = tag.rsplit(":", 1)[0]
        assert repo_digest.startswith(f"{repository}@sha256:")

        # pulled back from the registry (after dropping every local name for it)
        result_id = audit["result_image"]["id"]
        client.images.remove(tag)
        pulled = client.images.pull(repository, tag=tag.rsplit(":", 1)[1])
        assert pulled.id == result_id
        assert repo_digest in pulled.attrs["RepoDigests"]

        statement = json.loads((reports / "attestation.intoto.json").read_text())
        assert statement["_type"] == "https://in-toto.io/Statement/v1"
        assert statement["subject"][0]["digest"]["sha256"] == repo_digest.split("@sha256:")[1]
        assert json.loads((reports / "predicate.json").read_text())["result_image"]["repo_digest"] == repo_digest

        text = summary.read_text()
        assert text.startswith("# earlier step\n")  # appended, not overwritten
        assert "applied" in text and audit["files"][0]["post_sha256"] in text

        suite = ET.parse(tmp_path / "junit.xml").getroot()
        assert int(suite.get("failures", suite.find("testsuite").get("failures"))) == 0
    finally:
        for ref in (tag,):
            try:
                client.images.remove(ref, force=True)
            except docker.errors.ImageNotFound:
                pass


@pytest.mark.engine
def test_push_to_an_unreachable_registry_fails_cleanly(tmp_path):
    client = docker.from_env()
    tag = f"127.0.0.1:9/dspark-patch/vllm:{uuid.uuid4().hex[:8]}"  # nothing listens on port 9
    res = run("apply", "--image", fixture_image(), "--tag", tag, "--push", "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(3)
    assert "push" in line
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["status"] == "failed"
    try:
        client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass


def test_junit_counts_the_failing_checks_of_a_real_failed_verify(vllm033_tree: Path, tmp_path: Path):
    junit = tmp_path / "junit.xml"
    res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--junit", str(junit),
              "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 1
    failing_probe = [c["name"] for c in res.json["probe"]["cases"] if not c["ok"]]
    assert failing_probe
    root = ET.parse(junit).getroot()
    cases = root.iter("testcase")
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    for name in failing_probe:
        assert any(name in f for f in failed), (name, failed)
    assert int(root.get("failures")) == len(failed)
    assert (tmp_path / "r" / "junit.xml").read_text() == junit.read_text()


def test_markdown_report_leads_with_the_verdict_and_lists_hashes_and_probe_cases(vllm033_tree: Path, tmp_path: Path):
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0
    md = (tmp_path / "r" / "audit.md").read_text()
    first = md.strip().splitlines()[0]
    assert "applied" in first
    # the loops below see every patched file and the probe's cases
    assert sorted(f["path"] for f in res.json["files"]) == sorted(resolve("dspark-skip-mtp-buffer").variant_for("0.33.0").files)
    assert len(res.json["probe"]["cases"]) >= 20
    for f in res.json["files"]:
        assert f["pre_sha256"] in md and f["post_sha256"] in md
    for case in res.json["probe"]["cases"]:
        assert case["name"] in md
    rendered = run("report", "render", str(tmp_path / "r" / "audit.json"), "--format", "md")
    assert rendered.returncode == 0 and rendered.stdout.strip() == md.strip()


def _junit_checks(junit: Path) -> list[tuple[str, str, str, str]]:
    """(group, name, outcome, message) of every test case, as a CI system reads junit.xml."""
    out = []
    for tc in ET.parse(junit).getroot().iter("testcase"):
        failure, skipped = tc.find("failure"), tc.find("skipped")
        outcome = "failed" if failure is not None else "skipped" if skipped is not None else "passed"
        message = (failure if failure is not None else skipped if skipped is not None else tc).get("message", "")
        out.append((tc.get("classname", "").removeprefix("dspark-patch."), tc.get("name", ""), outcome, message))
    return out


@pytest.mark.parametrize("command", ["apply", "verify"])
def test_audit_json_holds_the_checks_junit_and_markdown_show(command: str, vllm033_tree: Path, tmp_path: Path):
    # apply on a pristine tree passes; verify of the same pristine tree fails (not patched): both
    # verdicts' checks are recorded in audit.json, and the other forms show exactly that list.
    res = run(command, "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == (0 if command == "apply" else 1), res.stderr
    recorded = [(c["group"], c["name"], c["outcome"], c["message"]) for c in res.json["checks"]]
    assert {c[0] for c in recorded} >= {"post-image", "integrity", "probe"}
    assert any(c[2] == "failed" for c in recorded) == (command == "verify")
    assert json.loads((tmp_path / "r" / "audit.json").read_text())["checks"] == res.json["checks"]
    assert _junit_checks(tmp_path / "r" / "junit.xml") == recorded
    # The forms render the recorded list and compute none of their own: a check recorded in
    # audit.json (here one added by hand) is what `report render` shows, in JUnit and Markdown.
    saved = json.loads((tmp_path / "r" / "audit.json").read_text())
    saved["checks"].append({"group": "sbom", "name": "sbom: lists every file", "outcome": "failed",
                            "message": "3 files not listed", "detail": ""})
    (tmp_path / "edited.json").write_text(json.dumps(saved))
    junit = run("report", "render", str(tmp_path / "edited.json"), "--format", "junit")
    assert junit.returncode == 0, junit.stderr
    (tmp_path / "edited.xml").write_text(junit.stdout)
    assert _junit_checks(tmp_path / "edited.xml") == [*recorded, ("sbom", "sbom: lists every file", "failed",
                                                                  "3 files not listed")]
    md = run("report", "render", str(tmp_path / "edited.json"), "--format", "md")
    assert md.returncode == 0 and "- ❌ sbom: lists every file — 3 files not listed" in md.stdout
