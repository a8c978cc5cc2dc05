"""`status --via registry`: images read straight from their registry, no engine.

For each reference: the manifest it names (an index: each of its platforms, or those
`--platform` selects), the config, then each layer streamed through the same strict layer
reader and merge as the save route (`targets/layers`, `targets/views/from_layers.status_retain`), and the
site folder found by the same rule (`targets/views/from_layers.find_site`, from the interpreters present,
without running anything). The rows are the engine routes' rows: same states, same lists.

Each layer is checked while it streams (registry/blobs.py: the blob against its digest and
size, the unpacked tar against the config's diff_id, both bounded); a mismatch, a missing blob
or a refused member makes that image's row an error. A layer is scanned once per run however
many images share it (a lock per diff_id), and its scan is kept in the scan cache
(targets/caches/scans.py) by diff_id, so the next run fetches no layer it has seen. Credentials:
Docker's config.json, as for every registry call (registry/index.py).

A fleet is read in two overlapping stages (`read_all`): the manifests and configs of all the
references side by side, as many at once as the pool has connections per registry
(registry/pool.py, `--registry-connections`), then each image's layers and row, `--jobs` at a
time (that stage is mostly CPU: merging scans, finding the site, assessing). Tags that name the
same image manifest are assessed once. The rows come back in the order the references were given,
whatever order the pool finished them in.
"""

from __future__ import annotations

import tarfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Literal

from ..errors import BadInput, DsparkPatchError, TargetNotFound
from ..patchset import PatchSet
from ..registry.blobs import ImageConfig, open_layer, parse_image_manifest, read_config
from ..registry.index import Registry, RegistryUnreachable, registry_host
from ..registry.manifest import Manifest, parse_index
from ..registry.platform_select import Platform, UnknownPlatform, select
from ..registry.pool import RegistryPool
from ..report.status_model import ImageStatus
from ..targets.caches.scans import ScanCache
from ..targets.layers import LayerScan, scan_layer
from ..targets.views.from_layers import find_site, merge_scans, status_retain

DISTRIBUTION = "vllm"
Event = Literal["start", "done"]
Lend = Callable[[], AbstractContextManager[Registry]]   # a client for one request, then given back


@dataclass
class LayerCounts:
    """What one run fetched: layer blobs and their bytes (the bench prints these)."""

    fetched: int = 0
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, size: int) -> None:
        with self.lock:
            self.fetched += 1
            self.bytes += size


class LayerReader:
    """Layers of images in registries, each scanned once per run (a lock per diff_id) and kept in
    the scan cache; one instance per run. `status --via registry` and `publish` read through it."""

    def __init__(self, *, retain, cache: ScanCache) -> None:
        self._retain = retain
        self.cache = cache
        self._registries: dict[tuple[int, str], Registry] = {}
        self._memo: dict[str, LayerScan | DsparkPatchError] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.counts = LayerCounts()

    def registry(self, host: str) -> Registry:
        key = (threading.get_ident(), host)  # one client (one session) per thread
        found = self._registries.get(key)
        if found is None:
            found = self._registries[key] = Registry(host)
        return found

    @staticmethod
    def config(registry: Registry, ref: str, manifest: Manifest) -> ImageConfig:
        """One image manifest's config, read strictly (registry/blobs.py)."""
        config_blob, layers = parse_image_manifest(manifest)
        return read_config(registry, ref, config_blob, len(layers))

    def scans(self, registry: Registry, ref: str, manifest: Manifest, config: ImageConfig) -> list[LayerScan]:
        """The scans of the image's layers, bottom up."""
        _, layers = parse_image_manifest(manifest)
        return [self.layer(registry, ref, blob, diff_id) for blob, diff_id in zip(layers, config.diff_ids, strict=True)]

    def layer(self, registry: Registry, ref: str, blob, diff_id: str) -> LayerScan:
        return self.layer_via(lambda: nullcontext(registry), ref, blob, diff_id)

    def layer_via(self, lend: Lend, ref: str, blob, diff_id: str) -> LayerScan:
        """The layer's scan; a client is borrowed (`lend`) only when the layer must be fetched."""
        with self._guard:
            lock = self._locks.setdefault(diff_id, threading.Lock())
        with lock:  # a layer shared by images read at once is fetched by one of them
            found = self._memo.get(diff_id)
            if found is None:
                found = self.cache.get(diff_id)
            if found is None:
                try:
                    with lend() as registry:
                        found = self._fetch(registry, ref, blob, diff_id)
                except DsparkPatchError as exc:
                    found = exc
            self._memo[diff_id] = found
        if isinstance(found, DsparkPatchError):
            raise found
        return found

    def _fetch(self, registry: Registry, ref: str, blob, diff_id: str) -> LayerScan:
        stream = open_layer(registry, ref, blob, diff_id)
        try:
            try:
                scan = scan_layer(stream.fileobj, where=stream.where, retain=self._retain)
            except DsparkPatchError:
                stream.check_blob()  # a corrupt blob is reported as one
                raise
            stream.finish()  # until here nothing of the layer is trusted
        finally:
            stream.close()
            self.counts.add(stream.raw.total)
        self.cache.put(diff_id, scan)
        return scan


