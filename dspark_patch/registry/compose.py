"""An image with one more layer, as a registry stores it: the new config and manifest. Pure.

Like go-containerregistry's `mutate.AppendLayers`: the source's config document is kept as it was
served (every field, in its order) but for our labels added to `config.Labels`, the new layer's
diff_id appended to `rootfs.diff_ids`, a `created` time, and one history entry for the layer
(history is left out when the source's does not account for its layers: an image config without
history is valid, one whose history disagrees with its layers is not). The manifest is the
source's with the new config and one more layer (gzip, of the source manifest's own family:
Docker v2 or OCI), a `subject` dropped (the new image refers to nothing).
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Mapping
from typing import Any

from .manifest import DOCKER_MANIFEST, Manifest, digest_of, load_object

HISTORY_NOTE = "dspark-patch: the patched files, their bytecode and their folders"
LAYER_TYPES = {DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar.gzip"}
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def gzip_layer(layer: bytes) -> bytes:
    """The layer's blob: gzip with no name and no time in its header, so the same tar gives the
    same blob (and digest) wherever it is published."""
    return gzip.compress(layer, compresslevel=6, mtime=0)


def append_config(source: bytes, *, diff_id: str, labels: Mapping[str, str], created: str) -> bytes:
    """The source config document (its bytes as served) plus one layer (see the module's docstring)."""
    doc: dict[str, Any] = copy.deepcopy(load_object(source, "the source image's config"))
    inner = dict(doc.get("config") or {})
    inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    doc["config"] = inner
    rootfs = dict(doc["rootfs"])
    rootfs["diff_ids"] = [*rootfs["diff_ids"], diff_id]
    doc["rootfs"] = rootfs
    doc["created"] = created
    history = doc.get("history")
    if isinstance(history, list) and all(isinstance(h, dict) for h in history) and \
            sum(1 for h in history if not h.get("empty_layer")) == len(rootfs["diff_ids"]) - 1:
        doc["history"] = [*history, {"created": created, "created_by": HISTORY_NOTE, "comment": "dspark-patch"}]
    else:
        doc.pop("history", None)
    return json.dumps(doc, separators=(",", ":")).encode()


def append_manifest(source: Manifest, *, config: bytes, layer_blob: bytes) -> bytes:
    """The source image manifest naming `config` and one more layer, `layer_blob` (gzip)."""
    doc = copy.deepcopy(source.document())
    doc.pop("subject", None)
    doc["config"] = {**doc["config"], "digest": digest_of(config), "size": len(config)}
    doc["layers"] = [*doc["layers"], {"mediaType": LAYER_TYPES.get(source.media_type, OCI_LAYER),
                                      "digest": digest_of(layer_blob), "size": len(layer_blob)}]
    return json.dumps(doc, indent=3).encode()
