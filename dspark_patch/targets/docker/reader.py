"""A read-only view of an image: its files, read through the engine, without running anything.

`ImageReader` creates one container from the image and never starts it (no entrypoint, no
code of the image runs, so a foreign platform needs no emulation and an image without Python
can be read), with networking off and a name of our scheme (`gc` knows it). It is removed on
every path. Nothing else changes on the engine: no image, no tag, no container is left.

Design, from measurements on the ~2 GB fixture (vLLM 877 MB + torch 754 MB in one site
folder), on a loaded 2-core machine (`bench/status_fleet.py` prints the current figures):
- Finding the site folder: `HEAD /containers/ID/archive` returns only the path-stat header,
  a few ms per path. The site folder is the one the image's interpreters import from
  (targets/sitepath.py: the interpreters `apply` finds, their sys.path derived from prefix and
  version), the same rule as the layer route; the old sweep of the usual prefixes over
  python3.6 … 3.14 only names a copy that no interpreter imports.
- Reading: the archive API cannot list a folder without sending all of it, and the check
  needs (a) every byte of the distribution's own folders (RECORD integrity) and (b) the
  site folder's top-level names and every distribution's RECORD (unlisted `.pth` files).
  One tar stream of the site folder, parsed as it arrives by the strict layer reader, hashing
  only the distribution's members and keeping only top-level names and RECORDs, serves both
  in one round trip. Streaming the vLLM folder alone costs about half (it is half the bytes),
  but then (b) would need the same full stream again.
- Many images: the work is the engine producing tar and us hashing it; images with the same
  id are read once, the rest concurrently (`status.fleet`).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import posixpath
import queue
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, BinaryIO

import docker.errors
import requests.exceptions

from ...distname import filename_name
from ...errors import (
    DsparkPatchError,
    EnvironmentProblem,
    HostileLayer,
    TargetNotFound,
    UnreadableLayout,
    runs_first_message,
)
from ...references.installer import SCRIPT_CAP
from .. import imageconfig, interpreter
from ..layerfs import folder_view, merge_scans, pth_in, site_files, status_keep
from ..layers import LayerScan, LayerView, TarStream, scan_layer
from ..layers.cache import ScanCache
from ..layers.tarstream import BLOCK
from ..runtime import runs_first
from ..sitefiles import SiteFiles
from ..sitepath import choose_site, interpreter_sites

# Our container naming is shared with `gc`; the lead moves these into targets/docker/ at merge.
from .client import DockerEngine
from .client import reason as _reason
from .naming import container_name as _container_name
from .signals import terminate_raises

# Never started; only named so an accidental start fails fast instead of running the image.
NEVER_STARTED = ["/dspark-patch-status-never-starts"]


class ChunkReader(io.RawIOBase):
    """A file object over the engine's response chunks, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


