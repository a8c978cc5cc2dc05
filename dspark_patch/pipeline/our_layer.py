"""A layer of ours on top of the source image, replaced, never stacked.

An image `apply` made carries one layer of ours on top, and labels saying which patch set (or
series) and files it holds. Applying another patch set or series to it starts from the image
under that layer, so the result is again the image under it plus one layer of ours; the same
patch set or series again is left to the plan (already applied).

The labels are input: they only say where to look. The layer that would be dropped must hold
nothing but what a layer of ours for the labelled files holds (those files, their bytecode,
the folders above them, a whiteout for a file the set deletes), read with the strict layer
reader (its scan kept by diff_id, as the layer check keeps it); its history entry must be ours.
Anything else is refused (StackedLayer, exit 2): a layer someone put on top of ours, or a layer
of theirs under forged labels, is never removed. What is under it is then checked as any
source is (integrity against the published wheel, the strict reader on every layer, ...).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import DsparkPatchError, StackedLayer
from ..patchset import PatchSet, Variant, available, is_id, patched_paths
from ..targets.base import Distribution, ImageCapable, ImageStore
from ..targets.layers.owners import top_layer_owners
from ..targets.layers.scan import LayerScan, path_key
from .image_steps import LABEL_PREFIX, SERIES_LABEL, label_ids, series_ids
from .runlog import RunLog
from .shared_steps import cached_name

if TYPE_CHECKING:
    from ..targets.caches.scans import ScanCache


@dataclass(frozen=True, kw_only=True)
class OurLayer:
    """What the source's labels say its top layer of ours holds."""

    image_id: str                         # the source image
    named: str                            # the patch set or series the labels name
    files: Mapping[str, str | None]       # each labelled file and its post-image (None: deleted)


class UnderOurLayer(Exception):
    """apply met a layer of ours holding another patch set or series: the run starts again on the
    image under it (commands.apply). Not an error: never reaches the user as one."""

    def __init__(self, layer: OurLayer) -> None:
        super().__init__(layer.named)
        self.layer = layer


def our_layer(target: ImageCapable, image_id: str, patchset: PatchSet, variant: Variant) -> OurLayer | None:
    """The layer of ours the source carries, when it holds another patch set (or series) than
    this run's; None when it carries none, or this very one (the plan decides what that means)."""
    labels = target.source_labels()
    files_label = labels.get(f"{LABEL_PREFIX}.files")
    if files_label is None:
        return None
    if labels.get(f"{LABEL_PREFIX}.patch.id") == (patchset.id or "bare-diff") \
            and labels.get(f"{LABEL_PREFIX}.patch.sha256") == variant.diff_sha256:
        return None
    carried = labels.get(SERIES_LABEL)
    named = series_ids(carried) if carried is not None else str(labels.get(f"{LABEL_PREFIX}.patch.id", "?"))[:200]
    return OurLayer(image_id=image_id, named=named, files=_files(files_label, named))


def _files(label: str, named: str) -> dict[str, str | None]:
    try:
        files = json.loads(label)
    except ValueError:
        files = None
    if not isinstance(files, dict) or not files or not all(
            isinstance(path, str) and _clean(path) and (post is None or isinstance(post, str))
            for path, post in files.items()):
        raise StackedLayer(f"the image's {LABEL_PREFIX}.files label (of {named}) is not a list of patched files, "
                           "so what its top layer holds cannot be told",
                           hint="apply to the image that layer was put on")
    return files


def _clean(path: str) -> bool:
    return bool(path) and not path.startswith("/") and posixpath.normpath(path) == path and ".." not in path.split("/")


def check_our_layer(layer: OurLayer, top: LayerScan | None, dist: Distribution) -> None:
    """The top layer holds nothing but what a layer of ours for the labelled files holds, in the
    distribution's folder: else it is not (only) ours, and it stays."""
    if top is None:
        raise StackedLayer(f"the top layer of {layer.image_id[:19]} could not be read, so it cannot be told ours",
                           hint="apply to the image the dspark-patch layer was put on")
    present, removed = allowed(layer.files, dist)
    extra = set(top.present) - {path_key(p) for p in present}
    if extra or top.opaques or not set(top.whiteouts) <= removed:
        what = (f"{len(extra)} path(s)" if extra else "an opaque folder" if top.opaques
                else f"a whiteout of {sorted(set(top.whiteouts) - removed)[0]}")
        raise StackedLayer(
            f"the top layer of {layer.image_id[:19]} holds {what} beyond the files its dspark-patch labels "
            f"({layer.named}) name: it is not only ours, and is not removed",
            hint="apply to the image the dspark-patch layer was put on; a layer with other changes is never dropped")