@dataclass(frozen=True, kw_only=True)
class Found:
    """A reference's manifests and configs (the first stage): one entry per image to assess, its
    config or the error that reading it was. `single`: the reference named an image, not an index."""

    host: str
    images: tuple[tuple[Manifest, ImageConfig | DsparkPatchError], ...]
    single: bool


class RegistryReader:
    """Reads references from their registries; one instance per run (its layer memo is the run's)."""

    def __init__(self, *, patchsets: Sequence[PatchSet], retain_paths: frozenset[str], cache: ScanCache,
                 platform: str | None, row: Callable[..., ImageStatus], error_row: Callable[..., ImageStatus],
                 unreadable: Callable[[str, Exception], DsparkPatchError], connections: int = 8) -> None:
        self._patchsets = patchsets
        self.layers = LayerReader(retain=status_retain(DISTRIBUTION, retain_paths), cache=cache)
        self.cache = cache
        self.counts = self.layers.counts
        self.pool = RegistryPool(connections)
        self._platform = platform
        self._row, self._error_row, self._unreadable = row, error_row, unreadable
        # By image manifest digest: the tags of one image are read and assessed once.
        self._configs: dict[tuple[str, str], ImageConfig] = {}
        self._rows: dict[tuple[str, str, bool], ImageStatus] = {}
        self._locks: dict[tuple[str, ...], threading.Lock] = {}
        self._guard = threading.Lock()

    # --- one reference ---------------------------------------------------------------------------
    def read(self, ref: str, *, absent_ok: bool = False) -> tuple[ImageStatus, ...] | None:
        """The rows of `ref` (one per platform read). `absent_ok`: None when the registry does not
        answer or has no such image (the caller keeps its own row for it)."""
        found = self.find(ref, absent_ok=absent_ok)
        return found if not isinstance(found, Found) else self.assess(ref, found)

    def find(self, ref: str, *, absent_ok: bool = False) -> Found | tuple[ImageStatus, ...] | None:
        """The first stage: the manifest `ref` names, its platforms' manifests and their configs
        (network only); or the reference's rows already, when it cannot be read."""
        host = registry_host(ref)
        if host is None:
            if absent_ok:
                return None
            return (self._error_row(ref, BadInput(f"{ref} names no registry host, so --via registry cannot read it",
                                                  hint="write HOST[:PORT]/REPOSITORY:TAG")),)
        try:
            with self.pool.client(host) as registry:
                manifest = registry.fetch(ref)
        except (RegistryUnreachable, TargetNotFound) as exc:
            return None if absent_ok else (self._error_row(ref, exc),)
        except DsparkPatchError as exc:
            return (self._error_row(ref, exc),)
        try:
            images = self._platforms(host, manifest)
        except DsparkPatchError as exc:
            return (self._error_row(ref, exc),)
        return Found(host=host, images=tuple((image, self._config(host, ref, image)) for image in images),
                     single=not manifest.is_index)

    def assess(self, ref: str, found: Found) -> tuple[ImageStatus, ...]:
        """The second stage: each image's layers (fetched where no scan holds them) and its row."""
        return tuple(self._image(found.host, ref, image, config, single=found.single) for image, config in found.images)

    def _lend(self, host: str) -> Lend:
        return lambda: self.pool.client(host)

    def _platforms(self, host: str, manifest: Manifest) -> list[Manifest]:
        if not manifest.is_index:
            return [manifest]
        index = parse_index(manifest)
        # all platforms unless --platform names some (the engine's own platform plays no part here)
        chosen = select(index.platforms, self._platform or "all", Platform(os="linux", architecture="amd64"))
        out = []
        for p in chosen:
            with self.pool.client(host) as registry:
                out.append(registry.fetch_platform(index, p))
        return out

    def _config(self, host: str, ref: str, manifest: Manifest) -> ImageConfig | DsparkPatchError:
        """The image's config, read once per run for all the tags of one image (by manifest digest)."""
        with self._lock_of(("config", host, manifest.digest)):
            known = self._configs.get((host, manifest.digest))
            if known is not None:
                return known
            try:
                with self.pool.client(host) as registry:
                    found = self.layers.config(registry, ref, manifest)
            except DsparkPatchError as exc:
                return exc  # an error names the reference it was read as: each tag its own
            except (ValueError, LookupError, TypeError, UnicodeError) as exc:
                return self._unreadable(ref, exc)
            self._configs[(host, manifest.digest)] = found
            return found

    def _lock_of(self, key: tuple[str, ...]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _wanted(self, platform: str) -> bool:
        if self._platform is None or self._platform.strip() == "all":
            return True
        found = Platform.parse(platform)
        return any(found.matches(Platform.parse(p)) for p in self._platform.split(",") if p.strip())

    def _image(self, host: str, ref: str, manifest: Manifest, config: ImageConfig | DsparkPatchError, *,
               single: bool) -> ImageStatus:
        if isinstance(config, DsparkPatchError):
            return self._error_row(ref, config)
        key = (host, manifest.digest, single)
        with self._lock_of(("row", host, manifest.digest, str(single))):  # tags of one image: assessed once
            known = self._rows.get(key)
            if known is not None:
                return replace(known, ref=ref)
            row = self._assess_image(host, ref, manifest, config, single=single)
            if row.error is None:  # an error names the reference it was read as: each tag its own
                self._rows[key] = row
            return row

    def _assess_image(self, host: str, ref: str, manifest: Manifest, config: ImageConfig, *, single: bool) -> ImageStatus:
        extra: dict[str, str | None] = {"id": config.digest, "platform": config.platform}
        try:
            if single and not self._wanted(config.platform):
                raise UnknownPlatform(f"{ref} is a {config.platform} image, not {self._platform}",
                                      hint="choose its platform with --platform, or leave --platform out")
            _, layers = parse_image_manifest(manifest)
            lend = self._lend(host)
            scans = [self.layers.layer_via(lend, ref, blob, diff_id)
                     for blob, diff_id in zip(layers, config.diff_ids, strict=True)]
            view = merge_scans(scans, where=f"image {ref}")
            site = find_site(view, DISTRIBUTION, config.config, ref)
            return self._row(ref, site, self._patchsets, config=config.config, **extra)
        except DsparkPatchError as exc:
            return self._error_row(ref, exc, **extra)
        except (ValueError, LookupError, TypeError, UnicodeError, tarfile.TarError) as exc:
            return self._error_row(ref, self._unreadable(ref, exc), **extra)


def read_all(reader: RegistryReader, refs: Sequence[str], *, jobs: int, absent_ok: bool = False,
             progress: Callable[[str, Event, ImageStatus | None], None] | None = None,
             ) -> dict[str, tuple[ImageStatus, ...] | None]:
    """Every reference's rows, in the order of `refs`; a failing image is its row, never the run's
    end. Manifests and configs are read `reader.pool.size` at a time, and each reference's images
    are assessed, `jobs` at a time, as soon as its configs are in."""
    tell = progress or (lambda ref, event, row: None)

    def find(ref: str) -> Found | tuple[ImageStatus, ...] | None:
        tell(ref, "start", None)
        return reader.find(ref, absent_ok=absent_ok)

    def done(ref: str, rows: tuple[ImageStatus, ...] | None) -> tuple[ImageStatus, ...] | None:
        for row in rows or ():
            tell(ref, "done", row)
        return rows

    results: dict[str, Future[tuple[ImageStatus, ...] | None]] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="status-assess") as assessing, \
            ThreadPoolExecutor(max_workers=reader.pool.size, thread_name_prefix="status-registry") as reading:
        try:
            found = {ref: reading.submit(find, ref) for ref in refs}
            for ref in refs:  # each reference's assessment is queued as its first stage ends, in order
                first = found[ref].result()
                if isinstance(first, Found):
                    results[ref] = assessing.submit(lambda r, f: done(r, reader.assess(r, f)), ref, first)
                else:
                    results[ref] = assessing.submit(done, ref, first)
            return {ref: results[ref].result() for ref in refs}
        except BaseException:
            reading.shutdown(wait=True, cancel_futures=True)
            assessing.shutdown(wait=True, cancel_futures=True)
            raise


__all__ = ["Found", "ImageConfig", "LayerCounts", "LayerReader", "RegistryReader", "read_all"]
