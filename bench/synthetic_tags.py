"""Synthetic tags over one shared base, written straight into a loopback registry's storage.

`docker build` of 1,000 images would take the bench an hour; a tag here is what such a build
and push would leave: the base image's layers, one small gzip layer of its own (a file under
the site folder), a config naming both (its history grown by one entry) and a manifest, written
as distribution writes a push (the blobs, the repository's links, the tag), as
tests/support/seed.py does for the fixture. The registry then serves them like pushed images.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

from tests.support.seed import Seeded, _blob, _link

SITE = "usr/local/lib/python3.11/dist-packages"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_blob(storage: Path, data: bytes) -> str:
    digest = _sha(data)
    path = _blob(storage, digest)
    if not path.exists():
        _write_bytes(path, data)
    return digest


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _layer(i: int) -> bytes:
    """A tar as a COPY of one file leaves it: the parent folders, then the file."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parts = f"{SITE}/vllm".split("/")
        for n in range(1, len(parts) + 1):
            info = tarfile.TarInfo("/".join(parts[:n]) + "/")
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
            tar.addfile(info)
        body = f"# bench edit {i}\n".encode()
        info = tarfile.TarInfo(f"{SITE}/vllm/bench_edit_{i}.py")
        info.size, info.mode, info.mtime = len(body), 0o644, 1_700_000_000
        tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def add_tags(storage: Path, base: Seeded, repository: str, count: int, *, prefix: str = "s") -> list[str]:
    """`count` tags `prefix0`… of `repository`, each `base` plus a one-file layer; returns the tags."""
    manifest = json.loads(_blob(storage, base.manifest).read_bytes())
    config = json.loads(_blob(storage, manifest["config"]["digest"]).read_bytes())
    layer_type = manifest["layers"][-1]["mediaType"]
    tags = []
    for i in range(count):
        tar = _layer(i)
        packed = gzip.compress(tar, mtime=0)
        layer = _put_blob(storage, packed)
        mine = json.loads(json.dumps(config))
        mine["rootfs"]["diff_ids"].append(_sha(tar))
        mine.setdefault("history", []).append({"created_by": f"COPY f /{SITE}/vllm/bench_edit_{i}.py"})
        config_body = json.dumps(mine).encode()
        config_digest = _put_blob(storage, config_body)
        doc = json.loads(json.dumps(manifest))
        doc["config"].update(digest=config_digest, size=len(config_body))
        doc["layers"].append({"mediaType": layer_type, "size": len(packed), "digest": layer})
        body = json.dumps(doc, indent=3).encode()
        digest = _put_blob(storage, body)
        tag = f"{prefix}{i}"
        _link(storage, repository, tag, Seeded(digest, (config_digest, *base.blobs[1:], layer)))
        tags.append(tag)
    return tags


__all__ = ["add_tags"]
