"""An image's config and layers as a registry serves them, read strictly and checked by digest.

The manifest and the config are hostile input like an index (manifest.py): an image manifest
names one config and at most `MAX_LAYERS` layers, each a descriptor with a `sha256:` digest, a
size and a known media type; the config's `rootfs.diff_ids` names one uncompressed digest per
layer. Anything else is one `BadManifest` line.

A layer is streamed, never stored (`open_layer`): the blob's bytes are counted against the
descriptor's size (one byte more is refused: an endless layer) and hashed against its digest;
the uncompressed stream is counted against `uncompressed_cap` (a decompression bomb) and hashed
against the diff_id. `LayerStream.finish()` reads what is left and checks both digests: until it
returns, nothing read from the layer may be trusted, so a mismatch makes the image's row an
error and its scan is neither used nor cached.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import requests

from ..errors import HostileLayer
from .index import Registry, RegistryRefused, RegistryUnreachable
from .manifest import DIGEST, BadManifest, Manifest, load_object

# overlayfs stacks at most 128 lower folders (Docker refuses more than 125 layers); 1000 leaves
# room for other stores and refuses a manifest of a million layers at once.
MAX_LAYERS = 1000
MAX_LAYER_BYTES = 1 << 40
CONFIG_TYPES = frozenset({"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"})
PLAIN = frozenset({"application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar"})
GZIP = frozenset({"application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip"})
# A real layer compresses a few times, rarely 100×; zeros compress about 1000×.
BOMB_RATIO = 256
BOMB_SLACK = 256 << 20


@dataclass(frozen=True, kw_only=True)
class Blob:
    digest: str
    size: int
    media_type: str


@dataclass(frozen=True, kw_only=True)
class ImageConfig:
    digest: str                    # the image id an engine gives it
    platform: str                  # "linux/amd64"
    diff_ids: tuple[str, ...]
    config: Mapping[str, Any]      # Env, Entrypoint, Cmd... (what an engine's inspect calls Config)


def parse_image_manifest(manifest: Manifest) -> tuple[Blob, tuple[Blob, ...]]:
    where = manifest.reference
    document = manifest.document()
    config = _blob(document.get("config"), f"{where}: config")
    if config.media_type not in CONFIG_TYPES:
        raise BadManifest(f"{where}: its config is {config.media_type}, not an image config",
                          hint="status reads container images only")
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise BadManifest(f"{where}: its `layers` is not a list")
    if len(layers) > MAX_LAYERS:
        raise BadManifest(f"{where} lists {len(layers)} layers, more than the {MAX_LAYERS} this tool reads",
                          hint="no engine runs an image of so many layers; check what was pushed")
    return config, tuple(_blob(raw, f"{where}: layers[{n}]") for n, raw in enumerate(layers))


def _blob(raw: object, where: str) -> Blob:
    if not isinstance(raw, dict):
        raise BadManifest(f"{where} is not a descriptor object")
    digest, size, media_type = raw.get("digest"), raw.get("size"), raw.get("mediaType")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise BadManifest(f"{where} has no sha256 digest", hint="a descriptor's digest is sha256: and 64 hex digits")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_LAYER_BYTES:
        raise BadManifest(f"{where} ({digest}) has size {size!r}, not a byte count up to 1 TiB")
    if not isinstance(media_type, str):
        raise BadManifest(f"{where} ({digest}) has no media type")
    return Blob(digest=digest, size=size, media_type=media_type)


def read_config(registry: Registry, reference: str, blob: Blob, layers: int) -> ImageConfig:
    body = registry.fetch_blob(reference, blob.digest)
    where = f"the config {blob.digest} of {reference}"
    document = load_object(body, where)
    rootfs = document.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) and DIGEST.fullmatch(d) for d in diff_ids):
        raise BadManifest(f"{where} has no list of sha256 diff_ids", hint="check what was pushed under that name")
    if len(diff_ids) != layers:
        raise BadManifest(f"{where} names {len(diff_ids)} layer digests for the manifest's {layers} layers",
                          hint="an engine would refuse this image; check what was pushed")
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise BadManifest(f"{where}: its `config` is not an object")
    parts = [document.get("os") or "linux", document.get("architecture") or "", document.get("variant") or ""]
    if not all(isinstance(p, str) for p in parts):
        raise BadManifest(f"{where}: os, architecture or variant is not a string")
    return ImageConfig(digest=blob.digest, platform="/".join(p for p in parts if p), diff_ids=tuple(diff_ids),
                       config=json.loads(json.dumps(config)))


class _Counted(io.RawIOBase):
    """Chunks as a file object, counted against `cap` and hashed."""

    def __init__(self, chunks: Iterator[bytes], *, cap: int, over: str, where: str) -> None:
        self._chunks = chunks
        self._buffer = b""
        self.total = 0
        self.sha256 = hashlib.sha256()
        self._cap, self._over, self._where = cap, over, where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._buffer:
            chunk = next(self._chunks, b"")
            if not chunk:
                return 0
            self.total += len(chunk)
            if self.total > self._cap:
                raise HostileLayer(f"{self._where}: {self._over}", hint="nothing is said about this image")
            self.sha256.update(chunk)
            self._buffer = chunk
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def drain(self) -> None:
        while self.readinto(bytearray(1 << 20)):
            pass


class LayerStream:
    """The uncompressed tar of one layer (`fileobj`); `finish()` checks it against both digests."""

    def __init__(self, answer: requests.Response, blob: Blob, diff_id: str, where: str) -> None:
        self._answer = answer
        self.blob, self.diff_id, self.where = blob, diff_id, where
        self.raw = _Counted(answer.iter_content(1 << 20), cap=blob.size, where=where,
                            over=f"the registry sends more than the {blob.size} bytes its manifest says")
        check_media_type(blob, where)
        if blob.media_type in GZIP:
            inner: Any = gzip.GzipFile(fileobj=io.BufferedReader(self.raw, 1 << 20), mode="rb")
            cap = min(MAX_LAYER_BYTES, blob.size * BOMB_RATIO + BOMB_SLACK)
        else:
            inner, cap = io.BufferedReader(self.raw, 1 << 20), blob.size
        self.plain = _Counted(_chunked(inner, where), cap=cap, where=where,
                              over=f"it unpacks to more than {cap} bytes (a decompression bomb?)")
        self.fileobj = io.BufferedReader(self.plain, 1 << 20)

    def check_blob(self) -> None:
        """Read the rest of the blob and check its size and digest (a corrupt blob is named as
        such, before whatever its corruption made the tar reader say)."""
        try:
            self.raw.drain()
        except requests.RequestException as exc:
            raise RegistryUnreachable(f"{self.where}: the registry broke off ({type(exc).__name__})") from None
        compressed = "sha256:" + self.raw.sha256.hexdigest()
        if self.raw.total != self.blob.size or compressed != self.blob.digest:
            raise RegistryRefused(f"{self.where}: the registry sent {self.raw.total} bytes with digest {compressed}, "
                                  f"not the {self.blob.size} bytes of {self.blob.digest}",
                                  hint="the registry's copy is corrupt or was changed; nothing is said about this image")

    def finish(self) -> None:
        """Read the rest and check the sizes and digests; raises on any mismatch."""
        try:
            self.plain.drain()
        except (HostileLayer, OSError, EOFError, zlib.error) as exc:
            self.check_blob()
            if isinstance(exc, HostileLayer):
                raise
            raise HostileLayer(f"{self.where}: cannot be decompressed ({exc})") from None
        except requests.RequestException as exc:
            raise RegistryUnreachable(f"{self.where}: the registry broke off ({type(exc).__name__})") from None
        self.check_blob()
        uncompressed = "sha256:" + self.plain.sha256.hexdigest()
        if uncompressed != self.diff_id:
            raise RegistryRefused(f"{self.where}: it unpacks to {uncompressed}, not the config's diff_id {self.diff_id}",
                                  hint="the image's config and its layer disagree; nothing is said about this image")

    def close(self) -> None:
        self._answer.close()


def _chunked(fh: Any, where: str) -> Iterator[bytes]:
    try:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                return
            yield chunk
    except (OSError, EOFError, zlib.error) as exc:
        raise HostileLayer(f"{where}: cannot be decompressed ({exc})") from None
    except requests.RequestException as exc:
        raise RegistryUnreachable(f"the registry broke off a layer ({type(exc).__name__})") from None


def check_media_type(blob: Blob, where: str) -> None:
    if blob.media_type in PLAIN | GZIP:
        return
    if "zstd" in blob.media_type:
        raise HostileLayer(f"{where} is zstd-compressed ({blob.media_type}), which this tool does not read yet",
                           hint="read the image through an engine (--via layers) or push it with gzip layers")
    raise BadManifest(f"{where} has media type {blob.media_type}, not a layer this tool reads "
                      "(a foreign or non-distributable layer is not in the registry)")


def open_layer(registry: Registry, reference: str, blob: Blob, diff_id: str) -> LayerStream:
    """Refused before any byte is fetched when the media type is not a layer this tool reads."""
    where = f"layer {diff_id} (blob {blob.digest}) of {reference}"
    check_media_type(blob, where)
    answer = registry.open_blob(reference, blob.digest)
    try:
        return LayerStream(answer, blob, diff_id, where)
    except BaseException:
        answer.close()
        raise
