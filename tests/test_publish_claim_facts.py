"""What publish takes from an in-image report and what it says itself (fast tier; the CLI against a
real registry is tests/test_publish_claims.py): review states from the patch sets it loads, the
probe's result as the job's claim; and how `verify --attestation` holds a predicate's probe."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dspark_patch.attest.check import _check_image
from dspark_patch.attest.dsse import AttestationInvalid
from dspark_patch.errors import UnreviewedVariant
from dspark_patch.patchset import resolve
from dspark_patch.publish.claim import CLAIMED_NOTE, as_publisher_knows
from dspark_patch.report.checks import record_checks
from dspark_patch.report.model import AuditReport, FileReport, ProbeReport
from tests.test_report_render import applied_report

SHIPPED = resolve("dspark-skip-mtp-buffer")
TEAM_SET = Path(__file__).resolve().parent / "data" / "patchsets" / "vllm-math-positive-divisor"


def _report(patchset_id: str = "dspark-skip-mtp-buffer", **changes) -> AuditReport:
    report = applied_report()
    variant = resolve(patchset_id).variant_for("0.33.0")   # a team's from DSPARK_PATCH_PATH too
    assert report.patch is not None
    return replace(report, patch=replace(report.patch, id=patchset_id, variant=variant.name,
                                         sha256=variant.diff_sha256, review="reviewed"), **changes)


def test_a_probe_the_job_ran_becomes_its_claim_and_one_it_did_not_run_stays_not_run() -> None:
    said = as_publisher_knows(_report(), "audit.json", allow_unreviewed=False)
    assert said.probe.ran and said.probe.claimed_by == "in-image job" and CLAIMED_NOTE in said.notes
    assert {c.message for c in record_checks(said).checks if c.group == "probe"} == {
        "claimed by the in-image job, not verified by the publisher"}
    # A report that names itself a claim but did not run the probe is "not run", no claim of a result.
    skipped = _report(probe=ProbeReport(ok=True, ran=False, detail="--no-probe", claimed_by="in-image job"))
    kept = as_publisher_knows(skipped, "audit.json", allow_unreviewed=False)
    assert not kept.probe.ran and kept.probe.claimed_by == "" and CLAIMED_NOTE not in kept.notes


def test_the_review_state_is_the_loaded_patch_sets_never_the_reports(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    said = _report()
    assert said.patch is not None
    lied = replace(said, patch=replace(said.patch, review="unreviewed"))
    assert as_publisher_knows(lied, "audit.json", allow_unreviewed=False).patch.review == "reviewed"  # type: ignore[union-attr]

    team = tmp_path / "team" / TEAM_SET.name
    shutil.copytree(TEAM_SET, team)
    toml = team / "patch.toml"
    toml.write_text(toml.read_text().replace('diff = "vllm-0.33.0.patch"\n', 'diff = "vllm-0.33.0.patch"\nreview = "unreviewed"\n'))
    monkeypatch.setenv("DSPARK_PATCH_PATH", str(tmp_path / "team"))
    honest = _report(TEAM_SET.name)
    assert honest.patch is not None
    edited = replace(honest, patch=replace(honest.patch, review="reviewed"))
    with pytest.raises(UnreviewedVariant) as refused:
        as_publisher_knows(edited, "audit.json", allow_unreviewed=False)
    assert refused.value.exit_code == 2 and "is unreviewed" in refused.value.message
    allowed = as_publisher_knows(edited, "audit.json", allow_unreviewed=True)
    assert allowed.patch is not None and allowed.patch.review == "unreviewed"
    assert "--allow-unreviewed: variant vllm-0.33.0 has not been reviewed by a person" in allowed.notes


def test_verify_attestation_tells_a_proven_probe_from_a_claim_and_can_require_a_proven_one() -> None:
    files = tuple(FileReport(path=p, action="modify", pre_sha256=h.pre_sha256, post_sha256=h.post_sha256)
                  for p, h in SHIPPED.variant_for("0.33.0").files.items())
    proven = _report(files=files, probe=ProbeReport(ok=True, ran=True))
    claimed = replace(proven, probe=replace(proven.probe, claimed_by="in-image job"))
    assert _check_image(proven, SHIPPED, False) == "proven"
    assert _check_image(proven, SHIPPED, True) == "proven"
    assert _check_image(claimed, SHIPPED, False) == "claimed"
    with pytest.raises(AttestationInvalid) as refused:
        _check_image(claimed, SHIPPED, True)
    assert "claimed by the in-image job, not verified by the publisher" in refused.value.message
    with pytest.raises(AttestationInvalid, match="the probe did not pass"):
        _check_image(replace(proven, probe=ProbeReport(ok=True, ran=False)), SHIPPED, False)
