"""Artifacts that refer to an image (OCI distribution spec 1.1, "referrers"): attach one, find them.

An attestation is an OCI image manifest whose `subject` is the image's manifest, with the empty
config (`application/vnd.oci.empty.v1+json`, `{}`) and one layer, the DSSE envelope. A registry
with the referrers API lists it at GET /v2/<name>/referrers/<digest> and says so when the
manifest is pushed (the OCI-Subject header). One without it (distribution 2.8, Debian's
`docker-registry`) gets the spec's fallback: the tag `sha256-<hex>` of the subject holds an OCI
index of the referrers, which each client reads, extends with its own entry and pushes back,
keeping every entry other tools put there. A single manifest PUT is the only write to that tag,
so it is never seen half written; a lost race (someone else changed it in between) is detected
by reading it back, and retried.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dspark_patch.errors import TargetNotFound
from dspark_patch.registry.index import OCI_INDEX, OCI_MANIFEST, Manifest, Registry, RegistryRefused, digest_of

# What the artifact is (what `oras discover --artifact-type` and policy engines filter on) and
# what its one layer holds: both the DSSE envelope type, as cosign's OCI 1.1 referrers mode
# writes for attestations; the in-toto predicate type is in the annotations.
ARTIFACT_TYPE = "application/vnd.dsse.envelope.v1+json"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
MAX_ENVELOPE_BYTES = 32 * 1024 * 1024  # an audit report is kilobytes; anything near this is hostile
_ATTEMPTS = 4

Via = Literal["referrers-api", "fallback-tag"]


@dataclass(frozen=True, kw_only=True)
class Attached:
    subject: str          # sha256:... of the manifest the artifact refers to
    artifact: str         # sha256:... of the artifact manifest
    via: Via


def fallback_tag(digest: str) -> str:
    """The spec's tag for the referrers of `digest` (`sha256:abc` -> `sha256-abc`)."""
    algorithm, _, hex_ = digest.partition(":")
    return f"{algorithm}-{hex_}"


def artifact_manifest(*, subject: Manifest | Mapping[str, Any], envelope_digest: str, envelope_size: int,
                      annotations: Mapping[str, str]) -> bytes:
    if isinstance(subject, Manifest):
        described = {"mediaType": subject.media_type, "digest": subject.digest, "size": len(subject.body)}
    else:
        described = dict(subject)
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": digest_of(EMPTY_BLOB), "size": len(EMPTY_BLOB),
                   "data": "e30="},
        "layers": [{"mediaType": ENVELOPE_MEDIA_TYPE, "digest": envelope_digest, "size": envelope_size}],
        "subject": described,
        "annotations": dict(annotations),
    }
    return json.dumps(document, indent=2).encode() + b"\n"


def attach(registry: Registry, repository: str, subject: Manifest, envelope: bytes,
           annotations: Mapping[str, str]) -> Attached:
    """Push `envelope` as an artifact referring to `subject` (a manifest in `repository`)."""
    envelope_digest = registry.push_blob(repository, envelope)
    registry.push_blob(repository, EMPTY_BLOB)
    body = artifact_manifest(subject=subject, envelope_digest=envelope_digest, envelope_size=len(envelope),
                             annotations=annotations)
    pushed, acknowledged = registry.push_with_subject(f"{repository}@{digest_of(body)}", body, OCI_MANIFEST)
    if acknowledged:
        return Attached(subject=subject.digest, artifact=pushed.digest, via="referrers-api")
    descriptor = {"mediaType": OCI_MANIFEST, "digest": pushed.digest, "size": len(body),
                  "artifactType": ARTIFACT_TYPE, "annotations": dict(annotations)}
    _add_to_fallback(registry, repository, subject.digest, descriptor)
    return Attached(subject=subject.digest, artifact=pushed.digest, via="fallback-tag")


def _read_fallback(registry: Registry, repository: str, digest: str) -> Manifest | None:
    try:
        current = registry.fetch(f"{repository}:{fallback_tag(digest)}")
    except TargetNotFound:
        return None
    if current.media_type != OCI_INDEX:
        raise RegistryRefused(
            f"{repository}:{fallback_tag(digest)} holds a {current.media_type or 'non-index'}, not the OCI index "
            "of referrers the spec puts under that tag; it was left as it is",
            hint="remove or rename that tag, then apply again")
    return current


def _entries(index: Manifest | None) -> list[dict[str, Any]]:
    if index is None:
        return []
    listed = index.document().get("manifests")
    return [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []


def _add_to_fallback(registry: Registry, repository: str, subject: str, descriptor: dict[str, Any]) -> None:
    tag = f"{repository}:{fallback_tag(subject)}"
    for _ in range(_ATTEMPTS):
        current = _read_fallback(registry, repository, subject)
        entries = _entries(current)
        if any(e.get("digest") == descriptor["digest"] for e in entries):
            return
        document = {k: v for k, v in (current.document() if current else {}).items() if k != "manifests"}
        document.update(schemaVersion=2, mediaType=OCI_INDEX, manifests=[*entries, descriptor])
        body = json.dumps(document, indent=2).encode() + b"\n"
        # Read again just before the write: if another client changed the tag since, start over
        # from its version rather than overwrite it (the registry has no conditional PUT).
        again = _read_fallback(registry, repository, subject)
        if (again.digest if again else None) != (current.digest if current else None):
            continue
        registry.push(tag, body, OCI_INDEX)
        after = _entries(_read_fallback(registry, repository, subject))
        kept = {e.get("digest") for e in after}
        if descriptor["digest"] in kept and all(e.get("digest") in kept for e in entries):
            return
    raise RegistryRefused(f"{tag} kept changing while the attestation was added to it; the image is pushed "
                          "and tagged, its attestation is not listed", hint="run apply again to attach it")


def find(registry: Registry, repository: str, digest: str) -> tuple[list[dict[str, Any]], Via]:
    """The artifact descriptors that say they refer to `digest`: from the referrers API where the
    registry has one, else from the fallback tag. What they claim is checked by the caller."""
    listed = registry.referrers(repository, digest)
    if listed is not None:
        return listed, "referrers-api"
    return _entries(_read_fallback(registry, repository, digest)), "fallback-tag"
