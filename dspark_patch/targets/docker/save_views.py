"""The layers of images from one `docker save` stream, read as they arrive: `save_views` asks the
engine for the archive, `views_from_save` (pure: no engine) scans each layer with the strict
layer reader, hashing it for its diff_id, and merges each image's layers into its view.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import posixpath
import queue
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import requests.exceptions

from ...errors import DsparkPatchError, EnvironmentProblem, HostileLayer
from ..caches.scans import ScanCache
from ..layers import LayerScan, LayerView, TarStream, scan_layer
from ..layers.tarstream import BLOCK
from ..views.from_layers import merge_scans, status_retain
from .client import DockerEngine
from .reader import ChunkReader, engine_url


def save_views(engine: DockerEngine, image_ids: Sequence[str], distribution: str,
               retain: Iterable[str] = (), cache: ScanCache | None = None, *,
               stop: threading.Event | None = None) -> dict[str, LayerView | DsparkPatchError]:
    """Every image's merged view from ONE `docker save` of all of them (shared layers come once).

    Nothing is created on the engine. Layers are scanned as they stream past (their order in
    the archive is the engine's) by the strict layer reader; manifest.json says which layers,
    bottom first, make which image. A layer the reader refuses is an error for the images that
    use it (naming the layer and member), never for the others."""
    api = engine.client.api
    try:
        # docker-py saves one image per call; the engine's endpoint takes many names at once.
        response = api.get(engine_url(api, "/images/get"), params={"names": list(image_ids)}, stream=True)
    except requests.exceptions.RequestException as exc:
        raise EnvironmentProblem(f"reading the images' layers failed: {exc}") from exc
    if response.status_code >= 400:
        raise EnvironmentProblem(f"reading the images' layers failed: HTTP {response.status_code} {response.text.strip()[:200]}")
    try:
        chunks = response.iter_content(1 << 20)
        stream = io.BufferedReader(ChunkReader(chunks if stop is None else _until(stop, chunks)), 1 << 20)
        return views_from_save(stream, image_ids, distribution, retain, cache=cache)
    except requests.exceptions.RequestException as exc:
        raise EnvironmentProblem(f"reading the images' layers failed: {exc}") from exc
    finally:
        response.close()


def _until(stop: threading.Event, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks, ended by an error as soon as `stop` is set (a caller that no longer needs them)."""
    for chunk in chunks:
        if stop.is_set():
            raise EnvironmentProblem("reading the images' layers was stopped")
        yield chunk


def save_layer_where(digest: str) -> str:
    """How a layer of the engine's save is named in its scan (and so in what a check says of it)."""
    return f"layer {digest} of the engine's save"


def views_from_save(stream: BinaryIO, image_ids: Sequence[str], distribution: str,
                    retain_paths: Iterable[str] = (), *, cache: ScanCache | None = None,
                    ) -> dict[str, LayerView | DsparkPatchError]:
    """The views of `image_ids` from a `docker save` archive (pure: no engine).

    `cache`: each layer's scan is stored under the sha256 of the tar it scanned (its diff_id,
    hashed here, so what is stored is what was read); a layer whose archive name is its digest
    (the OCI layout's `blobs/sha256/…`) and that the cache holds is not scanned again."""
    retain = status_retain(distribution, retain_paths)
    layers: dict[str, LayerScan | DsparkPatchError] = {}
    # A layer the archive already holds under another folder is written as a symlink to it
    # (dockerd does this when a layer is the top of one image and a lower layer of another).
    aliases: dict[str, str] = {}
    manifest: list[dict[str, Any]] = []
    try:
        outer = TarStream(stream, where="the engine's save archive")
        for member in outer:
            if member.kind == "symlink":
                aliases[member.name] = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
                continue
            if member.kind != "file":
                continue
            if member.name == "manifest.json":
                manifest = json.loads(outer.read_all(64 << 20))
                continue
            named = _digest_of(member.name)
            if cache is not None and named.startswith("sha256:"):
                hit = cache.get(named)
                if hit is not None:
                    layers[member.name] = hit
                    continue
            data = _Member(outer)
            head = data.peek(BLOCK)
            compressed = head[:2] == b"\x1f\x8b"
            if compressed:
                source: BinaryIO = gzip.GzipFile(fileobj=io.BufferedReader(data, 1 << 20), mode="rb")  # type: ignore[assignment]
            elif len(head) >= BLOCK and _is_tar_header(head[:BLOCK]) or head[:BLOCK] == bytes(BLOCK):
                source = data  # type: ignore[assignment]
                data.unhashed()  # the tar is the member: its digest is the layer's, hashed once (plain)
            else:
                continue  # configs, OCI index and manifests (JSON)
            where = save_layer_where(_digest_of(member.name))
            plain = _Hashing(source)
            try:
                buffered = io.BufferedReader(plain, 1 << 20)  # held: closing it would close `plain`
                scanned = scan_layer(buffered, where=where, retain=retain)
                layers[member.name] = scanned
                digest = plain.drain()
                if cache is not None:
                    cache.put(digest, scanned)
            except HostileLayer as exc:
                # Name the layer by its digest (what `docker inspect` lists), known once all of it is read.
                digest = data.drain() if compressed else plain.drain()
                kind = "blob" if compressed else "layer"
                layers[member.name] = HostileLayer(exc.message.replace(where, f"{kind} {digest} of the image"),
                                                   hint=exc.hint)
            except (OSError, EOFError, zlib.error) as exc:
                layers[member.name] = HostileLayer(f"{where}: cannot be decompressed ({exc})")
            finally:
                plain.stop()  # its hashing thread ends
    except (HostileLayer, ValueError) as exc:
        raise EnvironmentProblem(f"reading the images' layers failed: {exc}") from exc
    for alias, target in aliases.items():
        if target in layers:
            layers[alias] = layers[target]
    views: dict[str, LayerView | DsparkPatchError] = {}
    for entry in manifest:
        config = posixpath.basename(entry.get("Config", "")).removesuffix(".json")
        image_id = next((i for i in image_ids if i.removeprefix("sha256:") == config), None)
        names = entry.get("Layers") or ()
        # An image whose layer is missing from the archive gets no view (its row says so)
        # rather than a view that silently lacks that layer's files.
        if image_id is None or not all(name in layers for name in names):
            continue
        refused = next((layers[n] for n in names if isinstance(layers[n], DsparkPatchError)), None)
        if isinstance(refused, DsparkPatchError):
            views[image_id] = refused
            continue
        try:
            scans = [scan for n in names if isinstance(scan := layers[n], LayerScan)]
            views[image_id] = merge_scans(scans, where=f"image {image_id[:19]}")
        except DsparkPatchError as exc:
            views[image_id] = exc
    return views


class _Hashing(io.RawIOBase):
    """A layer's tar as read, hashed: `drain()` reads the rest and gives its sha256 (the diff_id).

    The hashing runs on a thread of its own (hashlib lets go of the GIL), beside the tar's
    reading in the caller's: read it through a BufferedReader, so that it sees large reads."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._sha256 = hashlib.sha256()
        self._pending: queue.Queue[bytes | None] = queue.Queue(maxsize=32)  # at most 32 reads held
        self._thread = threading.Thread(target=self._hash, name="dspark-patch-layer-hash", daemon=True)
        self._thread.start()
        self._done = False

    def _hash(self) -> None:
        while (data := self._pending.get()) is not None:
            self._sha256.update(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        if data and not self._done:
            self._pending.put(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def stop(self) -> None:
        """End the hashing thread (after `drain`, or when the layer is given up)."""
        if not self._done:
            self._done = True
            self._pending.put(None)
            self._thread.join()

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        self.stop()
        return "sha256:" + self._sha256.hexdigest()


class _Member(io.RawIOBase):
    """The current member of a `TarStream` as a file object, with a peek at its start."""

    def __init__(self, stream: TarStream) -> None:
        self._chunks = self._hashed(stream.chunks())
        self._buffer = b""
        self._sha256 = hashlib.sha256()
        self._hashing = True

    def unhashed(self) -> None:
        """From now on the member is not hashed (its digest is taken by whoever reads it)."""
        self._hashing = False

    def _hashed(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if self._hashing:
                self._sha256.update(chunk)
            yield chunk

    def drain(self) -> str:
        """Read the rest; the digest of the whole member."""
        for _ in self._chunks:
            pass
        return "sha256:" + self._sha256.hexdigest()

    def peek(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = next(self._chunks, b"")
            if not chunk:
                break
            self._buffer += chunk
        return self._buffer[:n]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._buffer:
            self._buffer = next(self._chunks, b"")
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def _is_tar_header(block: bytes) -> bool:
    stored = block[148:156].strip(b" \0")
    try:
        value = int(stored, 8)
    except ValueError:
        return False
    return value == sum(block[:148]) + 256 + sum(block[156:])


def _digest_of(name: str) -> str:
    # blobs/sha256/HEX (OCI layout) or HEX/layer.tar (the older layout)
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "blobs":
        return f"{parts[1]}:{parts[2]}"
    return f"sha256:{parts[0]}" if len(parts) == 2 and parts[1] == "layer.tar" else name
