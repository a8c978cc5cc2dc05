"""`publish`: an in-image run's layer and report onto the source image, registry to registry,
with no engine (see publish/__init__.py for the order of the work)."""

from __future__ import annotations

import hashlib
import io
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .. import ownfiles
from ..errors import BadInput, TagExists, TagRace
from ..imageref import ImageRef
from ..patchset import PatchSet, available, known, patched_paths
from ..registry.blobs import parse_image_manifest
from ..registry.compose import append_config, append_manifest, gzip_layer
from ..registry.index import Registry
from ..registry.manifest import Manifest
from ..registry.upload import Sent, Uploader
from ..report.audit_json import read_report
from ..report.labels import labels_of_report
from ..report.model import AuditReport, ImageRecord
from ..status.fleet import DISTRIBUTION, row_from_site, scan_cache
from ..status.registry_route import LayerReader
from ..targets.caches.scans import ScanCache
from ..targets.layers import scan_layer
from ..targets.views.from_layers import find_site, merge_scans, status_retain
from .claim import Claim, read_claim, refuse
from .proofs import prove_bytecode, prove_layer, prove_result, prove_source

# The largest layer file publish reads: a layer of patched files and their bytecode is kilobytes
# to a few megabytes; anything near this is not one.
LAYER_LIMIT = 256 << 20


@dataclass(frozen=True, kw_only=True)
class PublishRequest:
    source: str                  # HOST/REPO:TAG or @digest: the image the in-image run ran in
    layer: Path                  # the --layer-out file
    report: Path                 # the audit.json of that run
    tag: str                     # HOST/REPO:TAG to publish as
    force: bool = False          # move an existing tag
    cache_max: int | None = None  # the scan cache's bound (None: the environment's, or 1 GiB)


@dataclass(frozen=True, kw_only=True)
class Published:
    ref: str                     # the tag written
    repo_digest: str             # HOST/REPO@sha256:... of the new manifest, read back
    image_id: str                # the new config's digest (what an engine calls the image id)
    source_digest: str           # the source manifest's digest, the same at the end as at the start
    layer_blob: str              # the new layer's blob digest (gzip)
    layer_size: int              # the layer tar's size
    sent: Sent                   # what was uploaded, mounted, already there
    bytecode_checked: int        # .pyc files proven by their embedded source hash
    bytecode_recompiled: int     # of those, recompiled here and compared (this host's Python is the image's)
    report: AuditReport          # the in-image report, naming the source and the published image
    notes: tuple[str, ...] = ()


def publish(request: PublishRequest) -> Published:
    """Prove, compose, upload, then name: the tag is put last, and only when the source still is
    what was read and the tag is still free (or --force)."""
    src, dest = _references(request)
    report = read_report(request.report)
    claim = read_claim(report, str(request.report))
    layer = ownfiles.read_regular(request.layer, limit=LAYER_LIMIT, what="layer")

    patchsets = known(available())
    retain = status_retain(DISTRIBUTION, patched_paths(patchsets))   # status's: its scan cache serves both
    reader = LayerReader(retain=retain, cache=scan_cache_for(patchsets, request.cache_max))
    registry = reader.registry(src.registry or "")
    manifest = _image_manifest(registry, str(src))
    config = reader.config(registry, str(src), manifest)
    scans = reader.scans(registry, str(src), manifest, config)
    view = merge_scans(scans, where=f"image {src}")
    site = find_site(view, DISTRIBUTION, config.config, str(src))
    prove_source(claim, view, site, row_from_site(str(src), site, patchsets), str(src))
    entries = prove_layer(claim, layer, view)
    checked = prove_bytecode(claim, layer, entries)
    after = merge_scans([*scans, scan_layer(io.BytesIO(layer), where="the new layer", retain=retain)],
                        where=f"image {dest}")
    site_after = find_site(after, DISTRIBUTION, config.config, str(dest))
    row_after = row_from_site(str(dest), site_after, patchsets)
    prove_result(claim, site_after, row_after, str(dest))
    notes = []
    # status/bytecode.py recompiled the patched modules' bytecode when this host's Python is the image's
    recompiled = checked if _host_minor() == claim.python_minor else 0
    if not recompiled:
        notes.append(f"bytecode checked by its embedded source hashes, not recompiled (this host's Python is not "
                     f"the image's {claim.python_minor})")

    source_ref = replace(src, tag=None, digest=manifest.digest)
    labels = labels_of_report(_with_source(report, str(src), config.digest), report.tool_version)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    new_config = append_config(registry.fetch_blob(str(source_ref), config.digest), diff_id=claim.diff_id,
                               labels=labels, created=created)
    blob = gzip_layer(layer)
    new_manifest = append_manifest(manifest, config=new_config, layer_blob=blob)

    target = registry if dest.registry == src.registry else Registry(dest.registry or "")
    uploader = Uploader(target, dest.name)
    if not request.force and uploader.tag_digest(dest.tag_or_latest) is not None:
        raise TagExists(f"{dest} exists in its registry", hint="choose another --tag, or pass --force to move it")
    _base_layers(uploader, registry, str(source_ref), manifest, same_registry=target is registry)
    uploader.put(blob)
    image_id = uploader.put(new_config)
    _still_the_source(registry, src, manifest)
    if not request.force and uploader.tag_digest(dest.tag_or_latest) is not None:
        raise TagRace(f"{dest} was pushed by someone else while this publish ran; it was not moved",
                      hint="find which job pushed it; publish again with another --tag, or --force")
    pushed = target.push(str(dest), new_manifest, manifest.media_type)
    back = target.fetch(str(dest))
    if back.digest != pushed.digest:
        raise TagRace(f"{dest} names {back.digest}, not the {pushed.digest} this publish put: another push moved it",
                      hint="find which job pushed last; publish again")
    repo_digest = f"{dest.name}@{pushed.digest}"
    final = replace(_with_source(report, str(src), config.digest),
                    result_image=ImageRecord(ref=str(dest), id=image_id, repo_digest=repo_digest),
                    labels=labels, notes=(*report.notes, f"published {dest} as {repo_digest} with no engine "
                                          f"(the layer onto {src.name}@{manifest.digest})", *notes))
    return Published(ref=str(dest), repo_digest=repo_digest, image_id=image_id, source_digest=manifest.digest,
                     layer_blob="sha256:" + hashlib.sha256(blob).hexdigest(), layer_size=len(layer),
                     sent=uploader.sent, bytecode_checked=checked, bytecode_recompiled=recompiled, report=final,
                     notes=tuple(notes))


