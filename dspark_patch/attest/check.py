"""Is there a valid signed attestation for this manifest? Read from the registry alone: manifests,
the referrers list and the envelope blob, never an image layer.

An attestation holds when, for the manifest `digest` in `repository`:
- an artifact listed as referring to it has `subject.digest == digest` (the fallback tag's list
  is anyone's to write, so it is only a hint);
- its envelope verifies with the given public key (DSSE PAE);
- the signed statement is ours (in-toto v1, our predicate type) and names `digest` as a subject;
- the predicate, the audit report, says the reviewed patch set was applied to that image: patch
  id, a variant of it with every reviewed post-image sha256, compile ok, probe ok.

The probe's standing is part of the verdict: `proven` where the signing run ran it (apply), or
`claimed` where publish carried an in-image job's result (`probe.claimed_by`: not verified by
the publisher), or `not-run`. `require_proven_probe` holds only a proven one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dspark_patch.attest.dsse import AttestationInvalid, Verifier, open_envelope
from dspark_patch.errors import BadInput, DsparkPatchError
from dspark_patch.patchset import PatchSet
from dspark_patch.registry import referrers
from dspark_patch.registry.index import OCI_MANIFEST, Registry
from dspark_patch.report.audit_json import from_json_dict
from dspark_patch.report.intoto import PREDICATE_TYPE, STATEMENT_TYPE
from dspark_patch.report.model import AttestationReport, AuditReport, ProbeStanding

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# The fallback tag's list is anyone's to write: look at no more than this many of our kind,
# newest first, so a flooded list costs a bounded number of reads.
MAX_CHECKED = 16


@dataclass(frozen=True, kw_only=True)
class Subject:
    repository: str
    digest: str      # sha256:... of the manifest or index

    @property
    def ref(self) -> str:
        return f"{self.repository}@{self.digest}"


def check(registry: Registry, subject: Subject, verifier: Verifier, patchset: PatchSet, *,
          require_proven_probe: bool = False) -> AttestationReport:
    """The first valid attestation for `subject`, or why there is none (state none / invalid)."""
    listed, via = referrers.find(registry, subject.repository, subject.digest)
    ours = [d for d in listed if d.get("artifactType") == referrers.ARTIFACT_TYPE]
    if not ours:
        return AttestationReport(subject=subject.ref, state="none", keyid=verifier.keyid, via=via,
                                 detail="no referrer: no signed attestation is attached to it")
    failures: list[AttestationReport] = []
    for descriptor in list(reversed(ours))[:MAX_CHECKED]:
        artifact = str(descriptor.get("digest", ""))
        try:
            probe = _check_one(registry, subject, artifact, verifier, patchset, require_proven_probe)
        except DsparkPatchError as exc:
            failures.append(AttestationReport(subject=subject.ref, state="invalid", keyid=verifier.keyid,
                                              artifact=artifact if artifact.startswith("sha256:") else None,
                                              via=via, detail=exc.message))
            continue
        return AttestationReport(subject=subject.ref, state="valid", keyid=verifier.keyid, artifact=artifact, via=via,
                                 probe=probe)
    first = failures[0]
    if len(failures) > 1:
        return AttestationReport(subject=first.subject, state="invalid", keyid=first.keyid, artifact=first.artifact,
                                 via=via, detail=f"{first.detail} (and {len(failures) - 1} more invalid attestation(s))")
    return first


def _check_one(registry: Registry, subject: Subject, artifact: str, verifier: Verifier, patchset: PatchSet,
               require_proven_probe: bool) -> ProbeStanding:
    if not _DIGEST.match(artifact):
        raise AttestationInvalid(f"a referrer is listed with the digest {artifact[:80]!r}, which is not a sha256 digest")
    manifest = registry.fetch(f"{subject.repository}@{artifact}")  # checked against its digest there
    if manifest.media_type != OCI_MANIFEST:
        raise AttestationInvalid(f"the referrer {artifact[:19]} is a {manifest.media_type}, not an OCI artifact manifest")
    document = manifest.document()
    named = (document.get("subject") or {}).get("digest") if isinstance(document.get("subject"), dict) else None
    if named != subject.digest:
        raise AttestationInvalid(f"subject mismatch: the attestation {artifact[:19]} refers to {named}, "
                                 f"not {subject.digest}")
    listed = document.get("layers")
    layers = [la for la in (listed if isinstance(listed, list) else []) if isinstance(la, dict)
              and la.get("mediaType") == referrers.ENVELOPE_MEDIA_TYPE]
    if len(layers) != 1:
        raise AttestationInvalid(f"the attestation {artifact[:19]} does not hold exactly one DSSE envelope")
    size = layers[0].get("size")
    if not isinstance(size, int) or not 0 < size <= referrers.MAX_ENVELOPE_BYTES:
        raise AttestationInvalid(f"the attestation {artifact[:19]}'s envelope claims {size!r} bytes")
    blob = str(layers[0].get("digest"))
    if not _DIGEST.match(blob):
        raise AttestationInvalid(f"the attestation {artifact[:19]}'s envelope has no sha256 digest")
    body = registry.fetch_blob(subject.ref, blob)
    statement = open_envelope(body, verifier)
    _check_statement(statement, subject)
    return _check_predicate(statement.get("predicate"), subject, patchset, require_proven_probe)


def _check_statement(statement: dict[str, Any], subject: Subject) -> None:
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        raise AttestationInvalid(f"the signed statement is not a dspark-patch audit ({statement.get('predicateType')!r})")
    named = statement.get("subject")
    hexes = [s["digest"].get("sha256") for s in (named if isinstance(named, list) else [])
             if isinstance(s, dict) and isinstance(s.get("digest"), dict)]
    if subject.digest.removeprefix("sha256:") not in hexes:
        raise AttestationInvalid(f"subject mismatch: the signed statement does not name {subject.digest} "
                                 "(it was made for another image)")


def _check_predicate(predicate: Any, subject: Subject, patchset: PatchSet,
                     require_proven_probe: bool) -> ProbeStanding:
    try:
        report = from_json_dict(predicate)
    except BadInput as exc:
        raise AttestationInvalid(f"the predicate is not a dspark-patch audit report: {exc.message}") from None
    if report.command != "apply" or report.status not in ("applied", "already-applied"):
        raise AttestationInvalid(f"predicate says failed: the signed run is {report.command} {report.status}")
    images = _image_reports(report, subject)
    if not images:
        raise AttestationInvalid(f"subject mismatch: the predicate reports no image with digest {subject.digest}")
    standings = [_check_image(image, patchset, require_proven_probe) for image in images]
    return min(standings, key=_WEAKEST_FIRST.index)   # an index's: its weakest platform's


def _image_reports(report: AuditReport, subject: Subject) -> Sequence[AuditReport]:
    """The per-image reports the subject is about: all platforms for the index, one platform for
    its manifest, or the report itself for a single image."""
    if report.index is not None:
        if report.index.result_digest == subject.digest:
            return [p.report for p in report.platforms]
        return [p.report for p in report.platforms if p.result_manifest == subject.digest]
    pushed = report.result_image.repo_digest if report.result_image else None
    return [report] if pushed and pushed.endswith("@" + subject.digest) else []


_WEAKEST_FIRST: list[ProbeStanding] = ["not-run", "claimed", "proven"]


def _check_image(report: AuditReport, patchset: PatchSet, require_proven_probe: bool) -> ProbeStanding:
    patch = report.patch
    if patch is None or patch.id != patchset.id:
        raise AttestationInvalid(f"predicate says patch set {patch.id if patch else None!r}, not {patchset.id!r}")
    variant = next((v for v in patchset.variants if v.name == patch.variant), None)
    if variant is None:
        raise AttestationInvalid(f"predicate names variant {patch.variant!r}, which {patchset.id} does not have")
    if patch.sha256 != variant.diff_sha256:
        raise AttestationInvalid(f"predicate says diff {patch.sha256[:12]}, not the reviewed {variant.name} diff")
    posts = {f.path: f.post_sha256 for f in report.files}
    wrong = [p for p, h in variant.files.items() if posts.get(p) != h.post_sha256]
    if wrong:
        raise AttestationInvalid(f"predicate says {wrong[0]} is not the reviewed post-image")
    if not report.compile.ok or (report.status == "applied" and not report.compile.ran):
        raise AttestationInvalid("predicate says failed: compile did not pass")
    if not report.probe.ok or (report.status == "applied" and patchset.probe is not None and not report.probe.ran):
        raise AttestationInvalid("predicate says failed: the probe did not pass")
    standing: ProbeStanding = "not-run" if not report.probe.ran else "claimed" if report.probe.claimed_by else "proven"
    if require_proven_probe and standing != "proven" and patchset.probe is not None:
        said = ("claimed by the in-image job, not verified by the publisher" if standing == "claimed"
                else "not run by the signing run")
        raise AttestationInvalid(f"probe not proven: the predicate's probe result is {said}, and a proven probe "
                                 "is required")
    return standing
