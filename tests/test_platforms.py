"""`--platform` on a real two-platform index (linux/amd64 + linux/arm64/v8) in a real loopback
registry, on the real engine: every platform patched exactly and probed on its own architecture
(arm64 under qemu), one new index published of the source's kind, shape and annotations, and
each way of asking for a platform the index does not have.

Publishing the fixture index (two ~2 GB images) and patching both platforms takes minutes on a
shared machine, so the index and the patched index are made once per module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import docker
import pytest

from dspark_patch.pipeline.index_run import platform_tag
from dspark_patch.registry.index import Registry, parse_index
from dspark_patch.registry.platform_select import Platform
from dspark_patch.report.render import read_report
from tests.support.cli import run
from tests.support.images import fixture_image
from tests.support.index import INDEX_ANNOTATIONS, PLATFORMS, PublishedIndex, fixture_index

AMD64, ARM64 = "linux/amd64", "linux/arm64/v8"

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.emulation]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> PublishedIndex:
    with fixture_index(tmp_path_factory.mktemp("registry")) as published:
        yield published


@pytest.fixture(scope="module")
def patched(index, tmp_path_factory):
    """`apply --platform all --tag ... --push`, once: (the new index's tag, the CLI result, reports)."""
    tag = index.ref.rsplit(":", 1)[0] + ":0.33.0-dspark"
    reports = tmp_path_factory.mktemp("apply-reports")
    result = run("apply", "--image", index.ref, "--platform", "all", "--tag", tag, "--push",
                 "--report-dir", str(reports))
    yield tag, result, reports


def _layers(registry: Registry, ref: str) -> list[str]:
    return [layer["digest"] for layer in json.loads(registry.fetch(ref).body)["layers"]]


def test_apply_all_push_publishes_one_index_with_each_platform_one_layer_above_its_source(index, patched):
    tag, result, _ = patched
    assert result.returncode == 0, result.stderr[-3000:]
    registry = Registry(tag.split("/", 1)[0])
    source = parse_index(registry.fetch(index.ref))
    new = parse_index(registry.fetch(tag))
    # Same kind, same platforms in the same order with their platform fields as written, the
    # source's annotations; no attestation of the unpatched images carried over.
    assert new.manifest.media_type == index.media_type
    assert [e.raw["platform"] for e in new.entries] == [dict(p) for p in PLATFORMS]
    assert dict(new.annotations) == INDEX_ANNOTATIONS
    repository = tag.rsplit(":", 1)[0]
    for old, fresh in zip(source.images, new.images, strict=True):
        before = _layers(registry, f"{repository}@{old.digest}")
        after = _layers(registry, f"{repository}@{fresh.digest}")
        assert after[:-1] == before and len(after) == len(before) + 1, old.platform


def test_the_arm64_probe_ran_under_emulation_and_each_platform_has_its_own_evidence(index, patched):
    tag, result, reports = patched
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(reports / "audit.json")  # validated against the shipped schema
    assert report.status == "applied" and report.index is not None
    assert report.index.platforms == (AMD64, ARM64)
    assert report.index.result_ref == tag
    by_platform = {p.platform: p for p in report.platforms}
    assert list(by_platform) == [AMD64, ARM64]
    assert not by_platform[AMD64].emulated and by_platform[ARM64].emulated
    for p in report.platforms:
        r = p.report
        assert r.status == "applied" and r.compile.ok and r.compile.ran
        assert r.probe.ran and r.probe.ok and r.probe.cases
        assert r.layer is not None and r.layer.ok
        assert all(h.fuzz == 0 for f in r.files for h in f.hunks) and r.files
        assert p.result_manifest and r.result_image and r.result_image.repo_digest.endswith(p.result_manifest)
        assert p.source_manifest in {m.digest for m in index.images}
    # Each platform ran its own python: the arm64 fixture is trixie (3.13), amd64 bookworm (3.11).
    assert (by_platform[ARM64].report.target.python_version or "").startswith("3.13")
    steps = [s.name for s in by_platform[ARM64].report.steps]
    assert "emulation" in steps and "probe" in steps

    junit = ET.parse(reports / "junit.xml").getroot()
    assert [s.get("name") for s in junit.iter("testsuite")][:2] == [
        f"dspark-patch apply {AMD64}", f"dspark-patch apply {ARM64}"]
    assert junit.get("failures") == "0"

    statement = json.loads((reports / "attestation.intoto.json").read_text())
    digests = [s["digest"]["sha256"] for s in statement["subject"]]
    assert digests == [report.index.result_digest[7:]] + [p.result_manifest[7:] for p in report.platforms]

    markdown = (reports / "audit.md").read_text()
    assert f"## Platform `{AMD64}`" in markdown and f"## Platform `{ARM64}`" in markdown


def test_verify_all_passes_on_the_patched_index_and_fails_on_the_source(index, patched, tmp_path):
    tag, applied, _ = patched
    assert applied.returncode == 0, applied.stderr[-3000:]
    # The probe ran on both platforms in `apply` (above) and verify's probe step is the same
    # code: here the post-images, labels, integrity and layers of each platform, with no second
    # emulated probe (a minute of qemu).
    good = run("verify", "--image", tag, "--platform", "all", "--json", "--no-probe",
               "--report-dir", str(tmp_path / "good"))
    assert good.returncode == 0, good.stderr[-3000:]
    assert [p["report"]["status"] for p in good.json["platforms"]] == ["verified", "verified"]
    for p in good.json["platforms"]:
        assert p["report"]["integrity"]["checked"] > 5000 and not p["report"]["integrity"]["mismatched"], p["platform"]
        assert p["report"]["files"] and all(f["post_sha256"] == f["expected_post_sha256"] for f in p["report"]["files"])

    bad = run("verify", "--image", index.ref, "--platform", "all", "--json", "--no-probe",
              "--report-dir", str(tmp_path / "bad"))
    assert bad.returncode == 1, bad.stderr[-3000:]
    doc = bad.json
    assert doc["status"] == "failed"
    assert [p["report"]["status"] for p in doc["platforms"]] == ["failed", "failed"]
    assert "unpatched" in doc["platforms"][1]["report"]["errors"][0]["message"]


def test_a_platform_the_index_lacks_is_exit_2_listing_the_ones_it_has(index, tmp_path):
    result = run("probe", "--image", index.ref, "--platform", "linux/s390x", "--report-dir", str(tmp_path))
    line = result.assert_clean_error(2)
    assert "linux/s390x" in line and AMD64 in line and ARM64 in line


def test_push_of_part_of_an_index_is_refused_before_any_work(index, tmp_path):
    tag = index.ref.rsplit(":", 1)[0] + ":half"
    result = run("apply", "--image", index.ref, "--tag", tag, "--push", "--report-dir", str(tmp_path))
    line = result.assert_clean_error(2)
    assert "--platform all" in line and ARM64 in line
    registry = Registry(tag.split("/", 1)[0])
    with pytest.raises(Exception, match="not in the registry"):
        registry.fetch(tag)
    doc = json.loads((tmp_path / "audit.json").read_text())
    assert doc["platforms"] == []  # no platform was even pulled


def test_default_is_the_engines_platform_with_a_note_naming_the_others(index, tmp_path):
    # A dry run: the source is unpatched, so its probe would (rightly) fail.
    result = run("apply", "--image", index.ref, "--dry-run", "--json", "--report-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    doc = result.json
    assert doc["status"] == "dry-run"
    assert [p["platform"] for p in doc["platforms"]] == [AMD64]
    assert any(ARM64 in note and "--platform all" in note for note in doc["notes"])


def test_platform_on_a_local_tree_is_bad_input(tmp_path: Path):
    result = run("probe", "--root", str(tmp_path), "--platform", "linux/amd64")
    assert "--platform is for --image" in result.assert_clean_error(2)


# The real CLI, with one thing added once the report set is written and before anything is
# named: another run takes the arm64 image's name (as a second CI job would).
TAKES_A_NAME = r"""
import sys
import docker
import dspark_patch.cli.common as common

name, image, made = sys.argv[1], sys.argv[2], sys.argv[3]
written = common.write_reports

def write_then_take(report, folder, junit):
    written(report, folder, junit)
    if report.exit_code == 0:
        # the images this run committed, as the report about to name them says: the test's own
        with open(made, "w") as out:
            out.write("\n".join(p.report.result_image.id for p in report.platforms))
        repository, tag = name.rsplit(":", 1)
        docker.from_env().images.get(image).tag(repository, tag)

common.write_reports = write_then_take
sys.argv = ["dspark-patch", *sys.argv[4:]]
from dspark_patch.cli import main
main()
"""


def test_a_name_taken_while_an_index_run_names_its_images_takes_back_every_name(index, tmp_path):
    client = docker.from_env()
    tag = index.ref.rsplit(":", 1)[0] + ":taken-" + tmp_path.name[-8:].replace("_", "")
    amd64, arm64 = (platform_tag(tag, Platform.parse(p)) for p in (AMD64, ARM64))
    taker = client.images.get(fixture_image()).id  # the image another run names arm64's tag
    made = tmp_path / "made"
    done = subprocess.run([sys.executable, "-c", TAKES_A_NAME, arm64, taker, str(made), "apply", "--image", index.ref,
                           "--platform", "all", "--tag", tag, "--no-probe", "--report-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=1500)
    try:
        assert done.returncode == 2, done.stderr[-3000:]
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith("dspark-patch: error:") and arm64 in line, line
        # The run's own name is taken back, the other run's stays, and no image of this run is left.
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(amd64)
        assert client.images.get(arm64).id == taker
        # (this run's own images by id: other tests commit images on the same engine meanwhile)
        ours = made.read_text().split()
        assert len(ours) == 2 and taker not in ours, ours
        for image_id in ours:
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(image_id)
        audit = json.loads((tmp_path / "r" / "audit.json").read_text())
        assert audit["status"] == "failed" and audit["errors"][0]["kind"] == "tag-race"
        assert [p["report"]["result_image"] for p in audit["platforms"]] == [None, None]
        assert any(amd64 in note for note in audit["notes"]), audit["notes"]
    finally:
        for name in (amd64, arm64):
            try:
                client.images.remove(name)
            except docker.errors.ImageNotFound:
                pass
