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
from ..registry.index import Registry, republish
from ..registry.manifest import ImageIndex, Manifest, digest_of, parse_index
from ..registry.platform_select import Platform
from ..registry.upload import Sent, Uploader
from ..report.audit_json import read_report
from ..report.checks import record_checks
from ..report.labels import labels_of_report
from ..report.model import AuditReport, ImageRecord, IndexReport, PlatformReport
from ..routing import IN_IMAGE
from ..status.fleet import DISTRIBUTION, row_from_site, scan_cache
from ..status.registry_route import LayerReader
from ..targets.caches.scans import ScanCache
from ..targets.layers import RetainPredicate, scan_layer
from ..targets.views.from_layers import find_site, merge_scans, status_retain
from .claim import CLAIMED_NOTE, Claim, as_publisher_knows, read_claim, refuse
from .headers import prove_headers
from .proofs import prove_bytecode, prove_layer, prove_result, prove_source

# The largest layer file publish reads: a layer of patched files and their bytecode is kilobytes
# to a few megabytes; anything near this is not one.
LAYER_LIMIT = 256 << 20


@dataclass(frozen=True, kw_only=True)
class LayerPair:
    """One in-image run's outputs: the layer and the report it wrote, and for an index the
    platform whose image it ran in."""

    platform: str | None         # "linux/arm64" (an index's platform); None: the source is one image
    layer: Path                  # the --layer-out file
    report: Path                 # the audit.json of that run


@dataclass(frozen=True, kw_only=True)
class PublishRequest:
    source: str                  # HOST/REPO:TAG or @digest: the image (or index) the in-image runs ran in
    pairs: tuple[LayerPair, ...]  # one run's layer and report; for an index, one per platform
    tag: str                     # HOST/REPO:TAG to publish as
    force: bool = False          # move an existing tag
    cache_max: int | None = None  # the scan cache's bound (None: the environment's, or 1 GiB)
    sign_key: str | None = None  # sign the statement of the published image(s) and attach it as a referrer
    allow_open_key: bool = False  # a sign key group or others may read
    python: str | None = None    # an interpreter of the image's Python minor, to recompile its bytecode
    allow_unreviewed: bool = False  # publish a patch set whose variant no person has marked reviewed


@dataclass(frozen=True, kw_only=True)
class Published:
    ref: str                     # the tag written
    repo_digest: str             # HOST/REPO@sha256:... of the new manifest (or index), read back
    image_id: str                # the new config's digest (an index: its first platform's)
    source_digest: str           # the source manifest's digest, the same at the end as at the start
    layer_blob: str              # the new layer's blob digest (gzip; an index: its first platform's)
    layer_size: int              # the layer tar's size (an index: all platforms' together)
    sent: Sent                   # what was uploaded, mounted, already there
    bytecode_checked: int        # .pyc files proven by their embedded source hash
    bytecode_recompiled: int     # of those, recompiled here and compared (this host's Python is the image's)
    report: AuditReport          # the in-image report (an index: one per platform), naming source and result
    platforms: tuple[str, ...] = ()   # an index: its platforms, in its order
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    """One platform image, proven and composed; nothing written yet."""

    platform: str | None
    source: Manifest             # its manifest in the source
    source_ref: str              # HOST/REPO@sha256:... of it
    manifest: bytes              # the new manifest
    config: bytes                # the new config
    blob: bytes                  # the layer, gzip
    layer_size: int
    checked: int
    recompiled: int
    report: AuditReport          # the in-image report naming its source, with our labels
    notes: tuple[str, ...]


