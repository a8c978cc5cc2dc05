"""An in-toto Statement v1 whose subject is the result image and whose predicate is the audit.

Ready for `cosign attest --type custom`: cosign's `--predicate` takes the predicate alone
(`predicate.json`) and builds its own statement for the image it signs; we also write the
whole statement (`attestation.intoto.json`) for tools that take in-toto statements directly.
Spec: https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md
"""

from __future__ import annotations

import re
from typing import Any

from dspark_patch.errors import BadInput
from dspark_patch.imageref import ImageRef
from dspark_patch.report.model import AuditReport, ImageRecord
from dspark_patch.serialise import to_data

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://github.com/dspark-patch/attestation/audit/v1"

_DIGEST = re.compile(r"^(?:[^@\s]+@)?(?:sha256:)?([0-9a-f]{64})$")


def sha256_hex(digest: str) -> str:
    """The bare hex of `sha256:HEX`, `repo@sha256:HEX` or `HEX`, as in-toto's DigestSet wants it."""
    m = _DIGEST.match(digest.strip())
    if not m:
        raise BadInput(
            f"{digest!r} is not a sha256 image digest",
            hint="give the image id or repo digest, e.g. sha256:<64 hex digits>",
        )
    return m.group(1)


def image_subject(image: ImageRecord) -> tuple[str, str]:
    """(name, digest) of an image for a subject: the pushed manifest digest when there is one,
    since that is what registries, cosign and admission policies key on; else the image id."""
    if image.repo_digest:
        pushed = ImageRef.parse(image.repo_digest)
        assert pushed.digest is not None  # a repo digest is NAME@DIGEST
        return pushed.name, pushed.digest
    return image.ref, image.id


def subjects(report: AuditReport) -> list[tuple[str, str]]:
    """What the statement is about: the result image; for an index run, the published index
    and each platform's manifest (a policy may check either the tag a node pulls or the
    platform image it resolved to); before a push, each platform's committed image."""
    if report.result_image is not None:
        return [image_subject(report.result_image)]
    if not report.ok:  # a failed index run published nothing and kept no image
        return []
    found = []
    if report.index is not None and report.index.result_ref and report.index.result_digest:
        found.append((ImageRef.parse(report.index.result_ref).name, report.index.result_digest))
    for platform in report.platforms:
        if platform.report.result_image is not None:
            found.append(image_subject(platform.report.result_image))
    return found


def to_intoto(report: AuditReport, *, subject_name: str, subject_digest: str,
              more: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    named = [(subject_name, subject_digest), *(more or [])]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": sha256_hex(digest)}} for name, digest in named],
        "predicateType": PREDICATE_TYPE,
        "predicate": to_data(report),
    }