def scan_cache_for(patchsets: list[PatchSet], cache_max: int | None) -> ScanCache:
    """status's layer-scan cache (the same predicate, so the same entries)."""
    from ..status.fleet import StatusRequest

    return scan_cache(StatusRequest(cache_max=cache_max), patchsets)


def _references(request: PublishRequest) -> tuple[ImageRef, ImageRef]:
    src, dest = ImageRef.parse(request.source), ImageRef.parse(request.tag)
    for ref, option in ((src, "--image"), (dest, "--tag")):
        if ref.registry is None:
            raise BadInput(f"{option} {ref} names no registry host; publish reads and writes registries",
                           hint=f"write {option} HOST[:PORT]/REPOSITORY:TAG")
    if dest.digest is not None:
        raise BadInput(f"--tag {dest}: a tag names what publish writes, not a digest", hint="write --tag HOST/REPO:TAG")
    return src, dest


def _image_manifest(registry: Registry, ref: str) -> Manifest:
    manifest = registry.fetch(ref)
    if manifest.is_index:
        raise BadInput(f"{ref} is an image index; publish takes one platform's image",
                       hint=f"publish onto {ref.rsplit(':', 1)[0]}@DIGEST, the platform image the in-image job ran in")
    return manifest


def _with_source(report: AuditReport, src: str, config_digest: str) -> AuditReport:
    """The report as `apply --image` of that source would have it at its commit: its target's image
    is the source (what the report digest label covers)."""
    return replace(report, target=replace(report.target, image=ImageRecord(ref=src, id=config_digest)))


def _base_layers(uploader: Uploader, registry: Registry, source_ref: str, manifest: Manifest, *,
                 same_registry: bool) -> None:
    """Every layer of the source into the destination repository: already there, mounted from the
    source's repository (same registry), or streamed across (another registry)."""
    _, layers = parse_image_manifest(manifest)
    source_repository = ImageRef.parse(source_ref).name
    for blob in layers:
        if uploader.has(blob.digest):
            uploader.sent.present += 1
        elif same_registry and uploader.mount(blob.digest, source_repository):
            uploader.sent.mounted += 1
        else:
            uploader.copy(registry, source_ref, blob)


def _still_the_source(registry: Registry, src: ImageRef, manifest: Manifest) -> None:
    """The source reference names the manifest publish read at its start (a tag can move)."""
    again = registry.fetch(str(src))
    if again.digest != manifest.digest:
        raise TagRace(f"{src} named {manifest.digest} when publish read it and {again.digest} now",
                      hint=f"publish onto {src.name}@{manifest.digest} (a digest does not move), or run the job again")


def _host_minor() -> str:
    import sys

    return f"{sys.version_info[0]}.{sys.version_info[1]}"


__all__ = ["Claim", "PublishRequest", "Published", "publish", "refuse"]
