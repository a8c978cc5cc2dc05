"""Signed attestations in the registry: attach them after `apply --push --sign-key`, and check
them with `verify --attestation` from manifests alone (no engine, no layer pulled).

Attach: the in-toto Statement of the finished apply report (predicate: the audit; subjects: the
pushed manifest, or the index and each platform manifest) is signed once as a DSSE envelope and
attached to every subject as an artifact (registry/referrers.py). The signed predicate is the
report as it stood before attaching, so its own `attestations` field is empty.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..attest.check import Subject, check
from ..attest.dsse import AttestationInvalid, Signer, envelope, load_verifier
from ..errors import BadInput, DsparkPatchError
from ..imageref import ImageRef
from ..patchset import resolve
from ..registry import referrers
from ..registry.index import Registry, parse_index
from ..registry.platform_select import Platform, select
from ..report.checks import record_checks
from ..report.intoto import PREDICATE_TYPE, subjects, to_intoto
from ..report.model import AttestationReport, AuditReport, StepReport, TargetReport
from ..routing import ATTESTATION
from .image_steps import LABEL_PREFIX
from .runlog import RunLog, StepCallback


@dataclass(frozen=True, kw_only=True)
class AttestationRequest:
    ref: str                     # HOST[:PORT]/REPO:TAG or @sha256:... in a registry
    key: str                     # the public key (PEM) the attestation must be signed with
    patch: str | None = None     # the patch set it must attest; default dspark-skip-mtp-buffer
    platform: str | None = None  # for an index: which platforms (default: every one), plus the index
    # A probe result the signer carried as an in-image job's claim (publish) does not hold: the
    # signing run must have run the probe itself (apply).
    require_proven_probe: bool = False


def _host(ref: str, what: str) -> str:
    host = ImageRef.host_of(ref)
    if host is None:
        raise BadInput(f"{what} works on images in a registry; {ref} names no registry host",
                       hint="name the image with its registry, e.g. registry.example:5000/vllm/vllm-openai:TAG")
    return host


def sign_and_attach(report: AuditReport, signer: Signer, on_step: StepCallback | None) -> AuditReport:
    """`report` with the signed attestation attached to each pushed manifest it names."""
    if not report.ok or report.status not in ("applied", "already-applied"):
        return report
    pushed = [(name, digest) for name, digest in subjects(report) if _is_pushed(report, digest)]
    if not pushed:
        note = "--sign-key: no manifest was pushed by this run, so no attestation was attached"
        return replace(report, notes=(*report.notes, note))
    steps = list(report.steps)
    attached: list[AttestationReport] = []

    def step(name: str, start: float, status: str = "ok", detail: str = "") -> None:
        done = StepReport(name=name, status="ok" if status == "ok" else "failed", seconds=time.monotonic() - start,
                          detail=detail)
        steps.append(done)
        if on_step is not None:
            on_step(done)

    start = time.monotonic()
    (name, digest), *more = pushed
    # The signed predicate holds the checks of the report it is: this one, before attaching.
    statement = to_intoto(record_checks(replace(report, attestations=())), subject_name=name, subject_digest=digest,
                          more=more)
    signed = envelope(statement, signer)
    step("sign", start)
    annotations = _annotations(report)
    for name, digest in pushed:
        repository = ImageRef.parse(name).name
        start = time.monotonic()
        try:
            registry = Registry(_host(repository, "--sign-key"))
            subject = registry.fetch(f"{repository}@{digest}")
            done = referrers.attach(registry, repository, subject, signed, annotations)
        except DsparkPatchError as exc:
            step(f"attach {digest[:19]}", start, "failed", exc.line())
            failed = replace(report, attestations=tuple(attached), steps=tuple(steps))
            note = "the image is pushed and tagged; its signed attestation is not (fully) attached"
            return _failed(failed, exc, note)
        step(f"attach {digest[:19]}", start)
        attached.append(AttestationReport(subject=f"{repository}@{digest}", state="attached", keyid=signer.keyid,
                                          artifact=done.artifact, via=done.via))
    notes = [f"attached a signed attestation (key {signer.keyid[:16]}) to {a.subject} via the {a.via}" for a in attached]
    return replace(report, attestations=tuple(attached), steps=tuple(steps), notes=(*report.notes, *notes))


def _is_pushed(report: AuditReport, digest: str) -> bool:
    if report.index is not None and report.index.result_digest == digest:
        return True
    images = [report.result_image, *(p.report.result_image for p in report.platforms)]
    return any(i is not None and i.repo_digest is not None and i.repo_digest.endswith("@" + digest) for i in images)


def _annotations(report: AuditReport) -> dict[str, str]:
    patch = report.patch or next((p.report.patch for p in report.platforms if p.report.patch), None)
    variants = sorted({p.report.patch.variant for p in report.platforms if p.report.patch and p.report.patch.variant})
    variant = (patch.variant if patch and patch.variant and not report.platforms else ",".join(variants)) or ""
    return {
        referrers.PREDICATE_ANNOTATION: PREDICATE_TYPE,
        f"{LABEL_PREFIX}.patch.id": (patch.id if patch and patch.id else "bare-diff"),
        f"{LABEL_PREFIX}.patch.variant": variant,
        "org.opencontainers.image.created": report.started_at,
    }


def _failed(report: AuditReport, exc: DsparkPatchError, note: str) -> AuditReport:
    from ..report.model import ErrorReport

    error = ErrorReport(kind=exc.kind, message=exc.message, hint=exc.hint, exit_code=exc.exit_code)
    return replace(report, status="failed", exit_code=exc.exit_code, errors=(error,), notes=(*report.notes, note))


def verify_attestation(request: AttestationRequest, *, on_step: StepCallback | None = None) -> AuditReport:
    """Exit 0 when every manifest the reference resolves to (the index and each chosen platform)
    carries a valid attestation; 1 naming the first that does not, and why."""
    run = RunLog.start("verify", TargetReport(kind="image", ref=request.ref), on_step, route=ATTESTATION)
    try:
        with run.step("load key"):
            verifier = load_verifier(Path(request.key))
            patchset = resolve(request.patch)
        repository = ImageRef.parse(request.ref).name
        with run.step("resolve"):
            registry = Registry(_host(request.ref, "verify --attestation"))
            manifest = registry.fetch(request.ref)
            wanted = [Subject(repository=repository, digest=manifest.digest)]
            if manifest.is_index:
                index = parse_index(manifest)
                chosen = select(index.platforms, request.platform or "all", Platform(os="linux", architecture="amd64"))
                wanted += [Subject(repository=repository, digest=index.entry_for(p).digest) for p in chosen]
            elif request.platform is not None:
                raise BadInput(f"{request.ref} is a single-platform image, not an index; --platform selects "
                               "platforms of an index", hint="drop --platform")
        found = []
        for subject in wanted:
            with run.step(f"attestation {subject.digest[:19]}"):
                found.append(check(registry, subject, verifier, patchset,
                                   require_proven_probe=request.require_proven_probe))
            run.update(attestations=tuple(found))
        bad = [a for a in found if a.state != "valid"]
        if bad:
            more = f" (and {len(bad) - 1} more manifest(s) without a valid one)" if len(bad) > 1 else ""
            raise AttestationInvalid(f"{bad[0].subject}: {bad[0].detail}{more}",
                                     hint="attach one with `apply --push --sign-key`, or check --key")
        run.notes.append(f"{len(found)} manifest(s) carry a valid attestation signed by key {verifier.keyid[:16]}; "
                         "no layer was pulled")
        run.notes += [f"{a.subject}: the probe's result is claimed by the in-image job, not verified by the publisher "
                      "(--require-proven-probe refuses it)" for a in found if a.probe == "claimed"]
        return record_checks(run.report("verified"))
    except DsparkPatchError as exc:
        return record_checks(run.report("failed", exc))
