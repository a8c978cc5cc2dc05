"""The labels a patched image carries, from what its run recorded: one rule for `apply --image`
(at the commit) and `publish` (from the audit report the in-image run wrote), so both give an
image the same labels for the same source.

`report.sha256` is the digest of the run's evidence as it stood before the commit (`digestable`):
the patch, each file's hashes and hunks, the compile and probe verdicts, the layer's changes and
the source image's id (the result's own id cannot be inside its own label).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .model import AuditReport, PatchReport

LABEL_PREFIX = "io.github.dspark-patch"
SERIES_LABEL = f"{LABEL_PREFIX}.series"


def series_label(members: Sequence[PatchReport]) -> str:
    """The series an image carries, in order: each member's id, variant, diff digest and review
    state (only on an image made from a series of several patch sets)."""
    return json.dumps([{"id": m.id, "variant": m.variant, "sha256": m.sha256, "review": m.review} for m in members],
                      separators=(",", ":"))


def digestable(report: AuditReport) -> dict[str, Any]:
    """What `report.sha256` covers (see the module's docstring)."""
    return {
        "patch": report.patch and {"id": report.patch.id, "variant": report.patch.variant, "sha256": report.patch.sha256},
        "files": [{"path": f.path, "pre": f.pre_sha256, "post": f.post_sha256,
                   "hunks": [(h.source_start, h.applied_at, h.offset, h.fuzz) for h in f.hunks]} for f in report.files],
        "compile": report.compile.ok, "probe": [(c.name, c.ok) for c in report.probe.cases],
        "layer": [(c.kind, c.path) for c in report.layer.changes] if report.layer else [],
        "source_image": report.target.image and report.target.image.id,
    }


def image_labels(report: AuditReport, *, patch_id: str, variant: str, diff_sha256: str,
                 files: Mapping[str, str | None], tool_version: str) -> dict[str, str]:
    """Our labels for the image `report`'s run makes (its `target.image` the source image)."""
    labels = {
        f"{LABEL_PREFIX}.patch.id": patch_id,
        f"{LABEL_PREFIX}.patch.variant": variant,
        f"{LABEL_PREFIX}.patch.sha256": diff_sha256,
        f"{LABEL_PREFIX}.files": json.dumps(dict(files), sort_keys=True, separators=(",", ":")),
        f"{LABEL_PREFIX}.tool-version": tool_version,
    }
    if report.series:
        labels[SERIES_LABEL] = series_label(report.series)
    evidence = json.dumps(digestable(report), sort_keys=True, separators=(",", ":"))
    labels[f"{LABEL_PREFIX}.report.sha256"] = hashlib.sha256(evidence.encode()).hexdigest()
    return labels


def labels_of_report(report: AuditReport, tool_version: str) -> dict[str, str]:
    """The labels `apply --image` gives a reviewed patch set's (or series') image, from its report:
    what `publish` puts on the image it makes from an in-image run's report."""
    assert report.patch is not None and report.patch.id and report.patch.variant
    return image_labels(report, patch_id=report.patch.id, variant=report.patch.variant,
                        diff_sha256=report.patch.sha256, files={f.path: f.post_sha256 for f in report.files},
                        tool_version=tool_version)