class ImageReader:
    """Use as a context manager; `read_site(distribution)` returns a `SiteFiles`."""

    def __init__(self, ref: str, *, engine: DockerEngine, platform: str | None = None, image_id: str | None = None) -> None:
        self.ref = ref
        self._wanted = image_id or ref  # an id pins exactly the image a fleet run grouped tags by
        self.platform = platform
        self._engine = engine
        self._api = engine.client.api
        self._container: str | None = None
        self._name: str | None = None     # set before the create: what to remove if its answer is lost
        self._term = terminate_raises()
        self.image_id: str | None = None
        self.image_platform: str | None = None
        self._config: dict[str, Any] = {}

    def __enter__(self) -> ImageReader:
        info = self._engine.image_info(self._wanted)
        self.image_id, self._config = info.id, info.config
        self.image_platform = info.platform
        # As a work container's (container.py): the name is made first and the removal is by
        # name, on every way out of the entry too, so a SIGTERM wherever it lands (the main
        # thread; a fleet's readers are swept by `DockerEngine.removed_on_term`) leaves none.
        self._term.__enter__()
        self._name = _container_name("status")
        try:
            try:
                created = self._api.create_container(
                    info.id, entrypoint=NEVER_STARTED, command=[], name=self._name,
                    network_disabled=True, host_config=self._api.create_host_config(network_mode="none"),
                    platform=self.platform,
                )
            except docker.errors.APIError as exc:
                raise EnvironmentProblem(f"could not create a container from image {self.ref}: {_reason(exc)}") from exc
            self._container = created["Id"]
            return self
        except BaseException:
            self._leave(quiet=True)
            raise

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self, *, quiet: bool = False) -> None:
        """Remove the container by its name (held or not; gone already is fine), then give
        SIGTERM back. `quiet`: the error that ended the entry says more than the removal's."""
        try:
            if self._name is not None:
                with self._term.deferred():  # a SIGTERM now would leave it: the removal finishes first
                    try:
                        self._api.remove_container(self._name, force=True, v=True)
                    except docker.errors.NotFound:
                        pass
                    except Exception:
                        if not quiet:
                            raise
                    self._name, self._container = None, None
        finally:
            self._term.__exit__(None, None, None)

    # --- the archive API --------------------------------------------------------------------
    def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's path-stat of `path` in the image (name, size, mode, linkTarget), or None."""
        assert self._container
        url = _engine_url(self._api, f"/containers/{self._container}/archive")
        try:
            response = self._api.head(url, params={"path": path})
        except requests.exceptions.RequestException as exc:
            raise EnvironmentProblem(f"reading image {self.ref} failed: {exc}") from exc
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise EnvironmentProblem(f"reading {path} in image {self.ref} failed: HTTP {response.status_code}")
        header = response.headers.get("X-Docker-Container-Path-Stat")
        if not header:
            return None
        return json.loads(base64.b64decode(header))

    def is_dir(self, path: str) -> bool:
        found = self.stat(path)
        return imageconfig.is_dir(found)

    def _chunks(self, path: str) -> BinaryIO:
        assert self._container
        try:
            chunks, _ = self._api.get_archive(self._container, path, chunk_size=1 << 20)
        except docker.errors.NotFound:
            raise TargetNotFound(f"{path} vanished from image {self.ref}") from None
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"reading {path} in image {self.ref} failed: {_reason(exc)}") from exc
        return io.BufferedReader(ChunkReader(chunks), 1 << 20)

    def read_small(self, path: str, limit: int = 1 << 16) -> bytes | None:
        """A small regular file's bytes (pyvenv.cfg, a script's `#!` line), None otherwise."""
        if not interpreter.is_small_file(self.stat(path), limit):
            return None
        stream = TarStream(self._chunks(path), where=f"the engine's tar of {path} in image {self.ref}")
        for member in stream:
            return stream.read_all(limit) if member.kind == "file" else None
        return None

    # --- locating ----------------------------------------------------------------------------
    def site_candidates(self) -> list[str]:
        """Every site folder at the usual places (only to name a copy no interpreter imports)."""
        return imageconfig.site_candidates(self._config, self.is_dir)

    def read_site(self, distribution: str, *, keep: Iterable[str] = ()) -> SiteFiles:
        """The site folder the image's interpreters import `distribution` from (targets/sitepath.py,
        the same rule as the layer route), read through the engine without running anything."""
        top = filename_name(distribution)

        def read_head(path: str) -> bytes | None:
            data = self.read_small(path)
            return data[:512] if data is not None else None

        def holds(site: str) -> bool:
            found = self.stat(f"{site}/{top}")
            if imageconfig.is_link(found):
                raise UnreadableLayout(f"{site}/{top} in image {self.ref} is a symlink: status reads no files through "
                                       f"links in {distribution}'s folders", hint="nothing is said about this image")
            return self.stat(f"{site}/{top}/__init__.py") is not None

        def everywhere() -> list[str]:
            return [s for s in self.site_candidates() if self.stat(f"{s}/{top}/__init__.py") is not None]

        paths = interpreter_sites(self._config, self.stat, read_head, self.read_small)
        chosen, site = choose_site(self.ref, distribution, paths, holds, everywhere)
        found = self._read(site, distribution, keep)
        first = runs_first(self._config, self.stat, self.read_small, site=site, python=found.python or chosen.python,
                           distribution=distribution, sites=chosen.sites,
                           pth_files=lambda folder: self._pth_files(folder, distribution))
        if first:
            raise runs_first_message(self.ref, distribution, first)
        others = tuple(s for s in everywhere() if s != site)
        return replace(found, python=found.python or chosen.python, unimported=others)

    def _read(self, site: str, distribution: str, keep: Iterable[str] = ()) -> SiteFiles:
        # A site folder reached through a link is read where the link leads (dockerd's stat gives
        # the target resolved in the container); the archive's names start with the folder's name.
        stat = self.stat(site) or {}
        real = str(stat.get("linkTarget") or site) if imageconfig.is_link(stat) else site
        view = folder_view(self._chunks(real), folder=real, distribution=distribution,
                           where=f"the engine's tar of {real} in image {self.ref}", keep=keep)
        found = site_files(view, distribution, real)
        if found is None:
            raise TargetNotFound(f"{site}/{filename_name(distribution)} in image {self.ref} has no {distribution} dist-info "
                                 "(METADATA, RECORD)",
                                 hint="the package was not installed as a distribution; nothing to check it against")
        # The folder's tar holds no console script outside it: each is read through the engine.
        scripts = {row: self._script(posixpath.normpath(posixpath.join(real, row))) for row in found.scripts}
        return replace(found, location=site, scripts=scripts)

    def _pth_files(self, folder: str, distribution: str) -> dict[str, bytes | None] | None:
        """The `.pth` files right in another site folder (targets/runtime.py `pth_first`), from
        the engine's tar of that folder, read by the strict reader as the site folder is."""
        stat = self.stat(folder)
        if stat is None:
            return None
        real = str(stat.get("linkTarget") or folder) if imageconfig.is_link(stat) else folder
        if not imageconfig.is_dir(self.stat(real)):
            return None
        view = folder_view(self._chunks(real), folder=real, distribution=distribution,
                           where=f"the engine's tar of {real} in image {self.ref}")
        return pth_in(view, real)

    def _script(self, path: str) -> bytes | str | None:
        """A console script as the engine's path-stat and archive give it (references.ScriptBytes)."""
        found = self.stat(path)
        if found is None:
            return None
        if imageconfig.is_link(found):
            return "a symlink"
        if int(found.get("mode", 0)) & imageconfig.GO_TYPE:
            return "not a regular file"
        if int(found.get("size", 0)) > SCRIPT_CAP:
            return f"over {SCRIPT_CAP} bytes"
        data = self.read_small(path, SCRIPT_CAP)
        return data if data is not None else "not read"


