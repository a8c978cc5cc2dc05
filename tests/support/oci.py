"""An image as a registry serves it (manifest, config, gzip layer blobs), for `fake_registry`:
the bytes a push would leave, so the registry route can be fed faults a real registry refuses
to store (a blob that does not match its digest, an endless layer, a decompression bomb)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .hostile import diff_id, image_config

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def served_image(layers: Sequence[bytes], *, config: Mapping[str, Any] | None = None, repo: str = "test/img",
                 tag: str | None = "v1", platform: tuple[str, str] = ("linux", "amd64"),
                 blobs: Mapping[str, bytes] | None = None, manifest_extra: Mapping[str, Any] | None = None,
                 ) -> tuple[dict[str, Any], bytes]:
    """(what `fake_registry` serves, the manifest's bytes). `blobs`: a blob digest -> the bytes
    served for it instead (a fault); the manifest still names the honest digest and size."""
    doc = image_config([diff_id(layer) for layer in layers], config=config)
    doc["os"], doc["architecture"] = platform
    config_blob = json.dumps(doc, sort_keys=True).encode()
    compressed = [gzip.compress(layer, mtime=0) for layer in layers]
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": digest(config_blob), "size": len(config_blob)},
                "layers": [{"mediaType": GZIP_LAYER, "digest": digest(b), "size": len(b)} for b in compressed],
                **(manifest_extra or {})}
    body = json.dumps(manifest).encode()
    served: dict[str, Any] = {f"{repo}/blobs/{digest(b)}": ("application/octet-stream", b)
                              for b in (config_blob, *compressed)}
    for name, data in (blobs or {}).items():
        served[f"{repo}/blobs/{name}"] = ("application/octet-stream", data)
    served[f"{repo}/manifests/{digest(body)}"] = (OCI_MANIFEST, body)
    if tag is not None:
        served[f"{repo}/manifests/{tag}"] = (OCI_MANIFEST, body)
    return served, body
