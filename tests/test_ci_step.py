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
