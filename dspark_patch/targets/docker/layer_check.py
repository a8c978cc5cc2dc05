"""The strict layer reader on an image target's layers (docs/design.md: the source's layers, through
the strict reader): the source image's layers read as `status --via layers` reads them, from the
scan cache by diff_id or else one save (`check_layers`); the scan of the layer apply added, kept
beside them (`cache_layer_scan`); and the new layer taken from the work container (`fetch_layer`,
then targets/layers/new_layer.py's check).
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Iterable

from ...errors import CheckFailed, DsparkPatchError, EnvironmentProblem
from ..caches.scans import ScanCache
from ..layers import LayersRead
from ..layers.new_layer import layer_answer
from ..layers.scan import scan_layer
from ..views.from_layers import merge_scans, status_retain
from .client import DockerEngine, ImageInfo
from .container import WorkContainer
from .save_views import save_layer_where, save_views


def check_layers(engine: DockerEngine, source: ImageInfo, ref: str, distribution: str, retain: Iterable[str],
                 cache: ScanCache, *, save: bool = True, stop: threading.Event | None = None) -> LayersRead:
    """Read the source image's layers with the strict layer reader, as `status --via layers`
    does, and raise what it refuses (a header two tar readers read differently, an unclean
    name, a link over a folder, a cap): apply works on what the engine unpacked, but an image
    whose layers the reader refuses is hostile, and the audit of its result would be an error
    row. A layer whose scan `cache` holds (by diff_id) is not read again, so an image whose
    every layer is cached costs no save. Otherwise the layers are read through one save of the
    whole image if `save`, else not at all (`not_cached` says how many were not): dockerd 20.10
    exports every layer to a folder of its own before it sends a byte, so the save of a serving
    image of 10-30 GB is the whole cost of a cold apply. Setting `stop` ends a save under way
    (EnvironmentProblem)."""
    diff_ids = source.diff_ids
    scans = [cache.get(d) for d in diff_ids]
    if diff_ids and all(s is not None for s in scans):
        found: object = merge_scans([s for s in scans if s is not None], where=f"image {ref}")
        read = LayersRead(how="cached", layers=len(diff_ids))
    elif not save:
        return LayersRead(how="not-read", layers=len(diff_ids), not_cached=sum(s is None for s in scans))
    else:
        found = save_views(engine, [source.id], distribution, retain, cache, stop=stop).get(source.id)
        read = LayersRead(how="saved", layers=len(diff_ids))
    if found is None:
        raise EnvironmentProblem(f"the engine's save of image {ref} did not hold all of its layers")
    if isinstance(found, DsparkPatchError):
        raise type(found)(f"image {ref}: {found.message}; nothing was written",
                          hint=found.hint or "the engine and this tool could unpack this image differently; "
                          "rebuild it from trusted layers")
    return read


def cache_layer_scan(layer: bytes | None, distribution: str, retain: Iterable[str], cache: ScanCache) -> None:
    """The scan of the layer `commit` added, into `cache` by its diff_id (the sha256 of these
    very bytes, which the engine checked on load), named as a save would name it: a status of
    the result then saves nothing (the source's layers are there from `check_layers`). A
    layer the reader refuses is not kept: a later read says so itself."""
    if layer is None:
        return
    digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    try:
        scan = scan_layer(io.BytesIO(layer), where=save_layer_where(digest), retain=status_retain(distribution, retain))
    except DsparkPatchError:
        return
    cache.put(digest, scan)


def fetch_layer(container: WorkContainer, answer: bytes) -> bytes:
    """The layer tar the image's python wrote to a temporary file, read through the engine's
    archive API and checked against the sha256 and size it gave, then removed. (An exec's
    output stream is no channel for it: Podman 4's exec attach corrupts large binary output
    now and then, a frame header inside the data.)"""
    said = layer_answer(answer)
    if said is None:
        raise CheckFailed("taking the new layer from the container failed: the image's python did not say "
                          f"which temporary file it wrote it to ({answer[:200]!r})", hint="nothing was committed")
    where, sha, size = said
    try:
        copied = container.copy_out(where)
    finally:
        container.delete(where)
    data = copied[0] if copied is not None else b""
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        raise EnvironmentProblem(f"the new layer read from the container ({len(data)} bytes) is not the one the "
                                 f"image's python wrote ({size} bytes, sha256 {sha[:16]})",
                                 hint="nothing was committed; run again, and look at the engine's log if it recurs")
    return data
