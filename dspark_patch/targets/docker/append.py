"""One layer appended to an image, with the image's config kept: built, not committed.

Like go-containerregistry's `mutate.AppendLayers`, the new image is written out rather than
taken from a container: its config is the source's config (as the engine reports it) with our
labels added, its layers are the source's plus one tar we made, and it reaches the engine as a
`docker load` archive. Nothing runs, no container is committed, so no engine can add anything
to the layer (Podman writes /etc/hosts and friends into containers) or to the config (a Podman
commit ignores the config it is given and adds its own Env).

The archive holds only the new layer's bytes: the source's layers are already on the engine,
which reuses them by digest (dockerd does not open them; Podman's loader needs a file per
layer and is given an empty one, never read, since a layer it does not hold could not match
its digest and the load would fail, not go wrong).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Mapping
from typing import Any

from .client import DockerEngine, ImageInfo

HISTORY_NOTE = "dspark-patch: the patched files, their bytecode and their folders"


def append_layer(engine: DockerEngine, source: ImageInfo, layer: bytes, config: Mapping[str, Any]) -> str:
    """Load `source` + `layer` with image config `config`; returns the new image's id."""
    blob = json.dumps(image_config(engine, source, layer, config), sort_keys=True, separators=(",", ":")).encode()
    config_hex = hashlib.sha256(blob).hexdigest()
    lower = [f"{diff_id.split(':', 1)[1]}/layer.tar" for diff_id in source.diff_ids]
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": None, "Layers": [*lower, "new/layer.tar"]}]
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:") as tar:
        _add(tar, f"{config_hex}.json", blob)
        for name in lower:
            _add(tar, name, b"")
        _add(tar, "new/layer.tar", layer)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    engine.load(archive.getvalue())
    return f"sha256:{config_hex}"


def image_config(engine: DockerEngine, source: ImageInfo, layer: bytes, config: Mapping[str, Any]) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    platform = {k: v for k, v in (("architecture", source.architecture), ("os", source.os),
                                  ("variant", source.variant)) if v}
    history = _history(engine, source)
    doc: dict[str, Any] = {
        **platform,
        "created": now,
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [*source.diff_ids, "sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    if history is not None:
        doc["history"] = [*history, {"created": now, "created_by": HISTORY_NOTE, "comment": "dspark-patch"}]
    return doc


def _history(engine: DockerEngine, source: ImageInfo) -> list[dict[str, Any]] | None:
    """The source's history in config form, or None when it cannot be told which entries made a
    layer (the engine's history call reports sizes, not the `empty_layer` flag): an image config
    without history is valid, one whose history disagrees with its layers is not."""
    rows = list(reversed(engine.history(source.id)))
    for empty in (lambda r: not r.get("Size"), lambda r: "#(nop)" in (r.get("CreatedBy") or "")):
        if sum(1 for r in rows if not empty(r)) == len(source.diff_ids):
            return [_entry(r, empty(r)) for r in rows]
    return None


def _entry(row: Mapping[str, Any], empty: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"created_by": row.get("CreatedBy") or ""}
    # `created` is optional (OCI image spec, config.md); the engine reports a missing one as Go's
    # zero time, -62135596800 s, which must not become a date: `1-01-01T00:00:00Z` is no RFC 3339
    # time and the engine refuses to load a config holding it. Unknown stays absent.
    created = row.get("Created")
    if isinstance(created, int) and created > 0:
        entry["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    if row.get("Comment"):
        entry["comment"] = row["Comment"]
    if empty:
        entry["empty_layer"] = True
    return entry


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    tar.addfile(member, io.BytesIO(data))
