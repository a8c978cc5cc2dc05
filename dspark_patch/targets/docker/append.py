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

import copy
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Mapping
from typing import Any

from ...errors import StackedLayer
from ...registry.compose import HISTORY_NOTE
from .client import DockerEngine, ImageInfo


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


def load_under_top(engine: DockerEngine, source: ImageInfo, *, label_prefix: str) -> tuple[str, bool]:
    """The image under `source`'s last layer, loaded: its layers but the last, its config with
    the labels under `label_prefix` taken out, its history without the last entry that made a
    layer. The layers are on the engine already (as for append_layer). Returns its id, and
    whether the engine had that very image already (then nothing was loaded: it is not ours to
    remove).

    Only for an image whose last layer is one of ours (the caller checks that layer's content):
    its config is then the image's under it plus our labels, so this is that image's config."""
    if not source.diff_ids:
        raise ValueError("an image without layers has no layer of ours on top")
    config = copy.deepcopy(dict(source.config))
    labels = {k: v for k, v in (config.get("Labels") or {}).items() if not k.startswith(label_prefix)}
    config["Labels"] = labels or None
    platform = {k: v for k, v in (("architecture", source.architecture), ("os", source.os),
                                  ("variant", source.variant)) if v}
    lower = source.diff_ids[:-1]
    doc: dict[str, Any] = {**platform, "config": config, "rootfs": {"type": "layers", "diff_ids": list(lower)}}
    history = _history(engine, source)
    if history is not None:
        last = max(i for i, entry in enumerate(history) if not entry.get("empty_layer"))
        if history[last].get("created_by") != HISTORY_NOTE:
            raise StackedLayer(
                f"the last layer of {source.id[:19]} was not made by dspark-patch, by its history "
                f"({str(history[last].get('created_by'))[:80]!r}), though its labels say so",
                hint="apply to the image the dspark-patch layer was put on; a layer on top of ours is never removed")
        doc["history"] = history[:last] + history[last + 1:]
        made = [entry.get("created") for entry in doc["history"] if entry.get("created")]
        if made:
            doc["created"] = made[-1]   # the image under ours was made when its last entry was
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    config_hex = hashlib.sha256(blob).hexdigest()
    if engine.tag_exists(f"sha256:{config_hex}"):
        return f"sha256:{config_hex}", True
    names = [f"{diff_id.split(':', 1)[1]}/layer.tar" for diff_id in lower]
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": None, "Layers": names}]
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:") as tar:
        _add(tar, f"{config_hex}.json", blob)
        for name in names:
            _add(tar, name, b"")
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    engine.load(archive.getvalue())
    return f"sha256:{config_hex}", False