def publish(request: PublishRequest) -> Published:
    """Prove every platform, compose, upload, then name: the tag is put last, and only when the
    source still is what was read and the tag is still free (or --force)."""
    src, dest = _references(request)
    signer = None
    if request.sign_key is not None:   # a key that cannot sign stops the run before any work
        from ..attest.dsse import load_signer

        signer = load_signer(Path(request.sign_key), allow_open=request.allow_open_key)
    # Each report is the in-image job's word: read (bounded, no link, nesting capped) before any
    # registry is asked, so a hostile one is refused with nothing fetched; its review states and
    # probe then as this publisher knows them (claim.py: as_publisher_knows).
    reports = {pair.report: as_publisher_knows(read_report(pair.report), str(pair.report),
                                               allow_unreviewed=request.allow_unreviewed) for pair in request.pairs}
    patchsets = known(available())
    retain = status_retain(DISTRIBUTION, patched_paths(patchsets))   # status's: its scan cache serves both
    reader = LayerReader(retain=retain, cache=scan_cache_for(patchsets, request.cache_max))
    registry = reader.registry(src.registry or "")
    top = registry.fetch(str(src))
    index = parse_index(top) if top.is_index else None
    chosen = _pairs(index, request.pairs, str(src))
    prepared = [_prepare(reader, registry, src, dest, registry.fetch_platform(index, platform) if index and platform
                         else top, pair, reports[pair.report], platform, patchsets, retain, request.python)
                for platform, pair in chosen]

    if signer is not None and any(one.report.series for one in prepared):
        raise BadInput("--sign-key attests one patch set, and this report is of a series (which has no attestation yet)",
                       hint="publish the series without --sign-key")
    _still_the_source(registry, src, top)   # before anything is written, and again before the tag
    target = registry if dest.registry == src.registry else Registry(dest.registry or "")
    uploader = Uploader(target, dest.name)
    if not request.force and uploader.tag_digest(dest.tag_or_latest) is not None:
        raise TagExists(f"{dest} exists in its registry", hint="choose another --tag, or pass --force to move it")
    images, ids = _upload(prepared, uploader, registry, dest, as_index=index is not None)
    body, media_type = (republish(index, images), top.media_type) if index is not None else (
        prepared[0].manifest, prepared[0].source.media_type)
    _still_the_source(registry, src, top)
    if not request.force and uploader.tag_digest(dest.tag_or_latest) is not None:
        raise TagRace(f"{dest} was pushed by someone else while this publish ran; it was not moved",
                      hint="find which job pushed it; publish again with another --tag, or --force")
    pushed = target.push(str(dest), body, media_type)
    back = target.fetch(str(dest))
    if back.digest != pushed.digest:
        raise TagRace(f"{dest} names {back.digest}, not the {pushed.digest} this publish put: another push moved it",
                      hint="find which job pushed last; publish again")
    repo_digest = f"{dest.name}@{pushed.digest}"
    final = _final_report(prepared, index, images, src, top, dest, repo_digest, ids)
    if signer is not None:   # after the tag, as `apply --push --sign-key` does: a failure here says so
        from ..pipeline.attestation import sign_and_attach

        final = sign_and_attach(final, signer, None)
    final = record_checks(final)   # of what publish says, not the checks the job recorded
    claimed = (CLAIMED_NOTE,) if any(one.report.probe.claimed_by for one in prepared) else ()
    notes = tuple(dict.fromkeys((*claimed, *(n for one in prepared for n in one.notes))))
    return Published(ref=str(dest), repo_digest=repo_digest, image_id=ids[0], source_digest=top.digest,
                     layer_blob="sha256:" + hashlib.sha256(prepared[0].blob).hexdigest(),
                     layer_size=sum(one.layer_size for one in prepared), sent=uploader.sent,
                     bytecode_checked=sum(one.checked for one in prepared),
                     bytecode_recompiled=sum(one.recompiled for one in prepared), report=final,
                     platforms=tuple(str(p) for p in (index.platforms if index else ())), notes=notes)


def _upload(prepared: list[_Prepared], uploader: Uploader, source: Registry, dest: ImageRef, *,
            as_index: bool) -> tuple[dict[Platform, Manifest], list[str]]:
    """Each image's blobs into the destination (the source's layers never sent again when the
    registry has them); for an index, each platform's manifest by its digest too. Returns those
    manifests by platform, and the configs' digests (the image ids)."""
    target = uploader.registry
    images: dict[Platform, Manifest] = {}
    ids = []
    for one in prepared:
        _base_layers(uploader, source, one.source_ref, one.source, same_registry=target is source)
        uploader.put(one.blob)
        ids.append(uploader.put(one.config))
        if as_index and one.platform is not None:
            images[Platform.parse(one.platform)] = target.push(f"{dest.name}@{digest_of(one.manifest)}", one.manifest,
                                                               one.source.media_type)
    return images, ids


def _pairs(index: ImageIndex | None, pairs: tuple[LayerPair, ...], src: str) -> list[tuple[Platform | None, LayerPair]]:
    """Which run's outputs go onto which image: the one pair for a single image; for an index, one
    pair per platform it lists (every one: an index is published whole or not at all)."""
    if index is None:
        if len(pairs) != 1:
            raise BadInput(f"{src} is one image, and {len(pairs)} layers were given",
                           hint="give one --layer and one --report (several are for an index, PLATFORM=FILE each)")
        return [(None, pairs[0])]
    if any(p.platform is None for p in pairs):
        raise BadInput(f"{src} is an image index of {', '.join(map(str, index.platforms))}: name each layer's and "
                       "report's platform", hint="write --layer PLATFORM=FILE --report PLATFORM=FILE for each platform")
    found: list[tuple[Platform | None, LayerPair]] = []
    for platform in index.platforms:
        mine = [p for p in pairs if platform.matches(Platform.parse(p.platform or ""))]
        if len(mine) != 1:
            raise BadInput(f"{'no' if not mine else 'more than one'} --layer/--report for {platform} of {src}; the "
                           "index is published only with every platform's layer", hint=(
                               f"run the in-image job on {platform} too, and give its files as {platform}=FILE"
                               if not mine else f"give one {platform}=FILE each"))
        found.append((platform, mine[0]))
    extra = [p.platform for p in pairs if not any(p is pair for _, pair in found)]
    if extra:
        raise BadInput(f"{src} has no {extra[0]} image", hint=f"its platforms: {', '.join(map(str, index.platforms))}")
    return found