def allowed(files: Mapping[str, str | None], dist: Distribution) -> tuple[set[str], set[str]]:
    """The paths (as a layer's tar names them: no leading '/') a layer of ours for `files` may
    hold, and those it may white out."""
    location = dist.location.strip("/")
    present: set[str] = set()
    removed: set[str] = set()
    for path, post in files.items():
        full = f"{location}/{path}"
        pyc = f"{location}/{cached_name(path, dist.cache_tag)}" if path.endswith(".py") else None
        (removed if post is None else present).update(p for p in (full, pyc) if p)
        if pyc:
            present.add(pyc.rpartition("/")[0])
        for leaf in (full, pyc):
            if leaf:
                parts = leaf.split("/")
                present.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return present, removed


def top_layer_problems(layer: OurLayer, scans: Sequence[LayerScan], dist: Distribution) -> list[str]:
    """`verify` on every route that reads the image's layers (`scans`, bottom first): the top
    layer holds only what a layer of ours for `layer.files` holds, each with the mode and owner
    apply writes over the layers under it. One problem line each; [] when it is ours."""
    try:
        check_our_layer(layer, scans[-1], dist)
    except StackedLayer as exc:
        return [exc.message]
    return top_layer_owners(scans[-1], scans[:-1], allowed(layer.files, dist)[0])


def verify_top_layer(target: ImageCapable, dist: Distribution, files: Mapping[str, str | None], named: str,
                     run: RunLog) -> list[str]:
    """`verify --image`: `top_layer_problems` for `files` (each path the diff names; None: one it
    deletes), the layers read from the scan cache (apply keeps the layer it adds, and the source's
    when it reads them; `status --via layers` keeps every layer it reads). Where the cache lacks
    one, reading it would be a save of the whole image: a note says the top layer was not
    compared, and how to have it compared."""
    layers = target.info.layers
    cache = _scan_cache(dist.name)
    scans = [cache.get(diff_id) for diff_id in layers]
    missing = sum(scan is None for scan in scans)
    if not layers or missing:
        run.notes.append(f"the top layer's paths, modes and owners were not compared with the layers under it "
                         f"({missing} of {len(layers)} layers not in the scan cache; reading them is a save of the "
                         "whole image): `status --via layers` of the image reads and keeps them, and verify then "
                         "compares them, as `verify --via registry` always does")
        return []
    layer = OurLayer(image_id=target.info.id or "", named=named, files=files)
    problems = top_layer_problems(layer, [scan for scan in scans if scan is not None], dist)
    if not problems:
        run.notes.append(f"the top layer ({layers[-1][:19]}) holds only the patched files, their bytecode and the "
                         "folders above them, each with the mode and owner apply writes")
    return problems


def _scan_cache(distribution: str) -> ScanCache:
    """The scan cache under the predicate apply and `status` keep layers by (so all three share it)."""
    from ..targets.caches.scans import ScanCache
    from ..targets.views.from_layers import status_retain_identity

    return ScanCache.from_env(status_retain_identity(distribution, patched_paths(available())))


def top_layer_scan(store: ImageStore, image_id: str, diff_id: str, distribution: str) -> LayerScan | None:
    """The source's top layer through the strict layer reader, from the scan cache by diff_id or
    else one save of the image (whose every layer's scan is then kept, as the layer check keeps
    them: the run on the image under it reads none of its layers again). None when the scan
    cache keeps nothing (DSPARK_PATCH_CACHE_MAX=0): the layer cannot be told ours then."""
    cache = _scan_cache(distribution)
    scan = cache.get(diff_id)
    if scan is None:
        found = store.save_views([image_id], distribution, patched_paths(available()), cache).get(image_id)
        if isinstance(found, DsparkPatchError):
            raise type(found)(f"image {image_id[:19]}: {found.message}; nothing was written", hint=found.hint)
        scan = cache.get(diff_id)
    return scan


def labelled(target: object, run: RunLog) -> tuple[str, ...]:
    """verify with no patch set named: the patch set or series an image's labels name, as ids of
    known patch sets (said in a note); () for anything else (the shipped default then). Labels are
    input: they only choose what is checked, and every check then holds against those sets."""
    if not isinstance(target, ImageCapable):
        return ()
    labels = target.source_labels()
    carried = labels.get(SERIES_LABEL)
    ids = label_ids(carried) if carried is not None else (str(labels.get(f"{LABEL_PREFIX}.patch.id", "")),)
    if ids is None:
        return ()
    known = {p.id for p in available()}
    if not ids or len(ids) > 64 or not all(is_id(i) and i in known for i in ids):
        return ()
    run.notes.append(f"no patch set named: verifying what the image's labels name, {' + '.join(ids)}")
    return ids
