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
"""

from __future__ import annotations

import tarfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from ..errors import BadInput, DsparkPatchError, TargetNotFound
from ..patchset import PatchSet
from ..registry.blobs import ImageConfig, open_layer, parse_image_manifest, read_config
from ..registry.index import Registry, RegistryUnreachable, registry_host
from ..registry.manifest import Manifest, parse_index
from ..registry.platform_select import Platform, UnknownPlatform, select
from ..report.status_model import ImageStatus
from ..targets.caches.scans import ScanCache
from ..targets.layers import LayerScan, scan_layer
from ..targets.views.from_layers import find_site, merge_scans, status_retain

DISTRIBUTION = "vllm"
Event = Literal["start", "done"]


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
        with self._guard:
            lock = self._locks.setdefault(diff_id, threading.Lock())
        with lock:  # a layer shared by images read at once is fetched by one of them
            found = self._memo.get(diff_id)
            if found is None:
                found = self.cache.get(diff_id)
            if found is None:
                try:
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


class RegistryReader:
    """Reads references from their registries; one instance per run (its layer memo is the run's)."""

    def __init__(self, *, patchsets: Sequence[PatchSet], retain_paths: frozenset[str], cache: ScanCache,
                 platform: str | None, row: Callable[..., ImageStatus], error_row: Callable[..., ImageStatus],
                 unreadable: Callable[[str, Exception], DsparkPatchError]) -> None:
        self._patchsets = patchsets
        self.layers = LayerReader(retain=status_retain(DISTRIBUTION, retain_paths), cache=cache)
        self.cache = cache
        self.counts = self.layers.counts
        self._platform = platform
        self._row, self._error_row, self._unreadable = row, error_row, unreadable

    def _registry(self, host: str) -> Registry:
        return self.layers.registry(host)

    # --- one reference ---------------------------------------------------------------------------
    def read(self, ref: str, *, absent_ok: bool = False) -> tuple[ImageStatus, ...] | None:
        """The rows of `ref` (one per platform read). `absent_ok`: None when the registry does not
        answer or has no such image (the caller keeps its own row for it)."""
        host = registry_host(ref)
        if host is None:
            if absent_ok:
                return None
            return (self._error_row(ref, BadInput(f"{ref} names no registry host, so --via registry cannot read it",
                                                  hint="write HOST[:PORT]/REPOSITORY:TAG")),)
        try:
            registry = self._registry(host)
            manifest = registry.fetch(ref)
        except (RegistryUnreachable, TargetNotFound) as exc:
            return None if absent_ok else (self._error_row(ref, exc),)
        except DsparkPatchError as exc:
            return (self._error_row(ref, exc),)
        try:
            images = self._platforms(registry, manifest)
        except DsparkPatchError as exc:
            return (self._error_row(ref, exc),)
        return tuple(self._image(registry, ref, image, single=not manifest.is_index) for image in images)

    def _platforms(self, registry: Registry, manifest: Manifest) -> list[Manifest]:
        if not manifest.is_index:
            return [manifest]
        index = parse_index(manifest)
        # all platforms unless --platform names some (the engine's own platform plays no part here)
        chosen = select(index.platforms, self._platform or "all", Platform(os="linux", architecture="amd64"))
        return [registry.fetch_platform(index, p) for p in chosen]

    def _wanted(self, platform: str) -> bool:
        if self._platform is None or self._platform.strip() == "all":
            return True
        found = Platform.parse(platform)
        return any(found.matches(Platform.parse(p)) for p in self._platform.split(",") if p.strip())

    def _image(self, registry: Registry, ref: str, manifest: Manifest, *, single: bool) -> ImageStatus:
        extra: dict[str, str | None] = {}
        try:
            config = self.layers.config(registry, ref, manifest)
            extra = {"id": config.digest, "platform": config.platform}
            if single and not self._wanted(config.platform):
                raise UnknownPlatform(f"{ref} is a {config.platform} image, not {self._platform}",
                                      hint="choose its platform with --platform, or leave --platform out")
            scans = self.layers.scans(registry, ref, manifest, config)
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
    """Every reference's rows, `jobs` at a time; a failing image is its row, never the run's end."""
    def one(ref: str) -> tuple[ImageStatus, ...] | None:
        if progress is not None:
            progress(ref, "start", None)
        rows = reader.read(ref, absent_ok=absent_ok)
        if progress is not None and rows:
            for row in rows:
                progress(ref, "done", row)
        return rows

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="status-registry") as pool:
        return dict(zip(refs, pool.map(one, refs), strict=True))


__all__ = ["ImageConfig", "LayerCounts", "LayerReader", "RegistryReader", "read_all"]
