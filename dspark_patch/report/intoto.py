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
from dspark_patch.report.model import AuditReport, ImageRef
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


def image_subject(image: ImageRef) -> tuple[str, str]:
    """(name, digest) of an image for a subject: the pushed manifest digest when there is one,
    since that is what registries, cosign and admission policies key on; else the image id."""
    if image.repo_digest:
        name, _, digest = image.repo_digest.partition("@")
        return name, digest
    return image.ref, image.id


def to_intoto(report: AuditReport, *, subject_name: str, subject_digest: str) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": sha256_hex(subject_digest)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": to_data(report),
    }