def _prepare(reader: LayerReader, registry: Registry, src: ImageRef, dest: ImageRef, manifest: Manifest,
             pair: LayerPair, report: AuditReport, platform: Platform | None, patchsets: list[PatchSet],
             retain: RetainPredicate, python: str | None) -> _Prepared:
    """Prove one run's report and layer against one image of the source, and compose its result."""
    where = f"{src}" if platform is None else f"{src} ({platform})"
    claim = read_claim(report, str(pair.report))
    layer = ownfiles.read_regular(pair.layer, limit=LAYER_LIMIT, what="layer")
    source_ref = f"{src.name}@{manifest.digest}"
    config = reader.config(registry, source_ref, manifest)
    scans = reader.scans(registry, source_ref, manifest, config)
    view = merge_scans(scans, where=f"image {where}")
    site = find_site(view, DISTRIBUTION, config.config, where)
    prove_source(claim, view, site, row_from_site(where, site, patchsets), where)
    entries = prove_layer(claim, layer, view)
    prove_headers(entries, scans)
    checked = prove_bytecode(claim, layer, entries, python)
    after = merge_scans([*scans, scan_layer(io.BytesIO(layer), where="the new layer", retain=retain)],
                        where=f"image {dest}")
    site_after = find_site(after, DISTRIBUTION, config.config, str(dest))
    prove_result(claim, site_after, row_from_site(str(dest), site_after, patchsets), str(dest))
    labelled = _with_source(report, where if platform is None else source_ref, config.digest)
    labels = labels_of_report(labelled, report.tool_version)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    new_config = append_config(registry.fetch_blob(source_ref, config.digest), diff_id=claim.diff_id,
                               labels=labels, created=created)
    blob = gzip_layer(layer)
    return _Prepared(platform=None if platform is None else str(platform), source=manifest, source_ref=source_ref,
                     manifest=append_manifest(manifest, config=new_config, layer_blob=blob), config=new_config,
                     blob=blob, layer_size=len(layer), checked=checked, recompiled=checked,
                     report=replace(labelled, labels=labels), notes=())


def _final_report(prepared: list[_Prepared], index: ImageIndex | None, images: dict[Platform, Manifest],
                  src: ImageRef, top: Manifest, dest: ImageRef, repo_digest: str, ids: list[str]) -> AuditReport:
    """The in-image report naming the published image; for an index, one report per platform
    under the index's."""
    said = f"published {dest} as {repo_digest} with no engine"

    def result(one: _Prepared, image_id: str, ref: str, digest: str) -> AuditReport:
        return replace(one.report, result_image=ImageRecord(ref=ref, id=image_id, repo_digest=digest),
                       notes=(*one.report.notes, *one.notes), route=IN_IMAGE)

    if index is None:
        one = prepared[0]
        done = result(one, ids[0], str(dest), repo_digest)
        return replace(done, notes=(*done.notes, f"{said} (the layer onto {src.name}@{top.digest})"))
    platforms = []
    for one, image_id in zip(prepared, ids, strict=True):
        pushed = f"{dest.name}@{images[Platform.parse(str(one.platform))].digest}"
        platforms.append(PlatformReport(platform=str(one.platform), source_manifest=one.source.digest, emulated=False,
                                        result_manifest=pushed.rpartition("@")[2],
                                        report=result(one, image_id, pushed, pushed)))
    first = prepared[0].report
    return replace(first, route=IN_IMAGE, target=replace(first.target, image=ImageRecord(ref=str(src), id=top.digest)),
                   result_image=ImageRecord(ref=str(dest), id=ids[0], repo_digest=repo_digest), labels={},
                   index=IndexReport(ref=str(src), media_type=top.media_type, digest=top.digest,
                                     platforms=tuple(str(p) for p in index.platforms), result_ref=str(dest),
                                     result_digest=repo_digest.rpartition("@")[2]),
                   platforms=tuple(platforms), notes=(*first.notes, f"{said}: the index of {len(platforms)} platform "
                                               "images, each its in-image run's layer onto the source's"))


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


def _with_source(report: AuditReport, src: str, config_digest: str) -> AuditReport:
    """The report as `apply --image` of that source would have it at its commit: its target's image
    is the source image (whose id the report digest label covers), the run's site folder in it."""
    return replace(report, target=replace(report.target, kind="image", ref=src,
                                          image=ImageRecord(ref=src, id=config_digest)))


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


__all__ = ["Claim", "LayerPair", "PublishRequest", "Published", "publish", "refuse"]