def _engine_url(api: docker.APIClient, path: str) -> str:
    # docker-py's APIClient is a requests.Session whose adapters speak to the engine (unix socket,
    # TCP or SSH); it has no public call for HEAD of the archive endpoint (a path's stat without
    # its contents) or for saving several images in one stream, so those two requests are built
    # from its public attributes and sent with the Session's own public methods.
    return f"{api.base_url}/v{api.api_version}{path}"


def save_views(engine: DockerEngine, image_ids: Sequence[str], distribution: str,
               keep: Iterable[str] = (), cache: ScanCache | None = None, *,
               stop: threading.Event | None = None) -> dict[str, LayerView | DsparkPatchError]:
    """Every image's merged view from ONE `docker save` of all of them (shared layers come once).

    Nothing is created on the engine. Layers are scanned as they stream past (their order in
    the archive is the engine's) by the strict layer reader; manifest.json says which layers,
    bottom first, make which image. A layer the reader refuses is an error for the images that
    use it (naming the layer and member), never for the others."""
    api = engine.client.api
    try:
        # docker-py saves one image per call; the engine's endpoint takes many names at once.
        response = api.get(_engine_url(api, "/images/get"), params={"names": list(image_ids)}, stream=True)
    except requests.exceptions.RequestException as exc:
        raise EnvironmentProblem(f"reading the images' layers failed: {exc}") from exc
    if response.status_code >= 400:
        raise EnvironmentProblem(f"reading the images' layers failed: HTTP {response.status_code} {response.text.strip()[:200]}")
    try:
        chunks = response.iter_content(1 << 20)
        stream = io.BufferedReader(ChunkReader(chunks if stop is None else _until(stop, chunks)), 1 << 20)
        return views_from_save(stream, image_ids, distribution, keep, cache=cache)
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
                    keep_paths: Iterable[str] = (), *, cache: ScanCache | None = None,
                    ) -> dict[str, LayerView | DsparkPatchError]:
    """The views of `image_ids` from a `docker save` archive (pure: no engine).

    `cache`: each layer's scan is stored under the sha256 of the tar it scanned (its diff_id,
    hashed here, so what is stored is what was read); a layer whose archive name is its digest
    (the OCI layout's `blobs/sha256/…`) and that the cache holds is not scanned again."""
    keep = status_keep(distribution, keep_paths)
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
                scanned = scan_layer(buffered, where=where, keep=keep)
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
